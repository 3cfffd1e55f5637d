"""``dispatch list JOB...``: the jobs named that the listing does not hold, and why.

``ls`` says so of a file it cannot list, and so does ``dispatch list`` of a job:
one line each on stderr, and a non-zero exit status (the first one's), the
rows it did find printed as usual. A job named alone (an id or a name) is asked
of the daemon, one ``show`` request each, so that the line can say whether it
does not exist, is not yours, or is only left out (it has ended, without
``--finished``; another user's, without ``--all``). A FIRST-LAST range that
matches nothing is reported without a request: it may stand for 100,000 ids.
"""

from __future__ import annotations

from ..wire.messages import REFUSALS

TYPE_CHECKING = False
if TYPE_CHECKING:   # (typing costs dispatch's start-up several ms)
    from collections.abc import Callable
    from typing import Any


class Unlisted:
    """A job word the listing holds nothing for: its message and the refusal code it stands for."""

    __slots__ = ("word", "message", "code")

    def __init__(self, word: str, message: str, code: str):
        self.word, self.message, self.code = word, message, code

    @property
    def status(self) -> int:
        """The exit status its code gives (as a refusal of that code would)."""
        return REFUSALS[self.code]

    def doc(self) -> dict[str, Any]:
        """Its entry in ``list --json``'s ``errors``."""
        return {"job": self.word, "error": self.message, "code": self.code, "exit": self.status}


def array_words(job: dict[str, Any]) -> tuple[str, ...]:
    """The words that name a listed *job* as an array element, ``6_3`` and ``6_*`` (none for a job
    submitted alone); *job* is a summary (``array`` an object) or a table's (``6_3``)."""
    from ..core.arrayref import WHOLE, element_name
    array = job.get("array")
    if isinstance(array, dict):
        return element_name(array["first"], array["index"]), element_name(array["first"], WHOLE)
    if isinstance(array, str):
        return array, element_name(int(array.partition("_")[0]), WHOLE)
    return ()


def listed(job: dict[str, Any], word: str, ref: int | str | list[int]) -> bool:
    """Whether the listed *job* is one the *word* (parsed as *ref*) names."""
    if isinstance(ref, list):          # a FIRST-LAST range, its ids
        return bool(ref) and ref[0] <= job.get("id", 0) <= ref[-1]
    if isinstance(ref, int):
        return job.get("id") == ref
    if ref in array_words(job):
        return True
    from ..core.arrayref import looks_like
    if looks_like(ref):                # another array's element
        return False
    user, _, name = word.rpartition(":")
    return job.get("name") == name and (not user or job.get("user") == user)


def unmatched(refs: list[tuple[str, int | str | list[int]]], jobs: list[dict[str, Any]]) \
        -> list[tuple[str, int | str | list[int]]]:
    """The (word, ref) pairs no listed job answers to, in the order given. Pure."""
    return [(word, ref) for word, ref in refs if not any(listed(job, word, ref) for job in jobs)]


def why_unlisted(word: str, reply: dict[str, Any], finished: bool, all_users: bool, uid: int) -> Unlisted:
    """Why the job *word* names is not in the listing, from the daemon's answer to ``show`` it. Pure."""
    if not reply.get("ok"):
        code = str(reply.get("code"))
        return Unlisted(word, reply.get("error") or f"no such job: {word}", code if code in REFUSALS else "refused")
    job = reply.get("result", {}).get("job", {})
    ended = job.get("state") == "finished"
    if job.get("uid") not in (None, uid) and not all_users:
        return Unlisted(word, f"job {job.get('id', word)} is {job.get('user')}'s: add --all to list it", "forbidden")
    if ended and not finished:
        return Unlisted(word, f"job {job.get('id', word)} has ended: add --finished to list it", "finished")
    if ended:   # long enough ago to have left the list (the daemon's --keep-finished), not the history
        return Unlisted(word, f"job {job.get('id', word)} has ended and left the list: dispatch show "
                              f"{job.get('id', word)} or dispatch history {job.get('id', word)} has it", "finished")
    # It came (or moved) while the pages were read.
    return Unlisted(word, f"job {job.get('id', word)} is {job.get('state')} now: list again", "refused")


def unlisted_range(word: str, finished: bool) -> Unlisted:
    """A FIRST-LAST range that matches no listed job. Pure."""
    if finished:
        return Unlisted(word, f"no job in {word} is listed", "not_found")
    return Unlisted(word, f"no queued or running job in {word} (--finished lists ended ones too)", "not_found")


def explain(call: Callable[..., dict[str, Any]], missing: list[tuple[str, int | str | list[int]]],
            finished: bool, all_users: bool, uid: int) -> list[Unlisted]:
    """Why each of *missing* is not listed: a ``show`` request (*call*) for each job named alone."""
    return [unlisted_range(word, finished) if isinstance(ref, list) or str(ref).endswith("_*")
            else why_unlisted(word, call("show", id=ref), finished, all_users, uid)
            for word, ref in missing]

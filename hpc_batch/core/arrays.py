"""Bulk submission as users type it: ``--array`` specs, ``--commands`` files, id ranges.

Pure: no I/O. Errors are ValueError with a message that says what was wrong
and what a good value looks like.
"""

from __future__ import annotations

from .. import bounds
from .jobnames import is_range as is_range  # FIRST-LAST: the job-name rule's, re-exported for the range users

ARRAY_FORMS = "e.g. 1-100, 0-98:2, 1,4,9 or 1-1000%8 (at most 8 at once)"


def _number(text: str, what: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"{what} {bounds.shown(text)} is not a whole number")
    if len(text) > len(str(bounds.MAX_ARRAY_INDEX)):   # past every bound below (int() of any length is slow)
        raise ValueError(f"{what} {bounds.shown(text)} is too large")
    return int(text)


def parse_array(spec: str) -> tuple[list[int], int | None]:
    """``--array`` SPEC: the indices (sorted, each once) and the %N cap (None: no cap)."""
    text, pct, cap_text = spec.strip().partition("%")
    cap = None
    try:
        if pct:
            cap = _number(cap_text, "the cap after %")
            if not 1 <= cap <= bounds.MAX_ARRAY:
                raise ValueError(f"the cap after % must be from 1 to {bounds.MAX_ARRAY}")
        indices: set[int] = set()
        for part in text.split(","):
            part = part.strip()
            body, colon, step_text = part.partition(":")
            step = _number(step_text, "the step after :") if colon else 1
            if step < 1:
                raise ValueError("the step after : must be at least 1")
            low_text, dash, high_text = body.partition("-")
            low = _number(low_text, "index")
            high = _number(high_text, "index") if dash else low
            if high < low:
                raise ValueError(f"{part!r} runs backwards")
            if high > bounds.MAX_ARRAY_INDEX:
                raise ValueError(f"indices go up to {bounds.MAX_ARRAY_INDEX}")
            if (high - low) // step + 1 + len(indices) > bounds.MAX_ARRAY:
                raise ValueError(f"at most {bounds.MAX_ARRAY} jobs may be submitted at once")
            indices.update(range(low, high + 1, step))
    except ValueError as exc:
        raise ValueError(f"--array {bounds.shown(spec)}: {exc}; {ARRAY_FORMS}") from None
    return sorted(indices), cap


def parse_commands(text: str, source: str) -> list[str]:
    """``--commands``: one shell command a line; blank lines and ``#`` comment lines are skipped."""
    lines = [line.strip() for line in text.splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    if not commands:
        raise ValueError(f"--commands {source}: no commands in it (one shell command a line)")
    if len(commands) > bounds.MAX_ARRAY:
        raise ValueError(f"--commands {source}: {len(commands)} commands; at most {bounds.MAX_ARRAY} "
                         f"may be submitted at once")
    if any("\0" in c for c in commands):
        raise ValueError(f"--commands {source}: a line holds a NUL byte")
    return commands


def parse_range(text: str, most: int) -> list[int]:
    """The job ids of ``A-B`` (both ends included), at most *most* of them."""
    low_text, _, high_text = text.partition("-")
    if max(len(low_text), len(high_text)) > len(str(bounds.MAX_ID)):   # (and int() of any length is slow)
        raise ValueError(f"job range {bounds.shown(text)}: no job has an id that large "
                         f"(they go up to {bounds.MAX_ID})")
    low, high = int(low_text), int(high_text)
    if low < 1 or high < low:
        raise ValueError(f"job range {bounds.shown(text)}: expected FIRST-LAST with 1 <= FIRST <= LAST, e.g. 12-40")
    if high - low + 1 > most:
        raise ValueError(f"job range {bounds.shown(text)} names {high - low + 1} jobs; at most {most} at once")
    return list(range(low, high + 1))


def format_ids(ids: list[int]) -> str:
    """``12-40`` for a run of consecutive ids, else the ids (or names) comma-separated."""
    if len(ids) > 1 and all(isinstance(i, int) for i in ids) and ids == list(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(str(i) for i in ids)

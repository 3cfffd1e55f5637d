"""The job-name rule, and job references by name (pure; cheap to import for ``dispatch``)."""

MAX_NAME = 64


def valid_name(name: object) -> bool:
    """A --name: 1-64 letters, digits, '.', '_' or '-', not all digits (those are ids)."""
    return (isinstance(name, str) and 0 < len(name) <= MAX_NAME and name.isascii() and not name.isdigit()
            and all(c.isalnum() or c in "._-" for c in name))


MAX_USER = 32          # a login name in a qualified <job> reference (useradd's own limit)


def split_ref(text: str) -> tuple[str | None, str] | None:
    """A job name as a <job> reference: ``NAME`` (the caller's) or ``USER:NAME``; None if neither.

    A name alone always means the caller's own newest job of that name, for
    admins too: another user's job is named by id, or as ``USER:NAME``.
    """
    user, colon, name = text.rpartition(":")
    if not colon:
        return (None, name) if valid_name(name) else None
    if not (0 < len(user) <= MAX_USER and user.isascii() and user[0] != "-"
            and all(c.isalnum() or c in "._-" for c in user.removesuffix("$"))):
        return None
    return (user, name) if valid_name(name) else None


def log_name(job_id: int) -> str:
    """The default log file name."""
    return f"output.{job_id}.log"


def env_word(word: str) -> bool:
    """NAME=VALUE with NAME a shell variable name (what env(1) takes as an assignment)."""
    name, eq, _ = word.partition("=")
    return bool(eq) and bool(name) and name[0] in _NAME_START and all(c in _NAME_REST for c in name)


_NAME_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")


_NAME_REST = _NAME_START | frozenset("0123456789")

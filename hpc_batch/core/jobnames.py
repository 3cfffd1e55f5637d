"""The job-name rule, and job references by name (pure; cheap to import for ``dispatch``)."""

MAX_NAME = 64
NAME_PUNCTUATION = "._-"   # besides ASCII letters and digits, all a name may hold
# The rule in words, for every message that refuses a name (client, daemon, PSI/J).
NAME_RULE = (f"a job name is 1-{MAX_NAME} letters, digits, '.', '_' or '-', and not only digits, "
             f"a negative number, FIRST-LAST digits, or digits and '_' alone (those are job ids, ranges "
             f"and array elements, or read as such)")


def name_char(c: str) -> bool:
    """True for a character a job name may hold."""
    return c.isascii() and (c.isalnum() or c in NAME_PUNCTUATION)


def is_range(text: str) -> bool:
    """True for ``A-B`` with A and B job ids (a name cannot look like this)."""
    low, dash, high = text.partition("-")
    return bool(dash) and low.isascii() and low.isdigit() and high.isascii() and high.isdigit()


def valid_name(name: object) -> bool:
    """A --name, by :data:`NAME_RULE`: the one definition the client, daemon and PSI/J bridge share."""
    from .arrayref import looks_like
    return stored_name(name) and not str(name).lstrip("-").isdigit() and not looks_like(str(name))


def stored_name(name: object) -> bool:
    """A name a stored job may hold: the rule before negative numbers were refused (a job named
    ``-5`` by an older daemon still loads; it is named by its id)."""
    return (isinstance(name, str) and 0 < len(name) <= MAX_NAME and not name.isdigit()
            and all(name_char(c) for c in name) and not is_range(name))


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
            and all(name_char(c) for c in user.removesuffix("$"))):
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

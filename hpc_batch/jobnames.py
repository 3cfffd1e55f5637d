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

"""Becoming the job's user: the one privilege drop, checked after it is made.

Used by every process that acts for a user (the job itself, the copy of its
output, the relay past the buffer bound). A drop that did not fully happen,
or that root could undo, raises instead of carrying on as root.
"""

import os


def groups_of(user: str, gid: int) -> list[int] | None:
    """*user*'s groups as initgroups(3) would set them (None where they cannot be had, or not root).

    Looked up once by the shepherd and handed to each child that drops to the
    user, so the lookup (NSS: /etc/group, perhaps a directory service) is not
    repeated in each of them.
    """
    if os.geteuid() != 0:
        return None
    try:
        return os.getgrouplist(user, gid)
    except (OSError, KeyError, ValueError):
        return None   # each child then asks initgroups, and reports its failure as before


def become(user: str, uid: int, gid: int, groups: list[int] | None = None) -> None:
    """Drop to *uid*/*gid* with *user*'s supplementary groups (*groups*, from :func:`groups_of`,
    or else looked up here), for good."""
    if os.geteuid() != 0:
        # A user-mode daemon runs jobs as itself and cannot change identity.
        if os.getuid() != uid:
            raise PermissionError(1, f"cannot run as {user}: not root")
        return
    if groups is None:
        os.initgroups(user, gid)
    else:
        os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)
    if (os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid)):
        raise PermissionError(1, "privileges were not fully dropped")
    if uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            return
        raise PermissionError(1, "could regain root after dropping privileges")

"""Becoming the job's user: the one privilege drop, checked after it is made.

Used by every process that acts for a user (the job itself, the copy of its
output, the relay past the buffer bound). A drop that did not fully happen,
or that root could undo, raises instead of carrying on as root.
"""

import os


def become(user: str, uid: int, gid: int) -> None:
    """Drop to *uid*/*gid* with *user*'s supplementary groups, for good."""
    if os.geteuid() != 0:
        # A user-mode daemon runs jobs as itself and cannot change identity.
        if os.getuid() != uid:
            raise PermissionError(1, f"cannot run as {user}: not root")
        return
    os.initgroups(user, gid)
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

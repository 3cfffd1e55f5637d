"""Who may see and touch which job: owners, the admin group, and root."""

import grp
import os
import pwd
from dataclasses import dataclass


@dataclass(frozen=True)
class Caller:
    """A connected client, as the kernel reports it (SO_PEERCRED)."""

    uid: int
    gid: int
    pid: int
    name: str
    is_admin: bool


class AdminGroupError(ValueError):
    """--admin-group names a group that does not exist here."""


def resolve_admin_group(name: str, candidates) -> int:
    """Return the gid of *name*, or raise naming the candidate groups that exist."""
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        present = []
        for cand in candidates:
            try:
                grp.getgrnam(cand)
                present.append(cand)
            except KeyError:
                pass
        hint = (f"groups that exist here: {', '.join(present)}" if present
                else "none of " + ", ".join(candidates) + " exists either; create one (groupadd)")
        raise AdminGroupError(f"--admin-group {name!r}: no such group on this machine; {hint}") from None


def user_name(uid: int) -> str:
    """The passwd name of *uid*, or the number when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def make_caller(uid: int, gid: int, pid: int, admin_gid: int | None) -> Caller:
    """Build a Caller, deciding admin rights from the user's groups in the group database."""
    name = user_name(uid)
    admin = uid == 0
    if not admin and admin_gid is not None:
        if gid == admin_gid:
            admin = True
        else:
            try:
                admin = admin_gid in os.getgrouplist(name, gid)
            except (KeyError, OSError):
                admin = False
    return Caller(uid=uid, gid=gid, pid=pid, name=name, is_admin=admin)


"""Who may see and touch which job: owners, the admin group, and root."""

import grp
import os
import pwd
import time
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


# How long a user's name and admin right are taken from Callers' memory. A change to /etc/passwd or
# /etc/group is seen at once (their stat changes); one elsewhere in the user database (an NSS
# module, a userdb drop-in) within this time.
CALLER_FRESH = 30.0
CALLERS_KEPT = 4096      # (uid, gid) pairs remembered; the table starts afresh past that
USER_FILES = ("/etc/passwd", "/etc/group")


class Callers:
    """Each connection's Caller, with the user's name and admin right remembered for a while.

    Every connection used to look the user up afresh, on the event loop: a
    group list through NSS costs 3 ms here (nss-systemd reads every userdb
    directory), up to 13 ms, and a burst of connections after a restart
    held every client for the sum.
    """

    def __init__(self, admin_gid: int | None, clock=time.monotonic, files: tuple[str, ...] = USER_FILES):
        self.admin_gid = admin_gid
        self.clock = clock
        self.files = files
        self._known: dict[tuple[int, int], tuple[tuple, float, str, bool]] = {}

    def caller(self, uid: int, gid: int, pid: int) -> Caller:
        """The Caller for a peer the kernel reports as *uid*, *gid* and *pid*."""
        now, stamp = self.clock(), self._stamp()
        hit = self._known.get((uid, gid))
        if hit is not None and hit[0] == stamp and now - hit[1] < CALLER_FRESH:
            return Caller(uid=uid, gid=gid, pid=pid, name=hit[2], is_admin=hit[3])
        made = make_caller(uid, gid, pid, self.admin_gid)
        if len(self._known) >= CALLERS_KEPT:
            self._known.clear()
        self._known[(uid, gid)] = (stamp, now, made.name, made.is_admin)
        return made

    def _stamp(self) -> tuple:
        """What the user files are now: a change to either shows here."""
        out: list[tuple[int, int, int, int] | None] = []
        for path in self.files:
            try:
                st = os.stat(path)
                out.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
            except OSError:
                out.append(None)
        return tuple(out)


"""Per-job process options the job's child sets on itself before exec (no root needed).

* ``--aslr off``: personality(2) with ADDR_NO_RANDOMIZE added to the current
  persona, as ``setarch -R`` does; it holds from the next execve on, so the
  job's own program starts with a fixed address space layout.
* ``--thp off``: prctl(PR_SET_THP_DISABLE, 1): no transparent huge pages for
  the process and every child it forks; kept across execve.

Standard library only (ctypes), like the rest of the shepherd; ctypes is
imported only by a job that asks for one of them.

Also here: what every forked child of the shepherd does first, keep only
the descriptors it needs (``keep_only``), and the signals that stop a
shepherd, which each child puts back to their defaults (``STOP_SIGNALS``).
"""

import os
import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)   # each stops a shepherd and its job

ADDR_NO_RANDOMIZE = 0x0040000    # include/uapi/linux/personality.h
PER_QUERY = 0xFFFFFFFF           # personality(0xffffffff) answers the persona, changes nothing
PR_SET_THP_DISABLE = 41          # include/uapi/linux/prctl.h


def _ctypes():
    """ctypes, loaded by the first job that asks for --aslr off or --thp off, never by the fork server:
    each shepherd would share its pages (tests/unit/test_startup_imports.py allows this import)."""
    import ctypes
    return ctypes


def _libc():
    return _ctypes().CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> int:
    if ret == -1:
        err = _ctypes().get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def no_aslr() -> None:
    """Add ADDR_NO_RANDOMIZE to this process's persona (raises OSError if the kernel refuses)."""
    ctypes = _ctypes()
    libc = _libc()
    libc.personality.restype = ctypes.c_int
    libc.personality.argtypes = [ctypes.c_ulong]
    persona = _check(libc.personality(PER_QUERY), "personality")
    _check(libc.personality(persona | ADDR_NO_RANDOMIZE), "personality")


def no_thp() -> None:
    """PR_SET_THP_DISABLE for this process and what it execs and forks (raises OSError on refusal)."""
    ctypes = _ctypes()
    libc = _libc()
    libc.prctl.restype = ctypes.c_int
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    _check(libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0), "prctl(PR_SET_THP_DISABLE)")


def fd_ceiling() -> int:
    """One past the highest descriptor number this process may hold (capped at 2**20)."""
    try:
        return min(os.sysconf("SC_OPEN_MAX"), 1 << 20)
    except (OSError, ValueError):
        return 1 << 16


def keep_only(*fds) -> None:
    """In a forked child: close every descriptor but *fds*."""
    low = 0
    for fd in sorted(fds):
        os.closerange(max(low, 3), fd)
        low = fd + 1
    os.closerange(max(low, 3), fd_ceiling())

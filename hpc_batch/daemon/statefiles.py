"""Small file helpers every part of the state directory (store.py and its rooms) shares."""

import fcntl
import json
import os
import struct

from ..core.cputopo import format_cpulist

# FS_IOC_GETFLAGS and FS_IOC_SETFLAGS (linux/fs.h: _IOR and _IOW('f', 1 and 2, long)) in the ioctl
# encoding of asm-generic/ioctl.h, which these machines use (powerpc, mips and sparc do not: there
# the flag is not tried), and FS_TOPDIR_FL, chattr's +T.
_GENERIC_IOCTL = {"x86_64", "i386", "i686", "aarch64", "armv7l", "armv8l", "riscv64", "s390x", "loongarch64"}
_LONG = struct.calcsize("l")
GETFLAGS = (2 << 30) | (_LONG << 16) | (ord("f") << 8) | 1
SETFLAGS = (1 << 30) | (_LONG << 16) | (ord("f") << 8) | 2
TOPDIR_FL = 0x00020000


def dump(obj) -> bytes:
    """The readable JSON form of the state directory's own files (daemon.json, shared/, env/)."""
    return json.dumps(obj, indent=1, sort_keys=True).encode()


def read_json(path: str, check=None) -> dict | None:
    """A file's JSON object; None when it cannot be read, is not one, or *check*(its bytes) fails."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if check is not None and not check(raw):
            return None
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def unlink(path: str) -> None:
    """Remove *path*; one already gone is no error."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass



def spread_subdirectories(path: str) -> bool:
    """Mark the directory *path* as the top of unrelated trees (``chattr +T``); False where the file
    system or the machine has no such flag (nothing is changed then).

    ext2, ext3 and ext4 then place each new subdirectory, and the files made in it, in a block group
    of their own choosing rather than in *path*'s. The per-job directories under ``jobs/`` are such
    trees: made and deleted by the thousand in one group, on an ext4 without a journal they made each
    new inode cost a scan past every one freed there in the last minutes, which the allocator skips
    (docs/performance.md, the fourteenth look). Elsewhere the flag is only a hint.
    """
    if os.uname().machine not in _GENERIC_IOCTL:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        flags = struct.unpack("i", fcntl.ioctl(fd, GETFLAGS, bytes(4)))[0]
        if not flags & TOPDIR_FL:
            fcntl.ioctl(fd, SETFLAGS, struct.pack("i", flags | TOPDIR_FL))
        return True
    except OSError:   # ENOTTY, EOPNOTSUPP: a file system without these flags (tmpfs, xfs, btrfs)
        return False
    finally:
        os.close(fd)


def ranges(ids) -> str:
    """``1-3, 7`` for [1, 2, 3, 7]: a log line names every job, compactly."""
    return format_cpulist(ids, ", ")

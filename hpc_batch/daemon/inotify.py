"""A minimal inotify binding (ctypes, stdlib only) so attach wakes when output grows.

Without it ``dispatch attach`` would have to poll the output file; with it the
daemon sleeps until the job writes. If inotify is unavailable the server
falls back to a short timer.
"""

import ctypes
import ctypes.util
import os
import struct

IN_MODIFY = 0x2
IN_CLOSE_WRITE = 0x8
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")


class Inotify:
    """An inotify instance; ``fd`` goes into the selector."""

    def __init__(self):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        self._rm = libc.inotify_rm_watch
        self._rm.argtypes = (ctypes.c_int, ctypes.c_int)
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        self.fd = fd

    def add(self, path: str, mask: int = IN_MODIFY | IN_CLOSE_WRITE) -> int:
        """Watch *path*; returns the watch descriptor."""
        wd = self._add(self.fd, os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        return wd

    def remove(self, wd: int) -> None:
        """Stop watching (errors ignored: the file may be gone)."""
        self._rm(self.fd, wd)

    def read(self) -> set[int]:
        """Drain pending events; returns the watch descriptors that fired."""
        fired: set[int] = set()
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return fired
            pos = 0
            while pos + _EVENT.size <= len(data):
                wd, _mask, _cookie, length = _EVENT.unpack_from(data, pos)
                fired.add(wd)
                pos += _EVENT.size + length

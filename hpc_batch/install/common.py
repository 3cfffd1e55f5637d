"""The installer's names, default places and error type, shared by its modules."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hpc_batch.defaults import DEV_DIR, SOCKET, STATE_DIR

PROG = "hpc-batch-install"
SERVICE = "hpc-batch"
PACKAGE = "hpc-batch"

DEFAULT_PREFIX = "/opt/hpc-batch"
DEFAULT_BIN_DIR = "/opt/bin"
DEFAULT_SPEC = PACKAGE

# The daemon's own defaults, for --purge: one definition, in hpc_batch/defaults.py (a leaf with no
# imports of its own, so the installer still runs when the rest of the package is broken).
DEFAULT_SOCKET = SOCKET
DEFAULT_STATE_DIR = STATE_DIR
DEFAULT_DEV_DIR = DEV_DIR

EX_NOPERM = 77  # sysexits.h: not root

FLAGS = {"prefix": "--prefix", "bin_dir": "--bin-dir",
         "admin_group": "--admin-group", "spec": "--spec"}


class InstallError(Exception):
    """A refusal or failure, reported as one line and exit status 1."""


def read_head(path: Path, size: int = 4096) -> str | None:
    """The start of a plain file (never through a link, a FIFO or a device), or None.

    How the installer tells its own files (a marker near the top) from someone else's.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # missing, a symlink (ELOOP) or unreadable
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # a directory, a FIFO, a device
        return os.read(fd, size).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)

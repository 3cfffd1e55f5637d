"""The installer's names, default places and error type, shared by its modules."""

from __future__ import annotations

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

"""The installer's names, default places and error type, shared by its modules."""

from __future__ import annotations

PROG = "hpc-batch-install"
SERVICE = "hpc-batch"
PACKAGE = "hpc-batch"

DEFAULT_PREFIX = "/opt/hpc-batch"
DEFAULT_BIN_DIR = "/opt/bin"
DEFAULT_SPEC = PACKAGE

# The daemon's own defaults (hpc_batch/defaults.py), for --purge.
DEFAULT_SOCKET = "/run/hpc-batch/hpc-batch.sock"
DEFAULT_STATE_DIR = "/var/lib/hpc-batch"
DEFAULT_DEV_DIR = "/dev/hpc-batch"

EX_NOPERM = 77  # sysexits.h: not root

FLAGS = {"prefix": "--prefix", "bin_dir": "--bin-dir",
         "admin_group": "--admin-group", "spec": "--spec"}


class InstallError(Exception):
    """A refusal or failure, reported as one line and exit status 1."""

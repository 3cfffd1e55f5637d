"""The Debian package's postinst, its Python half: the venv under the prefix, from the wheels the package carries.

The postinst runs ``main`` from the package's own wheel (put on ``sys.path``,
imported from the zip), so the version being installed does its own install,
as hpc-batch-install re-execs the new version for the rest of an upgrade.
It is versions.py's upgrade: a copy of the current venv (a new one the first
time) under ``<prefix>.versions/``, ``pip install`` of the wheel into it with
pip held to the package's wheelhouse (no index, no network, no pip.conf),
written to disk, then the prefix switched to it in one rename. The rest of
the postinst (enable, start or reload the service) is shell, with Debian's
deb-systemd-helper and deb-systemd-invoke.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .common import DEFAULT_PREFIX, PACKAGE, InstallError
from .host import Host
from .steps import check_prefix, fast_dispatch
from .versions import prune, stage, switch


class Notes(Host):
    """The installer's Host, its lines under the package's name (dpkg's output carries them)."""

    def note(self, message: str) -> None:
        """Print one progress line."""
        print(f"{PACKAGE}: {message}", flush=True)


def offline_pip(wheelhouse: Path) -> dict[str, str]:
    """pip's environment for a root install from ``wheelhouse`` alone, whatever the machine's pip.conf says."""
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse), "PIP_CONFIG_FILE": os.devnull,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1", "PIP_ROOT_USER_ACTION": "ignore"}


def configure(wheel: Path, prefix: Path = Path(DEFAULT_PREFIX)) -> Path:
    """Install ``wheel`` (with the wheels beside it) as a new venv the prefix names; its path."""
    notes = Notes()
    os.umask(0o022)   # users run dispatch from the venv, whatever root's umask is
    os.environ.update(offline_pip(wheel.parent))
    check_prefix(prefix)
    prune(prefix, notes)   # earlier versions nothing runs from any more
    staged = stage(prefix, str(wheel), notes, lambda venv: fast_dispatch(venv, notes))
    switch(prefix, staged, notes)
    return staged


def main(argv: list[str]) -> int:
    """``main([WHEEL])``, as the postinst calls it; its exit status."""
    if len(argv) != 1 or not argv[0].endswith(".whl"):
        sys.stderr.write(f"{PACKAGE}: usage: main([WHEEL]), the package's own hpc_batch wheel\n")
        return 2
    try:
        configure(Path(argv[0]))
    except InstallError as exc:
        sys.stderr.write(f"{PACKAGE}: {exc}\n")
        return 1
    return 0

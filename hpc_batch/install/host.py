"""The machine as the installer sees it: its paths, systemctl, groups, the venv's files."""

from __future__ import annotations

import grp
import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import manpages
from .common import DEFAULT_DEV_DIR, DEFAULT_SOCKET, DEFAULT_STATE_DIR, PROG, InstallError, read_head
from .debian import WHEELHOUSE
from .texts import is_our_completion

UNIT_DATA = ("hpc_batch", "data", "hpc-batch.service")

# Shell completion for dispatch: packaged under hpc_batch/data/completion,
# installed where Debian's bash-completion and zsh look (Paths). Each
# packaged file carries this line near its top (the zsh one after its
# #compdef line): a file there without it is someone else's and is left
# alone, by installs and by --uninstall alike.
COMPLETION_DATA = ("hpc_batch", "data", "completion")


@dataclass(frozen=True)
class Paths:
    """Every system location the installer touches; tests point them elsewhere."""

    unit: Path = Path("/etc/systemd/system/hpc-batch.service")
    dropins: Path = Path("/etc/systemd/system/hpc-batch.service.d")
    profile: Path = Path("/etc/profile.d/hpc-batch.sh")
    record: Path = Path("/etc/hpc-batch/install.json")
    # There while the Debian package is installed (its wheels): dpkg, not this installer, manages hpc-batch.
    deb_wheelhouse: Path = Path(WHEELHOUSE)
    # Debian's: bash-completion loads the first on `dispatch <TAB>`; zsh's
    # fpath holds the second's directory.
    bash_completion: Path = Path("/usr/share/bash-completion/completions/dispatch")
    zsh_completion: Path = Path("/usr/share/zsh/vendor-completions/_dispatch")
    # man-db searches it whatever PATH holds (MANDATORY_MANPATH): see manpages.py.
    man_dir: Path = Path("/usr/local/share/man")
    cgroup: Path = Path("/sys/fs/cgroup/hpc-batch")
    proc: Path = Path("/proc")
    systemd_booted: Path = Path("/run/systemd/system")
    # Also removed by --purge when the unit names other ones: systemd
    # creates these from StateDirectory=/RuntimeDirectory= regardless.
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    dev_dir: Path = Path(DEFAULT_DEV_DIR)
    run_dir: Path = Path(os.path.dirname(DEFAULT_SOCKET))


def _systemctl(*args: str) -> int:
    try:
        return subprocess.run(["systemctl", *args]).returncode
    except FileNotFoundError:
        return 127


@dataclass
class Host:
    """The installer's view of the machine: paths, systemctl and output."""

    paths: Paths = Paths()
    systemctl: Callable[..., int] = _systemctl
    out: Callable[[str], None] = print

    def note(self, message: str) -> None:
        """Print one progress line."""
        self.out(f"{PROG}: {message}")

    @property
    def booted(self) -> bool:
        """Whether systemd runs this machine (sd_booted's test)."""
        return self.paths.systemd_booted.is_dir()


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` so no reader sees half a file (the project's one atomic write)."""
    from shepherd.base.records import write_atomic as replace
    path.parent.mkdir(parents=True, exist_ok=True)
    replace(str(path), text.encode(), mode)


def existing_groups() -> list[str]:
    """Names of the groups this machine knows."""
    return [g.gr_name for g in grp.getgrall()]


def group_exists(name: str) -> bool:
    """Whether ``name`` resolves as a group (files, LDAP, ...)."""
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def site_packages(prefix: Path) -> list[Path]:
    """The venv's site-packages directories, newest Python last."""
    return sorted(prefix.glob("lib/python3*/site-packages"),
                  key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)])


def installed_version(prefix: Path) -> str | None:
    """The hpc-batch version pip installed into ``prefix``, from its dist-info."""
    for sp in reversed(site_packages(prefix)):
        for info in sp.glob("hpc_batch-*.dist-info"):
            return info.name[len("hpc_batch-"):-len(".dist-info")]
    return None


def find_unit_template(prefix: Path) -> Path:
    """The packaged unit: the prefix venv's copy, this package's, the checkout's."""
    here = Path(__file__).resolve().parent.parent   # hpc_batch/, where data/ is
    candidates = [sp.joinpath(*UNIT_DATA) for sp in reversed(site_packages(prefix))]
    candidates.append(here / "data" / UNIT_DATA[-1])
    candidates.append(here.parent / "dist" / "systemd" / UNIT_DATA[-1])
    for path in candidates:
        if path.is_file():
            return path
    raise InstallError(f"no packaged unit file found (looked in {prefix} and {here}); "
                       "reinstall the package")


def man_sources(prefix: Path) -> list[Path]:
    """Where the packaged manual pages may be: the prefix venv's, else this package's."""
    here = Path(__file__).resolve().parent.parent   # hpc_batch/, where data/ is
    return [*(sp.joinpath(*manpages.DATA) for sp in reversed(site_packages(prefix))),
            here.joinpath(*manpages.DATA[1:])]


def find_completion(prefix: Path, name: str) -> Path | None:
    """The packaged completion file ``name``: the prefix venv's copy, else this package's."""
    here = Path(__file__).resolve().parent.parent   # hpc_batch/, where data/ is
    candidates = [sp.joinpath(*COMPLETION_DATA, name) for sp in reversed(site_packages(prefix))]
    candidates.append(here.joinpath(*COMPLETION_DATA[1:], name))
    for path in candidates:
        if path.is_file():
            return path
    return None


def completion_files(paths: Paths) -> list[tuple[str, str, Path]]:
    """(packaged name, shell, where it is installed) for each shell's completion."""
    return [("dispatch.bash", "bash", paths.bash_completion),
            ("_dispatch", "zsh", paths.zsh_completion)]


def completion_is_ours(path: Path) -> bool:
    """Whether ``path`` is a plain file (not a link) that hpc-batch-install wrote."""
    head = read_head(path)
    return head is not None and is_our_completion(head)

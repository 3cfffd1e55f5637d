"""One venv per installed version, and a symlink switched in one rename: an upgrade a power cut cannot split.

The prefix (``/opt/hpc-batch``) is a symlink to a venv under
``<prefix>.versions/`` (``/opt/hpc-batch.versions/20250101T120000``). An
upgrade never writes into the venv the prefix names:

1. ``stage``: a copy of the current venv (so what it has, the dependencies
   among it, is there without a network) under a new name, its own paths
   written into its scripts, then ``pip install --upgrade SPEC`` into the
   copy (a first install makes a new venv instead), the client script
   rewritten, and everything written out to disk with ``sync``;
2. ``switch``: a new symlink, renamed over the prefix (rename(2) replaces
   it whole), and the directory holding it fsynced.

A power cut before the rename leaves the prefix on the old venv, whole; after
it, on the new one, whole. The unit starts ``hpc-batchd`` through the prefix
(through the bin dir's links), and a reload re-execs the unit's ``ExecStart``,
so both a boot and a reload run the version the prefix names, and a daemon
running meanwhile keeps running its own venv's files, untouched. A staging
cut short leaves a directory nothing names: the next upgrade removes it.

The replaced venv is kept (a rollback is ``ln -sfn`` to it, and the old
shepherds still run from it); the one before is removed by the next upgrade
(``prune``), unless a process still runs from it (its command line names it).

An install made before this layout (the prefix a venv itself) is moved to it
by its first upgrade: the new symlink and the old venv swap names in one
``renameat2(RENAME_EXCHANGE)``, then the old venv moves under ``.versions``.
Where the filesystem cannot exchange, the two renames happen one after the
other, and the installer says so.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .common import InstallError
from .safety import require_root_only, safe_to_remove

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def versions_dir(prefix: Path) -> Path:
    """Where the venvs live: beside the prefix, ``<prefix>.versions``."""
    return prefix.with_name(prefix.name + ".versions")


def current(prefix: Path) -> Path | None:
    """The venv the prefix names: itself (the older layout), its symlink's target, or None."""
    if not os.path.lexists(prefix):
        return None
    return Path(os.path.realpath(prefix))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _new_name(vdir: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    path, n = vdir / stamp, 1
    while os.path.lexists(path):
        n += 1
        path = vdir / f"{stamp}.{n}"
    return path


def relocate(venv: Path, old: Path) -> None:
    """Point a copied venv's scripts (#! lines, the client's paths, activate's VIRTUAL_ENV) and pyvenv.cfg at itself."""
    # The old path as a whole name: followed by a slash, a quote, a blank or the end, never "hpc-batch.versions".
    was = re.compile(re.escape(os.fsencode(str(old))) + rb"(?=[/\"'\s]|$)")
    scripts = [p for p in (venv / "bin").iterdir() if p.is_file() and not p.is_symlink()]
    for path in [*scripts, venv / "pyvenv.cfg"]:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        fixed = was.sub(lambda _: os.fsencode(str(venv)), data)
        if fixed == data:
            continue
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(fixed)
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)


def stage(prefix: Path, spec: str, host, finish) -> Path:
    """A new venv under ``<prefix>.versions`` with ``spec`` installed, all of it on disk; its path.

    ``finish(venv)`` runs last before the sync (the client script's rewrite).
    """
    vdir = versions_dir(prefix)
    if os.path.lexists(vdir):
        require_root_only("--prefix", str(vdir), missing_ok=False)
    else:
        vdir.mkdir(mode=0o755, parents=True)
        os.chmod(vdir, 0o755)   # every user runs dispatch from under it
    old = current(prefix)
    new = _new_name(vdir)
    try:
        if old is not None and (old / "bin" / "python").exists():
            host.note(f"copying {old} to {new}, to upgrade the copy")
            try:
                shutil.copytree(old, new, symlinks=True)
                relocate(new, old)
            except (OSError, shutil.Error) as exc:   # a full disk, say
                raise InstallError(f"could not copy {old} to {new}: {exc}; {prefix} was not changed") from None
        else:
            host.note(f"creating a venv at {new}")
            # -I: not the working directory's modules (a user's venv.py, say) as root.
            if subprocess.run([sys.executable, "-I", "-m", "venv", str(new)]).returncode != 0:
                raise InstallError(f"could not create a venv at {new} (on Debian/Ubuntu: "
                                   "apt-get install python3-venv)")
        host.note(f"pip install --upgrade {spec} into {new}")
        # -I keeps the working directory off sys.path: a pip/ there would run as root.
        rc = subprocess.run([str(new / "bin" / "python"), "-I", "-m", "pip", "install",
                             "--disable-pip-version-check", "--upgrade", spec]).returncode
        if rc != 0:
            raise InstallError(f"pip could not install {spec!r}; {prefix} was not changed")
        finish(new)
    except BaseException:
        if safe_to_remove(str(new)):
            shutil.rmtree(new, ignore_errors=True)
        raise
    # Every file of the new venv on disk before anything names it: sync(2) waits for it all.
    os.sync()
    return new


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` in one step (renameat2); False where this kernel or filesystem cannot."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:   # a libc without the wrapper (glibc before 2.28)
        return False
    if fn(_AT_FDCWD, os.fsencode(str(a)), _AT_FDCWD, os.fsencode(str(b)), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def switch(prefix: Path, new: Path, host) -> Path | None:
    """Make the prefix name ``new`` in one rename, on disk once this returns; the venv it named before."""
    old = current(prefix)
    link = prefix.with_name(f".{prefix.name}.switch")
    if os.path.lexists(link):
        link.unlink()
    os.symlink(os.path.relpath(new, prefix.parent), link)
    if os.path.lexists(prefix) and not prefix.is_symlink():
        # The older layout: the prefix is the venv. It takes the link's name, the link takes its own.
        kept = versions_dir(prefix) / f"before-{new.name}"
        if _exchange(link, prefix):
            os.rename(link, kept)
        else:
            host.note(f"this filesystem cannot swap two names in one step: moving {prefix} to {kept} "
                      f"first (a power cut right now would leave no {prefix}; run this again then)")
            os.rename(prefix, kept)
            os.rename(link, prefix)
        _fsync_dir(kept.parent)
        old = kept
    else:
        os.replace(link, prefix)
    _fsync_dir(prefix.parent)
    host.note(f"{prefix} now names {new}")
    return old


def _in_use(paths: list[Path], proc: Path) -> set[Path]:
    """Those of ``paths`` that a running process's command line names (a daemon's or shepherd's python)."""
    used: set[Path] = set()
    marks = {p: os.fsencode(str(p)) + b"/" for p in paths}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        used.update(p for p, mark in marks.items() if mark in cmdline)
    return used


def prune(prefix: Path, host, proc: Path = Path("/proc")) -> None:
    """Remove the venvs under ``.versions`` but the prefix's own and those a process runs from.

    Run before a new one is staged: what is left after the switch is the new
    venv, the one it replaced, and any older one still in use.
    """
    vdir = versions_dir(prefix)
    if not vdir.is_dir() or vdir.is_symlink():
        return
    keep = current(prefix)
    others = [p for p in vdir.iterdir() if p != keep]
    busy = _in_use(others, proc)
    for path in others:
        if path in busy:
            host.note(f"kept {path}: a running process uses it")
        elif safe_to_remove(str(path)):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            host.note(f"removed {path}, an older version")

"""Build ``hpc-batch_<version>_all.deb`` from a clone: what ``scripts/build-deb`` runs.

1. copies the tree (``pyproject.toml``, ``README.md``, ``LICENSE``,
   ``hpc_batch``, ``shepherd``, ``dist``) and, with ``--local N``, gives the
   copy the version ``<version>+N`` (a newer package of the same tree);
2. ``pip wheel`` of the copy: the project's wheel and its dependencies'
   (docopt-ng), each checked pure (``py3-none-any``), which is what lets the
   package be ``Architecture: all``;
3. lays out the package from the project's wheel, so the .deb holds what the
   wheel holds: the wheels under debian.WHEELHOUSE, the unit (filled as the
   installer fills it), the manual pages gzipped, the bash and zsh
   completion, links in /usr/bin, the copyright and changelog, lintian's
   overrides (each with its reason) and the maintainer scripts of
   ``dist/debian`` filled in (debian.script);
4. ``dpkg-deb --build --root-owner-group`` (Debian's own tool; no
   debhelper, as there is no source package to build).

The version is the wheel's metadata's, mapped to Debian's ordering
(debian.debian_version). Everything gets the mtime of ``$SOURCE_DATE_EPOCH``
(else the last commit's), so two builds of one tree are the same file.
"""

from __future__ import annotations

import argparse
import email.utils
import gzip
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from . import debian
from .common import DEFAULT_PREFIX, SERVICE
from .host import COMPLETION_DATA, UNIT_DATA, Paths, completion_files
from .manpages import DATA as MAN_DATA

PROG = "build-deb"
TREE = ("pyproject.toml", "README.md", "LICENSE", "hpc_batch", "shepherd", "dist")
_VERSION_LINE = re.compile(r'^__version__ = "([^"]+)"$', re.M)


class BuildError(Exception):
    """A build that cannot go on; its message says why and what to do."""


def copy_tree(root: Path, dest: Path, local: str | None) -> None:
    """The files a wheel is built from, copied; with ``local``, the copy's version gets that local part."""
    for name in TREE:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.is_file():
            shutil.copy2(src, dest / name)
    if local is None:
        return
    init = dest / "hpc_batch" / "__init__.py"
    text = init.read_text()
    found = _VERSION_LINE.search(text)
    if not found:
        raise BuildError(f"{init} has no line __version__ = \"...\"")
    new = debian.with_local(found.group(1), local)
    init.write_text(text[:found.start(1)] + new + text[found.end(1):])


def build_wheels(python: str, src: Path, out: Path) -> list[Path]:
    """``pip wheel`` of ``src`` into ``out``: the project's wheel and its dependencies'."""
    if subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        raise BuildError(f"--python {python}: it cannot run pip; name a python that can (a venv's)")
    r = subprocess.run([python, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
                        "-w", str(out), str(src)])
    if r.returncode != 0:
        raise BuildError(f"pip wheel failed (exit {r.returncode}); it needs the package index for "
                         "hatchling and docopt-ng, or PIP_FIND_LINKS naming a directory that has them")
    wheels = sorted(out.glob("*.whl"))
    impure = [w.name for w in wheels if not debian.is_pure_wheel(w.name)]
    if impure:
        raise BuildError(f"{', '.join(impure)} has compiled code: an Architecture: all package "
                         "cannot carry it")
    return wheels


def wheel_version(wheel: Path) -> str:
    """The ``Version:`` of the wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        for line in z.read(meta).decode().splitlines():
            if line.startswith("Version: "):
                return line.split(" ", 1)[1].strip()
    raise BuildError(f"{wheel.name} has no Version in its metadata")


def _put(tree: Path, path: str, data: bytes, mode: int = 0o644) -> None:
    dest = tree / path.lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    os.chmod(dest, mode)


def _gzip(data: bytes) -> bytes:
    # No name and no time in the header (lintian's and reproducible builds' rule), best compression.
    return gzip.compress(data, compresslevel=9, mtime=0)


def lay_out(tree: Path, wheels: list[Path], root: Path, when: int, env: dict[str, str]) -> str:
    """Fill ``tree`` with the package's files and DEBIAN/; the version it is."""
    (project,) = [w for w in wheels if w.name.startswith("hpc_batch-")]
    version = wheel_version(project)
    maint = debian.maintainer(env)
    with zipfile.ZipFile(project) as z:
        def data(*parts: str) -> bytes:
            return z.read("/".join(parts))
        _put(tree, debian.UNIT_PATH, debian.unit(data(*UNIT_DATA).decode()).encode())
        for page in debian.MAN_PAGES:
            section = page.rsplit(".", 1)[1]
            _put(tree, f"/usr/share/man/man{section}/{page}.gz", _gzip(data(*MAN_DATA, page)))
        for name, _shell, dest in completion_files(Paths()):
            _put(tree, str(dest), data(*COMPLETION_DATA, name))
    for wheel in wheels:
        _put(tree, f"{debian.WHEELHOUSE}/{wheel.name}", wheel.read_bytes())
    bindir = tree / debian.BIN_DIR.lstrip("/")
    bindir.mkdir(parents=True, exist_ok=True)
    for name in debian.LINKED:
        os.symlink(f"{DEFAULT_PREFIX}/bin/{name}", bindir / name)
    date = email.utils.formatdate(when, usegmt=False)
    _put(tree, f"{debian.DOC_DIR}/copyright",
         debian.copyright_file((root / "LICENSE").read_text()).encode())
    _put(tree, f"{debian.DOC_DIR}/changelog.gz", _gzip(debian.changelog(version, maint, date).encode()))
    _put(tree, debian.LINTIAN_OVERRIDES, (root / "dist" / "debian" / "lintian-overrides").read_bytes())

    values = {"WHEEL": f"{debian.WHEELHOUSE}/{project.name}", "WHEELHOUSE": debian.WHEELHOUSE,
              "PREFIX": DEFAULT_PREFIX, "SERVICE": SERVICE, "RECORD": str(Paths.record),
              "STATE_DIR": str(Paths.state_dir)}
    uninstall_sh = (root / "uninstall.sh").read_text()
    for name in debian.SCRIPTS:
        template = (root / "dist" / "debian" / name).read_text()
        _put(tree, f"DEBIAN/{name}", debian.script(template, values, uninstall_sh).encode(), 0o755)
    _put(tree, "DEBIAN/md5sums", _md5sums(tree).encode())
    _put(tree, "DEBIAN/control", debian.control(version, _installed_kib(tree), maint).encode())
    for path in [tree, *tree.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            os.chmod(path, 0o755)
        os.utime(path, (when, when), follow_symlinks=False)
    return version


def _files(tree: Path) -> list[Path]:
    return sorted(p for p in tree.rglob("*") if p.is_file() and not p.is_symlink()
                  and p.relative_to(tree).parts[0] != "DEBIAN")


def _md5sums(tree: Path) -> str:
    return "".join(f"{hashlib.md5(p.read_bytes()).hexdigest()}  {p.relative_to(tree)}\n" for p in _files(tree))


def _installed_kib(tree: Path) -> int:
    # As dpkg-gencontrol counts: each file's size in KiB rounded up, and one for each other entry.
    entries = [p for p in tree.rglob("*") if p.relative_to(tree).parts[0] != "DEBIAN"]
    return sum(-(-p.stat().st_size // 1024) if p.is_file() and not p.is_symlink() else 1 for p in entries)


def source_date(root: Path, env: dict[str, str]) -> int:
    """The build's timestamp: $SOURCE_DATE_EPOCH, else the last commit's time, else now."""
    if env.get("SOURCE_DATE_EPOCH", "").isdigit():
        return int(env["SOURCE_DATE_EPOCH"])
    try:
        r = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%ct"],
                           capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip().isdigit():
            return int(r.stdout.strip())
    except OSError:
        pass
    return int(time.time())


def build(root: Path, out: Path, python: str, local: str | None) -> Path:
    """Build the package from the clone at ``root`` into ``out``; its path."""
    if shutil.which("dpkg-deb") is None:
        raise BuildError("dpkg-deb is missing (Debian's dpkg package has it)")
    env = dict(os.environ)
    when = source_date(root, env)
    with tempfile.TemporaryDirectory(prefix="hpc-batch-deb.") as tmp:
        work = Path(tmp)
        (work / "src").mkdir()
        copy_tree(root, work / "src", local)
        wheels = build_wheels(python, work / "src", work / "wheels")
        tree = work / "tree"
        version = lay_out(tree, wheels, root, when, env)
        out.mkdir(parents=True, exist_ok=True)
        deb = out / f"{debian.PACKAGE}_{debian.debian_version(version).split(':')[-1]}_all.deb"
        r = subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)],
                           env={**env, "SOURCE_DATE_EPOCH": str(when)}, stdout=subprocess.DEVNULL)
        if r.returncode != 0:
            raise BuildError(f"dpkg-deb --build failed (exit {r.returncode})")
    return deb


def main(argv: list[str] | None = None) -> int:
    """``python -m hpc_batch.install.debbuild``: scripts/build-deb's command line."""
    p = argparse.ArgumentParser(prog=PROG, description="Build hpc-batch_<version>_all.deb from this clone.")
    p.add_argument("--out", metavar="DIR", default="dist", help="where to write the .deb (default: dist)")
    p.add_argument("--local", metavar="N", help="build version <version>+N, newer than <version> "
                   "(to test an upgrade with a second package of the same tree)")
    p.add_argument("--python", metavar="PY", default=sys.executable,
                   help="a python with pip, to build the wheels with (default: this one)")
    args = p.parse_args(argv)
    if args.local is not None:
        try:
            debian.with_local("0", args.local)   # refused before anything is built
        except ValueError as exc:
            p.error(str(exc))   # exit status 2, as for every bad argument
    root = Path(__file__).resolve().parents[2]
    try:
        if not (root / "pyproject.toml").is_file() or not (root / "dist" / "debian").is_dir():
            raise BuildError(f"{root} is not a clone of hpc-batch; run scripts/build-deb in one")
        deb = build(root, Path(args.out).resolve(), args.python, args.local)
    except (BuildError, ValueError) as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return 1
    print(deb)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Root's rule for the paths it installs from and into, and for what --purge deletes.

The installer runs as root and so does what it installs: pip builds a
checkout or an sdist with root's rights, and the daemon runs from the
venv. Whoever can change such a path, or swap a directory above it for
their own, can run code as root. So each is refused unless only root can
change it: the path and every directory above it owned by root and not
group- or world-writable (an ACL that grants a user write shows in the
group bits). A sticky directory like /tmp passes as a parent only: there
nobody else can rename or delete the root-owned entry below it.

install.sh copies this rule (its ROOT_ONLY_PY runs find_unsafe's walk
before any Python of the package can); a test holds the two equal.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .choices import spec_path
from .common import FLAGS, InstallError

# Never rm -rf these, whatever a unit file's --state-dir says.
_PROTECTED = {"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64",
              "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp",
              "/usr", "/var", "/var/lib", "/var/run", "/var/tmp", "/usr/local",
              "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"}


def safe_to_remove(path: str) -> bool:
    """Whether ``path`` may be deleted recursively by --purge."""
    norm = os.path.normpath(path)
    return os.path.isabs(norm) and norm not in _PROTECTED and norm.count("/") >= 2


_WRITE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH
_MAX_SYMLINKS = 40  # as many as the kernel follows before ELOOP


@dataclass(frozen=True)
class Unsafe:
    """The component of a path that makes it unsafe for root, and why.

    ``kind`` is one of: "owner" (not owned by root), "link-owner" (a
    symlink not owned by root), "writable" (group- or world-writable),
    "shared-missing" (absent from a sticky directory others can write, so
    anyone may create it first; ``detail`` names that directory),
    "missing", "loop" (too many symlinks), "unreadable" (lstat failed;
    ``detail`` says why).
    """

    component: str
    kind: str
    uid: int | None = None
    mode: int | None = None
    detail: str = ""


def _steps(path: str) -> list[str]:
    """The components of ``path`` in walking order, "/" first if absolute."""
    names = [name for name in path.split("/") if name and name != "."]
    return ["/", *names] if path.startswith("/") else names


def _shared(st: os.stat_result) -> bool:
    """Whether ``st`` is a sticky directory others may create entries in."""
    return (stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISVTX)
            and bool(st.st_mode & _WRITE_BY_OTHERS))


def find_unsafe(path: str, lstat: Callable[[str], os.stat_result] = os.lstat,
                readlink: Callable[[str], str] = os.readlink, *,
                missing_ok: bool = False) -> Unsafe | None:
    """The first component of absolute ``path`` someone but root could change.

    Walks from / down with ``lstat`` and ``readlink`` (tests pass fakes),
    following root-owned symlinks by walking their targets; a symlink owned
    by anyone else is refused, as they could repoint it. Returns None when
    only root can change ``path``. With ``missing_ok`` a path that does not
    exist yet is fine when its existing part is, as the installer creates
    the rest as root; unless it would go straight into a sticky directory,
    where anyone can create that name first.
    """
    if not path.startswith("/"):
        raise ValueError(f"not an absolute path: {path!r}")
    todo = _steps(path)[::-1]  # a stack: the next component last
    current, mode, shared, links = "", 0, False, 0
    while todo:
        name = todo.pop()
        if name == "..":
            # current holds no symlinks, so its parent was walked already.
            current = os.path.dirname(current)
            st = lstat(current)
            mode, shared = st.st_mode, _shared(st)
            continue
        child = os.path.join(current, name)
        try:
            st = lstat(child)
        except FileNotFoundError:
            if shared:
                return Unsafe(child, "shared-missing", detail=current)
            return None if missing_ok else Unsafe(child, "missing")
        except OSError as exc:
            return Unsafe(child, "unreadable", detail=exc.strerror or str(exc))
        is_link = stat.S_ISLNK(st.st_mode)
        if st.st_uid != 0:
            return Unsafe(child, "link-owner" if is_link else "owner", uid=st.st_uid)
        if is_link:
            links += 1
            if links > _MAX_SYMLINKS:
                return Unsafe(child, "loop")
            target = readlink(child)
            if target.startswith("/"):
                current = ""
            todo.extend(_steps(target)[::-1])
            continue
        if st.st_mode & _WRITE_BY_OTHERS and not _shared(st):
            return Unsafe(child, "writable", uid=0, mode=st.st_mode)
        current, mode, shared = child, st.st_mode, _shared(st)
    if shared:
        # A sticky directory passes as a parent, but not as the path itself.
        return Unsafe(current, "writable", uid=0, mode=mode)
    return None


# What root does with each checked path, for the refusal.
_ROOT_USES = {"--spec": "pip installs it as root",
              "--prefix": "the daemon runs as root from this venv",
              "--bin-dir": "root runs the commands linked into it"}


def unsafe_message(flag: str, path: str, found: Unsafe,
                   owner_name: Callable[[int], str]) -> str:
    """One line: why ``flag path`` is refused, naming the culprit, and the fix."""
    where = found.component
    if found.kind == "missing":
        return f"{flag} {path}: {where} does not exist"
    if found.kind in ("owner", "link-owner"):
        assert found.uid is not None  # set for these kinds
        link = "a symlink " if found.kind == "link-owner" else ""
        problem = f"{where} is {link}owned by {owner_name(found.uid)}, not root"
    elif found.kind == "writable":
        assert found.mode is not None  # set for this kind
        who = " and ".join(w for bit, w in ((stat.S_IWGRP, "its group"),
                                            (stat.S_IWOTH, "everyone"))
                           if found.mode & bit)
        problem = f"{where} is writable by {who} (mode {stat.S_IMODE(found.mode):04o})"
    elif found.kind == "shared-missing":
        problem = f"{where} does not exist and anyone can create it first in {found.detail}"
    elif found.kind == "loop":
        problem = f"{where} has too many levels of symlinks"
    else:
        problem = f"{where} cannot be checked ({found.detail})"

    copy = ("install from a root-owned copy in a directory only root can write to "
            "(e.g. `cp -r` it under /root, then `chown -R root:` the copy)")
    if found.kind == "shared-missing":
        fix = (f"create it as root first (mkdir -m 755 {where}) or choose a path "
               f"outside {found.detail}")
    elif found.kind == "writable" and found.mode is not None and found.mode & stat.S_ISVTX:
        # Only the path itself gets here: /tmp and the like are for everyone.
        fix = f"use a directory of root's own, not {where} itself"
    elif found.kind == "writable":
        fix = f"run `chmod go-w {where}`" + (f", or {copy}" if flag == "--spec" else "")
    elif where == path and found.kind == "owner":
        fix = f"run `chown -R root: {path} && chmod -R go-w {path}`"
        fix += ", or install from a root-owned copy" if flag == "--spec" else ""
    elif flag == "--spec":
        fix = copy
    else:
        fix = f"choose a {flag} whose every directory only root can write to"
    return (f"refusing {flag} {path}: {problem}, and {_ROOT_USES.get(flag, 'root uses it')}, "
            f"so whoever can change it can run code as root; {fix}")


def owner_name(uid: int) -> str:
    """``alice (uid 1000)``, or ``uid 1000`` for a uid with no name."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def require_root_only(flag: str, path: str, *, missing_ok: bool) -> None:
    """Raise InstallError unless only root can change ``path`` on this machine."""
    found = find_unsafe(path, os.lstat, os.readlink, missing_ok=missing_ok)
    if found:
        raise InstallError(unsafe_message(flag, path, found, owner_name))


def check_root_only(choices: dict, explicit: dict, record: Path, cwd: str) -> None:
    """Refuse a prefix, bin dir or spec path that someone but root could change.

    Run on every install, so a spec or prefix that was safe when recorded
    is refused once a user gets hold of it, before pip runs it as root.
    """
    # Missing is fine for these two: the installer creates them as root.
    checks = [("prefix", choices["prefix"], True), ("bin_dir", choices["bin_dir"], True)]
    path = spec_path(choices["spec"], cwd)
    if path is not None:
        # A checkout is checked as a directory, not file by file: pip builds
        # it as root, so whoever can write the directory (add a setup.py, a
        # build backend, any module) runs code as root. Files in it that
        # others own are the admin's to fix; the refusal says chown -R.
        checks.append(("spec", path, False))
    for key, value, missing_ok in checks:
        try:
            require_root_only(FLAGS[key], value, missing_ok=missing_ok)
        except InstallError as exc:
            if explicit.get(key) is not None:
                raise
            hint = " (pass --spec hpc-batch to go back to PyPI)" if key == "spec" else ""
            raise InstallError(f"{exc} [{FLAGS[key]} comes from {record}, recorded by "
                               f"an earlier install{hint}]") from None

"""hpc-batch-install: install, upgrade or remove hpc-batch on a systemd host.

Run as root from the venv it installs into (``/opt/hpc-batch/bin/
hpc-batch-install``, linked as ``/opt/bin/hpc-batch-install``). One run:

1. merges this run's flags with the choices an earlier run recorded in
   ``/etc/hpc-batch/install.json`` (prefix, bin dir, admin group, pip spec),
   so a bare ``hpc-batch-install`` upgrades with the same choices; a flag
   that contradicts the record is refused unless ``--force``. A prefix,
   bin dir or path spec that anyone but root could change is refused
   outright (find_unsafe), whether given now or recorded;
2. unless ``--no-pip``: creates the venv if missing, ``pip install
   --upgrade SPEC`` into it, then re-execs the freshly installed
   ``hpc-batch-install --no-pip`` so the rest is done by the new version's
   own code, with the new version's unit file;
3. links the entry points into the bin dir, writes
   ``/etc/profile.d/hpc-batch.sh``, ``/etc/systemd/system/hpc-batch.service``,
   the bash and zsh completion of ``dispatch`` and the record;
4. ``systemctl daemon-reload``, then ``reload`` when the daemon is active
   (it re-execs in place and re-adopts running jobs) or ``enable --now``.

The record lives in /etc, not in the venv: it names the venv, so it must be
found without knowing it, and ``--uninstall`` (which deletes the venv)
removes it too, after which any choice may be made afresh.

This module must run when the rest of the package is broken (that is when
an upgrade is needed most), so it imports only the standard library and,
guarded, the package version. Paths and defaults below mirror
``hpc_batch/defaults.py`` for that reason.
"""

from __future__ import annotations

import argparse
import grp
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

try:
    from hpc_batch import __version__
except Exception:  # a broken package must not stop its own repair
    __version__ = "unknown"
# A leaf module with no imports: one list of admin groups for the installer and the daemon.
from hpc_batch.defaults import ADMIN_GROUP_CANDIDATES

PROG = "hpc-batch-install"
SERVICE = "hpc-batch"
PACKAGE = "hpc-batch"

DEFAULT_PREFIX = "/opt/hpc-batch"
DEFAULT_BIN_DIR = "/opt/bin"
DEFAULT_SPEC = PACKAGE

# Linked into the bin dir; the shepherd too, so admins find it with `ps`
# and `command -v` alike. A missing optional one is only a warning.
ENTRY_POINTS = ("dispatch", "hpc-batchd", "hpc-batch-install", "hpc-batch-shepherd")
REQUIRED_ENTRY_POINTS = ("dispatch", "hpc-batchd", "hpc-batch-install")
SHEPHERD = "hpc-batch-shepherd"

# The daemon's own defaults (hpc_batch/defaults.py), for --purge.
DEFAULT_SOCKET = "/run/hpc-batch/hpc-batch.sock"
DEFAULT_STATE_DIR = "/var/lib/hpc-batch"
DEFAULT_DEV_DIR = "/dev/hpc-batch"

UNIT_DATA = ("hpc_batch", "data", "hpc-batch.service")
PROFILE_MARKER = "# Written by hpc-batch-install"

# Shell completion for dispatch: packaged under hpc_batch/data/completion,
# installed where Debian's bash-completion and zsh look (Paths). Each
# packaged file carries this line near its top (the zsh one after its
# #compdef line): a file there without it is someone else's and is left
# alone, by installs and by --uninstall alike.
COMPLETION_DATA = ("hpc_batch", "data", "completion")
COMPLETION_MARKER = "# hpc-batch: shell completion for dispatch, installed by hpc-batch-install"
COMPLETION_MARKER_LINES = 3  # the marker is one of a file's first lines

EX_NOPERM = 77  # sysexits.h: not root

# Choices that fix where things live; changing one means moving files,
# so an install never silently changes them. The spec is not among them:
# a new spec is how an upgrade picks a new version.
FIXED_CHOICES = ("prefix", "bin_dir", "admin_group")
FLAGS = {"prefix": "--prefix", "bin_dir": "--bin-dir",
         "admin_group": "--admin-group", "spec": "--spec"}

# Letters systemd's ExecStart= and a shell both take literally.
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._+/-]*$")
_GROUP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*\$?$")
_VERSION = re.compile(r"^v?\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")
_PLACEHOLDER = re.compile(r"@[A-Z][A-Z_]*@")
# Endings pip takes as an archive file rather than a project name.
_ARCHIVES = (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz",
             ".txz", ".tar.lz", ".tlz", ".tar.lzma", ".tar")
# A file: URL in a spec, alone, after "name @ " or as in git+file:.
_FILE_URL = re.compile(r"(?:^|(?<=[\s@+]))file:[^\s;]+")

# Both versions of is_shepherd (this and uninstall.sh's) look at no more
# argv words than this: a hostile argv may hold a million options, and the
# daemon's own form needs five.
SHEPHERD_ARGV_WORDS = 8

# Never rm -rf these, whatever a unit file's --state-dir says.
_PROTECTED = {"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64",
              "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp",
              "/usr", "/var", "/var/lib", "/var/run", "/var/tmp", "/usr/local",
              "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"}


class InstallError(Exception):
    """A refusal or failure, reported as one line and exit status 1."""


class ChoiceConflict(InstallError):
    """Flags that contradict the recorded choices of an earlier install."""

    def __init__(self, conflicts: list[tuple[str, str, str]]):
        self.conflicts = conflicts  # (key, wanted, recorded)
        super().__init__("; ".join(f"{FLAGS[k]} {w} != {h}" for k, w, h in conflicts))


# ---------------------------------------------------------------- pure parts


def pick_admin_group(existing: Iterable[str]) -> str | None:
    """Return the first of wheel, sudo, adm among ``existing`` group names."""
    names = set(existing)
    for candidate in ADMIN_GROUP_CANDIDATES:
        if candidate in names:
            return candidate
    return None


def render_unit(template: str, values: dict[str, str]) -> str:
    """Fill ``@KEY@`` placeholders in the unit ``template`` from ``values``.

    A placeholder left unfilled is an error: systemd would take it literally
    and the daemon would fail in a confusing way.
    """
    text = template
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    left = sorted(set(_PLACEHOLDER.findall(text)))
    if left:
        raise ValueError(f"unit template has unfilled placeholders: {', '.join(left)}")
    return text


def profile_snippet(bin_dir: str) -> str:
    """The /etc/profile.d script that appends ``bin_dir`` to PATH once.

    It tests PATH when each login shell starts, so nested login shells and
    a bin dir already on the system PATH do not get a second copy.
    """
    quoted = shlex.quote(bin_dir)
    return (
        f"{PROFILE_MARKER}; removed by {PROG} --uninstall.\n"
        "# Puts the hpc-batch commands (dispatch) on every login shell's PATH.\n"
        'case ":${PATH}:" in\n'
        f"    *:{quoted}:*) ;;\n"
        f'    *) PATH="${{PATH:+${{PATH}}:}}"{quoted}; export PATH ;;\n'
        "esac\n"
    )


def normalize_spec(spec: str, cwd: str) -> str:
    """Turn a ``--spec`` into what pip is given and what is recorded.

    A bare version (``0.2.0``) pins the package; a path (wheel, sdist or
    checkout) is made absolute, since a later upgrade runs from elsewhere;
    anything else (a requirement, a URL) goes to pip as it is.
    """
    spec = spec.strip()
    if not spec:
        raise InstallError("--spec is empty")
    if "://" in spec or spec.startswith("git+"):
        return spec
    if _is_path_spec(spec):
        return os.path.normpath(os.path.join(cwd, spec))
    if _VERSION.match(spec):
        return f"{PACKAGE}=={spec.lstrip('v')}"
    return spec


def _is_path_spec(spec: str) -> bool:
    """pip's own test for "this is a path, not a project name"."""
    return os.sep in spec or spec in (".", "..") or spec.endswith(_ARCHIVES)


def spec_path(spec: str, cwd: str) -> str | None:
    """The local file or directory pip would install ``spec`` from, or None.

    That is a path (as normalize_spec decides) or a ``file:`` URL, bare,
    after ``name @`` or under a VCS (``git+file:///repo@v1``); relative
    paths are taken from ``cwd``, as pip takes them.
    """
    found = _FILE_URL.search(spec)
    if found:
        url = urllib.parse.urlsplit(found.group())
        path = urllib.parse.unquote(url.path)
        if found.start() > 0 and spec[found.start() - 1] == "+" and "@" in path:
            path = path.rsplit("@", 1)[0]  # pip's VCS revision, not a path
        return os.path.normpath(os.path.join(cwd, path))
    if "://" in spec or spec.startswith("git+") or not _is_path_spec(spec):
        return None
    return os.path.normpath(os.path.join(cwd, spec))


def normalize_path(path: str, cwd: str) -> str:
    """Absolute, normalized form of a path flag, so ``/opt/bin/`` == ``/opt/bin``."""
    return os.path.normpath(os.path.join(cwd, path))


def merge_choices(recorded: dict | None, explicit: dict, defaults: dict,
                  *, force: bool = False) -> dict:
    """Combine this run's flags with an earlier install's record.

    ``explicit`` holds only the flags given on this command line. A given
    flag wins; otherwise the recorded value; otherwise the default. A given
    prefix, bin dir or admin group that differs from the record raises
    ChoiceConflict unless ``force``.
    """
    recorded = recorded or {}
    merged: dict = {}
    conflicts = []
    for key in (*FIXED_CHOICES, "spec"):
        wanted, had = explicit.get(key), recorded.get(key)
        if wanted is None:
            merged[key] = had if had is not None else defaults.get(key)
            continue
        if key in FIXED_CHOICES and had is not None and wanted != had and not force:
            conflicts.append((key, wanted, had))
        merged[key] = wanted
    if conflicts:
        raise ChoiceConflict(conflicts)
    return merged


def conflict_message(exc: ChoiceConflict, record: Path) -> str:
    """Explain a ChoiceConflict and how to get past it, one line per flag."""
    lines = []
    for key, wanted, had in exc.conflicts:
        lines.append(
            f"{PROG}: {FLAGS[key]} {wanted} differs from {had}, chosen by an earlier "
            f"install and recorded in {record}. To change it, run `{PROG} --uninstall` "
            f"first (queued jobs and history are kept), or repeat with --force.")
    return "\n".join(lines)


def check_choices(choices: dict) -> list[str]:
    """Return a message for each choice unsafe to write into a unit or script."""
    problems = []
    for key in ("prefix", "bin_dir"):
        value = choices.get(key) or ""
        if not _SAFE_PATH.match(value) or value == "/":
            problems.append(f"{FLAGS[key]} {value!r} must be an absolute path "
                            "of letters, digits and . _ + - /")
    if (choices.get("spec") or "").startswith("-"):
        # pip would take it as an option: -e. or -r FILE name what to
        # build as root without it being a path anyone checks.
        problems.append(f"--spec {choices['spec']!r} must not start with '-'")
    group = choices.get("admin_group")
    if group is None:
        problems.append(f"none of {', '.join(ADMIN_GROUP_CANDIDATES)} exists here: "
                        "pass --admin-group GROUP")
    elif not _GROUP_NAME.match(group):
        problems.append(f"--admin-group {group!r} is not a valid group name")
    return problems


def exec_start_argv(unit_texts: Iterable[str]) -> list[str]:
    """The effective ``ExecStart=`` argv of a unit file plus its drop-ins.

    Later files override earlier ones; an empty ``ExecStart=`` resets, as in
    systemd. Continuation lines are joined; the ``-@:+!`` prefixes dropped.
    """
    argv: list[str] = []
    for text in unit_texts:
        for line in text.replace("\\\n", " ").splitlines():
            line = line.strip()
            if not line.startswith("ExecStart="):
                continue
            command = line[len("ExecStart="):].strip().lstrip("-@:+!")
            try:
                argv = shlex.split(command)
            except ValueError:
                argv = command.split()
    return argv


def daemon_dirs(argv: list[str]) -> dict[str, str]:
    """The daemon's socket, state dir and dev dir as ``argv`` sets them."""
    found = {"--socket": DEFAULT_SOCKET, "--state-dir": DEFAULT_STATE_DIR,
             "--dev-dir": DEFAULT_DEV_DIR}
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in found:
            if eq:
                found[name] = value
            elif i + 1 < len(argv):
                found[name] = argv[i + 1]
    return {"socket": found["--socket"], "state_dir": found["--state-dir"],
            "dev_dir": found["--dev-dir"]}


def is_shepherd(cmdline: list[str], comm: str) -> bool:
    """Whether a process is an hpc-batch-shepherd, from its argv and comm.

    The daemon runs ``python -E -s -S .../shepherd/hpc-batch-shepherd.py``;
    the console script shows as ``python .../bin/hpc-batch-shepherd`` with
    comm cut to 15 characters. An editor with the file open is no shepherd.
    uninstall.sh's is_shepherd must answer the same for every argv.
    """
    names = (SHEPHERD, SHEPHERD + ".py")
    cmdline = cmdline[:SHEPHERD_ARGV_WORDS]
    if comm == SHEPHERD[:15] or (cmdline and os.path.basename(cmdline[0]) in names):
        return True
    if not cmdline or not os.path.basename(cmdline[0]).startswith("python"):
        return False
    args = iter(cmdline[1:])
    for arg in args:
        if arg == "-m":
            return next(args, "") in ("shepherd", "shepherd.main")
        if arg in ("-X", "-W"):
            next(args, None)  # the option's value
        elif arg == "-c" or not arg.startswith("-"):
            # The first operand is the script python runs.
            return arg != "-c" and os.path.basename(arg) in names
    return False


def descendants(parent_of: dict[int, int], roots: Iterable[int]) -> set[int]:
    """``roots`` and every process below them, given pid -> ppid."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_of.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return found


def safe_to_remove(path: str) -> bool:
    """Whether ``path`` may be deleted recursively by --purge."""
    norm = os.path.normpath(path)
    return os.path.isabs(norm) and norm not in _PROTECTED and norm.count("/") >= 2


def is_our_completion(head: str) -> bool:
    """Whether a completion file whose text begins with ``head`` is hpc-batch's.

    It is when one of its first lines is COMPLETION_MARKER: the marker, not
    the content, since an upgrade must replace (and --uninstall remove) the
    file an older version wrote.
    """
    return COMPLETION_MARKER in head.splitlines()[:COMPLETION_MARKER_LINES]


# The installer runs as root and so does what it installs: pip builds a
# checkout or an sdist with root's rights, and the daemon runs from the
# venv. Whoever can change such a path, or swap a directory above it for
# their own, can run code as root. So each is refused unless only root can
# change it: the path and every directory above it owned by root and not
# group- or world-writable (an ACL that grants a user write shows in the
# group bits). A sticky directory like /tmp passes as a parent only: there
# nobody else can rename or delete the root-owned entry below it.

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


# ---------------------------------------------------------------- the host


@dataclass(frozen=True)
class Paths:
    """Every system location the installer touches; tests point them elsewhere."""

    unit: Path = Path("/etc/systemd/system/hpc-batch.service")
    dropins: Path = Path("/etc/systemd/system/hpc-batch.service.d")
    profile: Path = Path("/etc/profile.d/hpc-batch.sh")
    record: Path = Path("/etc/hpc-batch/install.json")
    # Debian's: bash-completion loads the first on `dispatch <TAB>`; zsh's
    # fpath holds the second's directory.
    bash_completion: Path = Path("/usr/share/bash-completion/completions/dispatch")
    zsh_completion: Path = Path("/usr/share/zsh/vendor-completions/_dispatch")
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


def load_record(path: Path) -> dict | None:
    """The choices an earlier install recorded, or None."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InstallError(f"cannot read {path}: {exc}; fix or delete it") from exc
    if not isinstance(data, dict):
        raise InstallError(f"{path} is not a JSON object; fix or delete it")
    return data


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` so no reader sees half a file (the project's one atomic write)."""
    from shepherd.records import write_atomic as replace
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
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # missing, a symlink (ELOOP) or unreadable
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False  # a directory, a FIFO, a device
        head = os.read(fd, 4096)
    except OSError:
        return False
    finally:
        os.close(fd)
    return is_our_completion(head.decode(errors="replace"))


# ---------------------------------------------------------------- install


def plan_links(prefix: Path, bin_dir: Path) -> list[tuple[Path, Path]]:
    """(link, target) pairs to create; refuses to overwrite a file not a link."""
    pairs = []
    for name in ENTRY_POINTS:
        target = prefix / "bin" / name
        if not os.path.lexists(target):
            if name in REQUIRED_ENTRY_POINTS:
                raise InstallError(f"{target} is missing: {prefix} has no working "
                                   f"hpc-batch install; run {PROG} without --no-pip")
            continue
        link = bin_dir / name
        if os.path.lexists(link) and not link.is_symlink():
            raise InstallError(f"{link} exists and is not a link; move it away first")
        pairs.append((link, target))
    return pairs


def make_links(pairs: list[tuple[Path, Path]]) -> None:
    """Point each link at its target, replacing older links in one rename."""
    for link, target in pairs:
        if not link.parent.is_dir():
            link.parent.mkdir(parents=True)
            os.chmod(link.parent, 0o755)  # every user runs dispatch from here
        tmp = link.with_name(f".{link.name}.tmp")
        if os.path.lexists(tmp):
            tmp.unlink()
        os.symlink(target, tmp)
        os.replace(tmp, link)


def remove_links(prefix: Path, bin_dir: Path) -> list[Path]:
    """Remove links in ``bin_dir`` that point into ``prefix``/bin; return them."""
    removed = []
    ours = os.path.normpath(prefix / "bin")
    for name in ENTRY_POINTS:
        link = bin_dir / name
        if link.is_symlink() and os.path.dirname(os.path.normpath(os.readlink(link))) == ours:
            link.unlink()
            removed.append(link)
    if safe_to_remove(str(bin_dir)):
        try:
            bin_dir.rmdir()  # only if we left it empty
        except OSError:
            pass
    return removed


def ensure_venv(prefix: Path, host: Host) -> None:
    """Create the venv at ``prefix`` unless one is there."""
    if (prefix / "bin" / "python").exists():
        return
    if prefix.exists() and any(prefix.iterdir()):
        raise InstallError(f"{prefix} exists and is not a venv; pick another --prefix")
    host.note(f"creating a venv at {prefix}")
    # -I: not the working directory's modules (a user's venv.py, say) as root.
    rc = subprocess.run([sys.executable, "-I", "-m", "venv", str(prefix)]).returncode
    if rc != 0:
        raise InstallError(f"could not create a venv at {prefix} (on Debian/Ubuntu: "
                           "apt-get install python3-venv)")


def pip_install(prefix: Path, spec: str, host: Host) -> None:
    """``pip install --upgrade spec`` into the venv."""
    host.note(f"pip install --upgrade {spec} into {prefix}")
    # -I keeps the working directory off sys.path: a pip/ there would run as root.
    rc = subprocess.run([str(prefix / "bin" / "python"), "-I", "-m", "pip", "install",
                         "--disable-pip-version-check", "--upgrade", spec]).returncode
    if rc != 0:
        raise InstallError(f"pip could not install {spec!r}; nothing else was changed")


def reexec_argv(prefix: Path, choices: dict, force: bool) -> list[str]:
    """The command line that hands the rest of an install to the new version."""
    argv = [str(prefix / "bin" / PROG), "--no-pip"]
    for key in (*FIXED_CHOICES, "spec"):
        argv += [FLAGS[key], choices[key]]
    if force:
        argv.append("--force")
    return argv


def install(choices: dict, recorded: dict | None, host: Host) -> None:
    """Write links, PATH snippet, unit and record for an installed venv; start it."""
    paths = host.paths
    prefix, bin_dir = Path(choices["prefix"]), Path(choices["bin_dir"])
    if not group_exists(choices["admin_group"]):
        present = [g for g in ADMIN_GROUP_CANDIDATES if group_exists(g)]
        raise InstallError(f"--admin-group {choices['admin_group']} does not exist here"
                           + (f"; try {' or '.join(present)}" if present else ""))
    links = plan_links(prefix, bin_dir)
    template = find_unit_template(prefix)
    try:
        unit = render_unit(template.read_text(), {
            "BIN_DIR": str(bin_dir), "ADMIN_GROUP": choices["admin_group"],
            "PREFIX": str(prefix)})
    except ValueError as exc:
        raise InstallError(f"{template}: {exc}") from exc

    if recorded and recorded.get("bin_dir") and recorded["bin_dir"] != str(bin_dir):
        # --force moved the bin dir: do not leave the old links behind.
        remove_links(Path(recorded.get("prefix", prefix)), Path(recorded["bin_dir"]))
    if recorded and recorded.get("prefix") and recorded["prefix"] != str(prefix):
        host.note(f"the venv at {recorded['prefix']} was left in place; "
                  "delete it when nothing needs it")
    fast_dispatch(prefix, host)
    make_links(links)
    host.note(f"linked {', '.join(link.name for link, _ in links)} into {bin_dir}")
    write_atomic(paths.profile, profile_snippet(str(bin_dir)))
    write_atomic(paths.unit, unit)
    host.note(f"wrote {paths.unit} (admin group {choices['admin_group']})")
    install_completions(prefix, host)
    version = installed_version(prefix)
    write_atomic(paths.record, json.dumps(
        {**choices, "version": version, "installed": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        indent=2, sort_keys=True) + "\n")
    os.chmod(paths.record.parent, 0o755)
    start_or_reload(host)
    host.note(f"hpc-batch {version or '(unknown version)'} is installed; new login "
              f"shells have {bin_dir} on PATH")


def fast_dispatch(prefix: Path, host: Host) -> None:
    """The venv's dispatch started without the site import (clientscript.py); a note when it cannot be."""
    from . import clientscript  # not at the top: python -m hpc_batch.install.clientscript runs it too
    script = prefix / "bin" / "dispatch"
    try:
        clientscript.rewrite(script)
    except clientscript.Declined as exc:
        host.note(f"left {script} starting with the site import: {exc}")
    except OSError as exc:
        host.note(f"left {script} starting with the site import: cannot rewrite it ({exc})")


def install_completions(prefix: Path, host: Host) -> None:
    """Write the packaged bash and zsh completion of dispatch (mode 0644).

    A file already there that is not ours is left alone, and so is a shell
    whose packaged file is missing: completion is a convenience, never a
    reason for an install to fail.
    """
    written = []
    for name, shell, dest in completion_files(host.paths):
        source = find_completion(prefix, name)
        try:
            text = source.read_text() if source else ""
        except (OSError, UnicodeDecodeError):
            text = ""
        if source is None:
            host.note(f"no packaged {shell} completion for dispatch ({name}); "
                      f"{dest} not written")
        elif not is_our_completion(text):
            # --uninstall could not tell it from someone else's file.
            host.note(f"{source} lacks the line {COMPLETION_MARKER!r}; {dest} not written")
        elif os.path.lexists(dest) and not completion_is_ours(dest):
            host.note(f"left {dest} alone: it was not written by {PROG}, so {shell} "
                      "completion for dispatch is not installed")
        else:
            try:
                write_atomic(dest, text, 0o644)
            except OSError as exc:  # a read-only /usr, say
                host.note(f"could not write {dest}: {exc.strerror or exc}")
                continue
            written.append(str(dest))
    if written:
        host.note(f"wrote {' and '.join(written)} (shell completion for dispatch)")


def remove_completions(host: Host) -> None:
    """Remove the completion files this installer wrote; leave anyone else's."""
    for _, _, dest in completion_files(host.paths):
        if not os.path.lexists(dest):
            continue
        if completion_is_ours(dest):
            try:
                dest.unlink()
            except OSError as exc:
                host.note(f"could not remove {dest}: {exc.strerror or exc}")
                continue
            host.note(f"removed {dest}")
        else:
            host.note(f"left {dest} alone: it was not written by {PROG}")


def start_or_reload(host: Host) -> None:
    """Reload a running daemon (jobs are re-adopted), or enable and start it."""
    if not host.booted:
        # A chroot or image build: enabling only writes links, which works.
        if host.systemctl("enable", SERVICE) != 0:
            raise InstallError(f"systemd is not running here and `systemctl enable "
                               f"{SERVICE}` failed")
        host.note("systemd is not running here: the unit is enabled and starts at boot")
        return
    if host.systemctl("daemon-reload") != 0:
        raise InstallError("systemctl daemon-reload failed")
    if host.systemctl("is-active", "--quiet", SERVICE) == 0:
        host.note("reloading the running daemon (running jobs are kept)")
        if host.systemctl("reload", SERVICE) != 0:
            raise InstallError(f"systemctl reload {SERVICE} failed; see "
                               f"journalctl -u {SERVICE}")
        return
    host.note("enabling and starting the daemon")
    if host.systemctl("enable", "--now", SERVICE) != 0:
        raise InstallError(f"the daemon did not start; see journalctl -u {SERVICE} "
                           "(exit status 78 is a refusal that names what is missing)")


# ---------------------------------------------------------------- uninstall


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def unit_texts(paths: Paths) -> list[str]:
    """The installed unit and its drop-ins, in the order systemd applies them."""
    texts = [_read(paths.unit)]
    if paths.dropins.is_dir():
        texts += [_read(p) for p in sorted(paths.dropins.glob("*.conf"))]
    return texts


def process_table(proc: Path) -> tuple[dict[int, int], list[int]]:
    """(pid -> ppid for every process, pids of shepherds) read from ``proc``."""
    parent_of, shepherds = {}, []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        comm = stat[stat.find("(") + 1:stat.rfind(")")]
        # Fields after the last ')' start with state, then ppid.
        parent_of[pid] = int(stat[stat.rfind(")") + 2:].split()[1])
        argv = [a.decode(errors="replace") for a in cmdline if a]
        if is_shepherd(argv, comm):
            shepherds.append(pid)
    return parent_of, shepherds


def kill_shepherds(host: Host) -> int:
    """SIGKILL every shepherd and everything below it; return how many."""
    parent_of, shepherds = process_table(host.paths.proc)
    # Never this process or its callers (a purge run from inside a job).
    spared, pid = {0, 1}, os.getpid()
    while pid not in spared:
        spared.add(pid)
        pid = parent_of.get(pid, 0)
    victims = descendants(parent_of, shepherds) - spared
    # Stop them all first so none reacts to another's death (or forks).
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in victims:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    return len(victims)


def kill_cgroups(root: Path, timeout: float = 10.0) -> list[str]:
    """Kill every process in the job cgroup tree and remove it; return problems."""
    if not root.is_dir():
        return []
    kill_file = root / "cgroup.kill"
    if kill_file.exists():
        kill_file.write_text("1")  # kernel >= 5.14: the whole subtree, race-free
    else:
        for procs in root.rglob("cgroup.procs"):
            for pid in _read(procs).split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
    deadline = time.monotonic() + timeout
    while "populated 1" in _read(root / "cgroup.events") and time.monotonic() < deadline:
        time.sleep(0.1)
    problems = []
    dirs = sorted((p for p in root.rglob("*") if p.is_dir()),
                  key=lambda p: len(p.parts), reverse=True)
    for cgroup in [*dirs, root]:
        try:
            cgroup.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            problems.append(f"cannot remove cgroup {cgroup}: {exc.strerror}")
    return problems


def remove_tree(path: Path, host: Host) -> None:
    """rm -rf ``path`` if it is a safe thing to delete; say so."""
    if not os.path.lexists(path):
        return
    if not safe_to_remove(str(path)):
        host.note(f"not removing {path}: too close to the root to be ours")
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    host.note(f"removed {path}")


def uninstall(choices: dict, host: Host, *, purge: bool) -> None:
    """Stop and remove hpc-batch; with ``purge`` also its jobs and state."""
    paths = host.paths
    prefix, bin_dir = Path(choices["prefix"]), Path(choices["bin_dir"])
    dirs = daemon_dirs(exec_start_argv(unit_texts(paths)))
    if host.booted and os.path.lexists(paths.unit):
        # KillMode=process: this stops the daemon only; jobs keep running
        # and a later install re-adopts them.
        host.systemctl("disable", "--now", SERVICE)
    if purge:
        killed = kill_shepherds(host)
        problems = kill_cgroups(paths.cgroup)
        host.note(f"killed {killed} shepherd and job processes")
        for problem in problems:
            host.note(problem)
        socket_dir = Path(os.path.dirname(dirs["socket"]))
        for path in {Path(dirs["state_dir"]), Path(dirs["dev_dir"]), paths.state_dir,
                     paths.dev_dir, paths.run_dir}:
            remove_tree(path, host)
        if socket_dir.name == SERVICE:
            remove_tree(socket_dir, host)
        else:
            remove_tree(Path(dirs["socket"]), host)
        remove_tree(paths.dropins, host)
    for path in (paths.unit, paths.profile, paths.record):
        if os.path.lexists(path):
            path.unlink()
            host.note(f"removed {path}")
    remove_completions(host)
    try:
        paths.record.parent.rmdir()
    except OSError:
        pass
    if host.booted:
        host.systemctl("daemon-reload")
        host.systemctl("reset-failed", SERVICE)  # forget a failed state, if any
    removed = remove_links(prefix, bin_dir)
    if removed:
        host.note(f"removed links {', '.join(p.name for p in removed)} from {bin_dir}")
    # Last: this very process may be running from that venv.
    if (prefix / "pyvenv.cfg").is_file():
        shutil.rmtree(prefix)
        host.note(f"removed {prefix}")
    elif prefix.exists():
        host.note(f"left {prefix} alone: it is not a venv")
    if not purge:
        host.note(f"kept {dirs['state_dir']} (queued jobs and history) and running "
                  "jobs; installing again picks them up, --purge removes them")


# ---------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    """The command line of hpc-batch-install."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Install, upgrade or remove hpc-batch (run as root). Without "
        "flags: pip install --upgrade the last --spec (else the latest release), "
        "repeat the last install's choices and reload the daemon, keeping running jobs.",
        epilog=f"Choices are recorded in {Paths.record} and repeated by later runs; "
        "a different --prefix, --bin-dir or --admin-group is refused unless --force "
        "(or --uninstall first).")
    p.add_argument("--prefix", metavar="DIR",
                   help=f"venv to install into (default {DEFAULT_PREFIX})")
    p.add_argument("--bin-dir", metavar="DIR",
                   help=f"where to link dispatch etc. and add to PATH (default {DEFAULT_BIN_DIR})")
    p.add_argument("--admin-group", metavar="GROUP",
                   help=f"the daemon's --admin-group (default: the first of "
                   f"{', '.join(ADMIN_GROUP_CANDIDATES)} that exists)")
    p.add_argument("--spec", metavar="SPEC",
                   help="what to pip install: a version (0.2.0), a wheel or sdist file, "
                   f"a checkout, a requirement (default: the last one, else {DEFAULT_SPEC}); "
                   "a file or checkout, and every directory above it, must be root's and "
                   "writable by no one else")
    p.add_argument("--no-pip", action="store_true",
                   help="use what is already installed in the venv (no network)")
    p.add_argument("--force", action="store_true",
                   help="replace recorded choices that this run's flags contradict")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--uninstall", action="store_true",
                      help="remove unit, links, PATH snippet, shell completion and venv; keep "
                      f"{DEFAULT_STATE_DIR} (queued jobs and history)")
    mode.add_argument("--purge", action="store_true",
                      help="--uninstall, and also kill running jobs and remove their "
                      "cgroups, state, socket and /dev entries")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


def main(argv: list[str] | None = None, host: Host | None = None) -> int:
    """Entry point of hpc-batch-install; returns its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    removing = args.uninstall or args.purge
    if removing and (args.spec or args.no_pip or args.force):
        parser.error("--spec, --no-pip and --force apply to installs, not --uninstall/--purge")
    if os.geteuid() != 0:
        sys.stderr.write(f"{PROG}: must be run as root (try: sudo {PROG})\n")
        return EX_NOPERM
    host = host or Host()
    # A hardened root umask (077) would make the venv unreadable to users.
    os.umask(0o022)
    cwd = os.getcwd()
    explicit = {
        "prefix": args.prefix and normalize_path(args.prefix, cwd),
        "bin_dir": args.bin_dir and normalize_path(args.bin_dir, cwd),
        "admin_group": args.admin_group,
    }
    try:
        if args.spec is not None:
            explicit["spec"] = normalize_spec(args.spec, cwd)
        recorded = load_record(host.paths.record)
        defaults = {"prefix": DEFAULT_PREFIX, "bin_dir": DEFAULT_BIN_DIR,
                    "admin_group": pick_admin_group(existing_groups()),
                    "spec": DEFAULT_SPEC}
        if removing:
            # Removal only needs to know where things are: no conflicts.
            choices = merge_choices(recorded, explicit, defaults, force=True)
            uninstall(choices, host, purge=args.purge)
            return 0
        try:
            choices = merge_choices(recorded, explicit, defaults, force=args.force)
        except ChoiceConflict as exc:
            sys.stderr.write(conflict_message(exc, host.paths.record) + "\n")
            return 1
        problems = check_choices(choices)
        if problems:
            raise InstallError("; ".join(problems))
        check_root_only(choices, explicit, host.paths.record, cwd)
        prefix = Path(choices["prefix"])
        if not args.no_pip:
            ensure_venv(prefix, host)
            pip_install(prefix, choices["spec"], host)
            new = reexec_argv(prefix, choices, args.force)
            if os.access(new[0], os.X_OK):
                sys.stdout.flush()
                sys.stderr.flush()
                # The new version finishes the job with its own code and unit.
                os.execv(new[0], new)
        install(choices, recorded, host)
    except InstallError as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return 1
    return 0

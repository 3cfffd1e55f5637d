"""The install's choices: this run's flags merged with the record, checked. Pure.

An earlier install records its choices (prefix, bin dir, admin group, pip
spec) in /etc/hpc-batch/install.json; a bare run repeats them, and a flag
that contradicts a fixed one is refused unless --force.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Iterable
from pathlib import Path

# A leaf module with no imports: one list of admin groups for the installer and the daemon.
from hpc_batch.defaults import ADMIN_GROUP_CANDIDATES

from .common import FLAGS, PACKAGE, PROG, InstallError

# Choices that fix where things live; changing one means moving files,
# so an install never silently changes them. The spec is not among them:
# a new spec is how an upgrade picks a new version.
FIXED_CHOICES = ("prefix", "bin_dir", "admin_group")

# Letters systemd's ExecStart= and a shell both take literally.
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._+/-]*$")
_GROUP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*\$?$")
_VERSION = re.compile(r"^v?\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")

# Endings pip takes as an archive file rather than a project name.
_ARCHIVES = (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz",
             ".txz", ".tar.lz", ".tlz", ".tar.lzma", ".tar")
# A file: URL in a spec, alone, after "name @ " or as in git+file:.
_FILE_URL = re.compile(r"(?:^|(?<=[\s@+]))file:[^\s;]+")


class ChoiceConflict(InstallError):
    """Flags that contradict the recorded choices of an earlier install."""

    def __init__(self, conflicts: list[tuple[str, str, str]]):
        self.conflicts = conflicts  # (key, wanted, recorded)
        super().__init__("; ".join(f"{FLAGS[k]} {w} != {h}" for k, w, h in conflicts))


def pick_admin_group(existing: Iterable[str]) -> str | None:
    """Return the first of wheel, sudo, adm among ``existing`` group names."""
    names = set(existing)
    for candidate in ADMIN_GROUP_CANDIDATES:
        if candidate in names:
            return candidate
    return None


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

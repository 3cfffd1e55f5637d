"""hpc-batch-install: install, upgrade or remove hpc-batch on a systemd host.

Run as root from the venv it installs into (``/opt/hpc-batch/bin/
hpc-batch-install``, linked as ``/opt/bin/hpc-batch-install``). One run:

1. merges this run's flags with the choices an earlier run recorded in
   ``/etc/hpc-batch/install.json`` (prefix, bin dir, admin group, pip spec),
   so a bare ``hpc-batch-install`` upgrades with the same choices; a flag
   that contradicts the record is refused unless ``--force``. A prefix,
   bin dir or path spec that anyone but root could change is refused
   outright (find_unsafe), whether given now or recorded;
2. unless ``--no-pip``: ``pip install --upgrade SPEC`` into a copy of the
   venv (a new venv the first time) under ``<prefix>.versions/``, synced to
   disk, then the prefix, a symlink, switched to it in one rename, so a
   power cut leaves one version or the other, whole (versions.py); then
   re-execs the freshly installed ``hpc-batch-install --no-pip`` so the
   rest is done by the new version's own code, with the new version's
   unit file;
3. links the entry points into the bin dir, writes
   ``/etc/profile.d/hpc-batch.sh``, ``/etc/systemd/system/hpc-batch.service``,
   the bash and zsh completion of ``dispatch``, the manual pages
   (manpages.py) and the record;
4. ``systemctl daemon-reload``, then ``reload`` when the daemon is active
   (it re-execs in place and re-adopts running jobs) or ``enable --now``.

The record lives in /etc, not in the venv: it names the venv, so it must be
found without knowing it, and ``--uninstall`` (which deletes the venv)
removes it too, after which any choice may be made afresh.

The installer must run when the rest of the package is broken (that is
when an upgrade is needed most), so its modules import only the standard
library, ``hpc_batch.defaults`` (a leaf with no imports) and, guarded, the
package version; tests/unit/test_layout.py holds them to it. They are:

- ``choices``: this run's flags merged with the record, and checked (pure);
- ``safety``: the "only root can change it" rule for paths (install.sh
  mirrors it) and what --purge may delete;
- ``texts``: the unit, the PATH snippet, the completion marker (pure);
- ``host``: the machine's paths, systemctl, groups and the venv's files;
- ``versions``: one venv per version and the symlink switched between them;
- ``steps``: the install itself, step by step;
- ``purge``: --uninstall and --purge (uninstall.sh mirrors is_shepherd);
- ``debian``, ``debbuild``, ``debhooks``: the Debian package, its texts
  (pure), its build (scripts/build-deb) and its postinst's venv, which is
  ``versions``' (where the package is installed, this installer and
  install.sh refuse to run);
- here, the command line: ``main`` and its parser.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

try:
    from hpc_batch import __version__
except Exception:  # a broken package must not stop its own repair
    __version__ = "unknown"
# A leaf module with no imports: one list of admin groups for the installer and the daemon.
from hpc_batch.defaults import ADMIN_GROUP_CANDIDATES

from .choices import (
    ChoiceConflict,
    check_choices,
    conflict_message,
    load_record,
    merge_choices,
    normalize_path,
    normalize_spec,
    pick_admin_group,
)
from .common import DEFAULT_BIN_DIR, DEFAULT_PREFIX, DEFAULT_SPEC, DEFAULT_STATE_DIR, EX_NOPERM, PROG, InstallError
from .debian import MANAGED_BY_PACKAGE
from .host import Host, Paths, existing_groups
from .purge import uninstall
from .safety import check_root_only
from .steps import check_prefix, fast_dispatch, install, reexec_argv
from .versions import prune, stage, switch


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
                      help="remove unit, links, PATH snippet, shell completion, manual pages and venv; keep "
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
        if host.paths.deb_wheelhouse.is_dir():
            # Two managers would switch one venv under each other, and a unit in /etc hides the package's.
            raise InstallError(MANAGED_BY_PACKAGE)
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
            check_prefix(prefix)
            prune(prefix, host)   # versions staged by runs a power cut stopped, and older ones no one runs
            staged = stage(prefix, choices["spec"], host, lambda venv: fast_dispatch(venv, host))
            switch(prefix, staged, host)
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

"""--uninstall and --purge: take hpc-batch off the host, with --purge its jobs and state too.

--uninstall stops the daemon and removes what an install wrote (running
jobs and the state directory stay, for a later install to pick up);
--purge also kills every shepherd and job and deletes their state.

is_shepherd is mirrored by uninstall.sh (which must work with no Python
package left); a test holds the two equal.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from . import manpages
from .common import SERVICE
from .host import Host, Paths
from .safety import safe_to_remove
from .steps import remove_completions, remove_links
from .texts import daemon_dirs, exec_start_argv
from .versions import versions_dir

SHEPHERD = "hpc-batch-shepherd"

# Both versions of is_shepherd (this and uninstall.sh's) look at no more
# argv words than this: a hostile argv may hold a million options, and the
# daemon's own form needs five.
SHEPHERD_ARGV_WORDS = 8


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
    manpages.remove(paths.man_dir, host.note)
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
    vdir = versions_dir(prefix)
    if prefix.is_symlink() and os.path.dirname(os.path.realpath(prefix)) == os.path.realpath(vdir):
        prefix.unlink()   # the link to one of the venvs under vdir, removed below
        host.note(f"removed {prefix}")
    elif (prefix / "pyvenv.cfg").is_file() and not prefix.is_symlink():
        shutil.rmtree(prefix)
        host.note(f"removed {prefix}")
    elif os.path.lexists(prefix):
        host.note(f"left {prefix} alone: it is not a venv")
    if vdir.is_dir() and not vdir.is_symlink():
        remove_tree(vdir, host)
    if not purge:
        host.note(f"kept {dirs['state_dir']} (queued jobs and history) and running "
                  "jobs; installing again picks them up, --purge removes them")

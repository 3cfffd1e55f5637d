"""What /proc says about processes: memory, wakeups, and the processes under a scratch path."""

from __future__ import annotations

import os
import re
import signal

from shepherd.base import proc, records


def read_text(path: str) -> str | None:
    """A /proc or /sys file as text, or None when it (or its process) is gone."""
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def read_proc(pid: int, name: str) -> str | None:
    """/proc/PID/NAME as text, or None when the process (or file) is gone."""
    return read_text(f"/proc/{pid}/{name}")


def processes() -> list[tuple[int, int, list[str]]]:
    """(pid, ppid, argv) of every process we can see."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        stat, cmd = read_proc(pid, "stat"), read_proc(pid, "cmdline")
        if stat is None or cmd is None:
            continue
        try:
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (ValueError, IndexError):
            continue
        out.append((pid, ppid, [a for a in cmd.split("\0") if a]))
    return out


def _kb_field(text: str, name: str) -> int:
    m = re.search(rf"^{name}:\s+(\d+) kB", text, re.M)
    if m is None:
        raise RuntimeError(f"no {name} line")
    return int(m.group(1)) * 1024


def memory(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of *pid* in bytes, from smaps_rollup (PSS splits shared pages among their users)."""
    text = read_proc(pid, "smaps_rollup")
    if not text:
        raise RuntimeError(f"cannot read /proc/{pid}/smaps_rollup (gone, or not ours to read)")
    return _kb_field(text, "Pss"), _kb_field(text, "Rss")


def wakeups(pid: int) -> int:
    """Voluntary plus involuntary context switches of *pid* so far."""
    text = read_proc(pid, "status") or ""
    return sum(int(n) for n in re.findall(r"^(?:non)?voluntary_ctxt_switches:\s+(\d+)", text, re.M))


def state(pid: int) -> str | None:
    """The one-letter state of *pid* (R, S, D, Z, ...), or None when gone."""
    stat = read_proc(pid, "stat")
    return stat[stat.rindex(")") + 2] if stat else None


def has_socket(pid: int) -> bool:
    """Whether *pid* holds a socket open (a client that has connected)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                return True
        except OSError:
            continue
    return False


def job_dir(state_dir: str, job: int) -> str:
    """The directory of job *job* of the daemon with *state_dir* (the daemon's Store lays it out so)."""
    return os.path.join(state_dir, "jobs", str(job))


def shepherd_of(job_dir: str) -> int | None:
    """Pid of the live shepherd of the job in *job_dir*, or None (not started yet, or gone).

    Taken from the pidfile the shepherd writes under its lock (pid and start
    time) and checked against /proc, so a reused pid is never taken for it.
    Nothing else is read: a scan of every command line on the machine waits
    on any process whose memory map is busy (reading /proc/PID/cmdline takes
    that process's mmap lock, and a VM or a big allocation elsewhere can hold
    it for seconds), and depends on the fork server having renamed its child.
    """
    found = records.read_pidfile(job_dir)
    if found is None:
        return None
    pid, start = found
    return pid if proc.proc_starttime(pid) == start else None


def _kill(pid: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_under(path: str) -> int:
    """SIGKILL each process whose command line names *path*, and all of its descendants.

    That is every shepherd of a scratch daemon (its job directory is in its
    argv) and the jobs under them, which run in sessions of their own, so a
    descendant that leads a process group takes its group with it. Jobs go
    before shepherds, so a shepherd never outlives its job. Returns how many
    processes were hit.
    """
    me = os.getpid()
    procs = processes()
    children: dict[int, list[int]] = {}
    for pid, ppid, _ in procs:
        children.setdefault(ppid, []).append(pid)
    marked = {pid for pid, _, argv in procs if pid != me and any(path in a for a in argv)}
    todo, doomed = list(marked), set()
    while todo:
        pid = todo.pop()
        if pid in doomed or pid == me:
            continue
        doomed.add(pid)
        todo.extend(children.get(pid, ()))
    for pid in doomed - marked:
        try:
            leader = os.getpgid(pid) == pid
        except OSError:
            continue
        _kill(pid, group=leader)
        _kill(pid)
    for pid in marked:
        _kill(pid)
    return len(doomed)

"""The shepherd's side of a job's cgroup: join it, and read and remove it at the end.

The daemon creates the cgroup and writes its limits before the shepherd
starts; the shepherd itself stays outside it (a sibling of the job, the way
slurmstepd stays apart from its tasks) so an OOM kill of the job never takes
the exit record with it.
"""

import os
import time


def join(path: str, pid: int = 0) -> None:
    """Move process *pid* (0: the calling one) into the cgroup at *path*.

    One write(2), as the kernel wants it, with no file object: a freshly forked shepherd or job
    child would fault in the pages of io's objects for it.
    """
    fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(pid).encode())
    finally:
        os.close(fd)


def read(path: str, name: str) -> str | None:
    """A cgroup file's text, or None when it cannot be read."""
    try:
        with open(os.path.join(path, name)) as f:
            return f.read()
    except OSError:
        return None


def keyed(text: str | None) -> dict:
    """A flat-keyed cgroup file (memory.events, cpu.stat) as a dict of ints."""
    out = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def kill(path: str) -> bool:
    """SIGKILL everything in the cgroup at once (cgroup.kill: no race with forks)."""
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
        return True
    except OSError:
        return False


def collect_and_remove(path: str) -> dict:
    """Record OOM kills, peak memory and CPU time, kill leftovers, remove the cgroup."""
    events = keyed(read(path, "memory.events"))
    cpu = keyed(read(path, "cpu.stat"))
    peak = read(path, "memory.peak")
    out = {
        "oom_kill": events.get("oom_kill", 0),
        "oom_group_kill": events.get("oom_group_kill", 0),
        "peak_mem": int(peak) if peak and peak.strip().isdigit() else None,
        "cpu_time": cpu["usage_usec"] / 1e6 if "usage_usec" in cpu else None,
    }
    remove(path)
    return out


def remove(path: str) -> bool:
    """Kill everything left in the cgroup and remove it; True once it is gone."""
    if not kill(path) and not os.path.isdir(path):
        return True
    deadline = time.monotonic() + 5
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)

"""cgroup v2 for jobs: startup checks, per-job cgroups with limits, pruning.

Job cgroups live under ``/sys/fs/cgroup/hpc-batch`` rather than inside the
service's own cgroup, so restarting the unit never touches a job::

    hpc-batch/shepherds/   every shepherd (no limits: an OOM kill of a job
                           must never take the exit record with it)
    hpc-batch/job-<id>/    the job: cpuset.cpus, cpuset.mems, memory.max,
                           memory.swap.max=0, memory.oom.group=1, pids.max

The daemon creates and limits a job's cgroup before starting its shepherd,
and reads the limits back: a job whose confinement the kernel did not apply
does not start.
"""

import os

from shepherd.base import cgroup

from .. import defaults
from . import devmask
from .discovery import format_cpulist, parse_cpulist

CGROUP_FS = "/sys/fs/cgroup"
REQUIRED = ("cpuset", "memory")
SHEPHERDS = "shepherds"
JOB_PREFIX = "job-"   # a job's cgroup: job-<id>


class CgroupError(Exception):
    """cgroups cannot provide the isolation asked for; the message names the piece."""


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _is_cgroup2(mountpoint: str) -> bool:
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) > 4 and fields[4] == mountpoint and right.split()[:1] == ["cgroup2"]:
                    return True
    except OSError:
        pass
    return False


def own_cgroup() -> str:
    """The daemon's own cgroup v2 path (from /proc/self/cgroup)."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return "/"


def check_available(root: str = defaults.CGROUP_ROOT) -> None:
    """Refuse (CgroupError) unless cgroup v2 with cpuset and memory is usable by us."""
    optout = "pass --no-cgroups to run without isolation (development only)"
    if os.geteuid() != 0:
        raise CgroupError(f"hpc-batchd is not running as root, so it cannot create job cgroups; {optout}")
    if not _is_cgroup2(CGROUP_FS):
        raise CgroupError(f"cgroup v2 is not mounted at {CGROUP_FS} (a unified hierarchy is needed; "
                          f"boot with systemd.unified_cgroup_hierarchy=1); {optout}")
    mine = os.path.join(CGROUP_FS, own_cgroup().lstrip("/"))
    try:
        have = _read(os.path.join(mine, "cgroup.controllers")).split()
    except OSError as exc:
        raise CgroupError(f"cannot read {mine}/cgroup.controllers: {exc.strerror}; {optout}") from None
    missing = [c for c in REQUIRED if c not in have]
    if missing:
        raise CgroupError(
            f"the {' and '.join(missing)} controller{'s are' if len(missing) > 1 else ' is'} not available "
            f"in the daemon's cgroup {mine}; the unit needs Delegate=cpuset memory pids "
            f"(was it removed by a drop-in?); {optout}")


def setup(root: str = defaults.CGROUP_ROOT) -> None:
    """Create the job tree and enable the controllers jobs need."""
    parent = os.path.dirname(root)
    try:
        wanted = [c for c in ("cpuset", "memory", "pids")
                  if c in _read(os.path.join(parent, "cgroup.controllers")).split()]
        enabled = _read(os.path.join(parent, "cgroup.subtree_control")).split()
        todo = " ".join(f"+{c}" for c in wanted if c not in enabled)
        if todo:
            _write(os.path.join(parent, "cgroup.subtree_control"), todo)
        os.makedirs(root, exist_ok=True)
        _write(os.path.join(root, "cgroup.subtree_control"), " ".join(f"+{c}" for c in wanted))
        os.makedirs(os.path.join(root, SHEPHERDS), exist_ok=True)
    except OSError as exc:
        raise CgroupError(f"cannot set up {root}: {exc.strerror or exc}; "
                          f"pass --no-cgroups to run without isolation") from None


def job_path(root: str, job_id: int) -> str:
    """The cgroup of one job."""
    return os.path.join(root, f"{JOB_PREFIX}{job_id}")


def is_job_name(name: str) -> bool:
    """Whether *name* (an entry of the job tree) is a job's cgroup."""
    return name.startswith(JOB_PREFIX) and name[len(JOB_PREFIX):].isdigit()


def shepherds_path(root: str) -> str:
    """The cgroup all shepherds join."""
    return os.path.join(root, SHEPHERDS)


def pin_shepherds(root: str, cpus) -> None:
    """Confine the shepherds' cgroup to ``cpus`` (the housekeeping CPUs; empty: wherever the tree may run).

    Raises OSError when the kernel refuses (ENOSPC for an empty list while shepherds run:
    ``shepherdcpus`` handles that); a job's child leaves for its own cgroup before it execs, so
    this never confines a job.
    """
    # An empty list must still reach the kernel (it then inherits the parent's CPUs): a write of
    # nothing makes no write(2) at all, and the old housekeeping CPUs would stay.
    _write(os.path.join(shepherds_path(root), "cpuset.cpus"), format_cpulist(cpus) or "\n")


def check_pids(root: str = defaults.CGROUP_ROOT) -> None:
    """Refuse (CgroupError) unless job cgroups get the pids controller (for --max-pids)."""
    try:
        have = _read(os.path.join(root, "cgroup.subtree_control")).split()
    except OSError as exc:
        have, why = [], exc.strerror
    else:
        why = "not enabled"
    if "pids" not in have:
        raise CgroupError(f"the pids controller is {why} for {root} (the unit needs Delegate=cpuset memory "
                          f"pids), so --max-pids cannot be enforced; pass --max-pids 0 to run without "
                          f"a per-job process limit")


def create_job(root: str, job_id: int, cpus, mems, mem_bytes: int, max_pids: int = 0,
               gpu_minors: tuple[int, ...] | None = None) -> str:
    """Create and limit a job's cgroup; raise CgroupError if the kernel did not apply it.

    *gpu_minors*, when given, masks the GPUs: the job may open only
    /dev/nvidia<minor> for those minors (and nvidiactl only if it has any).
    The device program stays attached for the cgroup's life, across the
    daemon's reloads and restarts.
    """
    path = job_path(root, job_id)
    try:
        if os.path.isdir(path) and not discard(path):
            raise CgroupError(f"a leftover cgroup {path} is still busy; job {job_id} cannot use it")
        os.mkdir(path)
        _write(os.path.join(path, "cpuset.cpus"), format_cpulist(cpus))
        _write(os.path.join(path, "cpuset.mems"), format_cpulist(mems))
        _write(os.path.join(path, "memory.max"), str(mem_bytes))
        _write(os.path.join(path, "memory.swap.max"), "0")
        _write(os.path.join(path, "memory.oom.group"), "1")
        if max_pids:
            _write(os.path.join(path, "pids.max"), str(max_pids))
        if gpu_minors is not None:
            devmask.apply(path, gpu_minors, control=bool(gpu_minors))
        eff_cpus = set(parse_cpulist(_read(os.path.join(path, "cpuset.cpus.effective"))))
        eff_mems = set(parse_cpulist(_read(os.path.join(path, "cpuset.mems.effective"))))
    except OSError as exc:
        remove(path)
        raise CgroupError(f"cannot confine job {job_id} in {path}: {exc.strerror or exc}") from None
    if eff_cpus != set(cpus) or eff_mems != set(mems):
        remove(path)
        raise CgroupError(
            f"the kernel did not apply job {job_id}'s confinement: asked for cpus {format_cpulist(cpus)} "
            f"mems {format_cpulist(mems)}, got cpus {format_cpulist(eff_cpus)} mems {format_cpulist(eff_mems)}")
    return path


def discard(path: str) -> bool:
    """Kill what is left in a job cgroup and try once to remove it; True once it is gone.

    Never waits (the daemon's loop calls it): a cgroup whose processes are
    still dying is left for the caller to try again.
    """
    cgroup.kill(path)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def remove(path: str) -> None:
    """Kill what is left in a job cgroup and remove it, waiting a few seconds at most (start-up only)."""
    cgroup.remove(path)


def oom_killed(path: str) -> bool:
    """True if the cgroup's memory.events records an OOM kill."""
    return cgroup.keyed(cgroup.read(path, "memory.events")).get("oom_kill", 0) > 0


def prune(root: str, keep) -> list[str]:
    """Remove job cgroups whose job is not running (left by a crash); returns what went."""
    gone: list[str] = []
    try:
        names = os.listdir(root)
    except OSError:
        return gone
    for name in names:
        if is_job_name(name) and int(name[len(JOB_PREFIX):]) not in keep:
            remove(os.path.join(root, name))
            gone.append(name)
    return gone

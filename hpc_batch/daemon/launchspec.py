"""What a job's shepherd is told at its start: its environment and its launch spec (pure).

The engine reads what these need (the stored environment, the user's passwd
entry, the reproducibility record's part) and writes the spec; here is only
how they combine. One rule of the house lives here: ``HPC_BATCH_JOB_ID`` and
``CUDA_VISIBLE_DEVICES`` are the daemon's, and no environment a user forwards
or sets wins over them (``tests/unit/test_launchspec.py``).
"""

from collections.abc import Sequence
from typing import Any

from shepherd.base import notifytext, records

from .. import defaults
from ..core.jobs import Job
from ..core.resources import Allocation


def environment(job: Job, stored: dict[str, Any], home: str, shell: str, mask_gpus: bool,
                gpu_uuids: dict[int, str]) -> dict[str, str]:
    """The job's environment: the one forwarded with ``--env``, or a clean one from the user's
    *home* and *shell*, with ``--env-var``'s settings on top and then the daemon's own.

    *stored* is the store's record of it (``forward``, ``job_env``, ``base``; ``{}``: a clean
    environment), *mask_gpus* and *gpu_uuids* say how the job's GPUs are named to CUDA.
    """
    if stored.get("forward") is not None:
        env = dict(stored["forward"])
    else:
        base = stored.get("base") or {}
        env = {"PATH": base.get("PATH") or defaults.DEFAULT_PATH, "HOME": home, "USER": job.user,
               "SHELL": shell, "LANG": base.get("LANG") or "C.UTF-8"}
    env.update(stored.get("job_env") or {})
    # Set by the daemon and never overridden: without masking the GPU list is how a job is held to its GPUs.
    env["HPC_BATCH_JOB_ID"] = str(job.id)
    if job.array is not None:   # from the record, not stored per job: a bulk submit's jobs share one environment
        env["HPC_BATCH_ARRAY_INDEX"] = str(job.array["index"])
        env["HPC_BATCH_ARRAY_JOB_ID"] = str(job.array["first"])
    env["CUDA_VISIBLE_DEVICES"] = visible_devices(job.alloc.gpus if job.alloc else (), mask_gpus, gpu_uuids)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"   # CUDA numbers GPUs as nvidia-smi does
    return env


def visible_devices(gpus: Sequence[int], mask_gpus: bool, gpu_uuids: dict[int, str]) -> str:
    """CUDA_VISIBLE_DEVICES for a job given *gpus* (nvidia-smi indices).

    Masked, CUDA enumerates only the devices the job can open, so plain
    indices would point at the wrong (or no) GPU: name them by UUID, or
    failing that renumber them 0..n-1 in index order. Unmasked, the
    indices as nvidia-smi gives them (with CUDA_DEVICE_ORDER=PCI_BUS_ID).
    """
    if not mask_gpus:
        return ",".join(str(g) for g in gpus)
    uuids = [gpu_uuids.get(g) for g in gpus]
    if all(uuids):
        return ",".join(u for u in uuids if u)
    return ",".join(str(i) for i in range(len(gpus)))


def build(job: Job, alloc: Allocation, env: dict[str, str], *, cgroup: str | None, shepherd_cgroup: str | None,
          use_cgroups: bool, admin_gid: int | None, max_output_buffer: int,
          record: dict[str, Any] | None) -> records.LaunchSpec:
    """What the shepherd needs, all of it: it cannot ask the daemon anything later.

    The grace, delivery limit and fork retry are the spec's own defaults
    (one definition, in shepherd/base/records.py, which the shepherd can read).
    """
    return records.LaunchSpec(
        id=job.id, user=job.user, uid=job.uid, gid=job.gid, cwd=job.cwd,
        argv=job.argv, env=env, output=job.output, umask=job.umask,
        admin_gid=admin_gid,
        cpus=None if use_cgroups else list(alloc.cpus),
        cgroup=cgroup,
        shepherd_cgroup=shepherd_cgroup,
        # The shepherd keeps the deadline itself, so it holds while the daemon is down.
        deadline=job.deadline, max_output_buffer=max_output_buffer,
        aslr=job.request.aslr, thp=job.request.thp,
        record=record,
        notify=notify_spec(job),
    )


def notify_spec(job: Job) -> dict[str, Any] | None:
    """The shepherd's part of --notify (shepherd/notify.py), or None."""
    want = job.request.notify
    if not want:
        return None
    return {"tty": notifytext.TTY in want["forms"], "command": want.get("command"),
            "limit": notifytext.LIMIT, "name": job.name}

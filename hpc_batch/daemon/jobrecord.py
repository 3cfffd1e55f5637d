"""What the daemon hands the shepherd for a job's reproducibility record (pure).

The shepherd collects the record (``shepherd/record/recorder.py``); the daemon adds
only what it alone knows, from memory and without reading a file: the
allocation as it made it, the machine's state around the job (the
housekeeping CPUs, the other jobs on the same NUMA node and L3, by id), the
CPUs whose busy time counts as "others on the job's node and L3", the GPUs
with their row of the topology, and the admin's thresholds. Cost: one pass
over the running jobs, at the start of each job.
"""

from typing import Any

from shepherd.record import verdict

from .. import __version__
from ..core import gputopo


class ThresholdError(ValueError):
    """An admin's ``--record-threshold`` that names no threshold or gives no number."""


def parse_thresholds(words: list[str]) -> dict[str, float | None]:
    """``--record-thresholds NAME=VALUE,...`` words as a dict, checked against ``verdict.THRESHOLDS``
    (``none``: the figure is reported, never judged)."""
    out: dict[str, float | None] = {}
    for word in words:
        name, eq, value = word.partition("=")
        if not eq or name not in verdict.THRESHOLDS:
            raise ThresholdError(f"--record-thresholds {word!r}: expected NAME=VALUE with NAME one of "
                                 f"{', '.join(sorted(verdict.THRESHOLDS))}")
        if value == "none":   # reported, never judged
            out[name] = None
            continue
        try:
            number = float(value)
        except ValueError:
            raise ThresholdError(f"--record-thresholds {word!r}: {value!r} is not a number (or none)") from None
        if not (number == number and 0 <= number < 1e15):
            raise ThresholdError(f"--record-thresholds {word!r}: give a number from 0 up, or none")
        out[name] = number
    return out


def spec(job, alloc, machine, running: dict, *, housekeeping, thresholds: dict, nvidia_smi: str | None,
         root: str, cgroups: bool, cpu_unit: str, commit: str | None = None) -> dict[str, Any]:
    """The launch spec's ``record`` entry for *job* starting on *alloc*.

    *running* maps the other running jobs' ids to their allocations
    (``resources.Allocation``).
    """
    topo = machine.cpu_topology
    mems = [n for n, _ in alloc.mem_by_node]
    node_cpus = sorted({c for n in machine.nodes if n.id in mems for c in n.cpus}) or list(alloc.cpus)
    l3 = {topo.last_level_cache(c) for c in alloc.cpus} - {None}
    l3_cpus = sorted({c for cache in l3 for c in cache.cpus}) or list(alloc.cpus)
    node_set, l3_set = set(node_cpus), set(l3_cpus)
    same_node = sorted(i for i, other in running.items() if i != job.id and node_set & set(other.held))
    same_l3 = sorted(i for i, other in running.items() if i != job.id and l3_set & set(other.held))
    return {
        "version": __version__, "commit": commit, "root": root,
        "thresholds": thresholds, "env_values": job.request.record_env,
        "to": _record_path(job),
        "cpus": list(alloc.cpus), "mems": mems, "node_cpus": node_cpus, "l3_cpus": l3_cpus,
        "held_idle": sorted(set(alloc.held) - set(alloc.cpus)),
        "requested": {
            "request": job.request.recorded(),
            "cpus": list(alloc.cpus), "held": list(alloc.held), "idle": list(alloc.idle),
            "cores": [list(c) for c in alloc.cores], "l3_idle": list(alloc.l3_idle),
            "l3_ids": sorted({cache.id for cache in l3 if cache.id is not None}),
            "mems": mems, "mem": alloc.mem, "gpus": list(alloc.gpus), "exclusive": alloc.exclusive,
            "cpu_unit": cpu_unit, "cgroups": cgroups,
        },
        "machine": {
            "housekeeping_cpus": list(housekeeping),
            "jobs_on_same_node": same_node,
            "jobs_on_same_l3": same_l3,
            "node_cpus": node_cpus, "l3_cpus": l3_cpus,
        },
        "gpus": [{"index": g, "uuid": machine.gpu_uuids.get(g), "topo": _topo_row(machine.topology, g)}
                 for g in alloc.gpus],
        "nvidia_smi": nvidia_smi if alloc.gpus else None,
    }


def _record_path(job) -> str | None:
    """Where ``dispatch new --record`` asked for the record: a file, or record.<id>.json in a directory."""
    to = job.request.record_to
    if to and job.request.record_is_dir:
        return f"{to.rstrip('/')}/record.{job.id}.json"
    return to


def _topo_row(topo: gputopo.Topology | None, gpu: int) -> dict[str, Any] | None:
    """GPU *gpu*'s row of ``nvidia-smi topo -m``: its link to each other GPU, and its NUMA node."""
    if topo is None or gpu not in topo.gpus:
        return None
    links: dict[str, str | None] = {}
    for other in topo.gpus:
        if other != gpu:
            try:
                links[f"GPU{other}"] = str(topo.link(gpu, other))
            except KeyError:
                links[f"GPU{other}"] = None
    return {"links": links, "numa": topo.numa.get(gpu)}

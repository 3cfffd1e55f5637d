"""Discover the machine: NUMA nodes and CPU cores from sysfs, GPUs from ``nvidia-smi``.

GPUs come from ``nvidia-smi -L`` (indices and UUIDs), how they are wired
from ``nvidia-smi topo -m``, and each card's device minor from ``nvidia-smi
-q`` (or /proc/driver/nvidia/gpus/*/information): masking opens a device node
by that minor, never by assuming index N is /dev/nvidiaN.

Parsers are pure; the few functions that touch the filesystem or run a
program take their roots/PATH as arguments so tests can point them at
recorded fixtures.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from ..core import cputopo, gputopo
from ..core.cputopo import format_cpulist, parse_cpulist
from ..core.resources import Machine, Node
from ..core.sizes import format_size

NVIDIA_SMI_TIMEOUT = 10.0  # seconds; a wedged driver must not stall startup

_MEMTOTAL = re.compile(r"^(?:Node\s+\d+\s+)?MemTotal:\s+(\d+)\s*kB\s*$", re.M)
_GPU_LINE = re.compile(r"^GPU (\d+): ")


def parse_node_meminfo(text: str) -> int:
    """Bytes in the MemTotal line of node*/meminfo (or /proc/meminfo)."""
    m = _MEMTOTAL.search(text)
    if m is None:
        raise ValueError("no MemTotal line in meminfo")
    return int(m.group(1)) * 1024


def parse_nvidia_smi_list(text: str) -> tuple[int, ...]:
    """GPU indices from ``nvidia-smi -L`` output.

    Only top-level "GPU <n>: ..." lines count; indented MIG device lines
    belong to the GPU above them and are not GPUs of their own.
    """
    found = {int(m.group(1)) for line in text.splitlines() if (m := _GPU_LINE.match(line))}
    return tuple(sorted(found))


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


def read_numa(
    sysfs_root: str = "/sys",
    allowed_cpus: set[int] | None = None,
    proc_root: str = "/proc",
) -> tuple[Node, ...]:
    """Read NUMA nodes under ``sysfs_root``, limited to ``allowed_cpus``.

    Pass ``os.sched_getaffinity(0)`` as ``allowed_cpus`` so jobs only get
    CPUs the daemon may use; nodes left without allowed CPUs are dropped.
    Without ``devices/system/node`` the machine is one node 0 holding all
    allowed CPUs (or ``devices/system/cpu/online``) and MemTotal from
    ``<proc_root>/meminfo``.
    """
    base = os.path.join(sysfs_root, "devices", "system", "node")
    if not os.path.isdir(base):
        return (_single_node(sysfs_root, allowed_cpus, proc_root),)
    online = None
    online_path = os.path.join(base, "online")
    if os.path.exists(online_path):
        online = set(parse_cpulist(_read(online_path)))  # same list format
    nodes = []
    for name in os.listdir(base):
        m = re.fullmatch(r"node(\d+)", name)
        if m is None or (online is not None and int(m.group(1)) not in online):
            continue
        d = os.path.join(base, name)
        cpus = parse_cpulist(_read(os.path.join(d, "cpulist")))
        if allowed_cpus is not None:
            cpus = tuple(c for c in cpus if c in allowed_cpus)
        if not cpus:
            continue  # memory-only, or none of it is ours to hand out
        nodes.append(Node(int(m.group(1)), cpus, parse_node_meminfo(_read(os.path.join(d, "meminfo")))))
    return tuple(sorted(nodes, key=lambda n: n.id))


def _read_optional(path: str) -> str | None:
    """The file's text, or None when it is missing or unreadable (an offline CPU, an old kernel)."""
    try:
        return _read(path)
    except OSError:
        return None


def read_cpu_files(sysfs_root: str, cpu: int) -> dict[str, str | None] | None:
    """The text of the topology and cache files of ``cpu`` under ``sysfs_root``, for ``cputopo.parse_cpu``.

    None when the kernel has no ``cpu<N>`` directory at all.
    """
    base = os.path.join(sysfs_root, "devices", "system", "cpu", f"cpu{cpu}")
    if not os.path.isdir(base):
        return None
    files = {rel: _read_optional(os.path.join(base, rel))
             for rel in (cputopo.SIBLINGS, cputopo.CORE_ID, cputopo.PACKAGE_ID)}
    try:
        indexes = [n for n in os.listdir(os.path.join(base, "cache")) if re.fullmatch(r"index\d+", n)]
    except OSError:
        indexes = []
    for name in indexes:
        for leaf in cputopo.CACHE_FILES:
            rel = f"cache/{name}/{leaf}"
            files[rel] = _read_optional(os.path.join(base, rel))
    return files


def read_cpu_topology(sysfs_root: str, cpus) -> tuple[cputopo.CpuTopology, list[str]]:
    """Threads, cores and caches of ``cpus`` (the CPUs jobs may get) from sysfs, and log lines.

    Never raises: what cannot be read leaves a CPU a core of its own, and an
    inconsistent tree (CPUs that disagree on their siblings) is ignored
    whole, with a log line; either way the allocator then packs threads as
    if every CPU were a core, which is how it worked before it knew cores.
    """
    found = []
    missing = []
    for cpu in sorted(set(cpus)):
        files = read_cpu_files(sysfs_root, cpu)
        if files is None or files.get(cputopo.SIBLINGS) is None:
            missing.append(cpu)
        if files is None:
            continue
        try:
            found.append(cputopo.parse_cpu(cpu, files))
        except ValueError as exc:
            return cputopo.CpuTopology(), [f"CPU topology: unreadable ({exc}); each CPU is treated as a core "
                                           f"of its own"]
    try:
        topo = cputopo.build(found)
    except ValueError as exc:
        return cputopo.CpuTopology(), [f"CPU topology: inconsistent ({exc}); each CPU is treated as a core "
                                       f"of its own"]
    log = [topo.describe()] if found else []
    if missing:
        log.append(f"CPU topology: no thread_siblings_list for CPU {format_cpulist(missing)} under "
                   f"{os.path.join(sysfs_root, 'devices', 'system', 'cpu')}; "
                   f"{'each' if len(missing) > 1 else 'it'} is treated as a core of its own")
    return topo, log


def _single_node(sysfs_root: str, allowed_cpus: set[int] | None, proc_root: str) -> Node:
    """The one-node fallback for kernels without NUMA support in sysfs."""
    if allowed_cpus is not None:
        cpus = tuple(sorted(allowed_cpus))
    else:
        online = os.path.join(sysfs_root, "devices", "system", "cpu", "online")
        cpus = parse_cpulist(_read(online)) if os.path.exists(online) else tuple(range(os.cpu_count() or 1))
    return Node(0, cpus, parse_node_meminfo(_read(os.path.join(proc_root, "meminfo"))))


def find_gpus(path_env: str | None = None) -> tuple[tuple[int, ...], str]:
    """Run ``nvidia-smi -L`` from PATH (or ``path_env``) and list GPU indices.

    Never raises: a missing, failing or hanging nvidia-smi means no GPUs.
    Returns the indices and one line for the startup log.
    """
    gpus, line, _ = _find_gpus(path_env)
    return gpus, line


def _find_gpus(path_env: str | None) -> tuple[tuple[int, ...], str, str]:
    """``find_gpus``, plus the listing itself (for the UUIDs)."""
    exe = shutil.which("nvidia-smi", path=path_env if path_env is not None else os.environ.get("PATH"))
    if exe is None:
        return (), "GPUs: none (nvidia-smi not found on PATH)", ""
    try:
        res = subprocess.run(
            [exe, "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return (), f"GPUs: none ({exe} -L timed out after {NVIDIA_SMI_TIMEOUT:g} s)", ""
    except OSError as e:
        return (), f"GPUs: none ({exe} -L could not run: {e.strerror or e})", ""
    if res.returncode != 0:
        why = (res.stderr.strip() or res.stdout.strip()).splitlines()
        detail = f": {why[0]}" if why else ""
        return (), f"GPUs: none ({exe} -L exited {res.returncode}{detail})", ""
    gpus = parse_nvidia_smi_list(res.stdout)
    if not gpus:
        return (), f"GPUs: none ({exe} -L listed no GPUs)", ""
    return gpus, f"GPUs: {len(gpus)} from {exe} -L (indices {format_cpulist(gpus)})", res.stdout


def _run(exe: str, *args: str) -> str | None:
    """stdout of ``exe args`` when it exits 0 within the timeout, else None."""
    try:
        res = subprocess.run([exe, *args], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def gpu_details(gpus: tuple[int, ...], listing: str, path_env: str | None = None,
                proc_root: str = "/proc") -> tuple[gputopo.Topology | None, dict[int, str], dict[int, int], list[str]]:
    """Topology, UUIDs and device minors of the GPUs ``find_gpus`` listed, and log lines.

    Never raises: what cannot be learnt is None or missing, and the log says so.
    """
    log: list[str] = []
    exe = shutil.which("nvidia-smi", path=path_env if path_env is not None else os.environ.get("PATH"))
    if not gpus or exe is None:
        return None, {}, {}, log
    topo = None
    text = _run(exe, "topo", "-m")
    try:
        topo = gputopo.parse_topo(text) if text is not None else None
    except gputopo.TopoError as exc:
        log.append(f"GPU topology: unreadable ({exc}); GPUs are placed in index order")
    else:
        if topo is None:
            log.append(f"GPU topology: unknown ({exe} topo -m failed); GPUs are placed in index order")
        elif set(topo.gpus) != set(gpus):
            log.append(f"GPU topology: {exe} topo -m names other GPUs than -L; GPUs are placed in index order")
            topo = None
        else:
            log.append("GPU topology: " + ", ".join(
                f"{a}-{b} {topo.link(a, b)}" for a, b in sorted(topo.links)[:12]) +
                (" ..." if len(topo.links) > 12 else ""))
    uuids = gputopo.parse_uuids(listing)
    by_uuid = gputopo.parse_query_minors(_run(exe, "-q") or "")
    minors = {i: by_uuid[u] for i, u in uuids.items() if u in by_uuid}
    if len(minors) < len(gpus):
        minors.update(_proc_minors(gpus, exe, proc_root, minors))
    missing = [g for g in gpus if g not in minors]
    if missing:
        log.append(f"GPU device minors: unknown for GPU {format_cpulist(missing)} (nvidia-smi -q and "
                   f"{proc_root}/driver/nvidia/gpus gave none)")
    else:
        log.append("GPU device minors: " + ", ".join(f"GPU {g} is /dev/nvidia{minors[g]}" for g in gpus))
    return topo, uuids, minors, log


def _proc_minors(gpus: tuple[int, ...], exe: str, proc_root: str, known: dict[int, int]) -> dict[int, int]:
    """Minors from the driver's /proc files, matched to indices through the PCI bus id."""
    out = _run(exe, "--query-gpu=index,pci.bus_id", "--format=csv,noheader") or ""
    bus_of = {}
    for line in out.splitlines():
        index, _, bus = line.partition(",")
        if index.strip().isdigit():
            bus_of[bus.strip().lower()[-12:]] = int(index)
    found: dict[int, int] = {}
    base = os.path.join(proc_root, "driver", "nvidia", "gpus")
    try:
        names = os.listdir(base)
    except OSError:
        return found
    for name in names:
        try:
            with open(os.path.join(base, name, "information")) as f:
                where, minor = gputopo.parse_proc_information(f.read())
        except OSError:
            continue
        gpu = bus_of.get((where or name).lower()[-12:])
        if gpu is not None and minor is not None and gpu not in known:
            found[gpu] = minor
    return found


def discover(
    sysfs_root: str = "/sys",
    allowed_cpus: set[int] | None = None,
    path_env: str | None = None,
    proc_root: str = "/proc",
) -> tuple[Machine, list[str]]:
    """Discover NUMA nodes, CPU cores and GPUs; return the Machine and startup log lines."""
    nodes = read_numa(sysfs_root, allowed_cpus, proc_root)
    log = [f"NUMA: {len(nodes)} node{'s' if len(nodes) != 1 else ''} with usable CPUs"]
    log += [
        f"NUMA node {n.id}: cpus {format_cpulist(n.cpus)} ({len(n.cpus)}), memory {format_size(n.mem)}"
        for n in nodes
    ]
    cpu_topo, more = read_cpu_topology(sysfs_root, [c for n in nodes for c in n.cpus])
    log += more
    gpus, line, listing = _find_gpus(path_env)
    log.append(line)
    topo, uuids, minors, more = gpu_details(gpus, listing, path_env, proc_root)
    log += more
    return Machine(nodes, gpus, topo, uuids, minors, cpu_topo), log

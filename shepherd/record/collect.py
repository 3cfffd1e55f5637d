"""The static sections of a job's record: who collected it, the kernel, CPU, frequency, memory, cgroup.

The shepherd calls these once, right after the job has started (none of it
is on the job's start path). Each takes a :class:`sysread.Source`, so tests
hand it a fixture tree, and returns a dict whose leaves are fields
(``{"value", "source"}``, or a null value with the ``error`` that says why).
Members that the kernel lists (vulnerabilities, NUMA nodes) are dicts of
fields; where the directory itself cannot be listed the dict is replaced by
one null field saying why.

Per-CPU and per-policy facts are grouped: CPUs (or policies) whose files
read the same become one entry naming them as a cpulist, so a 256-CPU job's
record stays a few lines long. A grouped entry's source names its files with
the numbers in braces (``/sys/devices/system/cpu/cpufreq/policy{0-3}/...``).

Standard library only: the shepherd loads this (and no datetime: its import
alone costs about a millisecond of the shepherd's start).
"""

import os
import time

try:
    from shepherd.base import sysread
except ImportError:  # run as a file: the base is a top-level package
    from base import sysread  # type: ignore[no-redef]

SCHEMA = 1              # the record's schema version: the one definition

field = sysread.field
CPU = "/sys/devices/system/cpu"
NODE = "/sys/devices/system/node"
CPUFREQ = f"{CPU}/cpufreq"
CPUINFO_LIMIT = 16384   # the first processor's entry is under 4 KiB; reading all of a large machine's is slow
NO_CGROUP = "no cgroup (--no-cgroups)"


# -- small parsers ------------------------------------------------------------
parse_cpulist = sysread.parse_cpulist
format_cpulist = sysread.format_cpulist


def _int_or_text(text: str):
    """An integer where the file holds one ("max", "0x1000065" and the like stay text)."""
    try:
        return int(text)
    except ValueError:
        return text


def _selected(text: str) -> str:
    """The bracketed choice of a sysfs setting (``"always [madvise] never"`` -> ``"madvise"``)."""
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else text


def _kv(text: str) -> dict[str, str]:
    """``Key: value`` lines (/proc/meminfo, one /proc/cpuinfo entry) as a dict of stripped strings."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out.setdefault(key.strip(), value.strip())
    return out


def _kb(text: str) -> int:
    """``"1234 kB"`` -> 1234 (the unit meminfo gives)."""
    return int(text.split()[0])


def _from(table: dict[str, str] | None, err: str | None, key: str, source: str, parse=None) -> dict:
    """The field for *key* of a parsed ``Key: value`` file, or null with why."""
    if table is None:
        return field(None, source, err)
    if key not in table:
        return field(None, source, f"no {key!r} line")
    try:
        return field(parse(table[key]) if parse else table[key], source)
    except ValueError as exc:
        return field(None, source, sysread.error_text(exc))


def _listdir(src, path: str) -> list[str]:
    """The names in directory *path*, sorted; raises OSError (unlike ``Source.listdir``, the reason counts)."""
    return sorted(os.listdir(src.path(path)))


def _numbered(src, path: str, prefix: str) -> list[int]:
    """The N of each ``<prefix>N`` entry of directory *path* (cpuN, nodeN, policyN), sorted; raises OSError."""
    return sorted(int(n[len(prefix):]) for n in os.listdir(src.path(path))
                  if n.startswith(prefix) and n[len(prefix):].isdigit())


def _braced(prefix: str, ids, suffix: str) -> str:
    """A grouped source: ``/sys/.../cpu{0-3}/power/...`` (no braces for a single number)."""
    ids = list(ids)
    middle = str(ids[0]) if len(ids) == 1 else "{" + format_cpulist(ids) + "}"
    return f"{prefix}{middle}{suffix}"


def _fact(f: dict):
    """What a field says, for grouping equal ones: the value, or the reason there is none."""
    return ("error", f["error"]) if "error" in f else ("value", repr(f["value"]))


# -- collector ----------------------------------------------------------------
def collector(src, job_id: int, version: str, commit: str | None) -> dict:
    """Who made the record and when: hpc-batch's version and commit, the schema, the machine's
    hostname, boot id and uptime, and the UTC and monotonic time now (source ``"clock"``)."""
    now = time.time()
    utc = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
    return {
        "job": field(job_id, "hpc-batch"),
        "version": field(version, "hpc-batch"),
        "commit": field(commit, "hpc-batch") if commit
        # An installed package carries no git metadata, so the daemon never has one to give.
        else field(None, "hpc-batch", "not recorded: an installed hpc-batch knows its version, not its commit"),
        "schema": field(SCHEMA, "hpc-batch"),
        "hostname": src.field("/proc/sys/kernel/hostname"),
        "boot_id": src.field("/proc/sys/kernel/random/boot_id"),
        "uptime_s": src.field("/proc/uptime", lambda t: float(t.split()[0])),
        "utc": field(utc, "clock"),
        "monotonic_s": field(time.monotonic(), "clock"),
    }


# -- kernel -------------------------------------------------------------------
def cgroup_mode(mounts: str) -> str:
    """``"unified"`` (cgroup v2 only), ``"hybrid"`` (v1 controllers beside a v2 mount), ``"v1"`` or
    ``"none"``, from /proc/mounts text (as systemd names the three layouts)."""
    types = {line.split()[2] for line in mounts.splitlines() if len(line.split()) > 2}
    if "cgroup2" in types:
        return "hybrid" if "cgroup" in types else "unified"
    return "v1" if "cgroup" in types else "none"


# Facts the running kernel fixes at boot, read once per process and kept (a process cannot outlive
# the boot it started in): the fork server reads them as it starts (``recorder.warm_up``), so the
# shepherds it forks have them without a read. Only on the machine: a fixture tree read through
# the same root may change between two reads.
_BOOT: dict = {}


def _per_boot(src, key, make):
    """``make()``, once per process on the machine (see _BOOT); every time under a fixture root.

    What it returns is shared by every record of this process: callers must not change it.
    """
    if src.root != "/":
        return make()
    if key not in _BOOT:
        _BOOT[key] = make()
    return _BOOT[key]


def _kernel_boot_fields(src) -> dict:
    """The kernel's fields that hold for the whole boot: uname's strings and the boot command line."""
    machine = src.field("/proc/sys/kernel/arch")
    if machine["value"] is None and src.root == "/":
        machine = field(os.uname().machine, "uname(2)")
    return {
        "sysname": src.field("/proc/sys/kernel/ostype"),
        "release": src.field("/proc/sys/kernel/osrelease"),
        "version": src.field("/proc/sys/kernel/version"),
        "machine": machine,
        "cmdline": src.field("/proc/cmdline"),
        "nohz_full": src.field(f"{CPU}/nohz_full"),   # (a boot parameter only)
    }


def kernel(src) -> dict:
    """uname, the boot command line, isolated and nohz_full CPUs, and the cgroup layout.

    uname's strings are read from /proc/sys/kernel/{ostype,osrelease,version,arch}: the same
    strings uname(2) returns (the UTS namespace's), and readable under a fixture root. Kernels
    before ``arch`` existed fall back to uname(2) for the machine, on the machine only. Those
    and the command line are fixed for the boot (read once per process, see _per_boot); the
    isolated CPUs and the cgroup layout can change while it runs and are read each time.
    """
    fixed = _per_boot(src, "kernel", lambda: _kernel_boot_fields(src))
    return {
        "sysname": fixed["sysname"],
        "release": fixed["release"],
        "version": fixed["version"],
        "machine": fixed["machine"],
        "cmdline": fixed["cmdline"],
        "isolated": src.field(f"{CPU}/isolated"),
        "nohz_full": fixed["nohz_full"],
        "cgroup_mode": src.field("/proc/mounts", cgroup_mode),
    }


# -- cpu ----------------------------------------------------------------------
CPUINFO_KEYS = (("vendor", "vendor_id", None), ("model_name", "model name", None),
                ("family", "cpu family", _int_or_text), ("model", "model", _int_or_text),
                ("stepping", "stepping", _int_or_text), ("microcode", "microcode", None))


def caches(src) -> dict:
    """Every distinct cache, as one field: entries grouped by (level, type, size), each with the
    ``shared_cpu_lists`` of its instances (a cache is deduplicated by level, type and sharers).

    A CPU's index directory is read only when no cache already read covers that CPU at that
    index, so the cost follows the number of caches, not CPUs x indexes. ``size`` is null where
    the kernel gives none.
    """
    source = f"{CPU}/cpu*/cache/index*/{{level,type,size,shared_cpu_list}}"
    try:
        cpus = _numbered(src, CPU, "cpu")
    except OSError as exc:
        return field(None, source, sysread.error_text(exc))
    covered: dict[str, set[int]] = {}
    seen: dict[tuple, dict] = {}
    for cpu in cpus:
        base = f"{CPU}/cpu{cpu}/cache"
        try:
            indexes = [n for n in _listdir(src, base) if n.startswith("index")]
        except OSError:
            continue
        for index in indexes:
            if cpu in covered.get(index, ()):
                continue
            d = f"{base}/{index}"
            try:
                level = int(src.value(f"{d}/level"))
                kind = src.value(f"{d}/type")
                shared = parse_cpulist(src.value(f"{d}/shared_cpu_list"))
            except (OSError, ValueError):
                continue
            try:
                size = src.value(f"{d}/size") or None
            except OSError:
                size = None
            covered.setdefault(index, set()).update(shared or [cpu])
            seen.setdefault((level, kind, format_cpulist(shared)), {"size": size})
    if not seen:
        return field(None, source, "no readable cache directories")
    groups: dict[tuple, list[str]] = {}
    for (level, kind, shared), info in seen.items():
        groups.setdefault((level, kind, info["size"]), []).append(shared)
    entries = [{"level": level, "type": kind, "size": size,
                "shared_cpu_lists": sorted(lists, key=lambda s: parse_cpulist(s) or [-1])}
               for (level, kind, size), lists in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                                       str(kv[0][2])))]
    return field(entries, source)


def numa_distances(src) -> dict:
    """One field: each node's row of the distance table (``{"0": [10, 21], "1": [21, 10]}``)."""
    source = f"{NODE}/node*/distance"
    try:
        nodes = _numbered(src, NODE, "node")
    except OSError as exc:
        return field(None, source, sysread.error_text(exc))
    if not nodes:
        return field(None, source, f"no node directories in {NODE}")
    rows = {}
    for node in nodes:
        try:
            rows[str(node)] = [int(x) for x in src.value(f"{NODE}/node{node}/distance").split()]
        except (OSError, ValueError) as exc:
            return field(None, source, f"node{node}: {sysread.error_text(exc)}")
    return field(rows, source)


def vulnerabilities(src) -> dict:
    """Each file of /sys/devices/system/cpu/vulnerabilities as a field (a null field if the directory is not there)."""
    base = f"{CPU}/vulnerabilities"
    try:
        names = _listdir(src, base)
    except OSError as exc:
        return field(None, base, sysread.error_text(exc))
    return {name: src.field(f"{base}/{name}") for name in names}


def cpu(src) -> dict:
    """The processor: the first /proc/cpuinfo entry's identity and microcode, SMT control and
    state, the online CPUs, the caches and who shares them, NUMA distances, vulnerabilities."""
    table: dict[str, str] | None = None
    err = None
    try:
        table = _kv(src.read("/proc/cpuinfo", CPUINFO_LIMIT).split("\n\n", 1)[0])
    except OSError as exc:
        err = sysread.error_text(exc)
    out = {key: _from(table, err, name, "/proc/cpuinfo", parse) for key, name, parse in CPUINFO_KEYS}
    online = src.field(f"{CPU}/online")
    smt_control = src.field(f"{CPU}/smt/control")
    smt_active = src.field(f"{CPU}/smt/active", lambda t: bool(int(t)))
    out.update({
        "online": online,
        "smt_control": smt_control,
        "smt_active": smt_active,
        # The caches are the hardware's; which CPUs share each follows the online ones only.
        "caches": _per_boot(src, ("caches", _fact(online)), lambda: caches(src)),
        "numa_distances": numa_distances(src),
        # About twenty files, fixed by the kernel and the microcode; SMT switched off or on at run
        # time rewrites some (MDS, L1TF), and a late microcode load others: read again when any moves.
        "vulnerabilities": _per_boot(src, ("vulnerabilities", _fact(smt_control), _fact(smt_active),
                                           _fact(out["microcode"])), lambda: vulnerabilities(src)),
    })
    return out


# -- frequency ----------------------------------------------------------------
POLICY_FILES = ("scaling_driver", "scaling_governor", "scaling_min_freq", "scaling_max_freq",
                "cpuinfo_min_freq", "cpuinfo_max_freq", "energy_performance_preference", "boost")


def _policies(src) -> dict[int, list[int]]:
    """Each cpufreq policy's number and the CPUs it governs (its affected_cpus)."""
    out: dict[int, list[int]] = {}
    try:
        numbers = _numbered(src, CPUFREQ, "policy")
    except OSError:
        return out
    for n in numbers:
        try:
            out[n] = parse_cpulist(src.value(f"{CPUFREQ}/policy{n}/affected_cpus"))
        except (OSError, ValueError):
            continue
    return out


def _idle_states(src, cpu: int) -> tuple:
    """(name, disable) of each cpuidle state of *cpu*, or the reason there are none."""
    base = f"{CPU}/cpu{cpu}/cpuidle"
    try:
        states = [f"state{n}" for n in _numbered(src, base, "state")]
    except OSError as exc:
        return ("error", sysread.error_text(exc))
    out = []
    for state in states:
        name = src.field(f"{base}/{state}/name")["value"]
        disable = src.field(f"{base}/{state}/disable", int)["value"]
        out.append({"state": state, "name": name, "disable": disable})
    return ("value", out)


def frequency(src, cpus: list[int]) -> dict:
    """The frequency settings that govern the job's *cpus*.

    ``policies``: one entry per group of cpufreq policies whose files read the same, with the
    job's CPUs in them (``cpus``), the policies (``policies``), and ``shared`` when a policy also
    governs CPUs the job does not hold. ``per_cpu``: the groups of job CPUs with the same
    energy_perf_bias and cpuidle states (name and ``disable``). The machine-wide switches
    (``boost``, intel_pstate's ``no_turbo`` and ``status``, amd_pstate's ``status``) and the
    cpuidle driver. ``available`` (a plain bool) says whether cpufreq governs any job CPU.
    """
    want = sorted(set(cpus))
    governing = {n: governed for n, governed in _policies(src).items() if set(governed) & set(want)}
    groups: dict[tuple, list[int]] = {}
    facts: dict[int, dict] = {}
    for n, governed in sorted(governing.items()):
        files = {f: src.field(f"{CPUFREQ}/policy{n}/{f}", _int_or_text) for f in POLICY_FILES}
        shared = not set(governed) <= set(want)
        facts[n] = files
        groups.setdefault((shared,) + tuple(_fact(files[f]) for f in POLICY_FILES), []).append(n)
    policies = []
    for key, numbers in groups.items():
        first = facts[numbers[0]]
        entry: dict = {"policies": format_cpulist(numbers),
                       "cpus": format_cpulist(c for n in numbers for c in governing[n] if c in want),
                       "shared": key[0]}
        for f in POLICY_FILES:
            entry[f] = dict(first[f], source=_braced(f"{CPUFREQ}/policy", numbers, f"/{f}"))
        policies.append(entry)
    ruled = {c for governed in governing.values() for c in governed}

    per_cpu_groups: dict[tuple, list[int]] = {}
    per_cpu_facts: dict[tuple, tuple] = {}
    for c in want:
        epb = src.field(f"{CPU}/cpu{c}/power/energy_perf_bias", _int_or_text)
        idle = _idle_states(src, c)
        key = (_fact(epb), idle[0], repr(idle[1]))
        per_cpu_groups.setdefault(key, []).append(c)
        per_cpu_facts.setdefault(key, (epb, idle))
    per_cpu = []
    for key, members in per_cpu_groups.items():
        epb, (kind, idle) = per_cpu_facts[key]
        idle_source = _braced(f"{CPU}/cpu", members, "/cpuidle/state*/{name,disable}")
        per_cpu.append({
            "cpus": format_cpulist(members),
            "energy_perf_bias": dict(epb, source=_braced(f"{CPU}/cpu", members, "/power/energy_perf_bias")),
            "idle_states": field(idle, idle_source) if kind == "value" else field(None, idle_source, idle),
        })
    return {
        "available": bool(ruled & set(want)),
        "policies": policies,
        "ungoverned_cpus": field(format_cpulist(c for c in want if c not in ruled), f"{CPUFREQ}/policy*/affected_cpus"),
        "per_cpu": per_cpu,
        "boost": src.field(f"{CPUFREQ}/boost", _int_or_text),
        "intel_pstate_status": src.field(f"{CPU}/intel_pstate/status"),
        "intel_pstate_no_turbo": src.field(f"{CPU}/intel_pstate/no_turbo", _int_or_text),
        "amd_pstate_status": src.field(f"{CPU}/amd_pstate/status"),
        "cpuidle_driver": src.field(f"{CPU}/cpuidle/current_driver"),
        "cpuidle_governor": src.field(f"{CPU}/cpuidle/current_governor_ro"),
    }


# -- memory -------------------------------------------------------------------
MEMINFO_KEYS = (("hugepages_total", "HugePages_Total", int), ("hugepages_free", "HugePages_Free", int),
                ("hugepages_rsvd", "HugePages_Rsvd", int), ("hugepages_surp", "HugePages_Surp", int),
                ("hugepagesize_kb", "Hugepagesize", _kb), ("swap_total_kb", "SwapTotal", _kb),
                ("swap_free_kb", "SwapFree", _kb), ("mem_total_kb", "MemTotal", _kb))


def parse_swaps(text: str) -> list[dict]:
    """/proc/swaps as a list of {filename, type, size_kb, used_kb, priority} (the header line skipped)."""
    out = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 5:
            out.append({"filename": parts[0], "type": parts[1], "size_kb": int(parts[2]),
                        "used_kb": int(parts[3]), "priority": int(parts[4])})
    return out


def _node_memory(src, node: int) -> dict:
    """A node's MemTotal and MemFree (kB) and its persistent huge pages of each size."""
    base = f"{NODE}/node{node}"
    table, err = None, None
    try:
        # "Node 0 MemTotal:  123 kB": drop the "Node <n>" prefix so the keys read as /proc/meminfo's.
        table = _kv("\n".join(line.split(None, 2)[-1] for line in src.read(f"{base}/meminfo").splitlines()))
    except OSError as exc:
        err = sysread.error_text(exc)
    hp_source = f"{base}/hugepages/hugepages-*kB/nr_hugepages"
    try:
        sizes = [n for n in _listdir(src, f"{base}/hugepages") if n.startswith("hugepages-")]
        pages = {n[len("hugepages-"):]: int(src.value(f"{base}/hugepages/{n}/nr_hugepages")) for n in sizes}
        hugepages = field(pages, hp_source)
    except (OSError, ValueError) as exc:
        hugepages = field(None, hp_source, sysread.error_text(exc))
    return {"mem_total_kb": _from(table, err, "MemTotal", f"{base}/meminfo", _kb),
            "mem_free_kb": _from(table, err, "MemFree", f"{base}/meminfo", _kb),
            "nr_hugepages": hugepages}


def memory(src, mems: list[int]) -> dict:
    """Memory: the job's NUMA nodes (*mems*; every node when empty) with their total, free and
    huge pages, THP's ``enabled`` and ``defrag``, numa_balancing, swappiness, zone_reclaim_mode,
    the huge page and swap lines of /proc/meminfo, and the swap areas."""
    nodes = sorted(set(mems))
    if not nodes:
        try:
            nodes = _numbered(src, NODE, "node")
        except OSError:
            nodes = []
    table, err = None, None
    try:
        table = _kv(src.read("/proc/meminfo"))
    except OSError as exc:
        err = sysread.error_text(exc)
    thp = "/sys/kernel/mm/transparent_hugepage"
    out = {
        "nodes": {str(n): _node_memory(src, n) for n in nodes} if nodes
        else field(None, f"{NODE}/node*", f"no node directories in {NODE}"),
        "thp_enabled": src.field(f"{thp}/enabled", _selected),
        "thp_defrag": src.field(f"{thp}/defrag", _selected),
        "numa_balancing": src.field("/proc/sys/kernel/numa_balancing", _int_or_text),
        "swappiness": src.field("/proc/sys/vm/swappiness", _int_or_text),
        "zone_reclaim_mode": src.field("/proc/sys/vm/zone_reclaim_mode", _int_or_text),
    }
    for key, name, parse in MEMINFO_KEYS:
        out[key] = _from(table, err, name, "/proc/meminfo", parse)
    out["swaps"] = src.field("/proc/swaps", parse_swaps)
    return out


# -- allocation read back -----------------------------------------------------
READ_BACK = (("cpus_effective", "cpuset.cpus.effective", None), ("partition", "cpuset.cpus.partition", None),
             ("mems_effective", "cpuset.mems.effective", None), ("memory_max", "memory.max", _int_or_text),
             ("memory_swap_max", "memory.swap.max", _int_or_text), ("pids_max", "pids.max", _int_or_text))


def read_back(src, cgroup: str | None) -> dict:
    """What the kernel holds for the job's *cgroup* (a machine path such as
    ``/sys/fs/cgroup/hpc-batch/job-12``): effective CPUs and memory nodes, the partition state,
    memory.max, memory.swap.max and pids.max (``"max"`` stays text). Without a cgroup every
    field is null, saying so."""
    if cgroup is None:
        return {key: field(None, name, NO_CGROUP) for key, name, _ in READ_BACK}
    base = cgroup.rstrip("/")
    return {key: src.field(f"{base}/{name}", parse) for key, name, parse in READ_BACK}


def sections(src, job_id: int, version: str, commit: str | None, cpus: list[int], mems: list[int],
             cgroup: str | None) -> dict:
    """All the static sections at once, keyed as in the record (``allocation`` holds ``read_back``)."""
    return {"collector": collector(src, job_id, version, commit), "kernel": kernel(src), "cpu": cpu(src),
            "frequency": frequency(src, cpus), "memory": memory(src, mems),
            "allocation": {"read_back": read_back(src, cgroup)}}

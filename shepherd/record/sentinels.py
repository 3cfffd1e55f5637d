"""Sentinels: the counters read just before a job is forked and again at its end.

A *snapshot* holds the counters that say whether anything else happened on
the job's CPUs while it ran: the interrupt counts on those CPUs, the thermal
throttle counters, swap traffic, the job cgroup's memory events, CPU
statistics and pressure, the machine's pressure, and the busy time of the
job's CPUs and of the NUMA node and L3 around them. :func:`delta` turns a
start and an end snapshot into the differences that ``verdict.judge`` weighs.

The start snapshot runs between the job's set-up and its fork, so it is
kept cheap: a handful of reads of procfs, sysfs and cgroupfs files, each
parsed only as far as the job's CPUs need. Nothing runs while the job runs.

Every section is a field (``sysread.field``): a value and the machine path
it came from, or null and the reason. A missing or odd file never raises.
Standard library only (the shepherd loads this).
"""

import os
import time

try:
    from shepherd.base import sysread
except ImportError:  # run as a file: the base is a top-level package
    from base import sysread  # type: ignore[no-redef]

CPU_DIR = "/sys/devices/system/cpu"
INTERRUPTS = "/proc/interrupts"
STAT = "/proc/stat"
VMSTAT = "/proc/vmstat"
THROTTLE = CPU_DIR + "/cpu*/thermal_throttle"
THROTTLE_FILES = ("core_throttle_count", "core_throttle_total_time_ms",
                  "package_throttle_count", "package_throttle_total_time_ms")
PRESSURES = ("cpu", "memory", "io")
SWAP_KEYS = ("pswpin", "pswpout")
CLOCK = "clock"
RUSAGE = "wait4(2) rusage"
NO_CGROUP = "no cgroup (--no-cgroups)"
NO_USAGE = "no usage of the job (no cgroup cpu.stat and none given)"
# /proc/interrupts is 11 bytes per online CPU per line: 256 CPUs and 1000 lines make 2.8 MB.
INTERRUPTS_LIMIT = 64 << 20
SPACE = ord(" ")
DESC_LIMIT = 80          # an interrupt's description is the kernel's (chip, hwirq, action); this bounds a long one

try:
    TICKS_PER_S = os.sysconf("SC_CLK_TCK")   # /proc/stat counts USER_HZ ticks
except (OSError, ValueError):
    TICKS_PER_S = 100


def snapshot(src: sysread.Source, cpus, node_cpus, l3_cpus, cgroup: str | None, held_cpus=()) -> dict:
    """The sentinel counters now, for a job on *cpus* in the cgroup *cgroup* (a machine path, or None).

    *node_cpus* and *l3_cpus* are the CPUs of the NUMA node(s) and L3(s) the
    job's CPUs belong to, *held_cpus* those it holds idle outside its cpuset
    (a benchmark job's SMT siblings, its L3 with --whole-l3): their busy
    time is kept so that :func:`delta` can tell how much CPU time others
    used there (on a held CPU, any is another's). Interrupt lines whose counts
    are zero on every job CPU are left out (a line absent from a snapshot
    counts zero there), which keeps a snapshot small on machines with
    hundreds of interrupt lines.
    """
    job = sorted({int(c) for c in cpus})
    groups = {"job": job, "node": sorted({int(c) for c in node_cpus}), "l3": sorted({int(c) for c in l3_cpus})}
    held = sorted({int(c) for c in held_cpus} - set(job))
    if held:
        groups["held"] = held
    now = time.time()
    snap: dict = {
        "time": {
            "utc": sysread.field(time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + ".%06dZ"
                                 % int((now % 1) * 1e6), CLOCK),
            "monotonic": sysread.field(time.monotonic(), CLOCK),
        },
        "cpus": job,
        "node_cpus": groups["node"],
        "l3_cpus": groups["l3"],
        **({"held_cpus": held} if held else {}),
        "interrupts": _read(src, INTERRUPTS, lambda text: interrupts(text, job), INTERRUPTS_LIMIT, raw=True),
        "cpu_busy": _read(src, STAT, lambda text: busy(text, groups)),
        "throttle": throttle(src, job),
        "vmstat": _read(src, VMSTAT, vmstat),
        "pressure": {name: _read(src, f"/proc/pressure/{name}", pressure) for name in PRESSURES},
        "cgroup": cgroup_counters(src, cgroup),
    }
    snap["facts"] = {
        "cpufreq": cpufreq_fact(src, job),
        "throttle_counters": sysread.field(snap["throttle"]["value"] is not None
                                           and "absent" not in snap["throttle"]["value"], THROTTLE),
    }
    return snap


def _read(src: sysread.Source, path: str, parse, limit: int = sysread.READ_LIMIT, raw: bool = False) -> dict:
    """*path*'s text (its bytes if *raw*) through *parse*, as a field (null with the reason when either fails)."""
    try:
        return sysread.field(parse(read_bytes(src, path, limit) if raw else src.read(path, limit)), path)
    except Exception as exc:  # a missing or odd file is a reason, never a failed snapshot
        return sysread.field(None, path, sysread.error_text(exc))


def read_bytes(src: sysread.Source, path: str, limit: int) -> bytes:
    """The bytes of *path* under *src*'s root, at most *limit*; raises OSError.

    The reads grow (64 KiB, then 1 MiB, then 16 MiB): a small machine's
    file comes in one small read, a large one's in few, each filled whole
    by seq_file.
    """
    fd = os.open(src.path(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        chunks, left, size = [], limit, 1 << 16
        while left > 0:
            chunk = os.read(fd, min(left, size))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
            size = min(size << 4, 16 << 20)
        return b"".join(chunks)
    finally:
        os.close(fd)


def interrupts(text: bytes | str, cpus: list[int]) -> dict:
    """The ``/proc/interrupts`` counts on *cpus*: ``{"cpus": [...], "lines": {name: {"counts", "desc"}}}``.

    The header names the online CPUs' columns (an offline CPU has none: its
    count is null). Lines with a count per CPU are kept when any job CPU's
    count is non-zero; ``counts`` is in the order of ``cpus``. Lines with a
    single machine-wide count (``ERR``, ``MIS``) say nothing about the job's
    CPUs and are skipped.

    On a large machine the file is megabytes (11 characters per CPU per
    line), so lines are not split whole: the kernel prints the counts in
    columns of 11 after the colon (``%10u`` and a space), and only the job's
    columns are sliced out, a run of adjacent columns at a time; a slice
    must hold exactly its columns' numbers between spaces (so it is right
    whatever the padding), and a line where it does not is split instead.
    The text is parsed as bytes: decoding megabytes would cost more than
    the parse.
    """
    if isinstance(text, str):
        text = text.encode()
    eol = text.find(b"\n")
    if eol <= 0:
        raise ValueError("no header line")
    header = text[:eol].split()
    column = {int(name[3:]): i for i, name in enumerate(header) if name.startswith(b"CPU") and name[3:].isdigit()}
    if not column:
        raise ValueError("no CPU columns in the header")
    ncols = len(header)
    wanted = [column.get(c) for c in cpus]
    columns = sorted({i for i in wanted if i is not None})
    runs = _runs(columns)
    # Where each job CPU's count is among the sliced ones (the runs' columns, in order).
    at = {col: k for k, col in enumerate(columns)}
    place = [at[i] if i is not None else None for i in wanted]
    in_order = place == list(range(len(columns)))
    width = 1 + 11 * ncols          # from a line's colon to the end of its last count
    out: dict = {}
    size = len(text)
    pos = eol + 1
    while pos < size and runs:
        eol = text.find(b"\n", pos)
        if eol < 0:
            eol = size
        colon = text.find(b":", pos, eol)
        line_pos, pos = pos, eol + 1
        if colon < 0 or eol - colon < width - 1:
            continue       # not a line, or one machine-wide count (ERR, MIS)
        values = _sliced(text, colon, eol, runs)
        if values is None:
            values = _split(text[colon + 1:eol], ncols)
            if values is None:
                continue
            values = [values[i] for i in columns]
            if not any(values):
                continue
        if not values:
            continue       # zero on every job CPU
        counts = values if in_order else [values[k] if k is not None else None for k in place]
        desc_at = colon + width
        if text[desc_at - 1:desc_at].isdigit() and text[desc_at:desc_at + 1] in (b" ", b""):
            desc = text[desc_at:eol]
        else:
            tail = text[colon + 1:eol].split(None, ncols)
            desc = tail[ncols] if len(tail) > ncols else b""
        name = text[line_pos:colon].strip().decode("ascii", "replace")
        out[name] = {"counts": counts, "desc": b" ".join(desc.split())[:DESC_LIMIT].decode("utf-8", "replace")}
    return {"cpus": cpus, "lines": out}


def _runs(columns: list[int]) -> list[tuple[int, int]]:
    """Sorted column indexes as runs of adjacent ones: ``[(first, count), ...]``."""
    runs: list[tuple[int, int]] = []
    for i in columns:
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def _sliced(text: bytes, colon: int, eol: int, runs: list) -> list | None:
    """The counts of the line at *colon* in the columns of *runs*, in order.

    [] if all are zero; None if the line is not laid out in columns of 11.
    """
    values: list = []
    nonzero = False
    for first, n in runs:
        a = colon + 1 + 11 * first          # the space before the run's first count
        b = a + 11 * n                      # just past its last count
        if b > eol or text[a] != SPACE or (b < eol and text[b] != SPACE):
            return None
        region = text[a:b]
        if not region.strip(b" 0"):
            values.extend([0] * n)          # only zeros
            continue
        numbers = region.split()
        if len(numbers) != n or not b"".join(numbers).isdigit():
            return None
        values.extend(map(int, numbers))
        nonzero = True
    return values if nonzero else []


def _split(rest: bytes, ncols: int) -> list | None:
    """Every column's count of a line's text after its colon, by splitting it."""
    head = rest.split(None, ncols)[:ncols]
    if len(head) < ncols or not b"".join(head).isdigit():
        return None
    return [int(h) for h in head]


def busy(text: str, groups: dict[str, list[int]]) -> dict:
    """From ``/proc/stat``: per group of CPUs the busy and the stolen time, in ticks.

    Busy is user + nice + system + irq + softirq (guest time is already in
    user and nice); steal is the time a hypervisor ran something else on the
    CPU. ``missing`` lists the group CPUs with no line (offline).
    """
    per_cpu = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            break              # the per-CPU lines come first; the long intr line is not parsed
        name, _, values = line.partition(" ")
        if not name[3:].isdigit():
            continue
        v = [int(x) for x in values.split()]
        per_cpu[int(name[3:])] = (sum(v[0:3]) + sum(v[5:7]), v[7] if len(v) > 7 else 0)
    if not per_cpu:
        raise ValueError("no per-CPU lines")
    out: dict = {"ticks_per_s": TICKS_PER_S}
    for group, cpus in groups.items():
        out[group] = {"busy": sum(per_cpu[c][0] for c in cpus if c in per_cpu),
                      "steal": sum(per_cpu[c][1] for c in cpus if c in per_cpu)}
        missing = [c for c in cpus if c not in per_cpu]
        if missing:
            out[group]["missing"] = missing
    return out


def throttle(src: sysread.Source, cpus: list[int]) -> dict:
    """The thermal throttle counters of *cpus*: ``{cpu: {file: int or None}}`` as a field.

    CPUs without a ``thermal_throttle`` directory (a VM, a CPU whose kernel
    driver has none) are left out; none at all gives null with the reason.
    """
    out: dict = {}
    absent = []
    for cpu in cpus:
        base = f"{CPU_DIR}/cpu{cpu}/thermal_throttle/"
        counters: dict = {}
        for name in THROTTLE_FILES:
            try:
                counters[name] = int(src.read(base + name))
            except FileNotFoundError:
                if name == THROTTLE_FILES[0] and not src.exists(base):
                    break      # no directory: the other files need not be tried
                counters[name] = None
            except (OSError, ValueError):
                counters[name] = None
        if counters:
            out[str(cpu)] = counters
        else:
            absent.append(cpu)
    if not out:
        return sysread.field(None, THROTTLE, "no thermal_throttle directory for CPUs " + cpu_list(cpus))
    if absent:
        out["absent"] = absent
    return sysread.field(out, THROTTLE)


def vmstat(text: str) -> dict:
    """``pswpin`` and ``pswpout`` from ``/proc/vmstat`` (pages swapped in and out since boot)."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in SWAP_KEYS:
            out[key] = int(value)
            if len(out) == len(SWAP_KEYS):
                break
    missing = [k for k in SWAP_KEYS if k not in out]
    if missing:
        raise ValueError("no " + ", ".join(missing))
    return out


def pressure(text: str) -> dict:
    """A PSI file's stall totals in microseconds: ``{"some": N, "full": N}``.

    ``full`` is absent from ``/proc/pressure/cpu`` before Linux 5.13.
    """
    out = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        for item in rest.split():
            if item.startswith("total="):
                out[kind] = int(item[6:])
    if "some" not in out:
        raise ValueError("no 'some' line")
    return out


def keyed(text: str) -> dict:
    """A flat-keyed cgroup file (``memory.events``, ``cpu.stat``) as ``{key: int}``."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    if not out:
        raise ValueError("no counters")
    return out


def cgroup_counters(src: sysread.Source, cgroup: str | None) -> dict:
    """The job cgroup's ``memory.events``, ``cpu.stat`` and ``{cpu,memory,io}.pressure``, each a field."""
    names = ["memory.events", "cpu.stat"] + [f"{p}.pressure" for p in PRESSURES]
    if cgroup is None:
        return {name: sysread.field(None, name, NO_CGROUP) for name in names}
    return {name: _read(src, f"{cgroup.rstrip('/')}/{name}", pressure if name.endswith(".pressure") else keyed)
            for name in names}


def cpufreq_fact(src: sysread.Source, cpus: list[int]) -> dict:
    """Whether every job CPU has a cpufreq policy, as a field (the kernel links ``cpuN/cpufreq`` to it)."""
    source = CPU_DIR + "/cpu*/cpufreq"
    without = [c for c in cpus if not src.exists(f"{CPU_DIR}/cpu{c}/cpufreq")]
    if without:
        # Some trees have the policy directories without the per-CPU links: ask the policies.
        governed: set[int] = set()
        for name in src.listdir(CPU_DIR + "/cpufreq"):
            if name.startswith("policy"):
                try:
                    governed.update(int(c) for c in src.read(f"{CPU_DIR}/cpufreq/{name}/affected_cpus").split())
                except (OSError, ValueError):
                    pass
        without = [c for c in without if c not in governed]
    return sysread.field(not without, source)


cpu_list = sysread.format_cpulist   # CPUs as the kernel lists them: 0-3,8


# --- the differences ---------------------------------------------------------------


def delta(start: dict, end: dict, own: dict | None = None) -> dict:
    """The differences between two snapshots of one job, and the job's own counts.

    *own* holds what the shepherd gets from wait4(2) when it reaps the job:
    ``nivcsw`` and ``nvcsw`` (the job processes' non-voluntary and voluntary
    context switches) and, for a job without a cgroup, ``usage_usec`` (its
    user + system CPU time), which otherwise comes from ``cpu.stat``.

    Every section is a field; one whose start or end could not be read is
    null with the reason. Only interrupt lines that moved are kept.
    """
    own = own or {}
    cpus = list(start.get("cpus") or [])
    wall = _sub(_value(end, "time", "monotonic"), _value(start, "time", "monotonic"))
    out: dict = {
        "cpus": cpus,
        "wall_s": sysread.field(round(wall, 6), CLOCK) if wall is not None
        else sysread.field(None, CLOCK, "no monotonic time in a snapshot"),
        "interrupts": _pair(start, end, ("interrupts",), lambda a, b: interrupt_delta(a, b, wall)),
        "throttle": _pair(start, end, ("throttle",), throttle_delta),
        "swap": _pair(start, end, ("vmstat",), _counter_delta),
        "pressure": {name: _pair(start, end, ("pressure", name), lambda a, b: _pressure_delta(a, b, wall))
                     for name in PRESSURES},
        "cgroup": {name: _pair(start, end, ("cgroup", name),
                               (lambda a, b: _pressure_delta(a, b, wall)) if name.endswith(".pressure")
                               else _counter_delta)
                   for name in (start.get("cgroup") or {})},
        "context_switches": _switches(own, cpus, wall),
        "facts": {name: _fact(start, end, name) for name in ("cpufreq", "throttle_counters")},
    }
    out["others_cpu"] = _others(start, end, out["cgroup"].get("cpu.stat"), own, wall)
    return out


def _value(snap: dict, *keys):
    node: object = snap
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node.get("value") if isinstance(node, dict) else None


def _sub(a, b):
    return a - b if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None


def _pair(start: dict, end: dict, keys: tuple, diff) -> dict:
    """A field of the difference *diff* makes of the two snapshots' fields at *keys*."""
    a: object = start
    b: object = end
    for key in keys:
        a = a.get(key) if isinstance(a, dict) else None
        b = b.get(key) if isinstance(b, dict) else None
    source = next((f["source"] for f in (a, b) if isinstance(f, dict) and "source" in f), "/".join(keys))
    for when, f in (("start", a), ("end", b)):
        if not isinstance(f, dict) or f.get("value") is None:
            why = f.get("error", "no value") if isinstance(f, dict) else "not in the snapshot"
            return sysread.field(None, source, f"{when}: {why}")
    try:
        return sysread.field(diff(a["value"], b["value"]), source)  # type: ignore[index]
    except Exception as exc:  # snapshots of another shape (an older shepherd): a reason, not a crash
        return sysread.field(None, source, sysread.error_text(exc))


def interrupt_delta(a: dict, b: dict, wall: float | None) -> dict:
    """The interrupt lines that moved on the job's CPUs: ``{name: {"counts", "total", "desc"[, "per_s"]}}``."""
    zero = [0] * len(b["cpus"])
    out = {}
    for name, line in b["lines"].items():
        before = a["lines"].get(name, {}).get("counts", zero)
        counts = [x - y if x is not None and y is not None else None for x, y in zip(line["counts"], before)]
        total = sum(c for c in counts if c)
        if total:
            moved = {"counts": counts, "total": total, "desc": line["desc"]}
            if wall:
                moved["per_s"] = round(total / wall, 3)
            out[name] = moved
    return out


def throttle_delta(a: dict, b: dict) -> dict:
    """Per throttle counter, its rise on each job CPU: ``{file: {cpu: n}}`` (CPUs seen at both ends)."""
    out: dict = {name: {} for name in THROTTLE_FILES}
    for cpu, counters in b.items():
        if cpu == "absent" or cpu not in a:
            continue
        for name in THROTTLE_FILES:
            rise = _sub(counters.get(name), a[cpu].get(name))
            if rise is not None:
                out[name][cpu] = rise
    return out


def _counter_delta(a: dict, b: dict) -> dict:
    return {key: b[key] - a[key] for key in b if key in a}


def _pressure_delta(a: dict, b: dict, wall: float | None) -> dict:
    """Stall time in microseconds and as a fraction of the wall time."""
    out: dict = {}
    for kind in b:
        if kind in a:
            usec = b[kind] - a[kind]
            out[kind + "_usec"] = usec
            if wall:
                out[kind + "_fraction"] = round(usec / 1e6 / wall, 6)
    return out


def _switches(own: dict, cpus: list[int], wall: float | None) -> dict:
    if "nivcsw" not in own:
        return sysread.field(None, RUSAGE, "not given")
    out = {"nivcsw": own["nivcsw"], "nvcsw": own.get("nvcsw")}
    if wall and cpus:
        out["nivcsw_per_cpu_s"] = round(own["nivcsw"] / wall / len(cpus), 3)
    return sysread.field(out, RUSAGE)


def _fact(start: dict, end: dict, name: str) -> dict:
    """A fact holds for the run when it held at both ends."""
    f = (start.get("facts") or {}).get(name) or {}
    g = (end.get("facts") or {}).get(name) or {}
    values = (f.get("value"), g.get("value"))
    if None in values:
        return sysread.field(None, f.get("source", name), "not in both snapshots")
    return sysread.field(all(values), f.get("source", name))


def _others(start: dict, end: dict, cpu_stat: dict | None, own: dict, wall: float | None) -> dict:
    """CPU time used by others on the job's CPUs, its L3, its node and the CPUs it holds idle: busy + steal
    there minus the job's usage.

    /proc/stat counts in ticks, so each group's figure is uncertain by about
    two ticks per CPU (``resolution_s``); the job's usage comes from its
    cgroup's ``cpu.stat`` (exact) or, without a cgroup, from its rusage.
    """
    source = STAT + " - cpu.stat usage_usec"
    a, b = _value(start, "cpu_busy"), _value(end, "cpu_busy")
    if a is None or b is None:
        return sysread.field(None, source, "no /proc/stat in a snapshot")
    usage = None
    if cpu_stat is not None and isinstance(cpu_stat.get("value"), dict):
        usage = cpu_stat["value"].get("usage_usec")
    if usage is None and "usage_usec" in own:
        usage, source = own["usage_usec"], STAT + " - " + RUSAGE
    if usage is None:
        return sysread.field(None, source, NO_USAGE)
    tick = 1.0 / b.get("ticks_per_s", TICKS_PER_S)
    job = set(start.get("cpus") or [])
    out = {}
    for group, key in (("job", "cpus"), ("l3", "l3_cpus"), ("node", "node_cpus"), ("held", "held_cpus")):
        members = start.get(key) or []
        if group not in a or group not in b or not members:
            continue
        spent = (b[group]["busy"] - a[group]["busy"] + b[group]["steal"] - a[group]["steal"]) * tick
        # The job's time is all on its own CPUs: it is subtracted from a group that holds them.
        mine = usage / 1e6 if job & set(members) else 0.0
        figures = {"cpus": len(members), "busy_s": round(spent, 3), "others_s": round(max(spent - mine, 0.0), 3),
                   "resolution_s": round(2 * tick * len(members), 3)}
        if wall:
            figures["others_fraction"] = round(figures["others_s"] / (wall * len(members)), 6)
        out[group] = figures
    return sysread.field(out, source)

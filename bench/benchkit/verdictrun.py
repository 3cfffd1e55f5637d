"""Runs for ``bench/verdict``: fixed workloads as hpc-batch jobs, interference injected on purpose, their records.

Shared by ``bench/verdict`` (a scratch daemon of its own) and
``tests/bench-mode/check-real-host --calibrate`` (the installed daemon), so
it uses the standard library and the ``dispatch`` client only. One run:

1. ``dispatch new --json --cpu 1 ... -- python3 -c WORKLOAD``: the job sets
   itself up (the memory workload builds its array) and then blocks on a
   FIFO;
2. once ``dispatch show --json`` says it runs, the interference of the run's
   kind starts, pinned by its CPUs (``os.sched_setaffinity``) relative to
   the job's: a busy loop on the job's CPU, a memory hog on another CPU of
   its L3, O_DIRECT reads issued from the CPU whose disk interrupts land on
   the job's, a busy loop on its SMT sibling, a process swapping inside a
   cgroup of its own; after a settling pause the FIFO releases the job;
3. the job times its work alone (``time.perf_counter`` around it, printed
   as JSON to its output), more precise than the record's ``wall_s``, which
   also holds the interpreter's start, the set-up and the wait;
4. after ``dispatch wait`` the interference stops and the record is read
   (``dispatch show --record --json``): the verdict, its causes and reasons,
   the sentinels' delta.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

# The workload, run as the job: argv = workload steps fifo mib. Prints {"work_s": s} once done.
# memory: a pointer chase over an array of int64 larger than the L3. a[i] = (13 i + c) mod n with n a
# power of two and c odd is a full-period LCG (13 = 1 mod 4), so following a[i] from 0 visits every
# slot in an order no prefetcher guesses; the array is built from 14 arithmetic runs, in C.
# cpu: an integer LCG, nothing but the interpreter and the registers.
WORKLOAD = r"""
import array, json, sys, time
workload, steps, fifo, mib = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
if workload == "memory":
    n = 1
    while n * 2 <= mib * (1 << 20) // 8:
        n *= 2
    A, C = 13, n // 2 + 1
    a = array.array("q")
    for k in range(A + 1):
        lo = max(0, -((C - k * n) // A))
        hi = min(n, -((C - (k + 1) * n) // A))
        if lo < hi:
            a.extend(range(A * lo + C - k * n, A * hi + C - k * n, A))
    def work():
        i = 0
        for _ in range(steps):
            i = a[i]
        return i
else:
    def work():
        x = 0
        for _ in range(steps):
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        return x
if fifo != "-":
    with open(fifo, "rb") as f:
        f.read(1)
t0 = time.perf_counter()
work()
t1 = time.perf_counter()
print(json.dumps({"work_s": t1 - t0}), flush=True)
"""

WORKLOADS = ("cpu", "memory")
SPIN = "while True: pass"
# A memory-bandwidth hog: copies one buffer of MIB MiB (filled, so its pages are real) into another, forever.
STREAM = r"""
import sys
n = int(sys.argv[1]) << 20
src = bytearray(b"\x5a") * n
dst = bytearray(n)
while True:
    dst[:] = src
"""
# A swapper: writes every page of MIB MiB, forever; run in a cgroup whose memory.max is far below that.
SWAPPER = r"""
import sys
n = int(sys.argv[1]) << 20
buf = bytearray(n)
while True:
    for i in range(0, n, 4096):
        buf[i] = (buf[i] + 1) & 255
"""
SETTLE_S = 0.3          # interference runs this long before the job is released
PROBE_S = 0.5           # O_DIRECT reads per CPU probed for where the disk's interrupts land
LANDED = 100            # device interrupts a CPU must take in a probe to count as where the disk lands
SYS = "/sys"


class RunError(RuntimeError):
    """A run could not be made or read; the text says why."""


class NotPlaceable(RunError):
    """This machine cannot produce a kind of interference around the job's CPUs; the text says why."""


# --- the machine ------------------------------------------------------------------------------------------


def parse_cpulist(text: str) -> list[int]:
    """``0-3,8`` as [0, 1, 2, 3, 8]."""
    out: list[int] = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def l3_peers(cpu: int, sysfs: str = SYS) -> list[int]:
    """The CPUs sharing *cpu*'s last-level cache (index3, else the highest index), itself included."""
    base = f"{sysfs}/devices/system/cpu/cpu{cpu}/cache"
    try:
        indexes = sorted((n for n in os.listdir(base) if n.startswith("index")), key=lambda n: int(n[5:]))
    except OSError:
        return [cpu]
    for name in ["index3"] + indexes[::-1]:
        text = _read(f"{base}/{name}/shared_cpu_list")
        if text:
            return parse_cpulist(text)
    return [cpu]


def l3_mib(cpu: int, sysfs: str = SYS) -> int:
    """The size of *cpu*'s L3 in MiB (0 when unknown)."""
    text = (_read(f"{sysfs}/devices/system/cpu/cpu{cpu}/cache/index3/size") or "").strip()
    if text.endswith("K") and text[:-1].isdigit():
        return int(text[:-1]) >> 10
    if text.endswith("M") and text[:-1].isdigit():
        return int(text[:-1])
    return 0


def smt_siblings(cpu: int, sysfs: str = SYS) -> list[int]:
    """The other hardware threads of *cpu*'s core."""
    text = _read(f"{sysfs}/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    return [c for c in parse_cpulist(text) if c != cpu] if text else []


def smt_control(sysfs: str = SYS) -> str:
    return (_read(f"{sysfs}/devices/system/cpu/smt/control") or "unknown").strip()


def throttle_counters(cpu: int, sysfs: str = SYS) -> bool:
    return os.path.isdir(f"{sysfs}/devices/system/cpu/cpu{cpu}/thermal_throttle")


def swap_areas() -> int:
    """How many swap areas /proc/swaps lists."""
    return max(0, len((_read("/proc/swaps") or "").strip().splitlines()) - 1)


def device_irqs() -> dict[str, dict[str, Any]]:
    """The numbered lines of /proc/interrupts: ``{irq: {"counts": {cpu: n}, "desc": str}}``."""
    text = _read("/proc/interrupts") or ""
    lines = text.splitlines()
    if not lines:
        return {}
    cols = [int(w[3:]) for w in lines[0].split() if w.startswith("CPU") and w[3:].isdigit()]
    out = {}
    for line in lines[1:]:
        head, _, rest = line.partition(":")
        if not head.strip().isdigit():
            continue
        words = rest.split()
        counts = {cpu: int(words[i]) for i, cpu in enumerate(cols) if i < len(words) and words[i].isdigit()}
        out[head.strip()] = {"counts": counts, "desc": " ".join(words[len(cols):])}
    return out


def busy_fraction(seconds: float = 0.3) -> float:
    """The share of every CPU's time that was busy over the next *seconds* (from /proc/stat's cpu line)."""
    def sample() -> tuple[int, int]:
        v = [int(x) for x in (_read("/proc/stat") or "cpu 0 0 0 0").splitlines()[0].split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        return sum(v[:8]) - idle, sum(v[:8])
    b0, t0 = sample()
    time.sleep(seconds)
    b1, t1 = sample()
    return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


# --- interference ---------------------------------------------------------------------------------------


class Process:
    """One interfering process, pinned to *cpus*, in a session of its own; stopped with its children."""

    def __init__(self, argv: list[str], cpus: list[int], cgroup: str | None = None):
        def setup() -> None:
            os.sched_setaffinity(0, cpus)
            if cgroup is not None:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
        self.argv = argv
        self.cpus = cpus
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=setup)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


class IrqPlacer:
    """Where a disk's interrupts land: O_DIRECT reads of a scratch file issued from one CPU at a time.

    A CPU's reads complete through an interrupt the kernel delivers to its
    queue's CPU (``/proc/irq/N/effective_affinity_list``); for a single-queue
    disk (a VM's virtio disk) that is one CPU whichever CPU reads, for NVMe
    with a queue per CPU it is the reading CPU itself. Each CPU is probed at
    most once, and only until one is found whose interrupts land on the
    job's CPU while it is not that CPU.
    """

    def __init__(self, path: str, cpus: list[int]):
        self.path = path
        self.cpus = cpus
        self.landing: dict[int, dict[str, Any]] = {}   # issuing CPU -> {"cpu", "irqs", "rate", "effective"}

    def reader(self) -> list[str]:
        return ["sh", "-c", f"while :; do dd if={shlex.quote(self.path)} of=/dev/null bs=4k iflag=direct "
                "status=none; done"]

    def probe(self, cpu: int) -> dict[str, Any]:
        if cpu not in self.landing:
            before = device_irqs()
            p = Process(self.reader(), [cpu])
            try:
                time.sleep(PROBE_S)
            finally:
                p.stop()
            after = device_irqs()
            per_cpu: dict[int, int] = {}
            lines: dict[int, dict[str, int]] = {}
            for irq, line in after.items():
                was = before.get(irq, {}).get("counts", {})
                for c, n in line["counts"].items():
                    rise = n - was.get(c, 0)
                    if rise > 0:
                        per_cpu[c] = per_cpu.get(c, 0) + rise
                        lines.setdefault(c, {})[f"{irq} {line['desc'].split()[-1] if line['desc'] else ''}"] = rise
            where = max(per_cpu, key=lambda c: per_cpu[c], default=None)
            got = per_cpu.get(where, 0) if where is not None else 0
            names = sorted(lines.get(where, {}), key=lambda k: -lines[where][k])[:3] if where is not None else []
            effective = {}
            for name in names:
                irq = name.split()[0]
                effective[irq] = (_read(f"/proc/irq/{irq}/effective_affinity_list") or "?").strip()
            self.landing[cpu] = {"cpu": where if got >= LANDED else None, "irqs": names,
                                 "rate": got / PROBE_S, "effective": effective}
        return self.landing[cpu]

    def issuer_for(self, targets: list[int], avoid: list[int]) -> tuple[int, dict[str, Any]] | None:
        """A CPU outside *avoid* whose reads' interrupts land on one of *targets*; None if there is none."""
        for cpu in self.cpus:
            if cpu in avoid:
                continue
            landing = self.probe(cpu)
            if landing["cpu"] in targets:
                return cpu, landing
        return None

    def why_not(self, targets: list[int]) -> str:
        seen = "; ".join(f"from CPU {c}: {v['cpu'] if v['cpu'] is not None else 'none counted'} "
                         f"({', '.join(v['irqs']) or 'no device IRQ'})" for c, v in sorted(self.landing.items()))
        return (f"the disk's interrupts cannot be put on CPU {','.join(map(str, targets))} from another CPU "
                f"(where reads issued from each CPU landed: {seen or 'no CPU to issue them from'})")


def scratch_file(directory: str, mib: int = 256) -> tuple[str | None, str]:
    """A file for O_DIRECT reads in *directory*: (path, "") or (None, why not)."""
    path = os.path.join(directory, "irq-source.dat")
    made = subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "conv=fsync",
                           "status=none"], capture_output=True, text=True)
    if made.returncode != 0:
        return None, f"cannot write {path}: {made.stderr.strip()}"
    ok = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=4k", "count=16", "iflag=direct", "status=none"],
                        capture_output=True, text=True)
    if ok.returncode != 0:
        return None, f"O_DIRECT reads fail in {directory} ({ok.stderr.strip()}): it is no disk (tmpfs?)"
    return path, ""


class Swapper:
    """A process writing more memory than its own cgroup's memory.max allows, so that it swaps."""

    def __init__(self, python: str, cpus: list[int], mib: int = 256, limit_mib: int = 64):
        self.cgroup = f"/sys/fs/cgroup/hpcb-verdict-swap-{os.getpid()}"
        os.mkdir(self.cgroup)
        try:
            with open(os.path.join(self.cgroup, "memory.max"), "w") as f:
                f.write(f"{limit_mib << 20}\n")
            self.proc: Process | None = Process([python, "-c", SWAPPER, str(mib)], cpus, self.cgroup)
        except OSError:
            os.rmdir(self.cgroup)
            raise

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
        for _ in range(50):
            try:
                os.rmdir(self.cgroup)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)   # the killed task leaves its cgroup a moment later


def swap_why_not() -> str | None:
    """Why this machine cannot be made to swap on purpose, or None."""
    if os.geteuid() != 0:
        return "making a process swap in a cgroup of its own needs root"
    if swap_areas() == 0:
        return "no swap space (/proc/swaps lists none)"
    controllers = (_read("/sys/fs/cgroup/cgroup.subtree_control") or "").split()
    if "memory" not in controllers:
        return "no cgroup v2 memory controller at /sys/fs/cgroup to confine the swapping process"
    return None


def throttle_why_not(cpu: int, sysfs: str = SYS) -> str:
    why = "thermal throttling cannot be injected on purpose (it would take heating the package)"
    if not throttle_counters(cpu, sysfs):
        why += f"; CPU {cpu} has no thermal throttle counters either (a VM), so none can be seen"
    return why


class Injector:
    """Starts the interference of a kind around a job's CPUs; says why when it cannot be placed."""

    def __init__(self, python: str, placer: IrqPlacer | None, irq_why: str, allowed: list[int],
                 sysfs: str = SYS):
        self.python = python
        self.placer = placer
        self.irq_why = irq_why
        self.allowed = allowed       # CPUs this process may pin interference to
        self.sysfs = sysfs

    def other_l3_cpu(self, cpus: list[int], held: list[int]) -> int | None:
        """A CPU sharing the job's L3, neither the job's nor held by it; one of another core if there is one."""
        peers = [c for c in l3_peers(cpus[0], self.sysfs) if c in self.allowed and c not in cpus and c not in held]
        siblings = set(smt_siblings(cpus[0], self.sysfs))
        other_core = [c for c in peers if c not in siblings]
        candidates = other_core or peers
        return candidates[0] if candidates else None

    def plan(self, kind: str, cpus: list[int], held: list[int]) -> tuple[Callable[[], list[Any]], dict[str, Any]]:
        """How to start the interference of *kind* around a job on *cpus* holding *held*, and where it goes;
        NotPlaceable when this machine cannot produce it there."""
        py = self.python
        if kind == "quiet":
            return list, {}
        if kind == "busy":
            return (lambda: [Process([py, "-c", SPIN], [c]) for c in cpus]), {"on": cpus}
        if kind == "membw":
            other = self.other_l3_cpu(cpus, held)
            if other is None:
                raise NotPlaceable(f"no CPU shares CPU {cpus[0]}'s L3 outside the job's CPUs")
            return (lambda: [Process([py, "-c", STREAM, "256"], [other])]), {"on": [other]}
        if kind == "sibling":
            all_siblings = smt_siblings(cpus[0], self.sysfs)
            siblings = [c for c in all_siblings if c not in cpus and c in self.allowed]
            if not siblings:
                hint = (": the job's cpuset has its whole core (--cpu-unit core); a benchmark job's sibling is "
                        "held idle outside it, so run with --job-option=--benchmark"
                        if len(all_siblings) > 1 else "")
                raise NotPlaceable(f"no SMT sibling of CPU {cpus[0]} outside the job's CPUs "
                                   f"(SMT: {smt_control(self.sysfs)}){hint}")
            return ((lambda: [Process([py, "-c", SPIN], [s]) for s in siblings]),
                    {"on": siblings, "held": all(s in held for s in siblings)})
        if kind == "irq":
            if self.placer is None:
                raise NotPlaceable(self.irq_why)
            placer = self.placer
            found = placer.issuer_for(cpus, cpus + held)
            if found is None:
                raise NotPlaceable(placer.why_not(cpus))
            issuer, landing = found
            return ((lambda: [Process(placer.reader(), [issuer])]),
                    {"on": [issuer], "lands_on": landing["cpu"], "irqs": landing["irqs"],
                     "effective_affinity": landing["effective"], "probe_rate": landing["rate"]})
        if kind == "swap":
            why = swap_why_not()
            if why:
                raise NotPlaceable(why)
            other = self.other_l3_cpu(cpus, held)
            spare = [c for c in self.allowed if c not in cpus and c not in held]
            where = [other] if other is not None else spare[:1]
            if not where:
                raise NotPlaceable("no CPU outside the job's to run the swapping process on")
            return (lambda: [Swapper(py, where)]), {"on": where}
        if kind == "throttle":
            raise NotPlaceable(throttle_why_not(cpus[0], self.sysfs))
        raise NotPlaceable(f"unknown kind {kind!r}")

    def why_not(self, kind: str, cpus: list[int], held: list[int]) -> str | None:
        """Why *kind* cannot be produced around a job on *cpus*, or None."""
        try:
            self.plan(kind, cpus, held)
        except NotPlaceable as exc:
            return str(exc)
        return None

    def start(self, kind: str, cpus: list[int], held: list[int]) -> tuple[list[Any], dict[str, Any]]:
        """The started processes and where they are; NotPlaceable when the kind cannot be placed here."""
        begin, placed = self.plan(kind, cpus, held)
        return begin(), placed


# --- the client ---------------------------------------------------------------------------------------------


class Client:
    """hpc-batch through the real ``dispatch``: *dispatch*(\\*words, check=True) returns its stdout and
    raises RunError when it fails (unless *check* is false)."""

    def __init__(self, dispatch: Callable[..., str]):
        self.dispatch = dispatch

    def show(self, job: int) -> dict[str, Any]:
        shown: dict[str, Any] = json.loads(self.dispatch("show", "--json", str(job)))
        return shown

    def running(self, job: int, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            shown = self.show(job)
            if shown.get("state") == "running":
                return shown
            if shown.get("state") not in ("queued", "waiting"):
                raise RunError(f"job {job} ended before it was released: {shown.get('state')} "
                               f"({shown.get('exit')}, {shown.get('note')})")
            if time.monotonic() > deadline:
                raise RunError(f"job {job} did not start within {timeout:.0f} s")
            time.sleep(0.02)

    def record(self, job: int, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                rec: dict[str, Any] = json.loads(self.dispatch("show", "--record", "--json", str(job)))
                if rec.get("complete"):
                    return rec
            except RunError:
                pass
            if time.monotonic() > deadline:
                raise RunError(f"job {job}'s record was not complete within {timeout:.0f} s")
            time.sleep(0.1)


def release(fifo: str, alive: Callable[[], bool], timeout: float = 120.0) -> None:
    """Open *fifo* for writing once the job reads it (it has set itself up) and write one byte.

    The job's record is running meanwhile: *alive* (a ``dispatch show``, a
    whole process on the job's L3) is asked once a second, not at each try.
    """
    deadline = time.monotonic() + timeout
    asked = time.monotonic()
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:      # no reader yet
                raise
        now = time.monotonic()
        if now > deadline or (now - asked > 1.0 and not alive()):
            raise RunError("the job never opened its FIFO (did it fail to start?)")
        if now - asked > 1.0:
            asked = now
        time.sleep(0.01)
    try:
        os.write(fd, b"g")
    finally:
        os.close(fd)


def job_argv(python: str, workload: str, steps: int, fifo: str, mib: int) -> list[str]:
    return [python, "-c", WORKLOAD, workload, str(steps), fifo, str(mib)]


def work_seconds(text: str) -> float:
    """The job's own timing of its work, from the last line of its output."""
    for line in reversed(text.strip().splitlines()):
        try:
            return float(json.loads(line)["work_s"])
        except (ValueError, KeyError, TypeError):
            continue
    raise RunError(f"the job printed no timing; its output ends: {text.strip().splitlines()[-3:]}")


def size(python: str, workload: str, cpu: int, seconds: float, mib: int) -> int:
    """Steps of *workload* that take about *seconds* on *cpu* with nothing else there (timed directly)."""
    steps = 200_000
    for _ in range(3):
        out = subprocess.run(job_argv(python, workload, steps, "-", mib), capture_output=True, text=True,
                             preexec_fn=lambda: os.sched_setaffinity(0, [cpu]), check=True).stdout
        took = work_seconds(out)
        steps = max(1000, int(steps * seconds / max(took, 1e-3)))
        if abs(took - seconds) < 0.2 * seconds:
            break
    return steps


def _value(f: Any) -> Any:
    return f.get("value") if isinstance(f, dict) and "source" in f else f


def figures(delta: dict[str, Any], rate_span: float = 1.0) -> dict[str, float | None]:
    """The sentinel figures the verdict weighs, from a record's delta (None where it has none)."""
    cpus = delta.get("cpus") or [0]
    wall = _value(delta.get("wall_s")) or 0.0
    span = max(wall, rate_span) * len(cpus)
    lines = _value(delta.get("interrupts")) or {}
    device = sum(v.get("total", 0) for k, v in lines.items()
                 if k.isdigit() and "arch_timer" not in v.get("desc", ""))   # arm64's timer is a numbered line
    ipis = sum(v.get("total", 0) for k, v in lines.items() if k in ("RES", "CAL", "TLB", "IWI") or k.startswith("IPI"))
    cs = _value(delta.get("context_switches")) or {}
    others = _value(delta.get("others_cpu")) or {}
    swap = _value(delta.get("swap")) or {}

    def frac(group: str) -> float | None:
        g = others.get(group) or {}
        return g.get("others_fraction")
    return {
        "device_irqs": device,
        "device_irqs_per_cpu_s": device / span,
        "ipis_per_cpu_s": ipis / span,
        "nivcsw_per_cpu_s": cs["nivcsw"] / span if "nivcsw" in cs else None,
        "others_cpu_fraction": frac("job"),
        "others_l3_fraction": frac("l3"),
        "others_node_fraction": frac("node"),
        "others_held_fraction": frac("held"),
        "swap_pages": swap.get("pswpin", 0) + swap.get("pswpout", 0) if swap else None,
        "wall_s": wall,
    }


class Runner:
    """Makes runs: one job of a workload with one kind of interference, and its record."""

    def __init__(self, client: Client, injector: Injector, python: str, work: str, options: tuple[str, ...],
                 steps: dict[str, int], mib: int, say: Callable[[str], None]):
        self.client = client
        self.injector = injector
        self.python = python
        self.work = work
        self.options = options
        self.steps = steps
        self.mib = mib
        self.say = say
        self.count = 0

    def run(self, workload: str, kind: str, round_: int) -> dict[str, Any]:
        self.count += 1
        tag = f"{workload}-{kind}-{round_}-{self.count}"
        fifo, log = os.path.join(self.work, f"{tag}.fifo"), os.path.join(self.work, f"{tag}.log")
        os.mkfifo(fifo, 0o600)
        load = os.getloadavg()[0]
        host_busy = busy_fraction()
        out = self.client.dispatch("new", "--json", "--cpu", "1", *self.options, "--output", log, "--",
                                   *job_argv(self.python, workload, self.steps[workload], fifo, self.mib))
        job = int(json.loads(out)["id"])
        procs: list[Any] = []
        try:
            shown = self.client.running(job)
            cpus, held = list(shown.get("cpus") or []), list(shown.get("held_cpus") or shown.get("cpus") or [])
            try:
                procs, placed = self.injector.start(kind, cpus, held)
            except RunError:
                self.client.dispatch("kill", str(job), check=False)
                self.client.dispatch("wait", str(job), check=False)
                raise
            time.sleep(SETTLE_S if procs else 0)
            if any(not p.alive() for p in procs):
                raise RunError(f"the {kind} interference died before the job was released")
            release(fifo, lambda: self.client.show(job).get("state") == "running")
            self.client.dispatch("wait", str(job), check=False)   # its exit status is the job's: read below
            alive = all(p.alive() for p in procs)
        finally:
            for p in procs:
                p.stop()
            os.unlink(fifo)
        if not alive:
            raise RunError(f"the {kind} interference died while job {job} ran")
        shown = self.client.show(job)
        if shown.get("exit") != "0":
            raise RunError(f"job {job} ended {shown.get('state')} ({shown.get('exit')}, {shown.get('note')})")
        with open(log) as f:
            took = work_seconds(f.read())
        os.unlink(log)
        rec = self.client.record(job)
        judged = rec.get("verdict") or {}
        delta = (rec.get("sentinels") or {}).get("delta") or {}
        return {"workload": workload, "kind": kind, "round": round_, "job": job, "cpus": cpus, "held": held,
                "placed": placed, "time_s": took, "verdict": judged.get("verdict"),
                "causes": judged.get("causes"), "reasons": judged.get("reasons"), "notes": judged.get("notes"),
                "figures": figures(delta), "delta": delta, "load1": load, "host_busy": host_busy}


def calibrate(runner: Runner, workloads: list[str], kinds: list[str], rounds: int,
              not_measured: dict[str, str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every run, interleaved; a kind that proves unplaceable goes to *not_measured* and is not run again.

    Returns the runs and the failures (a run that failed for another reason
    is said and skipped; more than a few in all stop the calibration).
    """
    runs: list[dict[str, Any]] = []
    failures: list[str] = []
    plan = interleaved(workloads, [k for k in kinds if k not in not_measured], rounds)
    for i, (workload, kind, round_) in enumerate(plan, 1):
        if kind in not_measured:
            continue
        try:
            r = runner.run(workload, kind, round_)
        except NotPlaceable as exc:
            not_measured[kind] = str(exc)
            runner.say(f"{kind}: not measured: {exc}")
            continue
        except (RunError, OSError, ValueError) as exc:
            failures.append(f"{workload} {kind} round {round_}: {exc}")
            runner.say(f"run {i}/{len(plan)} failed: {exc}")
            if len(failures) > max(3, len(plan) // 10):
                raise RunError(f"{len(failures)} runs failed; the last: {exc}") from exc
            continue
        runs.append(r)
        runner.say(f"run {i}/{len(plan)}: {workload} {kind}: {r['time_s']:.3f} s, {r['verdict']} "
                   f"({', '.join(r['causes'] or []) or '-'})")
    return runs, failures


def rejudge(runs: list[dict[str, Any]], thresholds: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs with their verdict, causes and reasons judged again from their deltas with *thresholds*
    (``shepherd.record.verdict`` as this python finds it: the checkout's or the venv's)."""
    from shepherd.record import verdict
    out = []
    for r in runs:
        v = verdict.judge(r["delta"], thresholds)
        out.append({**r, "verdict": v["verdict"], "causes": v["causes"], "reasons": v["reasons"],
                    "notes": v["notes"], "recorded_verdict": r.get("recorded_verdict", r.get("verdict"))})
    return out


def parse_thresholds(text: str) -> dict[str, float | None]:
    """``NAME=VALUE,...`` (``none``: reported, not judged), checked by the verdict's own check."""
    from shepherd.record import verdict
    out: dict[str, float | None] = {}
    for word in (w.strip() for w in text.split(",") if w.strip()):
        name, eq, value = word.partition("=")
        if not eq:
            raise ValueError(f"{word!r}: expected NAME=VALUE")
        out[name] = None if value == "none" else float(value)
    verdict.check_thresholds(out)
    return out


def notes_seen(runs: list[dict[str, Any]]) -> list[str]:
    """The verdict's notes (sentinels not judged) as they read in the runs' records, each once."""
    return list(dict.fromkeys(n for r in runs for n in (r.get("notes") or [])))


def keep_off(cpus: list[int]) -> list[int]:
    """Pin this process (and so every dispatch it runs) off the job's *cpus* where it can; the CPUs it keeps."""
    mine = sorted(set(os.sched_getaffinity(0)) - set(cpus))
    if mine:
        os.sched_setaffinity(0, mine)
    return mine


def interleaved(workloads: list[str], kinds: list[str], runs: int) -> list[tuple[str, str, int]]:
    """The order of the runs: round by round, every kind and workload in each, so drift hits all alike."""
    return [(w, k, i) for i in range(runs) for k in kinds for w in workloads]


def summary_line(runs: list[dict[str, Any]]) -> str:
    """The load the runs saw: 1-minute load average and the machine's busy share just before each."""
    if not runs:
        return "no runs"
    loads = [r["load1"] for r in runs]
    busy = [r["host_busy"] for r in runs]
    return (f"1-minute load average before each run: median {statistics.median(loads):.2f} "
            f"[{min(loads):.2f}-{max(loads):.2f}]; the machine's CPUs busy in the 0.3 s before each: median "
            f"{statistics.median(busy) * 100:.0f}% [{min(busy) * 100:.0f}-{max(busy) * 100:.0f}%]")


def eprint(message: str) -> None:
    print(message, file=sys.stderr, flush=True)

"""Helpers for system tests that drive hpc-batch in the guest as real users."""

import os
import re
import shlex
import threading
import time

GUEST_BIN = "/opt/bin"
DROPIN_DIR = "/etc/systemd/system/hpc-batch.service.d"
UNIT_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "dist", "systemd", "hpc-batch.service")


def wait_for(check, timeout, interval=1.0, what="condition"):
    """Poll *check* until it returns a truthy value; fail with *what* after *timeout*."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def holds(check, duration, interval=0.5, what="condition"):
    """Poll *check* until *duration* has passed; fail with *what* as soon as it returns a falsy value."""
    deadline = time.monotonic() + duration
    while True:
        value = check()
        assert value, f"{what} stopped holding"
        if time.monotonic() > deadline:
            return value
        time.sleep(interval)


def restart_sec(unit_file=UNIT_FILE) -> float:
    """The unit's ``RestartSec=`` in seconds, read from the unit the guests install (its one definition)."""
    with open(unit_file) as f:
        values = [line.split("=", 1)[1].strip() for line in f if line.startswith("RestartSec=")]
    assert len(values) == 1 and values[0].isdigit(), f"{unit_file}: want one RestartSec=N (seconds), got {values}"
    return float(values[0])


def dispatch(guest, user, *args, timeout=120, cwd="~"):
    """Run dispatch in the guest as *user* from *cwd* (a Result)."""
    cmd = f"cd {cwd} && {GUEST_BIN}/dispatch " + " ".join(shlex.quote(a) for a in args)
    return guest.run(cmd, user=user, timeout=timeout)


def submit(guest, user, *cmd, flags=(), cwd="~") -> int:
    """Submit a job as *user*; returns its id."""
    r = dispatch(guest, user, "new", *flags, "--", *cmd, cwd=cwd)
    assert r.ok, r.describe() + "\n" + guest.unit_report("hpc-batch")
    m = re.match(r"job (\d+) ", r.out)
    assert m, r.describe()
    return int(m.group(1))


def rows(guest, user, *flags) -> dict:
    """``dispatch list`` rows keyed by job id."""
    r = dispatch(guest, user, "list", *flags)
    assert r.ok, r.describe()
    out = {}
    for line in r.out.splitlines():
        words = line.split()
        if len(words) > 1 and words[1].isdigit():
            out[int(words[1])] = line
    return out


def state(guest, user, job) -> str:
    row = rows(guest, user, "--finished").get(job, "")
    return "finished" if " finished " in row else "queued" if " queued " in row else "running"


def wait_finished(guest, user, job, timeout=240) -> str:
    """The job's finished row, once it is."""
    def done():
        row = rows(guest, user, "--finished").get(job)
        return row if row and " finished " in row else None
    return wait_for(done, timeout, what=f"job {job} to finish")


def wait_running(guest, user, job, timeout=240) -> None:
    wait_for(lambda: state(guest, user, job) == "running" and
             guest.run(f"test -e /var/lib/hpc-batch/jobs/{job}/status.json", timeout=30).ok,
             timeout, what=f"job {job} to run")


def exit_of(row: str) -> str:
    words = row.split()
    return words[words.index("finished") + 1]


def home(guest, user) -> str:
    return guest.run(f"getent passwd {user} | cut -d: -f6", timeout=30, check=True).out.strip()


def read(guest, path, user=None) -> str:
    r = guest.run(["cat", path], user=user, timeout=60)
    assert r.ok, r.describe()
    return r.out


def main_pid(guest) -> int:
    return int(guest.run("systemctl show -p MainPID --value hpc-batch", timeout=30, check=True).out.strip())


def ready_count(guest) -> int:
    r = guest.run("journalctl -u hpc-batch -o cat --no-pager | grep -c 'ready on' || true", timeout=60)
    return int(r.out.strip() or 0)


def set_flags(guest, flags, how="reload", admin_group=None) -> None:
    """Override the daemon's flags with a drop-in, applied by reload or restart."""
    group = admin_group or guest.run(
        "systemctl show -p ExecStart --value hpc-batch | grep -o -- '--admin-group [^ ;]*' | cut -d' ' -f2",
        timeout=30).out.strip() or "adm"
    conf = ("[Service]\nExecStart=\nExecStart=%s/hpc-batchd --admin-group %s %s\n"
            % (GUEST_BIN, group, " ".join(flags)))
    guest.run(f"mkdir -p {DROPIN_DIR}", timeout=30, check=True)
    guest.put_bytes(conf, f"{DROPIN_DIR}/50-test-flags.conf", mode=0o644)
    apply(guest, how)


def clear_flags(guest, how="reload") -> None:
    guest.run(f"rm -f {DROPIN_DIR}/50-test-flags.conf", timeout=30, check=True)
    apply(guest, how)


def apply(guest, how) -> None:
    """daemon-reload, then reload or restart, and wait until the daemon answers again."""
    before = ready_count(guest)
    r = guest.run(f"systemctl daemon-reload && systemctl {how} hpc-batch", timeout=300)
    assert r.ok, r.describe() + "\n" + guest.unit_report("hpc-batch")
    wait_for(lambda: ready_count(guest) > before, 180, what=f"hpc-batch to be ready after {how}")


def expect_refusal(guest, dropin: str, content: str, *needles: str) -> None:
    """With *content* as drop-in *dropin*, the daemon refuses to start: exit 78, no restart loop,
    and a journal naming each of *needles*; the drop-in goes and the daemon comes back after."""
    conf = f"{DROPIN_DIR}/{dropin}"
    guest.put_bytes(content, conf, mode=0o644)
    try:
        guest.run("systemctl daemon-reload; systemctl restart hpc-batch", timeout=300)
        wait_for(lambda: guest.run("systemctl show -p ExecMainStatus --value hpc-batch",
                                   timeout=30).out.strip() == "78", 120, what="exit 78")
        # A restart loop would start again RestartSec after the exit: watch twice that (and a second,
        # for a slow guest) for NRestarts to move, failing as soon as it does.
        def state():
            return guest.run("systemctl show -p NRestarts -p ActiveState --value hpc-batch", timeout=30).out.split()
        holds(lambda: state()[0] == "0", 2 * restart_sec() + 1, what="no restart after exit 78")
        show = state()
        assert show[0] == "0" and show[1] in ("failed", "inactive"), show
        journal = guest.run("journalctl -u hpc-batch -o cat --no-pager | tail -5", timeout=60).out
        assert all(n in journal for n in needles), journal
    finally:
        guest.run(f"rm -f {conf}; systemctl daemon-reload; systemctl reset-failed hpc-batch; "
                  "systemctl start hpc-batch", timeout=300)
        wait_for(lambda: guest.run("systemctl is-active hpc-batch", timeout=30).out.strip() == "active",
                 120, what="hpc-batch active again")


def daemon_cmdline(guest) -> str:
    return guest.run(f"tr '\\0' ' ' < /proc/{main_pid(guest)}/cmdline", timeout=30, check=True).out


def job_cgroup(job) -> str:
    return f"/sys/fs/cgroup/hpc-batch/job-{job}"


# --- the daemon's flags and the guest's CPU topology (the SMT guest's tests) -----------------

def start_daemon(guest, *flags, how="restart") -> str:
    """Run the daemon with *flags* (a drop-in, as set_flags does), applied by *how* (restart or
    reload), and wait until it answers; returns its journal from then on (its start-up lines).

    Flags already in place with the daemon active are left as they are (no restart), and the
    journal of the last start is returned instead, so each test may ask for the flags it needs.
    """
    conf = f"{DROPIN_DIR}/50-test-flags.conf"
    wanted = " ".join(flags)
    current = guest.run(f"cat {conf} 2>/dev/null | sed -n 's/^ExecStart=.*--admin-group [^ ]* //p'",
                        timeout=30).out.strip()
    active = guest.run("systemctl is-active hpc-batch", timeout=30).out.strip() == "active"
    if current == wanted and active and how == "restart":
        return last_start_log(guest)
    cursor = guest.run("journalctl -u hpc-batch -n 1 -o cat --no-pager --show-cursor "
                       "| sed -n 's/^-- cursor: //p'", timeout=60).out.strip()
    set_flags(guest, flags, how=how)
    since = f"--after-cursor={shlex.quote(cursor)}" if cursor else ""
    return guest.run(f"journalctl -u hpc-batch -o cat --no-pager {since}", timeout=60, check=True).out


def last_start_log(guest) -> str:
    """The daemon's journal from its last start (or reload) on: from the last 'CPU topology:' line."""
    out = guest.run("journalctl -u hpc-batch -o cat --no-pager", timeout=60, check=True).out
    at = out.rfind("CPU topology:")
    return out[at:] if at >= 0 else out


def parse_cpulist(text) -> frozenset:
    """'0-3,8' (the kernel's list format) as a set of CPU numbers."""
    cpus = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cpus)


class CpuTopology:
    """The guest's CPUs as its sysfs says: threads of each core, packages, NUMA nodes, caches."""

    SCRIPT = r"""
cd /sys/devices/system/cpu || exit 1
for d in cpu[0-9]*; do
    [ -d "$d/topology" ] || continue
    printf 'cpu %s %s %s\n' "${d#cpu}" "$(cat $d/topology/thread_siblings_list)" \
        "$(cat $d/topology/physical_package_id)"
    for c in $d/cache/index*; do
        [ -d "$c" ] && printf 'cache %s %s %s %s\n' "${d#cpu}" "$(cat $c/level)" "$(cat $c/type)" \
            "$(cat $c/shared_cpu_list)"
    done
done
for n in /sys/devices/system/node/node[0-9]*; do printf 'node %s %s\n' "${n##*node}" "$(cat $n/cpulist)"; done
"""

    def __init__(self, guest):
        self.core_of = {}       # cpu -> frozenset of its core's threads (thread_siblings_list)
        self.package_of = {}    # cpu -> physical_package_id
        self.node_cpus = {}     # NUMA node -> frozenset of CPUs
        self.caches = set()     # (level, type, frozenset of CPUs sharing it)
        for line in guest.run(self.SCRIPT, timeout=60, check=True).out.splitlines():
            kind, *words = line.split()
            if kind == "cpu":
                cpu = int(words[0])
                self.core_of[cpu] = parse_cpulist(words[1])
                self.package_of[cpu] = int(words[2])
            elif kind == "cache":
                self.caches.add((int(words[1]), words[2], parse_cpulist(words[3])))
            elif kind == "node":
                self.node_cpus[int(words[0])] = parse_cpulist(words[1])
        self.cpus = sorted(self.core_of)
        self.cores = sorted(set(self.core_of.values()), key=min)
        self.node_of = {c: n for n, cpus in self.node_cpus.items() for c in cpus}

    def cores_of(self, cpus) -> set:
        """The cores (sibling sets) that any of *cpus* is a thread of."""
        return {self.core_of[c] for c in cpus}

    def node_cores(self, node) -> list:
        return [core for core in self.cores if core <= self.node_cpus[node]]


# --- the host's view of the guest's vCPUs (is a guest stall the guest's, or TCG's?) ----------

class VcpuWatch:
    """Samples, every second from a host thread, how much host CPU each of QEMU's vCPU threads
    ("CPU 0/TCG", ...) got and how long it waited for one, from /proc/<tid>/schedstat.

    The guest's soft lockup detector measures the time a CPU did not schedule by the guest's
    clock, which under TCG follows the host's. It cannot tell a CPU that ran kernel code for 49 s
    (a product or kernel bug) from a vCPU thread the host did not run for 49 s (an overcommitted
    host: 8 emulated CPUs on 2 cores shared with other guests). These samples can: a stall the
    host caused shows as a vCPU that *waited* for the host's CPU all along, a real one as a vCPU
    that *ran* all along.
    """

    def __init__(self, qemu_pid: int, period: float = 1.0):
        self.pid = qemu_pid
        self.period = period
        self.samples: list[tuple[float, dict[str, tuple[int, int]], str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vcpu-watch", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        return False

    def _sample(self) -> dict[str, tuple[int, int]]:
        """vCPU name -> (ns run on a host CPU, ns waited on a host run queue), since it started."""
        out: dict[str, tuple[int, int]] = {}
        base = f"/proc/{self.pid}/task"
        try:
            tids = os.listdir(base)
        except OSError:
            return out
        for tid in tids:
            try:
                with open(f"{base}/{tid}/comm") as f:
                    name = f.read().strip()
                if not name.startswith("CPU "):
                    continue
                with open(f"{base}/{tid}/schedstat") as f:
                    run, wait = f.read().split()[:2]
            except (OSError, ValueError):
                continue
            out[name.split("/")[0]] = (int(run), int(wait))
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with open("/proc/loadavg") as f:
                    load = f.read().split()[0]
            except OSError:
                load = "?"
            self.samples.append((time.time(), self._sample(), load))
            self._stop.wait(self.period)

    def worst(self, since: float = 0.0) -> dict[str, dict[str, float]]:
        """Per vCPU since *since* (time.time()): the longest stretch in seconds it was starved
        (waited for the host more than half of each period and ran less than a tenth) and the
        longest it was busy (ran more than nine tenths of each period)."""
        out: dict[str, dict[str, float]] = {}
        runs: dict[str, dict[str, float]] = {}
        prev = None
        for at, sample, _load in self.samples:
            if at < since:
                prev = (at, sample)
                continue
            if prev is not None:
                span = (at - prev[0]) * 1e9
                for cpu, (run, wait) in sample.items():
                    if cpu not in prev[1] or span <= 0:
                        continue
                    ran = (run - prev[1][cpu][0]) / span
                    waited = (wait - prev[1][cpu][1]) / span
                    cur = runs.setdefault(cpu, {"starved": 0.0, "busy": 0.0})
                    best = out.setdefault(cpu, {"starved": 0.0, "busy": 0.0})
                    cur["starved"] = cur["starved"] + span / 1e9 if waited > 0.5 and ran < 0.1 else 0.0
                    cur["busy"] = cur["busy"] + span / 1e9 if ran > 0.9 else 0.0
                    for key in cur:
                        best[key] = max(best[key], cur[key])
            prev = (at, sample)
        return out

    def quietest(self, cpu: int, seconds: float, since: float = 0.0) -> tuple[float, float] | None:
        """(seconds run, seconds waited for the host) of vCPU *cpu* in the *seconds*-long stretch
        since *since* in which it ran least; None without samples that long."""
        name = f"CPU {cpu}"
        points = [(at, sample[name]) for at, sample, _load in self.samples if at >= since and name in sample]
        best = None
        lo = 0
        for hi in range(len(points)):
            while lo < hi and points[hi][0] - points[lo + 1][0] >= seconds:
                lo += 1
            if points[hi][0] - points[lo][0] < seconds:
                continue
            ran = (points[hi][1][0] - points[lo][1][0]) / 1e9
            waited = (points[hi][1][1] - points[lo][1][1]) / 1e9
            if best is None or ran < best[0]:
                best = (ran, waited)
        return best

    def host_stalls(self, dmesg: str, since: float = 0.0) -> tuple[list[str], list[str]]:
        """The soft lockups in *dmesg* split into those the host caused and the rest.

        A guest CPU that really spun in its kernel for N seconds was executed by its vCPU thread
        whenever the host let it run, so over those N seconds it ran for a good part of them (on
        this 2-core host, with 8 vCPUs and other guests, a fifth of the time or more). One whose
        vCPU thread ran under a tenth of some N-second stretch since *since* did not execute for
        most of the time the guest counts as stuck: its lockup is the host's (TCG on an
        overcommitted host), not the guest's. Every other stall report is the guest's."""
        host, guest = [], []
        for line in dmesg.splitlines():
            m = re.search(r"soft lockup - CPU#(\d+) stuck for (\d+)s", line)
            if not m:
                guest.append(line)
                continue
            cpu, stuck = int(m.group(1)), int(m.group(2))
            quiet = self.quietest(cpu, stuck, since)
            if quiet is not None and quiet[0] < 0.1 * stuck:
                host.append(f"{line.strip()} -- the host ran its vCPU {quiet[0]:.1f}s of its quietest {stuck}s "
                            f"(it waited {quiet[1]:.1f}s for a host CPU)")
            else:
                guest.append(f"{line.strip()} -- its vCPU ran {quiet[0] if quiet else float('nan'):.1f}s of its "
                             f"quietest {stuck}s")
        return host, guest

    def judge(self, reports: list[tuple[str, str]], since: float = 0.0) -> tuple[list[str], list[str]]:
        """*reports* (a stall report's first line, the dmesg lines that follow it) split into
        those the host caused and the guest's: soft lockups as `host_stalls` judges them, RCU
        stalls as `rcu_stall_is_the_hosts` does; every other report is the guest's."""
        host, guest = [], []
        for head, block in reports:
            if "soft lockup" in head:
                h, g = self.host_stalls(head, since)
                host += h
                guest += g
                continue
            why = rcu_stall_is_the_hosts(head, block)
            (host if why else guest).append(f"{head.strip()} -- {why}" if why else head.strip())
        return host, guest

    def report(self, since: float = 0.0) -> str:
        """One line a vCPU: its worst starved and busy stretches; then the host's load."""
        worst = self.worst(since)
        loads = [float(load) for at, _s, load in self.samples if at >= since and load != "?"]
        lines = [f"{cpu}: longest starved by the host {w['starved']:.0f}s, longest running flat out "
                 f"{w['busy']:.0f}s" for cpu, w in sorted(worst.items(), key=lambda kv: int(kv[0].split()[1]))]
        if loads:
            lines.append(f"host load average 1 min: max {max(loads):.1f} (host CPUs {os.cpu_count()})")
        return "\n".join(lines)


def rcu_stall_is_the_hosts(head: str, block: str) -> str:
    """Why the RCU stall report starting at *head* (followed in dmesg by *block*) is the host's,
    or '' if it is not shown to be.

    The report names each stalled CPU with the timer ticks it took in the grace period
    (`0-....: (1359 ticks this GP)`), the period's length in jiffies (`t=5254 jiffies`), and an
    NMI backtrace of each stalled CPU with its flags register. A CPU that really held up RCU
    with interrupts on takes every tick of the period (one a jiffy); one that took fewer than
    half of them while its backtrace shows interrupts on (IF, 0x200, in EFLAGS) was not being
    executed for most of the period: under TCG, its vCPU thread was not run by the host. The
    stall is the host's only if that holds for every stalled CPU."""
    if "detected stalls on CPUs" not in head:
        return ""
    m = re.search(r"t=(\d+) jiffies", block)
    cpus = re.findall(r"rcu:\s+(\d+)-\S*: \((\d+) ticks this GP\)", block)
    if not m or not cpus:
        return ""
    period = int(m.group(1))
    why = []
    for cpu, ticks in cpus:
        trace = re.search(rf"NMI backtrace for cpu {cpu}\b(.*?)EFLAGS: ([0-9a-f]+)", block, re.S)
        if not trace or not int(trace.group(2), 16) & 0x200 or int(ticks) * 2 >= period:
            return ""
        why.append(f"CPU {cpu} took {ticks} timer ticks of a {period}-jiffy grace period with interrupts on")
    return "; ".join(why) + ": its vCPU was not run for most of it"


class StallJudge:
    """The guest kernel's stall reports that appeared since this judge was made: those already
    in dmesg then belong to an earlier test, which judged them."""

    def __init__(self, guest, heads: tuple[str, ...], context: int = 80):
        self.guest = guest
        self.heads = heads
        self.context = context
        self.seen = {head for head, _block in self._reports()}

    def _reports(self) -> list[tuple[str, str]]:
        lines = self.guest.run("dmesg", timeout=60, check=True).out.splitlines()
        return [(line, "\n".join(lines[i + 1:i + 1 + self.context]))
                for i, line in enumerate(lines) if any(h in line for h in self.heads)]

    def new(self) -> list[tuple[str, str]]:
        """(first line, the lines after it) of each report not returned before."""
        fresh = [(head, block) for head, block in self._reports() if head not in self.seen]
        self.seen.update(head for head, _block in fresh)
        return fresh


def stall_text(reports: list[tuple[str, str]]) -> str:
    """The reports as dmesg showed them, for a failure message."""
    return "\n".join(f"{head}\n{block}" for head, block in reports)

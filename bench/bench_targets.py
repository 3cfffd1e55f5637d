#!/usr/bin/env python3
"""Benchmark: hpc-batch against the performance targets of the developer guide.

Each figure is printed as a ratio against a baseline measured in the same
run, because the machines this runs on are shared and noisy; every timing
is the median of several runs, interleaved with its baseline so that a
burst of load hits both. Nothing here asserts or fails: it only reports.

1. client cost: ``dispatch new --no-output -- true`` and ``dispatch list``
   wall time against the venv's bare ``python -c pass`` (target: new within
   1.5x), plus the top imports of ``dispatch --version`` (-X importtime).
2. submit-to-start latency: from just before ``dispatch new`` is exec'd to
   the job's first instruction (a ``date +%s%N`` it writes to a file);
   target under 20 ms, also shown as a ratio to ``python -c pass``.
3. drain rate: N ``true`` jobs submitted back to back by ``dispatch new``
   until ``dispatch list`` is empty, in jobs/s, against task-spooler
   (``tsp``/``ts`` with 2 slots) draining the same N jobs (target >= 0.5).
4. shepherd footprint: PSS of one shepherd (target under 3 MB) against a
   bare sleeping ``python``, and its context switches over 5 s while the
   job is silent (target 0).
5. ``dispatch new`` with a long blocked queue (--queue N jobs behind one
   that takes every offered core) against the empty-queue figure of (1).

The daemons it starts run under --no-cgroups on scratch paths and are
killed at exit, together with every shepherd and job they left behind.
Run it with the python of the venv hpc-batch is installed in:

    <venv>/bin/python bench/bench_targets.py [--quick] [--runs N] [--drain N] [--queue N]
"""

from __future__ import annotations

import argparse
import atexit
import grp
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hpc_batch import framing, messages  # noqa: E402

VENV_BIN = os.path.dirname(sys.executable)
PYTHON = sys.executable
DISPATCH = os.path.join(VENV_BIN, "dispatch")
DAEMON = os.path.join(VENV_BIN, "hpc-batchd")
ADMIN_GROUPS = ("wheel", "sudo", "adm", "staff")


# --- small helpers ------------------------------------------------------------

def median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def run_timed(argv, env=None, cwd=None) -> tuple[float, str]:
    """Wall seconds of one run of *argv* (stdout returned); a failure raises."""
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {(r.stderr or r.stdout).strip()}")
    return took, r.stdout


def read_proc(pid: int, name: str) -> str | None:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


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


def pss_mb(pid: int) -> float:
    """Proportional set size of *pid* in MB (1 MB = 1024 kB), from smaps_rollup."""
    text = read_proc(pid, "smaps_rollup") or ""
    m = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
    if m is None:
        raise RuntimeError(f"no Pss line in /proc/{pid}/smaps_rollup")
    return int(m.group(1)) / 1024


def ctx_switches(pid: int) -> int:
    """Voluntary plus nonvoluntary context switches of *pid* so far."""
    text = read_proc(pid, "status") or ""
    return sum(int(n) for n in re.findall(r"^(?:non)?voluntary_ctxt_switches:\s+(\d+)", text, re.M))


def kill_quietly(pid: int, sig: int = signal.SIGKILL, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_under(path: str) -> int:
    """SIGKILL every process whose command line mentions *path*, and its descendants.

    Jobs run in their own session (the shepherd setsid()s them), so each
    descendant's whole process group goes too. Returns how many were hit.
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
    for pid in doomed - marked:  # jobs first, whole groups, so a shepherd sees its job end
        try:
            leader = os.getpgid(pid) == pid
        except OSError:
            continue
        kill_quietly(pid, group=leader)
        kill_quietly(pid)
    for pid in marked:
        kill_quietly(pid)
    return len(doomed)


# --- a throwaway daemon -----------------------------------------------------------

class Daemon:
    """One hpc-batchd under --no-cgroups with everything below *directory*."""

    def __init__(self, directory: str):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.sock = os.path.join(directory, "sock")
        self.log = os.path.join(directory, "daemon.log")
        self.work = os.path.join(directory, "work")  # the jobs' cwd
        os.makedirs(self.work, exist_ok=True)
        self.env = dict(os.environ, HPC_BATCH_SOCKET=self.sock)
        self.proc: subprocess.Popen | None = None
        self.offered_cpus = 0

    def start(self) -> Daemon:
        argv = [DAEMON, "--no-cgroups", "--socket", self.sock,
                "--state-dir", os.path.join(self.dir, "state"), "--dev-dir", os.path.join(self.dir, "dev"),
                "--reserve-cpu", "0", "--reserve-mem", "0"]
        group = admin_group()
        if group:
            argv += ["--admin-group", group]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         cwd=self.dir, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hpc-batchd exited {self.proc.returncode}:\n{self.log_text()}")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(self.sock)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"hpc-batchd did not accept connections in 30 s:\n{self.log_text()}") from exc
                time.sleep(0.02)
        counts = re.findall(r"NUMA node \d+: cpus \S+ \((\d+)\)", self.log_text())
        self.offered_cpus = sum(map(int, counts)) or len(os.sched_getaffinity(0))
        return self

    def log_text(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the daemon first (so it starts nothing more), then its leftovers."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        kill_under(self.dir)

    # The wire protocol, for what the CLI would be too slow or too coarse for.

    def call(self, op: str, **args) -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(self.sock)
            s.sendall(framing.encode(messages.request(op, **args)))
            return self._replies(s, 1)[0]

    @staticmethod
    def _replies(s: socket.socket, n: int) -> list[dict]:
        dec, out = framing.Decoder(framing.MAX_REPLY), []
        while len(out) < n:
            msg = dec.next()
            if msg is not None:
                out.append(msg)
                continue
            data = s.recv(1 << 20)
            if not data:
                raise RuntimeError(f"daemon closed the connection after {len(out)} of {n} replies")
            dec.feed(data)
        return out

    def submit_many(self, argv: list[str], n: int, batch: int = 256) -> None:
        """Queue *n* jobs through one connection, *batch* pipelined requests at a time."""
        body = framing.encode(messages.request(
            "new", argv=argv, cwd=self.work, no_output=True,
            base_env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(self.sock)
            left = n
            while left:
                k = min(batch, left)
                s.sendall(body * k)
                for r in self._replies(s, k):
                    if not r.get("ok"):
                        raise RuntimeError(f"daemon refused a job: {r.get('error')}")
                left -= k

    def active(self) -> int:
        """How many jobs ``dispatch list`` would show (queued or running)."""
        r = self.call("list", all=False, finished=False)
        if not r.get("ok"):
            raise RuntimeError(f"list failed: {r.get('error')}")
        return len(r["result"]["jobs"])

    def wait_idle(self, timeout: float = 60.0, poll: float = 0.002) -> float:
        """Poll until nothing is queued or running; return the monotonic time it was seen."""
        deadline = time.monotonic() + timeout
        while self.active():
            if time.monotonic() > deadline:
                raise RuntimeError(f"jobs still active after {timeout:.0f} s")
            time.sleep(poll)
        return time.perf_counter()

    def dispatch(self, *args: str) -> tuple[float, str]:
        return run_timed([DISPATCH, *args], env=self.env, cwd=self.work)


def admin_group() -> str | None:
    for name in ADMIN_GROUPS:
        try:
            grp.getgrnam(name)
            return name
        except KeyError:
            continue
    return None


# --- the report table -------------------------------------------------------------

ROWS: list[tuple[str, str, str, str, str]] = []


def row(figure: str, value: str, baseline: str, ratio: float | None, target: str) -> None:
    ROWS.append((figure, value, baseline, "-" if ratio is None else f"{ratio:.2f}x", target))


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def print_table() -> None:
    head = ("figure", "value", "baseline", "ratio", "target")
    widths = [max(len(r[i]) for r in [head, *ROWS]) for i in range(5)]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    print("\n" + line(head))
    print("  ".join("-" * w for w in widths))
    for r in ROWS:
        print(line(r))


# --- 1. client cost -----------------------------------------------------------------

def bench_client(d: Daemon, runs: int) -> float:
    """Returns the median ``dispatch new`` seconds, the empty-queue figure for (5)."""
    print(f"(1) client wall time, median of {runs} interleaved runs")
    py = [PYTHON, "-c", "pass"]
    run_timed(py)
    d.dispatch("list")  # warm the page cache for both
    base, new, lst = [], [], []
    for _ in range(runs):
        base.append(run_timed(py)[0])
        new.append(d.dispatch("new", "--no-output", "--", "true")[0])
        d.wait_idle()  # the next figure sees an idle daemon, not a shepherd finishing
        lst.append(d.dispatch("list")[0])
    b, n, li = median(base), median(new), median(lst)
    print(f"    python -c pass  {ms(b):>10}")
    print(f"    dispatch new    {ms(n):>10}  {n / b:.2f}x")
    print(f"    dispatch list   {ms(li):>10}  {li / b:.2f}x")
    row("dispatch new (empty queue)", ms(n), f"python -c pass {ms(b)}", n / b, "<= 1.5x")
    row("dispatch list", ms(li), f"python -c pass {ms(b)}", li / b, "-")

    tries = max(3, runs // 3)
    cum: dict[str, list[int]] = {}
    own: dict[str, list[int]] = {}
    for _ in range(tries):
        r = subprocess.run([PYTHON, "-X", "importtime", DISPATCH, "--version"], env=d.env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for m in re.finditer(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$", r.stderr, re.M):
            key = m.group(3)[1:] + m.group(4)  # indentation shows nesting
            own.setdefault(key, []).append(int(m.group(1)))
            cum.setdefault(key, []).append(int(m.group(2)))
    total = sum(median(v) for k, v in cum.items() if not k.startswith(" "))
    top = sorted(cum, key=lambda k: median(cum[k]), reverse=True)[:8]
    print(f"    imports of dispatch --version (median of {tries}; top 8 by cumulative; "
          f"all top-level imports {total / 1e3:.1f} ms)")
    print(f"      {'cumulative':>10} {'self':>8}  module")
    for k in top:
        print(f"      {median(cum[k]) / 1e3:>8.1f}ms {median(own[k]) / 1e3:>6.1f}ms  {k}")
    return n


# --- 2. submit-to-start latency ---------------------------------------------------------

def bench_latency(d: Daemon, jobs: int) -> None:
    print(f"(2) submit-to-start latency, median of {jobs} jobs")
    py = [PYTHON, "-c", "pass"]
    stamps = os.path.join(d.dir, "stamps")
    os.makedirs(stamps, exist_ok=True)

    def first_instruction(path: str, t0: int, timeout: float = 30.0) -> float:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with open(path) as f:
                    text = f.read()
                if text.endswith("\n"):
                    return (int(text) - t0) / 1e9
            except FileNotFoundError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"job never wrote {path}")
            time.sleep(0.001)

    base, lat, direct = [], [], []
    for i in range(jobs):
        base.append(run_timed(py)[0])
        path = os.path.join(stamps, f"{i}")
        script = f"date +%s%N > {path}"
        t0 = time.time_ns()
        subprocess.run([DISPATCH, "new", "--no-output", "--", "sh", "-c", script], env=d.env, cwd=d.work,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
        lat.append(first_instruction(path, t0))
        d.wait_idle()
        # The same sh + date started directly: the part of the latency no queue can remove.
        path = os.path.join(stamps, f"direct{i}")
        t0 = time.time_ns()
        subprocess.run(["sh", "-c", f"date +%s%N > {path}"], check=True)
        direct.append(first_instruction(path, t0))
    b, m, dr = median(base), median(lat), median(direct)
    print(f"    python -c pass        {ms(b):>10}")
    print(f"    dispatch new -> start {ms(m):>10}  {m / b:.2f}x   (min {ms(min(lat))}, max {ms(max(lat))})")
    print(f"    sh+date run directly  {ms(dr):>10}  (included in the figure above)")
    row("submit-to-start latency", ms(m), f"python -c pass {ms(b)}", m / b, "< 20 ms")


# --- 3. drain rate -------------------------------------------------------------------------

def find_task_spooler() -> str | None:
    """Path of task-spooler's client, installing Debian's package as root if missing."""
    def probe() -> str | None:
        for name in ("tsp", "ts"):  # Debian calls it tsp; moreutils has an unrelated ts
            path = shutil.which(name)
            if not path:
                continue
            try:
                r = subprocess.run([path, "-h"], stdin=subprocess.DEVNULL, capture_output=True,
                                   text=True, timeout=5)
            except subprocess.TimeoutExpired:
                continue
            if "spooler" in (r.stdout + r.stderr).lower():
                return path
        return None

    found = probe()
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    print("    task-spooler not found; installing Debian's package task-spooler")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "task-spooler"]
    r = subprocess.run(install, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if r.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, stdin=subprocess.DEVNULL, capture_output=True)
        r = subprocess.run(install, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"    apt-get install task-spooler failed: {r.stderr.strip().splitlines()[-1:]}")
    return probe()


def ts_drain(tsp: str, n: int, scratch: str) -> float | None:
    """Seconds for task-spooler with 2 slots to drain *n* ``true`` jobs."""
    tsdir = os.path.join(scratch, "ts")
    os.makedirs(tsdir, exist_ok=True)
    env = dict(os.environ, TS_SOCKET=os.path.join(tsdir, "socket"), TMPDIR=tsdir,
               TS_MAXFINISHED=str(max(1000, n + 10)))
    env.pop("TS_ENV", None)
    quiet = dict(env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def busy() -> bool:
        out = subprocess.run([tsp, "-l"], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True).stdout
        return any(len(f) > 1 and f[1] in ("queued", "running", "allocating")
                   for f in (line.split() for line in out.splitlines()[1:]))

    try:
        subprocess.run([tsp, "-S", "2"], check=True, **quiet)  # starts its server, 2 slots
        t0 = time.perf_counter()
        for _ in range(n):
            subprocess.run([tsp, "-n", "true"], check=True, **quiet)
        while busy():
            time.sleep(0.002)
        return time.perf_counter() - t0
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"    task-spooler run failed: {exc}")
        return None
    finally:
        subprocess.run([tsp, "-K"], **quiet)


def bench_drain(d: Daemon, n: int, scratch: str) -> None:
    print(f"(3) drain rate, {n} `true` jobs submitted back to back")
    d.wait_idle()
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run([DISPATCH, "new", "--no-output", "--", "true"], env=d.env, cwd=d.work,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
    submitted = time.perf_counter() - t0
    ours = d.wait_idle(timeout=600) - t0
    # The daemon alone: the same jobs pipelined over one connection, no client start-up.
    t1 = time.perf_counter()
    d.submit_many(["true"], n)
    raw = d.wait_idle(timeout=600) - t1
    print(f"    hpc-batch via dispatch: {n / ours:8.1f} jobs/s  ({ours:.2f} s; submitting took {submitted:.2f} s)")
    print(f"    hpc-batch via socket:   {n / raw:8.1f} jobs/s  ({raw:.2f} s; daemon only, informational)")

    tsp = find_task_spooler()
    if tsp is None:
        why = "not installed" if os.geteuid() != 0 else "could not be installed"
        print(f"    task-spooler baseline skipped: task-spooler (tsp/ts) {why}")
        row(f"drain rate ({n} jobs)", f"{n / ours:.1f} jobs/s", "task-spooler n/a", None, ">= 0.5x ts")
        row("drain rate, socket submits", f"{n / raw:.1f} jobs/s", "task-spooler n/a", None, "-")
        return
    ts = ts_drain(tsp, n, scratch)
    if ts is None:
        row(f"drain rate ({n} jobs)", f"{n / ours:.1f} jobs/s", "task-spooler failed", None, ">= 0.5x ts")
        return
    print(f"    task-spooler -S 2:      {n / ts:8.1f} jobs/s  ({ts:.2f} s, {os.path.basename(tsp)})")
    row(f"drain rate ({n} jobs)", f"{n / ours:.1f} jobs/s", f"ts -S 2 {n / ts:.1f} jobs/s", ts / ours, ">= 0.5x")
    row("drain rate, socket submits", f"{n / raw:.1f} jobs/s", f"ts -S 2 {n / ts:.1f} jobs/s", ts / raw, "-")


# --- 4. shepherd footprint --------------------------------------------------------------------

def bench_shepherd(d: Daemon, window: float) -> None:
    print(f"(4) shepherd footprint, one silent `sleep 30` job, wakeups over {window:.0f} s")
    _, out = d.dispatch("new", "--no-output", "--", "sleep", "30")
    m = re.search(r"^job (\d+)", out, re.M)
    if m is None:
        raise RuntimeError(f"cannot read the job id from {out!r}")
    job = m.group(1)
    sleeper = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(30)"], stdin=subprocess.DEVNULL)
    try:
        shepherd = None
        deadline = time.monotonic() + 10
        while shepherd is None:
            for pid, _, argv in processes():
                if any(d.dir in a for a in argv) and any(
                        argv[i] == "--job" and argv[i + 1] == job for i in range(len(argv) - 1)):
                    shepherd = pid
            if shepherd is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no shepherd with --job {job} found")
                time.sleep(0.05)
        time.sleep(1.0)  # both settled: the job exec'd, the interpreter finished starting
        s_pss, b_pss = pss_mb(shepherd), pss_mb(sleeper.pid)
        s0, b0 = ctx_switches(shepherd), ctx_switches(sleeper.pid)
        time.sleep(window)
        s_wake, b_wake = ctx_switches(shepherd) - s0, ctx_switches(sleeper.pid) - b0
    finally:
        sleeper.kill()
        sleeper.wait()
        subprocess.run([DISPATCH, "kill", job], env=d.env, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"    shepherd pid {shepherd}: PSS {s_pss:.2f} MB, {s_wake} context switches")
    print(f"    bare sleeping python:  PSS {b_pss:.2f} MB, {b_wake} context switches")
    row("shepherd PSS", f"{s_pss:.2f} MB", f"sleeping python {b_pss:.2f} MB", s_pss / b_pss, "< 3 MB")
    row(f"shepherd wakeups in {window:.0f} s", str(s_wake), f"sleeping python {b_wake}",
        s_wake / b_wake if b_wake else None, "0")
    d.wait_idle()


# --- 5. submit latency behind a long queue --------------------------------------------------------

def bench_long_queue(d: Daemon, queued: int, runs: int, empty_new: float) -> None:
    print(f"(5) dispatch new with {queued} blocked jobs queued, median of {runs}")
    cpus = d.offered_cpus
    _, out = d.dispatch("new", "--cpu", str(cpus), "--no-output", "--", "sleep", "600")
    if "running" not in out:
        raise RuntimeError(f"the blocking job did not start: {out.strip()}")
    py = [PYTHON, "-c", "pass"]
    base0, zero = [], []
    for _ in range(runs):  # nothing queued yet, but nothing can start either
        base0.append(run_timed(py)[0])
        zero.append(d.dispatch("new", "--no-output", "--", "true")[0])
    t0 = time.perf_counter()
    d.submit_many(["true"], queued)
    print(f"    queued {queued} jobs over the socket in {time.perf_counter() - t0:.1f} s "
          f"(blocker takes all {cpus} offered cpus)")
    base, full = [], []
    for _ in range(runs):
        base.append(run_timed(py)[0])
        full.append(d.dispatch("new", "--no-output", "--", "true")[0])
    b0, z, b, f = median(base0), median(zero), median(base), median(full)
    print(f"    empty queue, from (1)  {ms(empty_new):>10}")
    print(f"    blocked, queue ~0      {ms(z):>10}  (python -c pass {ms(b0)}, {z / b0:.2f}x)")
    print(f"    blocked, queue {queued:<7} {ms(f):>10}  (python -c pass {ms(b)}, {f / b:.2f}x)")
    print(f"    ratio to (1) {f / empty_new:.2f}x; to the blocked short queue {f / z:.2f}x")
    row(f"dispatch new, {queued} queued", ms(f), f"(1) empty queue {ms(empty_new)}", f / empty_new, "-")


# --- main ---------------------------------------------------------------------------------------------

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer runs and smaller N, for a smoke run")
    p.add_argument("--runs", type=int, help="timed runs per figure (default 15, quick 5)")
    p.add_argument("--latency-jobs", type=int, help="jobs timed in (2) (default 20, quick 8)")
    p.add_argument("--drain", type=int, help="jobs drained in (3) (default 200, quick 50; the target speaks of 1000)")
    p.add_argument("--queue", type=int, help="blocked jobs queued in (5) (default 10000, quick 1000)")
    p.add_argument("--window", type=float, default=5.0, help="seconds the shepherd's wakeups are counted (5)")
    args = p.parse_args()
    q = args.quick
    runs = args.runs or (5 if q else 15)
    lat_jobs = args.latency_jobs or (8 if q else 20)
    drain = args.drain or (50 if q else 200)
    queue = args.queue if args.queue is not None else (1000 if q else 10_000)

    for exe in (DISPATCH, DAEMON):
        if not os.access(exe, os.X_OK):
            print(f"{exe} not found: run this with the python of a venv hpc-batch is installed in", file=sys.stderr)
            return 2

    sys.stdout.reconfigure(line_buffering=True)  # progress shows up even when piped
    scratch = tempfile.mkdtemp(prefix="hpcb-targets-")
    daemons: list[Daemon] = []

    def cleanup() -> None:
        for dm in daemons:
            dm.stop()
        kill_under(scratch)
        shutil.rmtree(scratch, ignore_errors=True)

    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    print(f"hpc-batch targets; venv {VENV_BIN}; scratch {scratch}; "
          f"{len(os.sched_getaffinity(0))} cpus; load {os.getloadavg()[0]:.2f}; "
          f"runs {runs}{' (quick)' if q else ''}")
    d = Daemon(os.path.join(scratch, "a")).start()
    daemons.append(d)
    print(f"    daemon A offers {d.offered_cpus} cpus")
    empty_new = bench_client(d, runs)
    bench_latency(d, lat_jobs)
    bench_drain(d, drain, scratch)
    bench_shepherd(d, args.window)
    d.stop()

    b = Daemon(os.path.join(scratch, "b")).start()
    daemons.append(b)
    bench_long_queue(b, queue, runs, empty_new)
    b.stop()

    print_table()
    print(f"\nratios are value/baseline, except drain rate: ts's seconds over ours (our rate / ts rate). "
          f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

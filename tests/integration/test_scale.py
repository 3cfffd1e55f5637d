"""Scale: one user holds N jobs at once while another user is answered promptly (issue 20, item 2).

hpcb-alice fills a real root daemon with N jobs in every state: finished
(run, cancelled, and failed by a dependency), running, queued, and waiting
behind ``--after-ok`` fan-outs (one bulk of F behind one job) and chains
(each link behind the one before). Meanwhile hpcb-bob times the daemon's
answers to ``list`` and ``new`` (answer_probe.py: a long-lived client, so
what is timed is the daemon's answer, not a ``dispatch`` process start):

- while alice submits everything (bulk submits; printed, not judged);
- with all N held and nothing else happening ("steady");
- while a fan-out of F is released into the queue (its job exited 0);
- while another fan-out of F, and a chain of C behind it, fail as
  ``dependency-failed`` (their job exited 1).

Then the daemon's peak RSS (VmHWM) is checked against a bound, and it is
killed with SIGKILL and started again on the same state directory: the time
until a list request is answered, and every job must come back exactly once
in the state it had.

Size: $HPC_BATCH_SCALE_N jobs (default 10,000, which CI runs; the issue's
full run is 100,000: ``HPC_BATCH_SCALE_N=100000``). The full targets are
asserted when $HPC_BATCH_SCALE_FULL is 1, by default when N >= 100,000: bob's
``list`` and ``new`` each answered within 100 ms at the 99th percentile over
all the time the N are held (steady and both settlings together), and the
restart bound. Every run asserts the bound a stalled loop would break (in
those phases, every answer within STALL seconds: a release costing jobs x
jobs takes far longer), the peak RSS bound, and that every job is where it
should be. Bounds are checked after everything is measured. The figures are
printed (pytest -s), and written as JSON to $HPC_BATCH_SCALE_REPORT if set;
``bench/run --scale-json`` puts them in docs/benchmarks.md.
"""

import base64
import json
import math
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest
from ci_host import require
from conftest import USERS, wait_for
from wire import frame, read_reply

N = int(os.environ.get("HPC_BATCH_SCALE_N", "10000"))
FULL = os.environ.get("HPC_BATCH_SCALE_FULL", "1" if N >= 100_000 else "0") == "1"
ROUNDS = int(os.environ.get("HPC_BATCH_SCALE_ROUNDS", "1000" if FULL else "150"))  # bob's steady rounds
REPORT = os.environ.get("HPC_BATCH_SCALE_REPORT")

P99_TARGET = 0.100   # the issue's: a second user's list and new answered within 100 ms at the 99th percentile
STALL = 5.0          # CI: no answer may take this long (a release costing jobs x jobs takes far longer)
RSS_BASE = 64 << 20  # the daemon with no jobs: 17 MiB here; the rest is headroom (buffers, a listing in flight)
RSS_PER_JOB = 6 << 10  # a held job is a Job object and its dicts: about 3 KiB measured; twice that allowed
RESTART_FULL = 30.0  # the full run: kill -9 to serving 100,000 again (0.3 ms a job: the journal, one record each)
RESTART_CI = 60.0    # CI: a generous bound on a busy 2-core box
HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300 + N // 40)]


@dataclass(frozen=True)
class Mix:
    """How many of alice's N jobs are in each part of the load (pure)."""

    ran: int      # `true`, run to the end before the rest is submitted
    cancelled: int  # queued, then cancelled with `dispatch kill FIRST-LAST`
    fan: int      # each of the two fan-outs that are released (exit 0) and failed (exit 1)
    hold: int     # a fan-out waiting all along (behind a job that never ends)
    chain: int    # each of two chains of single --after-ok jobs: one failed, one waiting all along
    running: int  # one per offered CPU: two gates and sleepers
    front: int    # sleepers queued first, which take the gates' CPUs when they end
    queued: int   # `true`, queued behind all of it

    @classmethod
    def of(cls, n: int, cpus: int) -> "Mix":
        fan = min(10_000, n // 5)
        mix = cls(ran=min(500, n // 50), cancelled=min(200, n // 100), fan=fan, hold=fan // 2,
                  chain=min(1000, max(20, n // 100)), running=cpus, front=2, queued=0)
        rest = n - (mix.ran + mix.cancelled + 2 * mix.fan + mix.hold + 2 * mix.chain + mix.running + mix.front)
        assert rest >= 0, f"HPC_BATCH_SCALE_N={n} is too small for this mix"
        return cls(**{**mix.__dict__, "queued": rest})


def call(d, op, **args):
    """One request as root (the test process) on a connection of its own; the reply's result."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(d.socket)
        s.sendall(frame({"v": 1, "op": op, "args": args}))
        reply = read_reply(s, 120)
    assert reply and reply.get("ok"), f"{op}: {reply}\n{d.log()[-3000:]}"
    return reply["result"]


def counts(d):
    return call(d, "status")["jobs"]


def offered_cpus(d):
    return sum(n["cpus"]["total"] - n["cpus"]["reserved"] for n in call(d, "status")["nodes"])


def listing(d):
    """Every job the daemon holds, by id, from the real dispatch as root (admin): {id: (state, exit)}."""
    jobs = json.loads(d.ok("list", "--all", "--finished", "--json", timeout=300))["jobs"]
    ids = [j["id"] for j in jobs]
    assert len(ids) == len(set(ids)), "a job is listed twice"
    return {j["id"]: (j["state"], j.get("exit")) for j in jobs}


def bulk(d, n, *args):
    """alice's ``dispatch new --array 1-n ARGS``: (first id, last id, seconds the submit took)."""
    t0 = time.perf_counter()
    r = json.loads(d.ok("new", "--json", "--array", f"1-{n}", "--no-output", *args, user=USERS["alice"],
                        timeout=600))
    assert r["count"] == n and r["last"] - r["id"] == n - 1, r
    return r["id"], r["last"], time.perf_counter() - t0


def as_user(name, argv):
    """*argv* as the user *name*, with pipes to its stdin and stdout.

    The child drops to the user itself (no runuser: a long-lived runuser
    between the test and its child only adds a process that relays signals).
    """
    pw = pwd.getpwnam(name)
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, user=pw.pw_uid,
                            group=pw.pw_gid, extra_groups=[], cwd="/",
                            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": pw.pw_dir})


class Chain:
    """alice's chain of single ``--after-ok`` jobs, each behind the one before, over raw requests."""

    def __init__(self, d, scratch):
        self.d, self.wire = d, os.path.join(scratch, "wire.py")

    def build(self, first_after, length):
        p = as_user(USERS["alice"], [sys.executable, "-I", self.wire, self.d.socket, "120"])
        ids, prev = [], first_after
        try:
            for _ in range(length):
                req = frame({"v": 1, "op": "new", "args": {
                    "argv": ["true"], "cwd": self.d.base, "no_output": True, "umask": 0o022,
                    "after": [prev], "after_ok": True, "base_env": {"PATH": "/usr/bin:/bin"}}})
                p.stdin.write(base64.b64encode(req).decode() + "\n")
                p.stdin.flush()
                reply = json.loads(p.stdout.readline())
                assert reply and reply.get("ok"), reply
                prev = reply["result"]["id"]
                ids.append(prev)
        finally:
            p.stdin.close()
            p.wait(60)
        return ids


class Probe:
    """hpcb-bob's answer_probe.py: started, stopped, and its samples."""

    def __init__(self, d, scratch):
        self.d, self.scratch = d, scratch
        self.script = os.path.join(scratch, "answer_probe.py")
        self.cwd = os.path.join(scratch, "bob")
        os.makedirs(self.cwd, exist_ok=True)
        os.chmod(self.cwd, 0o777)
        self.ids = []          # bob's job ids, across every run
        self.proc = None

    def start(self, rounds=0, pause=0.005):
        self.proc = as_user(USERS["bob"], [sys.executable, "-E", "-s", self.script, self.d.socket, self.cwd,
                                           str(pause), str(rounds)])
        assert self.proc.stdout.readline() == "ready\n", "the probe's first round failed"
        return self

    def stop(self, timeout=600):
        """Close its stdin (a run of rounds=0 ends), wait, and return its samples."""
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, out
        samples = json.loads(out)["samples"]
        self.ids += [s["id"] for s in samples if s.get("id") is not None]
        return samples


def pct(values, p):
    """Nearest-rank percentile *p* (0-100) of *values*."""
    v = sorted(values)
    return v[max(0, math.ceil(p / 100 * len(v)) - 1)]


def figures(samples, start=None, end=None):
    """{op: {n, p50, p99, max}} for list and new, of the samples overlapping [start, end] if given."""
    out = {}
    for op in ("list", "new"):
        dts = [s["dt"] for s in samples if s["op"] == op and (start is None or s["at"] + s["dt"] >= start)
               and (end is None or s["at"] <= end)]
        if dts:
            out[op] = {"n": len(dts), "p50": pct(dts, 50), "p99": pct(dts, 99), "max": max(dts)}
    return out


def answered(samples):
    bad = [s for s in samples if s["op"] in ("list", "new") and not s["ok"]]
    assert not bad, f"bob was refused or not answered: {bad[:5]}"


def judge(name, samples, report, bounded=True):
    """Record a phase's figures, and an answer slower than STALL if *bounded* (collected, asserted at the
    end, so that a failing run still measures everything)."""
    answered(samples)
    figs = figures(samples)
    report["phases"][name] = figs
    worst = max(f["max"] for f in figs.values())
    if bounded and worst >= STALL:
        report["violations"].append(f"{name}: an answer took {worst:.2f} s: the daemon's loop stalled")
    return samples


def gate_job(d, fifo):
    """alice's job that exits with the code the test writes to *fifo*."""
    os.mkfifo(fifo)
    os.chmod(fifo, 0o666)
    return d.submit("sh", "-c", f"read x < {fifo}; exit $x", flags=("--no-output",), user=USERS["alice"])


def open_gate(fifo, code):
    """Write *code* to the gate job blocked reading *fifo* (it has opened it once this succeeds)."""
    def write():
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return False   # ENXIO: its reader has not opened it yet
        try:
            os.write(fd, f"{code}\n".encode())
        finally:
            os.close(fd)
        return True
    wait_for(write, timeout=60, what=f"the gate job to read {fifo}")


def release(d, probe, fifo, code, settled, report, name):
    """Open a gate while bob's probe runs; the figures of the window from the open to *settled*."""
    probe.start()
    t0 = time.time()
    open_gate(fifo, code)
    polls = []

    def done():
        p0 = time.perf_counter()
        c = counts(d)
        polls.append(time.perf_counter() - p0)
        return settled(c)
    wait_for(done, timeout=STALL * 60, interval=0.01, what=f"{name} to settle")
    t1 = time.time()
    samples = probe.stop()
    judge(name, samples, report)
    report["phases"][name]["window_s"] = t1 - t0
    report["phases"][name]["in_window"] = figures(samples, t0, t1)
    report["phases"][name]["root_status_max"] = max(polls)
    return samples


def rss_peak(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmHWM")


def timed_dispatch(d, probe, *args, runs=10):
    """Wall seconds of the real ``dispatch ARGS`` as bob (runuser and interpreter start-up included).

    A job it makes is cancelled at once, as the probe's are, and counted among bob's.
    """
    took = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = d.dispatch(*args, user=USERS["bob"])
        took.append(time.perf_counter() - t0)
        assert r.returncode == 0, r.stderr
        if args[0] == "new":
            job = int(r.stdout.split()[1])
            probe.ids.append(job)
            d.ok("kill", str(job), user=USERS["bob"])
    return {"n": runs, "p50": pct(took, 50), "max": max(took)}


def show(report):
    """The figures, readable, on stdout (pytest -s shows them)."""
    print(f"\nscale: N={report['n']} ({'full' if FULL else 'CI'} run), mix {report['mix']}")
    for name, figs in report["phases"].items():
        cells = [f"{op} n={f['n']} p50 {f['p50'] * 1e3:.1f} ms p99 {f['p99'] * 1e3:.1f} ms "
                 f"max {f['max'] * 1e3:.1f} ms" for op, f in figs.items() if op in ("list", "new")]
        extra = "".join(f", {k} {v:.3f}" for k, v in figs.items() if isinstance(v, float))
        print(f"  {name}: {'; '.join(cells)}{extra}")
        if "in_window" in figs:
            print(f"    in the window: {figs['in_window']}")
    for k, v in report.items():
        if k not in ("phases", "mix", "n", "full"):
            print(f"  {k}: {v}")


def test_scale_n_jobs_held_and_another_user_answered(daemon_factory, users, scratch):
    cap = N + 50_000   # above everything alice and bob hold, waiting jobs included
    # --cpu-unit thread: the test needs two hardware threads, not two whole cores.
    args = ("--reserve-cpu", "0", "--reserve-mem", "0", "--cpu-unit", "thread", "--max-queued-per-user", str(cap),
            "--keep-finished", str(cap))
    d = daemon_factory(*args)
    cpus = offered_cpus(d)
    require(cpus >= 2, "needs 2 hardware threads: the two gate jobs run side by side")
    mix = Mix.of(N, cpus)
    report = {"n": N, "full": FULL, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "cpus": os.cpu_count(), "load_at_start": os.getloadavg()[0], "mix": mix.__dict__, "phases": {},
              "violations": []}
    for name in ("wire.py", "answer_probe.py"):
        shutil.copy(os.path.join(HERE, name), os.path.join(scratch, name))
        os.chmod(os.path.join(scratch, name), 0o755)
    alice = USERS["alice"]
    probe = Probe(d, scratch).start()
    t_setup = time.perf_counter()

    # Finished by running, first, while the CPUs are free.
    ran = bulk(d, mix.ran, "--", "true")
    assert d.dispatch("wait", f"{ran[0]}-{ran[1]}", user=alice, timeout=600).returncode == 0
    # Running: two gates, and sleepers on the other CPUs; then two sleepers at the queue's front.
    ok_fifo, fail_fifo = os.path.join(scratch, "gate-ok"), os.path.join(scratch, "gate-fail")
    gate_ok, gate_fail = gate_job(d, ok_fifo), gate_job(d, fail_fifo)
    sleepers = bulk(d, cpus - 2, "--", "sleep", "3600") if cpus > 2 else None
    wait_for(lambda: counts(d)["running"] == cpus, timeout=60, what=f"{cpus} jobs running")
    front = bulk(d, mix.front, "--", "sleep", "3600")
    queued = bulk(d, mix.queued, "--", "true")
    fan_ok = bulk(d, mix.fan, "--after-ok", str(gate_ok), "--", "true")
    fan_fail = bulk(d, mix.fan, "--after-ok", str(gate_fail), "--", "true")
    chain_fail = Chain(d, scratch).build(fan_fail[1], mix.chain)
    hold = bulk(d, mix.hold, "--after-ok", str(front[0]), "--", "true")
    chain_hold = Chain(d, scratch).build(hold[1], mix.chain)
    cancelled = bulk(d, mix.cancelled, "--", "true")
    kill = d.dispatch("kill", f"{cancelled[0]}-{cancelled[1]}", user=alice, timeout=600)
    assert kill.returncode == 0, kill.stderr
    report["setup_s"] = time.perf_counter() - t_setup
    judge("while alice submits", probe.stop(), report, bounded=False)  # shown, not judged
    report["submit_s"] = {"queued": queued[2], "fan_ok": fan_ok[2], "fan_fail": fan_fail[2], "hold": hold[2]}

    waiting = 2 * mix.fan + mix.hold + 2 * mix.chain
    assert counts(d) == {"running": cpus, "queued": mix.front + mix.queued, "waiting": waiting}
    held = listing(d)
    alice_ids = [j for j, _ in held.items() if j not in probe.ids]
    assert len(alice_ids) == N, f"alice holds {len(alice_ids)} jobs, not {N}"

    # Steady: all N held, bob alone asks.
    probe.start(rounds=ROUNDS)
    held_samples = judge("steady", probe.stop(), report)
    report["dispatch_wall_s"] = {"list": timed_dispatch(d, probe, "list"),
                                 "new": timed_dispatch(d, probe, "new", "--no-output", "--", "true"),
                                 "runuser_true": _timed_runuser(USERS["bob"])}

    # A fan-out of F released into the queue: one front sleeper takes the gate's CPU.
    held_samples += release(d, probe, ok_fifo, 0, lambda c: c["waiting"] == waiting - mix.fan, report,
            f"release of {mix.fan:,} to the queue")
    after_ok = {"running": cpus, "queued": mix.front - 1 + mix.queued + mix.fan, "waiting": waiting - mix.fan}
    wait_for(lambda: counts(d) == after_ok, timeout=60, what=f"counts {after_ok}")
    # A fan-out of F and a chain of C behind it fail as dependency-failed, in one pass.
    held_samples += release(d, probe, fail_fifo, 1, lambda c: c["waiting"] == mix.hold + mix.chain, report,
            f"failure of {mix.fan:,} and a chain of {mix.chain:,}")
    # The target: over all the time the N are held (steady, and both settling), p99 within 100 ms.
    report["phases"]["all of the above"] = overall = figures(held_samples)
    for op, f in overall.items():
        if FULL and f["p99"] > P99_TARGET:
            report["violations"].append(f"bob's {op}: p99 {f['p99'] * 1e3:.1f} ms > 100 ms while N are held")
    final = {"running": cpus, "queued": mix.queued + mix.fan, "waiting": mix.hold + mix.chain}
    wait_for(lambda: counts(d) == final, timeout=60, what=f"counts {final}")

    jobs = listing(d)
    for first, last, _ in (ran,):
        assert all(jobs[j] == ("finished", "0") for j in range(first, last + 1))
    assert jobs[gate_ok] == ("finished", "0") and jobs[gate_fail] == ("finished", "1")
    assert all(jobs[j] == ("finished", "dependency-failed")
               for j in [*range(fan_fail[0], fan_fail[1] + 1), *chain_fail]), "a dependent of a failed job"
    assert all(jobs[j] == ("queued", None) for j in range(fan_ok[0], fan_ok[1] + 1))
    assert all(jobs[j] == ("waiting", None) for j in [*range(hold[0], hold[1] + 1), *chain_hold])
    assert all(jobs[j] == ("finished", "cancelled") for j in range(cancelled[0], cancelled[1] + 1))
    assert all(jobs[j][0] == "running" for j in range(front[0], front[1] + 1))
    assert sleepers is None or all(jobs[j][0] == "running" for j in range(sleepers[0], sleepers[1] + 1))
    assert all(jobs[j][0] == "finished" for j in probe.ids)
    assert set(jobs) == set(alice_ids) | set(probe.ids), "a job appeared or vanished"

    peak = rss_peak(d.proc.pid)
    bound = RSS_BASE + RSS_PER_JOB * len(jobs)
    report["rss_peak_mib"] = round(peak / (1 << 20), 1)
    report["rss_bound_mib"] = round(bound / (1 << 20), 1)
    if peak > bound:
        report["violations"].append(f"the daemon's peak RSS {peak >> 20} MiB is over {bound >> 20} MiB "
                                    f"for {len(jobs)} jobs")

    # kill -9, then a new daemon on the same state directory: serving again, every job exactly once.
    d.kill9()
    d2 = daemon_factory(*args, start=False)
    t0 = time.perf_counter()
    d2.start(wait=False)

    def serving():
        assert d2.proc.poll() is None, f"the restarted daemon exited {d2.proc.returncode}:\n{d2.log()[-3000:]}"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(d2.socket)
                s.sendall(frame({"v": 1, "op": "list", "args": {}}))
                reply = read_reply(s, 120)
        except OSError:
            return False
        return bool(reply and reply.get("ok"))
    wait_for(serving, timeout=300 + N // 100, interval=0.01, what="the restarted daemon to answer")
    report["restart_s"] = time.perf_counter() - t0
    assert listing(d2) == jobs, "after the restart a job changed state, vanished or appeared"
    report["restart_list_all_wall_s"] = _wall(lambda: d2.ok("list", "--all", "--finished", "--json", timeout=300))
    limit = RESTART_FULL if FULL else RESTART_CI
    report["restart_bound_s"] = limit
    if report["restart_s"] >= limit:
        report["violations"].append(f"the restart took {report['restart_s']:.1f} s to answer (> {limit} s)")
    report["load_at_end"] = os.getloadavg()[0]
    show(report)
    if REPORT:
        with open(REPORT, "w") as f:
            json.dump(report, f, indent=1)
    assert not report["violations"], "\n".join(report["violations"])


def _wall(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _timed_runuser(user, runs=10):
    """runuser's own cost, to read the real dispatch's wall time against."""
    took = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(["runuser", "-u", user, "--", "true"], check=True)
        took.append(time.perf_counter() - t0)
    return {"n": runs, "p50": pct(took, 50), "max": max(took)}

"""Soak with a mixed load (issue 31 item 6): every kind of job, a hostile user, reloads, restarts, kill -9.

For $HPC_BATCH_SOAK_MINUTES minutes (default 3, which CI runs: scripts/test
deselects only the system tier, so this slow-marked test runs there; the
issue's run is 60 minutes), on one real root daemon:

- hpcb-alice submits round after round of: an ``--array`` with a ``%N`` cap
  (each element exits with its index mod 3, and refuses to run twice: it
  creates a marker with noclobber), a chain of ``--after-ok``/``--after``
  links with a failing link in it, a job waiting on a gate that she kills
  (cancelled), a ``sleep`` she kills whenever it has got to (killed or
  cancelled), and a ``--benchmark`` job;
- hpcb-bob sits at his limits meanwhile: fills --max-queued-per-user until
  refused ``queue_full``, submits a command just under --max-job-size and one
  just over it, holds every connection --max-connections-per-user lets him
  and is refused the next, and kills part of what he queued;
- hpcb-admin's pinger (soak_user.py) times every answer to ``ping`` and
  ``list`` all along;
- the daemon is reloaded (SIGHUP) every 5 minutes (at least twice), and
  restarted (SIGTERM, start) and killed with SIGKILL (then started) at random
  moments, between alice's requests, while her jobs run and bob's clients
  are mid-request.

At the end, once everything drained: every job alice was told of is in the
history exactly once, with the end it had to have; so is every job bob was
told of (his requests race the kill -9s, so a job whose answer the kill cut
off may be there too, at most one per such request); no job ended ``lost``.

The daemon's RSS, descriptors and threads, and the state directory's size
(the history archive apart: it grows by design, and is reported), are taken
after a warm-up round and a fresh start (the baseline); at the end after the
drain (that image has served everything since the last reload, and its
descriptors and threads have lived through every re-exec); and once more
after a final restart, fresh as the baseline was. Each must be within MARGIN
of the baseline. Answer times are reported (max, p99), not judged: no timing
assertion in a test, CI runs on a loaded 2-core machine; the one bound on
them is liveness, every answer within ALIVE seconds, and none refused outside
a planned reload or restart. The figures are printed (pytest -s) and written
as JSON to $HPC_BATCH_SOAK_REPORT if set; docs/benchmarks.md has the 60-minute run.
"""

import json
import math
import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from conftest import USERS, descendants, wait_for

MINUTES = float(os.environ.get("HPC_BATCH_SOAK_MINUTES", "3"))
SEED = int(os.environ.get("HPC_BATCH_SOAK_SEED", "31"))
REPORT = os.environ.get("HPC_BATCH_SOAK_REPORT")

RELOAD_EVERY = 300.0       # the issue's: a reload every 5 minutes
ALIVE = 10.0               # liveness, not speed: an answer later than this is a stall
MAX_QUEUED = 24            # --max-queued-per-user: above one round of alice's, well below what bob tries
MAX_JOB_SIZE = 64 << 10    # --max-job-size
MAX_CONNS = 8              # --max-connections-per-user
# The margins of the end figures over the baseline. RSS: Python's allocator keeps freed arenas, and the
# end image has just served a round, so +20% or +10 MiB, whichever is more: a leak of even 100 bytes a
# job over the 60-minute run's jobs, in one image lifetime, is past it. Descriptors and threads: the same
# set once drained, plus 2 for what sqlite and the loop open lazily. State (the history archive apart):
# finished jobs' directories are evicted past --keep-finished, so +1 MiB. The journal apart: it grows
# between compactions (each when it has doubled since its last snapshot), so +4 MiB, several times
# what this load's snapshot and its doubling come to.
RSS_MARGIN = (0.20, 10 << 20)
FD_MARGIN = 2
THREAD_MARGIN = 2
STATE_MARGIN = 1 << 20
JOURNAL_MARGIN = 4 << 20

HERE = os.path.dirname(os.path.abspath(__file__))
ALICE, BOB, ADMIN = USERS["alice"], USERS["bob"], USERS["admin"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(MINUTES * 60) + 900)]


def as_user(name, argv):
    """*argv* as the user *name* (dropped in the child: no runuser between), pipes to stdin and stdout."""
    pw = pwd.getpwnam(name)
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, user=pw.pw_uid,
                            group=pw.pw_gid, extra_groups=[], cwd="/",
                            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": pw.pw_dir})


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read().strip()
    except OSError as exc:
        return f"({exc.strerror})"


def _task(path):
    """One process or thread: its name, state, kernel wait channel and kernel stack."""
    status = dict(line.split(":", 1) for line in _read(f"{path}/status").splitlines() if ":" in line)
    return {"comm": status.get("Name", "?").strip(), "state": status.get("State", "?").strip(),
            "wchan": _read(f"{path}/wchan"), "stack": _read(f"{path}/stack").splitlines()[:12]}


def where_stuck(client, daemon_pid, socket_path, log):
    """Where a client that got no answer is stuck, and what the daemon does meanwhile: its processes'
    kernel stacks, the unix sockets they hold (ss), the daemon's threads and the end of its log."""
    procs, inodes = {}, set()
    for pid in [client, *descendants(client)]:
        procs[pid] = _task(f"/proc/{pid}")
        fds = []
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    fds.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
                except OSError:
                    pass
        except OSError:
            pass
        procs[pid]["fds"] = fds
        inodes |= {f[8:-1] for f in fds if f.startswith("socket:[")}
    threads = {}
    try:
        for tid in os.listdir(f"/proc/{daemon_pid}/task"):
            threads[tid] = _task(f"/proc/{daemon_pid}/task/{tid}")
    except OSError as exc:
        threads["error"] = exc.strerror
    ss = subprocess.run(["ss", "-xanp"], capture_output=True, text=True).stdout.splitlines()
    sockets = [line for line in ss if socket_path in line or any(f" {i} " in line for i in inodes)]
    return {"client": procs, "daemon_threads": threads, "sockets": sockets[:40],
            "daemon_log": log.splitlines()[-40:]}


def at_rest(d):
    """figures_of(d) once it is at rest, comparable between a fresh daemon and one that has served for long.

    First the requests that open what the daemon opens lazily (the history archive's reader), so both
    have it open; then ten readings half a second apart (pacing, not a wait for a condition: a start
    finishes in the background for a while), the least of each figure: the daemon idle.
    """
    for args in (("list", "--all", "--finished"), ("history", "--all", "--limit", "1"), ("status",)):
        d.ok(*args)
    readings = []
    for _ in range(10):
        readings.append(figures_of(d))
        time.sleep(0.5)
    out = {k: min(r[k] for r in readings) for k in readings[0] if k != "top"}
    out["top"] = readings[-1]["top"]
    return out


def figures_of(d):
    """The daemon's RSS (bytes), open descriptors, threads, and its state directory's size in three parts.

    "top": the state directory's entries and their sizes, largest first (what grew, if it grew).
    """
    pid = d.proc.pid
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    state, history, journal, top = 0, 0, 0, Counter()
    for root, _, files in os.walk(d.state_dir):
        for name in files:
            try:
                size = os.lstat(os.path.join(root, name)).st_blocks * 512   # what du counts
            except OSError:
                continue   # a file removed while walked
            if root == d.state_dir and name.startswith("history.db"):
                history += size
            elif root == d.state_dir and name == "journal":
                journal += size
            else:
                state += size
            top[os.path.relpath(os.path.join(root, name), d.state_dir).split(os.sep)[0]] += size
    return {"rss": int(status["VmRSS"].split()[0]) * 1024, "rss_anon": int(status["RssAnon"].split()[0]) * 1024,
            "rss_file": int(status["RssFile"].split()[0]) * 1024, "journal": journal,
            "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": int(status["Threads"]), "state": state, "history": history, "top": top.most_common(8)}


def pct(values, p):
    """Nearest-rank percentile *p* (0-100) of *values*."""
    v = sorted(values)
    return v[max(0, math.ceil(p / 100 * len(v)) - 1)] if v else None


class Run:
    """The daemon now serving (it is replaced on restart), and the event windows the checks read."""

    def __init__(self, daemon_factory, args):
        self.factory, self.args = daemon_factory, args
        self.d = daemon_factory(*args)
        self.windows = []       # (kind, wall start, wall end): a reload, restart or kill -9 until served again
        self.lock = threading.Lock()

    def event(self, kind):
        start = time.time()
        if kind == "reload":
            seen = self.d.log().count("ready on")
            self.d.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: self.d.log().count("ready on") > seen and self.d.ping(), timeout=60,
                     what="the reload")
        else:
            if kind == "restart":
                self.d.stop()
            else:
                self.d.kill9()
            with self.lock:
                self.d = self.factory(*self.args)
        self.windows.append((kind, start, time.time()))

    def alice(self, *args):
        """``dispatch ARGS`` as alice in her directory; must succeed."""
        return self.d.ok(*args, user=ALICE, cwd=self.home)

    def drained(self):
        return not self.d.jobs("--all")


def plan_events(rng, seconds):
    """[(second, kind)]: reloads every RELOAD_EVERY (at least 2), restarts and kill -9s at random moments.

    Restarts and kill -9s fall in the first 80% so the end's image has lived a while; a reload may come
    after them, as they do all along.
    """
    reloads = max(2, round(seconds / RELOAD_EVERY))
    every = seconds / (reloads + 1)
    events = [(every * (i + 1), "reload") for i in range(reloads)]
    crashes = max(1, round(seconds / 600))    # one of each per 10 minutes
    for kind in ("restart", "kill9"):
        events += [(rng.uniform(0.05, 0.8) * seconds, kind) for _ in range(crashes)]
    return sorted(events)


class Alice:
    """alice's rounds, and what each of her jobs must have ended as: {id: set of (result, code)}."""

    def __init__(self, run, rng, marks):
        self.run, self.rng, self.marks = run, rng, marks
        self.gates = 0
        self.expected = {}
        self.counts = {"array": 0, "chain": 0, "killed": 0, "benchmark": 0, "rounds": 0}

    def new(self, *args):
        out = json.loads(self.run.alice("new", "--json", "--no-output", *args))
        return out["ids"] if "ids" in out else [out["id"]]

    def expect(self, ids, *ends):
        for i in ids:
            assert i not in self.expected, f"job {i} given out twice"
            self.expected[i] = set(ends)

    def round(self, due):
        """One round; *due* runs the events whose time has come, in the middle, while the round's jobs run."""
        rng = self.rng
        ids = []
        # An array with a cap: element i exits i mod 3, or 99 if its marker exists (it ran twice).
        n, cap = rng.randint(3, 8), rng.randint(1, 3)
        arr = self.new("--array", f"1-{n}%{cap}", "--", "sh", "-c",
                       f"set -C; : > {self.marks}/$HPC_BATCH_ARRAY_JOB_ID.$HPC_BATCH_ARRAY_INDEX || exit 99; "
                       "exit $((HPC_BATCH_ARRAY_INDEX % 3))")
        assert len(arr) == n, arr
        for index, job in enumerate(arr, 1):
            self.expect([job], ("exited", index % 3))
        ids += arr
        self.counts["array"] += n
        # A chain: a link that may fail, then --after (runs however it ended) and --after-ok links.
        # The head waits for a gate opened once the chain is queued: --after-ok naming a job that
        # has already failed is refused at submit, and a loaded host can be slower than any sleep.
        code = rng.choice([0, 1])
        self.gates += 1
        gate = os.path.join(self.marks, f"gate.{self.gates}")
        (head,) = self.new("--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done; "
                           f"sleep {rng.choice(['0.2', '0.5', '1'])}; exit {code}")
        (ok1,) = self.new("--after-ok", str(head), "--", "true")
        (any1,) = self.new("--after", str(ok1), "--", "sh", "-c", "exit 3")
        (ok2,) = self.new("--after-ok", str(any1), "--", "true")
        (ok3,) = self.new("--after-ok", str(ok2), "--", "true")
        open(gate, "w").close()
        self.expect([head], ("exited", code))
        self.expect([ok1], ("exited", 0) if code == 0 else ("dependency-failed", None))
        self.expect([any1], ("exited", 3))
        self.expect([ok2, ok3], ("dependency-failed", None))
        ids += [head, ok1, any1, ok2, ok3]
        self.counts["chain"] += 5
        # Kills: one waiting on a gate (cancelled: it never started), one wherever it has got to.
        (gate,) = self.new("--", "sleep", "2")
        (waiter,) = self.new("--after", str(gate), "--", "sleep", "60")
        self.run.alice("kill", str(waiter))
        (sleeper,) = self.new("--", "sleep", "60")
        self.expect([gate], ("exited", 0))
        self.expect([waiter], ("cancelled", None))
        self.expect([sleeper], ("killed", None), ("cancelled", None))
        ids += [gate, waiter, sleeper]
        # A benchmark job (warn: this host lacks what it would hold; it records that and runs).
        (bench,) = self.new("--benchmark", "--cpu", "1", "--", "sh", "-c", "exit 5")
        self.expect([bench], ("exited", 5))
        ids.append(bench)
        self.counts["benchmark"] += 1
        due()
        self.run.alice("kill", str(sleeper))
        self.counts["killed"] += 2
        r = self.run.d.dispatch("wait", "--json", *map(str, ids), user=ALICE, cwd=self.run.home, timeout=600)
        assert r.stdout and json.loads(r.stdout)["jobs"], r.stderr
        self.counts["rounds"] += 1


class Bob:
    """bob at his limits, in a thread of his own until stopped: {id: ends} of what he was told of."""

    def __init__(self, run, scratch):
        self.run, self.scratch = run, scratch
        self.expected = {}
        self.lost_answers = 0     # requests of his that got no answer: the daemon was down or went down
        self.refused = {"queue_full": 0, "too_large": 0, "busy": 0}
        self.accepted_large = 0
        self.other = []           # anything else: a failure
        self.stuck = []           # where_stuck() of each request left unanswered
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def dispatch(self, *args):
        d = self.run.d   # the socket path is the same across restarts
        try:
            r = d.dispatch(*args, user=BOB, cwd=pwd.getpwnam(BOB).pw_dir, timeout=120,
                           on_timeout=lambda pid: self.stuck.append(where_stuck(pid, d.proc.pid, d.socket, d.log())))
        except subprocess.TimeoutExpired:
            # Neither an answer nor a closed connection in 120 s (dispatch has no timeout of its own):
            # kept as a failure, with when it began, and bob goes on.
            self.other.append((" ".join(a[:40] for a in args[:6]), "no answer in 120 s",
                               time.strftime("%H:%M:%S", time.gmtime(time.time() - 120))))
            return subprocess.CompletedProcess(args, 124, "", "")
        if r.returncode == 69:
            self.lost_answers += 1
        return r

    def new(self, *args):
        r = self.dispatch("new", "--json", "--no-output", *args)
        if r.returncode == 0:
            out = json.loads(r.stdout)
            return r, out["ids"] if "ids" in out else [out["id"]]
        return r, []

    def note(self, r, *allowed):
        """Count a refusal; an exit that is neither allowed nor 'unreachable' is kept as a failure."""
        names = {7: "queue_full", 8: "too_large", 9: "busy"}
        if r.returncode in names and r.returncode in allowed:
            self.refused[names[r.returncode]] += 1
        elif r.returncode not in (0, 69):
            self.other.append((" ".join(a[:40] for a in r.args[-8:]), r.returncode, r.stderr.strip()[-300:]))

    def cycle(self):
        r, got = self.new("--", "sleep", "3")
        if not got:       # his queue still full from the cycle before, or the daemon down
            self.note(r, 7)
            return
        (gate,) = got
        self.expected[gate] = {("exited", 0)}
        # A command just under --max-job-size (taken, unless what he queued before still fills his
        # queue), and one just over (refused for its size, or for the full queue, whichever is checked first).
        r, got = self.new("--", "sh", "-c", ": " + "x" * (MAX_JOB_SIZE - 1024))
        for job in got:
            self.expected[job] = {("exited", 0)}
            self.accepted_large += 1
        self.note(r, 7)
        r, _ = self.new("--", "sh", "-c", ": " + "x" * (MAX_JOB_SIZE + 1024))
        self.note(r, 7, 8)
        # Fill his queue behind the gate until refused: a bulk past the limit first (refused whole).
        waiting = []
        r, _ = self.new("--array", f"1-{MAX_QUEUED + 5}", "--after", str(gate), "--", "true")
        self.note(r, 7)
        for _ in range(MAX_QUEUED + 2):
            if self.stop.is_set():
                break
            r, got = self.new("--array", "1-5", "--after", str(gate), "--", "true")
            if r.returncode == 7:        # the bulk no longer fits: one at a time up to the limit
                self.note(r, 7)
                r, got = self.new("--after", str(gate), "--", "true")
            waiting += got
            for job in got:
                self.expected[job] = {("exited", 0)}
            if r.returncode == 7:
                self.note(r, 7)
                break
            if r.returncode == 3:   # the gate ended and, past --keep-finished, was forgotten: start over
                break
            self.note(r)
        # Every connection he may hold, then one more (refused busy), then let go.
        hoarder = as_user(BOB, [sys.executable, "-I", os.path.join(self.scratch, "soak_user.py"), "hoard",
                                self.run.d.socket, str(MAX_CONNS)])
        try:
            if int(hoarder.stdout.readline() or 0) == MAX_CONNS:
                self.note(self.dispatch("list"), 9)
        finally:
            hoarder.communicate("\n", timeout=60)
        # Kill half of what waits: cancelled if still waiting; the gate may have ended, so it may have run.
        half = waiting[: len(waiting) // 2]
        if half:
            r = self.dispatch("kill", *map(str, half))
            for job in half:
                self.expected[job] = {("cancelled", None), ("killed", None), ("exited", 0)}
            if r.returncode not in (0, 10, 69):
                self.other.append((("kill",), r.returncode, r.stderr.strip()[-300:]))

    def loop(self):
        while not self.stop.is_set():
            self.cycle()
            self.stop.wait(2.0)   # pacing: bob comes back every couple of seconds, not a wait for a state


def check_ends(rows, expected, who):
    wrong, lost = {}, []
    for job, ends in expected.items():
        row = rows.get(job)
        if row is None:
            lost.append(job)
            continue
        got = (row["result"], row["code"] if row["result"] == "exited" else None)
        if got not in ends:
            wrong[job] = (got, sorted(ends, key=str), row["note"])
    assert not lost, f"{who}: jobs given out but not in the history: {lost}"
    assert not wrong, f"{who}: wrong ends (got, expected, note): {wrong}"


def within(name, start, end, margin):
    assert end <= margin, f"{name}: {end} at the end, {start} at the start, more than the margin allows ({margin})"


def test_soak_mixed_load(daemon_factory, users, scratch):
    rng = random.Random(SEED)
    started, load_at_start = time.time(), os.getloadavg()[0]
    seconds = MINUTES * 60
    for name in ("wire.py", "answer_probe.py", "soak_user.py"):
        shutil.copy(os.path.join(HERE, name), scratch)
        os.chmod(os.path.join(scratch, name), 0o644)
    # --history-per-user: the archive must keep every job of the run, for the accounting at the end (the
    # default 64M drops a user's oldest after about 40 minutes of this load).
    args = ("--reserve-cpu", "0", "--reserve-mem", "0", "--keep-finished", "20", "--history-per-user", "4G",
            "--max-queued-per-user", str(MAX_QUEUED), "--max-job-size", f"{MAX_JOB_SIZE >> 10}K",
            "--max-connections-per-user", str(MAX_CONNS))
    run = Run(daemon_factory, args)
    alice_pw = users["alice"]
    run.home = os.path.join(scratch, "alice")
    marks = os.path.join(run.home, "marks")
    os.makedirs(marks)
    for p in (run.home, marks):
        os.chown(p, alice_pw.pw_uid, alice_pw.pw_gid)
    alice = Alice(run, rng, marks)
    bob = Bob(run, scratch)

    # Warm-up: one round of each, drained; then a fresh start: the baseline.
    alice.round(lambda: None)
    bob.cycle()
    wait_for(run.drained, timeout=300, backoff=0.5, what="the warm-up drained")
    run.event("restart")
    run.windows.clear()
    base = at_rest(run.d)

    pinger = as_user(ADMIN, [sys.executable, "-I", os.path.join(scratch, "soak_user.py"), "ping",
                             run.d.socket, "0.1"])
    assert pinger.stdout.readline() == "ready\n", "the pinger's first answer failed"
    peaks = {"rss": 0, "fds": 0, "threads": 0}
    sampling = threading.Event()

    def sample():   # the daemon's figures every 10 s: their peaks over the run
        while not sampling.wait(10):
            with run.lock:
                d = run.d
            try:
                f = figures_of(d)
            except (OSError, KeyError):
                continue   # between a kill and the next start
            for k in peaks:
                peaks[k] = max(peaks[k], f[k])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    bob.thread.start()
    events = plan_events(rng, seconds)
    t0 = time.monotonic()
    done = []

    def due():
        while events and time.monotonic() - t0 >= events[0][0]:
            _, kind = events.pop(0)
            run.event(kind)
            done.append(kind)

    while time.monotonic() - t0 < seconds or events:
        alice.round(due)
    elapsed = time.monotonic() - t0
    bob.stop.set()
    bob.thread.join(timeout=600)
    assert not bob.thread.is_alive(), "bob's client is stuck"
    out, _ = pinger.communicate("", timeout=600)
    samples = json.loads(out)["samples"]
    sampling.set()
    sampler.join(timeout=60)
    wait_for(run.drained, timeout=600, backoff=0.5, what="everything drained")
    end = at_rest(run.d)
    run.event("restart")
    fresh = at_rest(run.d)

    rows = {}
    history = json.loads(run.d.ok("history", "--all", "--json", "--limit", "1000000"))["jobs"]
    dup = sorted(i for i, n in Counter(j["id"] for j in history).items() if n > 1)
    for job in history:
        rows[job["id"]] = job
    mine = {u: {i for i, j in rows.items() if j["user"] == u} for u in (ALICE, BOB, ADMIN)}

    def window_of(s):
        """The kind of event the answer overlapped, or None."""
        return next((kind for kind, a, b in run.windows if a - 0.5 <= s["at"] + s["dt"] and s["at"] <= b + 0.5),
                    None)

    def in_window(s):
        return window_of(s) is not None

    answered = [s for s in samples if s["ok"]]
    steady = [s["dt"] for s in answered if not in_window(s)]
    around = [s["dt"] for s in answered if in_window(s)]
    unanswered_out = [s for s in samples if not s["ok"] and not in_window(s)]
    report = {
        "minutes": round(elapsed / 60, 1), "seed": SEED, "knob": MINUTES,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)), "cpus": os.cpu_count(),
        "load_at_start": load_at_start, "load_at_end": os.getloadavg()[0],
        "margins": {"rss": list(RSS_MARGIN), "fds": FD_MARGIN, "threads": THREAD_MARGIN, "state": STATE_MARGIN,
                    "journal": JOURNAL_MARGIN, "alive_s": ALIVE},
        "events": {k: done.count(k) for k in ("reload", "restart", "kill9")},
        "alice": dict(alice.counts, jobs=len(alice.expected)),
        "bob": {"jobs": len(bob.expected), "refused": bob.refused, "large_accepted": bob.accepted_large,
                "unanswered": bob.lost_answers, "extra_in_history": len(mine[BOB] - set(bob.expected)),
                "stuck": bob.stuck},
        "history_rows": len(history),
        # The daemon's own account of its slow turns (server.SLOW_TURN; at most one line per 10 s).
        "slow_turns": [line for line in run.d.log().splitlines() if "a turn of the loop took" in line][-50:],
        "baseline": base, "end": end, "end_fresh": fresh, "peaks": peaks,
        "answers": {"n": len(samples), "answered": len(answered),
                    "steady": {"n": len(steady), "p50": pct(steady, 50), "p99": pct(steady, 99),
                               "max": max(steady, default=None)},
                    "around_events": {"n": len(around), "p99": pct(around, 99), "max": max(around, default=None)},
                    "around_each": {k: {"n": len(v), "p99": pct(v, 99), "max": max(v, default=None)}
                                    for k in ("reload", "restart", "kill9")
                                    for v in [[s["dt"] for s in answered if window_of(s) == k]]},
                    "unanswered_around_events": sum(1 for s in samples if not s["ok"] and in_window(s)),
                    "unanswered_otherwise": len(unanswered_out)},
    }
    print("soak figures:", json.dumps(report, indent=1))
    if REPORT:
        with open(REPORT, "w") as f:
            json.dump(report, f, indent=1)

    # Jobs: none lost, none twice, each ended as it had to.
    assert not dup, f"jobs twice in the history: {dup}"
    assert mine[ALICE] == set(alice.expected), ("alice: given out and history differ",
                                                sorted(set(alice.expected) ^ mine[ALICE]))
    check_ends(rows, alice.expected, "alice")
    check_ends(rows, bob.expected, "bob")
    extra = mine[BOB] - set(bob.expected)
    assert len(extra) <= 5 * bob.lost_answers, f"bob: jobs no answer named, more than his lost answers: {extra}"
    assert not [j for j in history if j["result"] == "lost"], "a job ended lost"
    assert not bob.other, f"bob was refused otherwise than at his limits: {bob.other[:5]}"
    assert bob.refused["queue_full"] and bob.refused["too_large"] and bob.refused["busy"], bob.refused
    assert bob.accepted_large, "bob's command just under --max-job-size was never taken"
    assert len(done) >= 4 and done.count("reload") >= 2, done
    # Liveness: every answer in time, none missing while the daemon was meant to be up.
    late = [s for s in answered if s["dt"] > ALIVE]
    assert not late, f"answers later than {ALIVE}s: {late[:5]}"
    assert not unanswered_out, f"unanswered outside a reload or restart: {unanswered_out[:5]}"
    # Resources: at the end, and fresh after a restart, within the margins of the baseline.
    for name, fig in (("end", end), ("end, fresh", fresh)):
        within(f"{name} RSS", base["rss"], fig["rss"], max(base["rss"] * (1 + RSS_MARGIN[0]),
                                                           base["rss"] + RSS_MARGIN[1]))
        within(f"{name} descriptors", base["fds"], fig["fds"], base["fds"] + FD_MARGIN)
        within(f"{name} threads", base["threads"], fig["threads"], base["threads"] + THREAD_MARGIN)
        within(f"{name} state dir", base["state"], fig["state"], base["state"] + STATE_MARGIN)
        within(f"{name} journal", base["journal"], fig["journal"], base["journal"] + JOURNAL_MARGIN)

"""Benchmark mode end to end (issue 21 items 2, 3, 6, 7) through the real daemon on this host.

This host may have no SMT (the 2-vCPU CI container has none): here the tests
check that --benchmark runs and records what it lacked, that the daemon and
its shepherds sit on the housekeeping CPUs and benchmark jobs never do, that
a request wider than what is left is refused naming the limit, that --aslr
off and --thp off reach the job's process, and that --benchmark=strict waits
while a throttle counter rises, then starts. The counters are read under a
fixture root (HPC_BATCH_PROBE_ROOT) this test writes. Siblings and L3
caches are unit-tested over recorded trees (tests/unit/test_benchmark.py)
and belong to the VM tier's SMT guest.
"""

import json
import os
import signal
import threading

import pytest
from ci_host import needs
from conftest import exit_of, wait_for

pytestmark = pytest.mark.timeout(180)

needs_two = needs(len(os.sched_getaffinity(0)) >= 2, "needs two CPUs: one is housekeeping")


def _allowed_list(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split()[1]
    return None


def _cpulist(text):
    out = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _lowest_core():
    first = min(os.sched_getaffinity(0))
    try:
        with open(f"/sys/devices/system/cpu/cpu{first}/topology/thread_siblings_list") as f:
            return _cpulist(f.read().strip()) & os.sched_getaffinity(0)
    except OSError:
        return {first}


def _show(d, job):
    return json.loads(d.ok("show", "--json", str(job)))


@needs_two
def test_a_benchmark_job_runs_off_the_housekeeping_cpus_which_the_daemon_and_shepherds_use(daemon_factory, users):
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    hk = _lowest_core()        # no --reserve-cpu: the lowest CPU's core
    log = d.log()
    assert f"housekeeping CPUs {','.join(map(str, sorted(hk)))} (the core of CPU {min(hk)}" in log, log
    assert _cpulist(_allowed_list(d.proc.pid)) == hk          # the daemon itself
    seen = os.path.join(d.base, "cpus-seen")
    job = d.submit("sh", "-c", f"grep Cpus_allowed_list /proc/self/status > {seen}; sleep 30",
                   flags=("--benchmark", "--cpu", "1"))
    shown = wait_for(lambda: (s := _show(d, job))["state"] == "running" and s, what="benchmark job to run")
    assert not set(shown["cpus"]) & hk
    assert shown["benchmark"] == "warn" and shown["request"]["numa_local"] is True
    assert "swap is not forbidden and memory is not kept on its NUMA node (--no-cgroups)" in shown["shortfalls"]
    with open(os.path.join(d.state_dir, "jobs", str(job), "shepherd.pid")) as f:
        shepherd = int(f.read().split()[0])
    assert _cpulist(_allowed_list(shepherd)) == hk            # the shepherd inherits it
    text = d.ok("show", str(job))
    assert "benchmark: warn" in text and "fell short: " in text, text
    # Killed once it has looked (running means started, not that its command has run yet).
    line = wait_for(lambda: os.path.exists(seen) and open(seen).read().strip(), what="the job to read its CPUs")
    d.ok("kill", str(job))
    d.wait_finished(job)
    assert _cpulist(line.split()[-1]) == set(shown["cpus"])   # the job ran on its cpuset


@needs_two
def test_a_benchmark_request_wider_than_what_housekeeping_leaves_is_refused(daemon_factory, users):
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    n = len(os.sched_getaffinity(0))
    r = d.dispatch("new", "--benchmark=strict", "--cpu", str(n), "--", "true")
    assert r.returncode == 6, r.stderr
    assert f"--benchmark=strict --cpu {n} can never fit: the largest NUMA node offers" in r.stderr
    assert "kept for housekeeping" in r.stderr
    r = d.dispatch("new", "--whole-l3", "--", "true")
    assert r.returncode == 2 and "--whole-l3 goes with --benchmark" in r.stderr


def test_housekeeping_none_leaves_the_daemon_unpinned_and_benchmark_jobs_say_so(daemon_factory, users):
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0", "--housekeeping-cpus", "none")
    assert "housekeeping CPUs: none (--housekeeping-cpus none" in d.log()
    assert _cpulist(_allowed_list(d.proc.pid)) == os.sched_getaffinity(0)
    job = d.submit("true", flags=("--benchmark",))
    d.wait_finished(job)
    assert "no housekeeping CPUs: the daemon and the shepherds may run on its cores" in _show(d, job)["shortfalls"]


@needs_two
def test_a_reload_keeps_every_cpu_to_give_though_the_daemon_is_pinned(daemon_factory, users):
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    d.ok("status")
    d.proc.send_signal(signal.SIGHUP)
    try:
        wait_for(lambda: d.log().count("ready on") >= 2, what="reload")
    except AssertionError:
        raise AssertionError(d.log()) from None
    st = json.loads(d.ok("status", "--json"))
    assert sum(n["cpus"]["total"] for n in st["nodes"]) == len(os.sched_getaffinity(0))
    job = d.submit("true", flags=("--benchmark", "--cpu", "1"))
    assert exit_of(d.wait_finished(job)) == "0"


def test_aslr_off_and_thp_off_reach_the_job_and_are_recorded_either_way(daemon_factory, users):
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    alice = users["alice"]
    home = os.path.join(d.base, "alice")     # the job runs as alice: no root needed for either
    os.makedirs(home)
    os.chown(home, alice.pw_uid, alice.pw_gid)
    probe = ("cat /proc/self/personality; grep THP_enabled /proc/self/status")
    off = d.submit("sh", "-c", probe, flags=("--aslr", "off", "--thp", "off"), user=alice.pw_name, cwd=home)
    plain = d.submit("sh", "-c", probe, user=alice.pw_name, cwd=home)
    for job in (off, plain):
        d.wait_finished(job, user=alice.pw_name)
    with open(os.path.join(home, f"output.{off}.log")) as f:
        words = f.read().split()
    assert int(words[0], 16) & 0x0040000 and words[-2:] == ["THP_enabled:", "0"], words
    with open(os.path.join(home, f"output.{plain}.log")) as f:
        words = f.read().split()
    assert not int(words[0], 16) & 0x0040000 and words[-2:] == ["THP_enabled:", "1"], words
    shown = _show(d, off)
    assert (shown["aslr"], shown["thp"]) == ("off", "off")
    assert (_show(d, plain)["aslr"], _show(d, plain)["thp"]) == ("on", "on")
    assert shown["user"] == alice.pw_name
    text = d.ok("show", str(off))
    assert "aslr: off" in text and "transparent huge pages: off" in text


def _throttle_tree(root, cpus):
    os.makedirs(os.path.join(root, "proc"), exist_ok=True)
    with open(os.path.join(root, "proc", "vmstat"), "w") as f:
        f.write("pswpin 0\npswpout 0\n")
    for cpu in cpus:
        os.makedirs(os.path.join(root, f"sys/devices/system/cpu/cpu{cpu}/thermal_throttle"), exist_ok=True)
        _set_count(root, cpu, 0)


def _set_count(root, cpu, n):
    path = os.path.join(root, f"sys/devices/system/cpu/cpu{cpu}/thermal_throttle/core_throttle_count")
    with open(path + ".new", "w") as f:
        f.write(f"{n}\n")
    os.replace(path + ".new", path)


def test_strict_waits_while_a_throttle_counter_rises_then_starts(daemon_factory, users, scratch):
    root = os.path.join(scratch, "probe-root")
    cpus = sorted(os.sched_getaffinity(0))
    _throttle_tree(root, cpus)
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0", env={"HPC_BATCH_PROBE_ROOT": root})
    stop = threading.Event()

    def bump():   # a counter that rises for as long as the test wants the machine hot
        n = 0
        while not stop.wait(0.02):
            n += 1
            _set_count(root, cpus[-1], n)
    heater = threading.Thread(target=bump, daemon=True)
    heater.start()
    try:
        job = d.submit("true", flags=("--benchmark=strict",))
        hot = f"the thermal throttle counters of CPU {cpus[-1]} are rising"
        why = wait_for(lambda: (s := _show(d, job))["state"] == "queued" and hot in (s["why"] or "") and s["why"],
                       timeout=30, what="the strict job to wait on the throttle counter")
        assert why.startswith("--benchmark=strict: ")
        assert hot in d.ok("show", str(job))
        # A plain job behind it is not held up, and neither is a warn one.
        plain = d.submit("true")
        warn = d.submit("true", flags=("--benchmark",))
        d.wait_finished(plain)
        d.wait_finished(warn)
        assert _show(d, job)["state"] == "queued"
    finally:
        stop.set()
        heater.join()
    assert exit_of(d.wait_finished(job, timeout=60)) == "0"

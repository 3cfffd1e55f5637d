"""Whole cores on a guest with SMT (issue 21, item 1): no two jobs share a physical core.

The SMT guest (conftest.SMT_SHAPE) has 8 CPUs: two sockets, each one NUMA node
of two cores of two threads. Which CPUs are siblings is read from the guest's
sysfs (guestlib.CpuTopology), never assumed. Each job's CPUs are read from
its cgroup's ``cpuset.cpus.effective``, what the kernel actually lets it run
on, and compared with what ``show``, ``list`` and ``status`` say.

Most tests run the daemon with the default --reserve-cpu 2, which is one whole
core of the lowest node, so jobs have three cores: one on node 0, two on
node 1. Memory flags are sized for nodes of about 1.9 GiB, and every job asks
for a small budget so that only CPUs decide where and whether it runs.
"""

import json
import re

import pytest
from guestlib import GUEST_BIN, CpuTopology, dispatch, job_cgroup, parse_cpulist, read, start_daemon, submit, wait_for

pytestmark = pytest.mark.system

MEM_FLAGS = ("--reserve-mem", "0.25", "--min-job-mem", "0.125")
CORE_FLAGS = ("--reserve-cpu", "2", *MEM_FLAGS)
JOB = ("--max-mem", "128M")
SLEEP = ("sleep", "3600")


@pytest.fixture(scope="module")
def topo(smt_guest):
    return CpuTopology(smt_guest)


@pytest.fixture
def core_daemon(smt_guest):
    """The daemon in whole-core mode with one core reserved; its start-up log."""
    return start_daemon(smt_guest, *CORE_FLAGS)


@pytest.fixture
def jobs(smt_guest):
    """Jobs a test submits, as (user, id); killed and waited for after the test."""
    started = []
    yield started
    for user in sorted({user for user, _ in started}):
        ids = " ".join(str(job) for u, job in started if u == user)
        # One kill and one wait a user: each dispatch is a Python start-up under TCG.
        r = smt_guest.run(f"cd ~ && {GUEST_BIN}/dispatch kill {ids}; {GUEST_BIN}/dispatch wait {ids}",
                          user=user, timeout=180)
        assert r.rc in (240, 244), r.describe()      # killed, or cancelled while queued


def show(guest, user, job) -> dict:
    r = dispatch(guest, user, "show", "--json", str(job))
    assert r.ok, r.describe()
    return json.loads(r.out)


def status(guest) -> dict:
    r = dispatch(guest, "alice", "status", "--json")
    assert r.ok, r.describe()
    return json.loads(r.out)


def listed(guest, user) -> dict:
    r = dispatch(guest, user, "list", "--json")
    assert r.ok, r.describe()
    return {j["id"]: j for j in json.loads(r.out)["jobs"]}


def start(guest, jobs, user, *flags) -> int:
    job = submit(guest, user, *SLEEP, flags=(*JOB, *flags))
    jobs.append((user, job))
    return job


def running_cpuset(guest, user, job) -> frozenset:
    """The job's cpuset.cpus.effective once it runs (its cgroup is where show says)."""
    shown = wait_for(lambda: (s := show(guest, user, job))["state"] == "running" and s.get("cgroup") and s,
                     240, what=f"job {job} to run in its cgroup")
    path = shown["cgroup"] if isinstance(shown["cgroup"], str) else job_cgroup(job)
    return parse_cpulist(read(guest, f"{path}/cpuset.cpus.effective"))


def test_the_guest_has_two_threads_per_core_and_a_node_per_socket(topo):
    assert len(topo.cpus) == 8, topo.core_of
    assert len(topo.cores) == 4 and all(len(core) == 2 for core in topo.cores), (
        "the guest sees no siblings (a CPU model that hides them?): %s" % topo.core_of)
    assert sorted(topo.node_cpus) == [0, 1]
    # One socket a node, two whole cores each.
    packages = [{topo.package_of[c] for c in topo.node_cpus[n]} for n in (0, 1)]
    assert all(len(p) == 1 for p in packages) and packages[0] != packages[1], topo.package_of
    assert [len(topo.node_cores(n)) for n in (0, 1)] == [2, 2], (topo.cores, topo.node_cpus)


def test_start_up_log_names_the_topology_and_whole_cores(topo, core_daemon):
    log = core_daemon
    # Journal lines carry the daemon's "hpc-batchd: " prefix.
    line = next((x[x.index("CPU topology:"):] for x in log.splitlines() if "CPU topology:" in x), None)
    assert line, log
    assert line.startswith("CPU topology: 8 CPUs in 4 cores on 2 packages, 2 threads per core"), line
    gaps = {max(core) - min(core) for core in topo.cores}
    numbering = ("siblings numbered next to each other" if gaps == {1}
                 else f"siblings numbered N and N+{gaps.pop()}")
    assert numbering in line, (line, topo.cores)
    unified = [c for c in topo.caches if c[1] != "Instruction"]
    if unified:
        top = max(level for level, _, _ in unified)
        groups = {cpus for level, _, cpus in unified if level == top}
        assert f"{len(groups)} L{top} cache" in line, (line, topo.caches)
    alloc = next((x for x in log.splitlines() if "CPU allocation:" in x), None)
    assert alloc and "whole cores (--cpu-unit core)" in alloc, log
    m = re.search(r"reserved for the OS \(--reserve-cpu 2\): CPUs (\S+)", alloc)
    assert m, alloc
    # --reserve-cpu 2 is one whole core: the lowest of the lowest node.
    assert parse_cpulist(m.group(1)) == topo.core_of[min(topo.node_cpus[0])], (alloc, topo.cores)


def test_one_cpu_jobs_of_two_users_never_get_threads_of_one_core(smt_guest, topo, core_daemon, jobs):
    g = smt_guest
    reserved = topo.core_of[min(topo.node_cpus[0])]
    for user in ("alice", "bob", "alice"):
        start(g, jobs, user, "--cpu", "1")
    got = {job: running_cpuset(g, user, job) for (user, job) in jobs}
    for job, cpus in got.items():
        assert cpus in topo.cores, f"job {job} runs on {sorted(cpus)}, not one whole core of {topo.cores}"
        assert not cpus & reserved, (job, cpus, reserved)
    held = list(got.values())
    assert len(set(held)) == len(held) == 3, got          # three distinct cores: all the jobs' cores
    # The machine is full: a fourth one-CPU job queues, and show says it waits for a whole core.
    fourth = start(g, jobs, "bob", "--cpu", "1")
    shown = wait_for(lambda: (s := show(g, "bob", fourth)).get("why") and s, 120,
                     what=f"job {fourth} to say why it waits")
    assert shown["state"] == "queued", shown
    assert "whole core" in shown["why"] and "NUMA node" in shown["why"], shown["why"]
    text = dispatch(g, "bob", "show", str(fourth)).out
    assert f"waiting because: {shown['why']}" in text, text
    st = status(g)
    assert [n["cores"]["free"] for n in st["nodes"]] == [0, 0], st["nodes"]
    assert sum(n["cores"]["in_use"] for n in st["nodes"]) == 3, st["nodes"]


def test_three_cpus_get_two_whole_cores_on_one_node(smt_guest, topo, core_daemon, jobs):
    g = smt_guest
    job = start(g, jobs, "alice", "--cpu", "3")
    cpus = running_cpuset(g, "alice", job)
    cores = topo.cores_of(cpus)
    assert len(cores) == 2 and frozenset().union(*cores) == cpus, (cpus, topo.cores)
    nodes = {topo.node_of[c] for c in cpus}
    assert len(nodes) == 1, (cpus, topo.node_cpus)
    node = nodes.pop()
    want_cores = sorted(sorted(core) for core in cores)
    shown = show(g, "alice", job)
    assert sorted(sorted(c) for c in shown["cores"]) == want_cores, shown
    assert sorted(shown["held_cpus"]) == sorted(cpus) and sorted(shown["cpus"]) == sorted(cpus), shown
    row = listed(g, "alice")[job]
    assert sorted(sorted(c) for c in row["cores"]) == want_cores and sorted(row["held_cpus"]) == sorted(cpus)
    text = dispatch(g, "alice", "show", str(job)).out
    assert "cores: 2 (" in text and "2 threads each)" in text, text
    by_node = {n["id"]: n["cores"] for n in status(g)["nodes"]}
    assert by_node[node] == {"total": 2, "reserved": 0, "in_use": 2, "free": 0}, by_node
    assert by_node[1 - node]["in_use"] == 0, by_node


def test_exclusive_one_cpu_holds_both_threads_of_one_core(smt_guest, topo, core_daemon, jobs):
    g = smt_guest
    job = start(g, jobs, "bob", "--exclusive", "--cpu", "1")
    cpus = running_cpuset(g, "bob", job)
    assert cpus in topo.cores, (cpus, topo.cores)
    shown = show(g, "bob", job)
    assert shown["cores"] == [sorted(cpus)] and sorted(shown["held_cpus"]) == sorted(cpus), shown


def test_threads_packed_then_a_reload_into_whole_cores_keeps_them_apart(smt_guest, topo, jobs):
    g = smt_guest
    flags = ("--reserve-cpu", "0", *MEM_FLAGS)
    log = start_daemon(g, *flags, "--cpu-unit", "thread")
    assert "single threads (--cpu-unit thread)" in log, log
    # Per-thread packing: one-CPU jobs of two users until two of them share a core (the first
    # two do where the kernel numbers siblings next to each other).
    got = {}
    users = ("alice", "bob")
    while len(got) < len(topo.node_cpus[0]):
        user = users[len(got) % 2]
        job = start(g, jobs, user, "--cpu", "1")
        got[job] = running_cpuset(g, user, job)
        assert len(got[job]) == 1, got
        if len(topo.cores_of(frozenset().union(*got.values()))) < len(got):
            break
    held = frozenset().union(*got.values())
    assert len(held) == len(got), got                       # no CPU given twice
    shared = len(topo.cores_of(held)) < len(got)
    assert shared, f"per-thread packing gave {got}: no two share a core of {topo.cores}"

    # Into whole cores by a reload, with those jobs running: they are re-adopted where they are,
    # and a new one-CPU job gets a whole core none of them touches.
    log = start_daemon(g, *flags, how="reload")
    assert "whole cores (--cpu-unit core)" in log, log
    assert status(g)["cpu_unit"] == "core"
    for user, job in jobs:
        assert show(g, user, job)["state"] == "running"
        assert parse_cpulist(read(g, f"{job_cgroup(job)}/cpuset.cpus.effective")) == got[job]
    new = start(g, jobs, "alice", "--cpu", "1")
    cpus = running_cpuset(g, "alice", new)
    assert cpus in topo.cores, (cpus, topo.cores)
    assert not cpus & frozenset().union(*topo.cores_of(held)), (cpus, got)
    in_use = sum(n["cores"]["in_use"] for n in status(g)["nodes"])
    assert in_use == len(topo.cores_of(held)) + 1

"""Whole cores as the unit of allocation (resources, report, listing), on the fixture trees.

The machines are read by the real discovery code from tests/fixtures/sysfs
(NUMA nodes and devices/system/cpu): two numberings of SMT siblings (N and
N+ncores on the Xeon and the EPYC, next to each other in the QEMU guest and
the hybrid part), cores of one and of two threads on one part (the hybrid),
and a machine without SMT (the real recording).
"""

import random
from pathlib import Path

import pytest

from hpc_batch.client import listing
from hpc_batch.client.listing import cpu_column, format_show
from hpc_batch.core import gputopo, report
from hpc_batch.core.allocator import Free, allocate
from hpc_batch.core.requestcheck import RequestError, check_request
from hpc_batch.core.resources import (
    Allocation,
    Budget,
    GiB,
    Limits,
    Machine,
    Node,
    Request,
    capacity,
    default_share,
    describe_unit,
)
from hpc_batch.daemon.discovery import read_cpu_topology, read_numa

SYSFS = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"
SMT = ("intel-2s-xeon-gold-6248", "amd-epyc-7502p-nps4", "laptop-1node", "qemu-2s-smt-adjacent",
       "intel-i9-12900k-hybrid")
CORES = Limits(reserve_cpu=2, reserve_mem=0, min_job_mem=0)
THREADS = Limits(reserve_cpu=2, reserve_mem=0, min_job_mem=0, whole_cores=False)


def machine(name, gpus=(), topology=None):
    nodes = read_numa(str(SYSFS / name))
    topo, _ = read_cpu_topology(str(SYSFS / name), [c for n in nodes for c in n.cpus])
    return Machine(nodes, gpus, topology, cpu_topology=topo)


def place(m, req, running=(), limits=CORES):
    return allocate(req, check_request(req, m, limits), m, limits, list(running))


def fill(m, limits, sizes, seed):
    """Start jobs of random sizes until one does not fit; end a random one now and then."""
    rng = random.Random(seed)
    running: list[Allocation] = []
    for _ in range(400):
        if running and rng.random() < 0.3:
            running.pop(rng.randrange(len(running)))
        req = Request(cpus=rng.choice(sizes), mem=GiB)
        try:
            a = place(m, req, running, limits)
        except RequestError:
            continue      # wider than any node of this machine
        if a is not None:
            running.append(a)
    return running


@pytest.mark.parametrize("name", SMT)
@pytest.mark.parametrize("seed", range(3))
def test_no_core_is_ever_split_between_jobs_and_every_job_gets_whole_cores(name, seed):
    m = machine(name)
    topo = m.cpu_topology
    cap = capacity(m, CORES)
    width = cap.widest_unit
    running = fill(m, CORES, (1, 2, 3, 5), seed)
    assert running
    owner: dict[int, int] = {}
    for i, a in enumerate(running):
        for core in topo.cores(a.cpus):
            assert core == topo.siblings(core[0]), f"job {i} holds part of core {topo.siblings(core[0])}"
            for c in core:
                assert owner.setdefault(c, i) == i
        assert a.cores == topo.cores(a.cpus) and a.held == a.cpus
        assert not set(a.cpus) & set(cap.reserved_cpus)
    # No job got a whole unit more than it needed (each asked for at most 5).
    assert all(len(a.cpus) < 5 + width for a in running)


@pytest.mark.parametrize("name", ["intel-2s-xeon-gold-6248", "qemu-2s-smt-adjacent"])
def test_two_one_cpu_jobs_never_get_threads_of_one_core(name):
    m = machine(name)
    a = place(m, Request(cpus=1))
    b = place(m, Request(cpus=1), [a])
    assert len(a.cpus) == len(b.cpus) == 2
    assert a.cpus == m.cpu_topology.siblings(a.cpus[0]) and b.cpus == m.cpu_topology.siblings(b.cpus[0])
    assert not set(a.cpus) & set(b.cpus)


def test_cpu_counts_round_up_to_whole_cores():
    xeon = machine("intel-2s-xeon-gold-6248")
    # --reserve-cpu 2 holds core 0 (CPUs 0 and 40): best fit then puts jobs on node 0, lowest cores first.
    assert place(xeon, Request(cpus=1)).cpus == (1, 41)
    assert place(xeon, Request(cpus=3)).cpus == (1, 2, 41, 42)
    assert place(xeon, Request(cpus=4)).cpus == (1, 2, 41, 42)
    assert place(xeon, Request(cpus=38)).cpus == tuple(range(1, 20)) + tuple(range(41, 60))
    qemu = machine("qemu-2s-smt-adjacent")
    assert place(qemu, Request(cpus=3)).cpus == (4, 5, 6, 7)      # node 0 keeps one core after the reserve
    assert place(qemu, Request(cpus=2)).cpus == (2, 3)


def test_a_hybrid_part_rounds_to_the_cores_it_takes():
    m = machine("intel-i9-12900k-hybrid")
    a = place(m, Request(cpus=15))     # P-cores after the reserve: 7 of 2 threads, then E-cores
    assert a.cpus == tuple(range(2, 17)) and a.cores[-1] == (16,)
    b = place(m, Request(cpus=2), [a])
    assert b.cpus == (17, 18) and b.cores == ((17,), (18,))


def test_a_request_wider_than_any_node_is_refused_naming_cpus_and_cores():
    with pytest.raises(RequestError) as e:
        check_request(Request(cpus=41), machine("intel-2s-xeon-gold-6248"), Limits(reserve_cpu=2))
    assert str(e.value) == "--cpu 41 can never fit: the largest NUMA node offers 40 CPUs (20 whole cores) to jobs"
    with pytest.raises(RequestError, match=r"offers 4 CPUs \(2 whole cores\) to jobs"):
        check_request(Request(cpus=5), machine("qemu-2s-smt-adjacent"), Limits(reserve_cpu=2))


def test_the_default_memory_share_counts_the_threads_held():
    m = machine("intel-2s-xeon-gold-6248")
    floorless = Limits(reserve_cpu=2, reserve_mem=0, min_job_mem=0)
    assert check_request(Request(cpus=1), m, floorless) == Budget(default_share(2, m), True)   # holds 2 threads
    assert check_request(Request(cpus=3), m, floorless) == Budget(default_share(4, m), True)
    assert check_request(Request(cpus=4), m, floorless) == Budget(default_share(4, m), True)
    packed = Limits(reserve_cpu=2, reserve_mem=0, min_job_mem=0, whole_cores=False)
    assert check_request(Request(cpus=1), m, packed) == Budget(default_share(1, m), True)
    assert default_share(2, m) > default_share(1, m)


@pytest.mark.parametrize("reserve, held", [(0, ()), (1, (0, 40)), (2, (0, 40)), (3, (0, 1, 40, 41))])
def test_the_reserve_is_whole_cores_too(reserve, held):
    m = machine("intel-2s-xeon-gold-6248")
    assert capacity(m, Limits(reserve_cpu=reserve)).reserved_cpus == held
    packed = capacity(m, Limits(reserve_cpu=reserve, whole_cores=False)).reserved_cpus
    assert packed == tuple(range(reserve))


def test_the_reserve_leaves_a_one_core_machine_its_core():
    m = machine("qemu-2s-smt-adjacent")
    one = Machine((m.nodes[0].__class__(0, (0, 1), 4 * GiB),), cpu_topology=m.cpu_topology)
    cap = capacity(one, Limits(reserve_cpu=2))
    assert cap.reserved_cpus == () and cap.nodes[0].cpus == (0, 1)


def test_exclusive_jobs_get_whole_cores_or_the_whole_machine():
    m = machine("qemu-2s-smt-adjacent")
    a = place(m, Request(cpus=3, exclusive=True))
    assert len(a.cpus) == 4 and a.cores == ((4, 5), (6, 7)) and a.exclusive
    every = place(m, Request(exclusive=True))
    assert every.cpus == (2, 3, 4, 5, 6, 7)       # all but the reserved core


def test_cpus_beside_gpus_are_whole_cores_of_the_gpus_node():
    text = (SYSFS.parent / "gpu" / "traverse-v100-4-topo.txt").read_text()
    t = gputopo.parse_topo(text)
    topo = gputopo.Topology(t.gpus, t.links, {0: 0, 1: 0, 2: 1, 3: 1})
    m = machine("intel-2s-xeon-gold-6248", gpus=(0, 1, 2, 3), topology=topo)
    first = place(m, Request(cpus=38, gpus=2, numa_local_gpu=True))
    a = place(m, Request(cpus=3, gpus=2, numa_local_gpu=True), [first])
    node_of = {c: n.id for n in m.nodes for c in n.cpus}
    assert {node_of[c] for c in a.cpus} == {topo.numa[a.gpus[0]]}
    assert all(core == m.cpu_topology.siblings(core[0]) for core in a.cores) and len(a.cpus) == 4


def test_packing_threads_lets_two_jobs_share_a_core():
    m = machine("qemu-2s-smt-adjacent")
    limits = Limits(reserve_cpu=0, reserve_mem=0, min_job_mem=0, whole_cores=False)
    a = place(m, Request(cpus=1), limits=limits)
    b = place(m, Request(cpus=1), [a], limits)
    assert (a.cpus, b.cpus) == ((0,), (1,))        # siblings: the old per-thread packing
    assert a.cores == ((0,),) and b.cores == ((1,),)
    assert "single threads (--cpu-unit thread)" in describe_unit(m, limits)


def test_a_machine_without_smt_allocates_exactly_as_before():
    real = machine("dev-container-real")
    bare = Machine(real.nodes)                     # no topology: every CPU a core, the old allocator
    assert not any(len(real.cpu_topology.siblings(c)) > 1 for c in real.cpu_topology.cpus)
    for limits in (Limits(reserve_cpu=0, reserve_mem=0, min_job_mem=0), Limits(reserve_cpu=1, reserve_mem=0)):
        run_real: list[Allocation] = []
        run_bare: list[Allocation] = []
        for req in (Request(cpus=1, mem=GiB), Request(mem=GiB), Request(cpus=1, mem=GiB)):
            a = place(real, req, run_real, limits)
            b = place(bare, req, run_bare, limits)
            assert (a and a.cpus) == (b and b.cpus)
            for run, x in ((run_real, a), (run_bare, b)):
                if x is not None:
                    run.append(x)
        assert check_request(Request(cpus=1), real, limits) == check_request(Request(cpus=1), bare, limits)
    assert "one thread per core here" in describe_unit(real, Limits())


def test_an_old_daemons_allocation_loads_and_its_cores_sibling_is_not_given_away():
    m = machine("qemu-2s-smt-adjacent")
    # As a thread-packing daemon without cores wrote it: CPU 4 alone, no "cores" key.
    old = Allocation.from_dict({"cpus": [4], "mem_by_node": [[1, GiB]], "gpus": [], "exclusive": False})
    assert old.cores == () and old.held == (4,)
    assert Allocation.from_dict(old.to_dict()) == old
    cap = capacity(m, CORES)
    free = Free.of(cap, [old])
    assert 5 in free.cpus[1] and free.free_cpus(1) == 2      # CPU 5 is free, but its core is not whole
    a = place(m, Request(cpus=2), [old])
    assert a.cpus == (2, 3) and 5 not in a.cpus              # node 1's free core (6,7) would also do
    b = place(m, Request(cpus=2), [old, a])
    assert b.cpus == (6, 7)
    assert place(m, Request(cpus=1), [old, a, b]) is None    # only CPU 5 is left, beside a running job
    free.release(old)
    assert free.free_cpus(1) == 4
    fields = report.cpu_fields(m, old)   # cores () here: the machine groups its CPUs
    assert fields == {"cores": [[4]], "held_cpus": [4]}
    assert cpu_column({"cpus": [4], **fields}) == "1/1c"


def test_allocation_records_round_trip_with_their_cores():
    a = place(machine("intel-2s-xeon-gold-6248"), Request(cpus=3))
    d = a.to_dict()
    assert d["cores"] == [[1, 41], [2, 42]]
    assert Allocation.from_dict(d) == a


def test_status_counts_cores_and_threads():
    m = machine("intel-2s-xeon-gold-6248")
    a = place(m, Request(cpus=3))
    st = report.status(m, CORES, [a], "fifo-strict", 0, 0, None)
    n0 = st["nodes"][0]
    assert n0["cpus"] == {"total": 40, "reserved": 2, "in_use": 4, "free": 34}
    assert n0["cores"] == {"total": 20, "reserved": 1, "in_use": 2, "free": 17}
    assert st["nodes"][1]["cores"] == {"total": 20, "reserved": 0, "in_use": 0, "free": 20}
    assert st["cpu_unit"] == "core"
    lines = listing.format_status(st)
    assert lines[3].split()[:3] == ["0", "40/2/4/34", "20/1/2/17"]
    assert lines[-2] == "CPUs are handed out in whole cores: a job gets every thread of its cores"
    assert report.status(m, THREADS, [], "fifo-strict", 0, 0, None)["cpu_unit"] == "thread"


def test_why_a_job_waits_names_cpus_and_cores():
    m = machine("qemu-2s-smt-adjacent")
    big = place(m, Request(cpus=4))
    free = Free.of(capacity(m, CORES), [big])
    why = report.why_waiting(Request(cpus=3), Budget(GiB, True), 1, None, free, "fifo-strict", {})
    assert why == "it needs 4 CPUs (2 whole cores) on one NUMA node; the most free on one is 2 CPUs (1 whole core)"


def test_show_and_list_name_the_cores():
    m = machine("intel-2s-xeon-gold-6248")
    a = place(m, Request(cpus=3))
    job = {"id": 1, "user": "alice", "command": "x", "state": "running", "started": 0.0, "max_time": 60,
           "mem": GiB, "cpus": list(a.cpus), **report.cpu_fields(m, a)}
    assert cpu_column(job) == "4/2c"
    assert "cores: 2 (1+41,2+42; 2 threads each)" in format_show(job, 0.0)


def test_the_startup_line_names_the_unit_and_the_reserved_cpus():
    m = machine("intel-2s-xeon-gold-6248")
    line = describe_unit(m, Limits())
    assert line.startswith("CPU allocation: whole cores (--cpu-unit core)")
    assert line.endswith("reserved for the OS (--reserve-cpu 2): CPUs 0,40")
    assert describe_unit(m, Limits(whole_cores=False)).endswith("(--reserve-cpu 2): CPUs 0-1")


def test_the_daemon_flag_defaults_to_cores():
    from hpc_batch import defaults
    from hpc_batch.daemon import main as daemon
    assert daemon.parse_args([]).cpu_unit == defaults.CPU_UNIT == "core"
    assert daemon.parse_args(["--cpu-unit", "thread"]).cpu_unit == "thread"
    with pytest.raises(daemon.ConfigError) as e:
        daemon.parse_args(["--cpu-unit", "socket"])
    assert e.value.status == 2 and "choose core or thread" in str(e.value)


def test_the_startup_line_says_why_the_reserve_holds_another_count_than_asked():
    two_cpus = Machine((Node(0, (0, 1), 4 * GiB),))            # no SMT: each CPU a core of its own
    assert describe_unit(two_cpus, Limits(reserve_cpu=2)).endswith(
        "(--reserve-cpu 2): CPUs 0 (only 1 of 2: the machine's last core is left to jobs)")
    assert describe_unit(two_cpus, Limits(reserve_cpu=2, whole_cores=False)).endswith(
        "CPUs 0 (only 1 of 2: the machine's last CPU is left to jobs)")
    assert describe_unit(two_cpus, Limits(reserve_cpu=1)).endswith("(--reserve-cpu 1): CPUs 0")
    xeon = machine("intel-2s-xeon-gold-6248")
    assert describe_unit(xeon, Limits(reserve_cpu=1)).endswith(
        "(--reserve-cpu 1): CPUs 0,40 (1 rounded up to whole cores)")
    two_nodes = Machine((Node(0, (0, 1), 4 * GiB), Node(1, (2, 3), 4 * GiB)))
    assert describe_unit(two_nodes, Limits(reserve_cpu=3, whole_cores=False)).endswith(
        "CPUs 0-1 (only 2 of 3: the reserve comes from the lowest NUMA node with CPUs, which has no more)")
    one_core = Machine((Node(0, (0,), 4 * GiB),))
    assert describe_unit(one_core, Limits(reserve_cpu=2)).endswith(
        "CPUs none (only 0 of 2: the machine's last core is left to jobs)")

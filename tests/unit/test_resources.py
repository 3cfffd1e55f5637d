"""Unit tests for hpc_batch.core.resources, requestcheck and allocator: budgets, reserves, placement."""

import json

import pytest

from hpc_batch.core.allocator import Free, allocate
from hpc_batch.core.requestcheck import RequestError, check_request, why_never_fits
from hpc_batch.core.resources import Allocation, Budget, GiB, Limits, Machine, Node, Request, capacity, default_share
from hpc_batch.core.sizes import format_size

NO_RESERVE = Limits(reserve_cpu=0, reserve_mem=0)


def node(i, first, count, mem_gib):
    return Node(i, tuple(range(first, first + count)), mem_gib * GiB)


# 32 cores on a 256 GiB node: the spec's default-share example.
ONE32 = Machine((node(0, 0, 32, 256),))
# Two 16-core nodes of 64 GiB each.
TWO16 = Machine((node(0, 0, 16, 64), node(1, 16, 16, 64)), gpus=(0, 1, 2, 3))
# Nodes with different memory per core: 4 GiB/core and 8 GiB/core.
UNEVEN = Machine((node(0, 0, 16, 64), node(1, 16, 16, 128)))
TINY = Machine((node(0, 0, 2, 4),))


@pytest.mark.parametrize(
    "machine, req, limits, expected",
    [
        # The spec: 4 of 32 cores on a 256 GiB node is 32 GiB.
        (ONE32, Request(cpus=4), NO_RESERVE, Budget(32 * GiB, True)),
        # The share uses the node before the reserve is taken off.
        (ONE32, Request(cpus=4), Limits(), Budget(32 * GiB, True)),
        # --cpu omitted means one core.
        (ONE32, Request(), NO_RESERVE, Budget(8 * GiB, True)),
        # 1 of 64 cores on 64 GiB is 1 GiB: floored at min_job_mem (2 GiB).
        (Machine((node(0, 0, 64, 64),)), Request(cpus=1), Limits(), Budget(2 * GiB, True)),
        # A share above the floor is kept as it is.
        (ONE32, Request(cpus=1), Limits(min_job_mem=4 * GiB), Budget(8 * GiB, True)),
        # --max-mem wins, even below the floor.
        (ONE32, Request(cpus=1, mem=GiB), Limits(min_job_mem=4 * GiB), Budget(GiB, False)),
        # Uneven nodes: the smallest per-core share (4 GiB/core).
        (UNEVEN, Request(cpus=2), NO_RESERVE, Budget(8 * GiB, True)),
        # Exclusive without --max-mem: all job memory (256 - 2 GiB reserve).
        (ONE32, Request(exclusive=True), Limits(), Budget(254 * GiB, True)),
        (TWO16, Request(cpus=2, exclusive=True), NO_RESERVE, Budget(128 * GiB, True)),
        # Exclusive + --numa-local: all of the largest node.
        (UNEVEN, Request(cpus=2, exclusive=True, numa_local=True), NO_RESERVE, Budget(128 * GiB, True)),
        # A floor the machine cannot honour is capped at what it offers.
        (TINY, Request(), Limits(min_job_mem=8 * GiB), Budget(2 * GiB, True)),
        # Pool mode gives the same default share.
        (ONE32, Request(cpus=4), Limits(per_node_memory=False), Budget(32 * GiB, True)),
    ],
)
def test_check_request_budget(machine, req, limits, expected):
    assert check_request(req, machine, limits) == expected


def test_default_share_arithmetic():
    assert default_share(4, ONE32) == 32 * GiB
    assert default_share(3, UNEVEN) == 12 * GiB


@pytest.mark.parametrize(
    "machine, limits, node_cpus, node_mem, reserved",
    [
        # Lowest CPU ids of node 0 are held back, with 2 GiB of its memory.
        (ONE32, Limits(), {0: tuple(range(2, 32))}, {0: 254 * GiB}, (0, 1)),
        # Only the lowest-numbered node pays; node 1 keeps its full width.
        (TWO16, Limits(), {0: tuple(range(2, 16)), 1: tuple(range(16, 32))},
         {0: 62 * GiB, 1: 64 * GiB}, (0, 1)),
        # Node order in the Machine does not matter.
        (Machine((node(1, 16, 16, 64), node(0, 0, 16, 64))), Limits(reserve_cpu=1),
         {0: tuple(range(1, 16)), 1: tuple(range(16, 32))}, {0: 62 * GiB, 1: 64 * GiB}, (0,)),
        # Never more than half a node's memory.
        (TWO16, Limits(reserve_mem=100 * GiB), {0: tuple(range(2, 16)), 1: tuple(range(16, 32))},
         {0: 32 * GiB, 1: 64 * GiB}, (0, 1)),
        # A 2-core machine keeps one core for jobs.
        (TINY, Limits(), {0: (1,)}, {0: 2 * GiB}, (0,)),
        # Two nodes of two cores: node 0 gives both, node 1 keeps its full width.
        (Machine((Node(0, (0, 1), 4 * GiB), Node(1, (2, 3), 4 * GiB))), Limits(),
         {0: (), 1: (2, 3)}, {0: 2 * GiB, 1: 4 * GiB}, (0, 1)),
        # Allowed CPUs need not start at 0: the lowest ones present go.
        (Machine((Node(0, (4, 5, 6, 7), 8 * GiB),)), Limits(), {0: (6, 7)}, {0: 6 * GiB}, (4, 5)),
        # A memory-only node 0 has no cores to give: node 1 is the reserve node.
        (Machine((Node(0, (), 64 * GiB), node(1, 0, 8, 32))), Limits(),
         {0: (), 1: tuple(range(2, 8))}, {0: 64 * GiB, 1: 30 * GiB}, (0, 1)),
    ],
)
def test_capacity_reserve(machine, limits, node_cpus, node_mem, reserved):
    cap = capacity(machine, limits)
    assert {n.id: n.cpus for n in cap.nodes} == node_cpus
    assert {n.id: n.mem for n in cap.nodes} == node_mem
    assert cap.reserved_cpus == reserved


@pytest.mark.parametrize(
    "machine, req, limits, message",
    [
        (ONE32, Request(cpus=64), Limits(),
         "--cpu 64 can never fit: the largest NUMA node offers 30 cores to jobs"),
        (ONE32, Request(cpus=31), Limits(),
         "--cpu 31 can never fit: the largest NUMA node offers 30 cores to jobs"),
        (ONE32, Request(mem=300 * GiB), Limits(),
         "--max-mem 300G can never fit: the machine offers 254G to jobs"),
        (TWO16, Request(mem=100 * GiB, numa_local=True), NO_RESERVE,
         "--max-mem 100G with --numa-local can never fit: the largest NUMA node offers 64G to jobs"),
        (TWO16, Request(gpus=5), NO_RESERVE, "--gpu-cores 5 can never fit: this machine has 4 GPUs"),
        (ONE32, Request(gpus=1), NO_RESERVE, "--gpu-cores 1 can never fit: this machine has no GPUs"),
        (ONE32, Request(cpus=0), NO_RESERVE, "--cpu must be at least 1 (got 0)"),
        (ONE32, Request(cpus=-3), NO_RESERVE, "--cpu must be at least 1 (got -3)"),
        (ONE32, Request(mem=0), NO_RESERVE, "--max-mem must be a positive amount"),
        (ONE32, Request(gpus=-1), NO_RESERVE, "--gpu-cores cannot be negative (got -1)"),
        (TWO16, Request(exclusive=True, numa_local=True), NO_RESERVE,
         "--exclusive --numa-local needs --cpu on a multi-node machine: "
         "without it the job takes every core of every node"),
        (Machine(()), Request(), NO_RESERVE, "no job can fit: this machine offers no cores to jobs"),
    ],
)
def test_never_fit_refusals(machine, req, limits, message):
    with pytest.raises(RequestError) as e:
        check_request(req, machine, limits)
    assert str(e.value) == message
    assert "\n" not in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize(
    "req",
    [
        Request(cpus=30),              # exactly the widest node after reserve
        Request(mem=254 * GiB),        # exactly the machine's job memory
        Request(cpus=1, mem=1),        # tiny explicit budget
    ],
)
def test_limits_are_inclusive(req):
    assert check_request(req, ONE32, Limits()).mem >= 1


def test_why_never_fits_checks_the_fixed_budget():
    # Budget fixed on a bigger machine; the machine has since shrunk.
    reason = why_never_fits(Request(), Budget(200 * GiB, True), TWO16, NO_RESERVE)
    assert reason == "its memory budget of 200G can never fit: the machine offers 128G to jobs"
    assert why_never_fits(Request(), Budget(8 * GiB, True), TWO16, NO_RESERVE) is None
    assert why_never_fits(Request(gpus=9), Budget(GiB, True), TWO16, NO_RESERVE).startswith("--gpu-cores 9")


def alloc(cpus, mem_by_node, gpus=(), exclusive=False):
    # Machines here have no known topology: each CPU is a core of its own.
    return Allocation(tuple(cpus), tuple(mem_by_node), tuple(gpus), exclusive, tuple((c,) for c in cpus))


def place(machine, req, running=(), limits=NO_RESERVE, mem=None, numa_only=False):
    budget = Budget(mem, False) if mem is not None else check_request(req, machine, limits)
    return allocate(req, budget, machine, limits, list(running), numa_only=numa_only)


def test_cpus_come_after_the_reserve_and_after_running_jobs():
    a = place(ONE32, Request(cpus=4), limits=Limits())
    assert a == alloc((2, 3, 4, 5), ((0, 32 * GiB),))
    b = place(ONE32, Request(cpus=4), running=[a], limits=Limits())
    assert b.cpus == (6, 7, 8, 9)


def test_best_fit_node_keeps_the_empty_node_whole():
    busy = alloc(range(0, 12), ((0, 8 * GiB),))  # node 0 has 4 free cores left
    a = place(TWO16, Request(cpus=4), running=[busy])
    assert a.cpus == (12, 13, 14, 15)
    assert a.mems == (0,)


def test_does_not_fit_now():
    full = alloc(range(0, 32), ((0, GiB), (1, GiB)))
    assert place(TWO16, Request(cpus=1), running=[full]) is None
    # Enough cores in total (8 + 8) but never on one node.
    split = alloc(list(range(0, 8)) + list(range(16, 24)), ((0, GiB), (1, GiB)))
    assert place(TWO16, Request(cpus=10), running=[split]) is None
    assert place(TWO16, Request(cpus=8), running=[split]) is not None


def test_spreads_a_budget_no_single_node_holds():
    a = place(TWO16, Request(cpus=4, mem=100 * GiB))
    assert a.mem_by_node == ((0, 64 * GiB), (1, 36 * GiB))
    assert a.mems == (0, 1)
    assert a.mem == 100 * GiB
    assert a.spread is True
    assert set(a.cpus) <= set(range(16)) or set(a.cpus) <= set(range(16, 32))


def test_prefers_a_local_node_over_spreading():
    # Node 0 has 30 GiB free, node 1 has 50 GiB: 40 GiB goes local on node 1.
    running = [alloc((0,), ((0, 34 * GiB),)), alloc((16,), ((1, 14 * GiB),))]
    a = place(TWO16, Request(cpus=2), running=running, mem=40 * GiB)
    assert a.mem_by_node == ((1, 40 * GiB),)
    assert a.cpus == (17, 18)
    assert a.spread is False


@pytest.mark.parametrize(
    "req, numa_only, expect_spread",
    [
        (Request(cpus=2, mem=40 * GiB), False, True),
        (Request(cpus=2, mem=40 * GiB, numa_local=True), False, None),
        (Request(cpus=2, mem=40 * GiB), True, None),
    ],
)
def test_numa_local_refuses_to_spread(req, numa_only, expect_spread):
    # Both nodes have 30 GiB free: 40 GiB only fits spread.
    running = [alloc((0,), ((0, 34 * GiB),)), alloc((16,), ((1, 34 * GiB),))]
    budget = Budget(req.mem, False)
    a = allocate(req, budget, TWO16, NO_RESERVE, running, numa_only=numa_only)
    if expect_spread is None:
        assert a is None
    else:
        assert a.spread and a.mem == 40 * GiB
        # The CPU node keeps most of the budget local: it is charged all it has.
        home = 0 if a.cpus[0] < 16 else 1
        assert dict(a.mem_by_node)[home] == 30 * GiB


def test_spread_job_runs_on_the_node_holding_most_of_its_memory():
    # Node 0 has 20 GiB free, node 1 has 50 GiB: 60 GiB is mostly on node 1.
    running = [alloc((0,), ((0, 44 * GiB),)), alloc((16,), ((1, 14 * GiB),))]
    a = place(TWO16, Request(cpus=2), running=running, mem=60 * GiB)
    assert a.mem_by_node == ((0, 10 * GiB), (1, 50 * GiB))
    assert a.cpus == (17, 18)


def test_waits_when_total_memory_is_short():
    running = [alloc((0,), ((0, 60 * GiB),)), alloc((16,), ((1, 60 * GiB),))]
    assert place(TWO16, Request(cpus=1), running=running, mem=10 * GiB) is None
    assert place(TWO16, Request(cpus=1), running=running, mem=8 * GiB) is not None


def test_gpus_lowest_free_first():
    running = [alloc((0,), ((0, GiB),), gpus=(0, 2))]
    assert place(TWO16, Request(gpus=2), running=running).gpus == (1, 3)
    assert place(TWO16, Request(gpus=3), running=running) is None
    assert place(TWO16, Request()).gpus == ()


def test_exclusive_takes_the_idle_machine():
    req = Request(exclusive=True)
    a = place(TWO16, req, limits=Limits())
    assert a.exclusive is True
    assert a.cpus == tuple(range(2, 32))
    assert a.mem_by_node == ((0, 62 * GiB), (1, 64 * GiB))
    assert place(TWO16, req, running=[alloc((5,), ((0, GiB),))]) is None


def test_exclusive_with_cpu_count_uses_one_node_and_all_memory():
    a = place(TWO16, Request(cpus=4, exclusive=True))
    assert len(a.cpus) == 4 and len({c // 16 for c in a.cpus}) == 1
    assert a.mem == 128 * GiB and a.exclusive
    # Even with room for its cores, it waits while anything else runs.
    small = alloc((20,), ((1, GiB),))
    assert place(TWO16, Request(cpus=4, exclusive=True), running=[small], mem=GiB) is None


def test_nothing_fits_while_an_exclusive_job_runs():
    ex = alloc((0,), ((0, GiB),), exclusive=True)
    assert place(TWO16, Request(cpus=1), running=[ex], mem=GiB) is None
    assert place(TWO16, Request(exclusive=True), running=[ex]) is None


POOL = Limits(reserve_cpu=0, reserve_mem=0, per_node_memory=False)


def test_no_cgroups_single_pool_is_never_spread():
    a = place(TWO16, Request(cpus=2), limits=POOL, mem=100 * GiB)
    assert len(a.mem_by_node) == 1 and a.spread is False
    assert a.mem_by_node[0] == (0 if a.cpus[0] < 16 else 1, 100 * GiB)


def test_no_cgroups_pool_counts_memory_machine_wide():
    # 60 GiB charged to node 0: node 0 alone could not hold 60 more, the pool can.
    running = [alloc((0,), ((0, 60 * GiB),))]
    assert place(TWO16, Request(cpus=1), running=running, limits=POOL, mem=60 * GiB) is not None
    assert place(TWO16, Request(cpus=1), running=running, limits=POOL, mem=69 * GiB) is None
    # --numa-local has nothing to refuse in pool mode.
    a = place(TWO16, Request(cpus=1, numa_local=True), running=running, limits=POOL, mem=68 * GiB)
    assert a is not None and not a.spread


def test_no_cgroups_exclusive_is_one_entry():
    a = place(TWO16, Request(exclusive=True), limits=POOL)
    assert a.mem_by_node == ((0, 128 * GiB),)
    assert len(a.cpus) == 32


def test_running_allocations_outside_capacity_are_ignored():
    # Reserved CPU 0 and a vanished node 7 must not break accounting.
    ghost = alloc((0, 200), ((7, 4 * GiB),), gpus=(9,))
    assert place(ONE32, Request(cpus=30), running=[ghost], limits=Limits(), mem=GiB).cpus == tuple(range(2, 32))


@pytest.mark.parametrize(
    "a",
    [
        alloc((2, 3), ((0, 32 * GiB),)),
        alloc((16, 17), ((0, 64 * GiB), (1, 36 * GiB)), gpus=(1, 3)),
        alloc(range(32), ((0, 128 * GiB),), exclusive=True),
    ],
)
def test_allocation_json_round_trip(a):
    d = json.loads(json.dumps(a.to_dict()))
    assert Allocation.from_dict(d) == a


def test_allocation_properties():
    a = alloc((16,), ((1, 3 * GiB), (0, 5 * GiB)))
    assert a.mems == (0, 1)
    assert a.mem == 8 * GiB
    assert a.spread is True
    assert alloc((1,), ((0, GiB),)).spread is False


@pytest.mark.parametrize(
    "n, text",
    [(32 * GiB, "32G"), (GiB + GiB // 2, "1.5G"), (512 << 20, "512M"), (4096, "4K"), (0, "0 bytes"),
     ((77 << 20) + (1 << 19) - 1, "77M"), (1500, "1K"),
     (3 << 40, "3T")],
)
def test_format_size(n, text):
    assert format_size(n) == text


# Free is the per-pass view the scheduler reuses; its shortcuts must not lie.
SPLIT = Machine((node(0, 0, 8, 64), node(1, 8, 8, 64)))


def split_free():
    """Node 0: 6 free cores, 4 GiB free. Node 1: 2 free cores, 60 GiB free."""
    running = [alloc((0, 1), ((0, 60 * GiB),)), alloc(range(8, 14), ((1, 4 * GiB),))]
    return Free.of(capacity(SPLIT, NO_RESERVE), running)


@pytest.mark.parametrize(
    "first, second, home",
    [
        # Same cores, smaller budget: the first failure must not veto it.
        ((6, 8 * GiB), (6, 4 * GiB), 0),
        # Same budget, fewer cores: fits on node 1.
        ((6, 8 * GiB), (2, 8 * GiB), 1),
    ],
)
def test_free_remembers_only_the_exact_failed_shape(first, second, home):
    free = split_free()
    assert free.fit(Request(cpus=first[0], numa_local=True), Budget(first[1], False)) is None
    assert free.fit(Request(cpus=first[0], numa_local=True), Budget(first[1], False)) is None
    a = free.fit(Request(cpus=second[0], numa_local=True), Budget(second[1], False))
    assert a is not None and a.mems == (home,)


def test_free_forgets_failures_when_resources_are_released():
    free = split_free()
    req, budget = Request(cpus=6, numa_local=True), Budget(8 * GiB, False)
    assert free.fit(req, budget) is None
    free.release(alloc((0, 1), ((0, 60 * GiB),)))
    a = free.fit(req, budget)
    assert a is not None and a.mems == (0,)


def test_free_take_and_release_are_inverse():
    free = split_free()
    before = free.to_dict()
    a = free.fit(Request(cpus=2), Budget(8 * GiB, False))
    free.take(a)
    assert free.to_dict() != before
    free.release(a)
    assert free.to_dict() == before
    assert Free.from_dict(free.cap, json.loads(json.dumps(before))).to_dict() == before


# -- GPUs placed by topology (a recorded topo -m: two NV3 pairs on NUMA nodes 0 and 8) ----------

def _gpu_machine():
    from pathlib import Path

    from hpc_batch.core import gputopo
    text = (Path(__file__).resolve().parent.parent / "fixtures" / "gpu" / "traverse-v100-4-topo.txt").read_text()
    topo = gputopo.parse_topo(text)
    nodes = (Node(0, tuple(range(0, 4)), 64 << 30), Node(8, tuple(range(4, 8)), 64 << 30))
    return Machine(nodes, (0, 1, 2, 3), topo)


GPU_LIMITS = Limits(reserve_cpu=0, reserve_mem=0, min_job_mem=1 << 30)


def _fit(req, running=()):
    machine = _gpu_machine()
    budget = check_request(req, machine, GPU_LIMITS)
    return allocate(req, budget, machine, GPU_LIMITS, running)


def test_a_gpu_pair_is_a_linked_pair_and_its_cpus_sit_next_to_it():
    one = _fit(Request(gpus=1))
    assert one.gpus == (0,) and set(one.cpus) <= set(range(4))
    pair = _fit(Request(gpus=2), [one])
    assert pair.gpus == (2, 3)                     # not 1,2 across the socket
    assert set(pair.cpus) <= set(range(4, 8))      # on node 8, where the pair hangs off
    assert pair.mems == (8,)


def test_gpu_link_waits_and_numa_local_gpu_insists():
    busy = _fit(Request(gpus=1, cpus=1))           # GPU 0, node 0
    other = _fit(Request(gpus=1, cpus=1), [busy])  # GPU 1: the {0,1} pair was already broken
    assert other.gpus == (1,)
    assert _fit(Request(gpus=2, gpu_link="NV"), [busy, other]).gpus == (2, 3)
    third = _fit(Request(gpus=1), [busy, other])   # GPU 2
    assert third.gpus == (2,)
    assert _fit(Request(gpus=2, gpu_link="NV"), [busy, third]) is None      # only 1 and 3 left: SYS
    assert _fit(Request(gpus=2), [busy, third]).gpus == (1, 3)              # without the flag, it runs
    local = _fit(Request(gpus=1, numa_local_gpu=True, cpus=3), [busy])     # node 0 has 3 cores left
    assert local.gpus == (1,) and set(local.cpus) == {1, 2, 3}
    wide = _fit(Request(gpus=1, numa_local_gpu=True, cpus=4), [busy])      # only node 8 has 4 free
    assert wide.gpus == (2,) and set(wide.cpus) == set(range(4, 8))


@pytest.mark.parametrize("req,needle", [
    (Request(gpus=2, gpu_link="NV4"), "can never be met: the closest 2 GPUs here are linked by NV3"),
    (Request(gpus=3, gpu_link="NV"), "can never be met"),
    (Request(gpus=3, numa_local_gpu=True), "--numa-local-gpu can never be met"),
    (Request(gpus=0, gpu_link="NV"), "--gpu-cores"),
    (Request(gpus=2, gpu_link="QPI"), "--gpu-link"),
])
def test_gpu_placement_that_can_never_be_met_is_refused(req, needle):
    with pytest.raises(RequestError, match=needle.replace("(", r"\(")):
        check_request(req, _gpu_machine(), GPU_LIMITS)


def test_without_topology_gpu_placement_flags_are_refused_and_gpus_go_in_index_order():
    machine = Machine((Node(0, (0, 1), 8 << 30),), (0, 1, 2))
    with pytest.raises(RequestError, match="wired is unknown"):
        check_request(Request(gpus=1, gpu_link="NV"), machine, GPU_LIMITS)
    budget = check_request(Request(gpus=2), machine, GPU_LIMITS)
    assert allocate(Request(gpus=2), budget, machine, GPU_LIMITS, []).gpus == (0, 1)

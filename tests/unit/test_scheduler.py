"""Unit tests for hpc_batch.core.scheduler: the three policies, simulated in time."""

import json
import time
from dataclasses import dataclass

import pytest

from hpc_batch.core.requestcheck import check_request
from hpc_batch.core.resources import Allocation, Budget, GiB, Limits, Machine, Node, Request
from hpc_batch.core.scheduler import POLICIES, QueuedJob, RunningJob, schedule

LIMITS = Limits(reserve_cpu=0, reserve_mem=0, min_job_mem=GiB)
# 16 cores, 64 GiB, 4 GPUs: the spec's running example machine.
GPU4 = Machine((Node(0, tuple(range(16)), 64 * GiB),), gpus=(0, 1, 2, 3))
CPU8 = Machine((Node(0, tuple(range(8)), 64 * GiB),))


@dataclass
class Job:
    id: int
    req: Request
    max_time: float = 100.0
    runtime: float | None = None   # defaults to max_time
    submit: float = 0.0


def queued(job, machine=GPU4, limits=LIMITS):
    return QueuedJob(job.id, job.req, check_request(job.req, machine, limits), job.max_time)


def simulate(policy, jobs, machine=GPU4, limits=LIMITS, *, via_json=False, drop_state_at=None):
    """Event-driven run: returns (start time per job id, failures, log of passes).

    At every submission or completion the queue is scheduled once, as the
    daemon does. ``via_json`` passes the state through json between passes
    (a daemon restart each time); ``drop_state_at`` forgets it at that time.
    """
    pending = sorted(jobs, key=lambda j: (j.submit, j.id))
    queue, running, ends = [], [], {}
    starts, failures, log, state = {}, {}, [], {}
    t = 0.0
    while pending or queue or running:
        times = [j.submit for j in pending] + list(ends.values())
        if not times:
            break  # queued jobs that can never start and no events left
        t = min(times)
        for r in [r for r in running if ends[r.id] <= t]:
            running.remove(r)
            del ends[r.id]
        while pending and pending[0].submit <= t:
            queue.append(queued(pending.pop(0), machine, limits))
        if drop_state_at is not None and t == drop_state_at:
            state = {}
        if via_json:
            state = json.loads(json.dumps(state))
        d = schedule(policy, queue, running, machine, limits, state, t)
        state = d.state
        log.append((t, [(i, a.to_dict()) for i, a in d.starts], d.failures, json.dumps(state, sort_keys=True)))
        by_id = {j.id: j for j in jobs}
        for jid, alloc in d.starts:
            starts[jid] = t
            job = by_id[jid]
            running.append(RunningJob(jid, alloc, t + job.max_time))
            ends[jid] = t + (job.runtime if job.runtime is not None else job.max_time)
        for jid, reason in d.failures:
            failures[jid] = reason
        gone = {jid for jid, _ in d.starts} | {jid for jid, _ in d.failures}
        queue = [q for q in queue if q.id not in gone]
    return starts, failures, log


def spec_example(max_times=(100, 100, 100, 100, 100), runtimes=(10, 10, 30, 50, 10)):
    """GPU demands [1, 4, 2, 1, 2] for jobs 1..5, all submitted at t=0."""
    return [Job(i + 1, Request(gpus=g), m, r) for i, (g, m, r) in enumerate(zip((1, 4, 2, 1, 2), max_times, runtimes))]


@pytest.mark.parametrize(
    "policy, first_starts",
    [
        ("fifo-strict", [1]),             # job 2 blocks jobs 3-5
        ("easy-backfill", [1, 3, 4]),     # 1+2+1 = 4 GPUs, job 2 reserved
        ("strict-backfill", [1, 3, 4]),   # all finish by job 2's reserved start
    ],
)
def test_spec_example_first_pass(policy, first_starts):
    queue = [queued(j) for j in spec_example()]
    d = schedule(policy, queue, [], GPU4, LIMITS, {}, 0.0)
    assert [i for i, _ in d.starts] == first_starts
    assert d.failures == []
    gpus = [g for _, a in d.starts for g in a.gpus]
    assert len(gpus) == len(set(gpus))  # no GPU handed out twice


def test_fifo_strict_never_overtakes():
    starts, _, _ = simulate("fifo-strict", spec_example())
    order = sorted(starts, key=lambda i: (starts[i], i))
    assert order == [1, 2, 3, 4, 5]
    assert starts[2] == 10  # job 2 starts as soon as job 1 ends
    assert starts[3] > starts[2]


def test_easy_backfill_holds_freed_gpus_for_the_head():
    # Job 6 (1 GPU) arrives while job 2 is blocked; freed GPUs are held.
    jobs = spec_example() + [Job(6, Request(gpus=1), 100, 10, submit=5)]
    starts, failures, log = simulate("easy-backfill", jobs)
    assert failures == {}
    assert (starts[1], starts[3], starts[4]) == (0, 0, 0)
    # Job 1 frees a GPU at 10 and job 3 two more at 30: all held, until job 4
    # ends at 50 and all four are free for job 2.
    assert starts[2] == 50
    assert starts[6] > starts[2]
    state_at_10 = json.loads([s for t, _, _, s in log if t == 10][0])
    assert state_at_10["head"] == 2 and state_at_10["budget"]["gpus"] == []


def test_easy_backfill_state_is_what_holds_resources():
    jobs = spec_example() + [Job(6, Request(gpus=1), 100, 10, submit=5)]
    # Forgetting the frozen budget when job 1 ends lets job 6 jump the head.
    starts, _, _ = simulate("easy-backfill", jobs, drop_state_at=10)
    assert starts[6] == 10


def test_easy_backfill_budget_serves_later_submissions_then_runs_out():
    # 8 cores; job 1 holds 4 for long. Head job 2 wants all 8: budget = 4 idle.
    jobs = [
        Job(1, Request(cpus=4), 1000, 1000),
        Job(2, Request(cpus=8), 100, 100, submit=1),
        Job(3, Request(cpus=2), 10, 10, submit=2),   # fits the budget (4 -> 2)
        Job(4, Request(cpus=2), 500, 500, submit=3),  # fits the rest (2 -> 0)
        Job(5, Request(cpus=2), 10, 10, submit=20),   # job 3's cores are held: waits
    ]
    starts, _, _ = simulate("easy-backfill", jobs, machine=CPU8)
    assert starts[3] == 2 and starts[4] == 3
    assert starts[2] == 1000  # job 1 ended at 1000; job 4 ended at 503
    assert starts[5] > starts[2]


def test_easy_backfill_budget_is_dropped_when_the_head_starts_or_leaves():
    queue = [queued(j) for j in spec_example()]
    running = [RunningJob(9, Allocation((0,), ((0, GiB),), (0,), False), 100.0)]
    d = schedule("easy-backfill", queue[1:], running, GPU4, LIMITS, {}, 0.0)
    assert d.state["head"] == 2
    # Job 2 was removed (killed) from the queue: job 3 is the head now and
    # the old budget does not apply to it.
    d2 = schedule("easy-backfill", queue[2:], running, GPU4, LIMITS, d.state, 1.0)
    assert [i for i, _ in d2.starts] == [3, 4]
    assert d2.state["head"] == 5
    # Everything started: nothing is blocked, no state is kept.
    d3 = schedule("easy-backfill", queue[2:4], [], GPU4, LIMITS, d2.state, 2.0)
    assert d3.state == {}


@pytest.mark.parametrize(
    "state",
    [
        {"policy": "easy-backfill", "head": 2, "budget": "garbage"},
        {"policy": "easy-backfill", "head": 2, "budget": {"pool": True, "cpus": [], "mem": [], "gpus": []}},
        {"policy": "strict-backfill", "head": 2, "start": 5.0},
        {"policy": "easy-backfill", "head": 99, "budget": {"pool": False, "cpus": [], "mem": [], "gpus": []}},
    ],
)
def test_easy_backfill_refreezes_on_unusable_state(state):
    # Unreadable, other-mode, other-policy or other-head state: freeze anew.
    queue = [queued(j) for j in spec_example()]
    running = [RunningJob(1, Allocation((0,), ((0, GiB),), (0,), False), 100.0)]
    d = schedule("easy-backfill", queue[1:], running, GPU4, LIMITS, state, 0.0)
    assert [i for i, _ in d.starts] == [3, 4]
    assert d.state["head"] == 2 and d.state["budget"]["gpus"] == []


def test_strict_backfill_spec_example():
    # Job 1 holds a GPU until t=100, so job 2 is reserved for t=100.
    jobs = [
        Job(1, Request(gpus=1), 100, 100),
        Job(2, Request(gpus=4), 100, 100),
        Job(3, Request(gpus=2), 50, 50),     # short: done by 50, may backfill
        Job(4, Request(gpus=1), 500, 500),   # long: would still run at 100
        Job(5, Request(gpus=2), 30, 30),     # short, fits once job 3 is done
    ]
    starts, failures, log = simulate("strict-backfill", jobs)
    assert failures == {}
    assert json.loads(log[0][3])["start"] == 100
    assert starts[3] == 0
    assert starts[5] == 50  # backfills into idle GPUs after job 2 blocked
    assert starts[2] == 100  # exactly the reserved start: never delayed
    assert starts[4] >= starts[2] + 100  # refused, runs after job 2
    # Easy-backfill would have let the long job in at once.
    easy, _, _ = simulate("easy-backfill", jobs)
    assert easy[4] == 0


def test_strict_backfill_counts_jobs_started_in_the_same_pass():
    queue = [queued(Job(1, Request(gpus=2), 300)), queued(Job(2, Request(gpus=4), 100)),
             queued(Job(3, Request(gpus=1), 400)), queued(Job(4, Request(gpus=1), 200))]
    d = schedule("strict-backfill", queue, [], GPU4, LIMITS, {}, 1000.0)
    assert d.state["start"] == 1300.0  # when job 1, started now, ends
    assert [i for i, _ in d.starts] == [1, 4]


def test_strict_backfill_reservation_never_slips_later():
    queue = [queued(Job(2, Request(gpus=4), 100)), queued(Job(3, Request(gpus=1), 80))]
    running = [RunningJob(1, Allocation((0,), ((0, GiB),), (0,), False), 100.0)]
    fresh = schedule("strict-backfill", queue, running, GPU4, LIMITS, {}, 0.0)
    assert [i for i, _ in fresh.starts] == [3]
    kept = {"policy": "strict-backfill", "head": 2, "start": 50.0}
    d = schedule("strict-backfill", queue, running, GPU4, LIMITS, kept, 0.0)
    assert d.starts == [] and d.state["start"] == 50.0
    # A reservation of another head, or another policy's state, is ignored.
    other = schedule("strict-backfill", queue, running, GPU4, LIMITS, dict(kept, head=7), 0.0)
    assert [i for i, _ in other.starts] == [3]


def test_strict_backfill_reserves_the_earliest_deadline_that_frees_enough():
    # Running jobs are not passed in deadline order.
    running = [RunningJob(1, Allocation((0,), ((0, GiB),), (0, 1), False), 300.0),
               RunningJob(2, Allocation((1,), ((0, GiB),), (2, 3), False), 100.0)]
    queue = [queued(Job(3, Request(gpus=2), 100)), queued(Job(4, Request(cpus=1), 200))]
    d = schedule("strict-backfill", queue, running, GPU4, LIMITS, {}, 0.0)
    assert d.state["start"] == 100.0
    assert d.starts == []  # job 4 would run until 200


def test_strict_backfill_reservation_for_a_head_short_of_local_memory():
    # Head wants 6 cores and 8 GiB on one node: node 0 has the cores but no
    # memory until job 1 ends at 40; node 1 has memory but not the cores.
    two = Machine((Node(0, tuple(range(8)), 64 * GiB), Node(1, tuple(range(8, 16)), 64 * GiB)))
    running = [RunningJob(1, Allocation((0, 1), ((0, 60 * GiB),), (), False), 40.0),
               RunningJob(2, Allocation(tuple(range(8, 14)), ((1, 4 * GiB),), (), False), 90.0)]
    queue = [QueuedJob(3, Request(cpus=6, numa_local=True), Budget(8 * GiB, False), 100),
             QueuedJob(4, Request(cpus=2), Budget(GiB, False), 30),
             QueuedJob(5, Request(cpus=2), Budget(GiB, False), 60)]
    d = schedule("strict-backfill", queue, running, two, LIMITS, {}, 0.0)
    assert d.state["start"] == 40.0
    assert [i for i, _ in d.starts] == [4]


def test_strict_backfill_overrunning_job_blocks_backfill():
    # Job 1's deadline has passed but it still runs: the head is due now.
    queue = [queued(Job(2, Request(gpus=4), 100)), queued(Job(3, Request(gpus=1), 1))]
    running = [RunningJob(1, Allocation((0,), ((0, GiB),), (0,), False), 90.0)]
    d = schedule("strict-backfill", queue, running, GPU4, LIMITS, {}, 95.0)
    assert d.starts == [] and d.state["start"] == 95.0


def test_strict_backfill_behind_an_exclusive_job():
    ex = RunningJob(1, Allocation(tuple(range(16)), ((0, 64 * GiB),), (), True), 500.0)
    queue = [queued(Job(2, Request(cpus=1), 10)), queued(Job(3, Request(cpus=1), 10))]
    d = schedule("strict-backfill", queue, [ex], GPU4, LIMITS, {}, 0.0)
    assert d.starts == [] and d.state == {"policy": "strict-backfill", "head": 2, "start": 500.0}


@pytest.mark.parametrize("policy", POLICIES)
def test_state_survives_json_round_trip(policy):
    jobs = spec_example(max_times=(100, 100, 50, 500, 30), runtimes=(100, 100, 50, 500, 30))
    jobs += [Job(6, Request(gpus=1), 20, 20, submit=5), Job(7, Request(cpus=4), 10, 10, submit=60)]
    direct = simulate(policy, jobs)
    restarted = simulate(policy, jobs, via_json=True)
    assert restarted == direct
    if policy != "fifo-strict":
        assert any(s != "{}" for _, _, _, s in direct[2])  # state was really used


@pytest.mark.parametrize("policy", POLICIES)
def test_head_that_can_never_start_fails_instead_of_blocking(policy):
    # The job was accepted on a 4-GPU machine; the machine now has 2.
    shrunk = Machine(GPU4.nodes, gpus=(0, 1))
    big = QueuedJob(1, Request(gpus=4), Budget(GiB, True), 100)
    small = QueuedJob(2, Request(gpus=1), Budget(GiB, True), 100)
    d = schedule(policy, [big, small], [], shrunk, LIMITS, {}, 0.0)
    assert d.failures == [(1, "--gpu-cores 4 can never fit: this machine has 2 GPUs")]
    assert [i for i, _ in d.starts] == [2]


@pytest.mark.parametrize("policy", POLICIES)
def test_head_whose_budget_no_longer_fits_fails(policy):
    q = [QueuedJob(1, Request(), Budget(100 * GiB, True), 100)]
    d = schedule(policy, q, [], GPU4, LIMITS, {}, 0.0)
    assert d.starts == []
    assert d.failures == [(1, "its memory budget of 100G can never fit: the machine offers 64G to jobs")]


def test_only_the_head_is_failed():
    # A never-fitting job behind a merely blocked head waits its turn.
    running = [RunningJob(9, Allocation(tuple(range(16)), ((0, GiB),), (), False), 10.0)]
    q = [QueuedJob(1, Request(), Budget(GiB, True), 100), QueuedJob(2, Request(gpus=9), Budget(GiB, True), 100)]
    d = schedule("fifo-strict", q, running, GPU4, LIMITS, {}, 0.0)
    assert d.failures == [] and d.starts == []


@pytest.mark.parametrize(
    "cpus, started",
    [
        ([4, 4, 1], [1, 2]),      # the third does not fit: 8 cores used
        ([4, 8, 1], [1]),         # job 3 would fit but job 2 blocks it
        ([2, 2, 2, 2], [1, 2, 3, 4]),
    ],
)
def test_fifo_strict_table(cpus, started):
    q = [queued(Job(i + 1, Request(cpus=c)), CPU8) for i, c in enumerate(cpus)]
    d = schedule("fifo-strict", q, [], CPU8, LIMITS, {}, 0.0)
    assert [i for i, _ in d.starts] == started
    assert d.state == {}


@pytest.mark.parametrize("policy", POLICIES)
def test_exclusive_waits_and_then_blocks(policy):
    q = [queued(Job(1, Request(exclusive=True)), CPU8), queued(Job(2, Request(cpus=1)), CPU8)]
    busy = [RunningJob(9, Allocation((0,), ((0, GiB),), (), False), 50.0)]
    d = schedule(policy, q, busy, CPU8, LIMITS, {}, 0.0)
    assert 1 not in [i for i, _ in d.starts]
    idle = schedule(policy, q, [], CPU8, LIMITS, {}, 60.0)
    assert [i for i, _ in idle.starts] == [1]  # job 2 waits for the exclusive job


def test_pool_mode_schedules_machine_wide_memory():
    two = Machine((Node(0, tuple(range(4)), 16 * GiB), Node(1, tuple(range(4, 8)), 16 * GiB)))
    pool = Limits(reserve_cpu=0, reserve_mem=0, per_node_memory=False)
    q = [QueuedJob(1, Request(cpus=1), Budget(20 * GiB, False), 10),
         QueuedJob(2, Request(cpus=1), Budget(12 * GiB, False), 10)]
    d = schedule("fifo-strict", q, [], two, pool, {}, 0.0)
    assert [i for i, _ in d.starts] == [1, 2]
    assert all(len(a.mem_by_node) == 1 for _, a in d.starts)
    per_node = schedule("fifo-strict", q, [], two, LIMITS, {}, 0.0)
    assert per_node.starts[0][1].spread  # the same 20 GiB must spread per node


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown scheduling policy 'lifo'"):
        schedule("lifo", [], [], GPU4, LIMITS, {}, 0.0)


@pytest.mark.parametrize("policy", POLICIES)
def test_pass_over_many_blocked_jobs_stays_cheap(policy):
    # Guards against quadratic behaviour; the real figures are in bench/.
    running = [RunningJob(0, Allocation((0,), ((0, GiB),), (0, 1), False), 1e9)]
    q = [queued(Job(i, Request(cpus=2, gpus=3))) for i in range(1, 10_001)]
    t0 = time.perf_counter()
    d = schedule(policy, q, running, GPU4, LIMITS, {}, 0.0)
    assert time.perf_counter() - t0 < 1.0
    assert d.starts == []


@pytest.mark.parametrize("policy", POLICIES)
def test_a_queue_given_as_an_iterator_is_scheduled_as_the_same_list_is(policy):
    jobs = [queued(Job(i, Request(cpus=c))) for i, c in enumerate([4, 8, 8, 2, 4, 1], 1)]
    running = [RunningJob(99, Allocation(tuple(range(6)), ((0, 8 * GiB),), (), False), 50.0)]
    as_list = schedule(policy, jobs, running, GPU4, LIMITS, {}, 0.0)
    as_iter = schedule(policy, iter(jobs), running, GPU4, LIMITS, {}, 0.0)
    assert as_iter == as_list and as_list.starts   # something started, and the same


def test_fifo_strict_reads_the_queue_no_further_than_its_blocked_head():
    read = []

    def queue():   # 3 start, the 4th blocks; a 5th read would be a read of all 100,000
        for i in range(1, 100_001):
            read.append(i)
            yield queued(Job(i, Request(cpus=16 if i == 4 else 4)))

    d = schedule("fifo-strict", queue(), [], GPU4, LIMITS, {}, 0.0)
    assert [jid for jid, _ in d.starts] == [1, 2, 3] and read == [1, 2, 3, 4]

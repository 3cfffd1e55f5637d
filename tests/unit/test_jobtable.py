"""JobTable: one move changes a job's state and every index derived from it (pure: no store, no engine).

Each test checks the table's indexes against what its jobs' records say
(``derived``, worked out here from the records alone), so an index that a
move forgets to update fails whichever move forgot it.
"""

import copy
import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc_batch.core.jobrequest import JobRequest
from hpc_batch.core.jobs import (
    CANCELLED,
    EXITED,
    FINISHED,
    KILLED,
    QUEUED,
    RUNNING,
    STATES,
    TRANSITIONS,
    WAITING,
    BadMove,
    Job,
    Result,
)
from hpc_batch.core.jobtable import JobTable, Running
from hpc_batch.core.resources import Allocation

T = 1_800_000_000.0
ALLOC = Allocation(cpus=(0, 1), mem_by_node=((0, 1 << 20),), gpus=(), exclusive=False)


def job(job_id, state=QUEUED, uid=0, after=(), name=None, limit=None, strict=False, **kw):
    return Job(id=job_id, uid=uid, gid=uid, user=f"u{uid}", argv=["true"], cwd="/", submitted=T, max_time=60,
               budget={"mem": 1 << 20}, state=state, after=list(after), name=name,
               array={"first": job_id, "index": 0, "limit": limit} if limit else None,
               request=JobRequest.from_dict({"cpus": 2, "benchmark": "strict" if strict else None}),
               result=Result(CANCELLED) if state == FINISHED else None, **kw)


def derived(t: JobTable) -> dict:
    """Every index, as the job records alone say it should be."""
    out = {"queued": set(), "running": set(), "waiting": set(), "held": {}, "capped": 0, "strict": 0,
           "finished": {}, "followers": {}, "names": {}}
    for job_id, j in t.jobs.items():
        if j.state in (QUEUED, WAITING):
            out["held"][j.uid] = out["held"].get(j.uid, 0) + 1
        if j.state == QUEUED:
            out["queued"].add(job_id)
            out["capped"] += bool(j.array and j.array.get("limit"))
            out["strict"] += j.request.benchmark == "strict"
        elif j.state == RUNNING:
            out["running"].add(job_id)
        elif j.state == WAITING:
            out["waiting"].add(job_id)
            for dep in j.after:
                out["followers"][dep] = out["followers"].get(dep, 0) + 1
        else:
            out["finished"].setdefault(j.uid, set()).add(job_id)
        if j.name is not None:
            out["names"].setdefault((j.uid, j.name), []).append(job_id)
    out["names"] = {k: sorted(v) for k, v in out["names"].items()}
    return out


def indexes(t: JobTable) -> dict:
    """Every index, as the table keeps it."""
    finished: dict = {}
    for uid in set(t.finished_by_uid):
        ids = list(t.finished_by_uid.get(uid, ()))
        assert len(ids) == len(set(ids)), f"user {uid}'s finished jobs indexed twice"
        if ids:
            finished[uid] = set(ids)
    for heap in t.finished_by_uid.values():
        assert all(heap[(k - 1) // 2] <= heap[k] for k in range(1, len(heap))), "not a heap"
    return {"queued": set(t.queued), "running": set(t.running), "waiting": set(t.waiting),
            "held": dict(t.held_by_uid), "capped": t.capped_queued, "strict": t.strict_queued,
            "finished": finished, "followers": {k: len(v) for k, v in t.followers.items()},
            "names": {k: list(v) for k, v in t.names.items()}}


def agree(t: JobTable) -> None:
    assert indexes(t) == derived(t)
    assert all(q.id == i and q.max_time == t.jobs[i].max_time for i, q in t.queued.items())
    assert all(r.alloc == t.jobs[i].alloc for i, r in t.running.items())
    assert list(t.in_order()) == sorted(t.queued)
    for dep, followers in t.dependents.items():   # only unended jobs have dependents, and only waiting ones
        assert t.jobs[dep].state != FINISHED and followers <= t.waiting


def world() -> JobTable:
    """A table with jobs in every state, for two users: bystanders a move must leave alone."""
    t = JobTable()
    t.add(job(1, FINISHED, uid=1, name="a"))
    t.add(job(2, uid=1, name="a", limit=2))
    t.add(job(3, uid=2, strict=True))
    t.add(job(4))
    t.add(job(5, WAITING, uid=2, after=[2, 1]))
    t.move(t.jobs[4], RUNNING, T, running=Running(ALLOC))
    return t


def put(t: JobTable, state: str, job_id: int = 10, **kw) -> Job:
    """Add a job and walk it into *state* through the table."""
    j = job(job_id, WAITING if state == WAITING else QUEUED, after=[2] if state == WAITING else (), **kw)
    t.add(j)
    if state in (RUNNING, FINISHED):
        t.move(j, RUNNING, T, running=Running(ALLOC, cgroup="/cg"))
    if state == FINISHED:
        t.move(j, FINISHED, T, Result(EXITED, code=0))
    return j


def test_adding_indexes_each_state():
    t = world()
    agree(t)
    assert t.dependents == {2: {5}}            # job 1 has ended: its end is not waited for
    assert t.names == {(1, "a"): [1, 2]} and t.user_ids == {"u1": 1, "u2": 2, "u0": 0}
    with pytest.raises(BadMove):
        t.add(job(3))


@pytest.mark.parametrize("src,dst", sorted(TRANSITIONS))
@pytest.mark.parametrize("capped,strict", [(False, False), (True, False), (False, True)])
def test_every_move_the_life_cycle_allows_moves_every_index(src, dst, capped, strict):
    for kind in sorted(TRANSITIONS[(src, dst)]) or [None]:
        t = world()
        j = put(t, src, limit=3 if capped else None, strict=strict)
        handles = t.running.get(j.id)
        gone = t.move(j, dst, T + 1, Result(kind) if kind else None,
                      Running(ALLOC) if dst == RUNNING else None)
        assert j.state == dst
        assert gone is handles and (gone is not None) == (src == RUNNING)
        agree(t)


@pytest.mark.parametrize("src,dst", [(s, d) for s in STATES for d in STATES if (s, d) not in TRANSITIONS])
def test_a_move_the_life_cycle_refuses_changes_nothing(src, dst):
    t = world()
    j = put(t, src)
    before = copy.deepcopy((indexes(t), j))
    with pytest.raises(BadMove):
        t.move(j, dst, T + 1, Result(KILLED) if dst == FINISHED else None,
               Running(ALLOC) if dst == RUNNING else None)
    assert (indexes(t), j) == before


@pytest.mark.parametrize("how", ["no handles", "handles elsewhere", "no result", "a result too many",
                                 "not in the table"])
def test_a_malformed_move_changes_nothing(how):
    t = world()
    queued, running = t.jobs[2], t.jobs[4]
    before = copy.deepcopy(indexes(t))
    with pytest.raises(BadMove):
        if how == "no handles":
            t.move(queued, RUNNING, T)
        elif how == "handles elsewhere":
            t.move(running, QUEUED, T, running=Running(ALLOC))
        elif how == "no result":
            t.move(running, FINISHED, T)
        elif how == "a result too many":
            t.move(running, QUEUED, T, Result(KILLED))
        else:
            t.move(copy.copy(queued), RUNNING, T, running=Running(ALLOC))   # the same id, another record
    assert indexes(t) == before and queued.state == QUEUED and running.state == RUNNING


def test_a_job_put_back_takes_its_place_in_submission_order():
    t = JobTable()
    for i in (1, 2, 3):
        t.add(job(i))
    t.move(t.jobs[1], RUNNING, T, running=Running(ALLOC))
    t.move(t.jobs[1], QUEUED, T)                  # its start could not be written
    assert list(t.queued) == [2, 3, 1] and not t.queue_sorted
    assert list(t.in_order()) == [1, 2, 3] and t.queue_sorted
    agree(t)


def test_a_released_job_stays_counted_and_keeps_its_queue_place():
    t = JobTable()
    t.add(job(1))
    t.add(job(2, WAITING, after=[1]))
    t.add(job(3))
    assert t.held_by_uid == {0: 3}
    t.move(t.jobs[1], RUNNING, T, running=Running(ALLOC))
    t.move(t.jobs[1], FINISHED, T, Result(EXITED, code=0))
    assert t.take_dependents(1) == {2} and t.take_dependents(1) == set()   # handed out once
    t.move(t.jobs[2], QUEUED, T)
    assert t.held_by_uid == {0: 2} and list(t.in_order()) == [2, 3]
    agree(t)


def test_a_refresh_changes_a_queued_job_in_its_place():
    t = world()
    t.jobs[2].max_time = 999
    t.refresh(t.jobs[2])
    t.refresh(t.jobs[4])                          # running: nothing to refresh
    assert t.queued[2].max_time == 999 and list(t.in_order()) == [2, 3]
    agree(t)


def test_a_followed_job_is_evicted_in_its_turn_and_its_followers_are_named():
    """G1: no finished job is kept back past --keep-finished for the waiting jobs that name it
    (the engine has each keep how it ended); ``followers`` says which they are."""
    t = JobTable()
    t.add(job(1, FINISHED))
    t.add(job(2, FINISHED))
    t.add(job(3, WAITING, after=[1]))
    t.add(job(4, WAITING, after=[1, 1]))          # named twice: let go once, no error
    assert t.followers == {1: {3, 4}}
    assert t.take_evictable(0, keep=0) == [1, 2]
    t.forget([t.jobs[1], t.jobs[2]])
    assert t.finished_by_uid == {} and t.followers == {1: {3, 4}}
    t.move(t.jobs[3], FINISHED, T, Result(CANCELLED))
    t.move(t.jobs[4], FINISHED, T, Result(CANCELLED))
    assert t.followers == {}
    agree(t)


def test_evictable_jobs_put_back_stay_in_line():
    t = JobTable()
    for i in (1, 2, 3):
        t.add(job(i, FINISHED))
    taken = t.take_evictable(0, keep=1)
    assert taken == [1, 2]
    t.put_back(0, taken)                          # the id floor could not be saved: they stay
    agree(t)
    assert t.take_evictable(0, keep=1) == [1, 2]


def test_forgetting_withdraws_jobs_in_every_state_from_every_index():
    t = world()
    ids = [put(t, s, job_id=10 + k, name="w").id for k, s in enumerate(STATES)]
    t.forget([t.jobs[i] for i in ids])
    assert not set(ids) & set(t.jobs) and (0, "w") not in t.names
    agree(t)
    t.forget([t.jobs[i] for i in list(t.jobs)])
    assert indexes(t) == indexes(JobTable()) and not t.dependents
    assert [i for i in t.ids_after(0) if i in t.jobs] == []   # (removed ids may linger until swept)


def test_an_evicted_job_leaves_the_others_in_line():
    t = JobTable()
    for i in (5, 3, 4, 1):
        t.add(job(i, FINISHED, name="n"))
    gone = t.take_evictable(0, keep=2)
    t.forget([t.jobs[i] for i in gone])
    assert gone == [1, 3] and t.names == {(0, "n"): [4, 5]}
    assert [heapq.heappop(t.finished_by_uid[0]) for _ in range(2)] == [4, 5]


def test_handles_attach_only_to_a_running_job():
    t = JobTable()
    t.add(job(1, RUNNING, started=T, alloc=ALLOC))   # loaded at start-up: no handles yet
    t.add(job(2))
    assert t.running == {}
    handles = Running(ALLOC, pid=42)
    t.attach(t.jobs[1], handles)
    with pytest.raises(BadMove):
        t.attach(t.jobs[2], Running(ALLOC))
    assert t.running == {1: handles} and t.detach(1) is handles and t.detach(1) is None
    assert t.move(t.jobs[1], FINISHED, T, Result(KILLED)) is None   # ended with its handles gone


MOVES = st.lists(st.tuples(st.integers(0, 7), st.sampled_from(STATES), st.sampled_from([EXITED, CANCELLED, KILLED])),
                 max_size=40)


@settings(max_examples=150, deadline=None)
@given(MOVES, st.lists(st.integers(0, 2), min_size=8, max_size=8))
def test_any_walk_of_moves_keeps_every_index(moves, uids):
    t = JobTable()
    for i, uid in enumerate(uids):
        t.add(job(i + 1, WAITING if i % 3 == 2 else QUEUED, uid=uid, after=[i] if i % 3 == 2 else (),
                  limit=2 if i % 4 == 1 else None, strict=i % 5 == 0, name="x" if i % 2 else None))
    for k, to, kind in moves:
        j = t.jobs.get(k + 1)
        if j is None:
            continue
        allowed = TRANSITIONS.get((j.state, to))
        result = Result(kind) if to == FINISHED else None
        if allowed is None or (to == FINISHED and kind not in allowed):
            with pytest.raises(BadMove):
                t.move(j, to, T, result, Running(ALLOC) if to == RUNNING else None)
        else:
            t.move(j, to, T, result, Running(ALLOC) if to == RUNNING else None)
            if to == FINISHED:
                t.take_dependents(j.id)
                t.forget([t.jobs[i] for i in t.take_evictable(j.uid, keep=1)])
        agree(t)

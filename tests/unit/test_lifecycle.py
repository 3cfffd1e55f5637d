"""The job life cycle: one table, walked move by move; dependencies; wait's exit statuses."""

import itertools

import pytest

from hpc_batch.core import dependencies, jobs
from hpc_batch.core.jobs import (
    CANCELLED,
    DEPENDENCY_FAILED,
    ERROR,
    EXITED,
    FINISHED,
    KILLED,
    LOST,
    OOM,
    QUEUED,
    RESULTS,
    RUNNING,
    SIGNALLED,
    STATES,
    TIMEOUT,
    TRANSITIONS,
    WAITING,
    BadMove,
    Job,
    Result,
)
from hpc_batch.core.resources import Allocation

T = 1_800_000_000.0
ALLOC = Allocation(cpus=(0,), mem_by_node=(), gpus=(), exclusive=False)


def job(state=QUEUED, **kw):
    base = dict(id=1, uid=0, gid=0, user="root", argv=["true"], cwd="/", submitted=T, max_time=60,
                budget={"mem": 1 << 20}, state=state)
    base.update(kw)
    return Job(**base)


@pytest.mark.parametrize("src,dst", list(itertools.product(STATES, STATES)))
def test_every_move_the_table_allows_and_only_those(src, dst):
    allowed = TRANSITIONS.get((src, dst))
    results = sorted(allowed) if allowed else [None]
    for kind in results:
        j = job(src, started=T if src == RUNNING else None, alloc=ALLOC if src == RUNNING else None,
                result=Result(CANCELLED) if src == FINISHED else None)
        result = Result(kind) if kind else None
        if allowed is None:
            with pytest.raises(BadMove):
                jobs.move(j, dst, T + 1, result)
            continue
        jobs.move(j, dst, T + 1, result, alloc=ALLOC if dst == RUNNING else None)
        assert j.state == dst
        if dst == FINISHED:
            assert j.result.kind == kind and j.ended == T + 1
        if dst == RUNNING:
            assert j.started == T + 1
        if dst == QUEUED:
            assert j.started is None and j.alloc is None
        j.check()   # every state reached carries the data it needs


def test_finished_is_final_and_results_fit_their_state():
    assert not any(src == FINISHED for src, _ in TRANSITIONS)
    with pytest.raises(BadMove):
        jobs.move(job(QUEUED), FINISHED, T, Result(EXITED, code=0))      # a job that never ran did not exit
    with pytest.raises(BadMove):
        jobs.move(job(RUNNING, started=T, alloc=ALLOC), FINISHED, T, Result(CANCELLED))
    with pytest.raises(BadMove):
        jobs.move(job(QUEUED), RUNNING, T, Result(EXITED))                  # only finishing carries a result
    assert set().union(*TRANSITIONS.values()) == set(RESULTS)              # every result is reachable


@pytest.mark.parametrize("result,status", [
    (Result(EXITED, code=0), 0), (Result(EXITED, code=3), 3), (Result(SIGNALLED, signal=11), 139),
    (Result(KILLED), 240), (Result(TIMEOUT), 241), (Result(OOM), 242), (Result(ERROR), 243),
    (Result(CANCELLED), 244), (Result(DEPENDENCY_FAILED), 245), (Result(LOST), 246), (None, 246),
])
def test_wait_status(result, status):
    assert jobs.wait_status(result) == status


def test_a_record_out_of_step_with_its_state_is_refused():
    with pytest.raises(ValueError, match="finished job needs its result"):
        job(FINISHED).check()
    with pytest.raises(ValueError, match="name"):
        job(name="12").check()
    with pytest.raises(ValueError, match="after"):
        job(after=[0]).check()


@pytest.mark.parametrize("field,value,said", [
    ("alloc", {"cpus": "not a list", "mem_by_node": [], "gpus": [], "exclusive": False}, "alloc is not an allocation"),
    ("alloc", {"cpus": [0]}, "alloc is not an allocation"),
    ("alloc", [0, 1], "alloc must be an object"),
    ("result", {"kind": "vanished"}, "result must be an object with a known kind"),
    ("result", "exited", "result must be an object with a known kind"),
    ("result", {"kind": EXITED, "code": "0"}, "result.code"),
    ("result", {"kind": SIGNALLED, "signal": True}, "result.signal"),
    ("result", {"kind": ERROR, "note": 7}, "result.note must be text"),
])
def test_a_stored_allocation_or_result_that_is_not_one_is_refused_naming_it(field, value, said):
    state = {"alloc": RUNNING, "result": FINISHED}[field]
    good = job(state, started=T, ended=T + 1 if state == FINISHED else None,
               alloc=ALLOC if state == RUNNING else None,
               result=Result(EXITED, code=0) if state == FINISHED else None)
    data = good.to_dict()
    assert Job.from_dict(data) == good
    with pytest.raises(ValueError, match=said):
        Job.from_dict(data | {field: value})


def test_dependencies():
    done = {2: job(FINISHED, id=2, result=Result(EXITED, code=0)),
            3: job(FINISHED, id=3, result=Result(EXITED, code=1)),
            4: job(RUNNING, id=4, started=T, alloc=ALLOC)}
    find = done.get
    assert dependencies.evaluate(job(WAITING, after=[2]), find) == (dependencies.READY, None)
    verdict, why = dependencies.evaluate(job(WAITING, after=[2, 4]), find)
    assert verdict == dependencies.PENDING and "job 4" in why
    verdict, why = dependencies.evaluate(job(WAITING, after=[4, 3], after_ok=True), find)
    assert verdict == dependencies.FAILED and "job 3" in why and "exit 1" not in why and "ended 1" in why
    assert dependencies.evaluate(job(WAITING, after=[3]), find)[0] == dependencies.READY   # however it ended
    assert dependencies.evaluate(job(WAITING, after=[99]), find)[0] == dependencies.READY
    assert dependencies.evaluate(job(WAITING, after=[99], after_ok=True), find)[0] == dependencies.FAILED

"""Admission (daemon/admission.py), case by case: a submit in, its terms or the refusal out.

The checks run in a fixed order, so each refusal row breaks one rule and the
ordering rows break two: the first in that order is the one the user is told.
"""

import pytest
from enginefakes import make_config, make_machine

from hpc_batch.core.jobs import EXITED, FINISHED, QUEUED, RUNNING, WAITING, Job, Result
from hpc_batch.daemon import admission
from hpc_batch.daemon.refusal import Refused
from hpc_batch.wire.protocol import NewJob

MACHINE, LIMITS = make_machine(cpus=2)
CFG = make_config("/nonexistent", max_queued_per_user=3, max_job_size=1 << 16, max_lifetime=3600)
BIG = ("x" * (1 << 17),)


def _admit(*, uid=1000, daemon_uid=0, root_mode=True, held=0, short=None, **kw):
    req = NewJob(**{"argv": ("true",), "cwd": "/home/a", **kw})
    return admission.admit(CFG, MACHINE, LIMITS, uid=uid, daemon_uid=daemon_uid, root_mode=root_mode, held=held,
                           short_of_room=short, req=req)


# (what is wrong, the submit, the refusal's code, words it must hold)
REFUSED_CASES = [
    ("another user, in user mode", {"uid": 1000, "daemon_uid": 500, "root_mode": False}, "forbidden",
     "only accepts jobs from that user"),
    ("--max-time past --max-lifetime", {"max_time": 7200}, "refused", "(--max-lifetime)"),
    ("a command too large", {"argv": BIG}, "too_large", "--max-job-size"),
    ("the state disk short of room", {"short": "the disk is full"}, "busy", "the disk is full"),
    ("the user's cap reached", {"held": 3}, "queue_full", "you already have 3 queued or waiting"),
    ("an array past the cap", {"held": 1, "array": (1, 2, 3)}, "queue_full", "these 3 jobs would make 4"),
    ("more cpus than the machine", {"cpus": 64}, "never_fits", "never fit"),
    # two rules broken: the first in the order is named
    ("user mode before the max time", {"root_mode": False, "daemon_uid": 1, "max_time": 7200}, "forbidden", ""),
    ("the max time before the size", {"max_time": 7200, "argv": BIG}, "refused", "--max-lifetime"),
    ("the size before the disk", {"argv": BIG, "short": "full"}, "too_large", ""),
    ("the disk before the cap", {"short": "full", "held": 3}, "busy", "full"),
    ("the cap before the fit", {"held": 3, "cpus": 64}, "queue_full", ""),
]


@pytest.mark.parametrize("kw, code, words", [c[1:] for c in REFUSED_CASES], ids=[c[0] for c in REFUSED_CASES])
def test_a_submit_is_refused_for_the_first_rule_it_breaks(kw, code, words):
    with pytest.raises(Refused) as info:
        _admit(**kw)
    assert info.value.code == code and words in str(info.value)


# (what is asked, the submit, (max_time, jobs, bulk, shared argv), request fields it must hold)
ADMITTED_CASES = [
    ("a plain job: the lifetime is its max time", {}, (3600, 1, False, None), {"numa_local": False}),
    ("its own max time", {"max_time": 60}, (60, 1, False, None), {}),
    ("user mode, its own user", {"uid": 7, "daemon_uid": 7, "root_mode": False}, (3600, 1, False, None), {}),
    ("--benchmark keeps memory local", {"benchmark": "warn"}, (3600, 1, False, None),
     {"numa_local": True, "benchmark": "warn"}),
    ("an array shares its argv", {"array": (1, 2)}, (3600, 2, True, ["true"]), {}),
    ("--commands: one argv each", {"commands": ("a", "b"), "argv": ()}, (3600, 2, True, None), {}),
    ("one command as --commands is still a bulk", {"commands": ("a",), "argv": ()}, (3600, 1, True, None), {}),
    ("--record is kept in the request", {"record_to": "/r", "record_env": True}, (3600, 1, False, None),
     {"record_to": "/r", "record_is_dir": False, "record_env": True}),
    ("--notify too", {"notify": {"forms": ["tty"], "command": None}}, (3600, 1, False, None),
     {"notify": {"forms": ["tty"], "command": None}}),
]


@pytest.mark.parametrize("kw, terms, fields", [c[1:] for c in ADMITTED_CASES], ids=[c[0] for c in ADMITTED_CASES])
def test_an_admitted_submit_has_its_terms(kw, terms, fields):
    adm = _admit(**kw)
    assert (adm.max_time, len(adm.elements), adm.bulk, adm.shared_argv) == terms
    stored = adm.wanted.to_dict()
    assert {k: stored.get(k) for k in fields} == fields
    assert ("record_to" in stored) == ("record_to" in fields)   # kept out of the usual job's record
    assert adm.budget.mem > 0


def test_the_maker_numbers_the_jobs_and_names_their_output():
    req = NewJob(argv=("run",), cwd="/home/a", array=(4, 9), array_limit=1, name="sweep")
    adm = admission.admit(CFG, MACHINE, LIMITS, uid=1000, daemon_uid=0, root_mode=True, held=0,
                          short_of_room=None, req=req)
    make = admission.Maker(req, adm, 1000, 100, "alice", 20, [5, 3, 5], 7.0)
    jobs = [make(k) for k in range(2)]
    assert [(j.id, j.array) for j in jobs] == [(20, {"first": 20, "index": 4, "limit": 1, "count": 2}),
                                               (21, {"first": 20, "index": 9, "limit": 1, "count": 2})]
    assert jobs[0].argv is jobs[1].argv   # an array's argv list is one, stored once
    assert (jobs[0].output, jobs[0].after, jobs[0].state, jobs[0].user, jobs[0].gid) == \
        ("/home/a/output.20.log", [3, 5], WAITING, "alice", 100)
    assert jobs[0].budget == {"mem": adm.budget.mem, "assigned": adm.budget.assigned}


@pytest.mark.parametrize("output, is_dir, no_output, want", [
    (None, True, False, "/home/a/output.1.log"),
    ("/data", True, False, "/data/output.1.log"),
    ("/data/run.log", False, False, "/data/run.log"),
    ("/data", True, True, None),
])
def test_a_jobs_output_goes_where_it_was_asked_to(output, is_dir, no_output, want):
    req = NewJob(argv=("run",), cwd="/home/a", output=output, output_is_dir=is_dir, no_output=no_output)
    adm = admission.admit(CFG, MACHINE, LIMITS, uid=1000, daemon_uid=0, root_mode=True, held=0,
                          short_of_room=None, req=req)
    job = admission.Maker(req, adm, 1000, 100, "alice", 1, [], 0.0)(0)
    assert (job.output, job.state, job.array) == (want, QUEUED, None)


def _dep(job_id, state, result=None):
    return Job(id=job_id, uid=1000, gid=1000, user="a", argv=["true"], cwd="/", submitted=0.0, max_time=60,
               state=state, result=result)


DEPS = {1: _dep(1, QUEUED), 2: _dep(2, FINISHED, Result(EXITED, code=0)),
        3: _dep(3, FINISHED, Result(EXITED, code=2)), "prep": _dep(4, RUNNING)}


def _lookup(ref):
    if ref not in DEPS:
        raise Refused(f"no such job: {ref}", "not_found")
    return DEPS[ref]


# (the submit's --after refs, --after-ok, the ids, or (code, words) of the refusal)
DEPENDENCY_CASES = [
    ("ids and names, in the order given", (2, "prep", 1), False, [2, 4, 1]),
    ("--after starts it however that one ended", (3,), False, [3]),
    ("--after-ok after a job that exited 0", (2, 1), True, [2, 1]),
    ("--after-ok after one that failed: it could never start", (1, 3), True, ("finished", "--after-ok 3: job 3")),
    ("an unknown job, refused with the flag and the lookup's code", (1, 9), False,
     ("not_found", "--after 9: no such job: 9")),
]


@pytest.mark.parametrize("after, ok, want", [c[1:] for c in DEPENDENCY_CASES], ids=[c[0] for c in DEPENDENCY_CASES])
def test_the_jobs_a_submit_follows(after, ok, want):
    req = NewJob(argv=("run",), cwd="/", after=after, after_ok=ok)
    if isinstance(want, list):
        assert admission.dependencies(req, _lookup) == want
        return
    with pytest.raises(Refused) as info:
        admission.dependencies(req, _lookup)
    assert (info.value.code, str(info.value).startswith(want[1])) == (want[0], True)

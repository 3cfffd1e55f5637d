"""The engine's decisions, with its store, launcher and server replaced by in-memory ones.

No daemon, no sockets, no processes: a job "runs" when the fake launcher
says it was spawned, and "ends" when the test writes its exit record and
tells the engine its shepherd exited, exactly as the server would. What is
checked is what the engine decides: start or queue, refuse and why, ask a
shepherd to stop (never signal), what result a record means, and that one
job's trouble ends that job only.
"""

import json
import os
import pwd
import types

import pytest
from enginefakes import ROOT, T0, FakeLauncher, Hooks, MemoryStore, TurnEngine, answered

from hpc_batch import defaults
from hpc_batch.core import jobs, resources
from hpc_batch.daemon import deadlines, devdir
from hpc_batch.daemon import ending as ending_mod
from hpc_batch.daemon.access import Caller
from hpc_batch.daemon.engine import Engine
from hpc_batch.daemon.main import Config
from hpc_batch.daemon.refusal import Refused
from hpc_batch.wire.protocol import NewJob
from shepherd.base import records


@pytest.fixture
def world(tmp_path):
    fake = FakeLauncher()
    store = MemoryStore(tmp_path)
    cfg = Config(socket="/x", state_dir=str(tmp_path), dev_dir=None, max_lifetime=3600, reserve_cpu=0,
                 reserve_mem=0, min_job_mem=1 << 20, keep_finished=50, list_is_public=False,
                 admin_group="root", schedule="fifo-strict", cgroups=False, max_queued_per_user=3,
                 max_job_size=1 << 16, user_name="root", admin_gid=0)
    machine = resources.Machine(nodes=(resources.Node(0, (0, 1), 8 << 30),))
    limits = resources.Limits(reserve_cpu=0, reserve_mem=0, min_job_mem=1 << 20, per_node_memory=False)
    hooks = Hooks()
    eng = TurnEngine(cfg, store, machine, limits, devdir.DevDir(None, 0), hooks, launcher=fake)
    eng.root_mode = True
    return eng, store, fake, hooks


def submit(eng, now=T0, **kw):
    args = dict(argv=("true",), cwd="/tmp", no_output=True)
    args.update(kw)
    return answered(eng, eng.submit(ROOT, NewJob(**args), now), now)


def start_pending(eng, now=T0):
    eng.run_pending(now)


def end(eng, store, job_id, now=T0 + 1, **rec):
    rec.setdefault("ended", now)
    records.write_json(os.path.join(store.job_dir(job_id), records.EXIT), rec)
    eng.shepherd_exited(job_id)
    return eng.jobs[job_id]


def test_a_job_that_fits_starts_and_one_that_does_not_queues(world):
    eng, store, fake, hooks = world
    a = submit(eng, cpus=2)
    assert a["state"] == "running"
    start_pending(eng)
    b = submit(eng, cpus=1)
    assert b["state"] == "queued" and fake.spawned == [a["id"]]
    assert (a["id"], "started") in hooks.events
    # The launch spec carries what the shepherd enforces on its own.
    assert fake.last_launch.deadline == T0 + 3600 and fake.last_launch.kill_grace == records.LaunchSpec.KILL_GRACE
    end(eng, store, a["id"], code=0)
    eng.tick(T0 + 2)
    assert fake.spawned == [a["id"], b["id"]]


def test_an_end_and_the_start_it_makes_room_for_share_one_turn(world):
    eng, store, fake, hooks = world
    a = submit(eng, cpus=2)
    start_pending(eng)
    b = submit(eng, cpus=2)
    assert b["state"] == "queued"
    records.write_json(os.path.join(store.job_dir(a["id"]), records.EXIT), {"ended": T0 + 1, "code": 0})
    Engine.shepherd_exited(eng, a["id"])       # the event, its turn not ended yet
    assert eng.jobs[b["id"]].state == jobs.QUEUED and eng.turn.resched
    eng.reschedule(T0 + 1)                     # as the server does before the turn's commit
    assert eng.jobs[b["id"]].state == jobs.RUNNING and fake.spawned == [a["id"], b["id"]]


def test_the_held_replies_go_while_the_first_shepherd_is_forked(world):
    eng, store, fake, hooks = world
    a = submit(eng, cpus=2)
    start_pending(eng)
    b = submit(eng, cpus=2)
    eng.end_turn(T0)                           # b queued, and answered
    records.write_json(os.path.join(store.job_dir(a["id"]), records.EXIT), {"ended": T0 + 1, "code": 0})
    Engine.shepherd_exited(eng, a["id"])       # a turn without submits: b's start is written at once
    Engine.schedule(eng, T0 + 1)               # started, not yet committed nor spawned
    replies = []
    eng.commit_turn(T0)
    eng.spawn_turn(T0, lambda: replies.append(list(fake.spawned)))
    assert replies == [[a["id"]]] and fake.spawned == [a["id"], b["id"]]   # once, before the answer
    eng.spawn_turn(T0, lambda: replies.append("again"))     # nothing to spawn: at once
    assert replies == [[a["id"]], "again"]


@pytest.mark.parametrize("kw,code,needle", [
    ({"max_time": 7200}, "refused", "--max-lifetime"),
    ({"argv": ("x" * (1 << 17),)}, "too_large", "--max-job-size"),
    ({"cpus": 64}, "never_fits", "never fit"),
])
def test_refusals_name_what_to_change(world, kw, code, needle):
    eng, store, fake, _ = world
    with pytest.raises(Refused) as info:
        submit(eng, **kw)
    assert info.value.code == code and needle in str(info.value)
    assert store.records == {} and fake.spawned == []


def test_queued_jobs_per_user_are_capped(world):
    eng, store, _, _ = world
    submit(eng, cpus=2)
    start_pending(eng)
    for _ in range(3):
        submit(eng)
    with pytest.raises(Refused) as info:
        submit(eng)
    assert info.value.code == "queue_full" and "--max-queued-per-user" in str(info.value)
    # A queued job removed makes room again.
    queued = [j for j in eng.table.queued]
    eng.kill(ROOT, queued[0], T0)
    submit(eng)


def test_kill_asks_the_shepherd_and_repeats_until_it_ends(world):
    eng, store, fake, _ = world
    job = submit(eng)["id"]
    start_pending(eng)
    fake.listening = False                      # its FIFO is not there yet
    eng.kill(ROOT, job, T0 + 1)
    assert fake.stops == [(job, "killed")]
    wake = eng.tick(T0 + 1.1)
    assert wake == pytest.approx(T0 + 1 + deadlines.STOP_RETRY)
    fake.listening = True
    eng.tick(T0 + 2)
    assert fake.stops == [(job, "killed"), (job, "killed")]
    assert eng.tick(T0 + 2.1) == pytest.approx(T0 + 2 + records.LaunchSpec.KILL_GRACE)
    done = end(eng, store, job, stopped="killed", signal=15)
    assert done.result.kind == jobs.KILLED


def test_deadline_asks_for_a_timeout(world):
    eng, store, fake, _ = world
    job = submit(eng, max_time=10)["id"]
    start_pending(eng)
    assert eng.tick(T0 + 5) == T0 + 10
    eng.tick(T0 + 10)
    assert fake.stops == [(job, "timeout")]
    assert end(eng, store, job, stopped="timeout", signal=9).result.kind == jobs.TIMEOUT


@pytest.mark.parametrize("rec,kind,column", [
    ({"code": 3}, jobs.EXITED, "3"),
    ({"signal": 11}, jobs.SIGNALLED, "SIGSEGV"),
    ({"signal": 9, "oom_kill": 1}, jobs.OOM, "oom"),
    ({"code": 127, "error": "failed while entering /x: No such file"}, jobs.ERROR, "error"),
    ({"code": 0, "stopped": "killed"}, jobs.KILLED, "killed"),
    ({"signal": 15, "stopped": "timeout"}, jobs.TIMEOUT, "timeout"),
    ({"code": "3", "signal": [1], "stopped": "bogus"}, jobs.EXITED, "None"),   # garbage is not trusted
])
def test_exit_records_mean_results(world, rec, kind, column):
    eng, store, _, _ = world
    job = submit(eng)["id"]
    start_pending(eng)
    done = end(eng, store, job, **rec)
    assert done.state == jobs.FINISHED and done.result.kind == kind
    assert jobs.exit_column(done.result) == column


def test_a_dead_shepherd_ends_its_job_and_keeps_the_output(world):
    eng, store, fake, _ = world
    out = "/home/alice/out.log"
    job = eng.submit(ROOT, NewJob(argv=("true",), cwd="/tmp", output=out, output_is_dir=False), T0)["id"]
    start_pending(eng)
    with open(os.path.join(store.job_dir(job), records.OUTPUT), "w") as f:
        f.write("partial\n")
    eng.shepherd_exited(job)                     # no exit record
    done = eng.jobs[job]
    assert done.result.kind == jobs.KILLED and "shepherd" in done.result.note
    assert fake.orphans_killed == [job]          # through the launcher's pidfd check, not a raw pid
    assert "kept at" in done.output_error
    assert os.path.exists(os.path.join(store.job_dir(job), records.OUTPUT))
    # Counted against its owner's share from its end (G1), though still in its directory.
    assert eng.finished.undelivered.held.owned[done.user] == len("partial\n")


def test_a_job_that_cannot_start_fails_alone(world):
    eng, store, fake, _ = world
    fake.spawn_error = RuntimeError("boom")
    bad = submit(eng, cpus=1)["id"]
    start_pending(eng)
    assert eng.jobs[bad].result.kind == jobs.ERROR
    fake.spawn_error = None
    good = submit(eng, cpus=1)["id"]
    start_pending(eng)
    assert fake.spawned == [good]


def test_an_error_while_checking_a_job_ends_that_job_only(world):
    eng, store, fake, _ = world
    a = submit(eng, cpus=1, max_time=5)["id"]
    start_pending(eng)
    b = submit(eng, cpus=1)["id"]
    start_pending(eng)
    fake.stop_error = RuntimeError("the FIFO exploded")
    eng.tick(T0 + 6)                             # a's deadline: asking its shepherd raises
    assert eng.jobs[a].state == jobs.FINISHED and eng.jobs[a].result.kind == jobs.ERROR
    assert "the FIFO exploded" in eng.jobs[a].result.note
    assert eng.jobs[b].state == jobs.RUNNING


def test_a_full_disk_at_start_requeues(world):
    eng, store, fake, _ = world
    submit(eng, cpus=1)
    store.fail_writes = True
    start_pending(eng)
    assert fake.spawned == [] and list(eng.table.queued) == [1] and eng.turn.retry_at == T0 + 2.0
    store.fail_writes = False
    eng.tick(T0 + 2.5)
    assert fake.spawned == [1]


def test_recovery_survives_a_record_it_cannot_readopt(world, monkeypatch):
    eng, store, fake, hooks = world
    job = jobs.Job(id=5, uid=0, gid=0, user="root", argv=["true"], cwd="/", submitted=T0, max_time=60,
                   budget={"mem": 1 << 20}, state=jobs.RUNNING, started=T0,
                   alloc=resources.Allocation(cpus=(0,), mem_by_node=(), gpus=(), exclusive=False))
    store.records[5] = job.to_dict()
    os.mkdir(store.job_dir(5))

    def cannot(job_dir):
        raise RuntimeError("its pidfile names a process of another boot")
    monkeypatch.setattr(fake, "adopt", cannot)
    eng.recover()
    assert eng.jobs[5].result.kind == jobs.ERROR and "re-adopt" in eng.jobs[5].result.note
    assert eng.next_id == 6


def test_user_mode_accepts_only_its_own_user(world):
    eng, _, _, _ = world
    eng.root_mode = False
    other = pwd.getpwnam("nobody")
    with pytest.raises(Refused) as info:
        eng.submit(Caller(uid=other.pw_uid, gid=other.pw_gid, pid=2, name="nobody", is_admin=False),
                   NewJob(argv=("true",), cwd="/tmp", no_output=True), T0)
    assert info.value.code == "forbidden"


ALICE = Caller(uid=4242, gid=4242, pid=3, name="alice", is_admin=False)


def test_max_time_read_by_owner_changed_by_admins(world):
    eng, store, fake, _ = world
    job = submit(eng, max_time=600)["id"]
    start_pending(eng)
    eng.jobs[job].uid = ALICE.uid                          # alice's job
    req = NewJobSetting(job, "get")
    assert eng.job_setting(ALICE, req, T0)["max_time"] == 600
    with pytest.raises(Refused) as info:
        eng.job_setting(ALICE, NewJobSetting(job, "add", 60), T0)
    assert info.value.code == "forbidden" and "10m" in str(info.value)
    got = eng.job_setting(ROOT, NewJobSetting(job, "add", 60), T0 + 1)
    assert got["max_time"] == 660 and got["deadline"] == T0 + 660
    assert store.records[job]["max_time"] == 660            # persisted
    assert fake.deadlines == [(job, T0 + 660)]             # and the shepherd told
    eng.job_setting(ROOT, NewJobSetting(job, "set", 30), T0 + 2)
    assert eng.tick(T0 + 31) is not None and fake.stops == [(job, "timeout")]


def test_max_time_of_a_queued_job_moves_its_place_in_the_plan(world):
    eng, store, fake, _ = world
    submit(eng, cpus=2)
    start_pending(eng)
    queued = submit(eng, max_time=600)["id"]
    eng.job_setting(ROOT, NewJobSetting(queued, "set", 1200), T0)
    assert eng.table.queued[queued].max_time == 1200 and eng.table.held_by_uid[0] == 1


def test_an_unheard_deadline_is_sent_again(world):
    eng, store, fake, _ = world
    job = submit(eng, max_time=600)["id"]
    start_pending(eng)
    fake.listening = False
    eng.job_setting(ROOT, NewJobSetting(job, "set", 900), T0)
    assert eng.tick(T0 + 0.1) == pytest.approx(T0 + deadlines.STOP_RETRY)
    fake.listening = True
    eng.tick(T0 + 1)
    assert len(fake.deadlines) == 2 and eng.table.running[job].deadline_resend_at is None


def test_strict_backfill_reservation_is_worked_out_afresh(world):
    eng, store, fake, _ = world
    eng.cfg.schedule = "strict-backfill"
    job = submit(eng, max_time=600)["id"]
    start_pending(eng)
    eng.policy_state = {"policy": "strict-backfill", "head": 9, "start": T0 + 600}
    eng.job_setting(ROOT, NewJobSetting(job, "add", 600), T0)
    assert eng.policy_state == {} and eng.turn.resched


def _spy_on_commits_and_launches(store, fake) -> list:
    """The store's commits ("commit") and the launcher's launch specs (("launch", id)), in order."""
    seen: list = []
    real_commit, real_write = store.commit, fake.write_launch

    def commit(now=None):
        seen.append("commit")
        real_commit(now)

    def write_launch(job_dir, launch, durable):
        seen.append(("launch", int(os.path.basename(job_dir))))
        real_write(job_dir, launch, durable)
    store.commit, fake.write_launch = commit, write_launch
    return seen


def test_a_submit_is_answered_before_the_start_it_makes_is_written(world):
    """The reply waits for the submit's commit only: the launch spec's fsyncs and the start's own
    commit come after it, and the spawn after that commit."""
    eng, store, fake, _ = world
    seen = _spy_on_commits_and_launches(store, fake)
    job = Engine.submit(eng, ROOT, NewJob(argv=("true",), cwd="/tmp", no_output=True), T0)["id"]
    Engine.run_pending(eng, T0)
    assert eng.jobs[job].state == jobs.RUNNING and eng.turn.to_write   # decided, not yet written
    assert ("launch", job) not in seen
    info = os.path.join(store.job_dir(job), records.INFO)

    def replies(refused):   # a client reads its job's /dev entry as soon as it has its answer
        with open(info) as f:
            seen.append(("replies", tuple(sorted(refused)), json.load(f)["state"]))
    eng.end_turn(T0, replies)
    # (the spawn's own commit, for ends a failed spawn makes, follows: nothing is staged for it)
    assert seen[:4] == ["commit", ("replies", (), jobs.RUNNING), ("launch", job), "commit"]
    assert fake.spawned == [job] and store.records[job]["state"] == jobs.RUNNING
    assert not eng.turn.shown


def test_a_start_put_off_for_a_refused_submit_is_never_written(world):
    """A submit the commit refuses is withdrawn: the start it was given is dropped, not written."""
    eng, store, fake, _ = world
    store.commit_error = OSError(28, "No space left on device")
    job = Engine.submit(eng, ROOT, NewJob(argv=("true",), cwd="/tmp", no_output=True), T0)["id"]
    Engine.run_pending(eng, T0)
    fake.write_launch = lambda job_dir, launch, durable: pytest.fail("a withdrawn job's start was written")
    assert eng.end_turn(T0) == {job}
    assert job not in eng.jobs and not eng.table.running and fake.spawned == []


@pytest.mark.parametrize("fails", ["launch spec", "start's commit"])
def test_a_put_off_start_the_full_disk_sends_back_says_queued_in_its_entry(world, fails):
    """Its /dev entry said it runs before the answer; once its start cannot be made durable, it says queued."""
    eng, store, fake, _ = world
    full = OSError(28, "No space left on device")
    if fails == "launch spec":
        def write_launch(job_dir, launch, durable):
            raise full
        fake.write_launch = write_launch
    else:
        commits = []
        real_commit = store.commit

        def commit(now=None):   # the submit's commit works, the start's does not
            commits.append(now)
            if len(commits) == 2:
                raise full
            real_commit(now)
        store.commit = commit
    job = Engine.submit(eng, ROOT, NewJob(argv=("true",), cwd="/tmp", no_output=True), T0)["id"]
    Engine.run_pending(eng, T0)
    assert eng.end_turn(T0) == set()                # the submit itself was stored and answered
    assert eng.jobs[job].state == jobs.QUEUED and fake.spawned == [] and eng.turn.retry_at == T0 + 2
    with open(os.path.join(store.job_dir(job), records.INFO)) as f:
        assert json.load(f)["state"] == jobs.QUEUED


def test_a_start_freed_by_an_end_in_a_turn_without_submits_rides_its_commit(world):
    """Without a submit to answer, a start is written at once and shares the end's commit."""
    eng, store, fake, _ = world
    a = submit(eng, cpus=2)["id"]
    start_pending(eng)
    b = submit(eng, cpus=2)["id"]
    eng.end_turn(T0)
    seen = _spy_on_commits_and_launches(store, fake)
    records.write_json(os.path.join(store.job_dir(a), records.EXIT), {"ended": T0 + 1, "code": 0})
    Engine.shepherd_exited(eng, a)
    Engine.schedule(eng, T0 + 1)   # as end_turn's reschedule does (TurnEngine's schedule ends a turn)
    eng.end_turn(T0 + 1, lambda refused: seen.append("replies"))
    assert eng.jobs[b].state == jobs.RUNNING and fake.spawned == [a, b]
    assert seen[:3] == [("launch", b), "commit", "replies"], seen


def NewJobSetting(job_id, action, seconds=None):
    from hpc_batch.wire.protocol import JobSetting
    return JobSetting(id=job_id, setting="max_time", action=action, seconds=seconds)


def test_a_failed_commit_refuses_the_turns_submits_and_holds_back_its_starts(world):
    eng, store, fake, _ = world
    a = submit(eng, cpus=2)["id"]
    start_pending(eng)
    queued = submit(eng, cpus=2)["id"]              # waits for a; committed in a turn that worked
    eng.end_turn(T0)
    store.commit_error = OSError(28, "No space left on device")
    new = submit(eng, cpus=1)["id"]
    records.write_json(os.path.join(store.job_dir(a), records.EXIT), {"ended": T0 + 1, "code": 0})
    Engine.shepherd_exited(eng, a)                  # a ends: queued would start in this same turn
    assert eng.end_turn(T0 + 1) == {new}               # the submit is refused: its reply says so
    assert new not in eng.jobs and new not in eng.table.queued
    assert eng.jobs[queued].state == jobs.QUEUED and fake.spawned == [a]   # its start waits
    assert eng.turn.retry_at == T0 + 3
    store.commit_error = None
    eng.tick(T0 + 3)                                # the retry: committed, then spawned
    assert eng.jobs[queued].state == jobs.RUNNING and fake.spawned == [a, queued]


def test_a_shepherd_that_found_its_job_taken_hands_it_to_the_one_that_holds_it(world):
    eng, store, fake, hooks = world
    job = submit(eng, cpus=1)["id"]
    start_pending(eng)
    # The shepherd we watch exits without an exit record; another one holds the job's lock.
    fake.adoptable = (43210, os.open(os.devnull, os.O_RDONLY))
    eng.shepherd_exited(job)
    assert eng.jobs[job].state == jobs.RUNNING and eng.table.running[job].pid == 43210
    assert fake.orphans_killed == []
    end(eng, store, job, code=0)               # that one ends the job as usual
    assert eng.jobs[job].result.kind == jobs.EXITED


# -- bounds: dependencies, caps and names at scale (issue 20) ---------------------------------

ALICE = Caller(uid=1001, gid=1001, pid=2, name="alice", is_admin=False)
BOB = Caller(uid=1002, gid=1002, pid=3, name="bob", is_admin=False)


@pytest.fixture
def users(world):
    """Passwd entries for alice and bob (the engine looks the submitter up by uid), given to the engine."""
    fake = {1001: "alice", 1002: "bob"}

    def getpwuid(uid):
        if uid in fake:
            return pwd.struct_passwd((fake[uid], "x", uid, uid, "", "/tmp", "/bin/sh"))
        return pwd.getpwuid(uid)
    world[0].passwd = types.SimpleNamespace(getpwuid=getpwuid)


def settle(eng, now=T0 + 2):
    """Turn the loop until no waiting job is left to look at (as the server does: wake at once)."""
    for _ in range(10_000):
        if not eng.unsettled:
            break
        eng.tick(now)
    eng.tick(now)   # and the scheduling pass the releases asked for
    if eng.unsettled:
        raise AssertionError("the engine never settled")


def test_a_failed_dependency_fails_thousands_of_dependents_without_recursion(world):
    eng, store, fake, _ = world
    eng.cfg.max_queued_per_user = 5000
    eng.cfg.keep_finished = 5000
    prep = submit(eng, name="prep", cpus=2)["id"]
    start_pending(eng)
    bulk = submit(eng, after=("prep",), after_ok=True, array=tuple(range(1, 1501)))
    # A chain as deep as Python's recursion limit, too.
    chain = [bulk["last"]]
    for _ in range(1200):
        chain.append(submit(eng, after=(chain[-1],), after_ok=True)["id"])
    # (the cap is per user; root submits all of them here)
    end(eng, store, prep, code=1)
    settle(eng)
    doomed = list(range(bulk["id"], bulk["last"] + 1)) + chain[1:]
    assert {eng.jobs[j].result.kind for j in doomed} == {jobs.DEPENDENCY_FAILED}
    assert not eng.table.waiting and not eng.table.dependents.get(prep)
    assert eng.table.held_by_uid.get(0, 0) == 0
    # Each call did a bounded share of the work: the loop was never held for all of it.
    assert len(doomed) > ending_mod.SETTLE_BATCH


def test_a_restart_with_thousands_of_doomed_dependents_serves_and_fails_them(world, tmp_path):
    eng, store, fake, hooks = world
    eng.cfg.max_queued_per_user = 5000
    eng.cfg.keep_finished = 5000
    prep = submit(eng, name="prep", cpus=2)["id"]
    start_pending(eng)
    bulk = submit(eng, after=(prep,), after_ok=True, array=tuple(range(1, 2001)))
    # The prep ends as failed while no daemon watches: the records say so.
    store.records[prep].update(state="finished", ended=T0 + 1, result=jobs.Result(jobs.EXITED, code=1).to_dict())
    again = TurnEngine(eng.cfg, store, eng.machine, eng.limits, devdir.DevDir(None, 0), hooks, launcher=eng.launcher)
    again.root_mode = True
    again.recover()
    settle(again)
    kinds = {again.jobs[j].result.kind for j in range(bulk["id"], bulk["last"] + 1)}
    assert kinds == {jobs.DEPENDENCY_FAILED} and not again.table.waiting


def test_waiting_jobs_count_toward_the_per_user_cap(world):
    eng, store, fake, _ = world   # the cap is 3
    hold = submit(eng, cpus=2)["id"]
    start_pending(eng)
    submit(eng, after=(hold,), array=(1, 2))
    submit(eng)
    with pytest.raises(Refused) as info:
        submit(eng, after=(hold,))
    assert info.value.code == "queue_full" and "queued or waiting" in str(info.value)
    with pytest.raises(Refused):
        submit(eng)
    # Released, they keep counting until they start.
    end(eng, store, hold, code=0)
    settle(eng)
    assert eng.table.held_by_uid[0] == len(eng.table.queued) + len(eng.table.waiting) - sum(
        1 for j in eng.table.queued if j in eng.table.running)


def test_released_jobs_take_their_submission_order(world):
    eng, store, fake, _ = world
    eng.cfg.max_queued_per_user = 100
    first = submit(eng, cpus=2)["id"]
    start_pending(eng)
    waits = submit(eng, cpus=2, after=(first,), array=(1, 2))      # ids 2, 3
    later = submit(eng, cpus=2)["id"]                                  # id 4, queued now
    assert list(eng.table.queued) == [later]
    end(eng, store, first, code=0)
    settle(eng)
    assert eng.table.running and waits["id"] in eng.table.running   # the released head started first
    assert list(eng.table.in_order()) == [waits["last"], later]


def test_a_name_means_the_callers_own_job_for_admins_too(world, users):
    eng, store, fake, _ = world
    mine = submit(eng, name="nightly-prep", cpus=2)["id"]
    start_pending(eng)
    bobs = eng.submit(BOB, NewJob(argv=("true",), cwd="/tmp", no_output=True, name="nightly-prep"), T0)["id"]
    assert bobs > mine
    assert eng.lookup(ROOT, "nightly-prep").id == mine
    assert eng.lookup(BOB, "nightly-prep").id == bobs
    assert eng.lookup(ROOT, "bob:nightly-prep").id == bobs      # another user's, named as such
    assert eng.lookup(BOB, "bob:nightly-prep").id == bobs
    # Root's --after-ok binds root's job, never bob's.
    dep = submit(eng, name="nightly", after=("nightly-prep",), after_ok=True)
    assert eng.jobs[dep["id"]].after == [mine]


def test_a_job_another_user_cannot_see_is_not_found_not_forbidden(world, users):
    eng, store, fake, _ = world
    alice = eng.submit(ALICE, NewJob(argv=("true",), cwd="/tmp", no_output=True, name="secret"), T0)["id"]
    for ref in (alice, "alice:secret", "secret", alice + 1000):
        with pytest.raises(Refused) as info:
            eng.lookup(BOB, ref)
        assert info.value.code == "not_found", ref
    assert str(_refusal(eng, BOB, alice)) == str(_refusal(eng, BOB, alice + 1)).replace(
        str(alice + 1), str(alice))
    eng.cfg.list_is_public = True
    with pytest.raises(Refused) as info:
        eng.lookup(BOB, alice)
    assert info.value.code == "forbidden"


def _refusal(eng, caller, ref):
    with pytest.raises(Refused) as info:
        eng.lookup(caller, ref)
    return info.value


def test_names_follow_eviction_and_stay_indexed(world):
    eng, store, fake, _ = world
    eng.cfg.keep_finished = 2
    eng.cfg.max_queued_per_user = 100
    ids = []
    for _ in range(5):
        ids.append(submit(eng, name="step", cpus=2)["id"])
        start_pending(eng)
        end(eng, store, ids[-1], code=0)
        settle(eng)
    assert sorted(eng.jobs) == ids[-2:]
    assert eng.table.names[(0, "step")] == ids[-2:]
    assert eng.lookup(ROOT, "step").id == ids[-1]
    assert sorted(eng.table.finished_by_uid[0]) == ids[-2:]


def test_a_job_is_remembered_until_its_dependents_have_seen_how_it_ended(world):
    eng, store, fake, _ = world
    eng.cfg.keep_finished = 1
    eng.cfg.max_queued_per_user = 5000
    prep = submit(eng, cpus=2)["id"]
    start_pending(eng)
    bulk = submit(eng, after=(prep,), after_ok=True, cpus=2, array=tuple(range(1, 1201)))
    end(eng, store, prep, code=0)       # a success: every dependent must be released, none failed
    # Meanwhile other jobs of the same user end, which evicts finished ones (--keep-finished 1).
    for _ in range(3):
        eng.tick(T0 + 2)                # starts the next released job
        running = list(eng.table.running)
        assert running
        for job_id in running:
            records.write_json(os.path.join(store.job_dir(job_id), records.EXIT), {"ended": T0 + 2, "code": 0})
            eng.shepherd_exited(job_id)   # (end() would look the job up: it is evicted at once here)
    settle(eng)
    for job_id in range(bulk["id"], bulk["last"] + 1):
        job = eng.jobs.get(job_id)
        assert job is None or job.result is None or job.result.kind != jobs.DEPENDENCY_FAILED, job_id
    assert not eng.table.waiting and not eng.table.followers and len(eng.table.queued) + len(eng.table.running) > 1000


def _ended_ok_and_failed(eng, store):
    """Two jobs run and end, the first with exit 0, the second with exit 2: their ids."""
    ids = []
    for code in (0, 2):
        ids.append(submit(eng, cpus=2)["id"])
        start_pending(eng)
        end(eng, store, ids[-1], code=code)
    return tuple(ids)


def test_a_submit_after_jobs_that_already_ended_is_settled_at_once(world):
    eng, store, fake, _ = world
    eng.cfg.max_queued_per_user = 100
    good, bad = _ended_ok_and_failed(eng, store)
    ok = submit(eng, after=(good,), after_ok=True, cpus=2)
    anyhow = submit(eng, after=(good, bad), array=(1, 2))
    settle(eng)
    assert eng.jobs[ok["id"]].state in (jobs.QUEUED, jobs.RUNNING)
    assert {eng.jobs[anyhow["id"]].state, eng.jobs[anyhow["last"]].state} <= {jobs.QUEUED, jobs.RUNNING}
    assert not eng.table.waiting and eng.table.held_by_uid.get(0, 0) == len(eng.table.queued)


def test_after_ok_a_job_that_already_failed_is_refused_at_submit(world):
    """It could only wait, then end dependency-failed: said at once, naming the job and how it ended."""
    eng, store, fake, _ = world
    good, bad = _ended_ok_and_failed(eng, store)
    known = set(eng.jobs)
    with pytest.raises(Refused) as info:
        submit(eng, after=(good, bad), after_ok=True, array=(1, 2))
    assert info.value.code == "finished"
    assert f"--after-ok {bad}: job {bad} has already ended with exit 2, not 0" in str(info.value)
    assert set(eng.jobs) == known


@pytest.mark.parametrize("after_ok,flag", [(False, "--after"), (True, "--after-ok")])
def test_a_dependency_that_is_not_known_is_refused_naming_the_flag(world, after_ok, flag):
    eng, *_ = world
    with pytest.raises(Refused) as info:
        submit(eng, after=(999,), after_ok=after_ok)
    assert info.value.code == "not_found" and str(info.value) == f"{flag} 999: no such job: 999"


def test_a_running_job_from_a_daemon_that_did_not_know_cores_is_readopted_and_its_core_kept(world):
    """Issue 21: a reload onto whole cores, with a job an older daemon gave one thread of a core."""
    from pathlib import Path

    from hpc_batch.daemon.discovery import read_cpu_topology, read_numa
    eng, store, fake, hooks = world
    tree = str(Path(__file__).resolve().parent.parent / "fixtures" / "sysfs" / "qemu-2s-smt-adjacent")
    nodes = read_numa(tree)
    machine = resources.Machine(nodes, cpu_topology=read_cpu_topology(tree, range(8))[0])   # cores 0+1 ... 6+7
    old = jobs.Job(id=5, uid=0, gid=0, user="root", argv=["true"], cwd="/", submitted=T0, max_time=600,
                   budget={"mem": 1 << 20, "assigned": False}, state=jobs.RUNNING, started=T0,
                   alloc=resources.Allocation(cpus=(4,), mem_by_node=((1, 1 << 20),), gpus=(), exclusive=False))
    store.records[5] = old.to_dict()
    os.mkdir(store.job_dir(5))
    fake.adoptable = (4242, os.open(os.devnull, os.O_RDONLY))
    again = TurnEngine(eng.cfg, store, machine, eng.limits, devdir.DevDir(None, 0), hooks, launcher=eng.launcher)
    again.root_mode = True
    again.recover()
    assert 5 in again.table.running and again.jobs[5].state == jobs.RUNNING
    ids = []
    for _ in range(4):
        ids.append(submit(again, cpus=1, mem=1 << 20)["id"])
        start_pending(again)
    got = [again.jobs[i].alloc and again.jobs[i].alloc.cpus for i in ids]
    assert got == [(6, 7), (0, 1), (2, 3), None]     # CPU 5 is free, but its core runs job 5
    shown = again.show(ROOT, 5, T0)
    assert shown["cores"] == [[4]] and shown["held_cpus"] == [4]
    assert again.show(ROOT, ids[0], T0)["cores"] == [[6, 7]]
    assert again.why(again.jobs[ids[3]])[1] == ("it needs 2 CPUs (1 whole core) on one NUMA node; "
                                                "the most free on one is 0 CPUs (0 whole cores)")


def _counters(root, pswpout):
    os.makedirs(os.path.join(root, "proc"), exist_ok=True)
    with open(os.path.join(root, "proc", "vmstat"), "w") as f:
        f.write(f"pswpin 0\npswpout {pswpout}\n")


def test_a_strict_benchmark_job_waits_while_the_machine_swaps_and_holds_up_nobody(world, tmp_path, monkeypatch):
    eng, store, fake, hooks = world
    root = str(tmp_path / "probe")
    _counters(root, 0)
    monkeypatch.setenv("HPC_BATCH_PROBE_ROOT", root)
    strict = submit(eng, benchmark="strict")
    assert strict["state"] == "queued"
    assert "being read" in eng.why(eng.jobs[strict["id"]])[1]
    plain = submit(eng)                     # behind it, and not held up by it
    assert plain["state"] == "running"
    start_pending(eng)
    assert eng.tick(T0) == T0 + defaults.BENCH_PROBE_INTERVAL   # the next reading is due
    _counters(root, 50)
    eng.tick(T0 + 1)
    assert eng.jobs[strict["id"]].state == "queued"
    assert "the machine is swapping (0 pages swapped in, 50 out" in eng.why(eng.jobs[strict["id"]])[1]
    eng.tick(T0 + 2)                         # nothing rose since: quiet, and it starts
    assert eng.jobs[strict["id"]].state == "running" and strict["id"] in fake.spawned
    job = eng.jobs[strict["id"]]
    assert job.request.resources.numa_local and job.request.benchmark == "strict"
    assert "no housekeeping CPUs: the daemon and the shepherds may run on its cores" in job.shortfalls
    assert job.bench_start["swap"] == [0, 50]
    _counters(root, 70)                     # it swapped while it ran: recorded when it ends
    end(eng, store, strict["id"], code=0)
    assert "while it ran, the machine is swapping (0 pages swapped in, 20 out" in " ".join(job.shortfalls)
    assert eng.table.strict_queued == 0 and eng.bench.watch.last is None


def test_the_launch_spec_and_the_record_carry_aslr_and_thp(world):
    eng, store, fake, hooks = world
    a = submit(eng, aslr="off", thp="off")
    start_pending(eng)
    assert (fake.last_launch.aslr, fake.last_launch.thp) == ("off", "off")
    assert (eng.jobs[a["id"]].request.aslr, eng.jobs[a["id"]].request.thp) == ("off", "off")
    b = submit(eng)
    assert (eng.jobs[b["id"]].request.aslr, eng.jobs[b["id"]].request.thp) == ("on", "on")


def test_a_pass_reads_the_queue_only_up_to_a_blocked_head_with_throttled_arrays(world):
    """fifo-strict stops at the first job that does not fit: with a %N array queued, the engine's
    filtered queue is read lazily, so a pass costs what it looks at, not the whole queue."""
    eng, store, fake, hooks = world
    eng.cfg.max_queued_per_user = 100
    busy = submit(eng, cpus=2)["id"]                       # the machine's two CPUs are taken
    start_pending(eng)
    arr = submit(eng, cpus=1, array=(1, 2, 3), array_limit=1)
    behind = [submit(eng, cpus=1)["id"] for _ in range(20)]
    assert eng.table.capped_queued and len(eng.table.queued) == 23
    # What the filter passes on, in order: one element of the %1 array (its room), then the rest.
    assert [q.id for q in eng._eligible(T0)] == [arr["id"], *behind]
    pulled = []
    queue = eng.table.in_order()

    class Counting:
        def values(self):
            for q in queue.values():
                pulled.append(q.id)
                yield q

    eng.table.in_order = Counting
    decision = eng.plan(T0)
    assert decision is not None and not decision.starts
    assert pulled == [arr["id"]]                           # the blocked head, and nothing behind it
    del eng.table.in_order
    # Once an element runs, its siblings are passed over and the jobs behind them are looked at.
    end(eng, store, busy)
    eng.tick(T0 + 2)
    assert fake.spawned == [busy, arr["id"], behind[0]]
    assert [q.id for q in eng._eligible(T0 + 2)] == behind[1:]

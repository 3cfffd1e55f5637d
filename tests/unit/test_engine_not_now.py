"""Out of pids (F8), as the engine sees it: a start whose command never ran goes back to the queue.

The same in-memory store and fake launcher as test_engine.py. Two ways a
start can fail for want of pids: the shepherd cannot be started at all (the
spawn raises EAGAIN), or the shepherd started but could not fork the job (its
exit record says ``not_started``). Either way the job never ran, so it is
queued again with its environment, not ended.
"""

import errno
import os

from test_engine import ROOT, T0, end, start_pending, submit, world  # noqa: F401 (world: a fixture)

from hpc_batch import defaults
from hpc_batch.core import jobs
from hpc_batch.core.resources import Allocation
from shepherd.base import records


def test_a_spawn_out_of_pids_puts_the_job_back_with_its_environment(world):  # noqa: F811
    eng, store, fake, hooks = world
    fake.spawn_error = OSError(errno.EAGAIN, "Resource temporarily unavailable")
    job = submit(eng, job_env={"SECRET": "s"})["id"]
    start_pending(eng)
    assert eng.jobs[job].state == jobs.QUEUED and fake.spawned == []
    assert store.env[job]["forward"]["SECRET"] == "s"                # the environment it was to get, kept
    assert (job, "finished") not in hooks.events
    assert eng.turn.retry_at == T0 + defaults.START_RETRY
    fake.spawn_error = None                                          # pids free again
    eng.tick(T0 + defaults.START_RETRY)
    assert fake.spawned == [job] and eng.jobs[job].state == jobs.RUNNING
    assert fake.last_launch.env["SECRET"] == "s"
    assert end(eng, store, job, code=3).result.code == 3


def test_any_other_spawn_failure_still_ends_the_job(world):  # noqa: F811
    eng, _, fake, _ = world
    fake.spawn_error = OSError(errno.ENOENT, "No such file or directory")
    job = submit(eng)["id"]
    start_pending(eng)
    assert eng.jobs[job].result.kind == jobs.ERROR


def _spec(env):
    return records.LaunchSpec(user="root", uid=0, gid=0, cwd="/", argv=["true"], env=env)


def _not_started(store, job, env):
    """What a shepherd that could not fork its job leaves: the spec it kept, and its record."""
    _spec(env).write(os.path.join(store.job_dir(job), records.LAUNCH))
    return {"error": "cannot fork the job (EAGAIN: Resource temporarily unavailable)", "not_started": "EAGAIN"}


def test_a_shepherd_that_could_not_fork_the_job_puts_it_back(world):  # noqa: F811
    eng, store, fake, hooks = world
    job = submit(eng)["id"]
    start_pending(eng)
    kept = store.env[job]
    rec = _not_started(store, job, {"PATH": "/bin", "HPC_BATCH_JOB_ID": str(job), "FOO": "bar"})
    done = end(eng, store, job, **rec)
    assert done.state == jobs.QUEUED and (job, "finished") not in hooks.events
    assert store.env[job] is kept, "the store kept its environment: the spec's is not read back"
    eng.tick(T0 + defaults.START_RETRY)
    assert fake.spawned == [job, job]
    assert fake.last_launch.env["HPC_BATCH_JOB_ID"] == str(job) and "FOO" not in fake.last_launch.env
    assert end(eng, store, job, code=4).result.code == 4


def test_a_job_started_by_an_older_daemon_is_put_back_with_its_specs_environment(world):  # noqa: F811
    """An older daemon let a job's stored environment go at its start: its launch spec's is stored again."""
    eng, store, fake, hooks = world
    job = submit(eng)["id"]
    start_pending(eng)
    del store.env[job]
    rec = _not_started(store, job, {"PATH": "/bin", "HPC_BATCH_JOB_ID": str(job), "FOO": "bar"})
    assert end(eng, store, job, **rec).state == jobs.QUEUED
    assert store.env[job] == {"forward": {"PATH": "/bin", "HPC_BATCH_JOB_ID": str(job), "FOO": "bar"}}
    eng.tick(T0 + defaults.START_RETRY)
    assert fake.spawned == [job, job] and fake.last_launch.env["FOO"] == "bar"


def test_without_its_spec_or_once_killed_it_ends_instead(world):  # noqa: F811
    eng, store, fake, _ = world
    lost = submit(eng)["id"]
    start_pending(eng)
    rec = _not_started(store, lost, {})
    os.unlink(os.path.join(store.job_dir(lost), records.LAUNCH))   # nothing to queue it again with
    del store.env[lost]                                            # (an older daemon let it go)
    result = end(eng, store, lost, **rec).result
    assert result.kind == jobs.ERROR and "cannot fork the job" in result.note
    killed = submit(eng)["id"]
    start_pending(eng)
    eng.kill(ROOT, killed, T0)                                       # asked while its shepherd retried
    result = end(eng, store, killed, **_not_started(store, killed, {})).result
    assert result.kind == jobs.KILLED and "before it could start" in result.note


def _recorded_running(store, job_id):
    """A job the store holds as running (as a daemon that died finds it), with its directory."""
    job = jobs.Job(id=job_id, uid=0, gid=0, user="root", argv=["true"], cwd="/", submitted=T0, max_time=60,
                   budget={"mem": 1 << 20}, state=jobs.RUNNING, started=T0,
                   alloc=Allocation(cpus=(0,), mem_by_node=((0, 1 << 20),), gpus=(), exclusive=False))
    store.records[job_id] = job.to_dict()
    os.mkdir(store.job_dir(job_id))


def test_after_a_restart_an_unstarted_shepherd_is_queued_again_with_its_environment(world):  # noqa: F811
    """Recovery found a launch spec no shepherd read (no pidfile: the command never ran). After a
    reboot its cgroup is gone, so the job is not started on that spec but queued again, with the
    spec's environment, and started afresh; out of pids, that start waits like any other."""
    eng, store, fake, hooks = world
    _recorded_running(store, 5)
    _spec({"PATH": "/bin", "FOO": "bar"}).write(os.path.join(store.job_dir(5), records.LAUNCH))
    eng.recover()
    fake.spawn_error = OSError(errno.EAGAIN, "Resource temporarily unavailable")
    now = T0 + defaults.SHEPHERD_START_GRACE + 100
    eng.tick(now)                                                  # the second look: queued again
    assert fake.spawned == [] and (5, "finished") not in hooks.events
    assert store.env[5] == {"forward": {"PATH": "/bin", "FOO": "bar"}}
    eng.tick(now + defaults.START_RETRY)                           # started: no pid for its shepherd
    assert eng.jobs[5].state == jobs.QUEUED and fake.spawned == []
    fake.spawn_error = None
    eng.tick(now + 3 * defaults.START_RETRY)
    assert fake.spawned == [5] and eng.jobs[5].state == jobs.RUNNING
    assert fake.last_launch.env["FOO"] == "bar" and fake.last_launch.env["HPC_BATCH_JOB_ID"] == "5"
    assert end(eng, store, 5, code=2).result.code == 2


def test_after_a_restart_a_shepherd_holding_its_lock_is_waited_for(world):  # noqa: F811
    """A shepherd that took the job's lock but has not written its pidfile yet is starting: the
    job is neither queued again nor lost, and is looked at again."""
    import fcntl
    eng, store, fake, _ = world
    _recorded_running(store, 7)
    _spec({}).write(os.path.join(store.job_dir(7), records.LAUNCH))
    fd = os.open(os.path.join(store.job_dir(7), records.PIDFILE), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        eng.recover()
        now = T0 + defaults.SHEPHERD_START_GRACE + 100
        eng.tick(now)
        assert eng.jobs[7].state == jobs.RUNNING and eng.table.running[7].recheck_at is not None
        assert fake.spawned == []
    finally:
        os.close(fd)


def test_after_a_power_cut_an_empty_launch_spec_ends_the_job_as_lost(world):  # noqa: F811
    """A start made durable, but its launch spec back empty (a damaged disk, or one an older daemon
    wrote without an fsync): no shepherd is started on it (it could only fail), and the job ends as
    lost, saying why."""
    eng, store, fake, _ = world
    _recorded_running(store, 6)
    open(os.path.join(store.job_dir(6), records.LAUNCH), "wb").close()
    eng.recover()
    eng.tick(T0 + defaults.SHEPHERD_START_GRACE + 100)
    result = eng.jobs[6].result
    assert fake.spawned == [] and eng.jobs[6].state == jobs.FINISHED
    assert result.kind == jobs.LOST and "did not survive a crash" in result.note, result


def test_after_a_power_cut_a_start_without_its_spec_or_pidfile_is_queued_again(world):  # noqa: F811
    """A clean environment's launch spec is not flushed: a power cut may take it (or leave it empty)
    after the start's commit. No durable pidfile says the command never ran, and the store kept the
    environment: the job is queued again, at once when the spec is gone, and started afresh. A
    forwarded environment's spec is flushed; without it, nothing is left to start it with."""
    eng, store, fake, hooks = world
    clean = {"base": {"PATH": "/bin"}, "forward": None, "job_env": {}}
    for job_id, env, spec in ((8, clean, None), (9, clean, b""), (10, {**clean, "forward": {"A": "b"}}, None)):
        _recorded_running(store, job_id)
        store.env[job_id] = env
        if spec is not None:
            open(os.path.join(store.job_dir(job_id), records.LAUNCH), "wb").close()
    eng.recover()
    assert eng.jobs[8].state == jobs.QUEUED, "no spec at all: nothing can be starting"
    assert eng.jobs[9].state == jobs.RUNNING, "an empty spec: looked at again after the grace"
    assert eng.jobs[10].result.kind == jobs.LOST
    eng.tick(T0 + defaults.SHEPHERD_START_GRACE + 100)
    assert eng.jobs[9].state == jobs.QUEUED and (8, "finished") not in hooks.events
    eng.tick(T0 + defaults.SHEPHERD_START_GRACE + 100 + defaults.START_RETRY)
    assert sorted(fake.spawned) == [8, 9] and fake.last_launch.env["PATH"] == "/bin"
    assert end(eng, store, 8, code=0).result.code == 0 and end(eng, store, 9, code=1).result.code == 1


def test_only_a_forwarded_environments_launch_spec_is_flushed(world):  # noqa: F811
    """The store keeps a clean environment until the job ends, so its spec needs no fsync; a
    forwarded one goes at the start (the README), so its spec is its only durable copy."""
    eng, store, fake, _ = world
    for env, durable in (({}, False), ({"job_env": {"TOKEN": "x"}}, True)):
        job = submit(eng, **env)["id"]
        start_pending(eng)
        assert fake.spawned[-1] == job and fake.last_durable is durable, env
        end(eng, store, job, code=0)

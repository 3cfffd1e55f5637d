"""The store over a real directory: journal replay, caches, environments that never enter the journal,
bulk submits stored once, damaged journals, and the free-space reserve."""

import os
import shutil

import pytest

from hpc_batch.core import jobs
from hpc_batch.core.resources import Allocation
from hpc_batch.daemon import journal
from hpc_batch.daemon.store import Store
from shepherd.base import records


def _job(job_id, state=jobs.QUEUED, argv=None, first=None):
    return jobs.Job(id=job_id, uid=0, gid=0, user="root", argv=argv or ["true"], cwd="/", submitted=1.8e9,
                    max_time=60, budget={"mem": 1 << 20}, state=state,
                    array=None if first is None else {"first": first, "index": job_id - first + 1, "limit": None})


def _open(path, lock=None):
    s = Store(str(path))
    s.open(inherited_lock=lock)
    s.load_jobs()
    return s


def _reopen(path, old):
    return _open(path, lock=old.lock_fd)


def _add(s, job_id, env=None):
    job = _job(job_id)
    s.add_jobs([job], env or {"base": {"PATH": "/bin"}}, None)
    return job


def _start(job):
    jobs.move(job, jobs.RUNNING, 1.8e9 + 1, alloc=Allocation(cpus=(0,), mem_by_node=(), gpus=(), exclusive=False))


def _end(job, store):
    """The job's end, written as the engine writes it (not journalled: its exit record holds it)."""
    jobs.move(job, jobs.FINISHED, 1.8e9 + 3, result=jobs.Result(jobs.EXITED, code=0))
    store.save_job(job, durable=False)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


SECRET = {"forward": {"TOKEN": "hunter2"}, "job_env": {"X": "y"}, "base": {"PATH": "/bin"}}


def test_a_forwarded_environment_never_enters_the_journal_and_goes_at_the_durable_start(tmp_path):
    s = _open(tmp_path)
    job = _add(s, 1, SECRET)
    s.commit()
    path = os.path.join(tmp_path, "env", "1")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert b"hunter2" not in _read(s.journal.path)
    assert b"hunter2" not in _read(os.path.join(tmp_path, "jobs", "1", "job.json"))
    assert s.load_env(job)["forward"] == {"TOKEN": "hunter2"} and s.load_env(job)["job_env"] == {"X": "y"}
    inode = os.stat(s.journal.path).st_ino
    _start(job)
    s.save_job(job)
    assert os.path.exists(path), "the start is not durable yet: a failed commit puts the job back"
    s.commit()
    assert not os.path.exists(path)
    assert os.stat(s.journal.path).st_ino == inode, "dropping a secret must not rewrite the journal"
    out = b"".join(_read(os.path.join(dp, f)) for dp, _, fs in os.walk(tmp_path) for f in fs if f != "daemon.lock")
    assert b"hunter2" not in out


def test_a_start_the_commit_refused_keeps_the_environment(tmp_path):
    s = _open(tmp_path)
    job = _add(s, 1, SECRET)
    s.commit()
    _start(job)
    s.save_job(job)
    jobs.move(job, jobs.QUEUED, 1.8e9 + 2)   # what the engine does when the commit fails
    s.save_job(job)
    s.commit()
    assert s.load_env(job)["forward"] == {"TOKEN": "hunter2"}


def test_a_submit_committed_before_its_start_is_written_keeps_the_environment(tmp_path):
    """The engine answers a submit at its own commit and writes the start it made after it
    (Starting.write_put_off): that first commit must not let the environment go."""
    s = _open(tmp_path)
    job = _add(s, 1, SECRET)
    _start(job)                              # decided while answering; its record is not written yet
    s.commit()                               # the submit's commit
    path = os.path.join(tmp_path, "env", "1")
    assert os.path.exists(path) and s.load_env(job)["forward"] == {"TOKEN": "hunter2"}
    s.save_job(job)                          # the start's record (its launch spec holds the environment)
    s.commit()
    assert not os.path.exists(path)


def test_a_start_put_back_on_a_full_disk_keeps_the_environment(tmp_path, monkeypatch):
    s = _open(tmp_path)
    job = _add(s, 1, SECRET)
    s.commit()
    _start(job)
    s.save_job(job)                          # its start is staged; then the commit fails

    def full(*_):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(s.cache, "write", full)
    jobs.move(job, jobs.QUEUED, 1.8e9 + 2)   # the engine puts it back in the queue; that record fails too
    with pytest.raises(OSError):
        s.save_job(job)
    monkeypatch.undo()
    s.commit()                               # the next commit that succeeds
    assert s.load_env(job)["forward"] == {"TOKEN": "hunter2"}


def test_an_environment_survives_a_restart_until_the_start_and_is_swept_after_it(tmp_path):
    s = _open(tmp_path)
    _add(s, 1, SECRET)
    s.commit()
    s2 = _reopen(tmp_path, s)
    job = s2.load_jobs()[0]
    assert s2.load_env(job)["forward"] == {"TOKEN": "hunter2"}
    _start(job)
    s2.save_job(job)           # the start's cache is written; the daemon dies before the commit
    s3 = _reopen(tmp_path, s2)
    assert s3.load_jobs()[0].state == jobs.RUNNING    # the newer cache wins (a launch spec is there)
    assert not os.path.exists(os.path.join(tmp_path, "env", "1"))


def test_a_bulk_stores_its_command_and_environment_once(tmp_path):
    s = _open(tmp_path)
    big = ["x" * 100_000]
    env = {"forward": {"BIG": "y" * 100_000}, "job_env": {}, "base": {}}
    bulk = [_job(i, argv=big, first=1) for i in range(1, 301)]
    before = s.journal.size
    s.add_jobs(bulk, env, None, argv=big)
    s.commit()
    written = s.journal.size - before
    caches = sum(os.path.getsize(os.path.join(tmp_path, "jobs", str(i), "job.json")) for i in range(1, 301))
    # One copy of each 100 kB, and well under 1 kB of journal and cache per element.
    assert written < 200_000 + 300 * 1000, written
    assert caches < 300 * 1000, caches
    assert os.path.getsize(os.path.join(tmp_path, "env", "1")) > 100_000
    s2 = _reopen(tmp_path, s)
    loaded = s2.load_jobs()
    assert len(loaded) == 300 and loaded[0].argv == big
    assert all(j.argv is loaded[0].argv for j in loaded), "elements share one argv list after a restart"
    for job in loaded[:-1]:
        _start(job)
        s2.save_job(job)
    s2.commit()
    assert os.path.exists(os.path.join(tmp_path, "env", "1")), "one element has not started yet"
    _start(loaded[-1])
    s2.save_job(loaded[-1])
    s2.commit()
    assert not os.path.exists(os.path.join(tmp_path, "env", "1"))
    for job in loaded[:-1]:
        s2.remove_job(job.id)
    s2.commit()
    assert os.path.exists(os.path.join(tmp_path, "shared", "1.json")), "one element still refers to it"
    s2.remove_job(loaded[-1].id)
    s2.commit()
    assert not os.path.exists(os.path.join(tmp_path, "shared", "1.json"))
    assert _reopen(tmp_path, s2).load_jobs() == []


def test_replay_rebuilds_lost_caches_and_drops_the_unacknowledged_tail(tmp_path):
    s = _open(tmp_path)
    for i in (1, 2):
        _add(s, i)
    s.commit()
    _add(s, 3)                           # written, never committed: never acknowledged
    os.remove(os.path.join(tmp_path, "jobs", "1", "job.json"))
    s2 = _reopen(tmp_path, s)
    assert [j.id for j in s2.load_jobs()] == [1, 2]
    assert os.path.exists(os.path.join(tmp_path, "jobs", "1", "job.json"))
    assert not os.path.exists(os.path.join(tmp_path, "jobs", "3"))
    assert any("rebuilt 1" in n for n in s2.notes)
    assert any(n.startswith("dropped jobs 3:") for n in s2.notes), s2.notes


def test_a_newer_cache_wins_over_the_journal(tmp_path):
    s = _open(tmp_path)
    job = _add(s, 1)
    s.commit()
    job.name = "renamed"
    s.save_job(job, durable=False)       # e.g. a finished job's record, its exit record already on disk
    assert _reopen(tmp_path, s).load_jobs()[0].name == "renamed"


def _cache(tmp_path, job_id):
    return os.path.join(tmp_path, "jobs", str(job_id), "job.json")


def test_a_durable_jobs_cache_is_rewritten_in_place_a_new_ones_renamed_in(tmp_path):
    s = _open(tmp_path)
    job = _add(s, 1)
    first = os.stat(_cache(tmp_path, 1)).st_ino
    _start(job)
    s.save_job(job)                      # its submit is not durable yet: a new file, renamed in
    assert os.stat(_cache(tmp_path, 1)).st_ino != first
    s.commit()
    renamed = os.stat(_cache(tmp_path, 1)).st_ino
    jobs.move(job, jobs.QUEUED, 1.8e9 + 2)   # a shorter record: padded to the old length
    s.save_job(job)
    s.commit()
    assert os.stat(_cache(tmp_path, 1)).st_ino == renamed
    raw = _read(_cache(tmp_path, 1))
    assert raw.endswith(b" ") and raw.rstrip(b" ").endswith(b"}")
    assert _reopen(tmp_path, s).load_jobs()[0].state == jobs.QUEUED


def test_a_torn_rewrite_of_a_cache_reads_as_none_and_the_journal_stands_in(tmp_path):
    s = _open(tmp_path)
    job = _add(s, 1)
    s.commit()
    old = _read(_cache(tmp_path, 1))
    _start(job)
    s.save_job(job)
    s.commit()
    new = _read(_cache(tmp_path, 1))
    with open(_cache(tmp_path, 1), "r+b") as f:   # the rewrite cut short: new bytes, then the old ones
        f.write(new[:len(old) // 2] + old[len(old) // 2:])
    s2 = _reopen(tmp_path, s)
    assert s2.load_jobs()[0].state == jobs.RUNNING
    assert any("rebuilt 1" in n for n in s2.notes), s2.notes
    assert _read(_cache(tmp_path, 1)).rstrip(b" ") == new


def test_no_snapshot_while_a_cache_rewrite_is_unfinished(tmp_path, monkeypatch):
    s = _open(tmp_path)
    job = _add(s, 1)
    s.commit()
    _start(job)

    def short(fd, data, offset):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "pwrite", short)
    monkeypatch.setattr("hpc_batch.daemon.jobcache.write_atomic", lambda *a, **k: short(0, b"", 0))
    with pytest.raises(OSError):
        s.save_job(job)
    with pytest.raises(OSError):
        s._snapshot()                    # the job's cache may be torn: it would drop the job
    monkeypatch.undo()
    s.save_job(job)
    s.commit()
    s._snapshot()
    assert _reopen(tmp_path, s).load_jobs()[0].state == jobs.RUNNING


def test_an_evicted_jobs_directory_goes_off_the_loop_and_a_leftover_at_the_next_start(tmp_path):
    s = _open(tmp_path)
    for i in (1, 2):
        _add(s, i)
    s.commit()
    s.remove_job(1)
    assert os.path.isdir(os.path.join(tmp_path, "jobs", "1"))          # kept until its drop is durable
    s.commit()
    assert not os.path.exists(os.path.join(tmp_path, "jobs", "1"))     # then moved aside at once
    s.sweeper.wait()
    assert os.listdir(os.path.join(tmp_path, "gone")) == []
    os.makedirs(os.path.join(tmp_path, "gone", "7", "sub"))            # left by a crash mid-sweep
    s.commit()
    s2 = _reopen(tmp_path, s)
    assert [j.id for j in s2.load_jobs()] == [2]
    s2.sweeper.wait()
    assert os.listdir(os.path.join(tmp_path, "gone")) == []


def test_a_crash_before_the_drop_is_durable_keeps_the_evicted_job_and_its_files(tmp_path):
    s = _open(tmp_path)
    job = _add(s, 1)
    s.commit()
    _start(job)
    s.save_job(job)
    s.commit()
    with open(os.path.join(tmp_path, "jobs", "1", "exit"), "w") as f:   # what its shepherd wrote
        f.write("{}")
    s.remove_job(1)                      # evicted; the loop is killed before the turn's commit
    s.sweeper.wait()
    s2 = _reopen(tmp_path, s)
    assert [(j.id, j.state) for j in s2.load_jobs()] == [(1, jobs.RUNNING)]
    assert os.path.exists(os.path.join(tmp_path, "jobs", "1", "exit")), "its end is still there to collect"


def test_a_refused_submit_removed_before_its_commit_goes_at_once(tmp_path):
    s = _open(tmp_path)
    job = _add(s, 1)                     # staged, never committed: the commit that held it failed
    s.remove_job(1)
    s.forget({1})
    s.sweeper.wait()
    assert not os.path.exists(os.path.join(tmp_path, "jobs", "1"))
    s.commit()
    assert _reopen(tmp_path, s).load_jobs() == [] and job.id == 1


def _batches(tmp_path):
    """A store that committed jobs 1..5 one batch each; the journal's byte offsets after each batch."""
    s = _open(tmp_path)
    ends = [s.journal.size]
    for i in range(1, 6):
        _add(s, i, SECRET if i == 4 else None)
        s.commit()
        ends.append(s.journal.size)
    return s, ends


@pytest.mark.parametrize("cut", ["boundary", "mid_line"])
def test_a_journal_cut_in_half_recovers_every_acknowledged_job_and_names_them(tmp_path, cut):
    s, ends = _batches(tmp_path)
    data = _read(s.journal.path)
    size = ends[2] if cut == "boundary" else ends[2] + (ends[3] - ends[2]) // 2
    with open(s.journal.path, "r+b") as f:
        f.truncate(size)                 # jobs 3, 4 and 5 lost their lines (acknowledged all)
    s2 = _reopen(tmp_path, s)
    loaded = s2.load_jobs()
    assert [j.id for j in loaded] == [1, 2, 3, 4, 5]
    assert any("recovered jobs 3-5" in n for n in s2.notes), s2.notes
    assert s2.load_env(loaded[3])["forward"] == {"TOKEN": "hunter2"}
    kept = [n for n in os.listdir(os.path.join(tmp_path, "quarantine")) if n.startswith("journal.")]
    assert kept and _read(os.path.join(tmp_path, "quarantine", kept[0])) == data[:size]
    assert [j.id for j in _reopen(tmp_path, s2).load_jobs()] == [1, 2, 3, 4, 5]


def test_only_a_torn_unacknowledged_last_batch_is_dropped(tmp_path):
    s, ends = _batches(tmp_path)
    with open(s.journal.path, "r+b") as f:
        f.truncate(ends[4] + (ends[5] - ends[4]) // 2)    # a crash mid-append of job 5's batch
    s2 = _reopen(tmp_path, s)
    assert [j.id for j in s2.load_jobs()] == [1, 2, 3, 4]
    assert any(n.startswith("dropped jobs 5:") for n in s2.notes), s2.notes
    assert not any("recovered" in n for n in s2.notes)


def test_a_lost_line_of_an_old_batch_is_damage_and_every_cache_is_kept(tmp_path):
    s, _ = _batches(tmp_path)
    lines = _read(s.journal.path).split(b"\n")
    hit = next(i for i, raw in enumerate(lines) if b'"job"' in raw and b'"id":2' in raw.replace(b" ", b""))
    with open(s.journal.path, "wb") as f:
        f.write(b"\n".join(lines[:hit] + lines[hit + 1:]))
    s2 = _reopen(tmp_path, s)
    assert [j.id for j in s2.load_jobs()] == [1, 2, 3, 4, 5]
    assert any("journal" in n and "quarantine" in n for n in s2.notes), s2.notes


def test_an_old_journal_without_batches_still_loads(tmp_path):
    s = _open(tmp_path)
    old = {"id": 7, "uid": 0, "gid": 0, "user": "root", "argv": ["true"], "cwd": "/", "submitted": 1.8e9,
           "max_time": 60, "budget": {"mem": 1 << 20}, "state": "queued", "seq": 2,
           "env": {"forward": {"TOKEN": "hunter2"}, "job_env": {}, "base": {}}}
    with open(s.journal.path, "wb") as f:
        f.write(journal.line({"seq": 1, "meta": {"next_id": 8}}) + journal.line({"seq": 2, "job": old}))
    shutil.rmtree(os.path.join(tmp_path, "jobs"))
    os.mkdir(os.path.join(tmp_path, "jobs"))
    s2 = _reopen(tmp_path, s)
    job = s2.load_jobs()[0]
    assert job.id == 7 and s2.load_meta()["next_id"] == 8
    assert s2.load_env(job)["forward"] == {"TOKEN": "hunter2"}     # moved to its env file
    assert b"hunter2" not in _read(s2.journal.path)
    assert b"hunter2" not in _read(os.path.join(tmp_path, "jobs", "7", "job.json"))


def test_submits_wait_while_the_state_filesystem_is_below_its_reserve(tmp_path):
    s = _open(tmp_path)
    assert s.short_of_room(0) is None
    why = s.short_of_room(1 << 62)
    assert str(tmp_path) in why and "--state-reserve" in why and "\n" not in why


def test_commands_share_their_environment_and_a_lone_jobs_shared_record_goes_at_its_end(tmp_path):
    s = _open(tmp_path)
    lines = [_job(i, argv=["/bin/sh", "-c", f"echo {i}"], first=1) for i in (1, 2)]
    s.add_jobs(lines, SECRET, None)                 # --commands: each its own argv, one environment
    lone = _job(3)
    s.add_jobs([lone], SECRET, None)
    s.commit()
    assert sorted(os.listdir(os.path.join(tmp_path, "env"))) == ["1", "3"]
    assert b"echo 2" in _read(os.path.join(tmp_path, "jobs", "2", "job.json"))
    for job in (*lines, lone):
        _start(job)
        s.save_job(job)
    s.commit()
    assert os.listdir(os.path.join(tmp_path, "env")) == [], "a forwarded environment goes at the start"
    assert sorted(os.listdir(os.path.join(tmp_path, "shared"))) == ["1.json", "3.json"]
    for job in (*lines, lone):
        _end(job, s)
    s.commit()
    assert os.listdir(os.path.join(tmp_path, "shared")) == []
    assert [j.argv[-1] for j in _reopen(tmp_path, s).load_jobs()] == ["echo 1", "echo 2", "true"]


def test_a_compacted_journal_leaves_the_caches_current(tmp_path):
    """A snapshot keeps each record's seq, so the next start rewrites no job.json."""
    from hpc_batch.core.jobs import Job
    store = Store(str(tmp_path))
    store.open()
    store.load_jobs()
    jobs = [Job(id=i, uid=0, gid=0, user="root", argv=["true"], cwd="/", submitted=1.0, max_time=60,
                budget={"mem": 1 << 20}) for i in range(1, 6)]
    store.add_jobs(jobs, {}, None)
    store.commit()
    store._snapshot()
    again = Store(str(tmp_path))
    again._lock_fd = -1
    assert [j.id for j in again.load_jobs()] == [1, 2, 3, 4, 5]
    assert not any("rebuilt" in n for n in again.notes), again.notes


@pytest.mark.parametrize("env", [SECRET, {"base": {"PATH": "/bin"}}], ids=["forwarded", "clean"])
def test_a_durable_start_whose_command_never_ran_gets_its_environment_back(tmp_path, env):
    """Out of pids after the start was durable: the job is queued again with its launch environment."""
    s = _open(tmp_path)
    job = _add(s, 1, env)
    s.commit()
    _start(job)
    s.save_job(job)
    s.commit()                                   # the start is durable: the environment is let go of
    assert not os.path.exists(os.path.join(tmp_path, "env", "1"))
    launch_env = {"PATH": "/bin", "TOKEN": "hunter2", "HPC_BATCH_JOB_ID": "1"}
    jobs.move(job, jobs.QUEUED, 1.8e9 + 2)
    s.unstart(job, launch_env)
    s.save_job(job)
    s.commit()
    # A forwarded environment comes back from the launch spec; a clean one was kept.
    want = launch_env if env is SECRET else None
    assert s.load_env(job).get("forward") == want and s.load_env(job)["base"] == env["base"]
    again = _reopen(tmp_path, s)                 # and after a restart
    (back,) = again.load_jobs()
    assert back.state == jobs.QUEUED and again.load_env(back).get("forward") == want
    _start(back)
    again.save_job(back)
    again.commit()                               # started for real: gone again
    assert not os.path.exists(os.path.join(tmp_path, "env", "1"))


def test_a_clean_environment_is_kept_until_the_end_and_a_forwarded_one_until_the_start(tmp_path):
    """The launch spec of a job with a clean environment is not flushed: after a power cut the
    store must still be able to start it again. A forwarded one goes at the start (the README)."""
    s = _open(tmp_path)
    clean, forwarded = _add(s, 1, {"base": {"PATH": "/bin", "LANG": "C"}}), _add(s, 2, SECRET)
    s.commit()
    assert s.keeps_env(clean) and not s.keeps_env(forwarded)
    for job in (clean, forwarded):
        _start(job)
        s.save_job(job)
    s.commit()
    assert s.keeps_env(clean) and s.load_env(clean)["base"] == {"PATH": "/bin", "LANG": "C"}
    assert not os.path.exists(os.path.join(tmp_path, "env", "2"))
    again = _reopen(tmp_path, s)                 # a power cut while they run
    running = {j.id: j for j in again.load_jobs()}
    assert again.keeps_env(running[1]) and again.load_env(running[1])["base"]["LANG"] == "C"
    assert not again.keeps_env(running[2])
    _end(running[1], again)
    again.commit()
    assert not again.keeps_env(running[1])
    assert not os.path.exists(os.path.join(tmp_path, "shared", "1.json"))
    assert os.path.exists(os.path.join(tmp_path, "shared", "2.json")), "job 2 runs on"


def test_a_jobs_dict_is_what_asdict_gives_in_json_and_shares_nothing_with_it():
    import dataclasses
    job = _job(1, argv=["a", "b"], first=1)
    alloc = Allocation(cpus=(0, 1), mem_by_node=((0, 5),), gpus=(), exclusive=False)
    jobs.move(job, jobs.RUNNING, 1.8e9 + 1, alloc=alloc)
    job.stats = {"peak_mem": 3, "nested": {"x": [1, {"y": 2}]}}
    data = job.to_dict()
    assert data == dataclasses.asdict(job) | {"alloc": {"cpus": [0, 1], "mem_by_node": [[0, 5]], "gpus": [],
                                                       "exclusive": False, "cores": [], "l3_idle": []},
                                             "request": job.request.to_dict()}
    assert jobs.Job.from_dict(data) == job, "the stored form comes back as the same job, typed"
    data["alloc"]["cpus"].append(9)
    data["stats"]["nested"]["x"][1]["y"] = 7
    data["argv"].append("c")
    assert job.alloc.cpus == (0, 1) and job.stats["nested"]["x"][1]["y"] == 2 and job.argv == ["a", "b"]


def test_a_compaction_written_over_many_commits_loses_nothing_that_changed_meanwhile(tmp_path, monkeypatch):
    """Each commit writes one slice of it (32 records here); jobs started, evicted and submitted
    before or after their slice come back as they were last committed, from the journal alone."""
    from hpc_batch.daemon import compaction
    monkeypatch.setattr(compaction, "COMPACT_SLICE", -1.0)   # every slice is cut at its first check
    s = _open(tmp_path)
    held = {}
    for first in range(1, 301, 100):
        bulk = [_job(i, first=first) for i in range(first, first + 100)]
        s.add_jobs(bulk, {"base": {"PATH": "/bin"}}, None, argv=["true"])
        held.update((j.id, j) for j in bulk)
    s.commit()
    s.compactor.compact(0.0)               # begun: the shared records and the first jobs written
    assert s.compacting
    for job_id in (5, 250):                # 5 is in the snapshot already, 250 not yet
        _start(held[job_id])
        s.save_job(held[job_id])
    s.remove_job(10)
    s.remove_job(200)
    new = _add(s, 301)
    s.commit()
    turns = 1
    while s.compacting:
        s.commit()
        turns += 1
    assert 3 < turns < 50, turns
    assert not os.path.exists(os.path.join(tmp_path, "journal.tmp"))
    s.sweeper.wait()
    for name in os.listdir(os.path.join(tmp_path, "jobs")):   # the caches lost: the journal alone
        os.unlink(os.path.join(tmp_path, "jobs", name, "job.json"))
    s2 = _reopen(tmp_path, s)
    loaded = {j.id: j for j in s2.load_jobs()}
    assert sorted(loaded) == sorted(set(held) - {10, 200} | {new.id})
    assert {i for i, j in loaded.items() if j.state == jobs.RUNNING} == {5, 250}
    assert loaded[150].argv == ["true"] and loaded[301].state == jobs.QUEUED


def test_a_commit_that_fails_gives_up_the_compaction_under_way(tmp_path, monkeypatch):
    """On a disk that refuses the batch, the loop must not spin on a compaction it cannot finish."""
    from hpc_batch.daemon import compaction
    monkeypatch.setattr(compaction, "COMPACT_SLICE", -1.0)
    s = _open(tmp_path)
    s.add_jobs([_job(i, first=1) for i in range(1, 101)], {"base": {"PATH": "/bin"}}, None, argv=["true"])
    s.commit()
    s.compactor.compact(0.0)
    assert s.compacting and os.path.exists(os.path.join(tmp_path, "journal.tmp"))
    _add(s, 101)

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", full)
    with pytest.raises(OSError):
        s.commit()
    monkeypatch.setattr(os, "fdatasync", os.fsync)
    assert not s.compacting and not os.path.exists(os.path.join(tmp_path, "journal.tmp"))
    s.commit()                                 # the batch, staged still, goes in once the disk takes it
    assert sorted(j.id for j in _reopen(tmp_path, s).load_jobs()) == list(range(1, 102))


BIG = ["true"] + ["w" * 100_000] * 10      # a 1 MB command, as the third review's G8 submitted


def test_a_jobs_command_enters_the_journal_once_whatever_happens_to_it_after(tmp_path):
    """G8: a start and an end (or a cancel) journal the change, not the 1 MB command again."""
    s = _open(tmp_path)
    job = _job(1, argv=list(BIG))
    s.add_jobs([job], {"base": {"PATH": "/bin"}}, None)
    s.commit()
    after_submit = s.journal.size
    assert after_submit > 1_000_000
    _start(job)
    s.save_job(job)
    s.commit()
    jobs.move(job, jobs.FINISHED, 1.8e9 + 2, result=jobs.Result(jobs.KILLED))
    s.save_job(job)
    s.commit()
    assert s.journal.size - after_submit < 4096, "each change journalled the command again"
    cache = _read(os.path.join(tmp_path, "jobs", "1", "job.json"))
    assert cache.count(b"w" * 100_000) == 10            # the cache is whole on its own
    os.remove(os.path.join(tmp_path, "jobs", "1", "job.json"))   # the journal alone must rebuild it
    back = _reopen(tmp_path, s).load_jobs()
    assert back[0].argv == BIG and back[0].state == jobs.FINISHED


def test_a_snapshot_holds_each_command_once_and_later_changes_still_say_same(tmp_path):
    s = _open(tmp_path)
    job = _job(1, argv=list(BIG))
    s.add_jobs([job], {"base": {"PATH": "/bin"}}, None)
    s.commit()
    s._snapshot()
    _start(job)
    s.save_job(job)
    s.commit()
    raw = _read(s.journal.path)
    assert raw.count(b"w" * 100_000) == 10 and b'"same":"argv"' in raw
    os.remove(os.path.join(tmp_path, "jobs", "1", "job.json"))
    assert _reopen(tmp_path, s).load_jobs()[0].argv == BIG


def test_the_reserve_counts_what_unfinished_jobs_may_still_journal(tmp_path):
    """The lines a queued job may still write are owed from its submit, and forgiven at its end."""
    s = _open(tmp_path)
    assert s.owed == 0
    job = _add(s, 1)
    s.commit()
    owed = s.owed
    assert owed > 0
    reserve = 1 << 20
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    # A reserve that leaves room for exactly the journal: the owed lines tip it over.
    assert s.short_of_room(free - s.journal.size - owed - reserve) is None or owed == 0
    why = s.short_of_room(free - s.journal.size - owed // 2)
    assert why is not None and "may still write" in why
    jobs.move(job, jobs.FINISHED, 1.8e9 + 2, result=jobs.Result(jobs.CANCELLED))
    s.save_job(job)
    assert s.owed == 0
    assert _reopen(tmp_path, s).owed == 0


def test_a_reloaded_daemon_owes_the_lines_of_the_jobs_it_finds_unfinished(tmp_path):
    s = _open(tmp_path)
    for i in (1, 2):
        _add(s, i)
    s.commit()
    assert s.owed > 0 and abs(_reopen(tmp_path, s).owed - s.owed) < s.owed / 10   # counted from the loaded records


def _bulk(s, first, count, per_slice, end=True):
    """A bulk stored a slice per commit, as the engine stores one (bulks.py)."""
    sh = s.begin_bulk(first, {"base": {"PATH": "/bin"}}, ["true"])
    for at in range(first, first + count, per_slice):
        s.add_slice(sh, [_job(i, argv=sh.argv, first=first) for i in range(at, min(at + per_slice, first + count))],
                    None)
        if at + per_slice >= first + count and end:
            s.end_bulk(sh)
        s.commit()
    return sh


def test_a_bulk_stored_over_many_commits_is_loaded_whole_once_ended(tmp_path):
    s = _open(tmp_path)
    _add(s, 1)
    _bulk(s, 2, 10, 3)
    s.commit()
    again = _reopen(tmp_path, s)
    assert [j.id for j in again.load_jobs()] == list(range(1, 12))
    assert not any("bulk" in n for n in again.notes), again.notes


def test_a_bulk_cut_short_mid_way_leaves_none_of_it(tmp_path):
    """G9: a crash (or a stop) before the last slice's commit: the bulk was never acknowledged."""
    s = _open(tmp_path)
    _add(s, 1)
    s.commit()
    _bulk(s, 2, 10, 3, end=False)            # 4 slices committed, its end never
    s._snapshot()                            # a compaction meanwhile keeps it pending too
    again = _reopen(tmp_path, s)
    assert [j.id for j in again.load_jobs()] == [1]
    assert any(n.startswith("dropped jobs 2-11 of bulk submits from 2:") for n in again.notes), again.notes
    assert sorted(os.listdir(os.path.join(tmp_path, "jobs"))) == ["1"]
    assert not os.path.exists(os.path.join(tmp_path, "shared", "2.json"))
    assert [j.id for j in _reopen(tmp_path, again).load_jobs()] == [1]   # and it stays gone


def test_an_aborted_bulk_drops_what_it_stored(tmp_path):
    s = _open(tmp_path)
    sh = _bulk(s, 1, 6, 2, end=False)
    s.abort_bulk(sh, range(1, 7))
    s.commit()
    assert _reopen(tmp_path, s).load_jobs() == []


@pytest.mark.parametrize("keep_output", [False, True])
def test_release_removes_an_ended_jobs_run_files_and_its_buffer_unless_kept(tmp_path, keep_output):
    s = _open(tmp_path)
    _add(s, 1)
    jdir = s.job_dir(1)
    names = (records.INFO, records.LAUNCH, records.OUTPUT, records.EXIT)
    for name in names:
        with open(os.path.join(jdir, name), "w") as f:
            f.write("x")
    s.release(1, keep_output)
    left = {n for n in names if os.path.exists(os.path.join(jdir, n))}
    assert left == ({records.EXIT, records.OUTPUT} if keep_output else {records.EXIT})
    s.release(1, keep_output)   # once more: what is gone already is no error

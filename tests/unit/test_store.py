"""The store over a real directory: journal replay, caches, and secrets that must not outlive the start."""

import os

from hpc_batch import jobs
from hpc_batch.store import Store


def _job(job_id, state=jobs.QUEUED):
    return jobs.Job(id=job_id, uid=0, gid=0, user="root", argv=["true"], cwd="/", submitted=1.8e9,
                    max_time=60, budget={"mem": 1 << 20}, state=state)


def _open(path):
    s = Store(str(path))
    s.open()
    s.load_jobs()
    return s


def test_a_started_jobs_environment_leaves_the_journal(tmp_path):
    s = _open(tmp_path)
    job = _job(1)
    s.create_job_dir(1, None)
    s.save_job(job, {"forward": {"TOKEN": "hunter2"}, "job_env": {}, "base": {}})
    s.commit()
    journal = os.path.join(tmp_path, "journal")
    assert b"hunter2" in open(journal, "rb").read()
    s.save_job(job)                      # started: the record drops its environment
    s.commit()
    assert b"hunter2" not in open(journal, "rb").read()
    assert b"hunter2" not in open(os.path.join(tmp_path, "jobs", "1", "job.json"), "rb").read()


def test_replay_rebuilds_lost_caches_and_drops_unacknowledged_dirs(tmp_path):
    s = _open(tmp_path)
    for i in (1, 2):
        s.create_job_dir(i, None)
        s.save_job(_job(i), {"base": {"PATH": "/bin"}})
    s.commit()
    s.create_job_dir(3, None)            # written, never committed: never acknowledged
    s.save_job(_job(3))
    os.remove(os.path.join(tmp_path, "jobs", "1", "job.json"))
    s2 = Store(str(tmp_path))
    s2.open(inherited_lock=s.lock_fd)
    assert [j.id for j in s2.load_jobs()] == [1, 2]
    assert os.path.exists(os.path.join(tmp_path, "jobs", "1", "job.json"))
    assert not os.path.exists(os.path.join(tmp_path, "jobs", "3"))
    assert any("rebuilt 1" in n for n in s2.notes)


def test_a_newer_cache_wins_over_the_journal(tmp_path):
    s = _open(tmp_path)
    job = _job(1)
    s.create_job_dir(1, None)
    s.save_job(job)
    s.commit()
    job.name = "renamed"
    s.save_job(job, durable=False)       # e.g. a finished job's record, its exit record already on disk
    s2 = Store(str(tmp_path))
    s2.open(inherited_lock=s.lock_fd)
    assert s2.load_jobs()[0].name == "renamed"

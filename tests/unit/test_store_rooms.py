"""The store's rooms on their own: the job.json cache's forms, quarantine/, and the staged lines."""

import json
import os

from hpc_batch.core import jobs
from hpc_batch.daemon.commit import LINES_TO_COME, Staging
from hpc_batch.daemon.jobcache import JobCache
from hpc_batch.daemon.journal import Journal
from hpc_batch.daemon.quarantine import Quarantine


def _job(job_id, state=jobs.QUEUED):
    return jobs.Job(id=job_id, uid=0, gid=0, user="root", argv=["true"], cwd="/", submitted=1.8e9,
                    max_time=60, budget={"mem": 1 << 20}, state=state)


def _cache(tmp_path):
    cache = JobCache(str(tmp_path / "jobs"))
    os.mkdir(cache.dir)
    return cache


def test_a_checksummed_cache_reads_back_and_a_changed_byte_reads_as_none(tmp_path):
    cache = _cache(tmp_path)
    job = _job(1)
    cache.create_job_dir(1, None)
    cache.write(job, {**job.to_dict(), "seq": 3, "batch": 1})
    assert cache.read(1)["seq"] == 3 and "crc" not in cache.read(1) and "format" not in cache.read(1)
    path = os.path.join(cache.job_dir(1), "job.json")
    with open(path, "rb") as f:
        raw = f.read()
    with open(path, "wb") as f:
        f.write(raw.replace(b'"seq":3', b'"seq":4'))
    assert cache.read(1) is None


def test_a_cache_in_another_form_is_read_as_it_is(tmp_path):
    """An older daemon's job.json, or one an admin saved with other spacing, has no checksum to fail."""
    cache = _cache(tmp_path)
    cache.create_job_dir(2, None)
    with open(os.path.join(cache.job_dir(2), "job.json"), "w") as f:
        json.dump({**_job(2).to_dict(), "seq": 5}, f, indent=2)
    assert cache.read(2)["seq"] == 5


def test_quarantine_notes_where_a_record_went_and_knows_the_highest_id_set_aside(tmp_path):
    notes: list = []
    q = Quarantine(str(tmp_path / "quarantine"), notes)
    assert q.highest_id() == 0                               # no directory yet
    for name in ("7", "12", "daemon.json"):
        (tmp_path / name).write_text("{}")
        dest = q.move(str(tmp_path / name), name, "bad", "set aside")
        assert dest is not None and os.path.exists(dest) and dest in notes[-1]
    assert q.highest_id() == 12
    assert q.move(str(tmp_path / "missing"), "job 9", "bad", "lost") is None
    assert "nor moved aside" in notes[-1]


def test_forgetting_a_refused_job_unstages_only_its_lines_and_what_it_was_owed(tmp_path):
    staging = Staging(Journal(str(tmp_path)))
    for job_id in (1, 2):
        staging.stage(job_id, {"seq": staging.next_seq(), "drop": job_id})
        staging.live.add(job_id)
        staging.owe(_job(job_id), 100)
    assert staging.owed == 2 * LINES_TO_COME * (100 + 64)
    staging.forget({1})
    assert [j for j, _ in staging.pending] == [2] and staging.live == {2}
    assert staging.owed == LINES_TO_COME * (100 + 64)
    staging.owe(_job(2, jobs.FINISHED), 100)                 # a finished job may write no more lines
    assert staging.owed == 0 and staging.has_pending

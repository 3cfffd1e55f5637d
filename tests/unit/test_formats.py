"""Format versions of the journal and job.json: written, accepted when absent, a newer one refused."""

import json
import os

import pytest

from hpc_batch import __version__
from hpc_batch.core import jobs
from hpc_batch.daemon import formats, journal
from hpc_batch.daemon.store import StateError, Store


def _job(job_id):
    return jobs.Job(id=job_id, uid=0, gid=0, user="root", argv=["true"], cwd="/", submitted=1.8e9,
                    max_time=60, budget={"mem": 1 << 20})


def _open(path, lock=None):
    s = Store(str(path))
    s.open(inherited_lock=lock)
    s.load_jobs()
    return s


def _with_jobs(path, *ids):
    s = _open(path)
    for job_id in ids:
        s.add_jobs([_job(job_id)], {"base": {"PATH": "/bin"}}, None)
    s.commit()
    return s


def _lines(path):
    with open(os.path.join(path, "journal"), "rb") as f:
        return [json.loads(raw) for raw in f.read().splitlines()]


def _rewrite_journal(path, edit):
    lines = _lines(path)
    edit(lines)
    with open(os.path.join(path, "journal"), "wb") as f:
        f.write(b"".join(journal.line(e) for e in lines))


def _without_header(lines):
    """The journal as an older version wrote it: no format line (and its batch one line shorter)."""
    assert "format" in lines.pop(0)
    next(e for e in lines if "commit" in e)["lines"] -= 1


def _job_json(path, job_id):
    return os.path.join(path, "jobs", str(job_id), "job.json")


def _load_json(path):
    with open(path) as f:
        return json.load(f)


def test_this_version_writes_its_formats(tmp_path):
    s = _with_jobs(tmp_path, 1)
    assert _lines(tmp_path)[0] == {"seq": _lines(tmp_path)[0]["seq"], "format": formats.JOURNAL}
    assert _load_json(_job_json(tmp_path, 1))["format"] == formats.JOB
    # The journal's job lines are the record alone: the format is the journal's, said once.
    assert all("format" not in e["job"] for e in _lines(tmp_path) if "job" in e)
    s.commit()
    s2 = _open(tmp_path, lock=s.lock_fd)     # and reads them back
    assert [j.id for j in s2.load_jobs()] == [1]


def test_files_without_a_format_are_the_first_format(tmp_path):
    s = _with_jobs(tmp_path, 1, 2)
    _rewrite_journal(tmp_path, _without_header)
    for job_id in (1, 2):
        data = _load_json(_job_json(tmp_path, job_id))
        del data["format"]
        with open(_job_json(tmp_path, job_id), "w") as f:
            json.dump(data, f)
    s2 = _open(tmp_path, lock=s.lock_fd)
    assert [j.id for j in s2.load_jobs()] == [1, 2]
    assert not os.path.exists(os.path.join(tmp_path, "quarantine"))
    assert _lines(tmp_path)[0]["format"] == formats.JOURNAL     # rewritten in this version's format


@pytest.mark.parametrize("value", [formats.JOURNAL + 1, "2", None])
def test_a_newer_journal_stops_the_start_and_is_left_as_it_is(tmp_path, value):
    s = _with_jobs(tmp_path, 1)
    _rewrite_journal(tmp_path, lambda lines: lines[0].update(format=value))
    with open(os.path.join(tmp_path, "journal"), "rb") as f:
        before = f.read()
    with pytest.raises(StateError) as info:
        _open(tmp_path, lock=s.lock_fd)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(os.path.join(tmp_path, "journal") + ": ")
    assert __version__ in message and f"1 to {formats.JOURNAL}" in message
    if value == formats.JOURNAL + 1:
        assert f"journal format {value} is newer" in message
    with open(os.path.join(tmp_path, "journal"), "rb") as f:
        assert f.read() == before
    assert not os.path.exists(os.path.join(tmp_path, "quarantine"))


def test_a_newer_journal_is_refused_from_its_first_line_whatever_follows(tmp_path):
    # A later format may change every line after the first: those are not read (nor called damage).
    path = os.path.join(tmp_path, "journal")
    with open(path, "wb") as f:
        f.write(journal.line({"seq": 1, "format": formats.JOURNAL + 1}) + b"something else entirely\n")
    with pytest.raises(formats.NewerFormat):
        journal.Journal(str(tmp_path)).read()


def test_a_newer_job_json_is_quarantined_with_its_directory_and_the_rest_load(tmp_path):
    s = _with_jobs(tmp_path, 1, 2)
    data = _load_json(_job_json(tmp_path, 2))
    data["format"] = formats.JOB + 1
    data["seq"] += 100        # as if a newer daemon had written it last
    with open(_job_json(tmp_path, 2), "w") as f:
        json.dump(data, f)
    s2 = _open(tmp_path, lock=s.lock_fd)
    assert [j.id for j in s2.load_jobs()] == [1]
    moved = os.listdir(os.path.join(tmp_path, "quarantine"))
    assert len(moved) == 1 and moved[0].startswith("2.")
    assert os.path.exists(os.path.join(tmp_path, "quarantine", moved[0], "job.json"))
    note = [n for n in s2.notes if n.startswith("job 2 ")]
    assert len(note) == 1 and "\n" not in note[0]
    assert _job_json(tmp_path, 2) in note[0] and f"job.json format {formats.JOB + 1} is newer" in note[0]
    assert "no longer tracked" in note[0]
    assert all(e.get("job", {}).get("id") != 2 for e in _lines(tmp_path))   # forgotten by the journal too


def test_the_check_names_the_file_and_both_versions():
    with pytest.raises(formats.NewerFormat) as info:
        formats.check({"format": 7}, 3, "/x/job.json", "job.json")
    assert str(info.value) == (f"/x/job.json: job.json format 7 is newer than this hpc-batchd ({__version__}) "
                               f"reads (formats 1 to 3); a newer hpc-batch wrote it")
    formats.check({}, 1, "/x", "journal")                 # absent: the first format
    formats.check({"format": 3}, 3, "/x", "journal")
    for bad in (0, True, 1.0, "1"):
        with pytest.raises(formats.NewerFormat):
            formats.check({"format": bad}, 3, "/x", "journal")

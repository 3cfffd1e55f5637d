"""What ran (shepherd/child.py ``_exec``'s report) and its hash's cache (shepherd/record/executable.py):
the third review's G4 and G6, without a daemon."""

import hashlib
import json
import os
import stat

import pytest

from hpc_batch.core import setup
from shepherd import child
from shepherd.base import records
from shepherd.record import executable, recorder

pytestmark = pytest.mark.timeout(60)


def _spec(tmp_path, **kw):
    spec = {"id": 7, "user": "nobody", "uid": os.getuid(), "gid": os.getgid(), "cwd": str(tmp_path),
            "argv": ["bench"], "env": {"PATH": str(tmp_path)}}
    spec.update(kw)
    return records.LaunchSpec.from_dict(spec)


def _exe(path, text=b"\x7fELF not really\n"):
    with open(path, "wb") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return str(path)


def test_a_name_resolves_to_the_first_executable_regular_file_on_the_path_and_only_that(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "bench").mkdir()                       # a directory: not a candidate
    (tmp_path / "b" / "bench").write_text("not executable")
    (tmp_path / "c").mkdir()
    want = _exe(tmp_path / "c" / "bench")
    env = {"PATH": ":".join(str(tmp_path / d) for d in "abc")}
    assert child.resolve("bench", env) == want
    assert child.resolve("./x/bench", env) == "./x/bench"    # a slash: as given, no search
    with pytest.raises(FileNotFoundError):
        child.resolve("nothing", env)


def test_the_childs_report_is_parsed_and_any_failure_after_it_kept(tmp_path):
    path = _exe(tmp_path / "bench")
    st = os.stat(path)
    fields = [b"binary-fd", *(b"%d" % v for v in (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                                  st.st_ctime_ns)), os.fsencode(path), b"/real\nname"]
    failure = b"hpc-batch: job 7 failed while running 'bench': Text file busy\n"
    info, rest = child.parse_exe_report(child.EXE_REPORT + b"\0".join(fields) + b"\0" + failure)
    assert info == {"kind": "binary-fd", "path": path, "realpath": "/real\nname", "dev": st.st_dev,
                    "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}
    assert rest == failure
    assert child.parse_exe_report(failure) == (None, failure)            # failed before it resolved a file
    assert child.parse_exe_report(child.EXE_REPORT + b"binary\0" + b"x\0" * 7) == (None, child.EXE_REPORT
                                                                                 + b"binary\0" + b"x\0" * 7)


def _launched(path, kind="binary-fd"):
    st = os.stat(path)
    return dict(kind=kind, path=path, realpath=os.path.realpath(path), **executable._identity(st))


def _recorder(tmp_path, **kw):
    jobs = tmp_path / "jobs"
    (jobs / "7").mkdir(parents=True, exist_ok=True)
    return recorder.Recorder(str(jobs / "7"), _spec(tmp_path, **kw))


def test_a_file_is_hashed_once_per_version_and_the_cache_is_the_users_own(tmp_path):
    path = _exe(tmp_path / "bench", b"\x7fELF" + b"x" * 100000)
    rec = _recorder(tmp_path)
    part, fd = rec._identify_path(path, executable._key(os.stat(path)))
    os.close(fd)
    assert part["sha256"] == hashlib.sha256(open(path, "rb").read()).hexdigest() and part["hash_from"] == "read"
    rec.sides = {}
    side = {"executable": part, "hasher": {"cpus": [0], "policy": "SCHED_IDLE", "cpu_s": 0.01}}
    rec._side_json_any = lambda name: side
    field = rec._executable_field()
    assert field["value"] == {k: part[k] for k in ("path", "realpath", "size", "sha256")}
    assert field["identity"]["executable"]["ino"] == os.stat(path).st_ino
    cache = tmp_path / "jobs" / executable.HASH_CACHE
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700 and os.listdir(cache) == [str(os.getuid())]
    # The next job of this user finds it without reading the file; another user's does not.
    again = _recorder(tmp_path)
    again.after_start(launched=_launched(path), failed=b"")
    assert again.executable["identity"]["executable"]["hash_from"] == "cache" and not again.sides
    assert again.executable["value"]["sha256"] == part["sha256"]
    assert _recorder(tmp_path, uid=os.getuid() + 1)._cache_load() == {}
    # A new version (written: its ctime moves) is another key.
    with open(path, "ab") as f:
        f.write(b"y")
    assert executable._key(os.stat(path)) not in again._cache_load()


def test_a_version_seen_at_the_start_that_is_gone_is_not_hashed_under_its_name(tmp_path):
    path = _exe(tmp_path / "bench")
    launched = _launched(path)
    os.rename(_exe(tmp_path / "other", b"#!/bin/sh\necho other\n"), path)
    part, fd = _recorder(tmp_path)._identify_path(path, executable._key(launched))
    assert fd is None and "sha256" not in part and "replaced" in part["error"], part


def test_a_failed_exec_ran_nothing_and_the_record_says_so(tmp_path):
    path = _exe(tmp_path / "bench")
    rec = _recorder(tmp_path)
    rec.after_start(launched=_launched(path), failed=b"hpc-batch: job 7 failed while running 'bench': Text file busy")
    field = rec.executable
    assert field["value"] is None and "did not run" in field["error"] and not rec.sides


def test_a_version_differs_only_in_the_fields_beside_the_value_so_diff_compares_by_sha256(tmp_path):
    value = {"path": "/a/bench", "realpath": "/a/bench", "size": 5, "sha256": "ab" * 32}
    a = {"schema": 1, "software": {"executable": {"value": value, "source": "x",
                                                  "identity": {"executable": {"ino": 1, "hash_from": "read"}}}}}
    b = {"schema": 1, "software": {"executable": {"value": dict(value), "source": "x",
                                                  "identity": {"executable": {"ino": 2, "hash_from": "cache"}}}}}
    assert setup.differences(a, b) == [] and setup.setup_digest(a) == setup.setup_digest(b)


def test_the_hasher_runs_idle_on_the_jobs_cpus(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))[-1:]
    rec = _recorder(tmp_path, cpus=cpus)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            placed = rec._confine()
            os.write(w, json.dumps([placed, sorted(os.sched_getaffinity(0)), os.sched_getscheduler(0)]).encode())
        finally:
            os._exit(0)
    os.close(w)
    placed, affinity, policy = json.loads(os.read(r, 4096))
    os.close(r)
    os.waitpid(pid, 0)
    assert affinity == cpus == placed["cpus"] and policy == os.SCHED_IDLE and placed["policy"] == "SCHED_IDLE"

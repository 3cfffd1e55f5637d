"""child.place: the shepherd puts its just-forked child on the job's CPUs before the child runs a line.

The child's own set-up (the pidfile's flush first) is meant to overlap the
shepherd's start snapshot; forked on the housekeeping CPUs, it waited there
until the shepherd blocked. The cgroup half of ``place`` needs cgroup v2 and
is run by every job of the system tier in the VM.
"""

import os

import pytest

from shepherd import child
from shepherd.base import records

pytestmark = pytest.mark.timeout(30)


def _spec(**changes) -> records.LaunchSpec:
    return records.LaunchSpec(user="nobody", uid=65534, gid=65534, cwd="/", argv=["true"], env={}, id=1,
                              **changes)


def _held_child():
    """A forked child that waits on a pipe (it runs nothing of the test's): ``(pid, release)``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.read(r, 1)
        finally:
            os._exit(0)
    os.close(r)

    def release() -> None:
        os.write(w, b"x")
        os.close(w)
        assert os.waitpid(pid, 0)[1] == 0
    return pid, release


def test_the_child_is_put_on_the_jobs_cpus():
    allowed = sorted(os.sched_getaffinity(0))
    target = allowed[-1]   # on a machine of two or more CPUs, a narrower mask than the parent's
    pid, release = _held_child()
    try:
        child.place(pid, _spec(cpus=[target]))
        assert os.sched_getaffinity(pid) == {target}
        assert sorted(os.sched_getaffinity(0)) == allowed   # the shepherd itself stays where it was
    finally:
        release()


def test_a_placement_that_fails_is_left_to_the_child(tmp_path):
    """No cgroup there: nothing is raised, and nothing moved (the child joins, and reports, itself)."""
    pid, release = _held_child()
    try:
        before = os.sched_getaffinity(pid)
        child.place(pid, _spec(cgroup=str(tmp_path / "no-such-cgroup")))
        assert os.sched_getaffinity(pid) == before
    finally:
        release()


def test_no_cgroup_and_no_cpus_moves_nothing():
    pid, release = _held_child()
    try:
        before = os.sched_getaffinity(pid)
        child.place(pid, _spec())
        assert os.sched_getaffinity(pid) == before
    finally:
        release()


def test_the_widest_mask_is_every_possible_cpu_read_once(tmp_path, monkeypatch):
    """A job child joining its cgroup is widened to every CPU the machine may have (the cpuset then
    keeps its own), not to 8,192 ids: that mask cost sched_setaffinity 0.1 ms to build, twice a job."""
    assert set(os.sched_getaffinity(0)) <= set(child.POSSIBLE_CPUS)
    assert len(child.POSSIBLE_CPUS) <= (os.cpu_count() or 1) * 64
    listed = tmp_path / "possible"
    for text, want in (("0-3,8-9\n", (0, 1, 2, 3, 8, 9)), ("0\n", (0,)),
                       ("", tuple(range(child._ALL_CPUS))), ("0-x\n", tuple(range(child._ALL_CPUS)))):
        listed.write_text(text)
        monkeypatch.setattr(child, "_POSSIBLE", str(listed))
        assert child._possible_cpus() == want, text
    monkeypatch.setattr(child, "_POSSIBLE", str(tmp_path / "absent"))
    assert child._possible_cpus() == tuple(range(child._ALL_CPUS))

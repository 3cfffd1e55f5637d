"""The shepherds' cgroup under --housekeeping-cpus none (hpc_batch.daemon.benchmode.shepherdcpus): the stand-in
list while the kernel will not empty a populated cpuset, over a fixture tree of cgroup files.

The kernel's side (ENOSPC for an empty list while the cgroup is populated) is played by
``Kernel``; the system tier's housekeeping loop (test_benchmark_guest.py, test 8) shows the real
one, in a guest."""

import errno
import logging
import os

import pytest
from enginefakes import Hooks, MemoryStore, TurnEngine, make_config, make_machine

from hpc_batch.core.cputopo import parse_cpulist
from hpc_batch.daemon import cgroups, devdir, main
from hpc_batch.daemon.benchmode import cpupartition, housekeeping, kfiles, shepherdcpus

pytestmark = pytest.mark.timeout(60)


# -- pure ---------------------------------------------------------------------

def test_claims_are_exclusive_cpus_and_valid_partitions():
    children = [
        {cpupartition.PARTITION: "isolated", cpupartition.EXCLUSIVE: "4-5", shepherdcpus.CPUS: "4-5"},
        {cpupartition.PARTITION: "root", cpupartition.EXCLUSIVE: None, shepherdcpus.CPUS: "6"},
        {cpupartition.PARTITION: "member", cpupartition.EXCLUSIVE: "", shepherdcpus.CPUS: "1-3"},
        {cpupartition.PARTITION: "isolated invalid (Parent is not a partition root)",
         cpupartition.EXCLUSIVE: None, shepherdcpus.CPUS: "7"},
        {cpupartition.PARTITION: "member", cpupartition.EXCLUSIVE: "8", shepherdcpus.CPUS: "8"},
        {},   # a cgroup gone between the listing and the reads
    ]
    assert shepherdcpus.claims(children) == {4, 5, 6, 8}


def test_unreadable_lists_claim_nothing():
    assert shepherdcpus.claims([{cpupartition.EXCLUSIVE: "garbage", shepherdcpus.CPUS: "x",
                                 cpupartition.PARTITION: "isolated"}]) == set()


def test_stand_in_is_the_parents_cpus_less_the_claimed():
    assert shepherdcpus.stand_in({0, 1, 2, 3, 4, 5}, {2, 3, 9}) == (0, 1, 4, 5)
    assert shepherdcpus.stand_in({0, 1}, {0, 1}) == ()


def test_describe_names_the_stand_in():
    line = shepherdcpus.describe((0, 1, 4, 5))
    assert "CPUs 0-1,4-5" in line and "shepherds run" in line


# -- with a fixture tree ------------------------------------------------------

class Kernel:
    """cgroups._write as the kernel answers for the shepherds' cpuset.cpus: an empty list is refused
    with ENOSPC while the cgroup is populated and its list is not empty."""

    def __init__(self, monkeypatch, root):
        self.populated = True
        self.target = os.path.join(cgroups.shepherds_path(root), shepherdcpus.CPUS)
        real = cgroups._write

        def write(path, value):
            if path == self.target and not value.strip() and self.populated and self.cpus():
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(path, value)
        monkeypatch.setattr(cgroups, "_write", write)

    def cpus(self) -> frozenset:
        with open(self.target) as f:
            return parse_cpulist(f.read().strip())


@pytest.fixture
def root(tmp_path):
    """hpc-batch/ with 8 CPUs, its shepherds' cgroup confined to CPUs 0-1 (the old housekeeping
    list), no partition support yet (see ``remote``)."""
    top = tmp_path / "hpc-batch"
    (top / cgroups.SHEPHERDS).mkdir(parents=True)
    (top / shepherdcpus.EFFECTIVE).write_text("0-7\n")
    (top / cgroups.SHEPHERDS / shepherdcpus.CPUS).write_text("0-1\n")
    return str(top)


def put(path, name, value):
    with open(os.path.join(path, name), "w") as f:
        f.write(value + "\n")


def remote(root):
    """Give the tree remote partitions (cpuset.cpus.exclusive, Linux 6.7 and later)."""
    put(root, cpupartition.EXCLUSIVE, "")


def job(root, n, cpus, partition="isolated"):
    path = os.path.join(root, f"job-{n}")
    os.makedirs(path, exist_ok=True)
    put(path, shepherdcpus.CPUS, cpus)
    put(path, cpupartition.PARTITION, partition)
    put(path, cpupartition.EXCLUSIVE, cpus if partition == "isolated" else "")
    return path


def shepherds(root) -> str:
    return kfiles.read(cgroups.shepherds_path(root), shepherdcpus.CPUS)


def test_a_list_confines_the_shepherds(root, monkeypatch):
    Kernel(monkeypatch, root)
    assert shepherdcpus.confine(root, (6, 7)) is None
    assert shepherds(root) == "6-7"


def test_none_empties_the_list_when_no_shepherd_runs(root, monkeypatch):
    Kernel(monkeypatch, root).populated = False
    assert shepherdcpus.confine(root, ()) is None
    assert shepherds(root) == ""


def test_none_with_shepherds_running_gets_every_cpu_but_partitions(root, monkeypatch):
    Kernel(monkeypatch, root)
    remote(root)
    job(root, 3, "4-5")
    job(root, 4, "2", partition="member")   # an ordinary job: its CPUs stay the shepherds' too
    assert shepherdcpus.confine(root, ()) == (0, 1, 2, 3, 6, 7)
    assert shepherds(root) == "0-3,6-7"


def test_another_refusal_is_raised(root, monkeypatch):
    def refuse(path, value):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
    monkeypatch.setattr(cgroups, "_write", refuse)
    with pytest.raises(OSError) as caught:
        shepherdcpus.confine(root, ())
    assert caught.value.errno == errno.EINVAL


def test_every_cpu_claimed_is_a_refusal_and_the_list_stays(root, monkeypatch):
    Kernel(monkeypatch, root)
    job(root, 3, "0-7")
    with pytest.raises(OSError) as caught:
        shepherdcpus.confine(root, ())
    assert caught.value.errno == errno.ENOSPC and "every CPU" in caught.value.strerror
    assert shepherds(root) == "0-1"


def test_the_stand_in_makes_room_for_a_partition_and_widens_after_it(root, monkeypatch):
    Kernel(monkeypatch, root)
    remote(root)
    assert shepherdcpus.confine(root, ()) == tuple(range(8))
    shepherdcpus.make_room(root, (4, 5))
    assert shepherds(root) == "0-3,6-7"
    cg = job(root, 3, "4-5")
    shepherdcpus.make_room(root, (6,))   # a second partition beside the first
    assert shepherds(root) == "0-3,7"
    job(root, 4, "6")
    os.rename(cg, cg + ".gone")   # the first job's cgroup is removed ...
    shepherdcpus.settle(root)   # ... and its partition released
    assert shepherds(root) == "0-5,7"


def test_no_room_is_made_where_no_partition_can_be(root, monkeypatch):
    """Linux 6.1: a job's cgroup below hpc-batch/ (no partition root) never becomes a partition, so
    the shepherds keep every CPU."""
    Kernel(monkeypatch, root)
    assert shepherdcpus.confine(root, ()) == tuple(range(8))
    shepherdcpus.make_room(root, (4, 5))
    assert shepherds(root) == "0-7"


def test_a_parent_partition_root_makes_local_partitions_possible(root, monkeypatch):
    Kernel(monkeypatch, root)
    put(root, cpupartition.PARTITION, "root")
    shepherdcpus.confine(root, ())
    shepherdcpus.make_room(root, (4, 5))
    assert shepherds(root) == "0-3,6-7"


def test_the_list_empties_once_no_shepherd_runs(root, monkeypatch, caplog):
    kernel = Kernel(monkeypatch, root)
    remote(root)
    shepherdcpus.confine(root, ())
    kernel.populated = False
    with caplog.at_level(logging.INFO, logger="hpc-batchd"):
        shepherdcpus.settle(root)
    assert shepherds(root) == ""
    assert "inherits its parent's CPUs again" in caplog.text


def test_an_inheriting_cgroup_is_left_alone(root, monkeypatch):
    Kernel(monkeypatch, root).populated = False
    shepherdcpus.confine(root, ())
    written = []
    monkeypatch.setattr(cgroups, "_write", lambda path, value: written.append(path))
    monkeypatch.setattr(kfiles, "write", lambda r, rel, value: written.append(rel))
    remote(root)
    shepherdcpus.make_room(root, (4, 5))
    shepherdcpus.settle(root)
    assert written == []


def test_a_refused_adjustment_is_logged_not_raised(root, monkeypatch, caplog):
    Kernel(monkeypatch, root)
    remote(root)
    shepherdcpus.confine(root, ())
    job(root, 3, "0-3")
    with caplog.at_level(logging.WARNING, logger="hpc-batchd"):
        shepherdcpus.make_room(root, (4, 5, 6, 7))
    assert "cannot keep the shepherds' cgroup" in caplog.text and "CPUs 4-7" in caplog.text
    assert shepherds(root) == "0-7"


# -- the daemon's wiring ------------------------------------------------------

def test_a_start_into_none_with_shepherds_running_logs_the_stand_in(root, monkeypatch, caplog, tmp_path):
    Kernel(monkeypatch, root)
    monkeypatch.setattr(housekeeping, "pin", lambda cpus, allowed: None)   # not this test process
    machine, limits = make_machine(cpus=8)
    cfg = make_config(tmp_path, cgroups=True, cgroup_root=root, housekeeping_flag=housekeeping.NONE)
    with caplog.at_level(logging.INFO, logger="hpc-batchd"):
        assert main._housekeeping(cfg, machine, limits, set(range(8))).housekeeping == ()
    assert shepherds(root) == "0-7"
    assert shepherdcpus.describe((0, 1, 2, 3, 4, 5, 6, 7)) in caplog.text
    assert "cannot confine" not in caplog.text


@pytest.mark.parametrize("cgroups_on,hk,expect", [(True, (), True), (True, (0, 1), False), (False, (), False)])
def test_the_engine_keeps_partitions_clear_only_for_an_inheriting_cgroup(tmp_path, cgroups_on, hk, expect):
    machine, limits = make_machine(cpus=4)
    cfg = make_config(tmp_path, cgroups=cgroups_on, cgroup_root=str(tmp_path / "cg"), housekeeping=hk)
    eng = TurnEngine(cfg, MemoryStore(tmp_path), machine, limits, devdir.DevDir(None, 0), Hooks())
    assert eng.bench.quiet.shepherds_root == (cfg.cgroup_root if expect else None)

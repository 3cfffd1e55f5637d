"""CPU topology: the pure parser (hpc_batch.core.cputopo) and the sysfs reader (discovery.read_cpu_topology).

The trees are tests/fixtures/sysfs/*/devices/system/cpu: synthesised to the
kernel's layout for the named machines, except dev-container-real, which was
copied from the machine this was written on (see tests/fixtures/README.md).
"""

import shutil
from pathlib import Path

import pytest

from hpc_batch.core import cputopo
from hpc_batch.daemon.discovery import discover, read_cpu_topology, read_numa

SYSFS = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"


def files(siblings="0,4\n", core="0\n", package="0\n", **caches):
    out = {cputopo.SIBLINGS: siblings, cputopo.CORE_ID: core, cputopo.PACKAGE_ID: package}
    out.update({k.replace("__", "/"): v for k, v in caches.items()})
    return out


def test_parse_cpu_reads_the_kernels_formats():
    cpu = cputopo.parse_cpu(0, files(**{
        "cache__index0__level": "1\n", "cache__index0__type": "Data\n", "cache__index0__id": "0\n",
        "cache__index0__shared_cpu_list": "0,4\n",
        "cache__index1__level": "1\n", "cache__index1__type": "Instruction\n", "cache__index1__id": "0\n",
        "cache__index1__shared_cpu_list": "0,4\n",
        "cache__index3__level": "3\n", "cache__index3__type": "Unified\n",   # no id: kernels before 4.14
        "cache__index3__shared_cpu_list": "0-7\n"}))
    assert (cpu.cpu, cpu.package, cpu.core_id, cpu.siblings) == (0, 0, 0, (0, 4))
    assert [(c.level, c.type, c.id) for c in cpu.caches] == [(1, "Data", 0), (1, "Instruction", 0),
                                                             (3, "Unified", None)]
    assert cpu.cache(1).type == "Data" and cpu.cache(3).cpus == tuple(range(8)) and cpu.cache(2) is None


def test_a_cpu_without_a_siblings_file_is_a_core_of_its_own():
    cpu = cputopo.parse_cpu(3, {cputopo.SIBLINGS: None, cputopo.CORE_ID: None, cputopo.PACKAGE_ID: None})
    assert (cpu.siblings, cpu.core_id, cpu.package, cpu.caches) == ((3,), None, None, ())


@pytest.mark.parametrize("bad", [files(siblings="1,5\n"), files(siblings="zero\n"), files(core="x\n"),
                                 files(cache__index0__level="L1\n", cache__index0__shared_cpu_list="0\n")])
def test_text_not_in_the_kernels_format_is_refused(bad):
    with pytest.raises(ValueError):
        cputopo.parse_cpu(0, bad)


def test_a_half_described_cache_is_left_out():
    cpu = cputopo.parse_cpu(0, files(cache__index2__level="2\n"))
    assert cpu.caches == ()


def test_cpus_that_disagree_on_their_core_are_refused():
    a = cputopo.parse_cpu(0, files(siblings="0,4"))
    b = cputopo.parse_cpu(4, files(siblings="4"))
    with pytest.raises(ValueError, match="cpu 0 and cpu 4 disagree"):
        cputopo.build([a, b])


def test_grouping_cpus_by_core_keeps_only_the_cpus_asked_about():
    topo = cputopo.build(cputopo.parse_cpu(c, files(siblings=f"{c % 4},{c % 4 + 4}")) for c in range(8))
    assert topo.cores([5, 0, 4, 2]) == ((0, 4), (2,), (5,))
    assert topo.siblings(9) == (9,)                     # a CPU it never read is a core of its own
    assert cputopo.CpuTopology().cores([1, 0]) == ((0,), (1,))


TREES = {
    # machine: (CPUs, cores, siblings of CPU 5, line for the log)
    "intel-2s-xeon-gold-6248": (80, 40, (5, 45), "CPU topology: 80 CPUs in 40 cores on 2 packages, 2 threads per "
                                "core, siblings numbered N and N+40; 2 L3 caches"),
    "amd-epyc-7502p-nps4": (64, 32, (5, 37), "CPU topology: 64 CPUs in 32 cores, 2 threads per core, siblings "
                            "numbered N and N+32; 8 L3 caches"),
    "laptop-1node": (8, 4, (1, 5), "CPU topology: 8 CPUs in 4 cores, 2 threads per core, siblings numbered N and "
                     "N+4; 1 L3 cache"),
    "qemu-2s-smt-adjacent": (8, 4, (4, 5), "CPU topology: 8 CPUs in 4 cores on 2 packages, 2 threads per core, "
                             "siblings numbered next to each other; 2 L3 caches"),
    "intel-i9-12900k-hybrid": (24, 16, (4, 5), "CPU topology: 24 CPUs in 16 cores, 1/2 threads per core, "
                               "siblings numbered next to each other; 1 L3 cache"),
    "dev-container-real": (2, 2, None, "CPU topology: 2 CPUs in 2 cores, 1 thread per core; 1 L3 cache"),
}


@pytest.mark.parametrize("machine", sorted(TREES))
def test_fixture_trees(machine):
    ncpus, ncores, five, line = TREES[machine]
    cpus = [c for n in read_numa(str(SYSFS / machine)) for c in n.cpus]
    topo, log = read_cpu_topology(str(SYSFS / machine), cpus)
    assert len(topo.cpus) == ncpus and len(topo.cores(cpus)) == ncores
    if five is not None:
        assert topo.siblings(5) == five
    assert log == [line]
    # Every core's threads are in one package and share its L1 and L2.
    for core in topo.cores(cpus):
        infos = [topo.cpus[c] for c in core]
        assert len({i.package for i in infos}) == 1
        assert all(set(core) <= set(i.cache(2).cpus) for i in infos)


def test_xeon_core_ids_have_gaps_and_repeat_across_sockets():
    topo, _ = read_cpu_topology(str(SYSFS / "intel-2s-xeon-gold-6248"), range(80))
    assert [topo.cpus[c].core_id for c in range(5, 10)] == [8, 9, 10, 11, 12]
    assert topo.cpus[20].core_id == topo.cpus[0].core_id == 0 and topo.cpus[20].package == 1
    assert topo.last_level_cache(61).cpus == tuple(range(20, 40)) + tuple(range(60, 80))


def test_epyc_last_level_cache_is_one_ccx():
    topo, _ = read_cpu_topology(str(SYSFS / "amd-epyc-7502p-nps4"), range(64))
    assert topo.last_level_cache(33).cpus == (0, 1, 2, 3, 32, 33, 34, 35)


def test_reading_only_the_allowed_cpus_keeps_siblings_outside_them():
    topo, _ = read_cpu_topology(str(SYSFS / "intel-2s-xeon-gold-6248"), [0, 1, 41])
    assert sorted(topo.cpus) == [0, 1, 41]
    assert topo.cores([0, 1, 41]) == ((0,), (1, 41))     # 40 is not ours: core 0 is cpu 0 alone


def test_a_tree_without_cpu_directories_leaves_every_cpu_a_core(tmp_path):
    shutil.copytree(SYSFS / "laptop-1node" / "devices" / "system" / "node", tmp_path / "devices" / "system" / "node")
    topo, log = read_cpu_topology(str(tmp_path), range(8))
    assert topo.cpus == {} and len(log) == 1
    assert log[0].startswith("CPU topology: no thread_siblings_list for CPU 0-7 under ")
    assert log[0].endswith("each is treated as a core of its own")


@pytest.mark.parametrize("cpu, text, why", [(4, "4\n", "inconsistent"), (4, "four\n", "unreadable")])
def test_a_damaged_tree_is_ignored_whole_and_said_so(tmp_path, cpu, text, why):
    shutil.copytree(SYSFS / "laptop-1node", tmp_path / "m")
    (tmp_path / "m" / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(text)
    topo, log = read_cpu_topology(str(tmp_path / "m"), range(8))
    assert topo.cpus == {} and log[0].startswith(f"CPU topology: {why} (")
    assert log[0].endswith("; each CPU is treated as a core of its own")


def test_discover_reads_the_cores_of_the_cpus_it_may_use(tmp_path):
    machine, log = discover(str(SYSFS / "qemu-2s-smt-adjacent"), allowed_cpus={0, 1, 2, 5}, path_env=str(tmp_path))
    assert [n.cpus for n in machine.nodes] == [(0, 1, 2), (5,)]
    assert sorted(machine.cpu_topology.cpus) == [0, 1, 2, 5]
    assert machine.cpu_topology.cores([0, 1, 2, 5]) == ((0, 1), (2,), (5,))
    assert any(line.startswith("CPU topology: 4 CPUs in 3 cores on 2 packages") for line in log)

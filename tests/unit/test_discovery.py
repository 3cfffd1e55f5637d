"""Unit tests for hpc_batch.daemon.discovery against recorded/synthesised fixtures."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hpc_batch.core.requestcheck import RequestError, check_request
from hpc_batch.core.resources import GiB, Limits, Request
from hpc_batch.daemon import discovery
from hpc_batch.daemon.discovery import (
    discover,
    find_gpus,
    format_cpulist,
    parse_cpulist,
    parse_node_meminfo,
    parse_nvidia_smi_list,
    read_numa,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SYSFS = FIXTURES / "sysfs"
SMI = FIXTURES / "nvidia-smi"


@pytest.mark.parametrize(
    "text, cpus",
    [
        ("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)),
        ("0\n", (0,)),
        ("", ()),
        ("\n", ()),
        ("3,1,2", (1, 2, 3)),
        ("0-2,1-3", (0, 1, 2, 3)),
        ("0-19,40-59", tuple(range(20)) + tuple(range(40, 60))),
    ],
)
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["a", "3-1", "1-", "-1", "0-7:2", "0 1"])
def test_parse_cpulist_rejects_garbage(text):
    with pytest.raises(ValueError):
        parse_cpulist(text)


@pytest.mark.parametrize(
    "cpus, text",
    [((0, 1, 2, 3, 8, 10, 11), "0-3,8,10-11"), ((5,), "5"), ((), ""), ((2, 0, 1, 1), "0-2")],
)
def test_format_cpulist(cpus, text):
    assert format_cpulist(cpus) == text
    assert parse_cpulist(text) == tuple(sorted(set(cpus)))


@pytest.mark.parametrize(
    "text, n",
    [
        ("Node 0 MemTotal:  263842708 kB\nNode 0 MemFree: 1 kB\n", 263842708 * 1024),
        ("Node 12 MemFree:   5 kB\nNode 12 MemTotal:       1024 kB\n", 1024 * 1024),
        ("MemTotal:       24684092 kB\nMemFree:        24241536 kB\n", 24684092 * 1024),
    ],
)
def test_parse_node_meminfo(text, n):
    assert parse_node_meminfo(text) == n


def test_parse_node_meminfo_without_memtotal():
    with pytest.raises(ValueError, match="MemTotal"):
        parse_node_meminfo("Node 0 MemFree: 12 kB\n")


@pytest.mark.parametrize(
    "fixture, gpus",
    [
        ("a100-4.txt", (0, 1, 2, 3)),
        ("h100-8.txt", tuple(range(8))),
        ("a100-2-mig.txt", (0, 1)),  # MIG instances are not extra GPUs
        ("no-devices.txt", ()),
        ("driver-failure.txt", ()),
    ],
)
def test_parse_nvidia_smi_list(fixture, gpus):
    assert parse_nvidia_smi_list((SMI / fixture).read_text()) == gpus


@pytest.mark.parametrize(
    "machine, node_cpus, node0_mem",
    [
        ("intel-2s-xeon-gold-6248", {0: 40, 1: 40}, 196438056 * 1024),
        ("amd-epyc-7502p-nps4", {0: 16, 1: 16, 2: 16, 3: 16}, 65449560 * 1024),
        ("laptop-1node", {0: 8}, 16211544 * 1024),
        ("dev-container-real", {0: 2}, 4942036 * 1024),
    ],
)
def test_read_numa_fixtures(machine, node_cpus, node0_mem):
    nodes = read_numa(str(SYSFS / machine))
    assert {n.id: len(n.cpus) for n in nodes} == node_cpus
    assert nodes[0].mem == node0_mem
    all_cpus = [c for n in nodes for c in n.cpus]
    assert len(all_cpus) == len(set(all_cpus))


def test_read_numa_intel_hyperthread_siblings_stay_on_their_node():
    n0, n1 = read_numa(str(SYSFS / "intel-2s-xeon-gold-6248"))
    assert n0.cpus == tuple(range(20)) + tuple(range(40, 60))
    assert n1.cpus == tuple(range(20, 40)) + tuple(range(60, 80))


@pytest.mark.parametrize(
    "allowed, expected",
    [
        (set(range(20)), {0: tuple(range(20))}),
        ({20, 21, 79}, {1: (20, 21, 79)}),           # node 0 dropped, node 1 keeps its id
        ({0, 79, 500}, {0: (0,), 1: (79,)}),          # CPUs that exist nowhere are ignored
        (set(), {}),
    ],
)
def test_read_numa_honours_allowed_cpus(allowed, expected):
    nodes = read_numa(str(SYSFS / "intel-2s-xeon-gold-6248"), allowed_cpus=allowed)
    assert {n.id: n.cpus for n in nodes} == expected


def _copy_tree(tmp_path, machine):
    root = tmp_path / "sys"
    shutil.copytree(SYSFS / machine, root)
    return root, root / "devices" / "system" / "node"


def test_read_numa_skips_offline_and_memory_only_nodes(tmp_path):
    root, base = _copy_tree(tmp_path, "amd-epyc-7502p-nps4")
    (base / "online").write_text("0-1,3\n")           # node 2 offline
    (base / "node3" / "cpulist").write_text("\n")     # node 3 memory-only
    assert [n.id for n in read_numa(str(root))] == [0, 1]


def test_read_numa_without_online_file_reads_every_node(tmp_path):
    root, base = _copy_tree(tmp_path, "amd-epyc-7502p-nps4")
    (base / "online").unlink()
    assert [n.id for n in read_numa(str(root))] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "allowed, cpu_online, cpus",
    [
        ({0, 1, 5}, None, (0, 1, 5)),
        (None, "0-3\n", (0, 1, 2, 3)),
    ],
)
def test_read_numa_without_node_directory(tmp_path, allowed, cpu_online, cpus):
    sysfs, proc = tmp_path / "sys", tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text("MemTotal:        8000000 kB\nMemFree:  1 kB\n")
    if cpu_online is not None:
        (sysfs / "devices" / "system" / "cpu").mkdir(parents=True)
        (sysfs / "devices" / "system" / "cpu" / "online").write_text(cpu_online)
    (node,) = read_numa(str(sysfs), allowed_cpus=allowed, proc_root=str(proc))
    assert (node.id, node.cpus, node.mem) == (0, cpus, 8000000 * 1024)


@pytest.fixture
def smi_dir(tmp_path):
    """A PATH directory holding the fake nvidia-smi, executable."""
    d = tmp_path / "bin"
    d.mkdir()
    shutil.copy(FIXTURES / "fake-nvidia-smi", d / "nvidia-smi")
    os.chmod(d / "nvidia-smi", 0o755)
    return d


def test_fake_nvidia_smi_refuses_what_it_was_not_given(smi_dir, monkeypatch):
    monkeypatch.delenv("FAKE_NVIDIA_SMI_QUERY", raising=False)
    r = subprocess.run([str(smi_dir / "nvidia-smi"), "-q"], capture_output=True, text=True)
    assert r.returncode == 1 and "no -q output" in r.stderr
    r = subprocess.run([str(smi_dir / "nvidia-smi"), "--bogus"], capture_output=True, text=True)
    assert r.returncode == 1 and "unsupported" in r.stderr


@pytest.mark.parametrize(
    "fixture, exit_code, gpus, message",
    [
        (None, 0, (0, 1, 2, 3), "GPUs: 4 from"),
        ("h100-8.txt", 0, tuple(range(8)), "(indices 0-7)"),
        ("a100-2-mig.txt", 0, (0, 1), "GPUs: 2 from"),
        ("no-devices.txt", 6, (), "-L exited 6: No devices were found)"),
        ("driver-failure.txt", 9, (), "-L exited 9: NVIDIA-SMI has failed because it couldn't"),
        ("no-devices.txt", 0, (), "-L listed no GPUs)"),
    ],
)
def test_find_gpus(monkeypatch, smi_dir, fixture, exit_code, gpus, message):
    if fixture is None:
        monkeypatch.delenv("FAKE_NVIDIA_SMI_OUTPUT", raising=False)
    else:
        monkeypatch.setenv("FAKE_NVIDIA_SMI_OUTPUT", str(SMI / fixture))
    monkeypatch.setenv("FAKE_NVIDIA_SMI_EXIT", str(exit_code))
    found, line = find_gpus(path_env=str(smi_dir))
    assert found == gpus
    assert message in line
    assert "\n" not in line


def test_find_gpus_not_on_path(tmp_path):
    found, line = find_gpus(path_env=str(tmp_path))
    assert found == ()
    assert line == "GPUs: none (nvidia-smi not found on PATH)"


def test_find_gpus_times_out(monkeypatch, smi_dir):
    monkeypatch.setattr(discovery, "NVIDIA_SMI_TIMEOUT", 0.3)
    monkeypatch.setenv("FAKE_NVIDIA_SMI_SLEEP", "3")
    found, line = find_gpus(path_env=str(smi_dir))
    assert found == ()
    assert "timed out after 0.3 s" in line


def test_discover_intel_with_gpus(monkeypatch, smi_dir):
    monkeypatch.setenv("FAKE_NVIDIA_SMI_OUTPUT", str(SMI / "a100-4.txt"))
    monkeypatch.delenv("FAKE_NVIDIA_SMI_EXIT", raising=False)
    machine, log = discover(str(SYSFS / "intel-2s-xeon-gold-6248"), path_env=str(smi_dir))
    assert [n.id for n in machine.nodes] == [0, 1]
    assert machine.gpus == (0, 1, 2, 3)
    assert log[0] == "NUMA: 2 nodes with usable CPUs"
    assert log[1] == "NUMA node 0: cpus 0-19,40-59 (40), memory 187.3G"
    assert any(line.startswith("GPUs: 4 from") for line in log)
    assert any(line.startswith("GPU topology: unknown") for line in log)   # this fake has no topo -m
    # Reserve comes off node 0, so node 1 is the widest: 40 CPUs, the two threads of 20 cores.
    assert check_request(Request(cpus=40), machine, Limits()).mem > 0
    with pytest.raises(RequestError, match=r"--cpu 41 can never fit: the largest NUMA node offers 40 CPUs "
                                           r"\(20 whole cores\) to jobs"):
        check_request(Request(cpus=41), machine, Limits())
    with pytest.raises(RequestError, match="offers 40 cores to jobs"):     # packing threads, as before
        check_request(Request(cpus=41), machine, Limits(whole_cores=False))
    # Default share: 4 of 40 cores on a ~187 GiB node.
    assert 18 * GiB < check_request(Request(cpus=4), machine, Limits()).mem < 19 * GiB


def test_discover_laptop_without_gpus(tmp_path):
    machine, log = discover(str(SYSFS / "laptop-1node"), path_env=str(tmp_path))
    assert machine.gpus == ()
    assert len(machine.nodes) == 1 and machine.nodes[0].cpus == tuple(range(8))
    assert log[-1] == "GPUs: none (nvidia-smi not found on PATH)"

"""GPUs through the real daemon, with a fake nvidia-smi on its PATH.

The fake (tests/fixtures/fake-nvidia-smi) prints four A100s for ``-L`` and,
here, a synthetic ``topo -m`` in nvidia-smi's own layout: two NVLink pairs,
{0,1} and {2,3}, joined to each other only across the socket interconnect
(SYS), all on NUMA node 0 (this host has one). ``-q`` gives each card a
minor number that is not its index, as on real machines where they differ.
Masking itself needs cgroup v2 and lives in the VM tier (tests/system).
"""

import json
import os

import pytest
from conftest import exit_of, wait_for

pytestmark = pytest.mark.timeout(120)
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")

TOPO = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV2\tSYS\tSYS\t0-1\t{n0}
GPU1\tNV2\t X \tSYS\tSYS\t0-1\t{n0}
GPU2\tSYS\tSYS\t X \tNV2\t0-1\t{n1}
GPU3\tSYS\tSYS\tNV2\t X \t0-1\t{n1}

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NV#  = Connection traversing a bonded set of # NVLinks
"""

QUERY_GPU = """\
GPU 00000000:{bus}:00.0
    Product Name                          : NVIDIA A100-SXM4-80GB
    Minor Number                          : {minor}
    GPU UUID                              : GPU-00000000-0000-4000-8000-00000000000{index}
"""


def _fake(scratch, numa=(0, 0)):
    d = os.path.join(scratch, "fakebin")
    os.mkdir(d)
    os.symlink(os.path.join(FIXTURES, "fake-nvidia-smi"), os.path.join(d, "nvidia-smi"))
    topo = os.path.join(scratch, "topo.txt")
    with open(topo, "w") as f:
        f.write(TOPO.format(n0=numa[0], n1=numa[1]))
    query = os.path.join(scratch, "query.txt")
    with open(query, "w") as f:
        f.write("==============NVSMI LOG==============\n\nAttached GPUs                             : 4\n")
        for index in range(4):
            f.write(QUERY_GPU.format(bus=f"{7 + 8 * index:02X}", minor=3 - index, index=index))
    return {"PATH": f"{d}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "FAKE_NVIDIA_SMI_TOPO": topo, "FAKE_NVIDIA_SMI_QUERY": query}


def _gpus_of(scratch, job):
    with open(os.path.join(scratch, f"output.{job}.log")) as f:
        return f.read().strip()


SHOW = 'echo "$CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER"'
HOLD = "while [ ! -e {} ]; do sleep 0.05; done; " + SHOW


@pytest.fixture
def gpu_daemon(daemon_factory, users, scratch):
    return daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0", env=_fake(scratch))


def test_topology_and_minors_reported_at_start(gpu_daemon):
    log = gpu_daemon.log()
    assert "GPU topology: 0-1 NV2" in log and "2-3 NV2" in log
    assert "GPU 0 is /dev/nvidia3" in log and "GPU 3 is /dev/nvidia0" in log
    assert "GPU masking: off (--no-cgroups)" in log


def test_a_pair_gets_linked_gpus_and_a_single_one_keeps_pairs_whole(gpu_daemon, scratch):
    d = gpu_daemon
    flag = os.path.join(scratch, "go")
    a = d.submit("sh", "-c", HOLD.format(flag), flags=("--gpu-cores", "1", "--max-mem", "256M"))
    b = d.submit("sh", "-c", HOLD.format(flag), flags=("--gpu-cores", "2", "--max-mem", "256M"))
    d.wait_running(b)
    rows = d.rows()
    assert (rows[a].split()[-1], rows[b].split()[-1]) == ("1", "2:NV2"), rows   # the GPU column: count and link
    open(flag, "w").close()
    for j in (a, b):
        d.wait_finished(j)
    assert _gpus_of(scratch, a) == "0 PCI_BUS_ID"
    # Index order would give 1,2 across the socket; the closest free pair is 2,3.
    assert _gpus_of(scratch, b) == "2,3 PCI_BUS_ID"


def test_a_single_gpu_carves_from_a_broken_pair(gpu_daemon, scratch):
    d = gpu_daemon
    flags = [os.path.join(scratch, f"go{i}") for i in range(2)]
    pair = d.submit("sh", "-c", HOLD.format(flags[0]), flags=("--gpu-cores", "2", "--max-mem", "256M"))
    one = d.submit("sh", "-c", HOLD.format(flags[1]), flags=("--gpu-cores", "1", "--max-mem", "256M"))
    d.wait_running(one)
    open(flags[0], "w").close()
    d.wait_finished(pair)
    # {0,1} is whole again; {2,3} is already broken by `one`: another single GPU goes there.
    late = d.submit("sh", "-c", SHOW, flags=("--gpu-cores", "1", "--max-mem", "256M"))
    d.wait_finished(late)
    open(flags[1], "w").close()
    d.wait_finished(one)
    assert (_gpus_of(scratch, pair), _gpus_of(scratch, one)) == ("0,1 PCI_BUS_ID", "2 PCI_BUS_ID")
    assert _gpus_of(scratch, late) == "3 PCI_BUS_ID"


def test_gpu_link_met_at_once_or_refused(gpu_daemon, scratch):
    d = gpu_daemon
    flag = os.path.join(scratch, "go")
    held = d.submit("sh", "-c", HOLD.format(flag), flags=("--gpu-cores", "2", "--max-mem", "256M"))   # 0,1
    d.wait_running(held)
    nv = d.submit("sh", "-c", SHOW, flags=("--gpu-cores", "2", "--gpu-link", "NV", "--max-mem", "256M"))
    assert exit_of(d.wait_finished(nv)) == "0" and _gpus_of(scratch, nv) == "2,3 PCI_BUS_ID"
    r = d.dispatch("new", "--gpu-cores", "2", "--gpu-link", "NV4", "--", "true")
    assert r.returncode == 6 and "can never be met" in r.stderr and "NV2" in r.stderr
    r = d.dispatch("new", "--gpu-cores", "2", "--gpu-link", "QPI", "--", "true")   # no class: dispatch refuses it
    assert r.returncode == 2 and "unknown GPU link class 'QPI'" in r.stderr
    open(flag, "w").close()
    d.wait_finished(held)


def test_gpu_link_job_waits_then_starts(gpu_daemon, scratch):
    d = gpu_daemon
    flag = os.path.join(scratch, "go")
    zero = d.submit("sh", "-c", HOLD.format(flag), flags=("--gpu-cores", "1", "--max-mem", "256M"))      # 0
    pair = d.submit("sh", "-c", HOLD.format(flag), flags=("--gpu-cores", "2", "--max-mem", "256M"))      # 2,3
    d.wait_running(pair)
    # Only GPU 1 is free; a linked pair must wait for GPU 0.
    linked = d.submit("sh", "-c", SHOW, flags=("--gpu-cores", "2", "--gpu-link", "NV", "--max-mem", "256M"))
    assert " queued " in d.rows()[linked]
    open(flag, "w").close()
    assert exit_of(d.wait_finished(linked)) == "0"
    assert _gpus_of(scratch, linked) in ("0,1 PCI_BUS_ID", "2,3 PCI_BUS_ID")
    for j in (zero, pair):
        d.wait_finished(j)


def test_numa_local_gpu_refused_when_no_node_can_hold_it(daemon_factory, users, scratch):
    # The fake says GPUs 2 and 3 hang off node 1, which this host does not have.
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0", env=_fake(scratch, numa=(0, 1)))
    r = d.dispatch("new", "--gpu-cores", "3", "--numa-local-gpu", "--", "true")
    assert r.returncode == 6 and "--numa-local-gpu can never be met" in r.stderr
    ok = d.submit("sh", "-c", SHOW, flags=("--gpu-cores", "2", "--numa-local", "--max-mem", "256M"))
    d.wait_finished(ok)
    assert _gpus_of(scratch, ok) == "0,1 PCI_BUS_ID"              # the pair on the job's node
    r = d.dispatch("new", "--gpu-link", "NV", "--", "true")
    assert r.returncode == 6 and "--gpu-cores" in r.stderr


def test_max_time_get_set_add(daemon_factory, users, scratch):
    d = daemon_factory()
    alice, admin = users["alice"].pw_name, users["admin"].pw_name
    home = users["alice"].pw_dir
    job = d.submit("sleep", "600", flags=("--max-time", "1h", "--no-output"), user=alice, cwd=home)
    assert d.ok("job", str(job), "max-time", "get", user=alice).startswith(f"job {job} max-time 1h")
    r = d.dispatch("job", str(job), "max-time", "add", "1h", user=alice)
    assert r.returncode == 4 and "admin" in r.stderr
    assert d.ok("job", str(job), "max-time", "add", "30m", user=admin).startswith(f"job {job} max-time 1h30m")
    assert " 1h30m " in d.rows(user=alice)[job]
    status = os.path.join(d.state_dir, "jobs", str(job), "status.json")
    wait_for(lambda: os.path.exists(status), what="its shepherd running the job")
    # Cut it short, then take the daemon away: the shepherd has the new deadline and keeps it.
    d.ok("job", str(job), "max-time", "set", "2s", user=admin)
    d.kill9()
    exit_rec = os.path.join(d.state_dir, "jobs", str(job), "exit.json")
    wait_for(lambda: os.path.exists(exit_rec), timeout=60, what="the shepherd to time the job out alone")
    d2 = daemon_factory()
    assert exit_of(d2.wait_finished(job, user=alice)) == "timeout"
    r = d2.dispatch("job", str(job), "max-time", "set", "1h", user=admin)
    assert r.returncode == 10 and "already finished" in r.stderr
    r = d2.dispatch("job", str(job), "max-time", "set", "soon", user=admin)
    assert r.returncode == 2


def _query_gpu_csv(scratch):
    """The fake's --query-gpu answer for its four A100s: the recorded-format H100 fixture's first
    row (tests/fixtures/nvidia-smi/query-gpu-h100-2.csv, synthesised) with each card's index and
    the UUID the fake's -L gives it."""
    with open(os.path.join(FIXTURES, "nvidia-smi", "query-gpu-h100-2.csv")) as f:
        header, row = f.readline(), f.readline()
    cells = [c.strip() for c in row.split(",")]
    path = os.path.join(scratch, "query-gpu.csv")
    with open(path, "w") as f:
        f.write(header)
        for index in range(4):
            cells[0], cells[1] = str(index), f"GPU-00000000-0000-4000-8000-00000000000{index}"
            f.write(", ".join(cells) + "\n")
    return path


def test_a_gpu_jobs_record_names_its_gpu_and_driver(daemon_factory, users, scratch):
    env = _fake(scratch)
    env["FAKE_NVIDIA_SMI_QUERY_GPU"] = _query_gpu_csv(scratch)
    # The shepherd runs nvidia-smi with its own fixed environment: the fake reads these from a file.
    with open(os.path.join(scratch, "fakebin", "nvidia-smi.env"), "w") as f:
        f.writelines(f"export {k}={v}\n" for k, v in env.items() if k.startswith("FAKE_"))
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0", env=env)
    job = d.submit("true", flags=("--gpu-cores", "1"), cwd=scratch)
    d.wait_finished(job)
    rec = json.loads(d.ok("show", "--record", "--json", str(job)))
    shown = json.loads(d.ok("show", "--json", str(job)))
    (gpu,) = rec["gpu"]
    assert gpu["uuid"]["value"] == f"GPU-00000000-0000-4000-8000-00000000000{shown['gpus'][0]}", gpu["uuid"]
    assert gpu["driver_version"]["value"] == "550.127.05" and gpu["power_limit_w"]["value"] == 700.0
    assert gpu["uuid"]["source"].startswith("nvidia-smi --query-gpu")
    # Read again at the end: the clock event reasons of both ends, each a field.
    assert gpu["end"]["clocks_event_reasons"]["hw_thermal_slowdown"]["value"] is False
    assert gpu["topo"]["value"], gpu["topo"]          # its row of topo -m

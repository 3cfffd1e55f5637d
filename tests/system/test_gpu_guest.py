"""GPUs in the guest: masking by the job cgroup's device program, topology, NUMA placement.

The guest has no GPU, so the daemon is given one the way it would see a
real machine: the project's fake nvidia-smi (tests/fixtures/fake-nvidia-smi)
at /usr/local/bin, printing four A100s for ``-L``, a ``topo -m`` in
nvidia-smi's layout (NVLink pairs {0,1} on NUMA node 0 and {2,3} on node 1)
and a ``-q`` that gives card i the minor 3 - i; and device nodes made with
mknod (major 195, mode 0666 as the driver makes them). With no driver
behind them, opening an allowed node fails with ENXIO and a masked one with
EPERM, which is how the tests tell them apart.
"""

import json
import os

import pytest
from guestlib import (
    DROPIN_DIR,
    apply,
    clear_flags,
    dispatch,
    exit_of,
    expect_refusal,
    home,
    read,
    set_flags,
    submit,
    wait_finished,
    wait_running,
)

pytestmark = pytest.mark.system
USER = "alice"
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
ENV_DROPIN = f"{DROPIN_DIR}/55-test-gpus.conf"
FLAGS = ("--reserve-cpu", "0", "--reserve-mem", "0.25", "--min-job-mem", "0.125")
MINOR = {0: 3, 1: 2, 2: 1, 3: 0}          # nvidia-smi index -> device minor, as -q says

TOPO = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV2\tSYS\tSYS\t0-1\t0
GPU1\tNV2\t X \tSYS\tSYS\t0-1\t0
GPU2\tSYS\tSYS\t X \tNV2\t2-3\t1
GPU3\tSYS\tSYS\tNV2\t X \t2-3\t1

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NV#  = Connection traversing a bonded set of # NVLinks
"""

PROBE = ("import errno, json, os\n"
         "res = {}\n"
         "for m in range(4):\n"
         "    try:\n"
         "        os.close(os.open('/dev/nvidia%d' % m, os.O_RDONLY))\n"
         "        res[m] = 'open'\n"
         "    except OSError as e:\n"
         "        res[m] = errno.errorcode[e.errno]\n"
         "print(json.dumps(res))\n")


def _query() -> str:
    out = "==============NVSMI LOG==============\n\nAttached GPUs                             : 4\n"
    for index, minor in MINOR.items():
        out += (f"GPU 00000000:{7 + 8 * index:02X}:00.0\n"
                f"    Product Name                          : NVIDIA A100-SXM4-80GB\n"
                f"    Minor Number                          : {minor}\n"
                f"    GPU UUID                              : GPU-00000000-0000-4000-8000-00000000000{index}\n")
    return out


@pytest.fixture(scope="module", autouse=True)
def fake_gpus(guest, installed, guest_users):
    assert not guest.run("grep -qE '^ *195 ' /proc/devices", timeout=30).ok, "this guest has an NVIDIA driver"
    with open(os.path.join(FIXTURES, "fake-nvidia-smi"), "rb") as f:
        guest.put_bytes(f.read(), "/usr/local/bin/nvidia-smi", mode=0o755)
    guest.run("mkdir -p /etc/hpcb-test", timeout=30, check=True)
    guest.put_bytes(TOPO, "/etc/hpcb-test/topo.txt", mode=0o644)
    guest.put_bytes(_query(), "/etc/hpcb-test/query.txt", mode=0o644)
    for minor in MINOR.values():
        guest.run(f"mknod -m 0666 /dev/nvidia{minor} c 195 {minor}", timeout=30, check=True)
    guest.put_bytes("[Service]\nEnvironment=FAKE_NVIDIA_SMI_TOPO=/etc/hpcb-test/topo.txt "
                    "FAKE_NVIDIA_SMI_QUERY=/etc/hpcb-test/query.txt\n", ENV_DROPIN, mode=0o644)
    set_flags(guest, FLAGS, how="restart")       # discovery happens at start
    yield
    guest.run(f"rm -f {ENV_DROPIN} /usr/local/bin/nvidia-smi /dev/nvidia[0-3]; rm -rf /etc/hpcb-test",
              timeout=30)
    clear_flags(guest, how="restart")


def _journal(guest) -> str:
    return guest.run("journalctl -u hpc-batch -o cat --no-pager | tail -40", timeout=60).out


def _probe_of(guest, job) -> tuple[dict, str]:
    lines = read(guest, f"{home(guest, USER)}/output.{job}.log", user=USER).strip().splitlines()
    return {int(k): v for k, v in json.loads(lines[-1]).items()}, lines[0]


def _gpus_of(guest, job) -> list:
    rec = json.loads(read(guest, f"/var/lib/hpc-batch/jobs/{job}/job.json"))
    return rec["alloc"]["gpus"]


def _expect(gpus) -> dict:
    mine = {MINOR[g] for g in gpus}
    return {m: ("ENXIO" if m in mine else "EPERM") for m in range(4)}


def test_startup_reports_topology_minors_and_masking(guest):
    log = _journal(guest)
    assert "GPU topology: 0-1 NV2" in log and "GPU 0 is /dev/nvidia3" in log, log
    assert "GPU masking: on" in log, log


def test_a_job_opens_only_its_own_gpu(guest):
    job = submit(guest, USER, "sh", "-c", f'echo "$CUDA_VISIBLE_DEVICES"; python3 -c "{PROBE}"',
                 flags=("--gpu-cores", "1", "--max-mem", "0.25"))
    assert exit_of(wait_finished(guest, USER, job)) == "0"
    probe, visible = _probe_of(guest, job)
    (gpu,) = _gpus_of(guest, job)
    assert probe == _expect([gpu]), probe
    # Masked, CUDA sees only this card: it is named by UUID, not by an index that would now mean another.
    assert visible == f"GPU-00000000-0000-4000-8000-00000000000{gpu}", visible


def test_a_job_without_gpus_opens_none(guest):
    job = submit(guest, USER, "sh", "-c", f'echo "[$CUDA_VISIBLE_DEVICES]"; python3 -c "{PROBE}"',
                 flags=("--max-mem", "0.25"))
    assert exit_of(wait_finished(guest, USER, job)) == "0"
    probe, visible = _probe_of(guest, job)
    assert probe == _expect([]) and visible == "[]", (probe, visible)


def test_numa_local_gpu_takes_cpus_where_the_gpus_are(guest):
    hold = submit(guest, USER, "sleep", "600", flags=("--gpu-cores", "2", "--max-mem", "0.25"))
    try:
        wait_running(guest, USER, hold)
        assert sorted(_gpus_of(guest, hold)) == [0, 1]            # the first whole pair
        job = submit(guest, USER, "sh", "-c", "grep Cpus_allowed_list /proc/self/status",
                     flags=("--gpu-cores", "2", "--numa-local-gpu", "--max-mem", "0.25"))
        assert exit_of(wait_finished(guest, USER, job)) == "0"
        assert sorted(_gpus_of(guest, job)) == [2, 3]
        cpus = read(guest, f"{home(guest, USER)}/output.{job}.log", user=USER).split()[-1]
        node1 = read(guest, "/sys/devices/system/node/node1/cpulist").strip()
        assert cpus in ("2", "3") and node1 == "2-3", (cpus, node1)
        assert " 2:NV2 " in dispatch(guest, USER, "list", "--finished").out
    finally:
        dispatch(guest, USER, "kill", str(hold))


@pytest.mark.parametrize("how", ["reload", "restart"])
def test_the_mask_survives_reload_and_restart(guest, how):
    flag = f"/tmp/hpcb-gpu-{how}"
    guest.run(f"rm -f {flag}", timeout=30)
    job = submit(guest, USER, "sh", "-c", f'while [ ! -e {flag} ]; do sleep 0.2; done; python3 -c "{PROBE}"',
                 flags=("--gpu-cores", "1", "--max-mem", "0.25"))
    wait_running(guest, USER, job)
    apply(guest, how)
    guest.run(f"touch {flag}", timeout=30, check=True)
    assert exit_of(wait_finished(guest, USER, job)) == "0"
    probe, _ = _probe_of(guest, job)
    assert probe == _expect(_gpus_of(guest, job)), probe


def test_no_gpu_mask_leaves_gpus_open(guest):
    set_flags(guest, FLAGS + ("--no-gpu-mask",), how="restart")
    try:
        assert "GPU masking: off (--no-gpu-mask)" in _journal(guest)
        job = submit(guest, USER, "sh", "-c", f'python3 -c "{PROBE}"', flags=("--max-mem", "0.25"))
        assert exit_of(wait_finished(guest, USER, job)) == "0"
        probe, _ = _probe_of(guest, job)
        assert probe == {m: "ENXIO" for m in range(4)}, probe     # nothing masked
    finally:
        set_flags(guest, FLAGS, how="restart")


def test_masking_that_cannot_be_had_is_a_refusal(guest):
    # systemd's seccomp filter takes the bpf() system call away from the daemon.
    expect_refusal(guest, "60-no-bpf.conf", "[Service]\nSystemCallFilter=~bpf\nSystemCallErrorNumber=EPERM\n",
                   "--no-gpu-mask", "cannot mask GPUs")

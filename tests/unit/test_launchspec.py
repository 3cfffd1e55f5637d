"""A job's environment and launch spec (daemon/launchspec.py), case by case.

The rule the table holds: ``HPC_BATCH_JOB_ID`` and ``CUDA_VISIBLE_DEVICES``
are set by the daemon, and neither a forwarded environment (``--env``) nor a
job's own settings can change them.
"""

import pytest

from hpc_batch import defaults
from hpc_batch.core.jobrequest import JobRequest
from hpc_batch.core.jobs import Job
from hpc_batch.core.resources import Allocation
from hpc_batch.daemon import launchspec

UUIDS = {0: "GPU-aaaa", 1: "GPU-bbbb", 2: "GPU-cccc"}


def _job(gpus=(), array=None, request=None) -> Job:
    return Job(id=7, uid=1000, gid=1000, user="alice", argv=["run"], cwd="/home/alice", submitted=0.0,
               max_time=60, array=array, request=JobRequest.from_dict(request or {}),
               alloc=None if gpus is None else Allocation(cpus=(0,), mem_by_node=(), gpus=tuple(gpus),
                                                          exclusive=False))


FORGED = {"HPC_BATCH_JOB_ID": "99", "CUDA_VISIBLE_DEVICES": "0,1,2", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
# (what was stored, the job's gpus, masked, what the job sees of the daemon's names)
RULE_CASES = [
    ("a clean environment", {}, [], False, {"HPC_BATCH_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": ""}),
    ("--env forwards forged ids", {"forward": dict(FORGED, PATH="/x")}, [1], False,
     {"HPC_BATCH_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "PATH": "/x"}),
    ("the job's own settings forge them", {"job_env": FORGED}, [], False,
     {"HPC_BATCH_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
    ("both at once, masked", {"forward": FORGED, "job_env": FORGED}, [0, 2], True,
     {"HPC_BATCH_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-cccc"}),
    ("a job without an allocation sees no GPU", {"forward": FORGED}, None, False,
     {"HPC_BATCH_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": ""}),
    ("the job's settings win over what is forwarded, not over the daemon",
     {"forward": {"A": "1", "HPC_BATCH_JOB_ID": "1"}, "job_env": {"A": "2"}}, [], False,
     {"A": "2", "HPC_BATCH_JOB_ID": "7"}),
]


@pytest.mark.parametrize("stored, gpus, masked, sees", [c[1:] for c in RULE_CASES], ids=[c[0] for c in RULE_CASES])
def test_the_daemons_names_are_never_overridden(stored, gpus, masked, sees):
    env = launchspec.environment(_job(gpus), stored, "/home/alice", "/bin/zsh", masked, UUIDS)
    assert {k: env.get(k) for k in sees} == sees


def test_a_clean_environment_is_the_users_own_with_the_stored_base():
    clean = launchspec.environment(_job(), {}, "/home/alice", "/bin/zsh", False, {})
    assert clean == {"PATH": defaults.DEFAULT_PATH, "HOME": "/home/alice", "USER": "alice", "SHELL": "/bin/zsh",
                     "LANG": "C.UTF-8", "HPC_BATCH_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "",
                     "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    based = launchspec.environment(_job(), {"base": {"PATH": "/opt/bin", "LANG": "de_DE.UTF-8", "X": "1"}},
                                   "/", "/bin/sh", False, {})
    assert (based["PATH"], based["LANG"], "X" in based) == ("/opt/bin", "de_DE.UTF-8", False)


def test_an_array_element_is_told_its_index_and_its_array():
    env = launchspec.environment(_job(array={"first": 5, "index": 3}), {"forward": {"HPC_BATCH_ARRAY_INDEX": "9"}},
                                 "/", "/bin/sh", False, {})
    assert (env["HPC_BATCH_ARRAY_INDEX"], env["HPC_BATCH_ARRAY_JOB_ID"]) == ("3", "5")
    assert "HPC_BATCH_ARRAY_INDEX" not in launchspec.environment(_job(), {}, "/", "/bin/sh", False, {})


# (the job's gpus, masked, the uuids known, CUDA_VISIBLE_DEVICES)
DEVICE_CASES = [
    ("unmasked: nvidia-smi's indices", [2, 0], False, UUIDS, "2,0"),
    ("masked: by uuid", [2, 0], True, UUIDS, "GPU-cccc,GPU-aaaa"),
    ("masked, a uuid unknown: renumbered", [1, 2], True, {1: "GPU-bbbb"}, "0,1"),
    ("none", [], True, UUIDS, ""),
]


@pytest.mark.parametrize("gpus, masked, uuids, want", [c[1:] for c in DEVICE_CASES], ids=[c[0] for c in DEVICE_CASES])
def test_visible_devices_name_the_gpus_as_cuda_will_see_them(gpus, masked, uuids, want):
    assert launchspec.visible_devices(gpus, masked, uuids) == want


@pytest.mark.parametrize("use_cgroups", [True, False])
def test_the_spec_pins_cpus_itself_only_without_cgroups(use_cgroups):
    job = _job(request={"aslr": "off", "notify": {"forms": ["tty"], "command": None}})
    alloc = Allocation(cpus=(2, 3), mem_by_node=((0, 1 << 30),), gpus=(), exclusive=False)
    spec = launchspec.build(job, alloc, {"A": "1"}, cgroup="/cg/7" if use_cgroups else None,
                            shepherd_cgroup="/cg/shepherds" if use_cgroups else None, use_cgroups=use_cgroups,
                            admin_gid=10, max_output_buffer=1 << 20, record=None)
    assert spec.cpus == (None if use_cgroups else [2, 3])
    assert (spec.cgroup, spec.env, spec.aslr, spec.thp, spec.admin_gid) == \
        ("/cg/7" if use_cgroups else None, {"A": "1"}, "off", "on", 10)
    assert spec.notify is not None and spec.notify["tty"] is True
    assert launchspec.notify_spec(_job()) is None

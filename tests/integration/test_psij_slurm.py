"""Portability, for real: one PSI/J script through Slurm and through hpc-batch, the same results.

Starts a single-node Slurm from Debian's packages (``scripts/install-host-
deps --slurm``) as root on scratch paths: munged with a key of its own,
slurmctld and slurmd in the foreground with a minimal slurm.conf naming this
host, all stopped at the end. Then psij_portable.py runs with PSI/J's slurm
executor and with hpc-batch, and every job must end in the same state, with
the same exit code and the same output. ``./scripts/test`` (and so CI)
installs the packages and runs it with the host tests, in seconds; it is
marked ``slurm`` to run it alone: ``./scripts/test --no-system -m slurm``.
"""

import json
import os
import shutil
import socket
import subprocess

import pytest
from conftest import wait_for
from test_psij import EXPECTED, _portable

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

DAEMONS = ("munged", "slurmctld", "slurmd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conf(base: str, host: str) -> str:
    return "\n".join([
        "ClusterName=hpcbtest",
        f"SlurmctldHost={host}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={base}/munge/munge.socket",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        f"StateSaveLocation={base}/state",
        f"SlurmdSpoolDir={base}/spool",
        f"SlurmctldPidFile={base}/slurmctld.pid",
        f"SlurmdPidFile={base}/slurmd.pid",
        f"SlurmctldLogFile={base}/slurmctld.log",
        f"SlurmdLogFile={base}/slurmd.log",
        # No cgroups and no accounting: the least a single node needs to run batch jobs.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "ReturnToService=2",
        f"NodeName={host} CPUs={os.cpu_count()} RealMemory=1024 State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


@pytest.fixture
def slurm(scratch, users):
    """A running single-node Slurm; yields the environment its commands need (SLURM_CONF)."""
    missing = [d for d in (*DAEMONS, "sbatch", "squeue", "sinfo")
               if shutil.which(d, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: run scripts/install-host-deps --slurm")
    base = os.path.join(scratch, "slurm-daemons")
    for sub in ("munge", "state", "spool"):
        os.makedirs(os.path.join(base, sub))
    os.chmod(os.path.join(base, "munge"), 0o755)
    key = os.path.join(base, "munge", "munge.key")
    with open(key, "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(key, 0o600)
    conf = os.path.join(base, "slurm.conf")
    with open(conf, "w") as f:
        f.write(_conf(base, socket.gethostname().split(".")[0]))
    env = dict(os.environ, SLURM_CONF=conf)
    log = open(os.path.join(base, "daemons.log"), "ab")
    procs = []
    try:
        m = os.path.join(base, "munge")
        procs.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={m}/munge.socket",
             f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed"],
            stdout=log, stderr=log, env=env))
        wait_for(lambda: os.path.exists(f"{m}/munge.socket"), what="munged's socket")
        procs.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", conf], stdout=log, stderr=log, env=env))
        procs.append(subprocess.Popen(["slurmd", "-D", "-f", conf], stdout=log, stderr=log, env=env))

        def idle():
            assert all(p.poll() is None for p in procs), _logs(base)
            r = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True)
            return r.stdout.strip() == "idle"
        wait_for(idle, timeout=60, interval=0.5, what="the Slurm node to be idle")
        yield {"SLURM_CONF": conf}
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        log.close()


def _logs(base: str) -> str:
    out = []
    for name in ("daemons.log", "slurmctld.log", "slurmd.log", "munge/munged.log"):
        try:
            with open(os.path.join(base, name), errors="replace") as f:
                out.append(f"--- {name}\n{f.read()[-4000:]}")
        except OSError:
            pass
    return "\n".join(out)


def test_the_same_script_through_slurm_and_hpc_batch(slurm, daemon_factory, scratch):
    hb = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    results = {}
    for executor in ("slurm", "hpc-batch"):
        work = os.path.join(scratch, f"via-{executor}")
        os.mkdir(work)
        results[executor] = _portable(executor, work, url=hb.socket if executor == "hpc-batch" else None,
                                      env=slurm)
    print(json.dumps(results, indent=1, sort_keys=True))
    for key in results["slurm"]:
        ours, theirs = results["hpc-batch"][key], results["slurm"][key]
        # Slurm's executor polls squeue, so a short job can go from QUEUED straight to its end;
        # the states seen may differ there, never the end.
        assert {k: v for k, v in ours.items() if k != "states"} == {k: v for k, v in theirs.items()
                                                                      if k != "states"}, key
        assert theirs["states"][0] == "QUEUED" and theirs["states"][-1] == theirs["final"]
    for key, (final, code, files) in EXPECTED.items():
        got = results["slurm"][key]
        assert (got["final"], got["exit_code"]) == (final, code), (key, got)
        assert {k: got[k] for k in files} == files, key

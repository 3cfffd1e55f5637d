"""How long `dispatch wait` takes to answer once a job has ended.

    python bench/bench_wait.py [--runs N]

Starts a scratch hpc-batchd (--no-cgroups, like bench_targets.py) from the
python running this script's venv. Each run submits a job that waits for a
flag file, starts `dispatch wait ID` and gives it half a second to connect
(it must be waiting before the job ends), creates the flag, and measures from the job's
end, as its shepherd recorded it in exit.json, to the wait process exiting.

Baseline in the same run: one `dispatch list` round trip (a client's start,
a request and its reply), the floor any answer to a client pays. Reported:
median, min and max over the runs; the target is under 50 ms (Slurm's
`sbatch --wait` polls every 2 s).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

BIN = os.path.dirname(sys.executable)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="hpcb-wait-")
    os.chmod(work, 0o755)
    sock = os.path.join(work, "sock")
    env = dict(os.environ, HPC_BATCH_SOCKET=sock)
    group = next(g for g in ("wheel", "sudo", "adm", "root") if subprocess.run(
        ["getent", "group", g], capture_output=True).returncode == 0)
    daemon = subprocess.Popen([os.path.join(BIN, "hpc-batchd"), "--no-cgroups", "--socket", sock,
                               "--state-dir", os.path.join(work, "state"), "--no-dev-dir", "--admin-group", group,
                               "--reserve-cpu", "0", "--reserve-mem", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    dispatch = os.path.join(BIN, "dispatch")
    try:
        deadline = time.monotonic() + 30
        while not _answers(sock):
            if time.monotonic() > deadline:
                raise SystemExit("hpc-batchd did not come up")
            time.sleep(0.05)
        base, lat = [], []
        for i in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run([dispatch, "list"], env=env, capture_output=True, check=True)
            base.append(time.perf_counter() - t0)
            flag = os.path.join(work, f"go{i}")
            out = subprocess.run([dispatch, "new", "--no-output", "--", "sh", "-c",
                                  f"while [ ! -e {flag} ]; do sleep 0.01; done"],
                                 env=env, capture_output=True, text=True, check=True, cwd=work).stdout
            job = out.split()[1]
            waiter = subprocess.Popen([dispatch, "wait", job], env=env, stdout=subprocess.DEVNULL)
            # Let the client start and send its request; the figure runs from the job's end,
            # so this pause only makes sure the wait is already held when the job ends.
            time.sleep(0.5)
            open(flag, "w").close()
            waiter.wait()
            returned = time.time()
            ended = json.load(open(os.path.join(work, "state", "jobs", job, "exit.json")))["ended"]
            lat.append(returned - ended)
        med_b, med_l = statistics.median(base), statistics.median(lat)
        print(f"dispatch list round trip (baseline): median {med_b * 1000:.1f} ms "
              f"(min {min(base) * 1000:.1f}, max {max(base) * 1000:.1f})")
        print(f"job end -> dispatch wait returns:    median {med_l * 1000:.1f} ms "
              f"(min {min(lat) * 1000:.1f}, max {max(lat) * 1000:.1f}); {med_l / med_b:.2f}x the baseline; "
              f"target < 50 ms: {'met' if med_l < 0.05 else 'NOT met'}")
        return 0
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=30)
        subprocess.run(["pkill", "-f", work])
        shutil.rmtree(work, ignore_errors=True)


def _answers(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


if __name__ == "__main__":
    sys.exit(main())

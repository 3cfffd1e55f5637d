"""Soak: many jobs while the daemon is reloaded and kill -9'd at random moments.

Every job must be reported exactly once, with the exit code it really had.
Size: $HPC_BATCH_SOAK_N jobs with $HPC_BATCH_SOAK_RELOADS reloads and
$HPC_BATCH_SOAK_KILLS kill -9s at random points (CI runs the defaults; the
closing notes record the largest runs).
"""

import os
import random
import signal

import pytest
from conftest import exit_of, wait_for

N = int(os.environ.get("HPC_BATCH_SOAK_N", "40"))
RELOADS = int(os.environ.get("HPC_BATCH_SOAK_RELOADS", str(max(1, N // 10))))
KILLS = int(os.environ.get("HPC_BATCH_SOAK_KILLS", str(max(1, N // 10))))
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120 + 6 * N)]


def test_soak_reload_and_crash(daemon_factory, users, scratch):
    rng = random.Random(int(os.environ.get("HPC_BATCH_SOAK_SEED", "1234")))
    args = ("--reserve-cpu", "0", "--reserve-mem", "0", "--keep-finished", str(N + 10))
    d = daemon_factory(*args)
    expected = {}
    actions = {"reload": 0, "kill9": 0}
    # After which submitted job each reload and kill -9 happens.
    plan = dict(zip(rng.sample(range(1, N), min(N - 1, RELOADS + KILLS)),
                    rng.sample(["reload"] * RELOADS + ["kill9"] * KILLS, RELOADS + KILLS)))
    while len(expected) < N:
        code = rng.randint(0, 20)
        nap = rng.choice(["0", "0.1", "0.3", "0.8", "1.5"])
        job = d.submit("sh", "-c", f"sleep {nap}; exit {code}", flags=("--no-output", "--cpu", "1"))
        assert job not in expected
        expected[job] = code
        action = plan.get(len(expected))
        if action == "reload":
            seen = d.log().count("ready on")
            d.proc.send_signal(signal.SIGHUP)
            wait_for(lambda d=d, seen=seen: d.log().count("ready on") > seen, timeout=30, what="reload")
            actions["reload"] += 1
        elif action == "kill9":
            d.kill9()
            d = daemon_factory(*args)
            actions["kill9"] += 1
    wait_for(lambda: not d.jobs(), timeout=30 + 2 * N, backoff=0.5, what="queue drained")
    rows = d.rows("--finished")
    assert sorted(rows) == sorted(expected), "a job was lost or invented"
    wrong = {j: (exit_of(rows[j]), c) for j, c in expected.items() if exit_of(rows[j]) != str(c)}
    assert not wrong, f"wrong exit codes (got, expected): {wrong}"
    print(f"soak: {N} jobs, {actions['reload']} reloads, {actions['kill9']} kill -9s, all exit codes right")

"""cgroup v2 isolation in the guest: CPUs and memory on one NUMA node, hard budgets, OOM.

The guest has two NUMA nodes of two CPUs and about 1.9 GiB each. The module
first reloads the daemon with flags sized for it (which also shows that a
reload applies flags changed in the unit): one reserved core, 0.25 GiB
reserved memory, a 0.125 GiB floor for assigned budgets and 64 tasks a job.
"""

import re

import pytest
from guestlib import (
    clear_flags,
    daemon_cmdline,
    dispatch,
    exit_of,
    expect_refusal,
    home,
    job_cgroup,
    read,
    rows,
    set_flags,
    state,
    submit,
    wait_finished,
    wait_for,
    wait_running,
)

pytestmark = pytest.mark.system
USER = "alice"
FLAGS = ("--reserve-cpu", "1", "--reserve-mem", "0.25", "--min-job-mem", "0.125", "--max-pids", "64")

ALLOC = ("import time\n"
         "blocks = []\n"
         "for _ in range({n}):\n"
         "    blocks.append(bytearray({mib} << 20))\n"
         "print('allocated', flush=True)\n"
         "time.sleep({nap})\n")


@pytest.fixture(scope="module", autouse=True)
def sized_daemon(guest, installed, guest_users):
    set_flags(guest, FLAGS, how="reload")
    assert "--min-job-mem 0.125" in daemon_cmdline(guest)
    yield
    clear_flags(guest, how="reload")


def node_cpus(guest):
    out = {}
    for node in (0, 1):
        text = read(guest, f"/sys/devices/system/node/node{node}/cpulist").strip()
        cpus = set()
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
        out[node] = cpus
    return out


def parse_list(text):
    cpus = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def test_job_confined_to_one_node(guest):
    # The allocator says when its 96 MiB are touched (a line on a pipe) and
    # holds them until the shell has read memory.numa_stat: no fixed sleep,
    # however slow the guest is.
    alloc = ("import sys; b = bytearray(96 << 20); print('ready', flush=True); "
             "sys.stdin.readline()")
    script = ("grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status; "
              "cg=/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup); "
              "d=$(mktemp -d); mkfifo $d/go; "
              f"python3 -c \"{alloc}\" < $d/go | {{ exec 3>$d/go; read ready; "
              "grep '^anon ' $cg/memory.numa_stat; cat $cg/memory.swap.max; echo done >&3; }; "
              "rm -r $d")
    job = submit(guest, USER, "sh", "-c", script, flags=("--cpu", "1", "--max-mem", "0.5"))
    assert exit_of(wait_finished(guest, USER, job)) == "0"
    out = read(guest, f"{home(guest, USER)}/output.{job}.log", user=USER)
    cpus = parse_list(re.search(r"Cpus_allowed_list:\s*(\S+)", out).group(1))
    mems = parse_list(re.search(r"Mems_allowed_list:\s*(\S+)", out).group(1))
    nodes = node_cpus(guest)
    (node,) = [n for n, c in nodes.items() if cpus <= c]       # inside exactly one node
    assert len(cpus) == 1 and mems == {node}, out
    anon = dict(kv.split("=") for kv in re.search(r"^anon (.*)$", out, re.M).group(1).split())
    other = 1 - node
    assert int(anon[f"N{node}"]) >= 96 << 20 and int(anon[f"N{other}"]) == 0, out
    assert out.strip().splitlines()[-1] == "0", out              # memory.swap.max: no swap


FORKER = ("import os, time\n"
          "n = 0\n"
          "try:\n"
          "    for _ in range(200):\n"
          "        if os.fork() == 0:\n"
          "            time.sleep(60)\n"
          "            os._exit(0)\n"
          "        n += 1\n"
          "except OSError as exc:\n"
          "    print('stopped', n, exc.errno, flush=True)\n")


def test_max_pids_bounds_a_fork_bomb(guest):
    job = submit(guest, USER, "sh", "-c", "cat /sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/pids.max; "
                 f"python3 -c \"{FORKER}\"")
    assert exit_of(wait_finished(guest, USER, job)) == "0"
    out = read(guest, f"{home(guest, USER)}/output.{job}.log", user=USER).split()
    assert out[0] == "64", out
    assert out[1] == "stopped" and int(out[2]) < 64 and out[3] == "11", out   # EAGAIN at the limit
    assert guest.run(f"test ! -e {job_cgroup(job)}", timeout=30).ok          # and the children went with the job


def test_budget_spread_over_nodes_is_marked(guest):
    job = submit(guest, USER, "sh", "-c", "cat /sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/cpuset.mems; "
                 "grep Mems_allowed_list /proc/self/status", flags=("--cpu", "1", "--max-mem", "2.5"))
    row = wait_finished(guest, USER, job)
    assert " 2.5G+ " in row, row
    out = read(guest, f"{home(guest, USER)}/output.{job}.log", user=USER)
    assert parse_list(out.splitlines()[0]) == {0, 1}, out


def test_numa_local_waits_for_a_node(guest):
    hold = ("--cpu", "1", "--max-mem", "1")
    a = submit(guest, USER, "sleep", "600", flags=hold)
    b = submit(guest, USER, "sleep", "600", flags=hold)
    wait_running(guest, USER, a)
    wait_running(guest, USER, b)
    w = submit(guest, USER, "sh", "-c", "grep Mems_allowed_list /proc/self/status",
               flags=("--cpu", "1", "--max-mem", "1.2", "--numa-local"))
    try:
        assert state(guest, USER, w) == "queued"
        assert "+" not in rows(guest, USER)[w].split()[-2]
        node_of_a = parse_list(read(guest, f"{job_cgroup(a)}/cpuset.mems"))
        dispatch(guest, USER, "kill", str(a))
        assert exit_of(wait_finished(guest, USER, w)) == "0"
        out = read(guest, f"{home(guest, USER)}/output.{w}.log", user=USER)
        assert parse_list(out.split()[-1]) == node_of_a, out       # one node, the one a freed
    finally:
        for j in (a, b, w):
            dispatch(guest, USER, "kill", str(j))


def test_oom_with_requested_budget(guest):
    job = submit(guest, USER, "python3", "-c", ALLOC.format(n=40, mib=32, nap=0),
                 flags=("--max-mem", "0.25"))
    row = wait_finished(guest, USER, job)
    assert exit_of(row) == "oom" and "requested" in row, row
    assert guest.run(f"test ! -e {job_cgroup(job)}", timeout=30).ok


def test_oom_with_assigned_budget(guest):
    out = dispatch(guest, USER, "new", "--", "python3", "-c", ALLOC.format(n=200, mib=32, nap=0))
    assert out.ok and "assigned by default" in out.out, out.describe()
    job = int(out.out.split()[1])
    row = wait_finished(guest, USER, job)
    assert exit_of(row) == "oom" and "assigned by default" in row, row


def test_children_that_outlive_the_job_are_killed(guest):
    # Two children outlive the job: one in its own session, one in its process group.
    job = submit(guest, USER, "sh", "-c", "setsid sleep 6543 & sleep 6543 & sleep 1; echo parent-exits")
    assert exit_of(wait_finished(guest, USER, job)) == "0"
    wait_for(lambda: guest.run("pgrep -f '^sleep 6543'", timeout=30).rc == 1, 60, what="children gone")
    assert guest.run(f"test ! -e {job_cgroup(job)}", timeout=30).ok


def test_peak_memory_and_cpu_time_recorded(guest):
    job = submit(guest, USER, "python3", "-c",
                 "b = bytearray(200 << 20)\nx = 0\nfor i in range(3000000): x += i\n",
                 flags=("--max-mem", "0.75"))
    assert exit_of(wait_finished(guest, USER, job)) == "0"
    import json
    rec = json.loads(read(guest, f"/var/lib/hpc-batch/jobs/{job}/job.json"))
    assert rec["stats"]["peak_mem"] >= 200 << 20, rec["stats"]
    assert rec["stats"]["cpu_time"] > 0.1, rec["stats"]
    # What the user sees of it: show --json and the list's accounting columns.
    shown = json.loads(dispatch(guest, USER, "show", "--json", str(job)).out)
    assert shown["peak_mem"] >= 200 << 20 and shown["cpu_time"] > 0.1 and shown["wall"] > 0, shown
    row = rows(guest, USER, "--finished")[job].split()
    assert int(row[row.index("peak") + 1].rstrip("M")) >= 200, row


def test_shepherd_outside_the_job_cgroup(guest):
    job = submit(guest, USER, "sleep", "600")
    try:
        wait_running(guest, USER, job)
        pid = read(guest, f"/var/lib/hpc-batch/jobs/{job}/shepherd.pid").split()[0]
        cg = read(guest, f"/proc/{pid}/cgroup").strip()
        assert cg == "0::/hpc-batch/shepherds", cg
        procs = read(guest, f"{job_cgroup(job)}/cgroup.procs").split()
        assert pid not in procs and procs
    finally:
        dispatch(guest, USER, "kill", str(job))


def test_missing_delegate_refuses_without_restart_loop(guest):
    expect_refusal(guest, "60-no-delegate.conf", "[Service]\nDelegate=no\n", "--no-cgroups", "Delegate")


def test_oom_while_the_daemon_is_down(guest):
    flag = "/tmp/hpcb-oom-go"
    guest.run(f"rm -f {flag}", timeout=30)
    job = submit(guest, USER, "sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.2; done; "
                 f"python3 -c \"{ALLOC.format(n=40, mib=32, nap=0)}\"", flags=("--max-mem", "0.25"))
    wait_running(guest, USER, job)
    guest.run("systemctl stop hpc-batch", timeout=120, check=True)
    try:
        guest.run(f"touch {flag}", timeout=30, check=True)
        wait_for(lambda: guest.run(f"test -e /var/lib/hpc-batch/jobs/{job}/exit.json", timeout=30).ok,
                 120, what="the shepherd's exit record")
    finally:
        guest.run("systemctl start hpc-batch", timeout=300, check=True)
    row = wait_finished(guest, USER, job)
    assert exit_of(row) == "oom" and "requested" in row, row

"""The reproducibility record in the SMT guest, with cgroups v2 and systemd (issue 22).

- The record's allocation, as read back, is what the kernel holds for the job's cgroup: each
  value is compared with the cgroup file read in the guest while the job runs.
- The guest (QEMU, TCG) has no cpufreq and no thermal throttle counters: its verdict is
  `unknown`, never `clean`, and says why.
- A daemon killed with SIGKILL mid-job (systemd starts another) loses nothing of the record:
  the shepherd keeps it, and it is complete at the job's end.
"""

import json

import pytest
from guestlib import (
    dispatch,
    home,
    job_cgroup,
    main_pid,
    read,
    ready_count,
    start_daemon,
    submit,
    wait_finished,
    wait_for,
)

pytestmark = pytest.mark.system

FLAGS = ("--reserve-cpu", "2", "--reserve-mem", "0.25", "--min-job-mem", "0.125")   # as the benchmark tests


def _record(guest, user, job) -> dict:
    r = dispatch(guest, user, "show", "--record", "--json", str(job))
    assert r.ok, r.describe()
    return json.loads(r.out)


def test_the_record_reads_back_the_cgroup_is_unknown_here_and_survives_a_daemon_kill(smt_guest):
    g = smt_guest
    start_daemon(g, *FLAGS)
    marker = f"{home(g, 'alice')}/record-go"
    g.run(f"rm -f {marker}", user="alice", timeout=30)
    job = submit(g, "alice", "sh", "-c", f"while [ ! -e {marker} ]; do sleep 0.2; done",
                 flags=("--max-mem", "128M", "--cpu", "1"))
    try:
        partial = wait_for(lambda: (r := dispatch(g, "alice", "show", "--record", "--json", str(job))).ok
                           and (rec := json.loads(r.out)).get("allocation") and rec, 240,
                           what=f"job {job}'s partial record")
        assert partial["complete"] is False
        cg = job_cgroup(job)
        back = partial["allocation"]["read_back"]
        for key, name in (("cpus_effective", "cpuset.cpus.effective"), ("mems_effective", "cpuset.mems.effective"),
                          ("memory_max", "memory.max"), ("memory_swap_max", "memory.swap.max"),
                          ("pids_max", "pids.max"), ("partition", "cpuset.cpus.partition")):
            on_disk = read(g, f"{cg}/{name}").strip()
            assert str(back[key]["value"]) == on_disk, (key, back[key], on_disk)
            assert back[key]["source"] == f"{cg}/{name}"
        shown = json.loads(dispatch(g, "alice", "show", "--json", str(job)).out)
        assert partial["allocation"]["requested"]["cpus"] == shown["cpus"]
        assert partial["allocation"]["requested"]["mem"] == 128 << 20
        # kill -9 the daemon; systemd starts another, which re-adopts the job.
        before = ready_count(g)
        g.run(f"kill -9 {main_pid(g)}", timeout=30, check=True)
        wait_for(lambda: ready_count(g) > before, 180, what="hpc-batch to be restarted after kill -9")
    finally:
        g.run(f"touch {marker}", user="alice", timeout=30)
    row = wait_finished(g, "alice", job)
    rec = _record(g, "alice", job)
    assert rec["complete"] is True
    # No cpufreq in the guest: never clean, and the reasons say why (noisy evidence, if any, comes first).
    assert rec["frequency"]["available"] is False
    assert rec["verdict"]["verdict"] in ("unknown", "noisy"), rec["verdict"]
    assert any("cpufreq" in why for why in rec["verdict"]["reasons"]), rec["verdict"]
    assert rec["verdict"]["verdict"] in row.split(), row
    # The end snapshot read the job's cgroup before it went: its cpu.stat moved.
    assert rec["sentinels"]["delta"]["cgroup"], rec["sentinels"]["delta"]
    start_stat = rec["sentinels"]["start"]["cgroup"]["cpu.stat"]
    assert start_stat["source"] == f"{job_cgroup(job)}/cpu.stat" and "usage_usec" in start_stat["value"], start_stat
    # The file in the state directory: root's, 0640.
    mode = g.run(f"stat -c '%U %a' /var/lib/hpc-batch/jobs/{job}/record.json", timeout=30, check=True).out.split()
    assert mode == ["root", "640"], mode
    # The verdict and digest reached the history archive (its writer commits the row just after the end).
    def row():
        out = g.run(f"dispatch history --json {job}", user="alice", timeout=30, check=True).out
        rows = json.loads(out)["jobs"]
        return rows[0] if rows else None
    line = wait_for(row, 60, what=f"job {job} in alice's history")
    assert line["verdict"] == rec["verdict"]["verdict"] and line["record_digest"] == rec["digest"]
    assert line["setup_digest"] and line["setup_digest"].startswith("sha256:")

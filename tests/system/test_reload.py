"""Reload and restart with a job running in its cgroup as a real user."""

import pytest
from guestlib import apply, dispatch, exit_of, job_cgroup, main_pid, read, submit, wait_finished, wait_running

pytestmark = pytest.mark.system
USER = "bob"


@pytest.mark.parametrize("how", ["reload", "restart"])
def test_job_survives_and_keeps_its_limits(guest, installed, guest_users, how):
    flag = f"/tmp/hpcb-go-{how}"
    guest.run(f"rm -f {flag}", timeout=30)
    job = submit(guest, USER, "sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.2; done; exit 5",
                 flags=("--max-mem", "0.5"))
    wait_running(guest, USER, job)
    limits = read(guest, f"{job_cgroup(job)}/memory.max")
    job_pid = read(guest, f"/var/lib/hpc-batch/jobs/{job}/status.json")
    pid_before = main_pid(guest)
    apply(guest, how)
    if how == "reload":
        assert main_pid(guest) == pid_before          # re-exec in place
    assert read(guest, f"{job_cgroup(job)}/memory.max") == limits
    assert read(guest, f"/var/lib/hpc-batch/jobs/{job}/status.json") == job_pid
    row = dispatch(guest, USER, "list").out
    assert str(job) in row and "queued" not in row
    guest.run(f"touch {flag}", timeout=30, check=True)
    assert exit_of(wait_finished(guest, USER, job)) == "5"

"""The guest is what the product needs, and the product runs in it.

The first three tests check the guest itself (they hold whatever state the
project is in); the rest install the project's wheel and unit and use it
as a user would.
"""

import re
import shlex
import time

import pytest

pytestmark = pytest.mark.system

GUEST_BIN = "/opt/bin"
JOB_DEADLINE = 180  # seconds for `echo hello` to run and be copied back


def test_systemd_is_pid1(guest):
    r = guest.run("cat /proc/1/comm; readlink /proc/1/exe", timeout=30)
    assert r.ok, r.describe()
    comm, exe = r.out.split("\n")[:2]
    assert comm == "systemd", r.describe()
    assert exe.endswith("/systemd"), r.describe()
    r = guest.run("systemctl is-system-running", timeout=60)
    assert r.out.strip() in ("running", "degraded"), r.describe()


def test_cgroup_v2_with_cpuset_and_memory(guest):
    r = guest.run("stat -f -c %T /sys/fs/cgroup", timeout=30)
    assert r.ok and r.out.strip() == "cgroup2fs", r.describe()
    # No v1 hierarchy anywhere: a pure unified mount.
    r = guest.run("grep -c ' cgroup ' /proc/mounts", timeout=30)
    assert r.out.strip() == "0", r.describe()
    r = guest.run("cat /sys/fs/cgroup/cgroup.controllers", timeout=30)
    assert r.ok, r.describe()
    controllers = r.out.split()
    for wanted in ("cpuset", "memory", "pids"):
        assert wanted in controllers, r.describe()


def test_two_numa_nodes(guest):
    r = guest.run("cat /sys/devices/system/node/online", timeout=30)
    assert r.ok and r.out.strip() == "0-1", r.describe()
    cpus = {}
    for node in (0, 1):
        r = guest.run("cat /sys/devices/system/node/node%d/cpulist" % node,
                      timeout=30)
        assert r.ok and r.out.strip(), r.describe()
        cpus[node] = _cpulist(r.out.strip())
        assert len(cpus[node]) == 2, r.describe()
        r = guest.run("grep MemTotal /sys/devices/system/node/node%d/meminfo"
                      % node, timeout=30)
        kb = int(r.out.split()[-2])
        assert 1500 * 1024 < kb <= 2048 * 1024, r.describe()
    assert not cpus[0] & cpus[1]
    r = guest.run("numactl -H", timeout=30)
    assert r.ok and "available: 2 nodes" in r.out, r.describe()


def _cpulist(text):
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def test_service_active(guest, installed):
    r = guest.run("systemctl is-active hpc-batch", timeout=60)
    assert r.out.strip() == "active", (
        "hpc-batch is %r after installing it %s (start: %s)\n%s"
        % (r.out.strip(), installed["method"],
           installed["start"].describe() if installed["start"] else None,
           guest.unit_report("hpc-batch")))
    r = guest.run("test -S /run/hpc-batch/hpc-batch.sock", timeout=30)
    assert r.ok, "no socket at /run/hpc-batch/hpc-batch.sock\n" + \
        guest.unit_report("hpc-batch")


def _wait_for(check, deadline, interval=1.0):
    """Poll ``check`` until it returns a truthy value or ``deadline``."""
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


@pytest.fixture(scope="module")
def hello_job(guest, installed, guest_users):
    """``dispatch new -- echo hello`` by alice from her home directory,
    waited for until its output file is there."""
    user = guest_users[0]
    home = guest.run("getent passwd %s | cut -d: -f6" % user,
                     timeout=30, check=True).out.strip()
    before = set(guest.run("ls -1 %s" % shlex.quote(home), user=user,
                           timeout=30, check=True).out.split())
    submit = guest.run("cd ~ && %s/dispatch new -- echo hello" % GUEST_BIN,
                       user=user, timeout=120)
    assert submit.ok, submit.describe() + "\n" + guest.unit_report("hpc-batch")

    def new_log():
        r = guest.run("ls -1 %s" % shlex.quote(home), user=user, timeout=30)
        logs = [n for n in r.out.split()
                if n not in before and re.fullmatch(r"output\.\d+\.log", n)]
        return logs[0] if logs else None

    name = _wait_for(new_log, time.monotonic() + JOB_DEADLINE)
    listing = guest.run("%s/dispatch list --finished" % GUEST_BIN,
                        user=user, timeout=60)
    assert name, ("no output.<id>.log in %s %ss after submitting\n%s\n"
                  "list --finished:\n%s\n%s"
                  % (home, JOB_DEADLINE, submit.describe(),
                     listing.describe(), guest.unit_report("hpc-batch")))
    job_id = re.fullmatch(r"output\.(\d+)\.log", name).group(1)
    return {"user": user, "home": home, "id": job_id, "log": name,
            "submit": submit}


def test_dispatch_new_writes_output_log_as_user(guest, hello_job):
    job_id, user = hello_job["id"], hello_job["user"]
    assert re.search(r"\b%s\b" % job_id, hello_job["submit"].out), (
        "dispatch new did not name job %s:\n%s"
        % (job_id, hello_job["submit"].describe()))
    path = "%s/%s" % (hello_job["home"], hello_job["log"])
    r = guest.run(["stat", "-c", "%U %s", path], timeout=30)
    assert r.ok, r.describe()
    owner = r.out.split()[0]
    assert owner == user, r.describe()
    # The copy is complete once the file has appeared; give a slow guest a
    # moment for the content all the same.
    content = _wait_for(
        lambda: "hello" in guest.run(["cat", path], user=user,
                                     timeout=30).out,
        time.monotonic() + 30)
    r = guest.run(["cat", path], user=user, timeout=30)
    assert content and r.out.strip() == "hello", r.describe()


def test_dispatch_list_finished_shows_exit_0(guest, hello_job):
    job_id, user = hello_job["id"], hello_job["user"]

    def finished_row():
        r = guest.run("%s/dispatch list --finished" % GUEST_BIN, user=user,
                      timeout=60)
        for line in r.out.splitlines():
            words = line.split()
            if user in words[:1] and job_id in words[1:2] \
                    and "finished" in words:
                return line
        return None

    row = _wait_for(finished_row, time.monotonic() + 60)
    listing = guest.run("%s/dispatch list --finished" % GUEST_BIN,
                        user=user, timeout=60)
    assert row, ("job %s not listed as finished:\n%s"
                 % (job_id, listing.describe()))
    words = row.split()
    assert words[-2:] == ["finished", "0"], row
    assert "echo hello" in row, row

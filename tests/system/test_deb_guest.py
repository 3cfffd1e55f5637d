"""The Debian package on a real systemd machine: install, a job, upgrade, remove, purge.

One scenario in steps, in order, on a guest of this module's own (the steps
take the machine apart, as test_install_guest.py's do for install.sh). Each
step fails at once (never skips) when the one it builds on failed, naming it.

0. the package refuses to install over an install hpc-batch-install made
   (its record in /etc/hpc-batch), and leaves nothing behind;
1. ``dpkg -i`` of scripts/build-deb's package: the venv made offline from
   the wheels it carries, the service enabled and active, dispatch on PATH,
   ``man dispatch``, the completion, and a job run as a user;
2. ``dpkg -i`` of a newer package (the same tree built with ``--local 1``)
   while a job runs: the daemon is reloaded, not restarted, runs the new
   version, and the job survives and ends with its exit code;
3. ``dpkg -r``: the program and its venvs are gone, the state is kept, and
   installing again brings the job history back;
4. ``dpkg -P`` with a job running and one queued: nothing of hpc-batch is
   left, no job, no shepherd, no state.

The image's ready-made venv at /opt/hpc-batch is deleted first: the package
makes its own, from nothing, and the guest has no network.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest
from boxuser import BoxUser, held, report, scenario_steps, wait_for
from harness import Guest

pytestmark = [pytest.mark.system, pytest.mark.timeout(600, func_only=True)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARE = "/mnt/host/deb-test"
PREFIX = "/opt/hpc-batch"
STATE = "/var/lib/hpc-batch"
RECORD = "/etc/hpc-batch/install.json"
USER = "dora"
LINKED = ("dispatch", "hpc-batchd", "hpc-batch-shepherd")
PACKAGED = ("/lib/systemd/system/hpc-batch.service", "/usr/share/man/man1/dispatch.1.gz",
            "/usr/share/man/man8/hpc-batchd.8.gz", "/usr/share/bash-completion/completions/dispatch",
            "/usr/share/zsh/vendor-completions/_dispatch", "/usr/share/doc/hpc-batch/copyright")
JOB_DEADLINE = 240
BUILD_TIMEOUT = 900

step = scenario_steps()


# --- fixtures -------------------------------------------------------------------


def build_deb(out, *flags):
    """scripts/build-deb's package of this tree, built into *out* with *flags*; its path."""
    proc = subprocess.run([os.path.join(ROOT, "scripts", "build-deb"), "--python", sys.executable,
                           "--out", str(out), *flags],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=BUILD_TIMEOUT)
    debs = [line for line in proc.stdout.splitlines() if line.endswith(".deb")]
    assert proc.returncode == 0 and len(debs) == 1, proc.stdout[-4000:]
    return debs[0]


def deb_version(deb):
    """The package's Debian version, as dpkg-deb reads it."""
    return subprocess.run(["dpkg-deb", "-f", deb, "Version"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """{"first": .deb, "next": the same tree as a newer version}, built by scripts/build-deb."""
    first = build_deb(tmp_path_factory.mktemp("deb-first"))
    nxt = build_deb(tmp_path_factory.mktemp("deb-next"), "--local", "1")
    assert subprocess.run(["dpkg", "--compare-versions", deb_version(nxt), "gt", deb_version(first)]).returncode == 0
    return {"first": first, "next": nxt}


@pytest.fixture(scope="module")
def box(guest_image, packages, tmp_path_factory):
    """A guest of this module's own, with a user, the packages staged and no venv."""
    g = Guest(guest_image, str(tmp_path_factory.mktemp("vm-deb")), nodes=2, cpus_per_node=2,
              mem_per_node_mb=2048, boot_timeout=600, lifetime=3600,
              log=lambda msg: sys.stderr.write("[deb vm] %s\n" % msg))
    try:
        g.start()
        staged = os.path.join(g.share_dir, "deb-test")
        os.makedirs(staged)
        g.debs, g.versions = {}, {}
        for key, deb in packages.items():
            shutil.copy(deb, staged)
            os.chmod(os.path.join(staged, os.path.basename(deb)), 0o644)
            g.debs[key] = "%s/%s" % (SHARE, os.path.basename(deb))
            g.versions[key] = deb_version(deb)
        os.chmod(staged, 0o755)
        g.run("rm -rf %s && (id -u %s >/dev/null 2>&1 || useradd -m -s /bin/bash %s)"
              % (PREFIX, USER, USER), timeout=120, check=True)
        g.jobs = {}
        yield g
    finally:
        g.close()


# --- helpers ----------------------------------------------------------------------


_user = BoxUser(USER, "/usr/bin", JOB_DEADLINE)
login, submit, listing = _user.login, _user.submit, _user.listing
wait_running, wait_exit, wait_ready = _user.wait_running, _user.wait_exit, _user.wait_ready


def dpkg_status(box):
    """``Status Version`` of the package as dpkg knows it ('' when it knows none)."""
    r = box.run("dpkg-query -W -f='${Status} ${Version}' hpc-batch", timeout=60)
    return r.out.strip() if r.ok else ""


def dpkg(box, *args):
    r = box.run(["dpkg", *args], timeout=600)
    assert r.ok, report(box, r)
    return r


def main_pid(box):
    return box.run("systemctl show -p MainPID --value hpc-batch", timeout=60).out.strip()


def exists(box, path):
    return box.run("[ -e %s ] || [ -L %s ]" % (path, path), timeout=60).ok


# --- the scenario ------------------------------------------------------------------


@step("refused")
def test_the_package_refuses_an_install_made_by_hpc_batch_install(box):
    box.run("mkdir -p /etc/hpc-batch && echo '{}' > %s" % RECORD, timeout=60, check=True)
    r = box.run(["dpkg", "-i", box.debs["first"]], timeout=600)
    assert r.rc != 0, report(box, r)
    assert "hpc-batch-install manages hpc-batch on this machine" in r.err, r.describe()
    assert "hpc-batch-install --uninstall" in r.err, r.describe()
    assert not dpkg_status(box).startswith("install ok installed"), dpkg_status(box)
    for path in (PREFIX, "/usr/bin/dispatch", PACKAGED[0]):
        assert not exists(box, path), path
    box.run("rm -rf /etc/hpc-batch", timeout=60, check=True)
    # What the failed install left in dpkg's database (a package never unpacked), forgotten.
    box.run("dpkg --purge hpc-batch >/dev/null 2>&1 || true", timeout=300)


@step("install", needs=["refused"])
def test_install_makes_the_venv_offline_starts_the_service_and_runs_a_job(box):
    assert login(box, "command -v dispatch").rc != 0
    r = dpkg(box, "-i", box.debs["first"])
    assert dpkg_status(box) == "install ok installed %s" % box.versions["first"], report(box, r)
    assert box.run("systemctl is-active hpc-batch").out.strip() == "active", report(box, r)
    assert box.run("systemctl is-enabled hpc-batch").out.strip() == "enabled", report(box, r)

    # The venv layout of hpc-batch-install (one venv per version, the prefix a link), not dpkg's files.
    target = box.run(["readlink", PREFIX], timeout=60).out.strip()
    assert re.fullmatch(r"hpc-batch\.versions/\S+", target), target
    assert box.run(["dpkg", "-S", PREFIX], timeout=60).rc != 0
    for name in LINKED:
        r = box.run(["readlink", "/usr/bin/" + name], timeout=60)
        assert r.out.strip() == "%s/bin/%s" % (PREFIX, name), r.describe()
    for path in PACKAGED:
        r = box.run(["dpkg", "-S", path], timeout=60)
        assert r.ok and r.out.startswith("hpc-batch: "), r.describe()
    unit = box.run("systemctl cat hpc-batch", timeout=60).out
    assert "ExecStart=/usr/bin/hpc-batchd --admin-group sudo" in unit.splitlines(), unit

    r = login(box, "command -v dispatch")
    assert r.ok and r.out.strip() == "/usr/bin/dispatch", r.describe()
    r = login(box, "man -P cat dispatch")
    assert r.ok and "dispatch - submit and manage hpc-batch jobs" in r.out, r.describe()

    job_id, _ = submit(box, "echo hello")
    assert wait_exit(box, job_id) == "0"
    log = box.run("cat ~/output.%s.log" % job_id, user=USER)
    assert log.out.strip() == "hello", log.describe()
    box.jobs["hello"] = job_id


@step("upgrade", needs=["install"])
def test_an_upgrade_reloads_the_daemon_and_the_running_job_survives(box):
    job_id, _ = submit(box, held("/tmp/upgraded", 7))
    wait_running(box, job_id)
    pid = main_pid(box)

    r = dpkg(box, "-i", box.debs["next"])
    assert dpkg_status(box) == "install ok installed %s" % box.versions["next"], report(box, r)
    r2 = box.run([PREFIX + "/bin/python", "-c", "import hpc_batch; print(hpc_batch.__version__)"])
    assert r2.out.strip() == box.versions["next"], r2.describe()

    wait_ready(box)
    # Reloaded, not restarted: the same process, re-executed from the new venv.
    assert main_pid(box) == pid, report(box, r)
    new_venv = box.run(["realpath", PREFIX], timeout=60).out.strip()

    def runs_new():
        return new_venv + "/" in box.run("tr '\\0' ' ' </proc/%s/cmdline" % pid, timeout=60).out
    assert wait_for(runs_new, 120, interval=2), report(box, r)
    assert job_id in listing(box, finished=False), "the job did not outlive the upgrade:\n" + report(box, r)
    box.run(["touch", "/tmp/upgraded"], check=True)
    assert wait_exit(box, job_id) == "7"


@step("remove", needs=["install"])
def test_remove_keeps_the_state_and_installing_again_brings_the_history_back(box):
    r = dpkg(box, "-r", "hpc-batch")
    assert box.run("systemctl is-active hpc-batch").out.strip() != "active", report(box, r)
    for path in (PREFIX, PREFIX + ".versions", *("/usr/bin/" + n for n in LINKED), *PACKAGED):
        assert not exists(box, path), "left after dpkg -r: %s\n%s" % (path, r.describe())
    assert box.run(["test", "-d", STATE + "/jobs"]).ok, r.describe()
    assert login(box, "command -v dispatch").rc != 0

    r = dpkg(box, "-i", box.debs["next"])
    wait_ready(box)
    assert box.jobs["hello"] in listing(box), "history lost:\n" + report(box, r)


@step("purge", needs=["install"])
def test_purge_leaves_nothing(box):
    if not dpkg_status(box).startswith("install ok installed"):
        dpkg(box, "-i", box.debs["next"])
        wait_ready(box)
    running, _ = submit(box, "sleep 600", flags="--exclusive")
    wait_running(box, running)
    submit(box, "echo never")
    r = box.run(["pgrep", "-a", "-f", "hpc-batch-shepher[d]"], timeout=60)
    assert r.ok, "no shepherd visible for a running job:\n" + r.describe()

    r = dpkg(box, "-P", "hpc-batch")
    assert dpkg_status(box) in ("", "unknown ok not-installed "), dpkg_status(box)
    paths = [PREFIX, PREFIX + ".versions", STATE, "/run/hpc-batch", "/dev/hpc-batch", "/sys/fs/cgroup/hpc-batch",
             "/etc/systemd/system/hpc-batch.service", "/etc/systemd/system/multi-user.target.wants/hpc-batch.service",
             *("/usr/bin/" + n for n in LINKED), *PACKAGED]
    left = [p for p in paths if exists(box, p)]
    assert not left, "left after dpkg -P: %s\n%s" % (left, r.describe())
    assert box.run("systemctl show -p LoadState --value hpc-batch").out.strip() == "not-found"
    for argv in (["pgrep", "-a", "-f", "hpc-batch-shepher[d]"], ["pgrep", "-a", "-u", USER, "-x", "sleep"]):
        r2 = box.run(argv, timeout=60)
        assert r2.rc == 1 and r2.out.strip() == "", "still running:\n" + r2.describe()
    assert login(box, "command -v dispatch").rc != 0

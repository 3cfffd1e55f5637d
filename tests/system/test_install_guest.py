"""Install, upgrade and remove hpc-batch on a real systemd machine.

One scenario in steps, in order, on a guest of this module's own: the steps
take the machine apart, so they must not share the session's guest (which
other modules expect installed). Each step fails at once (never skips) when
the one it builds on failed, naming it, so the first failure is the cause.

1. a fresh install with install.sh from a wheel built on the host: the
   service is active, a new login shell finds dispatch and its manual
   page (``man dispatch``, and the daemon's in section 8), a job runs;
2. hpc-batch-install and the scripts refuse a normal user;
3. an upgrade to a newer build while a job runs: the daemon is reloaded in
   place, the job survives and its exit code is reported, the recorded
   choices are kept;
4. a flag that contradicts the recorded choices is refused;
5. --uninstall keeps queued jobs and history, and installing again (from
   scratch with install.sh: a new venv) brings them back;
6. --purge leaves no unit, link, venv, state, cgroup or job behind;
7. uninstall.sh does the same when the venv is already gone.

The guest is offline: wheels (the project's, a version-bumped build, and
the dependencies for a venv created from scratch) go through the 9p share.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from boxuser import BoxUser, held, report, scenario_steps
from harness import Guest

pytestmark = [pytest.mark.system, pytest.mark.timeout(600, func_only=True)]

PREFIX = "/opt/hpc-batch"
BIN = "/opt/bin"
SHARE = "/mnt/host/install-test"
RECORD = "/etc/hpc-batch/install.json"
UNIT = "/etc/systemd/system/hpc-batch.service"
PROFILE = "/etc/profile.d/hpc-batch.sh"
STATE = "/var/lib/hpc-batch"
ENTRY_POINTS = ("dispatch", "hpc-batchd", "hpc-batch-install", "hpc-batch-shepherd")
MAN_PAGES = ("/usr/local/share/man/man1/dispatch.1", "/usr/local/share/man/man8/hpc-batchd.8",
             "/usr/local/share/man/man8/hpc-batch-install.8", "/usr/local/share/man/man8/hpc-batch-shepherd.8")
USER = "carol"
DEPENDENCIES = ("docopt-ng",)
JOB_DEADLINE = 240

step = scenario_steps()


# --- fixtures -------------------------------------------------------------------


def _wheel_version(path):
    return os.path.basename(path).split("-")[1]


@pytest.fixture(scope="module")
def next_wheel(project_wheel, request, tmp_path_factory):
    """A wheel of the same tree with a higher version, as a release would be."""
    root = str(request.config.rootpath)
    src = tmp_path_factory.mktemp("next-src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if os.path.exists(os.path.join(root, name)):
            shutil.copy(os.path.join(root, name), src / name)
    for name in ("hpc_batch", "shepherd", "dist"):   # dist/: the unit and the PSI/J descriptor
        shutil.copytree(os.path.join(root, name), src / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    init = src / "hpc_batch" / "__init__.py"
    text = init.read_text()
    old = re.search(r'__version__ = "([^"]+)"', text).group(1)
    post = re.search(r"\.post(\d+)$", old)
    new = (old[:post.start()] + ".post%d" % (int(post.group(1)) + 1)
           if post else old + ".post1")
    init.write_text(text.replace('"%s"' % old, '"%s"' % new))
    out = tmp_path_factory.mktemp("next-wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "--disable-pip-version-check", "-w", str(out), str(src)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    wheels = glob.glob(str(out / "hpc_batch-*.whl"))
    assert proc.returncode == 0 and len(wheels) == 1, proc.stdout[-4000:]
    assert _wheel_version(wheels[0]) == new
    return wheels[0]


def _platforms(glibc):
    major, minor = (int(x) for x in glibc.split(".")[:2])
    tags = ["manylinux_%d_%d_x86_64" % (major, m) for m in range(minor, 4, -1)]
    return tags + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


@pytest.fixture(scope="module")
def box(guest_image, project_wheel, next_wheel, tmp_path_factory):
    """A guest of this module's own, with a user and the files staged."""
    workdir = tmp_path_factory.mktemp("vm-install")
    g = Guest(guest_image, str(workdir), nodes=2, cpus_per_node=2,
              mem_per_node_mb=2048, boot_timeout=600, lifetime=3600,
              log=lambda msg: sys.stderr.write("[install vm] %s\n" % msg))
    try:
        g.start()
        staged = os.path.join(g.share_dir, "install-test")
        os.makedirs(os.path.join(staged, "wheelhouse"))
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        for name in ("install.sh", "uninstall.sh"):
            shutil.copy(os.path.join(root, name), staged)
        for wheel in (project_wheel, next_wheel):
            shutil.copy(wheel, staged)
        # Dependencies for a venv made from scratch, for the guest's Python.
        pyver, glibc = g.run(
            "python3 -c 'import platform, sys; print(\"%d.%d\" % sys.version_info[:2]);"
            " print(platform.libc_ver()[1])'", timeout=60, check=True).out.split()
        argv = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
                "--disable-pip-version-check", "--python-version", pyver,
                "--implementation", "cp", "--abi", "cp" + pyver.replace(".", ""),
                "-d", os.path.join(staged, "wheelhouse")]
        for tag in _platforms(glibc):
            argv += ["--platform", tag]
        subprocess.run(argv + list(DEPENDENCIES), check=True, timeout=600)
        for path, _dirs, files in os.walk(staged):
            os.chmod(path, 0o755)
            for f in files:
                os.chmod(os.path.join(path, f), 0o644)
        g.run(f"id -u {USER} >/dev/null 2>&1 || useradd -m -s /bin/bash {USER}",
              timeout=60, check=True)
        g.wheels = {"first": "%s/%s" % (SHARE, os.path.basename(project_wheel)),
                    "next": "%s/%s" % (SHARE, os.path.basename(next_wheel))}
        g.versions = {"first": _wheel_version(project_wheel),
                      "next": _wheel_version(next_wheel)}
        g.pip_env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": SHARE + "/wheelhouse",
                     "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        g.jobs = {}
        yield g
    finally:
        g.close()


# --- helpers ----------------------------------------------------------------------


def as_root(box, cmd, timeout=120, env=None):
    return box.run(cmd, timeout=timeout, env=env)


_user = BoxUser(USER, BIN, JOB_DEADLINE)
login, submit, listing = _user.login, _user.submit, _user.listing
wait_running, wait_exit, wait_ready = _user.wait_running, _user.wait_exit, _user.wait_ready


def read_record(box):
    r = box.run(["cat", RECORD], timeout=30)
    assert r.ok, r.describe()
    return json.loads(r.out)


def admin_group(box):
    for name in ("wheel", "sudo", "adm"):
        if box.run(["getent", "group", name], timeout=30).ok:
            return name
    raise AssertionError("the guest has none of wheel, sudo, adm")


def assert_gone(box):
    """Nothing of hpc-batch is left: unit, links, venv, state, cgroups, jobs."""
    paths = [UNIT, PROFILE, RECORD, PREFIX, STATE, "/dev/hpc-batch", "/run/hpc-batch",
             "/sys/fs/cgroup/hpc-batch", "/etc/systemd/system/multi-user.target.wants/"
             "hpc-batch.service", *MAN_PAGES] + ["%s/%s" % (BIN, n) for n in ENTRY_POINTS]
    left = box.run("for p in %s; do if [ -e \"$p\" ] || [ -L \"$p\" ]; then echo \"$p\"; fi; "
                   "done" % " ".join(paths), timeout=60)
    assert left.ok and left.out.strip() == "", "left behind:\n" + left.out
    r = box.run("systemctl show -p LoadState --value hpc-batch", timeout=60)
    assert r.out.strip() == "not-found", r.describe()
    # No shepherd (the [d] keeps pgrep's own argv from matching), no job.
    for argv in (["pgrep", "-a", "-f", "hpc-batch-shepher[d]"],
                 ["pgrep", "-a", "-u", USER, "-x", "sleep"]):
        r = box.run(argv, timeout=60)
        assert r.rc == 1 and r.out.strip() == "", "still running:\n" + r.describe()
    r = login(box, "command -v dispatch")
    assert r.rc != 0, r.describe()


# --- the scenario ------------------------------------------------------------------


@step("install")
def test_fresh_install_with_install_sh(box):
    r = login(box, "command -v dispatch")
    assert r.rc != 0, "dispatch on PATH before installing?\n" + r.describe()

    r = as_root(box, ["sh", SHARE + "/install.sh", box.wheels["first"]], timeout=600,
                env=box.pip_env)
    assert r.ok, report(box, r)
    assert box.run("systemctl is-active hpc-batch").out.strip() == "active", report(box, r)
    assert box.run("systemctl is-enabled hpc-batch").out.strip() == "enabled"

    group = admin_group(box)
    unit = box.run(["cat", UNIT], check=True).out
    assert "ExecStart=%s/hpc-batchd --admin-group %s" % (BIN, group) in unit.splitlines()
    for name in ENTRY_POINTS:
        r = box.run(["readlink", "%s/%s" % (BIN, name)])
        assert r.out.strip() == "%s/bin/%s" % (PREFIX, name), r.describe()
    record = read_record(box)
    assert {k: record[k] for k in ("prefix", "bin_dir", "admin_group", "spec", "version")} == {
        "prefix": PREFIX, "bin_dir": BIN, "admin_group": group,
        "spec": box.wheels["first"], "version": box.versions["first"]}

    # A new login shell has dispatch on PATH, once, nested or not.
    r = login(box, "command -v dispatch")
    assert r.ok and r.out.strip() == BIN + "/dispatch", r.describe()
    r = login(box, "bash -lc 'echo $PATH'")
    assert r.ok and r.out.strip().split(":").count(BIN) == 1, r.describe()

    # man finds the pages by name and section, as a user types it (man-db, no mandb run).
    r = login(box, "man -P cat dispatch")
    assert r.ok and "dispatch - submit and manage hpc-batch jobs" in r.out, r.describe()
    assert "EXIT STATUS" in r.out and "--after-ok JOBS" in r.out, r.describe()
    for page in MAN_PAGES:
        name, section = os.path.basename(page).rsplit(".", 1)
        # Debian's manpath may name /usr/local/share/man by its link /usr/local/man.
        r = login(box, 'readlink -e "$(man -w %s %s)"' % (section, name))
        assert r.ok and r.out.strip() == page, r.describe()

    job_id, _ = submit(box, "echo hello")
    assert wait_exit(box, job_id) == "0"
    log = box.run("cat ~/output.%s.log" % job_id, user=USER)
    assert log.out.strip() == "hello", log.describe()
    box.jobs["hello"] = job_id


@step("refused", needs=["install"])
def test_non_root_is_refused(box):
    r = box.run([BIN + "/hpc-batch-install"], user=USER, timeout=120)
    assert r.rc == 77, r.describe()
    assert r.err.strip() == "hpc-batch-install: must be run as root (try: sudo hpc-batch-install)"
    r = box.run([BIN + "/hpc-batch-install", "--help"], user=USER, timeout=120)
    assert r.ok and "--purge" in r.out, r.describe()
    for script in ("install.sh", "uninstall.sh"):
        r = box.run(["sh", "%s/%s" % (SHARE, script)], user=USER, timeout=60)
        assert r.rc == 1 and "must be run as root" in r.err, r.describe()
    # Nothing changed.
    assert read_record(box)["version"] == box.versions["first"]


@step("upgrade", needs=["install"])
def test_upgrade_while_a_job_runs(box):
    before = read_record(box)
    job_id, _ = submit(box, held("/tmp/upgraded", 7))
    wait_running(box, job_id)
    pid = box.run("systemctl show -p MainPID --value hpc-batch").out.strip()

    r = as_root(box, [BIN + "/hpc-batch-install", "--spec", box.wheels["next"]],
                timeout=600, env=box.pip_env)
    assert r.ok, report(box, r)
    assert "reloading" in r.out, r.describe()

    record = read_record(box)
    for key in ("prefix", "bin_dir", "admin_group"):
        assert record[key] == before[key], (key, record, before)
    assert record["spec"] == box.wheels["next"]
    assert record["version"] == box.versions["next"]
    r = box.run([PREFIX + "/bin/python", "-c", "import hpc_batch; print(hpc_batch.__version__)"])
    assert r.out.strip() == box.versions["next"], r.describe()

    wait_ready(box)
    # Reloaded, not restarted: the same process re-executed itself.
    assert box.run("systemctl show -p MainPID --value hpc-batch").out.strip() == pid
    assert job_id in listing(box, finished=False), (
        "the job did not outlive the upgrade:\n" + report(box, r))
    box.run(["touch", "/tmp/upgraded"], check=True)
    assert wait_exit(box, job_id) == "7"


@step("conflict", needs=["install"])
def test_a_contradicting_choice_is_refused(box):
    unit = box.run(["md5sum", UNIT], check=True).out
    r = as_root(box, [BIN + "/hpc-batch-install", "--no-pip", "--bin-dir", "/usr/local/bin"])
    assert r.rc == 1, r.describe()
    assert "--bin-dir /usr/local/bin differs from %s" % BIN in r.err, r.describe()
    assert "--uninstall" in r.err and "--force" in r.err, r.describe()
    assert box.run(["md5sum", UNIT], check=True).out == unit
    assert not box.run(["test", "-e", "/usr/local/bin/dispatch"]).ok
    assert read_record(box)["bin_dir"] == BIN


@step("uninstall", needs=["install"])
def test_uninstall_keeps_queued_jobs_and_history(box):
    blocker, _ = submit(box, held("/tmp/reinstalled"), flags="--exclusive")
    wait_running(box, blocker)
    queued, state = submit(box, "echo later")
    assert state == "queued", state

    r = as_root(box, [BIN + "/hpc-batch-install", "--uninstall"], timeout=300)
    assert r.ok, report(box, r)
    for path in [UNIT, PROFILE, RECORD, PREFIX] + ["%s/%s" % (BIN, n) for n in ENTRY_POINTS]:
        assert not box.run(["test", "-e", path]).ok, path
    assert box.run("systemctl is-active hpc-batch").out.strip() != "active"
    assert box.run(["test", "-d", STATE]).ok
    assert login(box, "command -v dispatch").rc != 0

    # From scratch: install.sh makes a new venv (from the wheelhouse).
    r = as_root(box, ["sh", SHARE + "/install.sh", box.wheels["next"]], timeout=600,
                env=box.pip_env)
    assert r.ok, report(box, r)
    wait_ready(box)
    # The new daemon adopted the job that ran on through the gap.
    assert blocker in listing(box, finished=False), box.unit_report("hpc-batch")
    box.run(["touch", "/tmp/reinstalled"], check=True)
    assert wait_exit(box, blocker) == "0"
    assert wait_exit(box, queued) == "0"
    log = box.run("cat ~/output.%s.log" % queued, user=USER)
    assert log.out.strip() == "later", log.describe()
    rows = listing(box)
    assert box.jobs["hello"] in rows, "history lost:\n%s" % rows


def _busy(box):
    """A running job and a queued one, and a job cgroup when cgroups are in use."""
    running, _ = submit(box, "sleep 600", flags="--exclusive")
    wait_running(box, running)
    submit(box, "echo never")
    # So that "no shepherd is left" below means something.
    r = box.run(["pgrep", "-a", "-f", "hpc-batch-shepher[d]"], timeout=60)
    assert r.ok, "no shepherd visible for a running job:\n" + r.describe()


@step("purge", needs=["install"])
def test_purge_leaves_nothing(box):
    _busy(box)
    # Kept for the next step, which needs an installed venv to start from.
    box.run("rm -rf /root/venv && cp -a %s /root/venv" % PREFIX, timeout=300, check=True)
    r = as_root(box, [BIN + "/hpc-batch-install", "--purge"], timeout=300)
    assert r.ok, report(box, r)
    assert_gone(box)


@step("uninstall.sh", needs=["purge"])
def test_uninstall_sh_when_the_venv_is_gone(box):
    # The README's two-step install, from the venv kept by the last step.
    box.run("cp -a /root/venv %s" % PREFIX, timeout=300, check=True)
    r = as_root(box, [PREFIX + "/bin/hpc-batch-install", "--no-pip"], timeout=300)
    assert r.ok, report(box, r)
    wait_ready(box)
    _busy(box)
    box.run(["rm", "-rf", PREFIX], check=True)
    r = as_root(box, ["sh", SHARE + "/uninstall.sh"], timeout=300)
    assert r.ok and "removing by hand" in r.out, report(box, r)
    assert_gone(box)

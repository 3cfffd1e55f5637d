"""Fixtures for the system tier: the real product in a Debian guest.

The host cannot show what the product is for (it has a cgroup v1/v2 hybrid,
no systemd as PID 1 and one NUMA node), so these tests boot a QEMU guest
that has all three: systemd 252 as PID 1, a pure cgroup v2 hierarchy with
cpuset and memory, and two NUMA nodes of two CPUs and 2 GiB each.

Session fixtures, in the order they happen:

``guest_image``   the cached image from tests/system/vm/build-image (built
                  on a cache miss: about two minutes, needs root)
``project_wheel`` the project's wheel, built from the pytest rootdir
``guest``         the booted guest (harness.Guest), powered off at the end
``installed``     the wheel installed offline into /opt/hpc-batch (the venv
                  the image carries with docopt-ng), the entry
                  points in /opt/bin and the systemd unit installed and
                  started, by ``hpc-batch-install --no-pip`` when that works
                  and by hand, the way an admin would, when it does not
                  (or when HPC_BATCH_SYSTEM_INSTALL=by-hand)
``guest_users``   real users (alice, bob) made with useradd
``smt_guest``     a second guest shape, with SMT: 8 CPUs as 2 sockets (one
                  NUMA node each) of 2 cores of 2 threads, an Intel CPU
                  model, the project installed and started and the same
                  users; booted only when a test asks for it, after the
                  first guest is gone (modules that use it run last)

Every test under tests/system gets the ``system`` marker, and a
``timeout`` marker with ``func_only=True`` unless it has its own: the
session fixtures above can take minutes and are bounded by the harness's
own deadlines instead (see BOOT_TIMEOUT, GUEST_LIFETIME), and the whole
tier by scripts/test.  A test that sets its own timeout should pass
``func_only=True`` too.

On a failing test the end of the guest's serial console (which carries its
journal) and ``journalctl -u hpc-batch`` are attached to the report; the
guest's work directory with serial.log and qemu.log is kept under pytest's
basetemp and named in the terminal summary.
"""

import contextlib
import glob
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "vm"))

from harness import Guest  # noqa: E402

BUILD_IMAGE = os.path.join(HERE, "vm", "build-image")
BUILD_TIMEOUT = 1200      # a cold image build takes about 2 minutes
WHEEL_TIMEOUT = 600
BOOT_TIMEOUT = 600        # 25-30 s normally; TCG on a loaded host is slow
GUEST_LIFETIME = 3600     # QEMU is killed after this whatever happens
DEFAULT_TEST_TIMEOUT = 300

GUEST_PREFIX = "/opt/hpc-batch"
GUEST_BIN = "/opt/bin"
ENTRY_POINTS = ("dispatch", "hpc-batchd", "hpc-batch-shepherd",
                "hpc-batch-install")
ADMIN_GROUP_CANDIDATES = ("wheel", "sudo", "adm")
TEST_USERS = ("alice", "bob")

# The SMT guest: two sockets, each a NUMA node of two cores of two threads.
SMT_SHAPE = {"nodes": 2, "cpus_per_node": 4, "threads_per_core": 2,
             "mem_per_node_mb": 2048, "cpu_model": "Haswell-v1"}

# Session guests by fixture name; each is powered off after the last test
# that uses it.
GUEST_FIXTURES = ("guest", "smt_guest")

_state = {"guests": {}, "workdirs": {}, "last_item": {}, "failed": False,
          "notes": []}


def _note(msg):
    line = "[system] %s" % msg
    _state["notes"].append(line)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def pytest_configure(config):
    # `timeout` (scripts/test) sends SIGTERM: turn it into an interrupt so
    # pytest still tears the guest down and prints what it has.
    def interrupted(signum, frame):
        raise KeyboardInterrupt("SIGTERM")
    try:
        signal.signal(signal.SIGTERM, interrupted)
    except ValueError:  # not the main thread
        pass


# --- markers ------------------------------------------------------------------

def _uses(item, name):
    return name in getattr(item, "fixturenames", ())


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    # Modules that use the SMT guest run after all others (in their own
    # order), so the two session guests are never up at once.
    smt_modules = {item.module for item in items
                   if getattr(item, "module", None) is not None
                   and _uses(item, "smt_guest")}
    # Modules that boot guests of their own (they use the image, not a
    # session guest) run after those, so no idle session guest shares the
    # cores with theirs.
    own_modules = {item.module for item in items
                   if getattr(item, "module", None) is not None
                   and _uses(item, "guest_image")
                   and not any(_uses(item, n) for n in GUEST_FIXTURES)}
    items.sort(key=lambda item: (getattr(item, "module", None) in own_modules,
                                 getattr(item, "module", None) in smt_modules))
    # Each session guest is powered off right after the last test that uses
    # it, not at the end of the session: modules that boot guests of their
    # own should not share two cores with an idle one.
    for name in GUEST_FIXTURES:
        users = [item for item in items if _uses(item, name)]
        _state["last_item"][name] = users[-1].nodeid if users else None
    for item in items:
        path = str(getattr(item, "path", None) or item.fspath)
        if not path.startswith(HERE + os.sep):
            continue
        item.add_marker(pytest.mark.system)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TEST_TIMEOUT,
                                                func_only=True))


# --- image, wheel, guest ---------------------------------------------------------

@pytest.fixture(scope="session")
def guest_image(tmp_path_factory):
    """Directory of the cached guest image (built here on a cache miss)."""
    logpath = tmp_path_factory.getbasetemp() / "build-image.log"
    started = time.monotonic()
    with open(logpath, "wb") as log:
        try:
            proc = subprocess.run([sys.executable, BUILD_IMAGE],
                                  stdout=subprocess.PIPE, stderr=log,
                                  timeout=BUILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail("build-image ran past %ss; log: %s\n%s"
                        % (BUILD_TIMEOUT, logpath, _tail(logpath)))
    if proc.returncode != 0:
        pytest.fail("build-image failed (rc=%d); log: %s\n%s"
                    % (proc.returncode, logpath, _tail(logpath)))
    image_dir = proc.stdout.decode().strip().splitlines()[-1]
    _note("guest image %s (%.0fs)" % (image_dir, time.monotonic() - started))
    return image_dir


@pytest.fixture(scope="session")
def project_wheel(request, tmp_path_factory):
    """The project's wheel, built from the pytest rootdir."""
    rootdir = str(request.config.rootpath)
    out = tmp_path_factory.mktemp("wheel")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps",
         "--disable-pip-version-check", "-q", "-w", str(out), rootdir],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=WHEEL_TIMEOUT)
    wheels = sorted(glob.glob(str(out / "hpc_batch-*.whl")))
    if proc.returncode != 0 or len(wheels) != 1:
        pytest.fail("could not build the project wheel from %s (rc=%d, "
                    "wheels=%s):\n%s" % (rootdir, proc.returncode, wheels,
                                         proc.stdout[-4000:]))
    _note("project wheel %s (%.0fs)" % (os.path.basename(wheels[0]),
                                        time.monotonic() - started))
    return wheels[0]


@contextlib.contextmanager
def _boot(name, guest_image, workdir, **shape):
    """A session guest, booted and known to the report hooks as ``name``;
    powered off (and QEMU killed) when the block ends, however it ends."""
    _state["workdirs"][name] = str(workdir)
    g = Guest(guest_image, str(workdir), boot_timeout=BOOT_TIMEOUT,
              lifetime=GUEST_LIFETIME, log=_note, **shape)
    _state["guests"][name] = g
    try:
        g.start()
        # A soft lockup then prints every CPU's stack, not only the stuck
        # one's; and warnings reach the serial log too (the image boots with
        # `quiet`, which keeps only errors there), since a lockup's stack is
        # printed at warning level and a wedged guest may not answer dmesg.
        g.run("sysctl -qw kernel.softlockup_all_cpu_backtrace=1 "
              "kernel.printk='5 4 1 7'", timeout=60)
        yield g
    finally:
        g.close()   # it stays in _state: its serial log is still of use


@pytest.fixture(scope="session")
def guest(guest_image, tmp_path_factory):
    """The booted guest; powered off (and QEMU killed) at the end."""
    with _boot("guest", guest_image, tmp_path_factory.mktemp("vm"),
               nodes=2, cpus_per_node=2, mem_per_node_mb=2048) as g:
        yield g


@pytest.fixture(scope="session")
def smt_guest(guest_image, project_wheel, request, tmp_path_factory):
    """The SMT guest (SMT_SHAPE), booted, with the project installed, its
    service active and the test users made; powered off at the end.

    Tests set the daemon's flags with guestlib.start_daemon.  The project is
    installed by hand, the quicker way under TCG: the installer is tested on
    the first guest."""
    with _boot("smt_guest", guest_image, tmp_path_factory.mktemp("vm-smt"),
               **SMT_SHAPE) as g:
        done = install_project(g, project_wheel, str(request.config.rootpath),
                               by_hand=True)
        if g.run("systemctl is-active hpc-batch", timeout=60).out.strip() \
                != "active":
            pytest.fail("hpc-batch is not active in the SMT guest after "
                        "installing it %s\n%s"
                        % (done["method"], g.unit_report("hpc-batch")))
        make_users(g)
        yield g


def _admin_group(guest):
    for name in ADMIN_GROUP_CANDIDATES:
        if guest.run(["getent", "group", name], timeout=30).rc == 0:
            return name
    pytest.fail("the guest has none of the groups %s"
                % (ADMIN_GROUP_CANDIDATES,))


def _install_by_hand(guest, rootdir, admin_group):
    """Links, PATH snippet and unit, the way an admin would do it."""
    for name in ENTRY_POINTS:
        target = "%s/bin/%s" % (GUEST_PREFIX, name)
        guest.run(f"test ! -e {target} || ln -sfn {target} {GUEST_BIN}/{name}", timeout=30, check=True)
    guest.put_bytes('case ":$PATH:" in *":%s:"*) ;; *) PATH="$PATH:%s" ;; '
                    'esac\n' % (GUEST_BIN, GUEST_BIN),
                    "/etc/profile.d/hpc-batch.sh", mode=0o644)
    with open(os.path.join(rootdir, "dist", "systemd",
                           "hpc-batch.service")) as f:
        unit = f.read()
    unit = unit.replace("@BIN_DIR@", GUEST_BIN)
    unit = unit.replace("@ADMIN_GROUP@", admin_group)
    unit = unit.replace("@PREFIX@", GUEST_PREFIX)
    left = re.findall(r"@[A-Z_]+@", unit)
    if left:
        pytest.fail("dist/systemd/hpc-batch.service has placeholders this "
                    "test does not know: %s" % sorted(set(left)))
    guest.put_bytes(unit, "/etc/systemd/system/hpc-batch.service",
                    mode=0o644)
    return guest.run("systemctl daemon-reload && systemctl enable hpc-batch "
                     "&& systemctl start hpc-batch", timeout=300)


@pytest.fixture(scope="session")
def installed(guest, project_wheel, request):
    """The project installed in the guest and its service started.

    Returns a dict: ``method`` ("hpc-batch-install" or "by hand"),
    ``admin_group``, ``wheel`` and ``start`` (the Result of starting it).
    The fixture does not fail when the service does not come up: that is
    what test_service_active reports, with the journal.
    """
    return install_project(guest, project_wheel,
                           str(request.config.rootpath))


def install_project(guest, project_wheel, rootdir, by_hand=False):
    """Install the wheel into a booted guest and start the service (see
    ``installed``, which returns what this does); ``by_hand`` skips the
    installer."""
    for rel in ("hpc_batch/daemon/main.py", "hpc_batch/client/cli.py"):
        if not os.path.isfile(os.path.join(rootdir, rel)):
            pytest.fail("%s is missing: nothing to install in the guest" % rel)

    name = os.path.basename(project_wheel)
    # Straight into the share: the guest installs from /mnt/host.
    staged = os.path.join(guest.share_dir, name)
    with open(project_wheel, "rb") as src, open(staged, "wb") as dst:
        dst.write(src.read())
    started = time.monotonic()
    guest.run("%s/bin/pip install --no-index --no-deps --no-cache-dir "
              "--disable-pip-version-check %s"
              % (GUEST_PREFIX, shlex.quote("/mnt/host/" + name)),
              timeout=600, check=True)
    os.unlink(staged)
    guest.run("mkdir -p %s && chmod 755 %s" % (GUEST_BIN, GUEST_BIN),
              timeout=30, check=True)
    admin_group = _admin_group(guest)

    method = None
    installer = "%s/bin/hpc-batch-install" % GUEST_PREFIX
    start = None
    # HPC_BATCH_SYSTEM_INSTALL=by-hand skips the installer (to check the
    # manual path, or to get past a broken installer).
    by_hand = by_hand or os.environ.get("HPC_BATCH_SYSTEM_INSTALL") == "by-hand"
    if not by_hand and guest.run(["test", "-x", installer], timeout=30).rc == 0:
        start = guest.run([installer, "--no-pip", "--admin-group",
                           admin_group], timeout=600,
                          env={"PIP_NO_INDEX": "1"})
        if start.ok and guest.run("systemctl is-active hpc-batch",
                                  timeout=60).ok:
            method = "hpc-batch-install"
        else:
            _note("hpc-batch-install did not work, installing by hand:\n"
                  + start.describe())
    if method is None:
        start = _install_by_hand(guest, rootdir, admin_group)
        method = "by hand"
    _note("installed %s in the guest (%s, admin group %s) in %.0fs"
          % (name, method, admin_group, time.monotonic() - started))
    return {"method": method, "admin_group": admin_group, "wheel": name,
            "start": start}


@pytest.fixture(scope="session")
def guest_users(guest):
    """Real, unprivileged users in the guest, with home directories."""
    return make_users(guest)


def make_users(guest):
    """Make TEST_USERS in ``guest`` (those missing); returns their names."""
    for user in TEST_USERS:
        guest.run(f"id -u {user} >/dev/null 2>&1 || useradd -m -s /bin/bash {user}"
                  , timeout=60, check=True)
    return TEST_USERS


# --- failure reports ---------------------------------------------------------------

# What the guest kernel says when a CPU or a task stops making progress.
KERNEL_STALLS = ("soft lockup", "hard LOCKUP", "self-detected stall",
                 "rcu: INFO", "blocked for more than")


def kernel_stalls(guest, context=80):
    """The guest kernel's lockup and stall reports so far, each with the
    ``context`` dmesg lines that follow it (its stack traces); '' if none.
    Never raises: it is also called for failure reports."""
    try:
        r = guest.run("dmesg", timeout=60)
    except Exception as exc:
        return "(could not read the guest's dmesg: %s)" % exc
    lines = r.out.splitlines()
    hits = [i for i, line in enumerate(lines)
            if any(s in line for s in KERNEL_STALLS)]
    return "\n".join("\n".join(lines[i:i + context]) for i in hits)


def _tail(path, lines=60):
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().splitlines()[-lines:])
    except OSError:
        return ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    for name, g in list(_state["guests"].items()):
        if item.nodeid == _state["last_item"].get(name):
            g.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    path = str(getattr(item, "path", None) or item.fspath)
    if not path.startswith(HERE + os.sep):
        return
    _state["failed"] = True
    for name, g in list(_state["guests"].items()):
        if not _uses(item, name):
            continue
        report.sections.append(("%s serial log (%s)" % (name, g.serial_log),
                                g.serial_tail(100)))
        if g.alive():
            stalls = kernel_stalls(g)
            if stalls:
                report.sections.append(("%s kernel lockups and stalls (dmesg)"
                                        % name, stalls))
        # The SMT guest is always installed; the first only with `installed`.
        if g.alive() and (name != "guest" or _uses(item, "installed")):
            report.sections.append(("hpc-batch service in %s" % name,
                                    g.unit_report("hpc-batch")))


def pytest_terminal_summary(terminalreporter):
    if not _state["notes"] and not _state["workdirs"]:
        return
    terminalreporter.section("system tier")
    for line in _state["notes"]:
        terminalreporter.write_line(line)
    for name, workdir in _state["workdirs"].items():
        terminalreporter.write_line(
            "%s work dir (serial.log, qemu.log): %s" % (name, workdir))
        if _state["failed"]:
            terminalreporter.write_line("--- end of the %s serial log ---"
                                        % name)
            terminalreporter.write_line(_tail(os.path.join(
                workdir, "serial.log"), 60))

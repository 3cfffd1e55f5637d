"""An in-place upgrade under a working daemon: jobs survive, the reloaded daemon runs the new code.

An upgrade in two halves, as a ``pip install`` by hand into the venv does it
(``hpc-batch-install`` no longer does: it installs each version into a venv
of its own and switches to it, hpc_batch/install/versions.py): pip replaces the package's files
under the running daemon, then the new version's installer (``--no-pip``)
reloads it. Between the two, the old daemon keeps working on the new files:
here it collects a job and starts the next one from its queue, which must
load nothing from the new version (tests/unit/test_startup_imports.py checks
the imports; this checks the whole path). Then the reload: the same process
re-executes itself as the new version, re-adopts the running job, keeps the
queued one, and both end with their own exit codes.

The new version is this tree with a higher version number, built as its own
wheel. The guest is left on it (this module runs last on the session guest).
"""

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from guestlib import (
    GUEST_BIN,
    dispatch,
    exit_of,
    main_pid,
    read,
    ready_count,
    rows,
    submit,
    wait_finished,
    wait_for,
    wait_running,
)

pytestmark = [pytest.mark.system, pytest.mark.timeout(900, func_only=True)]
USER = "bob"
PREFIX = "/opt/hpc-batch"


def build_next_wheel(root, src, out):
    """(path, version) of a wheel of the checkout at *root* whose version is one local label higher,
    built from a copy in *src* into *out* (both empty directories, pathlib paths)."""
    listed = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True, timeout=120).stdout.decode().split("\0")
    for rel in filter(None, listed):
        if os.path.isfile(os.path.join(root, rel)):
            os.makedirs(os.path.dirname(src / rel), exist_ok=True)
            shutil.copy2(os.path.join(root, rel), src / rel)    # with its mode: dispatch is a script
    init = src / "hpc_batch" / "__init__.py"
    text = init.read_text()
    old = re.search(r'__version__ = "([^"+]+)"', text).group(1)
    new = old + "+upgraded"
    init.write_text(text.replace(f'"{old}"', f'"{new}"'))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--disable-pip-version-check",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=600)
    wheels = glob.glob(str(out / "hpc_batch-*.whl"))
    assert proc.returncode == 0 and len(wheels) == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    return wheels[0], new


@pytest.fixture(scope="module")
def next_wheel(request, tmp_path_factory):
    """(path, version) of a wheel of this tree whose version is one local label higher."""
    return build_next_wheel(str(request.config.rootpath), tmp_path_factory.mktemp("next-src"),
                            tmp_path_factory.mktemp("next-wheel"))


def held(flag, code):
    """A job that runs until *flag* exists, then exits *code*."""
    return ("sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.2; done; exit {code}")


def last_ready(guest) -> str:
    """The daemon's last 'ready' line: the version it runs is in it."""
    out = guest.run("journalctl -u hpc-batch -o cat --no-pager | grep ' ready on ' | tail -1", timeout=60).out
    return out.strip()


def test_upgrade_under_running_and_queued_jobs(guest, installed, guest_users, next_wheel):
    wheel, version = next_wheel
    flags = {name: f"/tmp/hpcb-upgrade-{name}" for name in ("first", "second")}
    guest.run("rm -f " + " ".join(flags.values()), timeout=30, check=True)
    assert version not in last_ready(guest)

    # The machine is the first job's; the second and third wait for it, in that order.
    first = submit(guest, USER, *held(flags["first"], 5), flags=("--exclusive", "--no-output"))
    wait_running(guest, USER, first)
    second = submit(guest, USER, *held(flags["second"], 6), flags=("--exclusive", "--no-output"))
    third = submit(guest, USER, "sh", "-c", "exit 7", flags=("--no-output",))
    listed = rows(guest, USER)
    assert " queued " in listed[second] and " queued " in listed[third], listed
    pid = main_pid(guest)
    cursor = guest.run("journalctl -u hpc-batch -n 1 -o cat --no-pager --show-cursor | sed -n 's/^-- cursor: //p'",
                       timeout=60).out.strip()

    # First half: the new files, under the old daemon.
    name = os.path.basename(wheel)
    with open(wheel, "rb") as f:
        guest.put_bytes(f.read(), f"/root/{name}", mode=0o644)
    # As the installer's pip step does it: umask 022 (whatever root's is), pip install --upgrade.
    r = guest.run(f"umask 022 && {PREFIX}/bin/pip install --no-index --no-deps --disable-pip-version-check "
                  f"--upgrade {shlex.quote('/root/' + name)}", timeout=600)
    assert r.ok, r.describe()
    assert guest.run(f"{GUEST_BIN}/hpc-batchd --version", timeout=60).out.strip() == f"hpc-batchd {version}"

    # The old daemon keeps going meanwhile: it collects the first job and starts the second.
    guest.run(f"touch {flags['first']}", timeout=30, check=True)
    assert exit_of(wait_finished(guest, USER, first)) == "5"
    wait_running(guest, USER, second)
    running = read(guest, f"/var/lib/hpc-batch/jobs/{second}/status.json")
    assert " queued " in rows(guest, USER)[third]
    assert main_pid(guest) == pid and version not in last_ready(guest)

    # Second half: the new installer reloads the daemon (by hand where the fixture installed by hand).
    before = ready_count(guest)
    if installed["method"] == "hpc-batch-install":
        r = guest.run([f"{PREFIX}/bin/hpc-batch-install", "--no-pip"], timeout=600, env={"PIP_NO_INDEX": "1"})
    else:
        r = guest.run("systemctl daemon-reload && systemctl reload hpc-batch", timeout=300)
    assert r.ok, r.describe() + "\n" + guest.unit_report("hpc-batch")
    wait_for(lambda: ready_count(guest) > before, 180, what="hpc-batch to be ready after the upgrade's reload")

    # The same process (a reload, not a restart), now the new version, with the jobs it had.
    assert main_pid(guest) == pid
    assert f"hpc-batchd {version} ready on" in last_ready(guest), last_ready(guest)
    assert read(guest, f"/var/lib/hpc-batch/jobs/{second}/status.json") == running
    listed = rows(guest, USER)
    assert " queued " not in listed[second] and " queued " in listed[third], listed
    since = guest.run(f"journalctl -u hpc-batch -o cat --no-pager --after-cursor={shlex.quote(cursor)}",
                      timeout=60).out
    assert not [w for w in ("Traceback", "ImportError", "ModuleNotFoundError") if w in since], since[-4000:]

    guest.run(f"touch {flags['second']}", timeout=30, check=True)
    assert exit_of(wait_finished(guest, USER, second)) == "6"
    assert exit_of(wait_finished(guest, USER, third)) == "7"
    r = dispatch(guest, USER, "wait", str(third))
    assert r.rc == 7, r.describe()

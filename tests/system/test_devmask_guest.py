"""GPU device masking (hpc_batch.daemon.devmask) in the guest: a real cgroup v2 device program.

The guest has no GPU, so the tests make character nodes with NVIDIA's major
themselves: 195:0 and 195:1 as /dev/nvidia0 and /dev/nvidia1, and 195:255 as
/dev/nvidiactl (in a private directory under /dev instead when any of those
names already exists, so nothing real is touched). Major 195 has no driver in
the guest, so opening a node fails either way, but at different points: a
node the mask denies fails with EPERM (the device program runs first, in
inode_permission), a node it allows gets past it and fails with ENXIO (no
driver behind the number). /dev/null must keep working in every mask.

Each check runs a small helper with the installed venv's python as root: it
applies a mask to a fresh cgroup under /sys/fs/cgroup/hpcb-devmask-test,
moves itself into that cgroup (commands from the guest agent otherwise live
in the agent's service cgroup), opens the nodes and prints what happened as
JSON. The cgroups, the nodes and the helper are removed at the end.
"""

import json
import shlex

import pytest

pytestmark = pytest.mark.system

PY = "/opt/hpc-batch/bin/python"
CG_BASE = "/sys/fs/cgroup/hpcb-devmask-test"
HELPER_PATH = "/tmp/hpcb-devmask-helper.py"
NODES = {"nvidia0": 0, "nvidia1": 1, "nvidiactl": 255}

# argv[1]: JSON {"cgroup": path, "apply": bool, "minors": [...], "control": bool,
# "enter": bool, "open": {name: path}, "mknod": {name: [path, minor]}}
HELPER = r'''
import errno, json, os, stat, sys

from hpc_batch.daemon import devmask


def outcome(exc):
    return errno.errorcode.get(exc.errno, str(exc.errno))


def try_open(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return outcome(exc)
    os.close(fd)
    return "ok"


def try_null():
    try:
        fd = os.open("/dev/null", os.O_RDWR)
    except OSError as exc:
        return outcome(exc)
    try:
        written = os.write(fd, b"x")
        read = os.read(fd, 1)
    except OSError as exc:
        return outcome(exc)
    finally:
        os.close(fd)
    return "ok" if (written, read) == (1, b"") else "odd: %r %r" % (written, read)


def try_mknod(path, minor):
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(195, minor))
    except OSError as exc:
        return outcome(exc)
    os.unlink(path)
    return "ok"


req = json.loads(sys.argv[1])
out = {}
if req.get("apply"):
    devmask.apply(req["cgroup"], req["minors"], req["control"])
if req.get("enter"):
    with open(os.path.join(req["cgroup"], "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
with open("/proc/self/cgroup") as f:
    out["cgroup"] = [line.strip() for line in f if line.startswith("0::")]
out["open"] = {name: try_open(path) for name, path in req.get("open", {}).items()}
out["null"] = try_null()
out["mknod"] = {name: try_mknod(path, minor) for name, (path, minor) in req.get("mknod", {}).items()}
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def nodes(guest, installed):
    """{"nvidia0": path, ..., "scratch": a private directory under /dev}; all removed at the end."""
    # The test VM has no NVIDIA driver: an allowed node must answer ENXIO. A driver here would
    # make that premise false, so say so rather than pass or skip.
    assert not guest.run("grep -qE '^ *195 ' /proc/devices", timeout=30).ok, \
        "major 195 has a driver in this guest: allowed nodes would open, not fail with ENXIO"
    scratch = guest.run("mktemp -d /dev/hpcb-devmask.XXXXXX", timeout=30, check=True).out.strip()
    assert scratch.startswith("/dev/hpcb-devmask."), scratch
    present = [name for name in NODES if guest.run(["test", "-e", f"/dev/{name}"], timeout=30).ok]
    base = scratch if present else "/dev"      # never replace or remove a node that was there
    made = []
    try:
        for name, minor in NODES.items():
            path = f"{base}/{name}"
            guest.run(["mknod", "-m", "0666", path, "c", "195", str(minor)], timeout=30, check=True)
            made.append(path)
        guest.put_bytes(HELPER, HELPER_PATH, mode=0o644)
        guest.run(["mkdir", "-p", CG_BASE], timeout=30, check=True)
        paths = {name: f"{base}/{name}" for name in NODES}
        paths["scratch"] = scratch
        yield paths
    finally:
        # Children first; every helper has exited, so the cgroups are empty.
        guest.run(f"test ! -d {CG_BASE} || find {CG_BASE} -depth -type d -exec rmdir {{}} +", timeout=60)
        guest.run(["rm", "-f", HELPER_PATH, *made], timeout=30)
        guest.run(["rm", "-rf", scratch], timeout=30)
    assert guest.run(["test", "!", "-e", CG_BASE], timeout=30).ok, f"{CG_BASE} was left behind"


@pytest.fixture
def cgroup(guest, nodes):
    """make(relative) creates CG_BASE/relative and returns its path; removed (deepest first) afterwards."""
    made = []

    def make(rel):
        path = f"{CG_BASE}/{rel}"
        guest.run(["mkdir", path], timeout=30, check=True)
        made.append(path)
        return path

    yield make
    for path in reversed(made):
        r = guest.run(["rmdir", path], timeout=30)
        assert r.ok, r.describe()


def helper(guest, nodes, cgroup_path=None, *, apply=False, minors=(), control=False, enter=False, mknod=()):
    """Run the helper; its JSON report. ``mknod`` names minors to try mknod with, in the scratch dir."""
    req = {"cgroup": cgroup_path, "apply": apply, "minors": list(minors), "control": control, "enter": enter,
           "open": {name: nodes[name] for name in NODES},
           "mknod": {f"195:{m}": [f"{nodes['scratch']}/mknod-{m}", m] for m in mknod}}
    r = guest.run([PY, HELPER_PATH, json.dumps(req)], timeout=120)
    assert r.ok, r.describe()
    report = json.loads(r.out.strip().splitlines()[-1])
    if enter:
        assert report["cgroup"] == ["0::" + cgroup_path[len("/sys/fs/cgroup"):]], report
    return report


def test_probe_says_masking_works(guest, nodes):
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/hpc-batch"):
        if not guest.run(["test", "-d", root], timeout=30).ok:
            continue
        code = f"from hpc_batch.daemon import devmask; print(devmask.probe({root!r}))"
        r = guest.run([PY, "-c", code], timeout=120)
        assert r.ok and r.out.strip() == "None", r.describe()
        left = guest.run(f"ls {shlex.quote(root)} | grep devmask-probe || true", timeout=30).out.strip()
        assert left == "", f"probe left {left} in {root}"


def test_unmasked_nodes_reach_the_missing_driver(guest, nodes):
    # Outside any mask every node gets as far as the driver lookup: the baseline for ENXIO below.
    report = helper(guest, nodes, mknod=(0,))
    assert report["open"] == {"nvidia0": "ENXIO", "nvidia1": "ENXIO", "nvidiactl": "ENXIO"}, report
    assert report["null"] == "ok" and report["mknod"] == {"195:0": "ok"}, report


def test_given_gpu_allowed_other_gpu_masked(guest, nodes, cgroup):
    cg = cgroup("one-gpu")
    report = helper(guest, nodes, cg, apply=True, minors=[0], control=True, enter=True, mknod=(0, 1))
    assert report["open"] == {"nvidia0": "ENXIO", "nvidia1": "EPERM", "nvidiactl": "ENXIO"}, report
    assert report["null"] == "ok", report
    assert report["mknod"] == {"195:0": "ok", "195:1": "EPERM"}, report


def test_no_gpus_masks_every_nvidia_node(guest, nodes, cgroup):
    cg = cgroup("no-gpu")
    report = helper(guest, nodes, cg, apply=True, minors=[], control=False, enter=True, mknod=(0, 255))
    assert report["open"] == {"nvidia0": "EPERM", "nvidia1": "EPERM", "nvidiactl": "EPERM"}, report
    assert report["null"] == "ok", report
    assert report["mknod"] == {"195:0": "EPERM", "195:255": "EPERM"}, report


def test_mask_outlives_the_process_that_applied_it(guest, nodes, cgroup):
    # apply() closes the program's descriptor and the helper exits; the
    # attachment alone keeps the program, as it must across daemon restarts.
    cg = cgroup("outlives")
    helper(guest, nodes, cg, apply=True, minors=[1], control=True)
    report = helper(guest, nodes, cg, enter=True)
    assert report["open"] == {"nvidia0": "EPERM", "nvidia1": "ENXIO", "nvidiactl": "ENXIO"}, report
    assert report["null"] == "ok", report


def test_parent_mask_still_applies(guest, nodes, cgroup):
    # BPF_F_ALLOW_MULTI: a child's mask runs in addition to its parent's, and
    # the answer is the AND of both, so the child cannot re-allow a GPU.
    parent = cgroup("nest")
    child = cgroup("nest/inner")
    helper(guest, nodes, parent, apply=True, minors=[], control=False)
    report = helper(guest, nodes, child, apply=True, minors=[0], control=True, enter=True)
    assert report["open"] == {"nvidia0": "EPERM", "nvidia1": "EPERM", "nvidiactl": "EPERM"}, report
    assert report["null"] == "ok", report

"""Power cuts: QEMU SIGKILLed in the middle of the daemon's work, then the guest booted again.

The guest runs from a qcow2 overlay of the cached image that lives for the
whole test, opened with ``cache=writethrough``: every write the guest's
kernel sends reaches the host file before QEMU acknowledges it, and a guest
flush is a host flush, so a SIGKILL of QEMU loses exactly what a power cut
loses of a disk without a volatile cache: the guest's page cache and the
requests in flight, never what was flushed. (``cache=unsafe``, the other
tests' mode, would drop flushes and could lose what the daemon fsynced.)

Each cut lands in one of five kinds of work, in turn:

``burst``   alice and bob each submit single jobs back to back (a loop of
            ``dispatch new``); every line dispatch printed goes to the host
            at once over 9p, so an id the host read was acknowledged; the
            cut comes once a random number of them arrived.
``drain``   one ``--array`` submit of many short jobs (acknowledged when
            the host got dispatch's answer), cut after a random number ran.
``reload``  jobs running and queued, ``systemctl reload hpc-batch`` (the
            daemon re-executes itself), cut a random instant later.
``output``  a job writing a few MiB to a log (under ``--max-output-buffer``,
            so the shepherd copies its buffer at the end), cut once the
            copy has reached a random size in the guest.
``upgrade`` jobs running and queued, alice and bob submitting (paced, each
            acknowledged line at the host at once), and ``hpc-batch-install
            --spec WHEEL`` upgrading the package under the running daemon
            and reloading it: from this checkout's wheel to the same tree
            one version higher (test_upgrade_guest.build_next_wheel), or
            back, whichever is not installed. The cut lands a random
            instant (0 to 1.5 s) after a stage of the installer's output
            reached the host, each stage in turn from a random one: its
            start, the venv's copy, pip's steps (the old version's files
            removed, the new ones written), the prefix switched, the links,
            the reload, the end. The first upgrade
            also moves the install from the older layout (the prefix a venv
            itself) to the installer's versioned one.

Every job appends its id to ``~/runs`` and fsyncs it before it exits with
``id % 5``. After each reboot (the daemon must come up on its own, with no
restart) and once the queue has drained, the test checks that every
acknowledged job is listed exactly once under its name and user; that no
job ran twice (an id twice in ``runs``); that every exit code is the job's
own and belongs to a job that ran (a job that ended "error", never run, must
have no line in ``runs``; such jobs are listed with the results); that
every job that ran is known; and
that each delivered log is whole, or else its buffer is kept and named in
``list``. After an ``upgrade`` cut, also that the daemon runs one version,
whole, never a mix: the one the prefix names, either the version before the
upgrade or the one after; the venv its command line names is that one; every
file of that venv's site-packages is the one its RECORD names (a half-written
or replaced file shows), with no package source the RECORD does not list; the
venv's scripts name no other venv; and the daemon's "ready" line and
``dispatch --version`` say the version the files say.

A broken guarantee is printed when it is seen and the cuts go on; the test
fails at the end with all of them, each with the cut after which it showed.

A second test does the same for the Debian package: a guest of its own
with scripts/build-deb's package installed (``dpkg -i``), then
``$HPC_BATCH_POWERCUT_DEB_CUTS`` cuts (default 1) during ``dpkg -i`` of the
next version (the same tree built with ``--local K``), under the same load,
each after one of dpkg's stages in turn (its start, unpack, setting up, the
postinst's copy of the venv, pip, the prefix switched, the reload, its
end). After each reboot the same checks, then what an admin does after a
crash, ``dpkg --configure -a`` (or ``dpkg -i`` again where dpkg marks the
package for reinstalling, cut while unpacking), must leave the package installed at the new
version with the daemon serving.

``$HPC_BATCH_POWERCUT_CUTS`` sets the number of cuts (default 5, one of each
kind; 50 for the long run), ``$HPC_BATCH_POWERCUT_KINDS`` the kinds taken in
turn (comma-separated, default all five; ``upgrade`` alone to iterate on it)
and ``$HPC_BATCH_POWERCUT_SEED`` the random seed (printed with the results,
so a failing run can be repeated).
"""

import collections
import hashlib
import json
import os
import random
import re
import shlex
import signal
import subprocess
import time

import pytest
from guestlib import GUEST_BIN, dispatch, set_flags, wait_for
from harness import Guest
from test_deb_guest import build_deb, deb_version
from test_upgrade_guest import PREFIX, build_next_wheel

pytestmark = [pytest.mark.system, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))
CUTS = int(os.environ.get("HPC_BATCH_POWERCUT_CUTS", "5"))
SEED = int(os.environ.get("HPC_BATCH_POWERCUT_SEED") or time.time_ns() % 1_000_000)
ALL_KINDS = ("burst", "drain", "reload", "output", "upgrade")
KINDS = tuple(k for k in os.environ.get("HPC_BATCH_POWERCUT_KINDS", ",".join(ALL_KINDS)).split(",") if k)
# The lines of the installer's output (its own and pip's) an upgrade cut follows, in order; "" is its start.
UPGRADE_STAGES = ("", "copying ", "Processing ", "Attempting uninstall", "Successfully uninstalled",
                  "Successfully installed", " now names ", " linked ", "reloading the running daemon",
                  " is installed;")
# The same for a .deb upgrade: dpkg's lines, then the postinst's (versions.py's notes); "exit 0" its end.
DEB_STAGES = ("", "Preparing to unpack", "Unpacking ", "Setting up ", "copying ", "pip install --upgrade",
              " now names ")
DEB_CUTS = int(os.environ.get("HPC_BATCH_POWERCUT_DEB_CUTS", "1"))
USERS = ("alice", "bob")
CACHE = "writethrough"
FLAGS = ("--keep-finished", "1000000", "--max-output-buffer", "8M")
BOOT_TIMEOUT = 600
DRAIN_JOBS = 60
PATTERN = b"0123456789abcdef\n"
# Each job: its id into ~/runs, fsynced, before it exits with id % 5 ($1: seconds to sleep first).
JOB = ('sleep "$1"; echo "$HPC_BATCH_JOB_ID" >> "$HOME/runs" && sync "$HOME/runs"; '
       'exit $((HPC_BATCH_JOB_ID % 5))')
BURST = """#!/bin/sh
# burst CUT [PAUSE]: submit single jobs back to back; each line dispatch printed goes to the host at once
job='%s'
i=0
while :; do
    i=$((i + 1))
    name="b$1-$(id -un)-$i"
    out=$(%s/dispatch new --no-output --name "$name" -- sh -c "$job" job 0) || exit 1
    echo "$name $out" >> "/mnt/host/acks-$1"
    # Pacing, not a wait: an upgrade's submits spread over its minute or two without flooding the queue.
    [ -z "$2" ] || sleep "$2"
done
""" % (JOB, GUEST_BIN)

# Run in the guest by the venv the prefix names (argv: that venv, the daemon's pid): what that venv is,
# and whatever in it is not of one version, whole.
VENV_CHECK = r"""
import base64, csv, glob, hashlib, json, os, re, sys
real, pid = sys.argv[1], sys.argv[2]
bad, listed = [], set()
sps = glob.glob(os.path.join(real, "lib", "python3*", "site-packages"))
for sp in sps:
    for record in glob.glob(os.path.join(sp, "*.dist-info", "RECORD")):
        with open(record, newline="") as f:
            for row in csv.reader(f):
                if len(row) < 2 or row[0].startswith(".."):
                    continue   # the scripts in bin/: the installer rewrites dispatch, checked below
                path = os.path.normpath(os.path.join(sp, row[0]))
                listed.add(path)
                if not row[1]:
                    continue   # RECORD itself, and what pip compiled
                algo, _, want = row[1].partition("=")
                try:
                    with open(path, "rb") as g:
                        got = base64.urlsafe_b64encode(hashlib.new(algo, g.read()).digest()).rstrip(b"=").decode()
                except OSError as exc:
                    bad.append(f"{path}: {exc}")
                    continue
                if got != want:
                    bad.append(f"{path}: not the file its RECORD names")
    for pkg in ("hpc_batch", "shepherd"):
        for path in glob.glob(os.path.join(sp, pkg, "**", "*.py"), recursive=True):
            if os.path.normpath(path) not in listed:
                bad.append(f"{path}: no RECORD lists it")
version = dist = None
for sp in sps:
    with open(os.path.join(sp, "hpc_batch", "__init__.py")) as f:
        version = re.search(r'__version__ = "([^"]+)"', f.read()).group(1)
    for info in glob.glob(os.path.join(sp, "hpc_batch-*.dist-info")):
        dist = os.path.basename(info)[len("hpc_batch-"):-len(".dist-info")]
for script in glob.glob(os.path.join(real, "bin", "*")):
    if os.path.islink(script) or not os.path.isfile(script):
        continue
    with open(script, "rb") as f:
        for m in re.finditer(re.escape(sys.argv[3]).encode() + rb"[^\s'\x22]*", f.read()):
            named = m.group().decode()
            if named != real and not named.startswith(real + "/"):
                bad.append(f"{script} names {named}, of another venv")
with open(f"/proc/{pid}/cmdline", "rb") as f:
    argv0 = f.read().split(b"\0")[0].decode()
parent = os.path.dirname(real)
print(json.dumps({"version": version, "dist": dist, "bad": bad,
                  "daemon_venv": os.path.realpath(os.path.dirname(os.path.dirname(argv0))),
                  "venvs": sorted(os.listdir(parent)) if parent.endswith(".versions") else []}))
"""


class DiskGuest(Guest):
    """The harness's guest, booted from *overlay* (kept between boots) with flushes that reach the host."""

    def __init__(self, image_dir, workdir, overlay, **kw):
        super().__init__(image_dir, workdir, **kw)
        self.overlay = overlay

    def qemu_argv(self):
        argv = super().qemu_argv()
        at = argv.index("-drive") + 1
        assert "snapshot=on" in argv[at], argv[at]   # the harness's drive, replaced whole
        argv[at] = f"file={self.overlay},if=virtio,format=qcow2,cache={CACHE}"
        return argv

    def power_cut(self):
        """SIGKILL QEMU: the guest gets no chance to write anything more."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(60)
        self.close()


def _system_conftest(config):
    """tests/system/conftest.py as loaded by pytest (its install helpers)."""
    for plugin in config.pluginmanager.get_plugins():
        if getattr(plugin, "__file__", None) == os.path.join(HERE, "conftest.py"):
            return plugin
    raise AssertionError("tests/system/conftest.py is not loaded")


def _expected_output(size):
    return (PATTERN * (size // len(PATTERN) + 1))[:size]


class PowerCuts:
    """The guest across its reboots and what the host knows was acknowledged."""

    def __init__(self, image, tmp_path, say):
        self.image, self.tmp, self.say = image, tmp_path, say
        self.overlay = str(tmp_path / "root-overlay.qcow2")
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b",
                        os.path.join(image, "root.qcow2"), self.overlay], check=True, timeout=120)
        self.boots = 0
        self.g = None
        self.acked = {}        # job id -> (user, name): dispatch printed it and the host read it
        self.outputs = {}      # job id -> (user, log path, size)
        self.results = []      # one line per cut
        self.never_ran = {}    # job id -> why: acknowledged jobs that ended "error" without running
        self.faults = {}       # what broke -> the cut after which it was first seen
        self.wheels = {}       # version -> its wheel (host path), for the upgrade cuts
        self.version = None    # the version installed, as the last check found it
        self.upgrading = None  # (from, to) of the upgrade the last cut landed in
        self.stage = {}        # kind -> the stage its next cut follows: each in turn, from a random one
        self.debs = {}         # version -> its .deb (host path), for the deb cuts
        self.deb_order = []    # those versions, oldest first: each deb cut upgrades to the next

    def boot(self):
        workdir = self.tmp / f"boot{self.boots}"
        workdir.mkdir()
        self.boots += 1
        g = DiskGuest(self.image, str(workdir), self.overlay, nodes=2, cpus_per_node=2, mem_per_node_mb=2048,
                      boot_timeout=BOOT_TIMEOUT, lifetime=3 * 3600, log=self.say)
        try:
            g.start()
        except BaseException:
            g.close()
            raise
        self.g = g
        return g

    def cut(self):
        self.g.power_cut()
        self.g = None

    def close(self):
        if self.g is not None:
            self.g.close()

    # --- the work a cut lands in -------------------------------------------------

    def _runs(self, user):
        r = self.g.run(f"cat /home/{user}/runs 2>/dev/null || true", timeout=60, check=True)
        return [w for w in r.out.replace("\0", "").split() if w.isdigit()]

    def _start_burst(self, n, pause=""):
        """alice's and bob's burst.sh running; the host file their acknowledged submits go to."""
        acks = os.path.join(self.g.share_dir, f"acks-{n}")
        open(acks, "w").close()
        os.chmod(acks, 0o666)
        for user in USERS:
            self.g.put_bytes(BURST, f"/home/{user}/burst.sh", mode=0o755, owner=user)
        self.g.run("sync", timeout=120, check=True)
        for user in USERS:
            self.g.run(f"systemd-run --quiet --unit hpcb-burst-{n}-{user} --uid {user} "
                       f"-p WorkingDirectory=/home/{user} /home/{user}/burst.sh {n} {pause}",
                       timeout=60, check=True)
        return acks

    @staticmethod
    def _ack_lines(acks):
        with open(acks) as f:
            return [ln for ln in f.read().split("\n")[:-1]]   # whole lines only

    def _take_acks(self, acks):
        """What the burst had acknowledged when the power went: all of it must be there after."""
        lines = self._ack_lines(acks)
        for line in lines:
            m = re.match(r"(b\d+-(\w+)-\d+) job (\d+) ", line)
            assert m, f"cannot read an acknowledgement from {line!r}"
            self.acked[int(m.group(3))] = (m.group(2), m.group(1))
        return len(lines)

    def burst(self, n, rng):
        acks = self._start_burst(n)
        want = rng.randint(2, 16)
        wait_for(lambda: len(self._ack_lines(acks)) >= want, 600, interval=0.02,
                 what=f"{want} acknowledged submits")
        self.cut()
        return f"after {self._take_acks(acks)} acknowledged submits"

    def drain(self, n, rng):
        before = len(self._runs("alice"))
        r = dispatch(self.g, "alice", "new", "--array", f"1-{DRAIN_JOBS}", "--no-output", "--name", f"d{n}",
                     "--", "sh", "-c", JOB, "job", "0", timeout=300)
        m = re.match(r"jobs (\d+)-(\d+): ", r.out)
        assert r.ok and m, r.describe()
        for job in range(int(m.group(1)), int(m.group(2)) + 1):
            self.acked[job] = ("alice", f"d{n}")
        want = rng.randint(1, DRAIN_JOBS // 2)
        wait_for(lambda: len(self._runs("alice")) - before >= want, 900, interval=0.2,
                 what=f"{want} jobs of the drain to run")
        self.cut()
        return f"after {want}+ of {DRAIN_JOBS} jobs ran"

    def reload(self, n, rng):
        r = dispatch(self.g, "bob", "new", "--array", "1-8", "--no-output", "--name", f"r{n}",
                     "--", "sh", "-c", JOB, "job", "2", timeout=300)
        m = re.match(r"jobs (\d+)-(\d+): ", r.out)
        assert r.ok and m, r.describe()
        for job in range(int(m.group(1)), int(m.group(2)) + 1):
            self.acked[job] = ("bob", f"r{n}")
        def running():
            r = dispatch(self.g, "bob", "list", "--json")
            return r.ok and any(j["state"] == "running" for j in json.loads(r.out)["jobs"])
        wait_for(running, 300, what="a job running")
        delay = rng.uniform(0.0, 1.5)
        self.g.run("systemctl reload --no-block hpc-batch", timeout=60, check=True)
        # Not a wait for anything: where the cut lands, from the reload's request on.
        time.sleep(delay)
        self.cut()
        return f"{delay:.2f} s after asking for the reload"

    def output(self, n, rng):
        size = rng.randint(2 << 20, 6 << 20)
        at = rng.randint(1, size - 1)
        log = f"/home/alice/big{n}.log"
        go = os.path.join(self.g.share_dir, f"go-{n}")
        watch = (f'while [ "$(stat -c %s {log} 2>/dev/null || echo 0)" -lt {at} ]; do sleep 0.01; done; '
                 f'echo go > /mnt/host/go-{n}')
        self.g.run(f"systemd-run --quiet --unit hpcb-watch-{n} sh -c {shlex.quote(watch)}", timeout=60, check=True)
        r = dispatch(self.g, "alice", "new", "--output", log, "--name", f"o{n}", "--", "sh", "-c",
                     f"yes 0123456789abcdef | head -c {size}; " + JOB, "job", "0", timeout=300)
        m = re.match(r"job (\d+) ", r.out)
        assert r.ok and m, r.describe()
        job = int(m.group(1))
        self.acked[job] = ("alice", f"o{n}")
        self.outputs[job] = ("alice", log, size)
        wait_for(lambda: os.path.exists(go), 900, interval=0.02, what=f"the log of job {job} to reach {at} bytes")
        self.cut()
        return f"with the log of a {size}-byte output at {at}+ bytes"

    def upgrade(self, n, rng):
        to = next(v for v in self.wheels if v != self.version)
        wheel = f"/root/wheels/{os.path.basename(self.wheels[to])}"
        self._stage_file(self.wheels[to], wheel)
        run = f"PIP_NO_INDEX=1 PYTHONUNBUFFERED=1 {GUEST_BIN}/hpc-batch-install --spec {wheel}"
        return self._cut_during(n, rng, "upgrade", run, UPGRADE_STAGES, to)

    def deb_upgrade(self, n, rng):
        """``dpkg -i`` of the next package under the running daemon, cut after one of dpkg's stages."""
        to = self.deb_order[self.deb_order.index(self.version) + 1]
        deb = f"/root/debs/{os.path.basename(self.debs[to])}"
        self._stage_file(self.debs[to], deb)
        return self._cut_during(n, rng, "deb", f"dpkg -i {deb}", DEB_STAGES, to)

    def _stage_file(self, host_path, guest_path):
        g = self.g
        if g.run(["test", "-f", guest_path], timeout=30).rc != 0:
            g.run(f"mkdir -p -m 700 {os.path.dirname(guest_path)}", timeout=30, check=True)
            with open(host_path, "rb") as f:
                g.put_bytes(f.read(), guest_path, mode=0o644)
            g.run("sync", timeout=120, check=True)   # a cut must not leave half a file for the next upgrade

    def _cut_during(self, n, rng, kind, command, stages, to):
        """Jobs running and queued, alice and bob submitting, *command* upgrading to *to*; the power
        cut a random instant after one of *stages* (lines of its output) reached the host."""
        g = self.g
        r = dispatch(g, "bob", "new", "--array", "1-8", "--no-output", "--name", f"u{n}",
                     "--", "sh", "-c", JOB, "job", "3", timeout=300)
        m = re.match(r"jobs (\d+)-(\d+): ", r.out)
        assert r.ok and m, r.describe()
        for job in range(int(m.group(1)), int(m.group(2)) + 1):
            self.acked[job] = ("bob", f"u{n}")

        def running():
            r = dispatch(g, "bob", "list", "--json")
            return r.ok and any(j["state"] == "running" for j in json.loads(r.out)["jobs"])
        wait_for(running, 300, what="a job running")
        acks = self._start_burst(n, pause="0.5")
        log = os.path.join(g.share_dir, f"{kind}-{n}.log")
        # Its lines reach the host as they are printed (unbuffered, over 9p); its status last.
        run = f"{command} > /mnt/host/{kind}-{n}.log 2>&1; echo \"exit $?\" >> /mnt/host/{kind}-{n}.log"
        if kind not in self.stage:
            self.stage[kind] = rng.randrange(len(stages))
        stage, delay = stages[self.stage[kind]], rng.uniform(0.0, 1.5)
        self.stage[kind] = (self.stage[kind] + 1) % len(stages)
        started = time.monotonic()
        g.run(f"systemd-run --quiet --unit hpcb-{kind}-{n} sh -c {shlex.quote(run)}", timeout=60, check=True)

        def text():
            with open(log, errors="replace") as f:
                return f.read()

        def reached():
            out = text() if os.path.exists(log) else ""
            failed = re.search(r"^exit ([1-9]\d*)$", out, re.M)
            assert not failed, f"{command} failed:\n{out[-4000:]}"
            return stage in out or "exit 0" in out
        wait_for(reached, 900, interval=0.02, what=f"the {kind}'s output to say {stage!r}")
        at = time.monotonic() - started
        # Not a wait for anything: where the cut lands, after the stage.
        time.sleep(delay)
        last = ([ln for ln in text().splitlines() if ln.strip()] or ["(nothing yet)"])[-1]
        self.cut()
        self.upgrading = (self.version, to)
        return (f"{delay:.2f} s after {stage or 'its start'!r} ({at + delay:.1f} s into the {kind} "
                f"{self.version} -> {to}; its last line {last[:100]!r}; {self._take_acks(acks)} submits acknowledged)")

    # --- after the reboot --------------------------------------------------------------

    def fault(self, what):
        """A broken guarantee: noted (once) and reported at the end, so the later cuts still run."""
        if what not in self.faults:
            self.faults[what] = len(self.results) + 1
            self.say(f"FAULT after cut {self.faults[what]}: {what}")

    def _serving(self):
        """Whether the service is active and answers alice's list."""
        g = self.g
        return (g.run("systemctl is-active hpc-batch", timeout=60).out.strip() == "active"
                and dispatch(g, "alice", "list", timeout=60).ok)

    def check(self):
        """Everything the test knows must hold, once the daemon came up alone and drained its queue."""
        g = self.g

        wait_for(self._serving, 300, what="hpc-batch to serve after the reboot, on its own")
        restarts = g.run("systemctl show -p NRestarts --value hpc-batch", timeout=60).out.strip()
        if restarts != "0":
            self.fault(f"hpc-batch needed {restarts} restarts to come up\n{g.unit_report('hpc-batch')}")

        def jobs(*flags):
            r = dispatch(g, "root", "list", "--all", "--json", *flags, timeout=300)
            assert r.ok, r.describe()
            return json.loads(r.out)["jobs"]
        wait_for(lambda: not jobs(), 1800, interval=2, what="the queue to drain after the reboot")
        listed = jobs("--finished")
        ids = collections.Counter(j["id"] for j in listed)
        for i in (i for i, c in ids.items() if c > 1):
            self.fault(f"job {i} listed twice")
        by_id = {j["id"]: j for j in listed}
        names = collections.Counter(j["name"] for j in listed if (j["name"] or "").startswith("b"))
        for n in (n for n, c in names.items() if c > 1):
            self.fault(f"one submit ({n}) became two jobs")
        for job, (user, name) in self.acked.items():
            if job not in by_id:
                self.fault(f"acknowledged job {job} ({user}, {name}) is gone")
                continue
            got = (by_id[job]["user"], by_id[job]["name"] or "")
            if got[0] != user or not got[1].startswith(name):
                self.fault(f"acknowledged job {job} ({user}, {name}) is now {got}")

        ran = {}
        for user in USERS:
            counted = collections.Counter(int(w) for w in self._runs(user))
            for i in (i for i, c in counted.items() if c > 1):
                self.fault(f"{user}'s job {i} ran {counted[i]} times")
            ran.update(dict.fromkeys(counted, user))
        for i in (i for i in ran if i not in by_id):
            self.fault(f"job {i} ran, but the daemon does not know it")
        kinds = collections.Counter()
        for j in listed:
            kind = (j["result"] or {}).get("kind")
            kinds[kind] += 1
            if kind == "exited":
                if j["id"] not in ran:
                    self.fault(f"job {j['id']} has exit {j['exit']} but never ran: {j}")
                elif j["exit"] != str(j["id"] % 5):
                    self.fault(f"job {j['id']}: exit {j['exit']}, not its own: {j}")
            elif kind == "error":
                # Every job here can run: one whose start a cut interrupted before its command ran
                # is queued again. (Seen before: a shepherd started on the spec of the boot before,
                # whose cgroup was gone; a spec cut short, before it was fsynced.)
                if j["id"] in ran:
                    self.fault(f"job {j['id']} ran, yet is said never to have run: {j}")
                self.never_ran[j["id"]] = j["result"]["note"]
                self.fault(f"acknowledged job {j['id']} never ran: {j['result']['note']}")
            elif kind != "lost" or j["exit"] != "lost":
                self.fault(f"job {j['id']} ended {kind}: {j}")
            elif "the machine restarted while it ran" not in (j["result"].get("note") or ""):
                # Lost is right only for a job the machine died under (its pidfile, fsynced before
                # the fork, is from before the boot): not for one whose start was cut short.
                self.fault(f"job {j['id']} is lost, but not to the cut: {j}")
        return kinds, self._check_outputs(by_id)

    def check_version(self):
        """After an upgrade cut: the daemon runs one version, whole; which one (an empty string: not an upgrade)."""
        g = self.g
        g.put_bytes(VENV_CHECK, "/root/venv-check.py", mode=0o644)
        r = g.run(f'real=$(readlink -f {PREFIX}) && pid=$(systemctl show -p MainPID --value hpc-batch) && '
                  f'echo "$real" && "$real/bin/python" -I /root/venv-check.py "$real" "$pid" {PREFIX}', timeout=300)
        assert r.ok, r.describe()
        real, got = r.out.strip().split("\n", 1)
        info = json.loads(got)
        ready = g.run("journalctl -b -u hpc-batch -o cat --no-pager | grep ' ready on ' | tail -1", timeout=60).out
        m = re.search(r"hpc-batchd (\S+) ready on", ready)
        client = dispatch(g, "alice", "--version", timeout=60).out.strip()
        version = info["version"]
        for what in info["bad"]:
            self.fault(f"the installed venv {real} is not whole: {what}")
        if info["dist"] != version:
            self.fault(f"{real}: hpc_batch/__init__.py says {version}, its dist-info {info['dist']}")
        if info["daemon_venv"] != real:
            self.fault(f"the daemon runs from {info['daemon_venv']}, {PREFIX} names {real}")
        if not m or m.group(1) != version:
            self.fault(f"the daemon says {ready.strip()!r}, its files are {version}")
        if client != f"dispatch {version}":
            self.fault(f"dispatch --version says {client!r}, the files {version}")
        if self.upgrading is None:
            self.version = version
            return ""
        before, after = self.upgrading
        self.upgrading = None
        if version not in (before, after):
            self.fault(f"after an upgrade from {before} to {after}, the daemon runs {version}")
        self.version = version
        which = "the new version" if version == after else "the old version"
        return f"came up on {version} ({which}) from {real}; {len(info['venvs'])} venvs under {PREFIX}.versions"

    def verdict(self, during):
        """The end of a run of cuts: the jobs that never ran named, then every broken guarantee."""
        for job, why in sorted(self.never_ran.items()):
            self.say(f"acknowledged job {job} never ran: {why}")
        assert not self.faults, f"broken after power cuts{during} (seed {SEED}):\n" + "\n".join(
            f"cut {n}: {what}" for what, n in self.faults.items())

    def repair_package(self, to):
        """After a cut during ``dpkg -i``: what an admin does (``dpkg --configure -a``, and the
        ``dpkg -i`` again when dpkg had not unpacked it) must end installed at *to*, serving."""
        g = self.g

        def status():
            return g.run("dpkg-query -W -f='${Status} ${Version}' hpc-batch", timeout=60).out.strip()
        found = status()
        # A package dpkg marks "reinstreq" (cut while unpacking) must be installed again; dpkg itself
        # refuses to configure it and says so. Anything else configures.
        if "reinstreq" not in found:
            r = g.run("dpkg --configure -a", timeout=900)
            if not r.ok:
                self.fault(f"dpkg --configure -a failed after the cut (dpkg said {found!r}): {r.describe()}")
        if status() != f"install ok installed {to}":
            deb = f"/root/debs/{os.path.basename(self.debs[to])}"
            r = g.run(["dpkg", "-i", deb], timeout=900)
            if not r.ok:
                self.fault(f"dpkg -i {deb} again failed after the cut: {r.describe()}")
        if status() != f"install ok installed {to}":
            self.fault(f"after the repair dpkg says {status()!r}, not {to} installed")

        wait_for(self._serving, 300, what="hpc-batch to serve after dpkg's repair")

        def ready_on_to():   # a reload re-executes the daemon: done once it says it is ready again
            line = g.run("journalctl -b -u hpc-batch -o cat --no-pager | grep ' ready on ' | tail -1",
                         timeout=60).out
            return f"hpc-batchd {to} ready on" in line
        wait_for(ready_on_to, 300, interval=2, what=f"the daemon to be ready on {to} after dpkg's repair")
        self.check_version()
        if self.version != to:
            self.fault(f"after dpkg's repair the daemon runs {self.version}, not {to}")
        return f"dpkg found {found!r}; repaired to {status()!r}, the daemon on {self.version}"

    def _check_outputs(self, by_id):
        said = collections.Counter()
        for job, (user, log, size) in self.outputs.items():
            j = by_id.get(job)
            if j is None:
                continue   # a fault already
            want = hashlib.sha256(_expected_output(size)).hexdigest()
            if (j["result"] or {}).get("kind") == "lost":
                said["lost, no delivery"] += 1
                continue
            if j["output_error"]:
                m = re.search(r"the output is kept at (\S+)$", j["output_error"])
                if not m:
                    self.fault(f"job {job}: its log was not delivered and no buffer is named: {j}")
                    continue
                kept = self.g.run(f"stat -c %s {shlex.quote(m.group(1))} && sha256sum {shlex.quote(m.group(1))}",
                                  timeout=120)
                words = kept.out.split()
                if not kept.ok or len(words) < 2 or words[1] != want:
                    self.fault(f"job {job}: the buffer named as kept ({m.group(1)}) is not the output: "
                               f"{words[0] if words else '?'} of {size} bytes ({kept.describe()})")
                said["buffer kept and named"] += 1
                continue
            got = self.g.run(f"sha256sum {shlex.quote(log)}", timeout=120, user=user)
            if not got.ok or got.out.split()[0] != want:
                self.fault(f"job {job}: the log {log} is said delivered but is not whole ({size} bytes): {got!r}")
            said["log whole"] += 1
        return said


@pytest.mark.timeout(1200 + 900 * CUTS, func_only=True)
def test_power_cuts(guest_image, project_wheel, tmp_path, request):
    tr = request.config.pluginmanager.get_plugin("terminalreporter")

    def say(msg):
        (tr.write_line if tr else print)(f"[power cuts] {msg}")
    rng = random.Random(SEED)
    unknown = set(KINDS) - set(ALL_KINDS)
    assert KINDS and not unknown, f"HPC_BATCH_POWERCUT_KINDS: no such kinds {sorted(unknown)} (of {ALL_KINDS})"
    say(f"{CUTS} cuts, seed {SEED} (HPC_BATCH_POWERCUT_SEED repeats it), disk cache={CACHE}")
    conftest = _system_conftest(request.config)
    pc = PowerCuts(guest_image, tmp_path, say)
    try:
        g = pc.boot()
        conftest.install_project(g, project_wheel, str(request.config.rootpath), by_hand=True)
        conftest.make_users(g)
        set_flags(g, FLAGS, how="restart")
        if "upgrade" in KINDS:
            pc.check_version()   # the version installed, before any upgrade
            nxt, version = build_next_wheel(str(request.config.rootpath), tmp_path / "next-src", tmp_path / "next")
            pc.wheels = {pc.version: project_wheel, version: nxt}
            say(f"upgrades between {pc.version} and {version}")
        g.run("sync", timeout=300, check=True)   # the install itself must survive the first cut
        for n in range(CUTS):
            kind = KINDS[n % len(KINDS)]
            started = time.monotonic()
            where = getattr(pc, kind)(n, rng)
            pc.boot()
            kinds, outputs = pc.check()
            upgraded = pc.check_version() if kind == "upgrade" else ""
            line = (f"cut {n + 1}/{CUTS} ({kind}, {where}): daemon up alone; {len(pc.acked)} acknowledged jobs "
                    f"so far, all there once; results {dict(kinds)}"
                    + (f"; outputs {dict(outputs)}" if outputs else "")
                    + (f"; {upgraded}" if upgraded else "")
                    + f" ({time.monotonic() - started:.0f} s)")
            pc.results.append(line)
            say(line)
        pc.verdict("")
    finally:
        pc.close()


@pytest.mark.timeout(1200 + 900 * DEB_CUTS, func_only=True)
def test_power_cuts_during_deb_upgrades(guest_image, tmp_path, request):
    tr = request.config.pluginmanager.get_plugin("terminalreporter")

    def say(msg):
        (tr.write_line if tr else print)(f"[deb power cuts] {msg}")
    rng = random.Random(SEED)
    say(f"{DEB_CUTS} cuts during dpkg -i, seed {SEED} (HPC_BATCH_POWERCUT_SEED repeats it)")
    pc = PowerCuts(guest_image, tmp_path, say)
    for k in range(DEB_CUTS + 1):
        deb = build_deb(tmp_path / f"deb-{k}", *(("--local", str(k)) if k else ()))
        pc.debs[deb_version(deb)] = deb
        pc.deb_order.append(deb_version(deb))
    try:
        g = pc.boot()
        first = pc.debs[pc.deb_order[0]]
        # The package makes its own venv at the prefix (not the image's); the tests' dispatch is /opt/bin's.
        g.run(f"rm -rf {PREFIX} && mkdir -p {GUEST_BIN} && for p in dispatch hpc-batchd hpc-batch-shepherd; "
              f"do ln -sfn /usr/bin/$p {GUEST_BIN}/$p; done", timeout=120, check=True)
        pc._stage_file(first, "/root/debs/" + os.path.basename(first))
        r = g.run(["dpkg", "-i", "/root/debs/" + os.path.basename(first)], timeout=900)
        assert r.ok, r.describe()
        _system_conftest(request.config).make_users(g)
        set_flags(g, FLAGS, how="restart")
        pc.check_version()
        assert pc.version == pc.deb_order[0], (pc.version, pc.deb_order)
        g.run("sync", timeout=300, check=True)   # the install itself must survive the first cut
        for n in range(DEB_CUTS):
            started = time.monotonic()
            where = pc.deb_upgrade(n, rng)
            to = pc.upgrading[1]
            pc.boot()
            kinds, _ = pc.check()
            upgraded = pc.check_version()
            state = pc.repair_package(to)
            line = (f"cut {n + 1}/{DEB_CUTS} (dpkg -i, {where}): daemon up alone; {len(pc.acked)} acknowledged "
                    f"jobs, all there once; results {dict(kinds)}; {upgraded}; {state} "
                    f"({time.monotonic() - started:.0f} s)")
            pc.results.append(line)
            say(line)
        pc.verdict(" during dpkg -i")
    finally:
        pc.close()

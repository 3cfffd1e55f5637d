"""Benchmark mode's machine-wide changes, as users see them (security review 3, G7): overlapping
benchmark jobs of two users put every IRQ back however they end, a daemon killed between the
ends included, and machine-wide turbo goes off only under an --exclusive job, so another user's
job never runs without it.

The daemon runs in a private mount namespace with a fake cpufreq tree bound over
/sys/devices/system/cpu/cpufreq and a fake IRQ tree over /proc/irq (as the review's
g7_turbo_irq.sh does), so the host's settings are never touched; its shepherds, and so the jobs,
see the same trees. Needs root that may bind-mount in a new mount namespace, and 2 CPUs.
"""

import json
import os
import subprocess

import pytest
from ci_host import require
from conftest import wait_for

from hpc_batch.core.cputopo import parse_cpulist

pytestmark = pytest.mark.timeout(180)

IRQS = (24, 25, 26, 27)
BIND = ('mount --bind "$1/cpufreq" /sys/devices/system/cpu/cpufreq && '
        'mount --bind "$1/irq" /proc/irq && shift && exec "$@"')


def _put(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"{value}\n")


def _read(path):
    with open(path) as f:
        return f.read().strip()


class Fake:
    """The fake trees: two acpi-cpufreq policies, global boost on, four IRQs on CPUs 0-1."""

    def __init__(self, base):
        self.base = base
        for p in (0, 1):
            d = os.path.join(base, "cpufreq", f"policy{p}")
            for name, value in (("affected_cpus", p), ("related_cpus", p), ("scaling_governor", "schedutil"),
                                ("scaling_driver", "acpi-cpufreq"), ("scaling_min_freq", 1500000),
                                ("scaling_max_freq", 3000000), ("cpuinfo_min_freq", 1500000),
                                ("cpuinfo_max_freq", 3000000)):
                _put(os.path.join(d, name), value)
        _put(os.path.join(base, "cpufreq", "boost"), 1)
        for irq in IRQS:
            _put(os.path.join(base, "irq", str(irq), "smp_affinity_list"), "0-1")
        os.chmod(base, 0o755)
        self.before = self.state()

    def irq(self, n):
        return _read(os.path.join(self.base, "irq", str(n), "smp_affinity_list"))

    def boost(self):
        return _read(os.path.join(self.base, "cpufreq", "boost"))

    def state(self):
        out = {f"irq{n}": self.irq(n) for n in IRQS}
        out["boost"] = self.boost()
        for p in (0, 1):
            for name in ("scaling_governor", "scaling_min_freq"):
                out[f"policy{p}/{name}"] = _read(os.path.join(self.base, "cpufreq", f"policy{p}", name))
        return out

    def wrap(self):
        return ["unshare", "-m", "--propagation", "private", "--", "sh", "-c", BIND, "sh", self.base]


@pytest.fixture
def fake(scratch):
    require(len(os.sched_getaffinity(0)) >= 2, "needs 2 CPUs: two benchmark jobs side by side")
    require(os.path.isdir("/sys/devices/system/cpu/cpufreq") and subprocess.run(
            ["unshare", "-m", "--propagation", "private", "--", "mount", "--bind", scratch, "/proc/irq"],
            capture_output=True).returncode == 0,
            "needs cpufreq and root that may bind-mount over /proc/irq in a new mount namespace")
    return Fake(os.path.join(scratch, "fake"))


def _home(d, user):
    home = os.path.join(d.base, user.pw_name)
    os.makedirs(home, exist_ok=True)
    os.chown(home, user.pw_uid, user.pw_gid)
    return home


def _hold(d, user, name, flags=()):
    """A job of *user* that runs until its flag file appears; returns (id, flag, show --json)."""
    home = _home(d, user)
    flag = os.path.join(d.base, f"go-{name}")
    job = d.submit("sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done", flags=("--no-output", *flags),
                   user=user.pw_name, cwd=home)
    d.wait_running(job, user=user.pw_name)
    return job, flag, json.loads(d.ok("show", "--json", str(job), user=user.pw_name))


def _off(fake, cpus):
    """Whether every IRQ is off *cpus*."""
    return all(not set(parse_cpulist(fake.irq(n))) & set(cpus) for n in IRQS)


@pytest.mark.parametrize("first_out", ["alice", "bob"])
@pytest.mark.parametrize("kill9", [False, True], ids=["", "kill -9 between the ends"])
def test_two_users_overlapping_benchmark_jobs_put_every_irq_back(daemon_factory, users, fake, first_out, kill9):
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0", "--housekeeping-cpus", "none",
                       "--cpufreq", "enforce", "--allow-turbo-off", wrap=fake.wrap())
    a, a_flag, a_show = _hold(d, users["alice"], "a", ("--benchmark", "--cpu", "1"))
    assert _off(fake, a_show["cpus"]) and fake.boost() == "1"   # a plain benchmark job keeps turbo
    assert a_show["quiet"]["cpufreq"]["turbo"].startswith("turbo on (the switch is machine-wide")
    b, b_flag, b_show = _hold(d, users["bob"], "b", ("--benchmark", "--cpu", "1"))
    assert {a_show["cpus"][0], b_show["cpus"][0]} == {0, 1}
    # No CPU is off both: B's start leaves them where A put them, and B's record says so.
    assert _off(fake, a_show["cpus"])
    assert {e["result"] for e in b_show["quiet"]["irqs"]["each"].values()} == {"kept"}
    jobs = {"alice": (a, a_flag, b_show["cpus"]), "bob": (b, b_flag, a_show["cpus"])}
    first, flag, other_cpus = jobs[first_out]
    last, last_flag, _ = jobs["bob" if first_out == "alice" else "alice"]
    open(flag, "w").close()
    d.wait_finished(first, user=users[first_out].pw_name)
    assert _off(fake, other_cpus), fake.state()   # off the CPU of the job still running
    last_user = users["bob" if first_out == "alice" else "alice"].pw_name
    if kill9:
        d.kill9()
        open(last_flag, "w").close()   # it ends while no daemon runs
        wait_for(lambda: os.path.exists(os.path.join(d.state_dir, "jobs", str(last), "exit.json")),
                 what="the job's exit record")
        assert _off(fake, other_cpus)   # nobody has put them back yet
        d.start()                       # the new daemon collects it and finishes the undo
    else:
        open(last_flag, "w").close()
    d.wait_finished(last, user=last_user)
    assert fake.state() == fake.before
    undone = json.loads(d.ok("show", "--json", str(first)))["quiet"]["undone"]
    assert undone["handed"] == len(IRQS) and undone["left"] == []
    ledger = os.path.join(d.state_dir, "quiet-ledger.json")
    st = os.stat(ledger)
    assert st.st_uid == 0 and st.st_mode & 0o777 == 0o600
    with open(ledger) as f:
        assert json.load(f)["entries"] == {}


def test_turbo_goes_off_only_under_an_exclusive_job_which_no_other_job_runs_beside(daemon_factory, users, fake):
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0", "--cpufreq", "enforce", "--allow-turbo-off",
                       wrap=fake.wrap())
    alice, bob = users["alice"], users["bob"]
    a, a_flag, _ = _hold(d, alice, "a", ("--benchmark",))
    home = _home(d, bob)
    seen = d.submit("cat", "/sys/devices/system/cpu/cpufreq/boost", user=bob.pw_name, cwd=home)
    d.wait_finished(seen, user=bob.pw_name)
    assert _read(os.path.join(home, f"output.{seen}.log")) == "1"   # bob's job beside a benchmark job: turbo on
    open(a_flag, "w").close()
    d.wait_finished(a, user=alice.pw_name)
    x, x_flag, x_show = _hold(d, alice, "x", ("--benchmark", "--exclusive"))
    assert fake.boost() == "0" and x_show["quiet"]["cpufreq"]["turbo"] == "turbo off (cpufreq/boost)"
    later = d.submit("cat", "/sys/devices/system/cpu/cpufreq/boost", user=bob.pw_name, cwd=home)
    assert d.jobs(user=bob.pw_name)[later]["state"] == "queued"   # it waits for the machine
    d.kill9()                           # turbo stays off only while the exclusive job runs, daemon or not
    open(x_flag, "w").close()
    wait_for(lambda: os.path.exists(os.path.join(d.state_dir, "jobs", str(x), "exit.json")),
             what="the exclusive job's exit record")
    d.start()
    d.wait_finished(later, user=bob.pw_name)
    assert _read(os.path.join(home, f"output.{later}.log")) == "1"   # bob's job ran with turbo back on
    assert fake.state() == fake.before

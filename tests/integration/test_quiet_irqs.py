"""Benchmark jobs' IRQs on this host: moved off the job's CPUs at its start, put back at its end,
by the daemon that sees the end, after a kill -9 of the one that moved them too.

Needs root that can write /proc/irq/*/smp_affinity_list (skipped otherwise) and at
least 2 CPUs: the daemon reserves CPU 0 for the OS (the housekeeping CPU by default)
and gives the job the rest; the jobs are ``dispatch new --benchmark`` jobs.

What this host cannot show (cgroup v1 here, no cpufreq, no irqbalance), for the VM
tier (tests/system) to check on a guest with cgroup v2:
- a benchmark job's cgroup reads ``cpuset.cpus.partition`` = ``isolated`` (kernel 6.7
  or later), its CPUs are in ``hpc-batch/cpuset.cpus.exclusive`` while it runs and out
  of it after; ``/sys/fs/cgroup/cpuset.cpus.isolated`` lists them while it runs;
- the fallback: with a sibling that claims the CPUs exclusively (or an older kernel),
  the record says ``exclusive`` with the kernel's ``isolated invalid (<reason>)``;
- the virtio IRQs of the guest move to the housekeeping CPUs and come back, across a
  ``systemctl restart hpc-batch`` and a ``kill -9`` mid-job, and with two benchmark
  jobs whose IRQs overlap, the one that ends first hands them over (nothing returns to
  the other's CPUs until it ends);
- with irqbalance running (its unit active), the record says so; with
  ``--irqbalance-ban``, ``irqbalance`` answers ``setup`` on its socket with the job's
  CPUs in its BANNED mask while the job runs, and its own choice after.
"""

import json
import os
import signal

import pytest
from ci_host import require
from conftest import exit_of, wait_for

from hpc_batch.core.cputopo import parse_cpulist
from hpc_batch.daemon.benchmode import irqsteer, quiet

pytestmark = pytest.mark.timeout(120)


def _writable_irqs() -> bool:
    if os.geteuid() != 0 or len(os.sched_getaffinity(0)) < 2:
        return False
    for irq, value in irqsteer.read_affinities().items():
        try:   # writing back what is there changes nothing
            with open(f"/proc/irq/{irq}/smp_affinity_list", "w") as f:
                f.write(value)
            return True
        except OSError:
            continue
    return False


@pytest.fixture
def irqs():
    """Every IRQ's affinity before the test; put back afterwards whatever happens."""
    require(_writable_irqs(), "needs root that may write /proc/irq/*/smp_affinity_list on a 2-CPU machine")
    before = irqsteer.read_affinities()
    yield before
    for irq, value in before.items():
        if irqsteer.read_affinities().get(irq) != value:
            try:
                with open(f"/proc/irq/{irq}/smp_affinity_list", "w") as f:
                    f.write(value)
            except OSError:
                pass


def _start(d, scratch, bench=True):
    flag = os.path.join(scratch, "go")
    job = d.submit("sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done",
                   flags=("--benchmark",) if bench else ())
    d.wait_running(job)
    status = os.path.join(d.state_dir, "jobs", str(job), "status.json")
    wait_for(lambda: os.path.exists(status), what="its shepherd")
    show = json.loads(d.ok("show", "--json", str(job)))
    return job, flag, show


def _check_moved(before, show):
    irqs = show["quiet"]["irqs"]
    held = set(show["cpus"])
    assert irqs["to"] == "0" and 0 not in held
    touching = {irq for irq, v in before.items() if set(parse_cpulist(v)) & held}
    assert touching, "no IRQ on the job's CPUs: nothing to show"
    assert set(irqs["moved"]) | set(irqs["refused"]) == touching and set(irqs["each"]) == {str(i) for i in touching}
    assert irqs["moved"], f"every IRQ refused: {irqs['each']}"
    now = irqsteer.read_affinities()
    for irq in irqs["moved"]:
        assert now[irq] == "0" and irqs["each"][str(irq)]["result"] == "moved", (irq, now[irq])
    for irq in irqs["refused"]:   # as this VM's IRQ 36 (EPERM): kept where it was, and said so
        e = irqs["each"][str(irq)]
        assert now[irq] == before[irq] and e["result"] == "refused" and e["errno"].startswith("E") and e["error"]
    # The kernel's effective affinity, read back at the start: which IRQs can still land on the job's CPUs.
    still = sorted(int(i) for i, e in irqs["each"].items()
                   if e["effective"] is not None and set(parse_cpulist(e["effective"])) & held
                   or e["effective"] is None and e["result"] == "refused")
    assert irqs["still_on_job_cpus"] == still
    return irqs["moved"]


def _check_restored(before, moved):
    now = irqsteer.read_affinities()
    assert {irq: now[irq] for irq in moved} == {irq: before[irq] for irq in moved}


def test_benchmark_job_moves_irqs_and_puts_them_back(daemon_factory, users, scratch, irqs):
    d = daemon_factory()
    job, flag, show = _start(d, scratch)
    moved = _check_moved(irqs, show)
    assert show["quiet"]["irqbalance"] in ("not running",) or show["quiet"]["irqbalance"].startswith("active")
    assert show["quiet"]["cpufreq"]["policy"] == "record"
    shown = d.ok("show", str(job))
    assert f"interrupts: {len(moved)} moved to CPUs 0" in shown and "frequency: record" in shown
    for irq in show["quiet"]["irqs"]["refused"]:
        assert f"{irq} ({show['quiet']['irqs']['each'][str(irq)]['errno']}: " in shown
    open(flag, "w").close()
    assert exit_of(d.wait_finished(job)) == "0"
    _check_restored(irqs, moved)
    after = json.loads(d.ok("show", "--json", str(job)))["quiet"]
    assert after["undone"] == {"restored": len(moved), "handed": 0, "left": []}
    assert not os.path.exists(os.path.join(d.state_dir, "jobs", str(job), quiet.FILE))
    # The record says what the start did, as show does: not the planned writes.
    machine = json.loads(d.ok("show", "--record", "--json", str(job)))["machine"]["quiet"]["value"]
    assert machine["irqs"] == show["quiet"]["irqs"] and "writes" not in machine
    text = d.ok("show", "--record", str(job))
    for irq, e in show["quiet"]["irqs"]["each"].items():
        assert f"quiet.irqs.each.{irq}.result: {e['result']}" in text


def test_plain_job_moves_nothing(daemon_factory, users, scratch, irqs):
    d = daemon_factory()
    job, flag, show = _start(d, scratch, bench=False)
    assert show["quiet"] is None and irqsteer.read_affinities() == irqs
    open(flag, "w").close()
    d.wait_finished(job)


def test_kill9_mid_job_then_restart_restores_at_its_end(daemon_factory, users, scratch, irqs):
    d = daemon_factory()
    job, flag, show = _start(d, scratch)
    moved = _check_moved(irqs, show)
    saved = os.path.join(d.state_dir, "jobs", str(job), quiet.FILE)
    assert os.stat(saved).st_mode & 0o777 == 0o600 and os.stat(saved).st_uid == 0
    d.kill9()
    _check_moved(irqs, show)   # a crash keeps the job's IRQs where they were put
    d.start()                  # a new daemon re-adopts the job; the IRQs stay moved while it runs
    _check_moved(irqs, show)
    open(flag, "w").close()
    assert exit_of(d.wait_finished(job)) == "0"
    _check_restored(irqs, moved)


def test_job_ends_while_daemon_is_down(daemon_factory, users, scratch, irqs):
    d = daemon_factory()
    job, flag, show = _start(d, scratch)
    moved = _check_moved(irqs, show)
    d.kill9()
    open(flag, "w").close()
    exit_json = os.path.join(d.state_dir, "jobs", str(job), "exit.json")
    wait_for(lambda: os.path.exists(exit_json), what="the job's exit record")
    _check_moved(irqs, show)   # nobody has restored them yet
    d.start()                  # recovery collects the job and undoes its changes
    assert exit_of(d.wait_finished(job)) == "0"
    _check_restored(irqs, moved)


def test_reload_keeps_irqs_moved(daemon_factory, users, scratch, irqs):
    d = daemon_factory()
    job, flag, show = _start(d, scratch)
    moved = _check_moved(irqs, show)
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: d.log().count("ready on") >= 2, what="the reload")
    _check_moved(irqs, show)
    open(flag, "w").close()
    assert exit_of(d.wait_finished(job)) == "0"
    _check_restored(irqs, moved)


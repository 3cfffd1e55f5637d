"""The engine's side of quiet cores: a benchmark job's start quiets its CPUs (in a fixture tree),
its end undoes it, and so does the next daemon when the job ended while none ran."""

import errno
import os
import shutil
from dataclasses import replace

import pytest
from test_engine import ROOT, T0, Hooks, TurnEngine, end, start_pending, world  # noqa: F401 (world: fixture)

from hpc_batch.core import jobs
from hpc_batch.core.cputopo import parse_cpulist
from hpc_batch.daemon import devdir
from hpc_batch.daemon.benchmode import cpufreq, irqsteer, kfiles, quiet
from hpc_batch.wire.protocol import NewJob
from shepherd.base import records
from shepherd.record import recorder

pytestmark = pytest.mark.timeout(60)
FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "quiet")


@pytest.fixture
def bench(world, tmp_path):  # noqa: F811 (the imported fixture)
    eng, store, fake, hooks = world
    root = str(tmp_path / "machine")
    shutil.copytree(os.path.join(FIXTURES, "intel-pstate-turbo"), root)
    eng.bench.quiet = quiet.Settings(cpufreq="enforce", root=root, ledger=eng.bench.quiet.ledger)
    return eng, store, fake, root


def _submit(eng, benchmark=True, exclusive=False):
    job = eng.submit(ROOT, NewJob(argv=("true",), cwd="/tmp", no_output=True, cpus=None if exclusive else 1,
                                  exclusive=exclusive), T0)["id"]
    if benchmark:   # as --benchmark sets it (the fixture machine: allocation as for any job)
        asked = eng.jobs[job].request
        eng.jobs[job].request = replace(asked, resources=replace(asked.resources, benchmark="warn"))
    start_pending(eng)
    return job


def _restarted(eng, store):
    """A new daemon over the same state (the old one was killed)."""
    new = TurnEngine(eng.cfg, store, eng.machine, eng.limits, devdir.DevDir(None, 0), Hooks(), launcher=eng.launcher)
    new.bench.quiet = eng.bench.quiet
    return new


def test_benchmark_start_quiets_and_end_restores(bench):
    eng, store, fake, root = bench
    before = irqsteer.read_affinities(root)
    job = _submit(eng)
    held = eng.table.running[job].alloc.held
    rec = eng.jobs[job].quiet
    assert fake.spawned == [job] and quiet.pending(store.job_dir(job))
    assert rec["irqs"]["to"] == "1" and held == (0,)
    assert rec["irqs"]["moved"] == [0, 8, 9, 120, 130]
    assert kfiles.read(root, f"{cpufreq.CPUFREQ}/policy0/scaling_governor") == "performance"
    assert store.records[job]["quiet"]["irqs"]["moved"] == rec["irqs"]["moved"]   # in its saved record
    end(eng, store, job, code=0)
    assert irqsteer.read_affinities(root) == before
    assert kfiles.read(root, f"{cpufreq.CPUFREQ}/policy0/scaling_governor") == "powersave"
    assert eng.jobs[job].quiet["undone"] == {"restored": 7, "handed": 0, "left": []}
    assert not quiet.pending(store.job_dir(job))


def test_plain_job_changes_nothing(bench):
    eng, store, fake, root = bench
    before = irqsteer.read_affinities(root)
    job = _submit(eng, benchmark=False)
    assert eng.jobs[job].quiet is None and irqsteer.read_affinities(root) == before
    assert not quiet.pending(store.job_dir(job))


def test_a_job_that_ended_while_no_daemon_ran_is_undone_at_recovery(bench):
    eng, store, fake, root = bench
    before = irqsteer.read_affinities(root)
    job = _submit(eng)
    assert irqsteer.read_affinities(root) != before
    from shepherd.base import records
    records.write_json(os.path.join(store.job_dir(job), records.EXIT), {"ended": T0 + 5, "code": 0})
    new = _restarted(eng, store)
    new.recover()
    assert new.jobs[job].state == jobs.FINISHED and new.jobs[job].quiet["undone"]["restored"] == 7
    assert irqsteer.read_affinities(root) == before


def test_a_restart_keeps_a_running_jobs_changes_until_it_ends(bench):
    eng, store, fake, root = bench
    before = irqsteer.read_affinities(root)
    job = _submit(eng)
    moved = irqsteer.read_affinities(root)
    new = _restarted(eng, store)
    fake.adoptable = (fake._next, os.open(os.devnull, os.O_RDONLY))   # its shepherd still runs
    new.recover()
    assert new.bench.held == {job: (0,)} and irqsteer.read_affinities(root) == moved
    end(new, store, job, code=0)
    assert irqsteer.read_affinities(root) == before


def test_the_record_says_what_the_start_did_and_a_refusal_is_never_undone(bench, monkeypatch):
    eng, store, fake, root = bench
    real = kfiles.write

    def kernel(r, rel, value):   # IRQ 0 cannot be moved (the kernel's EPERM)
        if rel == irqsteer.affinity_path(0):
            raise OSError(errno.EPERM, "Operation not permitted")
        real(r, rel, value)
    monkeypatch.setattr(kfiles, "write", kernel)
    job = _submit(eng)
    jdir = store.job_dir(job)
    irqs = eng.jobs[job].quiet["irqs"]
    assert irqs["moved"] == [8, 9, 120, 130] and irqs["refused"] == [0]
    assert irqs["each"]["0"] == {"result": "refused", "errno": "EPERM", "error": "Operation not permitted",
                                 "old": "0", "new": "1", "effective": "0"}
    assert irqs["still_on_job_cpus"] == [0]   # the job holds CPU 0, where IRQ 0 stays
    assert recorder.quiet_field(jdir)["value"] == eng.jobs[job].quiet   # the record: what show --json says
    saved = records.read_json(os.path.join(jdir, quiet.FILE))
    assert irqsteer.affinity_path(0) not in {w["path"] for w in saved["writes"]}
    monkeypatch.setattr(kfiles, "write", real)
    kfiles.write(root, irqsteer.affinity_path(0), "1")   # moved since by someone else, as we tried
    end(eng, store, job, code=0)
    assert eng.jobs[job].quiet["undone"] == {"restored": 6, "handed": 0, "left": []}
    assert kfiles.read(root, irqsteer.affinity_path(0)) == "1"


@pytest.mark.parametrize("first_out", ["a", "b"])
@pytest.mark.parametrize("restart", [False, True], ids=["", "kill -9 and a new daemon between the ends"])
def test_overlapping_benchmark_jobs_put_every_irq_back_in_either_order(bench, first_out, restart):
    """Two CPUs, no CPU reserved: each job wants the IRQs on the other's CPU (as --housekeeping-cpus none)."""
    eng, store, fake, root = bench
    before = irqsteer.read_affinities(root)
    jobs_ = {"a": _submit(eng), "b": _submit(eng)}
    held = {k: eng.table.running[j].alloc.held for k, j in jobs_.items()}
    assert held == {"a": (0,), "b": (1,)}
    assert eng.jobs[jobs_["a"]].quiet["irqs"]["to"] == "1"
    # Nowhere is off both jobs' CPUs: B's start leaves them as A had them, and its record says so.
    assert irqsteer.read_affinities(root)[8] == "1"
    assert eng.jobs[jobs_["b"]].quiet["irqs"]["each"]["8"]["result"] == "kept"
    ledger = eng.bench.quiet.ledger
    assert ledger.startswith(store.root) and os.stat(ledger).st_mode & 0o777 == 0o600
    first, last = jobs_[first_out], jobs_["b" if first_out == "a" else "a"]
    end(eng, store, first, code=0)
    stays = held["b" if first_out == "a" else "a"]
    assert not set(parse_cpulist(irqsteer.read_affinities(root)[8])) & set(stays)   # off the one still running
    if restart:
        eng = _restarted(eng, store)
        fake.adoptable = (fake._next, os.open(os.devnull, os.O_RDONLY))
        eng.recover()
    end(eng, store, last, code=0)
    assert irqsteer.read_affinities(root) == before
    assert quiet.load_ledger(eng.bench.quiet).entries == {}


def test_machine_wide_turbo_goes_off_only_for_an_exclusive_job(bench):
    eng, store, fake, root = bench
    eng.bench.quiet.allow_turbo_off = True
    plain = _submit(eng)
    assert kfiles.read(root, cpufreq.NO_TURBO) == "0"
    assert eng.jobs[plain].quiet["cpufreq"]["turbo"] == \
        "turbo on (the switch is machine-wide: turned off only for an --exclusive job)"
    end(eng, store, plain, code=0)
    whole = _submit(eng, exclusive=True)
    assert eng.table.running[whole].alloc.exclusive
    assert kfiles.read(root, cpufreq.NO_TURBO) == "1"
    assert eng.jobs[whole].quiet["cpufreq"]["turbo"] == "turbo off (intel_pstate/no_turbo)"
    other = _submit(eng, benchmark=False)   # anyone's job waits for the machine, so never runs without turbo
    assert eng.jobs[other].state == jobs.QUEUED
    end(eng, store, whole, code=0)
    assert kfiles.read(root, cpufreq.NO_TURBO) == "0"
    eng.tick(T0 + 2)
    assert eng.jobs[other].state == jobs.RUNNING

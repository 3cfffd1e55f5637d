"""How a job ended (daemon/outcome.py), case by case: an exit record in, the job's result out.

Each table row is one thing a shepherd can have written; the expected value is
what the job's record keeps of it.
"""

import pytest

from hpc_batch.core.jobs import ERROR, EXITED, KILLED, OOM, SIGNALLED, TIMEOUT, Job, Result
from hpc_batch.daemon import outcome
from shepherd.base.records import DeliveryRecord, ExitRecord


def _job(stop_reason=None, stop_sent=None, output="/home/a/output.1.log") -> Job:
    return Job(id=1, uid=1000, gid=1000, user="a", argv=["true"], cwd="/", submitted=0.0, max_time=60,
               output=output, stop_reason=stop_reason, stop_sent=stop_sent)


def _old(rec: ExitRecord) -> ExitRecord:
    rec.old_format = True
    return rec


def _rec(**fields) -> ExitRecord:
    rec = ExitRecord()
    for name, value in fields.items():
        setattr(rec, name, value)
    return rec


# (what happened, the job's stop fields, the exit record, the result)
RESULT_CASES = [
    ("exit 0", {}, ExitRecord(status=0, code=0), Result(EXITED, code=0)),
    ("exit 3", {}, ExitRecord(status=3 << 8, code=3), Result(EXITED, code=3)),
    ("a signal", {}, ExitRecord(signal=11), Result(SIGNALLED, signal=11)),
    ("stopped for its deadline", {}, ExitRecord(signal=15, stopped=TIMEOUT, stop_note="past 1m"),
     Result(TIMEOUT, signal=15, note="past 1m")),
    ("killed, and it exited on the signal's way", {}, ExitRecord(code=1, stopped=KILLED),
     Result(KILLED, code=1)),
    ("the OOM killer, whatever else it says", {}, ExitRecord(signal=9, oom_kill=1, stopped=KILLED),
     Result(OOM, signal=9)),
    ("the shepherd's error wins over all", {}, ExitRecord(code=127, error="exec failed", oom_kill=1),
     Result(ERROR, code=127, note="exec failed")),
    ("an old shepherd's record: the stop the daemon sent", {"stop_reason": TIMEOUT, "stop_sent": 5.0},
     _old(ExitRecord(signal=15)), Result(TIMEOUT, signal=15)),
    ("an old record, no stop sent: the signal", {"stop_reason": TIMEOUT}, _old(ExitRecord(signal=15)),
     Result(SIGNALLED, signal=15)),
    ("a new record is believed over the daemon's stop", {"stop_reason": TIMEOUT, "stop_sent": 5.0},
     ExitRecord(signal=15), Result(SIGNALLED, signal=15)),
]


@pytest.mark.parametrize("stop, rec, want", [c[1:] for c in RESULT_CASES], ids=[c[0] for c in RESULT_CASES])
def test_an_exit_record_means_a_result(stop, rec, want):
    assert outcome.result_of(_job(**stop), rec) == want


# (what the record holds, the stats it adds, in the order the job's record keeps them)
STATS_CASES = [
    ("nothing measured", ExitRecord(code=0), {}),
    ("memory and cpu", ExitRecord(code=0, peak_mem=5 << 20, cpu_time=1.5), {"peak_mem": 5 << 20, "cpu_time": 1.5}),
    ("a verdict brings its digest", _rec(verdict="clean", record_digest="sha256:ab"),
     {"verdict": "clean", "record_digest": "sha256:ab"}),
    ("a verdict without a digest", _rec(verdict="noisy"), {"verdict": "noisy", "record_digest": None}),
]


@pytest.mark.parametrize("rec, want", [c[1:] for c in STATS_CASES], ids=[c[0] for c in STATS_CASES])
def test_an_exit_record_adds_only_the_stats_it_holds(rec, want):
    stats = outcome.stats_of(rec)
    assert stats == want and list(stats) == list(want)


KEPT = "/var/lib/hpc-batch/jobs/1/output"
# (what happened, where the output was to go, delivery.json, the buffer still there, (note, error))
DELIVERY_CASES = [
    ("delivered", "/o", DeliveryRecord(ok=True, path="/o"), False, (None, None)),
    ("delivered, with a note", "/o", DeliveryRecord(ok=True, note="cut at 1 GiB"), False, ("cut at 1 GiB", None)),
    ("refused by the destination", "/o", DeliveryRecord(ok=False, error="permission denied"), True,
     (None, f"permission denied; the output is kept at {KEPT}")),
    ("failed, with a note", "/o", DeliveryRecord(ok=False, error="disk full", note="n"), True,
     ("n", f"disk full; the output is kept at {KEPT}")),
    ("failed without saying why", "/o", DeliveryRecord(ok=False), True,
     (None, f"its delivery was interrupted; the output is kept at {KEPT}")),
    ("no record, the buffer kept: interrupted", "/o", None, True,
     (None, f"its delivery was interrupted; the output is kept at {KEPT}")),
    ("no record and no buffer: lost in a crash after a full copy", "/o", None, False, (None, None)),
    ("--no-output: nothing to deliver", None, None, True, (None, None)),
    ("--no-output keeps a note", None, DeliveryRecord(ok=False, note="n"), True, ("n", None)),
]


@pytest.mark.parametrize("output, delivery, buffer_kept, want", [c[1:] for c in DELIVERY_CASES],
                         ids=[c[0] for c in DELIVERY_CASES])
def test_a_delivery_record_says_what_became_of_the_output(output, delivery, buffer_kept, want):
    assert outcome.delivery_of(output, delivery, KEPT, buffer_kept) == want

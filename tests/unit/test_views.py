"""The public JSON documents (core/views.py): each one's keys are exactly the names the docs give.

The docs call these field names stable, so a key added, renamed or dropped
in the code without the docs (or the other way round) fails here. The names
are read from README.md and docs/*.md (wherever the passage lives): each
document's passage is found between two markers, and its names are the
backticked identifiers outside parentheses (what the parentheses hold
explains a field: its unit, its values, its own keys).
"""

import re
from pathlib import Path

import pytest

from hpc_batch.core import views
from hpc_batch.core.jobrequest import JobRequest
from hpc_batch.core.jobs import FINISHED, Job, Result, move, wait_status
from hpc_batch.core.resources import Allocation, Budget, Machine, Node

ROOT = Path(__file__).resolve().parents[2]
GiB = 1 << 30
T0 = 1_800_000_000.0

# document -> (the marker its passage starts after, the marker it ends before), in the
# whitespace-collapsed text of README.md and docs/*.md.
PASSAGES = {
    "list": ("a job (`list`'s `jobs`, `show`):", "`show` adds"),
    "show": ("`show` adds", "- `new`:"),
    "wait": ("- `wait`: `jobs` (", ") and `exit`"),
    "watch": ("each `job` event's `job` has", "; the `end` event"),
    "end": ("the `end` event that closes an `attach` stream has", "- `status`:"),
    "history": ("A history row has", "Rows migrated from"),
    "info": ("`info.json` (metadata, as in `list --json`:", ") and `output` (combined"),
    "array": ("a whole array, e.g. `show 6_*`):", "- `wait`:"),
    "new": ("- `new`:", "; a bulk submit"),
    "new_bulk": ("a bulk submit (`--array`, `--commands`) adds", ", and its `id`, `state` and `output` are"),
}
_TOKEN = re.compile(r"`[^`]*`|[()]")
_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def _docs_text() -> str:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return " ".join(" ".join(f.read_text().split()) for f in files)


def _passage(name: str) -> str:
    start, end = PASSAGES[name]
    text = _docs_text()
    found = [m.end() for m in re.finditer(re.escape(start), text)]
    assert len(found) == 1, f"the docs should hold {start!r} once (the {name} document's fields); found {len(found)}"
    stop = text.find(end, found[0])
    assert stop >= 0, f"the {name} document's passage should end with {end!r}"
    return text[found[0]:stop]


def _names(text: str) -> list[str]:
    """The backticked identifiers of *text* at parenthesis depth 0, in order."""
    depth, out = 0, []
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok == "(":
            depth += 1
        elif tok == ")":
            depth -= 1
        elif depth == 0 and _NAME.fullmatch(tok[1:-1]):
            out.append(tok[1:-1])
    return out


def documented(name: str) -> set[str]:
    names = _names(_passage(name))
    assert len(names) == len(set(names)), f"the {name} document names a field twice: {names}"
    return set(names)


def test_the_reader_takes_top_level_names_only():
    assert _names("`a` (`b`, `c (d)`), `e_f` (`{\"g\"}`), `h` s, `not a name`, `i`") == ["a", "e_f", "h", "i"]


# -- the jobs the documents are made of: queued, running (an allocation), finished --------------

MACHINE = Machine((Node(0, (0, 1, 2, 3), 8 * GiB), Node(1, (4, 5, 6, 7), 8 * GiB)), gpus=(0, 1))


def _job(job_id: int = 7, **request) -> Job:
    return Job(id=job_id, uid=1000, gid=100, user="alice", argv=["python", "train.py", "--epochs", "3"], cwd="/home/a",
               submitted=T0, max_time=3600, budget={"mem": 2 * GiB}, state="queued",
               request=JobRequest.from_dict(request), name="train")


def _running(**request) -> Job:
    job = _job(**request)
    alloc = Allocation(cpus=(0, 1), mem_by_node=((0, GiB), (1, GiB)), gpus=(0,), exclusive=False, cores=((0,), (1,)))
    move(job, "running", T0 + 5, alloc=alloc)
    return job


def _finished() -> Job:
    job = _running()
    job.stats.update(cpu_time=12.5, peak_mem=3 << 20, verdict="clean", record_digest="sha256:ab")
    move(job, FINISHED, T0 + 65, Result("exited", code=3))
    return job


JOBS = {"queued": _job, "running": _running, "finished": _finished}


@pytest.mark.parametrize("state", JOBS)
def test_the_list_summary_has_the_documented_fields(state):
    assert set(views.summary(JOBS[state](), MACHINE)) == documented("list")


@pytest.mark.parametrize("state", JOBS)
def test_show_is_the_summary_and_what_show_adds(state):
    doc = views.show(JOBS[state](), MACHINE, position=None, why=None, cgroup=None, now=T0 + 70)
    assert documented("list").isdisjoint(documented("show"))
    assert set(doc) == documented("list") | documented("show")


def test_show_carries_what_the_daemon_knows_and_the_whole_command():
    job = _running(benchmark="warn")
    doc = views.show(job, MACHINE, position=None, why=None, cgroup="/sys/fs/cgroup/hpc-batch/job-7", now=T0 + 35)
    assert doc["cgroup"] == "/sys/fs/cgroup/hpc-batch/job-7" and doc["wall"] == 30
    assert doc["command"] == "python train.py --epochs 3" and doc["argv"] == job.argv
    assert doc["deadline"] == T0 + 5 + 3600 and doc["numa_nodes"] == [0, 1] and doc["spread"] is True
    assert doc["benchmark"] == "warn" and (doc["note"], doc["code"], doc["signal"]) == (None, None, None)
    queued = views.show(_job(), MACHINE, position=2, why="behind job 6", cgroup=None, now=T0 + 35)
    assert (queued["position"], queued["why"], queued["wall"], queued["deadline"]) == (2, "behind job 6", None, None)


def _wait_passage_parts() -> tuple[set[str], set[str]]:
    """The wait entry's fields, and those of a job forgotten while waited for (after the ';')."""
    whole, forgotten = _passage("wait").split(";", 1)
    return set(_names(whole)), set(_names(forgotten))


def test_a_wait_entry_has_the_documented_fields():
    entry, forgotten = _wait_passage_parts()
    done = views.wait_entry(7, _finished())
    assert set(done) == entry
    assert (done["exit"], done["wait_status"], done["result"]) == ("3", 3, "exited")
    gone = views.wait_entry(9, None)
    assert set(gone) == forgotten
    assert gone == {"id": 9, "state": "unknown", "exit": None, "wait_status": wait_status(None), "note": None}


@pytest.mark.parametrize("state", JOBS)
def test_a_watch_event_has_the_documented_fields_with_the_summary_values(state):
    job = JOBS[state]()
    doc = views.watch_job(job, MACHINE)
    assert set(doc) == documented("watch")
    summary = views.summary(job, MACHINE)
    assert doc == {k: summary[k] for k in doc}


def test_attach_end_events_have_the_documented_fields():
    end = views.end_fields(_finished())
    assert set(end) == documented("end")
    assert (end["state"], end["exit"]) == (FINISHED, "3")
    forgotten = views.forgotten_end(9)
    assert set(forgotten) <= documented("end") and forgotten["state"] == "unknown"


def test_a_history_row_has_the_documented_fields_and_the_record_verdict():
    row = views.history_row(_finished())
    assert set(row) == documented("history")
    assert (row["verdict"], row["record_digest"]) == ("clean", "sha256:ab")
    assert (row["wall_s"], row["code"], row["exit"], row["result"]) == (60, 3, "3", "exited")
    # What the record adds is the archive's to fill in: empty until then.
    assert (row["causes"], row["reasons"], row["setup_digest"], row["metrics"]) == ([], [], None, {})


@pytest.mark.parametrize("state", ("queued", "running"))
def test_a_dev_entry_info_has_the_documented_fields_with_the_summary_values(state):
    job = JOBS[state]()
    info = views.dev_info(job, MACHINE)
    assert set(info) == documented("info")
    summary = views.summary(job, MACHINE)
    assert info == {k: summary[k] for k in info}


def test_a_whole_arrays_document_has_the_documented_fields():
    jobs = []
    for k, state in enumerate(("running", "queued", "queued")):
        job = _job(job_id=7 + k)
        job.array = {"first": 7, "index": k + 1, "limit": 1, "count": 4}
        job.state = state
        jobs.append(job)
    doc = views.array_doc(7, jobs, 4)
    assert set(doc) == documented("array")
    assert (doc["last"], doc["limit"], doc["states"], doc["ids"]) == (10, 1, {"running": 1, "queued": 2}, [7, 8, 9])
    # An element's fields in the job documents are the same four, named once.
    assert set(views.summary(jobs[0], MACHINE)["array"]) == set(views.ARRAY_FIELDS) == \
        set(views.history_row(jobs[0])["array"])


def test_the_new_reply_has_the_documented_fields_in_the_order_it_always_had():
    job = _job()
    budget = Budget(2 * GiB, assigned=True)
    reply = views.new_reply(job, budget, starts=True, mem_enforced=False)
    assert set(reply) == documented("new")
    assert list(reply) == ["id", "state", "mem", "mem_assigned", "mem_enforced", "output", "name", "after",
                           "after_ok", "note"]
    assert (reply["state"], reply["mem"], reply["mem_assigned"]) == ("running", 2 * GiB, True)
    assert views.new_reply(job, budget, starts=False, mem_enforced=True)["state"] == "queued"
    # A bulk's: the client adds `ids` (every id, first to last) from `last`.
    bulk = views.bulk_fields(7, 3, 1, None)
    assert set(bulk) | {"ids"} == documented("new_bulk") and bulk == {"last": 9, "count": 3, "starting": 1,
                                                                      "limit": None}
    stored = views.stored_bulk_reply(7, budget, mem_enforced=True, name="n", after=[], after_ok=False, count=3,
                                     limit=2)
    assert set(stored) | {"state", "output"} == set(reply) | set(bulk)
    assert (stored["starting"], stored["note"], stored["limit"]) == (0, None, 2)


def test_the_kill_and_job_replies():
    job = _running()
    assert views.kill_reply(7, "queued") == {"id": 7, "was": "queued"}
    assert views.setting_reply(job) == {"id": 7, "max_time": 3600, "deadline": job.deadline, "state": "running"}

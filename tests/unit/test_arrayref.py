"""Array elements by name (``6_3``, ``6_*``): parsing, the cells and lines that show them, and the
engine's resolution of them (in memory, with the fakes of test_engine)."""

import pytest
from enginefakes import ROOT
from test_engine import submit, world  # noqa: F401  (world: the fixture)

from hpc_batch.client.listing import array_words, format_array
from hpc_batch.client.listnamed import array_words as naming_words
from hpc_batch.client.listnamed import listed
from hpc_batch.client.listtable import default_columns, job_of_summary, render
from hpc_batch.core import arrayref
from hpc_batch.core.arrayref import ArrayRef
from hpc_batch.core.jobnames import valid_name
from hpc_batch.core.listrows import array_cell
from hpc_batch.daemon.access import Caller
from hpc_batch.daemon.refusal import Refused


@pytest.mark.parametrize("word, ref", [
    ("6_3", ArrayRef(6, 3)), ("6_*", ArrayRef(6, None)), ("6_0", ArrayRef(6, 0)), ("12_03", ArrayRef(12, 3)),
    ("6_10000000", ArrayRef(6, 10_000_000)),
    # ids and names are not array references
    ("6", None), ("prep_1", None), ("2024_run", None), ("__", None), ("_*", None), ("a_*", None),
])
def test_the_forms_of_an_array_reference(word, ref):
    assert arrayref.parse(word) == ref


@pytest.mark.parametrize("word, says", [
    ("6_", "the element's index goes after the _"),
    ("_3", "the array's id goes before the _"),
    ("__3", "the array's id goes before the _"),
    ("0_1", "array ids are job ids, whole numbers from 1"),
    ("99999999999999999999_1", "array ids are job ids"),
    ("6_99999999", "array indices go from 0 to 10000000"),
    ("6_" + "9" * 5000, "array indices go from 0 to 10000000"),
    ("6_3_1", "one _ only"),
    ("6_3_*", "one _ only"),
])
def test_a_malformed_reference_says_what_is_wrong_and_the_forms(word, says):
    with pytest.raises(ValueError) as exc:
        arrayref.parse(word)
    assert says in str(exc.value) and repr(word[:40] + ("..." if len(word) > 40 else "")) in str(exc.value)
    if "_" in says:   # (a misshapen one is shown the good shapes)
        assert "6_3" in str(exc.value) and "6_*" in str(exc.value)
    assert len(str(exc.value)) < 300   # (a long word is quoted cut)


def test_one_spelling_of_an_element_and_of_an_array():
    assert str(ArrayRef(6, 3)) == arrayref.element_name(6, 3) == "6_3"
    assert str(ArrayRef(6, None)) == "6_*"
    assert array_cell({"first": 6, "index": 3, "limit": None, "count": 5}) == "6_3" and array_cell(None) is None


@pytest.mark.parametrize("name, ok", [("6_3", False), ("_3", False), ("6_", False), ("1_2_3", False),
                                      ("prep_1", True), ("run_2024_a", True), ("__", True)])
def test_no_new_job_name_reads_as_an_array_reference(name, ok):
    assert valid_name(name) is ok


def test_show_lines_of_an_element_and_of_a_whole_array():
    assert array_words({"first": 6, "index": 3, "limit": 2, "count": 5}) == \
        "6_3 (index 3 of array 6_*: 5 jobs, at most 2 at once)"
    assert array_words({"first": 6, "index": 0, "limit": None, "count": None}) == \
        "6_0 (index 0 of array 6_*: its size not recorded)"
    doc = {"first": 6, "last": 10, "count": 5, "limit": None, "user": "alice", "name": "sweep",
           "states": {"running": 1, "finished": 2}, "ids": [8, 9, 10]}
    assert format_array(doc) == ["array: 6_*", "jobs: 5 (6-10)", "at most at once: no cap", "user: alice",
                                 "name: sweep",
                                 "states: 2 finished, 1 running (2 more ended and left the list: "
                                 "dispatch history --array 6)"]


def _summary(job_id, array):
    return {"id": job_id, "user": "alice", "name": None, "command": "true", "state": "queued", "started": None,
            "ended": None, "max_time": 60, "mem": 1 << 30, "spread": False, "exclusive": False, "cpus": None,
            "gpu_label": None, "exit": None, "stats": {}, "array": array}


def test_the_table_shows_the_array_column_only_where_an_element_is_listed():
    assert "array" not in default_columns(False, False)
    cols = default_columns(False, False, arrays=True)
    assert cols[:2] == ["id", "array"]
    jobs = [job_of_summary(_summary(6, {"first": 6, "index": 1, "limit": 2, "count": 2})),
            job_of_summary(_summary(9, None))]
    lines = render(jobs, ["id", "array", "state"], 0.0)
    assert [line.split() for line in lines] == [["ID", "ARRAY", "STATE"], ["6", "6_1", "queued"],
                                                ["9", "-", "queued"]]
    # A table row from a daemon before arrays could be named has no such value.
    assert render([{"id": 9}], ["array"], 0.0, header=False) == ["-"]


def test_list_names_an_element_and_a_whole_array():
    summary = _summary(8, {"first": 6, "index": 3, "limit": None, "count": 5})
    table = job_of_summary(summary)
    for job in (summary, table):
        assert naming_words(job) == ("6_3", "6_*")
        assert listed(job, "6_3", "6_3") and listed(job, "6_*", "6_*")
        assert not listed(job, "6_4", "6_4") and not listed(job, "7_*", "7_*")
    assert naming_words(_summary(9, None)) == ()


def test_an_element_is_found_by_its_index_and_the_whole_array_by_its_id(world):  # noqa: F811
    eng, store, fake, hooks = world
    eng.cfg.max_queued_per_user = 5000
    r = submit(eng, array=(0, 2, 4, 10), array_limit=2)
    first = r["id"]
    assert eng.jobs[first + 3].array == {"first": first, "index": 10, "limit": 2, "count": 4}
    assert eng.lookup(ROOT, f"{first}_4").id == first + 2
    assert eng.lookup(ROOT, f"{first}_10").id == first + 3     # past the gap in its indices
    with pytest.raises(Refused) as exc:
        eng.lookup(ROOT, f"{first}_3")
    assert str(exc.value) == f"array {first} has no element with index 3 (4 jobs, indices 0 to 10)"
    elements, count = eng.array_of(ROOT, first)
    assert [j.id for j in elements] == list(range(first, first + 4)) and count == 4
    with pytest.raises(Refused, match="names a whole array"):
        eng.lookup(ROOT, f"{first}_*")


def test_an_element_whose_indices_run_on_is_found_without_walking_the_array(world, monkeypatch):  # noqa: F811
    eng, store, fake, hooks = world
    eng.cfg.max_queued_per_user = 5000
    first = submit(eng, array=tuple(range(1, 2001)))["id"]

    def walked(*args):
        raise AssertionError("walked the array")
    monkeypatch.setattr(eng, "array_of", walked)
    assert eng.lookup(ROOT, f"{first}_1500").id == first + 1499


def test_an_array_stored_without_its_size_and_one_with_forgotten_elements(world):  # noqa: F811
    eng, store, fake, hooks = world
    eng.cfg.max_queued_per_user = 5000
    first = submit(eng, array=(1, 2, 3, 4))["id"]
    after = submit(eng)["id"]
    for k in range(4):   # as a daemon before the size was kept stored them
        del eng.jobs[first + k].array["count"]
    elements, count = eng.array_of(ROOT, first)
    assert [j.id for j in elements] == list(range(first, first + 4)) and count == 4 and after == first + 4
    del eng.jobs[first]          # the first element forgotten (--keep-finished)
    del eng.jobs[first + 2]
    elements, count = eng.array_of(ROOT, first)
    assert [j.id for j in elements] == [first + 1, first + 3] and count == 4   # measured to the last held
    assert eng.lookup(ROOT, f"{first}_4").id == first + 3
    with pytest.raises(Refused) as exc:
        eng.lookup(ROOT, f"{first}_3")
    assert "of which it still holds 2 (dispatch history --array" in str(exc.value)


def test_another_users_array_is_refused_as_a_job_of_theirs_is(world):  # noqa: F811
    eng, store, fake, hooks = world
    first = submit(eng, array=(1, 2))["id"]
    bob = Caller(uid=4242, gid=4242, pid=2, name="bob", is_admin=False)
    for word in (f"{first}_2", f"{first}_*"):
        with pytest.raises(Refused) as exc:
            eng.lookup(bob, word) if word.endswith("2") else eng.array_of(bob, first)
        assert (exc.value.code, str(exc.value)) == ("not_found", f"no such job: {first}")

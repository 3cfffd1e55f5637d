"""Arrays by name through the real daemon: ``6_3`` and ``6_*`` in show, kill, wait and list."""

import json

import pytest
from conftest import USERS
from test_list_table import on_terminal

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def capped(daemon_factory, users):
    """alice's ``--array 1-5%2`` of long sleeps: two run, three wait on the cap. (daemon, first id)"""
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    r = json.loads(d.ok("new", "--json", "--array", "1-5%2", "--no-output", "--", "sleep", "60",
                        user=USERS["alice"]))
    assert (r["count"], r["limit"]) == (5, 2)
    d.wait_running(r["id"] + 1, user=USERS["alice"])
    yield d, r["id"]
    d.dispatch("kill", f"{r['id']}_*", user=USERS["alice"])


def _alice(d, *args):
    return d.dispatch(*args, user=USERS["alice"])


def test_list_and_show_give_each_element_its_array_index_and_the_cap(capped):
    d, first = capped
    jobs = d.jobs(user=USERS["alice"])
    assert [jobs[first + k]["array"] for k in range(5)] == [
        {"first": first, "index": k + 1, "limit": 2, "count": 5} for k in range(5)]
    shown = json.loads(d.ok("show", "--json", f"{first}_3", user=USERS["alice"]))
    assert shown["id"] == first + 2 and shown["array"]["index"] == 3
    text = d.ok("show", f"{first}_3", user=USERS["alice"])
    assert f"array: {first}_3 (index 3 of array {first}_*: 5 jobs, at most 2 at once)" in text.splitlines()
    # The plain piped listing keeps the spec's columns: the element is not one of them.
    rows = d.rows(user=USERS["alice"])
    assert sorted(rows) == list(range(first, first + 5)) and f"{first}_" not in "".join(rows.values())


def test_the_whole_array_shows_its_size_cap_and_states(capped):
    d, first = capped
    doc = json.loads(d.ok("show", "--json", f"{first}_*", user=USERS["alice"]))
    assert doc == {"first": first, "last": first + 4, "count": 5, "limit": 2, "user": USERS["alice"],
                   "name": None, "states": {"running": 2, "queued": 3}, "ids": list(range(first, first + 5))}
    text = d.ok("show", f"{first}_*", user=USERS["alice"]).splitlines()
    assert f"array: {first}_*" in text and f"jobs: 5 ({first}-{first + 4})" in text
    assert "at most at once: 2" in text and "states: 3 queued, 2 running" in text


def test_kill_one_element_then_the_whole_array_and_wait_on_it(capped):
    d, first = capped
    r = _alice(d, "kill", f"{first}_4")
    assert r.returncode == 0
    assert r.stdout.strip() == f"job {first + 3} cancelled (removed from the queue before it started)"
    states = {j: v["state"] for j, v in d.jobs("--finished", user=USERS["alice"]).items() if j >= first}
    assert states[first + 3] == "finished" and [states[first + k] for k in (0, 1, 2, 4)] == \
        ["running", "running", "queued", "queued"]
    r = _alice(d, "kill", f"{first}_*")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (f"{first}_*: 2 killed ({first}-{first + 1}); 2 cancelled "
                                f"({first + 2},{first + 4}); 1 had already ended ({first + 3})")
    w = _alice(d, "wait", "--json", f"{first}_*")
    entries = json.loads(w.stdout)["jobs"]
    assert [e["id"] for e in entries] == list(range(first, first + 5))
    assert all(e["state"] == "finished" for e in entries) and w.returncode != 0   # none exited 0


def test_wait_on_one_element_answers_for_it_alone(daemon_factory, users):
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    r = json.loads(d.ok("new", "--json", "--array", "0-4:2", "--no-output", "--", "sh", "-c",
                        "exit $HPC_BATCH_ARRAY_INDEX", user=USERS["bob"]))
    first = r["id"]
    w = d.dispatch("wait", "--json", f"{first}_2", user=USERS["bob"])
    assert w.returncode == 2 and [e["id"] for e in json.loads(w.stdout)["jobs"]] == [first + 1]
    assert d.dispatch("wait", f"{first}_0", user=USERS["bob"]).returncode == 0
    # An index it was not submitted with: said so, with the indices it has.
    r = d.dispatch("show", f"{first}_1", user=USERS["bob"])
    assert r.returncode == 3 and f"array {first} has no element with index 1 (3 jobs, indices 0 to 4)" in r.stderr


@pytest.mark.parametrize("word, says", [
    ("6_", "the element's index goes after the _"),
    ("_3", "the array's id goes before the _"),
    ("6_99999999", "array indices go from 0 to 10000000"),
    ("6_3_1", "one _ only"),
    ("0_1", "array ids are job ids"),
])
@pytest.mark.parametrize("verb", ["show", "kill", "wait"])
def test_a_malformed_reference_is_refused_before_the_daemon(daemon, verb, word, says):
    r = daemon.dispatch(verb, word, user=USERS["alice"])
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_whole_array_is_not_one_job(capped):
    d, first = capped
    for args in (("new", "--after", f"{first}_*", "--", "true"), ("show", "--record", f"{first}_*"),
                 ("job", f"{first}_*", "max-time", "get")):
        r = _alice(d, *args)
        assert r.returncode == 2 and "names a whole array" in r.stderr, (args, r.stderr)
    # ...and one element is: --after takes it.
    r = _alice(d, "new", "--after", f"{first}_5", "--no-output", "--", "true")
    assert r.returncode == 0, r.stderr


def test_not_an_array_and_another_users_array(capped):
    d, first = capped
    lone = d.submit("true", flags=("--no-output",), user=USERS["alice"])
    r = _alice(d, "show", f"{lone}_1")
    assert r.returncode == 3 and f"job {lone} is not an array's first job" in r.stderr
    r = _alice(d, "show", f"{first + 1}_*")
    assert r.returncode == 3 and f"it is element {first}_2" in r.stderr
    # bob is told what he is told of a job he may not see: nothing about alice's array.
    for word in (f"{first}_2", f"{first}_*"):
        r = d.dispatch("show", word, user=USERS["bob"])
        assert r.returncode == 3 and r.stderr.strip() == f"dispatch: no such job: {first}", r.stderr


def test_the_terminal_table_has_an_array_column(capped):
    d, first = capped
    rc, seen, err = on_terminal(d, "list", "--all", columns=120)
    assert rc == 0, err
    lines = seen.decode().splitlines()
    header = lines[0].split()
    assert header[:2] == ["ID", "ARRAY"]
    cells = {int(line.split()[0]): line.split()[1] for line in lines[1:]}
    assert cells == {first + k: f"{first}_{k + 1}" for k in range(5)}
    rc, seen, err = on_terminal(d, "list", "--all", "-o", "id,array,state", f"{first}_*", columns=120)
    assert rc == 0 and len(seen.decode().splitlines()) == 6, (seen, err)
    rc, seen, err = on_terminal(d, "list", "--all", "-o", "array", f"{first}_2", columns=120)
    assert rc == 0 and seen.decode().split() == ["ARRAY", f"{first}_2"], (seen, err)


def test_arrays_survive_a_restart(capped):
    d, first = capped
    d.stop()
    d.start()
    jobs = d.jobs(user=USERS["alice"])
    assert jobs[first + 4]["array"] == {"first": first, "index": 5, "limit": 2, "count": 5}
    assert json.loads(d.ok("show", "--json", f"{first}_5", user=USERS["alice"]))["id"] == first + 4
    doc = json.loads(d.ok("show", "--json", f"{first}_*", user=USERS["alice"]))
    assert doc["count"] == 5 and doc["limit"] == 2

"""What only the daemon can judge of a submit or a listing, said at once (issue 32, items 6, 7).

--after-ok naming a job that has already failed, --after naming one that does not exist, list
naming jobs it does not hold, and new --parsable, against a real hpc-batchd.
"""

def test_after_ok_a_job_that_already_failed_is_refused_at_submit(daemon):
    failed = daemon.submit("sh", "-c", "exit 3")
    daemon.wait_finished(failed)
    r = daemon.dispatch("new", "--after-ok", str(failed), "--", "true")
    assert r.returncode == 10, r
    assert f"--after-ok {failed}: job {failed} has already ended with exit 3, not 0" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    # --after takes it: it starts however that one ended.
    assert daemon.dispatch("new", "--after", str(failed), "--", "true").returncode == 0


def test_after_a_job_that_is_not_known_is_refused_naming_the_flag(daemon):
    r = daemon.dispatch("new", "--after", "99999", "--", "true")
    assert r.returncode == 3 and "--after 99999: no such job: 99999" in r.stderr, r


def test_list_says_which_named_jobs_it_cannot_list_and_why(daemon):
    done = daemon.submit("true")
    daemon.wait_finished(done)
    r = daemon.dispatch("list", str(done))
    assert r.returncode == 10 and f"job {done} has ended: add --finished to list it" in r.stderr, r
    assert daemon.dispatch("list", "--finished", str(done)).returncode == 0
    mine = daemon.submit("sleep", "60")
    r = daemon.dispatch("list", str(mine), "99999")
    assert r.returncode == 3, r
    assert f" {mine} " in r.stdout and r.stderr.strip() == "dispatch: no such job: 99999"
    r = daemon.dispatch("list", "abc")
    assert r.returncode == 3 and r.stdout == "" and r.stderr.startswith("dispatch: no job named 'abc'"), r
    daemon.ok("kill", str(mine))


def test_list_json_carries_the_named_jobs_it_lacks(daemon):
    import json
    r = daemon.dispatch("list", "--json", "99999")
    doc = json.loads(r.stdout)
    assert r.returncode == 3 and doc["jobs"] == []
    assert doc["errors"] == [{"job": "99999", "error": "no such job: 99999", "code": "not_found", "exit": 3}]


def test_new_parsable_prints_the_id_alone(daemon):
    out = daemon.ok("new", "--parsable", "--", "true").strip()
    assert out.isdigit()
    bulk = daemon.ok("new", "--parsable", "--array", "1-3", "--", "true").strip()
    first, last = map(int, bulk.split("-"))
    assert last - first == 2 and first > int(out)
    # The range is what list, kill and wait take.
    assert daemon.dispatch("wait", bulk).returncode == 0

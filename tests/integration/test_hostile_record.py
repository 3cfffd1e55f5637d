"""Hostile users against the record and its readers (the third review's G3, G4 and G5).

hpcb-alice plants terminal escapes where `dispatch show --record` and
`dispatch record diff` print them to an admin (an environment variable's
name, her working directory's name), and a file named like a job id where an
admin runs `record diff`. Each test runs the attack as alice and reads as
root, as the review did.
"""

import hashlib
import json
import os
import subprocess

import pytest
from conftest import USERS, wait_for
from test_hostile import as_user, shared_dir

pytestmark = pytest.mark.timeout(180)

ALICE = USERS["alice"]
ESC_NAME = "\x1b[2J\x1b[Hverdict: clean\x1b]0;owned\x07\nsoftware.executable.sha256: 0000 "
CONTROL = ("\x1b", "\x07", "\x9b")


def _clean(text):
    """No terminal control reached the output, and no forged line."""
    assert not any(c in text for c in CONTROL), repr(text[:2000])
    assert not any(line.startswith("software.executable.sha256: 0000") for line in text.splitlines())


def test_escapes_in_a_records_keys_and_words_never_reach_an_admins_terminal(daemon, users, scratch):
    d = daemon
    plain = shared_dir(scratch, "pad pad pad pad pad pad plain")
    odd = shared_dir(scratch, "pad pad pad pad pad pad \x1b]0;owned-by-cwd\x07\x1b[2K")
    a = d.submit("sh", "-c", "exit 3", flags=("--env", "--record-env", "--no-output"), user=ALICE, cwd=odd,
                 env={ESC_NAME: "x"})
    b = d.submit("sh", "-c", "exit 3", flags=("--no-output",), user=ALICE, cwd=plain)
    for job in (a, b):
        d.wait_finished(job, user=ALICE)
    shown = d.ok("show", "--record", str(a))
    assert "owned" in shown            # the key is there, escaped: \x1b]0;owned\x07 ...
    _clean(shown)
    diff = d.dispatch("record", "diff", str(a), str(b))
    assert diff.returncode in (0, 1) and "cwd" in diff.stdout, diff.stdout + diff.stderr
    _clean(diff.stdout)
    # --json keeps the values whole (JSON escapes them): the key is there as it was sent.
    record = json.loads(d.ok("show", "--record", "--json", str(a)))
    assert ESC_NAME in record["software"]["environment"]["values"]["value"]


def test_a_file_named_like_a_job_is_never_read_for_the_job(daemon, users, scratch):
    d = daemon
    work = shared_dir(scratch, "tmp")                       # a 1777 directory, like /tmp
    four = d.submit("true", flags=("--thp", "off", "--no-output"), user=ALICE, cwd=work)
    five = d.submit("true", flags=("--no-output",), user=ALICE, cwd=work)
    for job in (four, five):
        d.wait_finished(job, user=ALICE)
    honest = d.dispatch("record", "diff", str(four), str(five))
    assert honest.returncode == 1 and "thp" in honest.stdout, honest.stdout
    # Alice plants a copy of job 4's record under job 5's id where root will run the command.
    planted = os.path.join(work, str(five))
    copy = d.ok("show", "--record", "--json", str(four), user=ALICE)
    r = as_user(ALICE, "sh", "-c", f"cat > '{planted}'", input=copy)
    assert r.returncode == 0 and os.stat(planted).st_uid == users["alice"].pw_uid, r.stderr
    fooled = d.dispatch("record", "diff", str(four), str(five), cwd=work)
    assert fooled.returncode == 1 and fooled.stdout == honest.stdout, fooled.stdout
    # The file is still reachable, by a path.
    as_file = d.dispatch("record", "diff", str(four), f"./{five}", cwd=work)
    assert as_file.returncode == 0 and as_file.stdout.startswith("comparable"), as_file.stdout


def _executable(d, job):
    return json.loads(d.ok("show", "--record", "--json", str(job), user=ALICE))["software"]["executable"]


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_the_record_names_the_file_that_ran_when_the_first_on_path_cannot_be_executed(daemon, users, scratch):
    # G4: alice holds the first PATH entry's file open for writing (its exec fails, ETXTBSY) so that,
    # with execvpe's fallback, a second one ran while the record hashed the first.
    d = daemon
    work = shared_dir(scratch, "g4")
    a, b = os.path.join(work, "A"), os.path.join(work, "B")
    setup = (f"mkdir {a} {b} && cp /usr/bin/true {a}/bench && "
             f"printf '#!/bin/sh\\necho this is B/bench\\n' > {b}/bench && chmod +x {a}/bench {b}/bench")
    assert as_user(ALICE, "sh", "-c", setup).returncode == 0
    env = {"PATH": f"{a}:{b}:/usr/bin:/bin"}
    honest = d.submit("bench", flags=("--env",), user=ALICE, cwd=work, env=env)
    d.wait_finished(honest, user=ALICE)
    exe = _executable(d, honest)
    assert exe["value"]["path"] == f"{a}/bench" and exe["value"]["sha256"] == _sha256(f"{a}/bench"), exe
    st = os.stat(f"{a}/bench")
    assert exe["identity"]["executable"]["ino"] == st.st_ino and exe["identity"]["executable"]["dev"] == st.st_dev
    # The forged run: A/bench open for writing by alice's own process while the job starts.
    held, go = os.path.join(work, "held"), os.path.join(work, "go")
    holder = subprocess.Popen(["runuser", "-u", ALICE, "--", "sh", "-c",
                               f"exec 9>>{a}/bench; touch {held}; i=0; "
                               f"while [ ! -e {go} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"])
    try:
        wait_for(lambda: os.path.exists(held), what="alice's writer on A/bench")
        forged = d.submit("bench", flags=("--env",), user=ALICE, cwd=work, env=env)
        row = d.wait_finished(forged, user=ALICE)
    finally:
        open(go, "w").close()
        holder.wait(timeout=60)
    log = os.path.join(work, f"output.{forged}.log")
    text = wait_for(lambda: os.path.exists(log) and open(log).read(), what="the forged job's log")
    assert "this is B/bench" not in text and "Text file busy" in text, text
    assert "ETXTBSY" in row, row
    exe = _executable(d, forged)
    assert exe["value"] is None and "did not run" in exe["error"] and "ETXTBSY" in exe["error"], exe
    diff = d.dispatch("record", "diff", str(honest), str(forged), user=ALICE)
    assert diff.returncode == 1 and "executable" in diff.stdout, diff.stdout + diff.stderr
    # What does run is named, with its identity: B/bench (a script) and its interpreter.
    os.remove(f"{a}/bench")
    other = d.submit("bench", flags=("--env",), user=ALICE, cwd=work, env=env)
    d.wait_finished(other, user=ALICE)
    exe = _executable(d, other)
    assert exe["value"]["path"] == f"{b}/bench" and exe["value"]["sha256"] == _sha256(f"{b}/bench"), exe
    assert exe["value"]["interpreter"]["realpath"] == os.path.realpath("/bin/sh"), exe
    assert exe["identity"]["executable"]["ino"] == os.stat(f"{b}/bench").st_ino, exe
    assert d.dispatch("record", "diff", str(honest), str(other), user=ALICE).returncode == 1

"""Hostile users against the record's readers (the third review's G3 and G5).

hpcb-alice plants terminal escapes where `dispatch show --record` and
`dispatch record diff` print them to an admin (an environment variable's
name, her working directory's name), and a file named like a job id where an
admin runs `record diff`. Each test runs the attack as alice and reads as
root, as the review did.
"""

import json
import os

import pytest
from conftest import USERS
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

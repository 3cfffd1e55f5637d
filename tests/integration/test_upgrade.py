"""Upgrade safety: a state directory written by 0.1.0 (tests/data) loads in this version, and a newer
format than this version knows is refused."""

import json
import os
import shutil
import subprocess

import pytest
from conftest import Daemon, exit_of

from hpc_batch import __version__
from hpc_batch.daemon import formats

pytestmark = pytest.mark.timeout(120)
DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "state-0.1.0")


def test_state_written_by_0_1_0_loads_and_runs(daemon_factory, users, scratch):
    shutil.copytree(DATA, os.path.join(scratch, "state"))
    d = daemon_factory("--schedule", "easy-backfill", "--reserve-cpu", "0", "--reserve-mem", "0")
    assert "quarantine" not in d.log()
    rows = d.rows("--all", "--finished")
    assert sorted(rows) == [1, 2, 3, 4]
    assert exit_of(rows[1]) == "3"
    assert exit_of(rows[2]) == "killed"                 # collected from its shepherd's exit record
    assert exit_of(d.wait_finished(3)) == "4"           # the queued head runs
    assert exit_of(d.wait_finished(4)) == "5"           # with the environment stored for it
    assert d.submit("true", flags=("--no-output",)) == 5   # ids continue past the old ones


def test_a_journal_in_a_newer_format_is_refused_in_one_line(daemon_factory, users, scratch):
    # As after a downgrade: the daemon must not start on what it cannot read, nor replace it.
    d = daemon_factory()
    job = d.submit("true", flags=("--no-output",))
    d.wait_finished(job)
    d.stop()
    path = os.path.join(d.state_dir, "journal")
    with open(path, "rb") as f:
        first, rest = f.read().split(b"\n", 1)
    header = json.loads(first)
    assert header["format"] == formats.JOURNAL
    newer = json.dumps({**header, "format": formats.JOURNAL + 1}).encode() + b"\n" + rest
    with open(path, "wb") as f:
        f.write(newer)
    r = subprocess.run(Daemon(scratch, ()).command(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 78, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert path in line and f"journal format {formats.JOURNAL + 1} is newer" in line and __version__ in line
    with open(path, "rb") as f:
        assert f.read() == newer
    with open(path, "wb") as f:
        f.write(first + b"\n" + rest)
    assert job in daemon_factory().rows("--finished")

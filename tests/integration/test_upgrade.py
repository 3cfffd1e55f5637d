"""Upgrade safety: a state directory written by 0.1.0 (tests/data) loads in this version."""

import os
import shutil

import pytest
from conftest import exit_of

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

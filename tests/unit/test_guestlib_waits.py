"""The system tier's waits on the guest's unit: RestartSec comes from the unit file, and a window
that must hold fails at the first look that breaks it."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "system"))

from guestlib import holds, restart_sec  # noqa: E402


def test_restart_sec_is_the_units_own(tmp_path):
    unit = tmp_path / "hpc-batch.service"
    unit.write_text("[Service]\nRestart=on-failure\nRestartSec=7\nRestartPreventExitStatus=78\n")
    assert restart_sec(str(unit)) == 7.0
    assert restart_sec() > 0    # the real unit says it, once


def test_a_unit_without_one_plain_restart_sec_is_an_error(tmp_path):
    unit = tmp_path / "hpc-batch.service"
    unit.write_text("[Service]\nRestartSec=2\nRestartSec=3\n")
    with pytest.raises(AssertionError, match="want one RestartSec=N"):
        restart_sec(str(unit))


def test_holds_fails_at_the_first_look_that_breaks_it():
    looks = iter([True, True, False])
    with pytest.raises(AssertionError, match="quiet stopped holding"):
        holds(lambda: next(looks), 3600, interval=0, what="quiet")


def test_holds_returns_once_its_window_has_passed():
    assert holds(lambda: "still", 0, interval=0) == "still"

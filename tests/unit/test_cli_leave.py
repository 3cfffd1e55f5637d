"""dispatch's fast exit: what it printed is all there, with main's exit status."""

import subprocess
import sys

import pytest

CODE = ("import sys\nfrom hpc_batch.client.cli import leave\n"
        "print('out' * 10000, end='')\nprint('err', file=sys.stderr, end='')\nleave({code})\n")


@pytest.mark.parametrize("code,status", [(0, 0), (3, 3), (69, 69), (256 + 4, 4)])
def test_leave_flushes_and_exits_with_the_status(code, status):
    r = subprocess.run([sys.executable, "-c", CODE.format(code=code)], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (status, "out" * 10000, "err")


def test_a_status_that_is_not_a_number_takes_the_normal_exit():
    r = subprocess.run([sys.executable, "-c", CODE.format(code="'a message'")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and r.stderr == "erra message\n"

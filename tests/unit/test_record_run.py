"""The record's side tasks run nvidia-smi through sides.run: its status, output and deadline."""

import os
import sys

import shepherd
from shepherd.record import bounds, sides


def test_status_and_both_streams():
    status, out = sides.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert status == 3
    assert out.split() == ["out", "err"]


def test_a_signal_reads_as_minus_its_number():
    assert sides.run(["sh", "-c", "kill -9 $$"]) == (-9, "")


def test_a_missing_program_did_not_run():
    status, out = sides.run(["/nonexistent/nvidia-smi"])
    assert status == -1
    assert out == "cannot run /nonexistent/nvidia-smi: No such file or directory"


def test_past_its_deadline_it_is_killed():
    status, out = sides.run(["sleep", "60"], timeout=0.2)
    assert (status, out) == (-1, "sleep took longer than 0s")


def test_output_is_cut_to_the_record_bound():
    status, out = sides.run([sys.executable, "-c", f"print('x' * {bounds.MAX_BYTES * 2})"])
    assert status == 0
    assert out == "x" * bounds.MAX_BYTES


def test_the_fork_server_loads_no_subprocess_module():
    # The shepherd's modules, loaded the way the fork server loads them, leave out subprocess (and
    # threading): each shepherd would map them, for nvidia-smi alone.
    import subprocess
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import forkserver; "
            "print('subprocess' in sys.modules, 'threading' in sys.modules)")
    shepherd_dir = os.path.dirname(os.path.abspath(shepherd.__file__))
    out = subprocess.run([sys.executable, "-E", "-s", "-S", "-c", code, shepherd_dir],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.split() == ["False", "False"]

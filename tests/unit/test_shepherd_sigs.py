"""The shepherd's signal calls without the enum layer (shepherd/base/sigs.py), and a forked
shepherd's name written in place without ctypes (forkserver._set_cmdline)."""

import ast
import os
import signal
import subprocess
import sys
from pathlib import Path

from shepherd.base import sigs

SHEPHERD = Path(__file__).resolve().parents[2] / "shepherd"


def test_the_mask_comes_back_as_plain_ints_and_is_put_back():
    old = sigs.pthread_sigmask(sigs.SIG_BLOCK, (signal.SIGUSR1,))
    try:
        now = sigs.pthread_sigmask(sigs.SIG_BLOCK, ())
        assert signal.SIGUSR1 in now
        assert {type(s) for s in now} == {int}   # no enum member was made
    finally:
        sigs.pthread_sigmask(sigs.SIG_SETMASK, old)
    assert signal.SIGUSR1 not in sigs.pthread_sigmask(sigs.SIG_BLOCK, ())


def test_a_handler_runs_and_the_default_comes_back():
    seen = []
    old = sigs.signal(signal.SIGUSR2, lambda num, frame: seen.append(num))
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert seen == [signal.SIGUSR2]
        assert callable(sigs.signal(signal.SIGUSR2, sigs.SIG_DFL))
        assert sigs.signal(signal.SIGUSR2, sigs.SIG_DFL) == sigs.SIG_DFL
    finally:
        sigs.signal(signal.SIGUSR2, old)


def test_no_shepherd_module_calls_the_wrapped_functions():
    # signal.signal and signal.pthread_sigmask stay out of the shepherd (docs/performance.md, a ninth look).
    wrapped = {"signal", "pthread_sigmask"}
    found = []
    for path in sorted(SHEPHERD.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in wrapped and isinstance(node.value, ast.Name)
                    and node.value.id == "signal"):
                found.append(f"{path.relative_to(SHEPHERD)}:{node.lineno} signal.{node.attr}")
    assert found == []


NAMING = """
import os, sys
sys.path.insert(0, {shepherd!r})
import forkserver
if sys.argv[1] == "fallback":
    real = os.open
    def refuse(path, *args, **kwargs):
        if path == "/proc/self/mem":
            raise PermissionError(13, "refused for the test")
        return real(path, *args, **kwargs)
    os.open = refuse
forkserver._set_cmdline(["hpc-batch-shepherd", "--job", "7", "--user", "alice", "/x/jobs/7"], forkserver.argv_area())
with open("/proc/self/cmdline", "rb") as f:
    print(f.read().rstrip(b"\\0").decode().replace("\\0", " "))
print("ctypes" in sys.modules)
"""


def _named(way: str) -> list[str]:
    code = NAMING.format(shepherd=str(SHEPHERD))
    out = subprocess.run([sys.executable, "-E", "-s", "-S", "-c", code, way, " " * 64],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_a_shepherds_name_is_written_through_its_own_memory_file_without_ctypes():
    assert _named("mem") == ["hpc-batch-shepherd --job 7 --user alice /x/jobs/7", "False"]


def test_where_that_file_cannot_be_written_ctypes_writes_the_name():
    assert _named("fallback") == ["hpc-batch-shepherd --job 7 --user alice /x/jobs/7", "True"]

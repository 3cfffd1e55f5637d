"""dispatch list on a terminal (a table cut to its width), and piped (the plain rows, unchanged).

The real dispatch writes to a pseudo-terminal of a set width (TIOCSWINSZ, no
$COLUMNS), and the test reads what a screen would get.
"""

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from unittest.mock import ANY

import pytest
from conftest import DISPATCH

from hpc_batch.client.listtable import COLUMNS, cell_width

pytestmark = pytest.mark.timeout(120)

LONG = "echo" + " a-rather-long-argument" * 12


def on_terminal(d, *args, columns=80, timeout=30.0):
    """``dispatch ARGS`` with stdin and stdout on a terminal *columns* wide: (exit status, the
    bytes the terminal got, stderr)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "TERM": "xterm",
           "HPC_BATCH_SOCKET": d.socket}
    proc = subprocess.Popen([DISPATCH, *args], stdin=slave, stdout=slave, stderr=subprocess.PIPE, env=env,
                            cwd=d.base)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"dispatch {args} did not finish writing: {seen[-2000:]!r}"
            ready, _, _ = select.select([master], [], [], left)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:   # EIO: the last writer has closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        rc = proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        os.close(master)
    return rc, seen, proc.stderr.read().decode()


@pytest.fixture
def three(daemon_factory, users):
    """One job finished (exit 3), one named and running with a long command, one queued behind it
    whose command holds an escape sequence and wide characters: (daemon, finished, running, queued)."""
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    done = d.submit("sh", "-c", "exit 3", flags=("--no-output",))
    d.wait_finished(done)
    running = d.submit("sh", "-c", f"sleep 60; {LONG}", flags=("--name", "prep", "--cpu", "2", "--no-output",
                                                               "--max-time", "1h30m"))
    d.wait_running(running)
    queued = d.submit("printf", "\x1b[2J漢字", flags=("--max-mem", "512M", "--max-time", "1h", "--no-output"))
    yield d, done, running, queued
    d.ok("kill", str(running))


def test_on_a_terminal_a_header_aligned_columns_and_the_command_cut_to_the_width(three):
    d, done, running, queued = three
    rc, seen, err = on_terminal(d, "list", columns=90)
    assert rc == 0, err
    assert b"\x1b" not in seen                                # the job's escape is shown, never sent
    lines = seen.decode().replace("\r\n", "\n").splitlines()
    assert lines[0].split() == ["ID", "STATE", "NAME", "START", "TIME", "MAX-TIME", "MEM", "CPUS", "GPUS",
                                "COMMAND"]
    assert len(lines) == 3 and all(cell_width(line) <= 90 for line in lines)
    rows = {int(line.split()[0]): line for line in lines[1:]}
    assert set(rows) == {running, queued}
    run = rows[running].split()
    assert run[1:3] == ["running", "prep"] and "[prep]" not in rows[running]
    assert re.fullmatch(r"\d+:\d\d", run[4]) and run[5] == "1h30m"
    # The command starts in the header's COMMAND column, in every row, and the long one is cut.
    at = lines[0].index("COMMAND")
    assert rows[running][at:].startswith("sh -c 'sleep 60; echo a-") and rows[running].endswith("...")
    assert cell_width(rows[running]) == 90
    assert rows[queued][at:] == "printf '\\x1b[2J漢字'"
    q = rows[queued].split()
    assert q[1:5] == ["queued", "-", "-", "-"] and q[5:7] == ["1h", "512M"]


def test_on_a_terminal_finished_jobs_add_their_exit(three):
    d, done, running, queued = three
    rc, seen, err = on_terminal(d, "list", "--finished", columns=400)
    assert rc == 0, err
    lines = seen.decode().replace("\r\n", "\n").splitlines()
    header = lines[0].split()
    assert header[-3:] == ["EXIT", "COMMAND", "NOTE"]
    row = next(line for line in lines if line.split()[0] == str(done))
    assert row.split()[1] == "finished" and row[lines[0].index("EXIT"):].split()[0] == "3"
    assert row[lines[0].index("COMMAND"):].startswith("sh -c 'exit 3'")
    # Wide enough for the whole command: nothing cut.
    assert LONG in next(line for line in lines if line.split()[0] == str(running))


def test_piped_the_plain_rows_are_unchanged(three):
    d, done, running, queued = three
    out = d.ok("list", "--finished")
    lines = out.splitlines()
    assert len(lines) == 3 and not lines[0].startswith("ID")
    rows = {int(line.split()[1]): line for line in lines}
    assert rows[queued] == f"root {queued} printf '\\x1b[2J漢字' - queued 1h 512M no - - queued -"
    assert re.fullmatch(rf"root {running} \[prep\]sh -c 'sleep 60; {LONG}' "
                        rf"\d\d:\d\d:\d\d \d+:\d\d:\d\d 1h30m \S+ no \S+ - running -", rows[running]), rows[running]
    assert re.fullmatch(rf"root {done} sh -c 'exit 3' \d\d:\d\d:\d\d \d+:\d\d:\d\d \S+ \S+ no \S+ -"
                        rf"( cpu \S+ peak \S+( \w+)?)? finished 3", rows[done]), rows[done]


def test_format_picks_columns_piped_too_and_no_header_drops_the_header(three):
    d, done, running, queued = three
    digits = len(str(max(running, queued)))
    width = max(digits, len("ID"))
    out = d.ok("list", "--format", "id,name,STATE")
    assert out.splitlines() == [f"{'ID':>{width}} NAME STATE", f"{running:>{width}} prep running",
                                f"{queued:>{width}} -    queued"]
    out = d.ok("list", "-o", "state,id", "--no-header", str(queued))
    assert out == f"queued {queued}\n"
    # Piped, nothing is cut, however long.
    out = d.ok("list", "--format=command", str(running))
    assert out.splitlines()[1] == f"sh -c 'sleep 60; {LONG}'"
    rc, seen, err = on_terminal(d, "list", "--format", "user,id", "--no-header", columns=40)
    assert rc == 0 and seen.decode().replace("\r\n", "\n").split("\n") == [f"root {running:>{digits}}",
                                                                           f"root {queued:>{digits}}", ""]


@pytest.mark.parametrize("args, says", [
    (("--format", "id,bogus"), "unknown column 'bogus'"),
    (("-o", "id,,state"), "an empty column name"),
    (("--format", "id", "--json"), "--json prints every field"),
    (("--no-header", "--json"), "--json prints every field"),
])
def test_a_bad_format_is_refused_before_the_daemon_is_asked(daemon, args, says):
    # Against a socket that is not there: the refusal comes first, so it is the client's own.
    r = daemon.dispatch("list", *args, env={"HPC_BATCH_SOCKET": os.path.join(daemon.base, "none.sock")})
    assert r.returncode == 2
    if "--json" in args:   # refused as --json refuses: one JSON document
        assert json.loads(r.stdout) == {"ok": False, "code": "usage", "exit": 2, "error": ANY}
        assert says in json.loads(r.stdout)["error"] and r.stderr == ""
        return
    assert r.stdout == "" and r.stderr.count("\n") == 1 and says in r.stderr
    if "column" in says:
        assert ",".join(COLUMNS) in r.stderr

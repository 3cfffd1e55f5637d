"""dispatch status on a terminal: the labelled view, the machine map, --watch; and piped, as before.

The real dispatch runs on a pseudo-terminal (pty.fork, as tests/unit/test_completion.py
drives bash and zsh), as a real user, under a small wrapper that reports, once
dispatch has exited, its exit status and whether the terminal is back in its
usual modes (echo, line editing). What it wrote is read as the screen would
get it, escapes and all.
"""

import fcntl
import json
import os
import pty
import re
import select
import struct
import sys
import termios
import time

import pytest
from conftest import DISPATCH

pytestmark = pytest.mark.timeout(120)

ENTER, LEAVE = b"\x1b[?1049h", b"\x1b[?1049l"     # the alternate screen, in and out
# Runs dispatch (argv[1:]) with SIGINT as usual, itself deaf to it (a Ctrl-C is for dispatch),
# then says how it ended and the terminal's modes.
WRAPPER = """import signal, subprocess, sys, termios
signal.signal(signal.SIGINT, signal.SIG_IGN)
rc = subprocess.Popen(sys.argv[1:], preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)).wait()
lflag = termios.tcgetattr(0)[3]
print(f"WRAPPER rc={rc} echo={bool(lflag & termios.ECHO)} icanon={bool(lflag & termios.ICANON)}")
"""


class Screen:
    """``dispatch ARGS`` on a pseudo-terminal of *rows* x *columns*, as *pw*'s user."""

    def __init__(self, pw, socket, args, env=(), rows=40, columns=120):
        environ = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TERM": "xterm", "HOME": pw.pw_dir,
                   "HPC_BATCH_SOCKET": socket, **dict(env)}
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
                os.chdir(pw.pw_dir)
                os.setgroups([])
                os.setgid(pw.pw_gid)
                os.setuid(pw.pw_uid)
                os.execve(sys.executable, [sys.executable, "-c", WRAPPER, DISPATCH, *args], environ)
            finally:
                os._exit(127)
        self.seen = b""

    def _read(self, left: float) -> bool:
        """Read what is there within *left* seconds; False once the terminal is closed."""
        ready, _, _ = select.select([self.fd], [], [], max(left, 0))
        if ready:
            try:
                data = os.read(self.fd, 65536)
            except OSError:   # EIO: every process on the terminal is gone
                return False
            if not data:
                return False
            self.seen += data
        return True

    def expect(self, pattern: bytes, timeout: float = 30.0) -> re.Match:
        """Read until everything written so far matches *pattern*."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.seen)
            if found:
                return found
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} on the screen: {self.seen[-3000:]!r}"
            assert self._read(left), f"the terminal closed; no {pattern!r} in {self.seen[-3000:]!r}"

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def finish(self, timeout: float = 30.0) -> tuple[int, bool, bool]:
        """Read to the end; dispatch's exit status and whether echo and line editing are back on."""
        deadline = time.monotonic() + timeout
        while self._read(deadline - time.monotonic()):
            assert time.monotonic() < deadline, f"dispatch did not end: {self.seen[-3000:]!r}"
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        assert os.waitstatus_to_exitcode(status) == 0, self.seen[-3000:]
        m = re.search(rb"WRAPPER rc=(-?\d+) echo=(\w+) icanon=(\w+)", self.seen)
        assert m, self.seen[-3000:]
        return int(m.group(1)), m.group(2) == b"True", m.group(3) == b"True"


@pytest.fixture
def running(daemon_factory, users):
    """A daemon offering both CPUs of this host, and one of alice's jobs running on one: (daemon, job, cpu)."""
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    alice = users["alice"]
    job = d.submit("sleep", "120", flags=("--cpu", "1", "--no-output"), user=alice.pw_name, cwd=alice.pw_dir)
    d.wait_running(job, user=alice.pw_name)
    held = json.loads(d.ok("status", "--json", user=alice.pw_name))["map"]["jobs"]
    assert [j["id"] for j in held] == [job]
    yield d, job, held[0]["cpus"][0]
    d.ok("kill", str(job))


def cell(cpu: int, label: str) -> bytes:
    """A CPU's cell in the map, colour or not: its number, a mark or a blank, then its holder."""
    return rb"(?<![0-9])" + str(cpu).encode() + rb"[ H~] " + re.escape(label.encode())


def test_on_a_terminal_the_view_is_labelled_and_the_map_shows_the_job_on_its_cpu(running, users):
    d, job, cpu = running
    screen = Screen(users["alice"], d.socket, ["status"])
    screen.expect(rb"NODE +RESOURCE +TOTAL +RESERVED +IN USE +FREE")
    screen.expect(rb"NUMA node 0")
    screen.expect(cell(cpu, f"#{job} hpcb-alice"))
    assert screen.finish() == (0, True, True)
    assert b"\x1b[1m" in screen.seen and ENTER not in screen.seen      # coloured; no full-screen mode
    assert not re.search(rb"\d+/\d+/\d+/\d+", screen.seen)           # no packed cells


def test_no_color_keeps_every_escape_off_the_terminal(running, users):
    d, job, cpu = running
    screen = Screen(users["alice"], d.socket, ["status"], env={"NO_COLOR": "1"})
    screen.expect(cell(cpu, f"#{job} hpcb-alice"))
    assert screen.finish() == (0, True, True)
    assert b"\x1b" not in screen.seen


def test_watch_redraws_until_q_and_leaves_the_terminal_as_it_was(running, users):
    d, job, cpu = running
    screen = Screen(users["alice"], d.socket, ["status", "--watch", "--interval", "0.5"])
    screen.expect(rb"(?s)" + re.escape(ENTER) + rb".*" + cell(cpu, f"#{job} hpcb-alice"))
    screen.expect(rb"dispatch status --watch: every 0.5s; q quits")
    # Redrawn in place while it runs: wait for a further frame (counted, not timed).
    drawn = screen.seen.count(b"\x1b[H")
    screen.expect(rb"(?s)(?:\x1b\[H.*){%d}" % (drawn + 1))
    screen.type(b"q")
    assert screen.finish() == (0, True, True)
    assert screen.seen.rindex(LEAVE) > screen.seen.rindex(ENTER)


def test_watch_ends_cleanly_on_ctrl_c(running, users):
    d, job, cpu = running
    screen = Screen(users["alice"], d.socket, ["status", "--watch"])
    screen.expect(rb"(?s)" + re.escape(ENTER) + rb".*" + cell(cpu, f"#{job} hpcb-alice"))
    screen.type(b"\x03")
    assert screen.finish() == (0, True, True)
    assert LEAVE in screen.seen.split(ENTER, 1)[1]


def test_another_user_sees_busy_and_an_admin_sees_whose(running, users):
    d, job, cpu = running
    bob = d.ok("status", "--map", user=users["bob"].pw_name)
    assert re.search(rf"(?<![0-9]){cpu}[ H~] busy", bob), bob
    assert "hpcb-alice" not in bob and f"#{job}" not in bob
    admin = d.ok("status", "--map", user=users["admin"].pw_name)
    assert re.search(cell(cpu, f"#{job} hpcb-alice").decode(), admin), admin


def test_piped_status_keeps_its_plain_lines(running, users):
    d, job, cpu = running
    out = d.ok("status", user=users["alice"].pw_name)
    assert out.startswith("policy ") and "cpus total/reserved/in use/free" in out
    assert "MACHINE" not in out and "\x1b" not in out
    mapped = d.ok("status", "--map", user=users["alice"].pw_name)
    assert "\x1b" not in mapped and re.search(cell(cpu, f"#{job} hpcb-alice").decode(), mapped)


@pytest.mark.parametrize("args, said", [
    (("--watch",), "--watch needs a terminal"),
    (("--watch", "--interval", "0"), "--interval '0': expected 0.5 to 3600 seconds"),
    (("--watch", "--interval", "abc"), "--interval 'abc': expected seconds"),
    (("--interval", "2"), "unexpected argument '--interval'"),   # only with --watch
    (("--map", "--json"), "unexpected argument '--map'"),
])
def test_bad_status_flags_are_usage_errors(daemon, args, said):
    r = daemon.dispatch("status", *args)
    assert r.returncode == 2 and said in r.stderr, r

"""A throwaway hpc-batchd on scratch paths, and the clients that talk to it.

Each daemon runs under ``--no-cgroups`` with its socket, state and dev
directories below one scratch directory, offers every CPU it is allowed
(``--reserve-cpu 0 --reserve-mem 0``), and is started from the venv that runs
this code, as is every ``dispatch``. Most figures drive it with the real
``dispatch``; what a client process would be too slow or too coarse for
(polling for idleness, filling a queue) goes over the socket with the
project's own framing.
"""

from __future__ import annotations

import grp
import os
import socket
import subprocess
import sys
import time
from typing import Any

from hpc_batch import defaults
from hpc_batch.wire import framing, messages

from .procs import kill_under, processes

BIN = os.path.dirname(sys.executable)
PYTHON = sys.executable
DISPATCH = os.path.join(BIN, "dispatch")
DAEMON = os.path.join(BIN, "hpc-batchd")


class DaemonError(RuntimeError):
    """A scratch daemon would not start, answer or do what was asked."""


def admin_group() -> str | None:
    """The first admin group the installer would pick that exists here, else root's group."""
    for name in (*defaults.ADMIN_GROUP_CANDIDATES, "root"):
        try:
            grp.getgrnam(name)
            return name
        except KeyError:
            continue
    return None


def timed(argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> float:
    """Wall seconds of one run of *argv*, from just before the fork to its exit; failure raises."""
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True)
    took = time.perf_counter() - t0
    if r.returncode != 0:
        err = (r.stderr or r.stdout).decode(errors="replace").strip()
        raise DaemonError(f"{' '.join(argv)} exited {r.returncode}: {err}")
    return took


class ScratchDaemon:
    """One hpc-batchd with everything below *directory*; *cpus* pins it (and so its offer)."""

    def __init__(self, directory: str, cpus: set[int] | None = None, args: tuple[str, ...] = ()):
        self.dir = directory
        self.cpus = cpus
        self.args = args
        self.sock = os.path.join(directory, "sock")
        self.state = os.path.join(directory, "state")
        self.log = os.path.join(directory, "daemon.log")
        self.work = os.path.join(directory, "work")  # the jobs' cwd, and where their logs land
        os.makedirs(self.work, exist_ok=True)
        os.chmod(directory, 0o755)
        self.env = {"PATH": os.environ.get("PATH", defaults.DEFAULT_PATH), "LANG": "C.UTF-8",
                    defaults.SOCKET_ENV: self.sock}
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        argv = [DAEMON, "--no-cgroups", "--socket", self.sock, "--state-dir", self.state,
                "--dev-dir", os.path.join(self.dir, "dev")]
        for flag in ("--reserve-cpu", "--reserve-mem"):   # 0 unless *args* names its own (given once only)
            if flag not in self.args:
                argv += [flag, "0"]
        group = admin_group()
        return argv + (["--admin-group", group] if group else []) + list(self.args)

    def spawn(self) -> None:
        """Start the daemon process and return at once."""
        cpus = self.cpus
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=self.dir,
                start_new_session=True,  # its shepherds outlive a kill -9 of it, as under systemd
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)

    def start(self, timeout: float = 60.0) -> ScratchDaemon:
        """Start it and wait until it answers a list request."""
        self.spawn()
        self.wait_serving(lambda reply: True, timeout)
        return self

    def wait_serving(self, ready: Any, timeout: float = 60.0, poll: float = 0.002) -> float:
        """Poll with list requests until one is answered and *ready*(reply) holds; perf_counter then."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise DaemonError(f"hpc-batchd exited {self.proc.returncode}:\n{self.log_text()[-2000:]}")
            try:
                reply = self.call("list", all=True, finished=False)
                if reply.get("ok") and ready(reply):
                    return time.perf_counter()
            except OSError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise DaemonError(f"hpc-batchd did not serve within {timeout:.0f} s:\n{self.log_text()[-2000:]}")
            time.sleep(poll)

    def fork_server(self) -> int | None:
        """The pid of its shepherd fork server (None: it has none now)."""
        if self.proc is None:
            return None
        return next((pid for pid, ppid, argv in processes() if ppid == self.proc.pid and "--fork-server" in argv),
                    None)

    def offered_cpus(self) -> int:
        """CPUs the daemon offers to jobs (from its status)."""
        st = self.call("status")["result"]
        return sum(n["cpus"]["total"] - n["cpus"]["reserved"] for n in st["nodes"])

    def log_text(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def kill9(self) -> None:
        """SIGKILL the daemon alone; its shepherds and jobs carry on."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

    def stop(self) -> None:
        """Stop the daemon first (so it starts nothing more), then everything it left running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill9()
        kill_under(self.dir)

    # --- the socket --------------------------------------------------------

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """One request and its reply."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(self.sock)
            s.sendall(framing.encode(messages.request(op, **args)))
            return _replies(s, 1)[0]

    def counts(self) -> dict[str, int]:
        """Running, queued and waiting jobs, from the daemon's status."""
        reply = self.call("status")
        if not reply.get("ok"):
            raise DaemonError(f"status failed: {reply.get('error')}")
        jobs: dict[str, int] = reply["result"]["jobs"]
        return jobs

    def wait_idle(self, timeout: float = 600.0, poll: float = 0.002) -> float:
        """Poll until nothing is running, queued or waiting; perf_counter when first seen."""
        deadline = time.monotonic() + timeout
        while any(self.counts().values()):
            if time.monotonic() > deadline:
                raise DaemonError(f"jobs still active after {timeout:.0f} s: {self.counts()}")
            time.sleep(poll)
        return time.perf_counter()

    def submit_many(self, argv: list[str], n: int, batch: int = 200) -> None:
        """Queue *n* copies of a ``--no-output`` job over one connection, *batch* pipelined at a time."""
        body = framing.encode(messages.request(
            "new", argv=argv, cwd=self.work, no_output=True, umask=0o022,
            base_env={"PATH": self.env["PATH"], "LANG": self.env["LANG"]}))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(self.sock)
            left = n
            while left:
                k = min(batch, left)
                s.sendall(body * k)
                for r in _replies(s, k):
                    if not r.get("ok"):
                        raise DaemonError(f"the daemon refused a job: {r.get('error')}")
                left -= k

    # --- the real client -----------------------------------------------------

    def dispatch(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``dispatch ARGS`` against this daemon, in its work directory."""
        r = subprocess.run([DISPATCH, *args], env=self.env, cwd=self.work, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True)
        if check and r.returncode != 0:
            raise DaemonError(f"dispatch {' '.join(args)} exited {r.returncode}: {(r.stderr or r.stdout).strip()}")
        return r

    def timed(self, *args: str) -> float:
        """Wall seconds of ``dispatch ARGS``, which must succeed."""
        return timed([DISPATCH, *args], env=self.env, cwd=self.work)

    def submit(self, *args: str) -> int:
        """``dispatch new ARGS``; the new job's id."""
        out = self.dispatch("new", *args).stdout
        words = out.split()
        if len(words) < 2 or words[0] != "job" or not words[1].isdigit():
            raise DaemonError(f"cannot read a job id from {out.strip()!r}")
        return int(words[1])


def _replies(s: socket.socket, n: int) -> list[dict[str, Any]]:
    dec, out = framing.Decoder(framing.MAX_REPLY), list[dict[str, Any]]()
    while len(out) < n:
        msg = dec.next()
        if msg is not None:
            out.append(msg)
            continue
        data = s.recv(1 << 20)
        if not data:
            raise DaemonError(f"the daemon closed the connection after {len(out)} of {n} replies")
        dec.feed(data)
    return out

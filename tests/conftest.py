"""Shared fixtures: real daemons on scratch paths, real users, the real CLI.

Integration tests start ``hpc-batchd`` from the test venv (``--no-cgroups``:
this host cannot show cgroup v2; the system tier in tests/system does) and
drive it with the ``dispatch`` entry point, as root or as real users created
with ``useradd``. Scratch directories live under /tmp with mode 0755 so the
test users can reach their submit directories.
"""

import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

# A runner started as a background job of a non-interactive shell (`bash .ci/run &`) ignores SIGINT,
# and an ignored signal stays ignored across exec: every `dispatch` and `scripts/try` a test starts
# would then shrug off the Ctrl-C the test sends. A handler here is reset to the default at each
# exec, so the tests' children see Ctrl-C as they would from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

BIN = os.path.dirname(sys.executable)
DISPATCH = os.path.join(BIN, "dispatch")
DAEMON = os.path.join(BIN, "hpc-batchd")

ADMIN_GROUP = "hpcb-admins"
USERS = {"alice": "hpcb-alice", "bob": "hpcb-bob", "admin": "hpcb-admin"}


def wait_for(predicate, timeout=15.0, interval=0.02, what="condition", backoff=None):
    """Poll *predicate* until it returns a truthy value or the deadline passes.

    With *backoff*, the pause doubles from *interval* up to *backoff* seconds: for a predicate that
    costs a process (a dispatch), which a slow wait should not run fifty times a second.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
        if backoff is not None:
            interval = min(interval * 2, backoff)


def _ensure_group(name):
    try:
        grp.getgrnam(name)
    except KeyError:
        subprocess.run(["groupadd", name], check=True)


def _ensure_user(name, groups=()):
    try:
        pwd.getpwnam(name)
    except KeyError:
        cmd = ["useradd", "-m", "-s", "/bin/sh"]
        if groups:
            cmd += ["-G", ",".join(groups)]
        subprocess.run(cmd + [name], check=True)
    return pwd.getpwnam(name)


@pytest.fixture(scope="session")
def users():
    """Two job users and one admin (member of the admin group); needs root."""
    if os.geteuid() != 0:
        pytest.fail("the integration tests create real users and must run as root (CI does)")
    _ensure_group(ADMIN_GROUP)
    out = {}
    for role, name in USERS.items():
        out[role] = _ensure_user(name, (ADMIN_GROUP,) if role == "admin" else ())
    return out


@pytest.fixture
def scratch():
    """A world-traversable scratch directory, removed afterwards."""
    d = tempfile.mkdtemp(prefix="hpcb-test-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Daemon:
    """One hpc-batchd on scratch paths, and a dispatch runner pointed at it."""

    def __init__(self, base, args=(), as_user=None, env=None, wrap=(), pass_fds=()):
        self.base = base
        self.wrap = list(wrap)          # a command the daemon runs under (e.g. prlimit ...)
        self.pass_fds = tuple(pass_fds)  # descriptors the daemon inherits, as from a careless shell
        self.socket = os.path.join(base, "run", "hpc-batch.sock")
        self.state_dir = os.path.join(base, "state")
        self.dev_dir = os.path.join(base, "dev")
        self.log_path = os.path.join(base, "daemon.log")
        self.args = list(args)
        self.as_user = as_user
        self.env = env
        self.proc = None

    def command(self):
        argv = [DAEMON, "--socket", self.socket, "--state-dir", self.state_dir]
        if "--no-dev-dir" not in self.args and not any(a.startswith("--dev-dir") for a in self.args):
            argv += ["--dev-dir", self.dev_dir]
        if not any(a.startswith("--admin-group") for a in self.args):
            argv += ["--admin-group", ADMIN_GROUP]
        if "--cgroups" in self.args:
            self.args.remove("--cgroups")
        elif "--no-cgroups" not in self.args:
            argv.append("--no-cgroups")
        argv += self.args
        if self.as_user:
            argv = ["runuser", "-u", self.as_user, "--"] + argv
        return self.wrap + argv

    def start(self, wait=True):
        os.makedirs(os.path.dirname(self.socket), exist_ok=True)
        os.chmod(os.path.dirname(self.socket), 0o755)
        log = open(self.log_path, "ab")
        if self.as_user:  # a user-mode daemon owns its scratch paths
            pw = pwd.getpwnam(self.as_user)
            for p in (self.base, os.path.dirname(self.socket), self.log_path):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        env = dict(os.environ, **(self.env or {}))
        env.pop("NOTIFY_SOCKET", None)
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log, env=env,
                                     start_new_session=True, pass_fds=self.pass_fds)
        log.close()
        if wait:
            wait_for(lambda: self.proc.poll() is not None or self.ping(), timeout=20, what="daemon to answer")
            assert self.proc.poll() is None, f"daemon exited {self.proc.returncode}:\n{self.log()}"
        return self

    def ping(self):
        import socket
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def dispatch(self, *args, user=None, cwd=None, env=None, timeout=60, input=None, on_timeout=None):
        """Run the real dispatch (as *user*, a passwd name, if given).

        *on_timeout*, if given, is called with the client's pid when *timeout* passes, before the client
        is killed and TimeoutExpired raised: a test can look at where it is stuck.
        """
        full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
                    "HPC_BATCH_SOCKET": self.socket}
        full_env.update(env or {})
        argv = [DISPATCH, *args]
        if user:
            argv = ["runuser", "-u", user, "--", "env", *[f"{k}={v}" for k, v in full_env.items()], *argv]
            run_env = None
        else:
            run_env = full_env
        if on_timeout is None:
            return subprocess.run(argv, cwd=cwd or self.base, env=run_env, capture_output=True,
                                  text=True, timeout=timeout, input=input)
        with subprocess.Popen(argv, cwd=cwd or self.base, env=run_env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
            try:
                out, err = proc.communicate(input, timeout=timeout)
            except subprocess.TimeoutExpired:
                on_timeout(proc.pid)
                for pid in [*descendants(proc.pid), proc.pid]:   # runuser's dispatch too, not runuser alone
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                proc.wait()
                raise
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def ok(self, *args, **kw):
        """dispatch that must succeed; returns stdout."""
        r = self.dispatch(*args, **kw)
        assert r.returncode == 0, f"dispatch {args} failed ({r.returncode}): {r.stderr}\n--- daemon log:\n{self.log()}"
        return r.stdout

    def submit(self, *cmd, flags=(), **kw) -> int:
        """Submit a job and return its id."""
        out = self.ok("new", *flags, "--", *cmd, **kw)
        assert out.startswith("job "), out
        return int(out.split()[1])

    def rows(self, *flags, **kw):
        """The human ``dispatch list`` rows keyed by job id: for tests of what that listing says.

        To learn a job's state, use jobs() (``list --json``); to wait for one, wait_running() or
        wait_finished().
        """
        out = self.ok("list", *flags, **kw)
        rows = {}
        for line in out.splitlines():
            parts = line.split()
            rows[int(parts[1])] = line
        return rows

    def jobs(self, *flags, **kw):
        """``dispatch list --json``: each job's fields (names in docs) keyed by job id."""
        return {j["id"]: j for j in json.loads(self.ok("list", "--json", *flags, **kw))["jobs"]}

    def wait_running(self, job_id, timeout=15, **kw):
        """Until the job runs; returns its ``list --json`` fields."""
        def running():
            job = self.jobs(**kw).get(job_id)
            return job if job is not None and job["state"] == "running" else None
        return wait_for(running, timeout=timeout, interval=0.02, backoff=0.2, what=f"job {job_id} to run")

    def wait_finished(self, job_id, timeout=30, **kw):
        """``dispatch wait`` for the job, within *timeout* seconds; returns its ``list --finished`` row."""
        try:
            r = self.dispatch("wait", "--json", str(job_id), timeout=timeout, **kw)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"timed out after {timeout}s waiting for job {job_id} to finish\n"
                                 f"--- daemon log:\n{self.log()}") from None
        try:
            answer = json.loads(r.stdout)
        except ValueError:
            raise AssertionError(f"dispatch wait {job_id} failed ({r.returncode}): {r.stderr}\n"
                                 f"--- daemon log:\n{self.log()}") from None
        row = self.rows("--finished", str(job_id), **kw).get(job_id)
        assert row is not None and " finished " in row, (answer, row)
        return row

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig) if sig == signal.SIGKILL else self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill9(self):
        """SIGKILL the daemon alone (its shepherds are in their own sessions)."""
        self.proc.kill()
        self.proc.wait()


def descendants(root: int) -> list[int]:
    """The pids of *root*'s descendants, children first (read from /proc at one moment)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def exit_of(row: str) -> str:
    """The <exit> column of a finished row (the word after 'finished')."""
    parts = row.split()
    return parts[parts.index("finished") + 1]


def _shepherds_under(base):
    """Pids of shepherds whose job directory lives under *base*."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if any(b"hpc-batch-shepherd" in c for c in cmd) and any(c.startswith(base.encode()) for c in cmd):
            found.append(int(pid))
    return found


def kill_shepherds(base):
    """End every shepherd and job whose job directory lives under *base* (test cleanup).

    Shepherds get SIGTERM, which makes each stop its own job; what is left
    gets SIGKILL, and a job whose shepherd is gone is killed only through a
    pidfd that proves it is still that job (never a stale pid).
    """
    import glob

    from hpc_batch.daemon import launcher
    for pid in _shepherds_under(base):
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + 10
    while _shepherds_under(base) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in _shepherds_under(base):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for status in glob.glob(os.path.join(base, "*", "jobs", "*", "status.json")):
        launcher.kill_orphaned_job(os.path.dirname(status))


@pytest.fixture
def daemon_factory(scratch):
    """Start daemons on the same scratch paths; all stopped at the end."""
    started = []

    def make(*args, as_user=None, env=None, start=True, wrap=(), pass_fds=()):
        d = Daemon(scratch, args, as_user=as_user, env=env, wrap=wrap, pass_fds=pass_fds)
        started.append(d)
        return d.start() if start else d

    yield make
    for d in started:
        d.stop()
    kill_shepherds(scratch)


@pytest.fixture
def daemon(daemon_factory, users):
    """A root-mode --no-cgroups daemon with the test admin group."""
    return daemon_factory()

"""dispatch new --notify: the command runs as the user, bounded; the line reaches only the user's own terminals.

The terminal tests register ptys in the real utmp (``/run/utmp``, as login(1)
would, and as ``who`` then shows them) and take their records out again
afterwards; the hanging-command tests start a shepherd by hand with a short
notify limit, since the daemon's is the fixed ``notifytext.LIMIT``.
"""

import json
import os
import select
import signal
import stat
import subprocess

import pytest
from conftest import exit_of, wait_for

from hpc_batch.daemon import launcher
from shepherd.base import notifytext, records

pytestmark = pytest.mark.timeout(180)


def _user_dir(scratch, user, name="sub"):
    path = os.path.join(scratch, name)
    os.mkdir(path)
    os.chown(path, user.pw_uid, user.pw_gid)
    return path


def _read_when_written(path, what):
    """The file's text once the notifier has finished it (it ends with a line 'end')."""
    def done():
        try:
            with open(path) as f:
                text = f.read()
        except FileNotFoundError:
            return None
        return text if text.endswith("end\n") else None
    return wait_for(done, timeout=30, what=what)


def test_the_command_runs_as_the_user_with_the_jobs_outcome(daemon, users, scratch):
    alice = users["alice"]
    sub = _user_dir(scratch, alice)
    out = os.path.join(sub, "notified")
    cmd = f"(id -u; id -g; pwd; env | grep '^HPC_BATCH_JOB_' | sort; echo end) > {out}"
    job = daemon.submit("sh", "-c", "echo hi; exit 3", flags=("--name", "prep", "--notify-command", cmd),
                        user=alice.pw_name, cwd=sub)
    assert exit_of(daemon.wait_finished(job, user=alice.pw_name)) == "3"
    lines = _read_when_written(out, "the notify command's file").splitlines()
    log = os.path.join(sub, f"output.{job}.log")
    assert lines == [str(alice.pw_uid), str(alice.pw_gid), sub, "HPC_BATCH_JOB_CODE=3", "HPC_BATCH_JOB_EXIT=3",
                     f"HPC_BATCH_JOB_ID={job}", "HPC_BATCH_JOB_NAME=prep", f"HPC_BATCH_JOB_OUTPUT={log}",
                     "HPC_BATCH_JOB_RESULT=exited", lines[9], "end"], lines
    assert lines[9].startswith("HPC_BATCH_JOB_WALL=") and lines[9].split("=")[1].isdigit()
    assert os.stat(out).st_uid == alice.pw_uid
    shown = json.loads(daemon.ok("show", "--json", str(job), user=alice.pw_name))
    assert shown["notify"] == {"forms": ["cmd"], "command": cmd}


def test_a_killed_job_says_so(daemon, users, scratch):
    alice = users["alice"]
    sub = _user_dir(scratch, alice)
    out = os.path.join(sub, "notified")
    job = daemon.submit("sleep", "300", flags=("--notify", "cmd", "--notify-command",
                                               f"echo $HPC_BATCH_JOB_RESULT $HPC_BATCH_JOB_EXIT. end > {out}",
                                               "--no-output"), user=alice.pw_name, cwd=sub)
    daemon.wait_running(job, user=alice.pw_name)
    daemon.ok("kill", str(job), user=alice.pw_name)
    assert exit_of(daemon.wait_finished(job, user=alice.pw_name)) == "killed"
    assert _read_when_written(out, "the notify command's file") == "killed killed. end\n"


def test_the_choice_survives_a_restart(daemon_factory, users, scratch):
    alice = users["alice"]
    sub = _user_dir(scratch, alice)
    daemon = daemon_factory()
    first = daemon.submit("sleep", "300", flags=("--no-output",), user=alice.pw_name, cwd=sub)
    job = daemon.submit("true", flags=("--after", str(first), "--notify", "tty,cmd", "--notify-command", "echo hi",
                                       "--no-output"), user=alice.pw_name, cwd=sub)
    daemon.stop()
    again = daemon_factory()
    shown = json.loads(again.ok("show", "--json", str(job), user=alice.pw_name))
    assert shown["state"] == "waiting" and shown["notify"] == {"forms": ["tty", "cmd"], "command": "echo hi"}
    assert "notify: tty, cmd (echo hi)" in again.ok("show", str(job), user=alice.pw_name).splitlines()
    again.ok("kill", str(job), str(first), user=alice.pw_name)


def test_bad_notify_values_never_reach_the_daemon(daemon, users):
    for flags, says in ((("--notify", "bogus"), "unknown form"), (("--notify", "cmd"), "needs the command"),
                        (("--notify-command", ""), "is empty"), (("--notify", "tty,"), "an empty form")):
        r = daemon.dispatch("new", *flags, "--", "true", user=users["alice"].pw_name)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert daemon.jobs("--all", "--finished") == {}


def test_64_hanging_notifications_stall_nothing(daemon_factory, users, scratch):
    """64 jobs whose notify commands never end: each job's end is still recorded at once, and the daemon answers."""
    daemon = daemon_factory("--keep-finished", "100")
    alice = users["alice"]
    sub = _user_dir(scratch, alice)
    marker = f"hpcb-notify-hang-{os.getpid()}"
    out = daemon.ok("new", "--parsable", "--no-output", "--array", "1-64", "--notify-command",
                    f"trap '' TERM; sleep 600; : {marker}", "--", "sh", "-c", "exit 7",
                    user=alice.pw_name, cwd=sub)
    first, last = map(int, out.strip().split("-"))
    try:
        r = daemon.dispatch("wait", "--json", f"{first}-{last}", user=alice.pw_name, timeout=150)
        assert r.returncode == 7, (r.stdout, r.stderr, daemon.log())
        ended = daemon.jobs("--finished", user=alice.pw_name)
        assert sorted(ended) == list(range(first, last + 1))
        assert {j["exit"] for j in ended.values()} == {"7"}
        assert daemon.proc.poll() is None
        # Those still hanging (each is killed after the limit) run as alice, never as root.
        assert all(_owner(pid) in (alice.pw_uid, None) for pid in _processes_with(marker))
    finally:
        for pid in _processes_with(marker):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass


# -- a shepherd started by hand, with a short limit ------------------------------------------------

def _hand_made_job(scratch, user, argv, notify):
    jdir = os.path.join(scratch, "job")
    os.mkdir(jdir, 0o755)
    launch = {"id": 1, "user": user.pw_name, "uid": user.pw_uid, "gid": user.pw_gid, "cwd": user.pw_dir,
              "argv": argv, "env": {"PATH": "/usr/bin:/bin", "HOME": user.pw_dir}, "output": None,
              "umask": 0o022, "notify": notify}
    records.write_json(os.path.join(jdir, records.LAUNCH), launch)
    return jdir


def _run_shepherd(user, jdir):
    _, argv, env = launcher.shepherd_argv(1, user.pw_name, jdir)
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return records.read_record(os.path.join(jdir, records.EXIT), records.ExitRecord)


def _pgrp(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rfind(b")") + 2:].split()[2])


def _in_group(pgid):
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgrp(int(p)) == pgid]


def _processes_with(marker):
    found = []
    for p in os.listdir("/proc"):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(p))
        except OSError:
            pass
    return found


def _owner(pid):
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


@pytest.mark.parametrize("body", ["while :; do sleep 1; done",                      # never exits, ignores TERM
                                  "while :; do sleep 60 & sleep 0.05; done"])       # and forks all along
def test_a_hanging_command_is_killed_at_its_limit_and_the_exit_code_stands(users, scratch, body):
    bob = users["bob"]
    pidfile = os.path.join(scratch, "notify.pid")
    os.chmod(scratch, 0o777)
    jdir = _hand_made_job(scratch, bob, ["sh", "-c", "exit 5"],
                          {"tty": False, "command": f"trap '' TERM; echo $$ > {pidfile}; {body}", "limit": 1.0})
    rec = _run_shepherd(bob, jdir)   # returns at once: the shepherd never waits for its notifier
    assert rec.code == 5 and rec.error is None, rec.to_dict()
    pid = int(wait_for(lambda: os.path.exists(pidfile) and open(pidfile).read().strip(), what="the command's pid"))
    assert _owner(pid) in (bob.pw_uid, None)
    # Its whole process group goes: SIGTERM at the limit, ignored, then SIGKILL.
    wait_for(lambda: not _in_group(pid), timeout=30, what="the notify command's group to be killed")
    assert records.read_record(os.path.join(jdir, records.EXIT), records.ExitRecord).code == 5


# -- the terminal form ---------------------------------------------------------------------------

class Utmp:
    """Records added to the real utmp for this test, taken out again (the file removed if we made it)."""

    def __init__(self):
        self.made = not os.path.exists(notifytext.UTMP_PATH)
        self.lines = []

    def add(self, user, tty_line):
        with open(notifytext.UTMP_PATH, "ab") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(notifytext.utmp_record(user, tty_line))
        self.lines.append(tty_line)

    def close(self):
        if self.made:
            os.unlink(notifytext.UTMP_PATH)
            return
        with open(notifytext.UTMP_PATH, "r+b") as f:
            data = f.read()
            size = notifytext.UTMP.size
            keep = [data[i:i + size] for i in range(0, len(data), size)
                    if data[i + 8:i + 40].split(b"\0", 1)[0].decode(errors="replace") not in self.lines]
            f.seek(0)
            f.write(b"".join(keep))
            f.truncate()


@pytest.fixture
def utmp():
    u = Utmp()
    yield u
    u.close()


def _pty(owner_uid, mode=0o620, gid=-1):
    master, slave = os.openpty()
    path = os.ttyname(slave)
    os.chown(path, owner_uid, gid)
    os.chmod(path, mode)
    os.set_blocking(master, False)
    return master, slave, path


def _drain(master):
    try:
        return os.read(master, 4096)
    except (BlockingIOError, OSError):
        return b""


def test_the_line_goes_to_the_users_own_terminals_only(daemon, users, scratch, utmp):
    alice = users["alice"]
    sub = _user_dir(scratch, alice)
    mine = _pty(alice.pw_uid)
    # Bob's, though alice may open it (its group is hers): the owner check alone refuses it.
    bobs = _pty(users["bob"].pw_uid, 0o660, alice.pw_gid)
    quiet = _pty(alice.pw_uid, 0o600)                 # alice's, but mesg n
    fifo = f"/dev/hpcb-notify-fifo-{os.getpid()}"     # alice's, but not a terminal
    link = f"/dev/hpcb-notify-link-{os.getpid()}"     # a symlink to her own terminal: not followed
    os.mkfifo(fifo, 0o620)
    os.chown(fifo, alice.pw_uid, -1)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    os.symlink(mine[2], link)
    opened = [mine[0], mine[1], bobs[0], bobs[1], quiet[0], quiet[1], reader]
    try:
        # The refused ones first: once the line is on hers, every other has been tried.
        for path in (bobs[2], quiet[2], fifo, link, mine[2]):
            utmp.add(alice.pw_name, path[len("/dev/"):])
        who = subprocess.run(["who"], capture_output=True, text=True).stdout
        assert mine[2][len("/dev/"):] in who
        job = daemon.submit("sh", "-c", "exit 4", "\x1b]0;owned\x07\u202e", flags=("--notify", "tty", "--no-output"),
                            user=alice.pw_name, cwd=sub)
        assert exit_of(daemon.wait_finished(job, user=alice.pw_name)) == "4"
        got = b""

        def line_arrived():
            nonlocal got
            if select.select([mine[0]], [], [], 0.2)[0]:
                got += _drain(mine[0])
            return got.endswith(b"\n") and b"ended" in got
        wait_for(line_arrived, timeout=30, what="the line on alice's terminal")
        text = got.decode()
        assert f"hpc-batch: job {job} (sh -c exit 4 \\x1b]0;owned\\x07\\u202e) ended: exit 4 after" in text, text
        assert text.count("ended") == 1 and "\x1b" not in text and "\u202e" not in text   # once: not via the link
        assert _drain(bobs[0]) == b"" and _drain(quiet[0]) == b"" and _drain(reader) == b""
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.path.islink(link)
    finally:
        for fd in opened:
            os.close(fd)
        for path in (fifo, link):
            os.unlink(path)

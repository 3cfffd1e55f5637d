"""Hostile local users against a root daemon: every attack of the hardening issue.

Each test plays an unprivileged user (hpcb-alice, hpcb-bob) attacking a real
root hpc-batchd, then checks what the attack got, and that another user's
``dispatch list`` still answers (a frozen daemon would time out: this is a
liveness check with a deadline, not a timing measurement). The numbered
comments refer to the list in the issue.
"""

import base64
import json
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import time

import pytest
from conftest import exit_of, wait_for

from shepherd.base.proc import proc_starttime

pytestmark = pytest.mark.timeout(180)
ALIVE = 10          # seconds a dispatch list may take before the daemon counts as frozen
WIRE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wire.py")
HEADER = struct.Struct(">I")


def alive(d, user):
    """Another user's dispatch list answers: the daemon is neither dead nor frozen."""
    r = d.dispatch("list", user=user, timeout=ALIVE)
    assert r.returncode == 0, r.stderr
    assert d.proc.poll() is None, d.log()


def frame(obj) -> bytes:
    body = json.dumps(obj).encode()
    return HEADER.pack(len(body)) + body


def request(op, **args) -> bytes:
    return frame({"v": 1, "op": op, "args": args})


def raw_as(d, user, payloads, scratch, timeout=10):
    """Send raw *payloads* (bytes each) as *user*; the replies, None where the daemon hung up."""
    wire = os.path.join(scratch, "wire.py")
    if not os.path.exists(wire):
        shutil.copy(WIRE, wire)
        os.chmod(wire, 0o755)
    lines = "".join(base64.b64encode(p).decode() + "\n" for p in payloads)
    r = subprocess.run(["runuser", "-u", user, "--", sys.executable, "-I", wire, d.socket, str(timeout)],
                       input=lines, capture_output=True, text=True, timeout=60 + timeout * len(payloads))
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def as_user(user, *cmd, **kw):
    return subprocess.run(["runuser", "-u", user, "--", *cmd], capture_output=True, text=True, timeout=60, **kw)


def shared_dir(scratch, name="shared"):
    d = os.path.join(scratch, name)
    os.mkdir(d)
    os.chmod(d, 0o1777)
    return d


def job_dir(d, job):
    return os.path.join(d.state_dir, "jobs", str(job))


def wait_running(d, job, user=None):
    d.wait_running(job, user=user)
    wait_for(lambda: os.path.exists(os.path.join(job_dir(d, job), "status.json")), what="shepherd status")


def read_json(path):
    with open(path) as f:
        return json.load(f)


# 1. Root never signals a process group by number -------------------------------------

def test_stale_job_pid_is_never_signalled(daemon, users, scratch):
    """A stranger now holding the job's recorded pid survives the job's end."""
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    job = daemon.submit("sleep", "300", user=alice, cwd=users["alice"].pw_dir)
    wait_running(daemon, job, user=alice)
    jdir = job_dir(daemon, job)
    status = read_json(os.path.join(jdir, "status.json"))
    # A pid and a start time (in clock ticks) name one process: a stranger forked within the job's
    # own tick would be the job as far as anyone can tell (a real reuse of its pid would need the
    # pid counter to wrap within that tick). So the stranger starts in a later tick.
    wait_for(lambda: _boot_ticks() > status["job_start"], what="the clock to pass the job's start")
    # bob's process leads its own session: the kind of group a reused pid names.
    stranger = subprocess.Popen(["runuser", "-u", bob, "--", "setsid", "-w", "sleep", "300"])
    try:
        wait_for(lambda: _child_of(stranger.pid), what="bob's process")
        victim = _child_of(stranger.pid)
        assert proc_starttime(victim) != status["job_start"]
        # Make the record say the job's pid is now the stranger's (as pid reuse would).
        status["job_pid"] = victim
        with open(os.path.join(jdir, "status.json"), "w") as f:
            json.dump(status, f)
        shepherd_pid = int(open(os.path.join(jdir, "shepherd.pid")).read().split()[0])
        os.kill(shepherd_pid, signal.SIGKILL)       # the daemon must now clean up after the job
        row = daemon.wait_finished(job, user=alice)
        assert exit_of(row) == "killed" and "shepherd" in row
        # The cleanup checked the process behind the number and left the stranger alone.
        assert os.path.exists(f"/proc/{victim}") and _state(victim) != "Z"
        alive(daemon, bob)
    finally:
        for who in (bob, alice):
            subprocess.run(["pkill", "-KILL", "-u", who, "-x", "sleep"])
        stranger.wait(timeout=30)


def _boot_ticks():
    """Clock ticks since boot now, as /proc/PID/stat counts a process's start."""
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK"))


def _child_of(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
    except OSError:
        return None
    if not kids:
        return None
    deeper = _child_of(int(kids[0]))
    return deeper or int(kids[0])


def _state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_fifo_as_output_cannot_stall_or_misdirect(daemon_factory, users, scratch):
    """A job that turns its own log path into a FIFO: delivery refuses at once, the buffer is kept."""
    alice, bob = users["alice"], users["bob"].pw_name
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    share = shared_dir(scratch)
    job = d.submit("sh", "-c", 'echo secret; mkfifo "output.$HPC_BATCH_JOB_ID.log"',
                   flags=("--exclusive",), user=alice.pw_name, cwd=share)
    row = d.wait_finished(job, user=alice.pw_name, timeout=60)
    assert exit_of(row) == "0"
    assert "output not delivered" in row and "FIFO" in row, row
    with open(os.path.join(job_dir(d, job), "output")) as f:
        assert f.read() == "secret\n"
    # The exclusive job let go of the machine: the next job runs.
    after = d.submit("true", flags=("--exclusive",), user=bob, cwd="/tmp")
    assert exit_of(d.wait_finished(after, user=bob, timeout=60)) == "0"
    alive(d, bob)


def test_kill_is_asked_of_the_shepherd_and_works(daemon, users):
    alice = users["alice"].pw_name
    job = daemon.submit("sh", "-c", "trap '' TERM; while :; do sleep 0.1; done", user=alice,
                        cwd=users["alice"].pw_dir)
    wait_running(daemon, job, user=alice)
    fifo = os.path.join(job_dir(daemon, job), "control")
    wait_for(lambda: os.path.exists(fifo), what="control FIFO")
    st = os.lstat(fifo)
    assert stat.S_ISFIFO(st.st_mode) and st.st_uid == 0 and st.st_mode & 0o777 == 0o600
    daemon.ok("kill", str(job), user=alice)
    row = daemon.wait_finished(job, user=alice, timeout=60)
    assert exit_of(row) == "killed"


def test_deadline_holds_while_the_daemon_is_down(daemon_factory, users, scratch):
    d = daemon_factory()
    alice = users["alice"].pw_name
    job = d.submit("sleep", "300", flags=("--max-time", "3s"), user=alice, cwd=users["alice"].pw_dir)
    wait_running(d, job, user=alice)
    d.kill9()
    exit_rec = os.path.join(job_dir(d, job), "exit.json")
    wait_for(lambda: os.path.exists(exit_rec), timeout=60, what="the shepherd to enforce --max-time alone")
    assert read_json(exit_rec)["stopped"] == "timeout"
    d2 = daemon_factory()
    assert exit_of(d2.wait_finished(job, user=alice)) == "timeout"


# 2. Values no real client sends ---------------------------------------------------------

@pytest.mark.parametrize("field,value", [
    ("max_time", -10 ** 400), ("max_time", 10 ** 400), ("max_time", 0), ("max_time", -10),
    ("cpus", 10 ** 30), ("mem", -1), ("gpus", 2 ** 63), ("umask", 0o7777), ("max_time", 1.5),
])
def test_out_of_bounds_numbers_refused(daemon, users, scratch, field, value):
    bob = users["bob"].pw_name
    req = {"argv": ["true"], "cwd": "/tmp", "no_output": True, field: value}
    (reply,) = raw_as(daemon, bob, [request("new", **req)], scratch)
    assert reply and reply["ok"] is False and field in reply["error"], reply
    alive(daemon, users["alice"].pw_name)
    assert daemon.rows("--all", "--finished") == {}


def test_unusable_record_is_quarantined_not_a_crash_loop(daemon_factory, users, scratch):
    d = daemon_factory()
    job = d.submit("true")
    d.wait_finished(job)
    d.stop()
    path = os.path.join(job_dir(d, job), "job.json")
    rec = read_json(path)
    rec.update(state="running", max_time=-10 ** 400, ended=None, result=None,
               alloc={"cpus": [0], "mem_by_node": [[0, 1]], "gpus": [], "exclusive": False})
    with open(path, "w") as f:
        json.dump(rec, f)
    for _ in range(2):   # and again: the first start moved it aside for good
        d = daemon_factory()
        alive(d, users["bob"].pw_name)
        assert job not in d.rows("--all", "--finished")
        d.stop()
    assert any(n.startswith(f"{job}.") for n in os.listdir(os.path.join(d.state_dir, "quarantine")))


# 3. A user who stops every process they can --------------------------------------------

STOPPER = """
import os, signal, socket, struct, sys, time, json
path = sys.argv[1]
body = json.dumps({"v": 1, "op": "new", "args": {"argv": ["true"], "cwd": "/tmp", "output": "/tmp"}}).encode()
socks = []
for _ in range(20):   # many submits in flight: any helper process the daemon made for one gets caught
    s = socket.socket(socket.AF_UNIX); s.connect(path)
    s.sendall(struct.pack(">I", len(body)) + body)
    socks.append(s)
print("go", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    os.kill(-1, signal.SIGSTOP)      # every process of this user but this one
os.kill(-1, signal.SIGCONT)
answered = 0
for s in socks:
    s.settimeout(30)
    answered += len(s.recv(65536)) > 0
print(answered == len(socks))
"""


def test_sigstop_everything_cannot_freeze_the_daemon(daemon, users, scratch):
    bob, alice = users["bob"].pw_name, users["alice"].pw_name
    script = os.path.join(scratch, "stopper.py")
    with open(script, "w") as f:
        f.write(STOPPER)
    os.chmod(script, 0o644)
    # The stopper keeps at it longer than ALIVE: a daemon waiting on any of bob's processes would time out.
    p = subprocess.Popen(["runuser", "-u", bob, "--", sys.executable, "-I", script, daemon.socket, str(ALIVE + 2)],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "go"
        alive(daemon, alice)
        alive(daemon, alice)
    finally:
        out, _ = p.communicate(timeout=90)
    assert out.strip() == "True"


# 4. A lease on a file the daemon opens ----------------------------------------------

LEASER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
try:
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    print("leased")
except OSError as exc:
    print("refused", exc.errno)
"""


def test_user_cannot_lease_the_output_buffer(daemon_factory, users, scratch):
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0")
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    blocker = d.submit("sleep", "60", flags=("--cpu", "2"))
    job = d.submit("echo", "hi", user=alice, cwd=users["alice"].pw_dir)   # queued: its buffer is idle
    script = os.path.join(scratch, "leaser.py")
    with open(script, "w") as f:
        f.write(LEASER)
    os.chmod(script, 0o644)
    buf = os.path.join(d.dev_dir, "jobs", str(job), "output")
    r = as_user(alice, sys.executable, "-I", script, buf)
    assert r.stdout.startswith("refused"), r.stdout + r.stderr
    p = subprocess.Popen(["runuser", "-u", alice, "--", "env", f"HPC_BATCH_SOCKET={d.socket}",
                          os.path.join(os.path.dirname(sys.executable), "dispatch"), "attach", str(job)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    alive(d, bob)
    d.ok("kill", str(blocker))
    out, err = p.communicate(timeout=60)
    assert out == "hi\n", err


# 5. Offsets and ids past what pread takes -------------------------------------------

def test_huge_attach_offset_refused(daemon, users, scratch):
    bob = users["bob"].pw_name
    job = daemon.submit("sleep", "30", user=bob, cwd="/tmp", flags=("--no-output",))
    replies = raw_as(daemon, bob, [request("attach", id=job, offset=2 ** 63),
                                   request("attach", id=2 ** 70), request("kill", id=-1)], scratch)
    for reply, needle in zip(replies, ("offset", "job ids", "job ids")):
        assert reply and reply["ok"] is False and needle in reply["error"], reply
    alive(daemon, users["alice"].pw_name)
    daemon.ok("kill", str(job))


# 6. Connections ---------------------------------------------------------------------------

HOARDER = """
import socket, struct, sys, time
path, n, partial = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
socks = []
for i in range(n):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
    except OSError:
        break
    if partial:   # announce a 4 MiB request and send half of it, never the rest
        try:
            s.sendall(struct.pack(">I", 4 << 20) + b"[" * (2 << 20))
        except OSError:
            pass
    socks.append(s)
print(len(socks), flush=True)
sys.stdin.readline()
closed = 0
for s in socks:   # dropped: an error reply or EOF is waiting; kept: nothing is
    s.setblocking(False)
    try:
        s.recv(1 << 16)
        closed += 1
    except BlockingIOError:
        pass
    except OSError:
        closed += 1
print(closed, flush=True)
"""


def _hoarder(d, user, scratch, n, partial):
    script = os.path.join(scratch, "hoarder.py")
    with open(script, "w") as f:
        f.write(HOARDER)
    os.chmod(script, 0o644)
    return subprocess.Popen(["runuser", "-u", user, "--", sys.executable, "-I", script, d.socket, str(n),
                             str(int(partial))], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_connections_per_user_are_capped(daemon_factory, users, scratch):
    d = daemon_factory("--max-connections-per-user", "8")
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    p = _hoarder(d, alice, scratch, 8, False)
    assert int(p.stdout.readline()) == 8
    try:
        r = d.dispatch("list", user=alice, timeout=ALIVE)
        assert r.returncode == 9 and "--max-connections-per-user" in r.stderr, r.stderr
        alive(d, bob)                          # bob is not affected by alice's hoard
    finally:
        p.communicate("\n", timeout=30)
    wait_for(lambda: d.dispatch("list", user=alice).returncode == 0, what="alice served again")


def test_unfinished_frames_do_not_pile_up(daemon_factory, users, scratch):
    d = daemon_factory("--max-connections-per-user", "64")
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    before = _rss(d.proc.pid)
    p = _hoarder(d, alice, scratch, 20, True)   # 20 x 2 MiB of half-sent 4 MiB frames
    assert int(p.stdout.readline()) >= 1
    alive(d, bob)
    grew = _rss(d.proc.pid) - before
    out, _ = p.communicate("\n", timeout=60)
    closed = int(out.split()[-1])
    assert closed >= 15, out            # most were dropped with an error, not buffered
    assert grew < 16 << 20, grew         # at most a couple of frames' worth held at once


def test_a_frame_begun_must_be_finished_in_time(daemon, users, scratch):
    alice = users["alice"].pw_name
    s = socket.socket(socket.AF_UNIX)
    s.connect(daemon.socket)
    s.sendall(struct.pack(">I", 100) + b'{"v":')
    s.settimeout(40)
    start = time.monotonic()
    while s.recv(65536):
        pass
    assert time.monotonic() - start < 35    # dropped after the frame deadline, not the idle timeout
    alive(daemon, alice)


def test_out_of_descriptors_backs_off(daemon_factory, users, scratch):
    d = daemon_factory("--max-connections-per-user", "1000", wrap=["prlimit", "--nofile=64:64", "--"])
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    p = _hoarder(d, alice, scratch, 150, False)    # past 64 descriptors, within the listen backlog
    assert int(p.stdout.readline()) >= 60
    try:
        cpu = _cpu_seconds(d.proc.pid)
        lines = d.log().count("out of file descriptors")
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:   # three seconds at EMFILE: the attack, not a wait for a condition
            time.sleep(0.1)
        assert _cpu_seconds(d.proc.pid) - cpu < 1.0          # not spinning
        assert d.log().count("out of file descriptors") - lines <= 1   # not flooding the log
    finally:
        p.communicate("\n", timeout=60)
    wait_for(lambda: d.dispatch("list", user=bob).returncode == 0, what="served again once fds are free")


def _rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# 7. A killed shepherd loses nothing ------------------------------------------------------

def test_killed_shepherd_keeps_the_output(daemon, users, scratch):
    alice = users["alice"]
    flag = os.path.join(scratch, "go")
    job = daemon.submit("sh", "-c", f"echo precious; while [ ! -e {flag} ]; do sleep 0.05; done",
                        user=alice.pw_name, cwd=alice.pw_dir)
    wait_running(daemon, job, user=alice.pw_name)
    buf = os.path.join(job_dir(daemon, job), "output")
    wait_for(lambda: os.path.getsize(buf) > 0, what="output buffered")
    pid = int(open(os.path.join(job_dir(daemon, job), "shepherd.pid")).read().split()[0])
    os.kill(pid, signal.SIGKILL)
    row = daemon.wait_finished(job, user=alice.pw_name)
    assert exit_of(row) == "killed" and buf in row, row
    with open(buf) as f:
        assert f.read() == "precious\n"
    r = as_user(alice.pw_name, "cat", buf)                  # hers to read
    assert r.stdout == "precious\n"
    assert as_user(users["bob"].pw_name, "cat", buf).returncode != 0


# 8. The submitter's umask ------------------------------------------------------------------

def test_job_and_log_get_the_submitters_umask(daemon, users, scratch):
    alice = users["alice"]
    home = os.path.join(scratch, "alice")          # fresh: an existing log keeps its own mode
    os.mkdir(home)
    os.chown(home, alice.pw_uid, alice.pw_gid)
    dispatch = os.path.join(os.path.dirname(sys.executable), "dispatch")
    jobs = {}
    for mask in ("077", "027"):
        out = subprocess.run(
            ["runuser", "-u", alice.pw_name, "--", "sh", "-c",
             f"umask {mask}; cd {home}; HPC_BATCH_SOCKET={daemon.socket} "
             f"{dispatch} new -- sh -c 'umask; touch made-{mask}'"],
            capture_output=True, text=True, check=True).stdout
        jobs[mask] = int(out.split()[1])
    for mask, job in jobs.items():
        daemon.wait_finished(job, user=alice.pw_name)
        log = os.path.join(home, f"output.{job}.log")
        assert open(log).read().strip() == "0" + mask
        expected = 0o666 & ~int(mask, 8)
        assert os.stat(log).st_mode & 0o777 == expected, (mask, oct(os.stat(log).st_mode))
        assert os.stat(os.path.join(home, f"made-{mask}")).st_mode & 0o777 == expected


# 9. A file planted where the log will go --------------------------------------------------

def test_planted_log_file_receives_nothing(daemon, users, scratch):
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    share = shared_dir(scratch)
    probe = daemon.submit("true", user=alice, cwd=share, flags=("--no-output",))
    planted = os.path.join(share, f"output.{probe + 1}.log")
    as_user(bob, "sh", "-c", f"umask 0; : > {planted}")
    job = daemon.submit("echo", "alice-secret", user=alice, cwd=share)
    assert job == probe + 1
    row = daemon.wait_finished(job, user=alice)
    assert open(planted).read() == ""                      # bob got nothing
    assert "belongs to another user" in row, row
    with open(os.path.join(job_dir(daemon, job), "output")) as f:
        assert f.read() == "alice-secret\n"                 # kept for alice
    # Named explicitly, bob's file is refused at submit.
    r = daemon.dispatch("new", "--output", planted, "--", "true", user=alice, cwd=share)
    assert r.returncode == 1 and "another user" in r.stderr


# 10. Records --------------------------------------------------------------------------------

def test_a_delivery_with_nothing_to_say_writes_no_record_a_failed_one_does(daemon, users):
    # All of the output in the log (or nowhere, with --no-output) and nothing to report: the record's
    # absence with the buffer's says the same to the daemon (outcome.delivery_of), one file fewer a
    # job. A delivery that failed is recorded, and its buffer kept.
    alice = users["alice"]
    quiet = daemon.submit("true", flags=("--no-output",), user=alice.pw_name, cwd=alice.pw_dir)
    logged = daemon.submit("echo", "kept", user=alice.pw_name, cwd=alice.pw_dir)
    gone = os.path.join(alice.pw_dir, "gone")
    os.mkdir(gone)
    os.chown(gone, alice.pw_uid, alice.pw_gid)
    lost = daemon.submit("sh", "-c", f"rmdir {gone}; echo lost", flags=("--output", gone),
                         user=alice.pw_name, cwd=alice.pw_dir)
    for j in (quiet, logged, lost):
        daemon.wait_finished(j, user=alice.pw_name)
    for j in (quiet, logged):
        assert not os.path.exists(os.path.join(job_dir(daemon, j), "delivery.json")), j
        assert not os.path.exists(os.path.join(job_dir(daemon, j), "output")), j
        shown = json.loads(daemon.ok("show", "--json", str(j), user=alice.pw_name))
        assert shown["exit"] == "0" and not shown.get("output_error") and not shown.get("output_note"), shown
    with open(os.path.join(alice.pw_dir, f"output.{logged}.log")) as f:
        assert f.read() == "kept\n"
    record = os.path.join(job_dir(daemon, lost), "delivery.json")
    st = os.stat(record)
    assert st.st_uid == 0 and st.st_mode & 0o077 == 0, oct(st.st_mode)
    with open(record) as f:
        assert json.load(f)["ok"] is False
    with open(os.path.join(job_dir(daemon, lost), "output")) as f:
        assert f.read() == "lost\n"
    shown = json.loads(daemon.ok("show", "--json", str(lost), user=alice.pw_name))
    assert "kept at" in (shown.get("output_error") or ""), shown


def test_records_are_root_only_and_job_ids_unlistable(daemon, users):
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    job = daemon.submit("sh", "-c", "exit 3", user=alice, cwd=users["alice"].pw_dir)
    daemon.wait_finished(job, user=alice)
    running = daemon.submit("sleep", "30", user=alice, cwd=users["alice"].pw_dir)
    wait_running(daemon, running, user=alice)
    # (delivery.json too, where there is one: test_a_delivery_with_nothing_to_say_writes_no_record_a_failed_one_does)
    for j, names in ((job, ("exit.json", "status.json", "shepherd.pid", "job.json")),
                     (running, ("status.json", "shepherd.pid", "job.json"))):
        for name in names:
            st = os.stat(os.path.join(job_dir(daemon, j), name))
            assert st.st_uid == 0 and st.st_mode & 0o077 == 0, (j, name, oct(st.st_mode))
    assert os.stat(os.path.join(daemon.dev_dir, "jobs")).st_mode & 0o777 == 0o711
    assert as_user(bob, "ls", os.path.join(daemon.dev_dir, "jobs")).returncode != 0
    assert as_user(bob, "cat", os.path.join(job_dir(daemon, running), "status.json")).returncode != 0
    daemon.ok("kill", str(running))


# 11. Log injection -------------------------------------------------------------------------

def test_newlines_in_a_command_forge_no_log_line(daemon, users):
    alice = users["alice"].pw_name
    forged = "hpc-batchd: job 999 finished: 0"
    job = daemon.submit("true", f"\n{forged}\n\x1b[2J", user=alice, cwd=users["alice"].pw_dir)
    daemon.wait_finished(job, user=alice)
    assert not any(line.startswith(forged) for line in daemon.log().splitlines())
    row = [line for line in daemon.ok("list", "--all", "--finished").splitlines() if line.split()[1] == str(job)]
    assert len(row) == 1 and "\x1b" not in row[0]


# 12. Descriptors --------------------------------------------------------------------------

def test_job_gets_only_descriptors_0_1_2(daemon_factory, users, scratch):
    r, w = os.pipe()
    os.set_inheritable(r, True)
    os.set_inheritable(w, True)
    try:
        d = daemon_factory(pass_fds=(r, w))
        job = d.submit("sh", "-c", "ls /proc/$$/fd; true")   # ls lists its parent's descriptors
        d.wait_finished(job)
        with open(os.path.join(scratch, f"output.{job}.log")) as f:
            assert f.read().split() == ["0", "1", "2"]
    finally:
        os.close(r)
        os.close(w)


# 13. Per-user bounds ----------------------------------------------------------------------

def test_queued_jobs_per_user_are_capped(daemon_factory, users):
    d = daemon_factory("--max-queued-per-user", "3", "--reserve-cpu", "0", "--reserve-mem", "0")
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    home = users["alice"].pw_dir
    blocker = d.submit("sleep", "60", flags=("--cpu", "2"))
    for _ in range(3):
        d.submit("true", user=alice, cwd=home)
    r = d.dispatch("new", "--", "true", user=alice, cwd=home)
    assert r.returncode == 7 and "--max-queued-per-user" in r.stderr and r.stderr.count("\n") == 1
    d.submit("true", user=bob, cwd="/tmp", flags=("--no-output",))    # bob has his own allowance
    d.ok("kill", str(blocker))


def test_job_size_is_capped(daemon_factory, users):
    d = daemon_factory("--max-job-size", "64K")
    alice = users["alice"].pw_name
    r = d.dispatch("new", "--env", "--", "true", user=alice, cwd=users["alice"].pw_dir,
                   env={"BIG": "x" * (100 << 10)})
    assert r.returncode == 8 and "--max-job-size" in r.stderr and r.stderr.count("\n") == 1
    r = d.dispatch("new", "--", "echo", "y" * (100 << 10), user=alice, cwd=users["alice"].pw_dir)
    assert r.returncode == 8 and "--max-job-size" in r.stderr
    assert d.rows("--all", "--finished") == {}


def test_output_past_the_buffer_bound_goes_straight_to_the_log(daemon_factory, users, scratch):
    d = daemon_factory("--max-output-buffer", "64K")
    alice = users["alice"]
    lines = 50000   # about 1 MiB: sixteen times the bound
    job = d.submit("sh", "-c", f"seq 1 {lines}; seq 1 {lines} >&2", user=alice.pw_name, cwd=alice.pw_dir)
    buf = os.path.join(job_dir(d, job), "output")
    sizes = []

    def finished():
        try:
            sizes.append(os.path.getsize(buf))
        except OSError:
            pass
        return " finished " in d.rows("--finished", user=alice.pw_name).get(job, "")
    wait_for(finished, timeout=60, what=f"job {job} to finish")
    assert sizes and max(sizes) <= 64 << 10
    row = d.rows("--finished", user=alice.pw_name)[job]
    assert exit_of(row) == "0" and "went straight to" in row and "not delivered" not in row, row
    with open(os.path.join(alice.pw_dir, f"output.{job}.log")) as f:
        assert f.read().split() == [str(i) for i in range(1, lines + 1)] * 2
    assert not os.path.exists(buf)


def test_output_past_the_bound_is_discarded_with_no_output(daemon_factory, users, scratch):
    d = daemon_factory("--max-output-buffer", "64K")
    job = d.submit("sh", "-c", "head -c 1048576 /dev/zero", flags=("--no-output",))
    row = d.wait_finished(job)
    assert exit_of(row) == "0" and "discarded" in row, row
    assert not os.path.exists(os.path.join(job_dir(d, job), "output"))

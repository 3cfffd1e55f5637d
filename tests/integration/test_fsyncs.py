"""Group commit, counted: fsyncs per job, with strace on the daemon and everything it starts.

strace comes from Debian's package (scripts/install-host-deps --host, which
scripts/test runs before the host tests); the count covers the daemon, its
fork server and every shepherd (-f), and each fsync or fdatasync call once.
The same trace (with unlinks, renames and execs, and -y naming each
descriptor's file) shows that a job's log is fsynced before its output
buffer, the only other copy, is removed, and what makes a start safe from
a power cut: the shepherd's pidfile, and its name, are durable before the
command is exec'd (so a start whose pidfile is empty or gone never ran), and
the launch spec of a job with a forwarded environment, its only durable copy
once the job starts, before the commit that says the job runs.
"""

import os
import re
import shutil
import signal

import pytest
from conftest import _shepherds_under, wait_for

pytestmark = pytest.mark.timeout(180)

CALL = re.compile(rb"\b(?:fsync|fdatasync)\(")
LINE = re.compile(rb"^\d+ +(\w+)\((.*?)\) += (-?\d+)", re.M)   # pid call(args) = result
START = re.compile(rb"^\d+ +(\w+)\((.*)$", re.M)                # pid call(args..., finished or not


def _count(path):
    with open(path, "rb") as f:
        return len(CALL.findall(f.read()))


def _settled(d, scratch, trace):
    """The count once every shepherd is gone and it stopped moving."""
    wait_for(lambda: not _shepherds_under(scratch), what="the shepherds to finish")
    last = [-1]

    def same():
        n = _count(trace)
        done = n == last[0]
        last[0] = n
        return done
    wait_for(same, interval=0.3, what="the count to settle")
    return last[0]


def test_fsyncs_per_job(daemon_factory, users, scratch):
    strace = shutil.which("strace")
    assert strace, "strace is missing: scripts/install-host-deps --host installs it"
    trace = os.path.join(scratch, "fsyncs.trace")
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0",
                       wrap=[strace, "-f", "-qq", "-y", "-e",
                             "trace=fsync,fdatasync,unlink,unlinkat,rename,renameat,renameat2,execve,execveat", "-o",
                             trace])
    try:
        _measure(d, scratch, trace)
        _log_before_buffer(d, scratch, trace)
    finally:   # the daemon is strace's child: stop it, and strace goes with it
        with open(f"/proc/{d.proc.pid}/task/{d.proc.pid}/children") as f:
            for pid in f.read().split():
                os.kill(int(pid), signal.SIGTERM)
        d.proc.wait(timeout=30)


def _measure(d, scratch, trace):
    base = _settled(d, scratch, trace)
    for _ in range(5):
        job = d.submit("true", flags=("--no-output",))
        assert d.dispatch("wait", str(job)).returncode == 0
    singles = _settled(d, scratch, trace) - base
    out = d.ok("new", "--no-output", "--array", "1-40", "--", "true")
    first = int(out.split()[1].split("-")[0].rstrip(":"))
    assert d.dispatch("wait", f"{first}-{first + 39}").returncode == 0
    bulk = _settled(d, scratch, trace) - base - singles
    print(f"fsyncs: {singles / 5:.1f} per lone job, {bulk / 40:.2f} per job of a 40-job array")
    # 2 journal commits for a lone job: its submit's, which answers the client, and its start's
    # (the start is written after that answer, so the client waits for no launch spec); none for
    # its launch spec (a clean environment: the store keeps it until the end); 2 for the pidfile,
    # its data and its name (before the command runs: the proof, after a power cut, that it may
    # have); 2 for its exit record.
    assert singles <= 5 * 6
    # The array's submit is one commit; its ends and starts share one a turn.
    assert bulk <= 40 * 5 + 2


def _log_before_buffer(d, scratch, trace):
    """A job with a log: its fsync (in the delivery child, as the user) comes before the buffer's unlink."""
    log = os.path.join(scratch, "durable.log")
    job = d.submit("echo", "kept", flags=("--output", log))
    assert d.dispatch("wait", str(job)).returncode == 0
    _settled(d, scratch, trace)
    with open(log) as f:
        assert f.read() == "kept\n"
    buf = os.path.join(d.state_dir, "jobs", str(job), "output").encode()
    with open(trace, "rb") as f:
        calls = [(m.group(1), m.group(2), int(m.group(3))) for m in LINE.finditer(f.read())]
    synced = [i for i, (call, args, res) in enumerate(calls)
              if call in (b"fsync", b"fdatasync") and f"<{log}>".encode() in args and res == 0]
    removed = [i for i, (call, args, res) in enumerate(calls)
               if call in (b"unlink", b"unlinkat") and b'"' + buf + b'"' in args and res == 0]
    assert synced and removed, (synced, removed)
    assert synced[0] < removed[0], "the buffer was removed before the log was fsynced"
    # The buffer is flushed before the exit record makes the end final: after a power cut in the
    # delivery, the buffer the daemon names as kept holds the output.
    exit_tmp = os.path.join(d.state_dir, "jobs", str(job), "exit.json.tmp").encode()
    flushed = [i for i, (call, args, res) in enumerate(calls)
               if call in (b"fsync", b"fdatasync") and b"<" + buf + b">" in args and res == 0]
    recorded = [i for i, (call, args, res) in enumerate(calls)
                if call in (b"fsync", b"fdatasync") and b"<" + exit_tmp in args and res == 0]
    assert flushed and recorded, (flushed, recorded)
    assert flushed[0] < recorded[0], "the exit record was made durable before the output buffer"
    _start_order(d, job, trace, ["echo", "kept"], spec_flushed=False)
    forwarded = d.submit("echo", "forwarded", flags=("--env", "--output", log + ".env"))
    assert d.dispatch("wait", str(forwarded)).returncode == 0
    _settled(d, scratch, trace)
    _start_order(d, forwarded, trace, ["echo", "forwarded"], spec_flushed=True)


def _start_order(d, job, trace, argv, spec_flushed):
    """Power-cut safety of a start: the pidfile and its name are durable before the command runs (no
    pidfile then proves the command never ran); the launch spec of a forwarded environment is durable
    before the journal's commit, and a clean one's is not flushed at all."""
    jdir = os.path.join(d.state_dir, "jobs", str(job))
    with open(trace, "rb") as f:   # each call where it starts (strace splits one another process interrupts)
        starts = [(m.group(1), m.group(2)) for m in START.finditer(f.read())]

    def synced(path):
        return lambda call, args: call in (b"fsync", b"fdatasync") and f"<{path}".encode() in args

    def first(pred, what, after=-1):
        found = [i for i, (call, args) in enumerate(starts) if i > after and pred(call, args)]
        assert found, f"no {what} in the trace"
        return found[0]
    if spec_flushed:
        spec = first(synced(f"{jdir}/launch.json.tmp"), "fsync of the launch spec")
        renamed = first(lambda call, args: call.startswith(b"rename") and f'"{jdir}/launch.json"'.encode() in args,
                        "rename of the launch spec", spec)
        first(synced(f"{d.state_dir}/journal>"), "journal commit after the launch spec's rename", renamed)
    else:
        assert not [a for c, a in starts if synced(f"{jdir}/launch.json")(c, a)], "a clean job's spec was flushed"
    pid_synced = first(synced(f"{jdir}/shepherd.pid>"), "fsync of the pidfile")
    ran = first(lambda call, args: call in (b"execve", b"execveat") and
                ("[" + ", ".join(f'"{a}"' for a in argv) + "]").encode() in args,
                "exec of the job")   # execveat: the child runs the very file it resolved (fexecve)
    assert pid_synced < ran, "the job ran before its pidfile was durable"
    named = first(synced(f"{jdir}>"), "fsync of the job's directory (the pidfile's name)", pid_synced)
    assert named < ran, "the job ran before its pidfile's name was durable"

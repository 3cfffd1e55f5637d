#!/usr/bin/python3
"""In-guest command agent for the hpc-batch system-test VM.

Runs inside the Debian guest (baked into the image by build-image, started
by ``hpc-batch-test-agent.service``) and talks to the host over a
virtio-serial port.  Standard library only: the guest's system Python runs
it, never the project's venv.

Protocol: one JSON object per line in each direction.

Request::

    {"id": 7, "op": "run", "argv": ["sh", "-c", "echo hi"],
     "timeout": 30, "user": "alice", "input": "", "env": {"K": "V"},
     "cwd": "/tmp"}

    {"id": 8, "op": "ping"}

Reply::

    {"id": 7, "rc": 0, "out": "hi\\n", "err": "", "timed_out": false,
     "duration": 0.01}

``rc`` is the command's exit status, or ``-N`` when it died of signal N
(a timed-out command is killed with SIGKILL, so ``timed_out`` is true and
``rc`` is -9).  ``user`` runs the command as that user, with its groups,
home directory as working directory and a login-like environment.  A
request the agent cannot carry out is answered with ``rc`` 255 and an
``error`` field instead of crashing the agent.

    {"id": 9, "op": "cancel", "target": 7}

``cancel`` kills the command of request ``target`` (its whole process
group) if it is still running; that request is then answered as usual,
with ``timed_out`` false and ``rc`` -9.  The host sends it for a request it
gave up on, so an abandoned ``sleep 1000`` does not outlive its test.

The port serves one client at a time.  Each request runs in a thread of its
own and answers come back as they finish, each on one line: the host
matches them to its requests by ``id`` and drops answers it no longer
waits for.  When the host disconnects, whatever its requests still run is
killed.
"""

import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time

DEFAULT_PORT = "/dev/virtio-ports/test.agent"
# Cap on what one reply carries back per stream; big data goes over 9p.
MAX_OUTPUT = 8 * 1024 * 1024
DEFAULT_TIMEOUT = 60.0


def log(msg):
    # stderr goes to the journal (and so to the console log on failure).
    sys.stderr.write("hpc-batch-test-agent: %s\n" % msg)
    sys.stderr.flush()


def _user_setup(name):
    """Popen keyword arguments that run a command as ``name``."""
    pw = pwd.getpwnam(name)
    groups = os.getgrouplist(pw.pw_name, pw.pw_gid)
    env = {
        "HOME": pw.pw_dir,
        "USER": pw.pw_name,
        "LOGNAME": pw.pw_name,
        "SHELL": pw.pw_shell or "/bin/sh",
        "PATH": "/usr/local/bin:/usr/bin:/bin:/opt/bin",
        "LANG": "C.UTF-8",
    }
    cwd = pw.pw_dir if os.path.isdir(pw.pw_dir) else "/"
    return {"user": pw.pw_uid, "group": pw.pw_gid,
            "extra_groups": groups, "env": env, "cwd": cwd}


def _decode(data):
    if len(data) > MAX_OUTPUT:
        data = data[:MAX_OUTPUT] + b"\n[... truncated by agent ...]\n"
    return data.decode("utf-8", errors="replace")


# Running commands by request id, for cancel and for a host that leaves.
_running = {}
_running_lock = threading.Lock()


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def cancel(target):
    with _running_lock:
        proc = _running.get(target)
    if proc is None:
        return False
    _kill_group(proc)
    return True


def cancel_all():
    with _running_lock:
        procs = list(_running.values())
    for proc in procs:
        _kill_group(proc)
    return len(procs)


def run_command(req):
    argv = req.get("argv")
    if isinstance(argv, str):
        argv = ["/bin/sh", "-c", argv]
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError("argv must be a non-empty list of strings")
    timeout = float(req.get("timeout") or DEFAULT_TIMEOUT)

    kwargs = {
        "env": {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
                        "/sbin:/bin:/opt/bin",
                "HOME": "/root", "USER": "root", "LOGNAME": "root",
                "LANG": "C.UTF-8"},
        "cwd": "/",
    }
    if req.get("user"):
        kwargs.update(_user_setup(req["user"]))
    if req.get("env"):
        kwargs["env"].update({str(k): str(v) for k, v in req["env"].items()})
    if req.get("cwd"):
        kwargs["cwd"] = req["cwd"]
    data = req.get("input")
    data = data.encode() if isinstance(data, str) else b""

    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
            **kwargs)
    except OSError as exc:
        # As a shell would say it: 127 not found, 126 not executable.
        rc = 127 if isinstance(exc, FileNotFoundError) else 126
        return {"rc": rc, "out": "", "err": "%s: %s\n" % (argv[0], exc),
                "timed_out": False, "duration": 0.0}
    rid = req.get("id")
    with _running_lock:
        _running[rid] = proc
    timed_out = False
    try:
        out, err = proc.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        # The command got its own session: take the whole group down.
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            # A grandchild that left the group still holds the pipes.
            proc.kill()
            proc.wait()
            out, err = b"", b"[agent: output pipes held open after kill]\n"
    finally:
        with _running_lock:
            _running.pop(rid, None)
    return {"rc": proc.returncode, "out": _decode(out), "err": _decode(err),
            "timed_out": timed_out,
            "duration": round(time.monotonic() - start, 3)}


def handle(line):
    try:
        req = json.loads(line)
    except ValueError as exc:
        return {"id": None, "rc": 255, "out": "", "err": "",
                "error": "bad request: %s" % exc}
    rid = req.get("id") if isinstance(req, dict) else None
    try:
        if not isinstance(req, dict):
            raise ValueError("request must be a JSON object")
        op = req.get("op", "run")
        if op == "ping":
            reply = {"rc": 0, "out": "pong", "err": ""}
        elif op == "cancel":
            found = cancel(req.get("target"))
            reply = {"rc": 0 if found else 1, "out": "", "err": ""}
        elif op == "run":
            reply = run_command(req)
        else:
            raise ValueError("unknown op %r" % op)
    except Exception as exc:  # keep serving whatever one request does
        reply = {"rc": 255, "out": "", "err": "",
                 "error": "%s: %s" % (type(exc).__name__, exc)}
    reply["id"] = rid
    return reply


def open_port(path):
    while True:
        try:
            return os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            # udev may not have made the symlink yet this early in boot.
            log("waiting for %s (%s)" % (path, exc.strerror))
            time.sleep(0.5)


class Port:
    """The virtio-serial port: whole lines out, one writer at a time."""

    def __init__(self, path):
        self.fd = open_port(path)
        self.lock = threading.Lock()

    def reply(self, obj):
        data = memoryview((json.dumps(obj) + "\n").encode())
        with self.lock:
            while data:
                data = data[os.write(self.fd, data):]


def _serve_one(port, line):
    try:
        reply = handle(line)
    except BaseException as exc:  # never lose the answer
        reply = {"id": None, "rc": 255, "out": "", "err": "",
                 "error": "agent: %s" % exc}
    try:
        port.reply(reply)
    except OSError as exc:
        log("could not answer request %s: %s" % (reply.get("id"), exc))


def serve(path):
    port = Port(path)
    log("listening on %s" % path)
    buf = b""
    while True:
        chunk = os.read(port.fd, 65536)
        if not chunk:
            # No host connected: the port reads as EOF until one is.  A
            # half-sent line from a client that went away is worthless, and
            # so is whatever it left running.
            if buf or _running:
                log("host went away: dropping its requests (%d killed)"
                    % cancel_all())
            buf = b""
            time.sleep(0.1)
            continue
        buf += chunk
        while b"\n" in buf:
            raw, buf = buf.split(b"\n", 1)
            line = raw.decode("utf-8", errors="replace")
            if not line.strip():
                continue
            try:
                op = json.loads(line).get("op", "run")
            except (ValueError, AttributeError):
                op = None
            if op == "run":
                threading.Thread(target=_serve_one, args=(port, line),
                                 daemon=True).start()
            else:
                _serve_one(port, line)  # instant: no thread needed


def main(argv):
    path = DEFAULT_PORT
    if len(argv) >= 2 and argv[0] == "--port":
        path = argv[1]
    serve(path)


if __name__ == "__main__":
    main(sys.argv[1:])

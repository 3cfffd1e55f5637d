"""A mutation fuzzer: real dispatch requests, bent out of shape, sent by an unprivileged user.

The seeds are recorded from the real ``dispatch`` (run as hpcb-alice against
a recording socket), so they are exactly what the client sends. Each is
mutated (out-of-range numbers, wrong types, huge and deep values, missing
and unknown fields, other verbs and versions, corrupt and inconsistent
bytes) and sent by hpcb-alice, one connection a frame. Every frame must get
an answer, every refusal must be one line and never an internal error, and
another user must be served throughout. Then the queue is let run and the
daemon restarted: it comes back with every accepted job, its memory bounded.

$HPC_BATCH_FUZZ_N frames (CI runs the default; the hardening issue's
closing note records a run of 10,000), $HPC_BATCH_FUZZ_SEED picks them.
"""

import base64
import json
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import threading

import pytest
from conftest import DISPATCH, wait_for

N = int(os.environ.get("HPC_BATCH_FUZZ_N", "2000"))
SEED = int(os.environ.get("HPC_BATCH_FUZZ_SEED", "20261201"))
CHUNK = 500            # frames between liveness checks
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300 + N // 10)]
HEADER = struct.Struct(">I")
WIRE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wire.py")

HOSTILE = [0, -1, 1, 2 ** 31, 2 ** 63, -2 ** 63, 10 ** 400, -10 ** 400, 1.5, -0.0, float("nan"),
           float("inf"), True, False, None, "", "x" * 100_000, "\x00", "\n\x1b[2J", "\udcff", [], {},
           [0] * 10_000, "/", "relative/path", "../../etc/shadow", "/etc/passwd", "/proc/self/fd/0",
           "/dev/tty", "/tmp", {"a": 1}, ["true"], ["", ""]]


NEST = "__nest__"


def _nested(depth: int, kind: str) -> str:
    """JSON text nested *depth* deep (built as text: the encoder itself would give up)."""
    if kind == "list":
        return "[" * depth + "0" + "]" * depth
    return '{"a":' * depth + "0" + "}" * depth


def record_seeds(scratch, user, home):
    """The frames the real dispatch sends for a handful of commands, as *user*."""
    path = os.path.join(scratch, "recorder.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o666)
    server.listen(8)
    seeds = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            buf = b""
            while len(buf) < 4 or len(buf) < 4 + HEADER.unpack_from(buf)[0]:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                buf += chunk
            if len(buf) >= 4:
                seeds.append(json.loads(buf[4:4 + HEADER.unpack_from(buf)[0]]))
            body = json.dumps({"v": 1, "ok": False, "error": "recorded"}).encode()
            conn.sendall(HEADER.pack(len(body)) + body)
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    commands = [
        ("new", "--", "true"),
        ("new", "--cpu", "1", "--max-mem", "512M", "--max-time", "10s", "--no-output", "--", "true"),
        ("new", "--env", "--output", home, "--numa-local", "--", "FOO=bar", "echo", "hi"),
        ("new", "--name", "prep", "--after-ok", "1", "--json", "--", "true"),
        ("new", "--exclusive", "--gpu-cores", "0", "--", "true"),
        ("list", "--all", "--finished"),
        ("kill", "1"),
        ("attach", "1"),
        ("show", "prep"),
        ("status",),
        ("job", "1", "max-time", "add", "1h"),
    ]
    for cmd in commands:
        subprocess.run(["runuser", "-u", user, "--", "env", f"HPC_BATCH_SOCKET={path}", DISPATCH, *cmd],
                       cwd=home, capture_output=True, timeout=60)
    server.close()
    t.join(timeout=10)
    assert len(seeds) == len(commands), seeds
    return seeds


def mutate(rng: random.Random, seed: dict) -> bytes:
    """One hostile frame (header included) made from *seed*."""
    msg = json.loads(json.dumps(seed))
    args = msg.setdefault("args", {})
    how = rng.randrange(12)
    if how <= 4 and args:                              # a field gets a hostile value
        key = rng.choice(sorted(args))
        args[key] = rng.choice(HOSTILE)
    elif how == 5 and args:                            # a field goes missing
        del args[rng.choice(sorted(args))]
    elif how == 6:                                     # an unknown field, or a known one in the wrong place
        args[rng.choice(["uid", "user", "id", "offset", "umask", "output_is_dir", "zzz"])] = rng.choice(HOSTILE)
    elif how == 7:                                     # deep nesting where a value goes
        args[rng.choice(sorted(args) or ["argv"])] = NEST
    elif how == 8:                                     # the envelope itself
        field = rng.choice(["v", "op", "args"])
        msg[field] = rng.choice(HOSTILE + ["new", "list", "kill", "attach", "ping", "NEW"])
    elif how == 9:                                     # not an object at all
        msg = rng.choice([[msg], "text", 42, None])
    if how == 10:                                      # bytes: flipped, truncated (consistent header), garbage
        body = bytearray(json.dumps(msg).encode())
        for _ in range(rng.randint(1, 8)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        body = bytes(body[:rng.randint(1, len(body))])
        return HEADER.pack(len(body)) + body
    if how == 11:                                      # raw oddities
        choice = rng.randrange(4)
        if choice == 0:
            body = b"[" * rng.choice([1000, 100_000, 1_000_000])
        elif choice == 1:
            body = b"\xff\xfe" * 100
        elif choice == 2:
            return HEADER.pack((4 << 20) + rng.randint(1, 1 << 30))   # declared too big
        else:
            body = b""
        return HEADER.pack(len(body)) + body
    text = json.dumps(msg)
    if how == 7:
        text = text.replace(f'"{NEST}"', _nested(rng.choice([50, 900, 5000]), rng.choice(["list", "dict"])))
    body = text.encode("utf-8", "surrogatepass")
    return HEADER.pack(len(body)) + body


def _send(d, user, frames, scratch):
    wire = os.path.join(scratch, "wire.py")
    if not os.path.exists(wire):
        shutil.copy(WIRE, wire)
        os.chmod(wire, 0o755)
    lines = "".join(base64.b64encode(f).decode() + "\n" for f in frames)
    r = subprocess.run(["runuser", "-u", user, "--", sys.executable, "-I", wire, d.socket, "15"],
                       input=lines, capture_output=True, text=True, timeout=60 + 20 * len(frames))
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def _rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    return 0


def test_mutated_requests_from_a_user(daemon_factory, users, scratch):
    alice, bob = users["alice"], users["bob"].pw_name
    home = os.path.join(scratch, "alice")
    os.mkdir(home)
    os.chown(home, alice.pw_uid, alice.pw_gid)
    seeds = record_seeds(scratch, alice.pw_name, home)
    d = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0", "--max-lifetime", "1h")
    # A root job holds the machine while the fuzz runs, so what gets accepted only queues.
    blocker = d.submit("sleep", "3600", flags=("--exclusive", "--no-output"))
    rng = random.Random(SEED)
    stats = {"answered": 0, "ok": 0, "refused": 0}
    sent = 0
    while sent < N:
        frames = [mutate(rng, rng.choice(seeds)) for _ in range(min(CHUNK, N - sent))]
        replies = _send(d, alice.pw_name, frames, scratch)
        assert len(replies) == len(frames)
        for frame, reply in zip(frames, replies):
            assert isinstance(reply, dict), f"no answer to {frame[:200]!r}"
            stats["answered"] += 1
            if reply.get("ok"):
                stats["ok"] += 1
            else:
                stats["refused"] += 1
                error = reply.get("error")
                assert isinstance(error, str) and "\n" not in error, reply
                assert "internal error" not in error, (frame[:300], reply)
        sent += len(frames)
        assert d.dispatch("list", user=bob, timeout=10).returncode == 0   # another user is served
        assert d.proc.poll() is None, d.log()
    assert _rss(d.proc.pid) < 200 << 20
    # Let the queue run, then restart: everything accepted is still there and ends.
    d.ok("kill", str(blocker))
    wait_for(lambda: not d.jobs("--all"), timeout=120 + N // 5, interval=0.5, what="the queue drained")
    before = set(d.rows("--all", "--finished"))
    d.stop()
    d2 = daemon_factory("--reserve-cpu", "0", "--reserve-mem", "0", "--max-lifetime", "1h")
    assert set(d2.rows("--all", "--finished")) == before
    assert d2.dispatch("list", user=bob).returncode == 0
    print(f"fuzz: {N} frames, {stats['ok']} accepted, {stats['refused']} refused, all answered; "
          f"daemon RSS {_rss(d.proc.pid if d.proc.poll() is None else d2.proc.pid) >> 20} MiB")

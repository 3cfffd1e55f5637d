"""A user timing the daemon's answers: ``list`` and ``new`` (then ``kill``), round after round.

Run as a script by a test user (``runuser -u hpcb-bob -- python -E -s
answer_probe.py SOCKET CWD PAUSE ROUNDS``) beside a copy of ``wire.py``. It
prints ``ready`` once its first round is answered, loops until it has made
ROUNDS rounds (0: until its stdin is closed), pausing PAUSE seconds between
them, then prints one JSON document: every request it made, with when it
began (``at``, the wall clock, to place it against what the test did
meanwhile) and how long the answer took (``dt``, seconds).

What ``dt`` covers: from just before the connect to the whole reply read and
decoded, in this long-lived process. It is the daemon's answer time as a
client on the same machine sees it, without the start-up of a ``dispatch``
process. Each ``new`` is cancelled at once with ``kill`` (timed too), so the
user's own queue stays at most one job long and ``list`` measures the
daemon, not the size of this user's listing. Standard library only.
"""

import json
import os
import select
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wire import frame, read_reply

WAIT = 600.0   # seconds one answer may take before it counts as none (a stall is measured, not cut)


def ask(path: str, op: str, **args):
    """One request on a connection of its own: (wall time it began, seconds it took, reply or None)."""
    at, t0 = time.time(), time.perf_counter()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        sock.sendall(frame({"v": 1, "op": op, "args": args}))
        reply = read_reply(sock, WAIT)
    except OSError:
        reply = None
    finally:
        sock.close()
    return at, time.perf_counter() - t0, reply


def stdin_closed() -> bool:
    ready, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(ready) and sys.stdin.readline() == ""


def main(argv) -> int:
    path, cwd = argv[1], argv[2]
    pause, rounds = float(argv[3]), int(argv[4])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    samples = []

    def note(op, at, dt, reply):
        ok = bool(reply and reply.get("ok"))
        samples.append({"op": op, "at": at, "dt": dt, "ok": ok,
                        "error": None if ok else (reply or {}).get("error", "no answer")})
        return reply["result"] if ok else None

    done = 0
    while done < rounds if rounds else not stdin_closed():
        note("list", *ask(path, "list"))
        made = note("new", *ask(path, "new", argv=["true"], cwd=cwd, no_output=True, umask=0o022,
                                base_env=env))
        if made is not None:
            samples[-1]["id"] = made["id"]
            note("kill", *ask(path, "kill", id=made["id"]))
        done += 1
        if done == 1:
            print("ready", flush=True)
        time.sleep(pause)
    json.dump({"samples": samples}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

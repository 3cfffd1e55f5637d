"""The soak's unprivileged clients over raw frames: a pinger that times answers, and a connection hoarder.

Run as a script by a test user beside a copy of ``wire.py`` (standard library
only: the user may not be able to read the checkout):

- ``soak_user.py ping SOCKET PAUSE``: until its stdin is closed, asks
  ``ping`` then ``list``, each on a connection of its own, PAUSE seconds
  apart; prints ``ready`` once the first is answered, and at the end one JSON
  document with every request: when it began (``at``, the wall clock, to place
  it against the daemon's reloads and restarts), how long it took (``dt``,
  from just before the connect to the whole reply read) and whether it was
  answered.
- ``soak_user.py hoard SOCKET N``: opens N connections and holds them,
  prints how many connected, and closes them all when a line (or EOF) comes
  on stdin: the user at the daemon's --max-connections-per-user.
"""

import json
import os
import select
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from answer_probe import ask  # one request on a connection of its own, timed


def stdin_closed(pause):
    """Whether stdin reached EOF within *pause* seconds (the pacing between requests)."""
    ready, _, _ = select.select([sys.stdin], [], [], pause)
    return bool(ready) and sys.stdin.readline() == ""


def ping(path, pause):
    samples = []
    announced = False
    while True:
        for op in ("ping", "list"):
            at, dt, reply = ask(path, op)
            ok = bool(reply and reply.get("ok"))
            samples.append({"op": op, "at": at, "dt": dt, "ok": ok,
                            "error": None if ok else (reply or {}).get("code", "no answer")})
            if ok and not announced:
                print("ready", flush=True)
                announced = True
        if stdin_closed(pause):
            break
    json.dump({"samples": samples}, sys.stdout)


def hoard(path, n):
    held = []
    for _ in range(n):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            continue
        held.append(sock)
    print(len(held), flush=True)
    sys.stdin.readline()
    for sock in held:
        sock.close()


def main(argv):
    if argv[1] == "ping":
        ping(argv[2], float(argv[3]))
    else:
        hoard(argv[2], int(argv[3]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

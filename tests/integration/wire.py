"""Raw protocol frames from a real, unprivileged user: the hostile client.

Run as a script by a test user (``runuser -u hpcb-bob -- python wire.py
SOCKET``): each line on stdin is a base64 string of bytes to send as they
are (a frame, a half frame, garbage) on a connection of its own; each line
on stdout is the JSON reply to it, ``null`` if the daemon closed the
connection (or sat on it) without one. Standard library only, and kept
apart from the package, because it must run as a user who may not be able
to read the checkout.
"""

import base64
import json
import socket
import struct
import sys

HEADER = struct.Struct(">I")


def frame(obj) -> bytes:
    """One frame holding *obj* as JSON (NaN and huge ints are sent as Python writes them)."""
    body = json.dumps(obj).encode("utf-8", "surrogatepass")
    return HEADER.pack(len(body)) + body


def read_reply(sock, timeout: float):
    """The next whole frame from *sock* as an object, or None on EOF or timeout."""
    sock.settimeout(timeout)
    buf = b""
    try:
        while True:
            if len(buf) >= 4:
                (size,) = HEADER.unpack_from(buf)
                if len(buf) >= 4 + size:
                    return json.loads(buf[4:4 + size])
            chunk = sock.recv(1 << 16)
            if not chunk:
                return None
            buf += chunk
    except (OSError, ValueError):
        return None


def main(argv) -> int:
    path = argv[1]
    timeout = float(argv[2]) if len(argv) > 2 else 10.0
    for line in sys.stdin:
        data = base64.b64decode(line.strip())
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            sock.sendall(data)
            reply = read_reply(sock, timeout)
        except OSError:
            reply = None
        finally:
            sock.close()
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""systemd's readiness protocol (sd_notify) with the standard library only.

systemd hands a ``Type=notify`` service the address of a datagram socket in
``$NOTIFY_SOCKET``; the service sends newline-separated ``KEY=VALUE`` states
to it (``READY=1``, ``RELOADING=1``, ``STOPPING=1``, ``STATUS=...``). An
address starting with ``@`` lives in the abstract namespace: the ``@``
stands for a leading NUL byte.

Outside systemd (development, tests) ``$NOTIFY_SOCKET`` is unset and every
call is a no-op returning False, so callers never need to check first.

The variable is deliberately left in the environment (unlike
``sd_notify(unset_environment=1)``): the daemon re-execs itself on reload
under the same pid and must be able to send ``READY=1`` again afterwards.
Children that are not the main process should not inherit it; with
``NotifyAccess=main`` systemd ignores them anyway.
"""

from __future__ import annotations

import os
import socket
import time

__all__ = ["notify", "ready", "reloading", "stopping", "status"]


def _address(raw: str) -> str | None:
    """Map a ``$NOTIFY_SOCKET`` value to an AF_UNIX address, or None."""
    if raw.startswith("@"):
        return "\0" + raw[1:]
    if raw.startswith("/"):
        return raw
    # vsock: and other transports are for VMs and containers; not needed
    # by a daemon run directly by the host's systemd.
    return None


def notify(*states: str) -> bool:
    """Send ``states`` (each ``KEY=VALUE``) to systemd in one datagram.

    Returns True when the message was sent, False when there is no
    notification socket or sending failed: readiness reporting must never
    take the daemon down.
    """
    raw = os.environ.get("NOTIFY_SOCKET", "")
    address = _address(raw) if raw else None
    if address is None or not states:
        return False
    payload = "\n".join(states).encode("utf-8")
    try:
        with socket.socket(socket.AF_UNIX,
                           socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(payload)
    except OSError:
        return False
    return True


def ready() -> bool:
    """Tell systemd the service is up (the socket accepts jobs)."""
    return notify("READY=1")


def reloading() -> bool:
    """Tell systemd a reload has begun; send ``ready()`` when it is done.

    systemd >= 253 (``Type=notify-reload``) wants the CLOCK_MONOTONIC time
    of the reload start with it, to tell this reload from an older one;
    earlier versions ignore the extra field.
    """
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify("RELOADING=1", f"MONOTONIC_USEC={usec}")


def stopping() -> bool:
    """Tell systemd the service is shutting down of its own accord."""
    return notify("STOPPING=1")


def status(text: str) -> bool:
    """Set the one-line status shown by ``systemctl status``."""
    # A newline would end the STATUS field and start a bogus new state.
    line = " ".join(text.splitlines())
    return notify(f"STATUS={line}")

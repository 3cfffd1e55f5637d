"""One handler per verb: the daemon's side of each ``dispatch`` command.

Each takes the engine, the caller (from SO_PEERCRED) and the validated
payload, and returns a reply message. ``attach`` is not here: it streams, so
the server owns it.
"""

from . import __version__, protocol
from .engine import Refused


def new(engine, caller, req, now):
    """``dispatch new``."""
    return protocol.ok(**engine.submit(caller, req, now))


def list_jobs(engine, caller, req, now):
    """``dispatch list [--all] [--finished]``."""
    if req.all and not (caller.is_admin or engine.cfg.list_is_public):
        raise Refused("only members of the admin group may list all users' jobs "
                      "(the admin can allow everyone with --list-is-public)", "forbidden")
    jobs = engine.visible(caller, req.all, req.finished)
    return protocol.ok(jobs=[engine.summary(j) for j in jobs], now=now)


def kill(engine, caller, req, now):
    """``dispatch kill ID``."""
    return protocol.ok(**engine.kill(caller, req.id, now))


def ping(engine, caller, req, now):
    """Liveness and version."""
    return protocol.ok(version=__version__, protocol=protocol.VERSION)


HANDLERS = {"new": new, "list": list_jobs, "kill": kill, "ping": ping}

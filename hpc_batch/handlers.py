"""One handler per verb: the daemon's side of each ``dispatch`` command.

Each takes the engine, the caller (from SO_PEERCRED) and the validated
payload, and returns a reply message. ``attach`` and ``wait`` are not here:
they hold their connection until the daemon has something to say, so the
server owns them.
"""

from collections.abc import Callable
from typing import Any

from . import __version__, protocol
from .access import Caller
from .engine import Engine, Refused
from .protocol import JobRef, JobSetting, ListJobs, NewJob, Ping, Status

# (engine, caller, validated payload of the handler's own verb, now) -> reply message
Handler = Callable[[Engine, Caller, Any, float], dict[str, Any]]


def new(engine: Engine, caller: Caller, req: NewJob, now: float) -> dict[str, Any]:
    """``dispatch new``."""
    return protocol.ok(**engine.submit(caller, req, now))


def list_jobs(engine: Engine, caller: Caller, req: ListJobs, now: float) -> dict[str, Any]:
    """``dispatch list [--all] [--finished]``."""
    if req.all and not (caller.is_admin or engine.cfg.list_is_public):
        raise Refused("only members of the admin group may list all users' jobs "
                      "(the admin can allow everyone with --list-is-public)", "forbidden")
    jobs = engine.visible(caller, req.all, req.finished)
    return protocol.ok(jobs=[engine.summary(j) for j in jobs], now=now)


def kill(engine: Engine, caller: Caller, req: JobRef, now: float) -> dict[str, Any]:
    """``dispatch kill ID``."""
    return protocol.ok(**engine.kill(caller, req.id, now))


def job(engine: Engine, caller: Caller, req: JobSetting, now: float) -> dict[str, Any]:
    """``dispatch job ID max-time get|set D|add D``."""
    return protocol.ok(**engine.job_setting(caller, req, now))


def show(engine: Engine, caller: Caller, req: JobRef, now: float) -> dict[str, Any]:
    """``dispatch show JOB``."""
    return protocol.ok(job=engine.show(caller, req.id, now), now=now)


def status(engine: Engine, caller: Caller, req: Status, now: float) -> dict[str, Any]:
    """``dispatch status``."""
    return protocol.ok(**engine.status(now, caller))


def ping(engine: Engine, caller: Caller, req: Ping, now: float) -> dict[str, Any]:
    """Liveness and version."""
    return protocol.ok(version=__version__, protocol=protocol.VERSION)


HANDLERS: dict[str, Handler] = {"new": new, "list": list_jobs, "kill": kill, "show": show, "status": status,
                                 "job": job, "ping": ping}

"""What a reload re-execs: the unit's *current* ExecStart, so changed flags apply.

``systemctl daemon-reload && systemctl reload hpc-batch`` is documented to
apply new daemon flags without touching running jobs. SIGHUP carries no
arguments, so on reload the daemon asks systemd for its unit's ExecStart as
it is now. If that is not possible (not under systemd) or the new flags do
not parse, it re-execs exactly what it was started with and says so.
"""

import logging
import os
import subprocess
import sys
from collections.abc import Callable

from .cgroups import own_cgroup

log = logging.getLogger("hpc-batchd")


def parse_exec_start(text: str):
    """The argv in ``systemctl show -p ExecStart --value`` output, or None."""
    start = text.find("argv[]=")
    if start < 0:
        return None
    end = text.find(" ;", start)
    body = text[start + len("argv[]="):end if end >= 0 else None].strip()
    return body.split() or None


def _unit() -> str | None:
    leaf = os.path.basename(own_cgroup())
    return leaf if leaf.endswith(".service") else None


def current_argv(parse_args: Callable[[list[str]], object], errors: tuple[type[BaseException], ...]):
    """(executable, argv) for the re-exec; *parse_args* checks the unit's new flags, raising one of
    *errors* on flags that cannot be used (passed in: the daemon's main imports this module)."""
    fallback = (sys.executable, list(sys.orig_argv))
    unit = _unit() if os.environ.get("INVOCATION_ID") else None
    if unit is None:
        return fallback
    try:
        out = subprocess.run(["systemctl", "show", "--property=ExecStart", "--value", unit],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("cannot ask systemd for %s's ExecStart (%s); keeping the current flags", unit, exc)
        return fallback
    argv = parse_exec_start(out)
    if not argv or not os.access(argv[0], os.X_OK):
        log.warning("cannot read %s's ExecStart; keeping the current flags", unit)
        return fallback
    try:
        parse_args(argv[1:])
    except errors as exc:
        log.error("the unit's new flags are invalid (%s); keeping the current flags", exc)
        return fallback
    return argv[0], argv

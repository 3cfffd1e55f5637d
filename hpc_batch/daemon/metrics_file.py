"""``hpc-batchd --metrics-file PATH``: keep a Prometheus text file current.

node_exporter's textfile collector reads every ``*.prom`` file in its
directory at each scrape, so the file is replaced whole (a temporary file in
the same directory, then a rename) and is never seen half written. It is
rewritten when what it says changes, at most once a second however busy the
queue is, from the event loop's timer: a burst of submits costs one write.
The file is 0640, group ``--metrics-group`` (by default the directory's
group): node_exporter reads it through that group, other users cannot
(per-user job counts are not theirs to see). The directory must be one
only root (and that group, when named) can write to, or the daemon refuses
to start: a writable directory would let anyone drop ``*.prom`` files for
node_exporter to serve. The temporary name is random, so nothing can be
planted at it in advance.

The write is a few kilobytes with no fsync (a file lost in a power cut is
rewritten at the next start), so it never holds up the loop; one that fails
(full disk, a directory gone) keeps the old file, is logged at most once per
interval and is retried.

This module needs only the standard library: ``prometheus_client`` is
imported (through ``metrics``) only once ``--metrics-file`` is given, and
its absence is a refusal to start. That import happens at start-up, when
the flag is checked (``check``), never later: a long-lived daemon loads no
file after an upgrade may have replaced it.
"""

from __future__ import annotations

import grp
import logging
import os
import secrets
import stat
import struct
import sys
import time
from types import ModuleType
from typing import TYPE_CHECKING

from shepherd.base import acl, records

from .. import __version__
from .ratelog import RateLimited

if TYPE_CHECKING:   # at run time only once --metrics-file is given
    from ..core.metrics import Snapshot, Tally
    from .engine import Engine

log = logging.getLogger("hpc-batchd")
rlog = RateLimited(log)

SUFFIX = ".prom"            # node_exporter's textfile collector reads only these
INTERVAL = 1.0              # seconds between two writes at the most
RETRY = 10.0                # seconds before a failed write is tried again
CARRY_ENV = "HPC_BATCH_METRICS_TALLY"   # the counters, handed across a reload's re-exec
EXTRA = "hpc-batch[metrics]"
ACL_USER, ACL_GROUP = 0x02, 0x08   # named entries of a POSIX ACL (linux/posix_acl_xattr.h)


class MetricsError(Exception):
    """Why --metrics-file cannot be used, in one line."""


def check(path: str, group: str = "") -> tuple[str, int]:
    """The absolute metrics path and the group that reads it, or MetricsError.

    Refused: a bad path, a directory that users other than root (or *group*,
    when named) could write in or replace, an unknown group, or
    prometheus_client missing. Without *group* the file gets its
    directory's group.
    """
    full = os.path.abspath(path)
    directory, name = os.path.split(full)
    where = f"--metrics-file {path}"
    if not name.endswith(SUFFIX) or name == SUFFIX:
        raise MetricsError(f"{where}: the name must end in {SUFFIX} (node_exporter's textfile collector "
                           f"reads only those)")
    if not os.path.isdir(directory):
        raise MetricsError(f"{where}: the directory {directory} does not exist; create it (it is "
                           f"node_exporter's --collector.textfile.directory)")
    if os.path.isdir(full):
        raise MetricsError(f"{where}: that is a directory; name a file in it")
    if not os.access(directory, os.W_OK):
        raise MetricsError(f"{where}: cannot write to {directory}")
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise MetricsError(f"--metrics-group {group}: no such group") from None
    else:
        gid = os.stat(directory).st_gid
    why = others_may_write(directory, gid if group else 0)
    if why:
        raise MetricsError(f"{where}: refusing a directory others can write to: {why}; make it root's and "
                           f"not writable by others (node_exporter only reads it)")
    try:
        metrics_module()
    except ImportError as exc:
        raise MetricsError(f"{where} needs the prometheus_client package ({exc}); install it with "
                           f"`{sys.executable} -m pip install '{EXTRA}'`") from None
    if gid == 0 and os.geteuid() == 0:
        log.warning("%s: the file will be readable by root and group root only; if node_exporter runs as "
                    "another user, name its group with --metrics-group", where)
    return full, gid


def metrics_module() -> ModuleType:
    """``hpc_batch.core.metrics`` (and with it prometheus_client, the optional extra); ImportError without it.

    The one import the daemon makes after its module-level ones, and only at
    start-up: ``check`` calls this while the flags are parsed.
    """
    from ..core import metrics  # the optional extra: loaded once --metrics-file is checked, at start-up
    return metrics


def others_may_write(directory: str, group: int) -> str | None:
    """Why someone other than root, this daemon's user or group *group* could write in *directory*
    or swap it (through a parent), or None.

    The directory must not be writable by others, nor by a group but *group*
    (0: none), nor through an ACL entry; each parent must be owned likewise
    and, unless sticky, not writable by others either.
    """
    me = os.geteuid()
    path = os.path.realpath(directory)
    first = True
    while True:
        st = os.stat(path)
        mode = st.st_mode
        if st.st_uid not in (0, me):
            return f"{path} belongs to uid {st.st_uid}"
        if first or not mode & stat.S_ISVTX:
            if mode & stat.S_IWOTH:
                return f"{path} is writable by everyone (mode {stat.S_IMODE(mode):04o})"
            if mode & stat.S_IWGRP and st.st_gid not in (0, group):
                return f"{path} is writable by its group {_group_name(st.st_gid)}"
            why = _acl_writer(path, me, group)
            if why:
                return why
        if path == "/":
            return None
        path = os.path.dirname(path)
        first = False


def _acl_writer(path: str, me: int, group: int) -> str | None:
    """Why *path*'s ACL lets some named user or group write, or None."""
    try:
        blob = os.getxattr(path, acl.XATTR)
    except OSError:
        return None            # no ACL (or no ACL support): the mode said it all
    for off in range(4, len(blob) - 7, 8):
        tag, perm, ident = struct.unpack_from("<HHI", blob, off)
        if perm & 2 and ((tag == ACL_USER and ident not in (0, me)) or (tag == ACL_GROUP and ident not in (0, group))):
            return f"{path} has an ACL entry letting {'uid' if tag == ACL_USER else 'gid'} {ident} write"
    return None


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def write_atomic(path: str, data: bytes, gid: int = -1) -> None:
    """Replace *path* with *data* in one rename (0640, group *gid*, whatever the umask: node_exporter
    reads it through its group); raises OSError and leaves the old file on failure."""
    directory, name = os.path.split(path)
    # Not *.prom, so the collector never reads it; a random name no one can plant in advance.
    tmp = os.path.join(directory, f".{name}.{secrets.token_hex(8)}.tmp")

    def group(fd: int) -> None:
        if gid >= 0 and os.geteuid() == 0:
            os.fchown(fd, 0, gid)

    records.write_atomic(path, data, 0o640, durable=False, exclusive=True, tmp=tmp, prepare=group)


def remove_stale_temps(path: str) -> None:
    """Remove temporary files a daemon that died mid-write left beside *path* (plain files of ours only)."""
    directory, name = os.path.split(path)
    prefix = f".{name}."
    try:
        with os.scandir(directory) as it:
            for d in it:
                if d.name.startswith(prefix) and d.name.endswith(".tmp"):
                    st = d.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                        os.unlink(d.path)
    except OSError as exc:
        log.warning("metrics: cannot clear old temporary files beside %s (%s)", path, exc)


class MetricsFile:
    """The metrics file of one daemon: counts the engine's job events, rewrites the file on change."""

    def __init__(self, path: str, engine: Engine, carried: str = "", gid: int = -1):
        self.path = path
        self.gid = gid
        self.engine = engine
        remove_stale_temps(path)
        self.tally = self._tally(carried)
        log.info("metrics: keeping %s current (counters since %s)", path,
                 time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.tally.start_time)))
        self.written: Snapshot | None = None   # what the file says now
        self.not_before = 0.0           # no write before this (time.time())

    @staticmethod
    def _tally(carried: str) -> Tally:
        metrics = metrics_module()
        if carried:
            try:
                return metrics.Tally.from_text(carried)
            except ValueError as exc:
                log.warning("metrics: the counters handed over by the last daemon are unusable (%s); "
                            "counting from zero", exc)
        return metrics.Tally(start_time=time.time())

    def job_event(self, job_id: int, kind: str) -> None:
        """The engine's job event (submitted, started, finished): count it."""
        job = self.engine.jobs.get(job_id)
        self.tally.note(kind, job.result.kind if job is not None and job.result is not None else None)

    def snapshot(self) -> Snapshot:
        """The engine's state now, as metrics.take sees it."""
        eng = self.engine
        return metrics_module().take(eng.jobs.values(), eng.machine, eng.limits, eng.table.allocs(),
                                     self.tally, __version__)

    def tick(self, now: float) -> float | None:
        """Write the file if what it says changed; returns when to look again (None: at the next event).

        Called on every turn of the event loop; never raises. The state is
        looked at (and the file written) at most once per INTERVAL.
        """
        if self.not_before - now > RETRY:
            self.not_before = now          # the clock went back: do not stall until it catches up
        if now < self.not_before:
            return self.not_before         # looked (or failed) a moment ago: look again then
        try:
            snap = self.snapshot()
            if snap == self.written:
                # Looked at most once an interval too: a flood of requests that change nothing costs no more.
                self.not_before = now + INTERVAL
                return None
            write_atomic(self.path, metrics_module().render(snap), self.gid)
        except OSError as exc:
            rlog.error("metrics-write", "cannot write the metrics file %s (%s); keeping the old one, "
                       "retrying every %ds", self.path, exc.strerror or exc, RETRY)
            self.not_before = now + RETRY
            return self.not_before
        except Exception:   # a bug in the metrics must not take the daemon down
            rlog.exception("metrics-error", "cannot build the metrics for %s", self.path)
            self.not_before = now + RETRY
            return self.not_before
        self.written = snap
        self.not_before = now + INTERVAL
        return None

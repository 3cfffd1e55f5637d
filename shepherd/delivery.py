"""The shepherd's last act: the job's output (and its record) to the user's files, within a time limit.

After exit.json is written, the buffer is copied to the log file by a
child running as the user (``output.fork_as_user``); only once that child
says the copy is fsynced is the buffer, the only other copy, removed. Past
the buffer bound a relay child is already writing the log: it is waited
for instead. ``dispatch new --record FILE`` gets record.json copied the
same way. A copy that outlasts ``delivery_limit``, or that a "stop" on the
FIFO or a signal to the shepherd interrupts, is killed; delivery.json says
how it went, unless all went well with nothing to say (then its absence,
with the buffer's, says so).

These functions run in the Supervisor's poll loop (shepherd/main.py), so
the FIFO and signals are heard while a copy runs. They take the part of
it they use, :class:`Delivering`, as *sup*: its poll loop, its fork and
what it knows of the job, never the supervisor's module.
"""

import os
import signal
import time

try:
    from shepherd import output
    from shepherd.base import records
except ImportError:  # run as a file: siblings are on sys.path
    # The same modules, found as top-level ones: mypy sees each name bound twice.
    import output  # type: ignore[no-redef]
    from base import records  # type: ignore[no-redef]

# Not typing.TYPE_CHECKING: importing typing would load it (and re) into the fork server, about
# 0.9 MB that every shepherd maps; mypy honours a plain constant of that name alike.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Protocol

    from shepherd.base.records import DeliveryRecord, LaunchSpec
    from shepherd.output import OutputPump
    from shepherd.record.recorder import Recorder

    class Delivering(Protocol):
        """What delivery asks of the shepherd's supervisor (shepherd/main.py's ``Supervisor``)."""

        job_dir: str
        spec: LaunchSpec
        out: OutputPump
        pid: int | None             # the job's, once forked
        abandon: str | None         # why delivery stops (a "stop" on the FIFO, a signal)
        recorder: Recorder | None   # the record's, when the job has one
        delivery_limit: float
        groups: list[int] | None    # the user's (identity.groups_of), for the children that act as the user
        delivered: DeliveryRecord | None   # how it went, once known (record_delivery writes it down)

        def watch(self, fd: int, handler: Callable[[int], None]) -> None: ...
        def unwatch(self, fd: int) -> None: ...
        def wait(self, until: float) -> None: ...
        def fork_retrying(self, interrupted: Callable[[], bool], limit: float | None = None) -> int: ...
        def record_delivery(self, rec: DeliveryRecord) -> None: ...


def deliver(sup: "Delivering") -> None:
    """Get the output to the user's log file (or drop it), and record the outcome."""
    path = os.path.join(sup.job_dir, records.OUTPUT)
    dest = sup.spec.output
    rec = records.DeliveryRecord(True, dest, None, sup.out.note)
    if sup.out.relay is not None:
        pid, pidfd, report = sup.out.relay
        rec.ok, rec.error = await_child(sup, pid, pidfd, report)
    elif dest is None:
        pass
    elif sup.pid is None:   # never forked: no output, and no log is made (the job may yet run)
        rec.note = "it never started, so no log was written"
        return sup.record_delivery(rec)
    elif sup.abandon:
        rec.ok, rec.error = False, sup.abandon
    else:
        try:   # out of pids, the copy waits (within the delivery limit) rather than fail at once
            pid, report_r = output.fork_as_user(
                lambda: sup.fork_retrying(lambda: bool(sup.abandon), sup.delivery_limit), sup.spec, sup.out.buf,
                groups=sup.groups)
        except OSError as exc:
            rec.ok, rec.error = False, sup.abandon or f"the copy to {dest} could not be started ({exc.strerror})"
        else:
            rec.ok, rec.error = await_child(sup, pid, os.pidfd_open(pid), report_r)
    if rec.ok:
        # The delivery child fsynced the log before it exited 0: only now may
        # the buffer, the only other copy of the output, go.
        records.unlink(path)
    why = deliver_record(sup)
    if why:
        rec.note = f"{rec.note}; {why}" if rec.note else why
    if rec.ok and not rec.note and not (sup.spec.record or {}).get("to"):
        # All of it is in the log (or nothing was to go anywhere), the buffer is gone, and there
        # is nothing to say: the record's absence with the buffer's tells the daemon the same
        # (outcome.delivery_of), so a job makes one file fewer. --notify still learns the log.
        sup.delivered = rec
        return
    sup.record_delivery(rec)


def deliver_record(sup: "Delivering") -> str | None:
    """``dispatch new --record FILE``: copy record.json there as the user; why not, or None."""
    to = (sup.spec.record or {}).get("to")
    if not to or sup.recorder is None or sup.pid is None:
        return None
    if sup.abandon:
        return f"the record was not written to {to}: {sup.abandon}"
    try:
        src = os.open(os.path.join(sup.job_dir, records.RECORD), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return f"the record was not written to {to}: it could not be made ({exc.strerror})"
    try:
        pid, report_r = output.fork_as_user(
            lambda: sup.fork_retrying(lambda: bool(sup.abandon), sup.delivery_limit), sup.spec.replace(output=to), src,
            groups=sup.groups)
    except OSError as exc:
        os.close(src)
        return f"the record was not written to {to}: cannot fork ({exc.strerror})"
    os.close(src)
    ok, why = await_child(sup, pid, os.pidfd_open(pid), report_r)
    return None if ok else f"the record was not written: {why}"


def await_child(sup: "Delivering", pid: int, pidfd: int, report: int):
    """Wait for a delivery child within the time limit; ``(ok, why)``.

    The child runs as the user, who can stop it; a "stop" on the FIFO or a
    signal to the shepherd interrupts it too. It is our unreaped child, so
    killing it by pid is safe.
    """
    done, said = [], []
    sup.watch(pidfd, lambda fd: done.append(True))

    def on_report(fd):
        chunk = os.read(fd, 4096)
        if chunk:
            said.append(chunk)
        else:
            sup.unwatch(fd)
    sup.watch(report, on_report)
    give_up = time.time() + sup.delivery_limit
    why = None
    while not done:
        if sup.abandon:
            why = sup.abandon
        elif time.time() >= give_up:
            why = f"delivery took longer than {int(sup.delivery_limit)}s and was stopped"
        if why:
            os.kill(pid, signal.SIGKILL)
            sup.wait(time.time() + 5)
            break
        sup.wait(give_up)
    _, status = os.waitpid(pid, 0)
    for fd in (pidfd, report):
        sup.unwatch(fd)
    try:
        said.append(os.read(report, 4096))
    except OSError:
        pass
    os.close(pidfd)
    os.close(report)
    text = b"".join(said).decode("utf-8", "replace").strip()
    if why or status != 0 or text:
        return False, why or text or f"the copy failed (status {status})"
    return True, None

"""The daemon's event loop: the socket, client connections, kernel events.

One thread, one selector (the other threads delete evicted job directories,
store.Sweeper, and write and read the history archive, archive.Archive).
Every socket is non-blocking and every reply is buffered, so a slow or
malicious client can only stall itself. The loop
sleeps until something happens: a client writes, a shepherd exits (its pidfd
becomes readable), a job writes output someone is attached to (inotify), a
signal arrives (the wakeup fd), the history archive has committed jobs or
answered a query (its pipe), or the engine's next deadline comes.

Every client is bounded: connections per user (--max-connections-per-user),
bytes of unfinished frames per user, reply bytes a user leaves unread
(--max-reply-bytes-per-user: past it, no more of that user's requests are
read until some are), a deadline to finish a frame once begun, an idle
timeout, and an attach that stops reading is dropped once its backlog has
not moved for as long. Running out of descriptors pauses
accepting for a moment instead of spinning.

The streaming verbs (attach, wait, watch), whose connections stay open for
the daemon to speak next, are in streams.py; this module gives them the
connections' I/O.
"""

import errno
import logging
import os
import selectors
import signal
import socket
import struct
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from shepherd.base import records
from shepherd.base.proc import reap_children

from ..wire import framing, protocol
from . import access, launcher
from .conn import Conn
from .engine import Engine
from .handlers import HANDLERS, Deferred, Submitted
from .hooks import Hooks
from .ratelog import RateLimited
from .refusal import Refused
from .streams import CHUNK, FALLBACK_POLL, STREAMING, Streams

if TYPE_CHECKING:
    from .metrics_file import MetricsFile

log = logging.getLogger("hpc-batchd")
rlog = RateLimited(log)

IDLE_TIMEOUT = 60.0          # a connection that sends no request is dropped
FRAME_DEADLINE = 10.0        # a frame once begun must be complete within this
ACCEPT_PAUSE = 1.0           # out of descriptors: stop accepting for this long
SLOW_TURN = 0.1              # a turn of the loop longer than this is logged, with where it went
PENDING_PER_USER = 2 * framing.MAX_FRAME   # unfinished frame bytes one user may hold in the daemon
_CRED = struct.Struct("3i")


# The signals the loop takes. Those that would end the process are held blocked from main()'s first
# line and across a reload's exec, and let through once start() has its handlers: the socket
# answers before then, so a reload or stop asked that early is taken late rather than fatal.
TAKEN = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)
HELD = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)


def hold_signals() -> None:
    """Block :data:`HELD` until :meth:`Server.start` (kept blocked, and pending, across an exec)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD)


def soonest(*times: float | None) -> float | None:
    """The earliest of *times*, those that are None left out; None if all are."""
    return min((t for t in times if t is not None), default=None)


class Server:
    """Accepts clients and drives the engine."""

    def __init__(self, cfg, listener: socket.socket, engine: Engine, hooks: Hooks):
        self.cfg = cfg
        self.listener = listener
        self.engine = engine
        self.callers = access.Callers(cfg.admin_gid)   # who each connection is (the user database, remembered)
        self.sel = hooks.sel                  # the engine's pidfds are registered on it (hooks.py)
        self.pidfds = hooks.pidfds            # pidfd -> job id
        self.held_replies: list[Conn] = []   # replies waiting for this turn's commit
        self.resume: list[Conn] = []         # connections with whole requests left once their replies went
        self.conns: dict[int, Conn] = {}
        self.signals: list[int] = []
        self.stop_reason: str | None = None   # "reload" / "terminate" / "release" (handoff.py)
        self.per_uid: dict[int, int] = {}     # open connections per user
        self.conns_of: dict[int, set[Conn]] = {}  # uid -> its open connections
        self.stalled: dict[int, set[Conn]] = {}   # uid -> its connections waiting for its replies to drain
        self.accept_paused_until: float | None = None
        self.metrics: MetricsFile | None = None   # --metrics-file: told of job events, ticked by the loop
        self.streams = Streams(engine, self._reply, self._flush, self._close, self._held_back, self._ask_archive)
        hooks.listeners.append(self.job_event)

    def job_event(self, job_id: int, kind: str) -> None:
        """A job event from the engine (through its hooks): the metrics file counts it, streams answer it."""
        if self.metrics is not None:
            self.metrics.job_event(job_id, kind)
        self.streams.job_event(job_id, kind)

    # -- set-up -----------------------------------------------------------------
    def start(self) -> None:
        """Listen, take signals and the archive's answers; before the loop runs."""
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, ("listen", None))
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_r = rfd
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        for sig in TAKEN:
            signal.signal(sig, self._on_signal)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)   # one sent while we started is taken now
        self.sel.register(rfd, selectors.EVENT_READ, ("signal", None))
        self.sel.register(self.engine.finished.archive.fd, selectors.EVENT_READ, ("archive", None))
        if self.streams.inotify:
            self.sel.register(self.streams.inotify.fd, selectors.EVENT_READ, ("inotify", None))
        reap_children()  # shepherds that ended while we were re-executing

    def watch_release(self, fd: int) -> None:
        """In a reload's old image (handoff.py): *fd* readable ends the loop, the new image wants the state."""
        self.sel.register(fd, selectors.EVENT_READ, ("release", None))

    def quiesce_archive(self) -> bool:
        """Stop the archive's threads and stop watching them (before a reload's fork); False if one
        is still busy, so that a fork is unsafe."""
        archive = self.engine.finished.archive
        if archive.fd >= 0:
            self.sel.unregister(archive.fd)   # before stop() closes it: the number may be reused
        return archive.stop()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)

    # -- the loop ---------------------------------------------------------------
    def run(self) -> str:
        """Serve until SIGHUP (returns "reload") or SIGTERM/SIGINT ("terminate")."""
        busy = None   # when the select of this turn returned; None before the first
        kinds: dict[str, int] = {}
        events_s = end_s = 0.0
        clocks = self._clocks()   # what _clocks read when the select of this turn returned
        while self.stop_reason is None:
            now = time.time()
            tick_from = time.monotonic()
            resume, self.resume = self.resume, []
            for conn in resume:
                if not conn.open() or conn.stalled:
                    continue
                if self.streams.waits(conn):
                    self.streams.resume(conn)   # held back while its user was over the reply budget
                elif conn.may_take_request():
                    self._requests(conn)
            wake = self.engine.tick(now)
            self._end_turn()   # what the tick did (starts, ends) is made durable and spawned before we sleep
            timeout = self._timeout(wake, now)
            if busy is not None:
                self._slow_turn(busy, kinds, events_s, end_s, time.monotonic() - tick_from,
                                [b - a for a, b in zip(clocks, self._clocks())])
            ready = self.sel.select(timeout)
            busy = time.monotonic()
            clocks = self._clocks()
            kinds = {}
            for key, mask in ready:
                kind, arg = key.data
                kinds[kind] = kinds.get(kind, 0) + 1
                try:
                    if kind == "listen":
                        self._accept()
                    elif kind == "conn":
                        self._service(arg, mask)
                    elif kind == "pidfd":
                        job_id = self.pidfds.get(arg)
                        if job_id is not None:
                            self.engine.shepherd_exited(job_id)
                    elif kind == "inotify":
                        self.streams.on_inotify()
                    elif kind == "signal":
                        self._drain_signals()
                    elif kind == "archive":
                        self._archive_done()
                    elif kind == "release":
                        self.stop_reason = "release"
                except Exception:  # one bad event must not take the daemon down
                    rlog.exception(f"event-{kind}", "error handling %s event", kind)
                    if kind == "conn":
                        self._close(arg)
            handled = time.monotonic()
            events_s = handled - busy
            self.streams.poll()
            self._end_turn(bulks=True)   # one slice of a bulk a turn of the loop, answers in between
            self._expire_idle()
            self._resume_accepting()
            end_s = time.monotonic() - handled
        return self.stop_reason

    def _clocks(self) -> tuple[float, float, float]:
        """Where a slow turn's time may have gone, each a running total in seconds: the loop thread's
        CPU time, its fsyncs (the journal's, a launch spec's, ...), the waits for the fork server's answers."""
        return time.thread_time(), records.synced_seconds(), launcher.fork_server_wait()

    @staticmethod
    def _slow_turn(busy: float, kinds: dict[str, int], events_s: float, end_s: float, tick_s: float,
                   spent: list[float]) -> None:
        """Log a turn that kept every client waiting longer than SLOW_TURN, with where its time went:
        the events the select returned (each kind counted), the commit and spawns after them, the
        timers with their commit before the next select; and of it all, *spent* (what :meth:`_clocks`
        counted over the turn). What none of them covers was spent waiting: for a CPU, for the GIL
        or in another system call."""
        took = time.monotonic() - busy
        if took > SLOW_TURN:
            what = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"
            cpu, sync, fork = (x * 1e3 for x in spent)
            rlog.warning("slow-turn", "a turn of the loop took %.0f ms: %.0f ms on its events (%s), %.0f ms "
                         "committing and spawning after them, %.0f ms on timers before the next wait; of it, "
                         "%.0f ms on the loop's CPU, %.0f ms in fsyncs, %.0f ms waiting "
                         "for the fork server", took * 1e3, events_s * 1e3, what, end_s * 1e3, tick_s * 1e3,
                         cpu, sync, fork)

    def _end_turn(self, bulks: bool = False) -> None:
        """The engine ends the turn (Engine.end_turn), sending the replies that waited on its commit
        while the first shepherd is forked; then the bulk submits it finished storing are answered."""
        self.engine.end_turn(time.time(), self._send_held, schedule=True, bulks=bulks,
                             held=lambda: bool(self.held_replies))
        for conn, answer in self.engine.take_bulk_replies():
            if not conn.open() or not conn.deferred:
                continue
            conn.deferred = False
            self._reply(conn, protocol.error(str(answer), answer.code) if isinstance(answer, Refused)
                        else protocol.ok(**answer))
            if conn.open() and conn.decoder.pending:
                self.resume.append(conn)   # requests it pipelined behind the submit

    def _timeout(self, wake: float | None, now: float) -> float | None:
        """How long the loop may sleep: until the soonest of what it waits for (None: no deadline)."""
        mono = time.monotonic()
        due = soonest(
            wake,                                                    # the engine's timers (tick)
            self.engine.turn.wake(now),                              # work this turn left, a start to retry
            now if self.resume else None,                            # connections to go on with
            self.metrics.tick(now) if self.metrics is not None else None,   # the metrics file's next write
            now + FRAME_DEADLINE if self.conns else None,            # a frame's deadline, idle clients
            now + max(0.0, self.accept_paused_until - mono) if self.accept_paused_until is not None else None,
            now + FALLBACK_POLL if self.streams.polling else None,   # attach without inotify
        )
        return None if due is None else max(0.0, due - now)

    def _send_held(self, refused: set[int]) -> None:
        held, self.held_replies = self.held_replies, []
        for conn in held:
            conn.unsent = False
            if refused & conn.submitted:
                # Its replies (pipelined ones too) are void: one refusal, then the connection ends.
                conn.out = bytearray(framing.encode(protocol.error(
                    "cannot store the job (the state directory cannot be written); nothing was queued, "
                    "try again later", "busy")))
                conn.closing = True
            conn.submitted = set()
            if conn.open():
                self._flush(conn)
            if conn.open() and not conn.out and conn.decoder.pending:
                self.resume.append(conn)   # pipelined requests it sent meanwhile: next turn

    def _archive_done(self) -> None:
        """What the history archive's threads finished: jobs it holds now, answers to send."""
        done = self.engine.finished.archive.take()
        if done.archived:
            self.engine.archived(done.archived)
        for conn, answer in done.answers:
            if conn.open() and self.streams.waits(conn):
                self.streams.archived_wait(conn, answer)
            elif conn.open() and conn.deferred:
                conn.deferred = False
                self._reply(conn, answer)
                if conn.open() and conn.decoder.pending:
                    self.resume.append(conn)   # requests it pipelined behind the query

    def _ask_archive(self, conn: Conn, query: Any) -> str | None:
        """A question for the archive's reader on *conn*'s behalf; None, or why it was not taken."""
        query.token = conn
        return self.engine.finished.archive.ask(query)

    def _drain_signals(self) -> None:
        try:
            os.read(self._wake_r, 4096)
        except BlockingIOError:
            pass
        sigs, self.signals = self.signals, []
        for sig in sigs:
            if sig == signal.SIGHUP:
                self.stop_reason = "reload"
            elif sig in (signal.SIGTERM, signal.SIGINT):
                self.stop_reason = "terminate"
            elif sig == signal.SIGCHLD:
                reap_children()  # exits are learned through pidfds; this only clears zombies

    def _expire_idle(self) -> None:
        now = time.monotonic()
        for conn in list(self.conns.values()):
            if conn.stalled:
                continue   # held back by its user's other connections, which expire on their own
            if conn.partial_since is not None and now - conn.partial_since > FRAME_DEADLINE:
                rlog.warning(f"slow-{conn.caller.uid}", "uid %d took over %ds to send one request; dropped",
                             conn.caller.uid, FRAME_DEADLINE)
                self._close(conn)
            elif not self.streams.held(conn) and not conn.deferred and now - conn.last > IDLE_TIMEOUT:
                self._close(conn)   # (a deferred reply is on its way: a bulk being stored, a query)
            elif conn.out and now - conn.last > IDLE_TIMEOUT:
                self._close(conn)   # an attach, a watch or an answered wait that stopped reading

    # -- connections ------------------------------------------------------------
    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    rlog.error("accept", "out of file descriptors (%s); not accepting for %ss",
                               exc.strerror, ACCEPT_PAUSE)
                    self._pause_accepting()
                    return
                raise
            try:
                sock.setblocking(False)
                pid, uid, gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
                caller = self.callers.caller(uid, gid, pid)
            except OSError:
                sock.close()
                continue
            conn = Conn(sock, caller)
            self.conns[sock.fileno()] = conn
            self.per_uid[uid] = self.per_uid.get(uid, 0) + 1
            self.conns_of.setdefault(uid, set()).add(conn)
            self.sel.register(sock, selectors.EVENT_READ, ("conn", conn))
            if self.per_uid[uid] > self.cfg.max_connections_per_user and uid != 0:
                rlog.warning(f"conns-{uid}", "uid %d holds more than %d connections; refusing more",
                             uid, self.cfg.max_connections_per_user)
                self._reply(conn, protocol.error(
                    f"you already have {self.cfg.max_connections_per_user} connections open to hpc-batchd, "
                    f"the most one user may (the admin's --max-connections-per-user); close some and retry",
                    "busy"), close=True)

    def _pause_accepting(self) -> None:
        try:
            self.sel.unregister(self.listener)
        except (KeyError, ValueError):
            pass
        self.accept_paused_until = time.monotonic() + ACCEPT_PAUSE

    def _resume_accepting(self) -> None:
        if self.accept_paused_until is not None and time.monotonic() >= self.accept_paused_until:
            self.accept_paused_until = None
            self.sel.register(self.listener, selectors.EVENT_READ, ("listen", None))

    def _pending_of(self, uid: int) -> int:
        return sum(c.decoder.pending for c in self.conns_of.get(uid, ()))

    def _service(self, conn: Conn, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            try:
                data = conn.sock.recv(CHUNK)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                self._close(conn)
                return
            if data == b"":  # the client went away (an attach client detaching, too)
                if conn.decoder.pending and not conn.closing:
                    log.warning("uid %d sent a truncated frame", conn.caller.uid)
                self._close(conn)
                return
            if data:
                conn.last = time.monotonic()
                if not self.streams.held(conn) and not conn.closing:
                    conn.decoder.feed(data)
                    if conn.decoder.pending and conn.partial_since is None:
                        conn.partial_since = conn.last
                    if (conn.decoder.pending > framing.MAX_FRAME + framing.HEADER_SIZE
                            or (conn.decoder.expected > CHUNK
                                and self._pending_of(conn.caller.uid) > PENDING_PER_USER)):
                        self._over_limit(conn)
                        return
                    if conn.may_take_request():
                        self._requests(conn)
        if mask & selectors.EVENT_WRITE:
            self._flush(conn)
            if not conn.open():
                return
            if self.streams.attach_of(conn) is not None:
                self.streams.pump(conn)
            elif conn.may_take_request() and conn.decoder.pending:
                self._requests(conn)  # pipelined requests held back while replies were unsent

    def _over_limit(self, conn: Conn) -> None:
        rlog.warning(f"pending-{conn.caller.uid}", "uid %d sent more unfinished request bytes than allowed; "
                     "dropped a connection", conn.caller.uid)
        self._reply(conn, protocol.error(
            "too many request bytes in flight from your user; send one request at a time", "busy"), close=True)

    # -- the reply budget ---------------------------------------------------------------
    def _held_bytes(self, uid: int) -> int:
        """Reply bytes built for *uid* and not yet taken by its clients (all its connections)."""
        return sum(len(c.out) for c in self.conns_of.get(uid, ()))

    def _over_budget(self, uid: int) -> bool:
        return self._held_bytes(uid) >= self.cfg.max_reply_bytes_per_user

    def _held_back(self, conn: Conn) -> bool:
        """Whether *conn*'s user is over the reply budget; if so *conn* is stalled until it drains."""
        if self._over_budget(conn.caller.uid):
            self._stall(conn)
            return True
        return False

    def _stall(self, conn: Conn) -> None:
        """Read no more of *conn* until its user's unread replies drop below the budget.

        Backpressure rather than a refusal: a client that reads its replies
        only waits a moment, and one that does not is dropped by the idle
        timeout, which frees the budget for the user's other connections.
        """
        if not conn.stalled:
            conn.stalled = True
            self.stalled.setdefault(conn.caller.uid, set()).add(conn)
            self._arm(conn)

    def _unstall(self, uid: int) -> None:
        """Its user is under the budget again: its held connections go on next turn."""
        now = time.monotonic()
        for conn in self.stalled.pop(uid, ()):
            conn.stalled = False
            if conn.open():
                conn.last = now
                conn.partial_since = now if conn.decoder.pending else None
                self._arm(conn)
                self.resume.append(conn)

    def _drained(self, uid: int) -> None:
        """Some of *uid*'s reply bytes went (sent, or their connection closed)."""
        if uid in self.stalled and not self._over_budget(uid):
            self._unstall(uid)

    def _arm(self, conn: Conn) -> None:
        """Register *conn* for what it waits for: writing while a reply is unsent, else reading
        (nothing while stalled)."""
        if not conn.open():
            return
        if conn.out:
            events = selectors.EVENT_WRITE
        elif conn.stalled:
            try:
                self.sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            return
        else:
            events = selectors.EVENT_READ
        try:
            self.sel.modify(conn.sock, events, ("conn", conn))
        except KeyError:
            self.sel.register(conn.sock, events, ("conn", conn))
        except ValueError:
            return

    def _requests(self, conn: Conn) -> None:
        while not conn.closing and not self.streams.held(conn) and conn.may_take_request():
            d = conn.decoder
            if d.pending and d.pending >= d.expected and self._over_budget(conn.caller.uid):
                self._stall(conn)   # a whole request is there, but its user leaves too much unread
                return
            try:
                msg = conn.decoder.next()
            except framing.FrameError as exc:
                self._reply(conn, protocol.error(str(exc), "bad_request"), close=True)
                return
            conn.partial_since = time.monotonic() if conn.decoder.pending else None
            if msg is None:
                return
            try:
                op, payload = protocol.parse_request(msg)
            except protocol.ProtocolError as exc:
                self._reply(conn, protocol.error(str(exc), "bad_request"), close=True)
                return
            now = time.time()
            try:
                stream = STREAMING.get(op)
                if stream is not None:
                    stream(self.streams, conn, payload, now)
                    continue
                reply = HANDLERS[op](self.engine, conn.caller, payload, now)
                if isinstance(reply, Deferred) and reply.bulk is not None:
                    reply.bulk.token = conn
                    conn.deferred = True   # answered from _end_turn once it is stored
                    self.engine.run_pending(now)
                    return
                if isinstance(reply, Deferred):
                    assert reply.query is not None   # the one other kind of Deferred
                    busy = self._ask_archive(conn, reply.query)
                    if busy is None:
                        conn.deferred = True   # answered from _archive_done
                        self.engine.run_pending(now)
                        return
                    reply = protocol.error(busy, "busy")
                elif isinstance(reply, Submitted):
                    conn.submitted.update(reply.ids)
                    reply = reply.reply
            except Refused as exc:
                reply = protocol.error(str(exc), exc.code)
            except Exception:
                rlog.exception(f"internal-{op}", "internal error handling %s", op)
                reply = protocol.error(f"internal error in hpc-batchd handling {op!r}; see the daemon's log",
                                       "internal")
            self._reply(conn, reply)
            self.engine.run_pending(now)

    def _reply(self, conn: Conn, msg: dict[str, Any], close: bool = False) -> None:
        try:
            conn.out += framing.encode(msg, framing.MAX_REPLY)
        except framing.FrameError as exc:
            conn.out += framing.encode(protocol.error(f"reply too large: {exc}", "internal"))
        if close:
            conn.closing = True
        if self.engine.turn.holds_replies:
            # What it reports is not durable yet: it goes out after this turn's commit.
            if not conn.unsent:
                conn.unsent = True
                self.held_replies.append(conn)
            return
        self._flush(conn)

    def _flush(self, conn: Conn) -> None:
        sent = False
        while conn.out:
            try:
                n = conn.sock.send(conn.out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._close(conn)
                return
            del conn.out[:n]
            sent = True
            conn.last = time.monotonic()
        attach = self.streams.attach_of(conn)
        if not conn.out and conn.closing and (attach is None or attach.done):
            self._close(conn)
            return
        # Backpressure: while a reply is unsent, read nothing more from this client,
        # so one that never reads its replies cannot make the daemon buffer without end.
        self._arm(conn)
        if sent:
            self._drained(conn.caller.uid)

    def _close(self, conn: Conn) -> None:
        fd = conn.sock.fileno()
        if fd in self.conns:
            del self.conns[fd]
            left = self.per_uid.get(conn.caller.uid, 1) - 1
            if left > 0:
                self.per_uid[conn.caller.uid] = left
            else:
                self.per_uid.pop(conn.caller.uid, None)
            try:
                self.sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            mine = self.conns_of.get(conn.caller.uid)
            if mine is not None:
                mine.discard(conn)
                if not mine:
                    del self.conns_of[conn.caller.uid]
        if conn.stalled:
            conn.stalled = False
            stalled = self.stalled.get(conn.caller.uid)
            if stalled is not None:
                stalled.discard(conn)
                if not stalled:
                    del self.stalled[conn.caller.uid]
        self.streams.forget(conn)
        conn.sock.close()
        conn.out = bytearray()
        self._drained(conn.caller.uid)

    def close_clients(self) -> None:
        """Drop every client (before a re-exec or exit)."""
        for conn in list(self.conns.values()):
            self._close(conn)


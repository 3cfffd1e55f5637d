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

from shepherd.base.proc import reap_children

from ..wire import framing, protocol
from . import access
from .engine import Engine
from .handlers import HANDLERS, Deferred
from .ratelog import RateLimited
from .refusal import Refused
from .streams import CHUNK, FALLBACK_POLL, AttachState, Streams

if TYPE_CHECKING:
    from .metrics_file import MetricsFile

log = logging.getLogger("hpc-batchd")
rlog = RateLimited(log)

IDLE_TIMEOUT = 60.0          # a connection that sends no request is dropped
FRAME_DEADLINE = 10.0        # a frame once begun must be complete within this
ACCEPT_PAUSE = 1.0           # out of descriptors: stop accepting for this long
HELD_REPLY_BYTES = 1 << 18   # replies one connection may have waiting for a commit (pipelined requests)
PENDING_PER_USER = 2 * framing.MAX_FRAME   # unfinished frame bytes one user may hold in the daemon
_CRED = struct.Struct("3i")


class Conn:
    """One client connection."""

    def __init__(self, sock: socket.socket, caller: access.Caller):
        self.sock = sock
        self.caller = caller
        self.decoder = framing.Decoder()
        self.out = bytearray()
        self.closing = False
        self.last = time.monotonic()          # last request bytes, or last reply bytes taken
        self.partial_since: float | None = None   # when the unfinished frame in decoder began
        self.attach: AttachState | None = None    # while streaming (streams.py)
        self.waiting: list[int] | None = None     # the jobs a dispatch wait names, while it waits
        self.wait_plan: list | None = None        # ... with those the archive answers for (streams.wait)
        self.wait_archived: list | None = None    # ... the archive's entries for them, once they came
        self.wait_left = 0                        # ... how many of them are still to end
        self.wait_paged = False                   # ... and whether its client takes the answer in pages
        self.wait_rest: list | None = None        # ... a paged wait's rest: the ids the archive answers for
        self.stalled = False                      # its user is over --max-reply-bytes-per-user: not read
        self.unsent = False                       # a reply held until this turn's commit
        self.submitted: set[int] = set()          # the jobs its unsent replies acknowledge: void if refused
        self.watching = False                     # a watch: told of each of its user's job changes
        self.deferred = False                     # its reply comes from the history archive's reader

    def may_take_request(self) -> bool:
        """Backpressure: no new request while a reply is unsent (or still to come from the archive),
        unless that reply only waits for this turn's commit (then pipelined requests share the
        commit, up to a bound)."""
        return not self.deferred and (not self.out or (self.unsent and len(self.out) < HELD_REPLY_BYTES))

    @property
    def held(self) -> bool:
        """An attach, a wait or a watch: a connection that stays open for the daemon to speak next."""
        return self.attach is not None or self.waiting is not None or self.watching

    def open(self) -> bool:
        """False once the connection has been closed."""
        return self.sock.fileno() >= 0


class Server:
    """Accepts clients and drives the engine."""

    def __init__(self, cfg, listener: socket.socket):
        self.cfg = cfg
        self.listener = listener
        self.sel = selectors.DefaultSelector()
        self.engine: Engine | None = None     # set by start(), before the loop runs
        self.held_replies: list[Conn] = []   # replies waiting for this turn's commit
        self.resume: list[Conn] = []         # connections with whole requests left once their replies went
        self.conns: dict[int, Conn] = {}
        self.pidfds: dict[int, int] = {}      # pidfd -> job id
        self.signals: list[int] = []
        self.stop_reason: str | None = None   # "reload" / "terminate"
        self.per_uid: dict[int, int] = {}     # open connections per user
        self.conns_of: dict[int, set[Conn]] = {}  # uid -> its open connections
        self.stalled: dict[int, set[Conn]] = {}   # uid -> its connections waiting for its replies to drain
        self.accept_paused_until: float | None = None
        self.metrics: MetricsFile | None = None   # --metrics-file: told of job events, ticked by the loop
        self.streams = Streams(self._reply, self._flush, self._close, self._held_back, self._ask_archive)

    # -- hooks the engine calls -------------------------------------------------
    def watch_pidfd(self, fd: int, job_id: int) -> None:
        self.pidfds[fd] = job_id
        self.sel.register(fd, selectors.EVENT_READ, ("pidfd", fd))

    def unwatch_pidfd(self, fd: int) -> None:
        if self.pidfds.pop(fd, None) is not None:
            self.sel.unregister(fd)

    def job_event(self, job_id: int, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.job_event(job_id, kind)
        self.streams.job_event(job_id, kind)

    # -- set-up -----------------------------------------------------------------
    def start(self, engine: Engine) -> None:
        self.engine = self.streams.engine = engine
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, ("listen", None))
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_r = rfd
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, self._on_signal)
        self.sel.register(rfd, selectors.EVENT_READ, ("signal", None))
        self.sel.register(engine.archive.fd, selectors.EVENT_READ, ("archive", None))
        if self.streams.inotify:
            self.sel.register(self.streams.inotify.fd, selectors.EVENT_READ, ("inotify", None))
        reap_children()  # shepherds that ended while we were re-executing

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)

    # -- the loop ---------------------------------------------------------------
    def run(self) -> str:
        """Serve until SIGHUP (returns "reload") or SIGTERM/SIGINT ("terminate")."""
        assert self.engine is not None  # start() first
        while self.stop_reason is None:
            now = time.time()
            resume, self.resume = self.resume, []
            for conn in resume:
                if not conn.open() or conn.stalled:
                    continue
                if conn.waiting is not None:
                    if conn.wait_left <= 0 and not conn.closing:
                        self.streams.answer_wait(conn)   # held back while its user was over the reply budget
                elif conn.may_take_request():
                    self._requests(conn)
            wake = self.engine.tick(now)
            self._end_turn()   # what the tick did (starts, ends) is made durable and spawned before we sleep
            if self.engine.resched or self.engine.to_spawn or self.resume or self.engine.storing:
                wake = now
            retry = self.engine.retry_at   # (set by the turn's end too: a start put off, out of pids)
            if retry is not None:
                wake = retry if wake is None else min(wake, retry)
            if self.metrics is not None:
                wake = min((w for w in (wake, self.metrics.tick(now)) if w is not None), default=None)
            timeout = None if wake is None else max(0.0, wake - now)
            if self.conns:
                timeout = FRAME_DEADLINE if timeout is None else min(timeout, FRAME_DEADLINE)
            if self.accept_paused_until is not None:
                pause = max(0.0, self.accept_paused_until - time.monotonic())
                timeout = pause if timeout is None else min(timeout, pause)
            if self.streams.polling:
                timeout = FALLBACK_POLL if timeout is None else min(timeout, FALLBACK_POLL)
            for key, mask in self.sel.select(timeout):
                kind, arg = key.data
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
                except Exception:  # one bad event must not take the daemon down
                    rlog.exception(f"event-{kind}", "error handling %s event", kind)
                    if kind == "conn":
                        self._close(arg)
            self.streams.poll()
            self._end_turn(bulks=True)   # one slice of a bulk a turn of the loop, answers in between
            self._expire_idle()
            self._resume_accepting()
        return self.stop_reason

    def _end_turn(self, bulks: bool = False) -> None:
        """Start what this turn's ends made room for, commit the turn's changes (one fsync for all),
        then spawn, sending the replies that waited on the commit while the first shepherd is forked."""
        assert self.engine is not None
        now = time.time()
        if bulks:
            self.engine.store_bulks(now)
        self.engine.reschedule(now)
        refused = self.engine.commit_turn(now)
        # The fork is asked for first, so it is under way while the replies wake their clients;
        # a submit is still answered before its shepherd's answer is read.
        self.engine.spawn_turn(now, lambda: self._send_held(refused))
        if self.held_replies:         # replies the spawns gave rise to; spawn_turn committed their cause
            self._send_held(self.engine.commit_turn(now))
        for conn, answer in self.engine.take_bulk_replies():
            if not conn.open() or not conn.deferred:
                continue
            conn.deferred = False
            self._reply(conn, protocol.error(str(answer), answer.code) if isinstance(answer, Refused)
                        else protocol.ok(**answer))
            if conn.open() and conn.decoder.pending:
                self.resume.append(conn)   # requests it pipelined behind the submit

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
        assert self.engine is not None
        done = self.engine.archive.take()
        if done.archived:
            self.engine.archived(done.archived)
        for conn, answer in done.answers:
            if conn.open() and conn.waiting is not None:
                self.streams.archived_wait(conn, answer)
            elif conn.open() and conn.deferred:
                conn.deferred = False
                self._reply(conn, answer)
                if conn.open() and conn.decoder.pending:
                    self.resume.append(conn)   # requests it pipelined behind the query

    def _ask_archive(self, conn: Conn, query: Any) -> str | None:
        """A question for the archive's reader on *conn*'s behalf; None, or why it was not taken."""
        assert self.engine is not None
        query.token = conn
        return self.engine.archive.ask(query)

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
            elif not conn.held and not conn.deferred and now - conn.last > IDLE_TIMEOUT:
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
                caller = access.make_caller(uid, gid, pid, self.cfg.admin_gid)
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
                if not conn.held and not conn.closing:
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
            if conn.attach is not None:
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
        assert self.engine is not None  # start() first
        while not conn.closing and not conn.held and conn.may_take_request():
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
                if op == "attach":
                    assert isinstance(payload, protocol.Attach)  # what parse_request makes of "attach"
                    self.streams.attach(conn, payload, now)
                    continue
                if op == "wait":
                    assert isinstance(payload, protocol.WaitJobs)
                    self.streams.wait(conn, payload, now)
                    continue
                if op == "watch":
                    self.streams.watch(conn)
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
                elif op == "new" and reply.get("ok"):
                    first = reply["result"]["id"]
                    conn.submitted |= set(range(first, reply["result"].get("last", first) + 1))
            except Refused as exc:
                reply = protocol.error(str(exc), exc.code)
            except Exception:
                rlog.exception(f"internal-{op}", "internal error handling %s", op)
                reply = protocol.error(f"internal error in hpc-batchd handling {op!r}; see the daemon's log",
                                       "internal")
            self._reply(conn, reply)
            self.engine.run_pending(now)

    def _reply(self, conn: Conn, msg: dict[str, Any], close: bool = False) -> None:
        assert self.engine is not None
        try:
            conn.out += framing.encode(msg, framing.MAX_REPLY)
        except framing.FrameError as exc:
            conn.out += framing.encode(protocol.error(f"reply too large: {exc}", "internal"))
        if close:
            conn.closing = True
        if self.engine.store.has_pending or self.engine.to_spawn:
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
        if not conn.out and conn.closing and (conn.attach is None or conn.attach.done):
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


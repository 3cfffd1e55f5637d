"""The streaming verbs: attach, wait and watch, the connections the daemon speaks on next.

A request is answered at once; these three are not. ``attach`` streams a
job's output buffer as it grows (woken by inotify on the buffer, or a short
poll where inotify is missing) and ends with the job's end (a finished job's
buffer kept after a failed delivery is streamed from where the client
is, then the end); ``wait`` is
answered once every job it names has ended; ``watch`` sends one event per
change to any of its user's jobs. Each is woken by the engine's job events,
never by polling the jobs.

The server owns the connections, their I/O and the reply budget: it gives
this object ``reply`` (queue a message, sent after the turn's commit if
needed), ``flush`` (send what a connection holds), ``close`` and
``held_back`` (a user over the reply budget: the connection is stalled,
answered later). What is kept here is each held connection's state
(``StreamState``, keyed by the connection: the server only asks whether one
is held), which connection follows which job or user, and the inotify
watches on the buffers. ``STREAMING`` is the table of these verbs, beside
the handlers' ``HANDLERS``.
"""

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core import arrayref, views, waitpages
from ..core.jobs import FINISHED, QUEUED, WAITING, Job
from ..wire import framing, protocol
from . import joboutput
from .conn import Conn
from .inotify import Inotify
from .ratelog import RateLimited
from .refusal import Refused

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger("hpc-batchd")
rlog = RateLimited(log)

CHUNK = 64 << 10             # attach reads and sends output in chunks this big
FALLBACK_POLL = 0.05         # attach wake-up when inotify is unavailable
WATCH_BACKLOG = 1 << 20      # unsent watch events one connection may hold before it is dropped
_UNPAGED = ("the answer is longer than one reply may carry ({}) and this dispatch is older than "
            "hpc-batchd: use a dispatch of the same version, which asks for it in pages")


@dataclass
class AttachState:
    """Where an attach stream stands."""

    job: int
    fd: int | None        # the job's output buffer, open once the job has started
    offset: int           # how far the client has it
    ending: bool = False  # the job has ended: send the rest, then the end event
    end: dict | None = None   # ... its fields, taken at the end: it may be let go before they are sent
    done: bool = False    # the end event is queued: close once it is sent


@dataclass
class StreamState:
    """What one held connection streams, waits for or watches (the server knows only that it is held)."""

    attach: AttachState | None = None    # while streaming a job's output
    waiting: list[int] | None = None     # the jobs a dispatch wait names, while it waits
    wait_plan: list | None = None        # ... with those the archive answers for (wait)
    wait_archived: list | None = None    # ... the archive's entries for them, once they came
    wait_left: int = 0                   # ... how many of them are still to end
    wait_paged: bool = False             # ... and whether its client takes the answer in pages
    wait_rest: list | None = None        # ... a paged wait's rest: the ids the archive answers for
    wait_found: dict = field(default_factory=dict)   # ... the archive's entries for jobs forgotten meanwhile
    wait_asking: list | None = None      # ... the ids of the question about those, while under way
    watching: bool = False               # a watch: told of each of its user's job changes


class Streams:
    """Who attaches to, waits for or watches which jobs; woken by the engine's job events."""

    def __init__(self, engine: "Engine", reply: Callable[..., None], flush: Callable[[Conn], None],
                 close: Callable[[Conn], None], held_back: Callable[[Conn], bool],
                 ask_archive: Callable[[Conn, Any], str | None]):
        self.reply = reply            # reply(conn, msg, close=False)
        self.flush = flush
        self.close = close
        self.held_back = held_back    # true: its user is over the reply budget, the conn now waits
        self.ask_archive = ask_archive   # a question for the history archive, answered to archived_wait
        self.engine = engine
        self.states: dict[Conn, StreamState] = {}   # the held connections: what each streams
        self.attached: dict[int, set[Conn]] = {}  # job id -> conns streaming it
        self.waiters: dict[int, set[Conn]] = {}   # job id -> conns waiting for it to end
        self.watchers: dict[int, set[Conn]] = {}  # uid -> conns watching that user's jobs
        self.wds: dict[int, int] = {}         # inotify wd -> job id
        self.job_wd: dict[int, int] = {}      # job id -> inotify wd
        try:
            self.inotify: Inotify | None = Inotify()
        except (OSError, AttributeError) as exc:
            log.warning("inotify unavailable (%s); attach falls back to polling", exc)
            self.inotify = None

    # -- what the server calls ----------------------------------------------------
    def job_event(self, job_id: int, kind: str) -> None:
        """A job was submitted, started or finished: answer waits, tell watchers, feed attaches."""
        if kind == "submitted":
            return   # counted; a submitter already knows (and a watch streams starts and ends)
        if kind == "finished":
            for conn in list(self.waiters.pop(job_id, ())):
                st = self.states[conn]
                st.wait_left -= 1   # a count, not a rescan: a wait on n jobs costs O(n) over all their ends
                if st.wait_left <= 0:
                    self.answer_wait(conn)
        self._tell_watchers(job_id)
        for conn in list(self.attached.get(job_id, ())):
            if kind == "started":
                self._open_stream(conn)
            elif kind == "finished":
                attach = self.states[conn].attach
                assert attach is not None  # every conn in attached streams
                attach.ending = True
                job = self.engine.jobs.get(job_id)
                attach.end = views.end_fields(job) if job is not None else None
            self.pump(conn)

    def on_inotify(self) -> None:
        """Buffers grew: send the new output to whoever is attached to them."""
        assert self.inotify is not None  # registered only with one
        for wd in self.inotify.read():
            for conn in list(self.attached.get(self.wds.get(wd, 0), ())):  # 0: no job
                self.pump(conn)

    @property
    def polling(self) -> bool:
        """Attached clients and no inotify: the loop must wake every FALLBACK_POLL and call poll()."""
        return self.inotify is None and bool(self.attached)

    def poll(self) -> None:
        """Without inotify: look at every attached buffer."""
        if self.inotify is None:
            for conns in list(self.attached.values()):
                for conn in list(conns):
                    self.pump(conn)

    def held(self, conn: Conn) -> bool:
        """An attach, a wait or a watch: a connection that stays open for the daemon to speak next."""
        return conn in self.states

    def attach_of(self, conn: Conn) -> AttachState | None:
        """Where *conn*'s attach stream stands, or None if it streams no output."""
        st = self.states.get(conn)
        return st.attach if st is not None else None

    def waits(self, conn: Conn) -> bool:
        """True for a dispatch wait's connection (answered by this object, not by a handler)."""
        st = self.states.get(conn)
        return st is not None and st.waiting is not None

    def resume(self, conn: Conn) -> None:
        """A wait held back while its user was over the reply budget: answered now if its jobs ended."""
        if self.states[conn].wait_left <= 0 and not conn.closing:
            self.answer_wait(conn)

    def forget(self, conn: Conn) -> None:
        """A connection closed: it streams, waits for and watches nothing any more."""
        st = self.states.get(conn)
        if st is None:
            return
        if st.attach is not None:
            self._detach(conn)
        del self.states[conn]
        for job_id in st.waiting or ():
            waiters = self.waiters.get(job_id)
            if waiters is not None:
                waiters.discard(conn)
                if not waiters:
                    del self.waiters[job_id]
        if st.watching:
            watchers = self.watchers.get(conn.caller.uid)
            if watchers is not None:
                watchers.discard(conn)
                if not watchers:
                    del self.watchers[conn.caller.uid]

    # -- wait ---------------------------------------------------------------------
    def wait(self, conn: Conn, req: protocol.WaitJobs, now: float) -> None:
        """dispatch wait: answer once every named job has ended; woken by their ends, never by polling.

        A job the daemon no longer holds (past --keep-finished) has ended: the history archive
        answers for it, on its reader thread (:meth:`archived_wait`).
        """
        # Each distinct ref is resolved once (100,000 copies of one name are one lookup), then
        # each distinct job counted once: the wait is answered when the count of those
        # still to end reaches 0, so its cost is O(refs) in all, never refs x ends.
        plan: list[Any] = []          # in the order given: a live job's id, or ("gone", i) of gone[i]
        gone: list[int | str] = []
        seen: set[int] = set()
        for ref in dict.fromkeys(req.ids):
            try:
                job_id = self.engine.lookup(conn.caller, ref).id
            except Refused as exc:
                if exc.code != "not_found" or (isinstance(ref, str) and arrayref.looks_like(ref)):
                    raise   # (the archive knows no 6_3: the engine said what it knows of the array)
                plan.append(("gone", len(gone)))
                gone.append(ref)
                continue
            if job_id not in seen:
                seen.add(job_id)
                plan.append(job_id)
        if not req.paged and len(plan) > protocol.WAIT_PAGE_JOBS:
            raise Refused(_UNPAGED.format(f"{len(plan)} jobs"))
        st = self.states.setdefault(conn, StreamState())
        st.wait_paged = req.paged
        st.wait_rest = gone if req.rest else None
        st.waiting = [x for x in plan if isinstance(x, int)]
        st.wait_plan = plan if gone else None
        st.wait_archived = None
        left = 0
        for job_id in st.waiting:
            if self.engine.jobs[job_id].state != FINISHED:
                self.waiters.setdefault(job_id, set()).add(conn)
                left += 1
        st.wait_left = left
        if gone:
            busy = self.ask_archive(conn, self.engine.archive_query(conn.caller, "wait", None, now, refs=tuple(gone)))
            if busy is not None:
                self.archived_wait(conn, protocol.error(busy, "busy"))
            return
        if left == 0:
            self.answer_wait(conn)

    def archived_wait(self, conn: Conn, answer: dict[str, Any]) -> None:
        """The archive's entries for the jobs of a wait it no longer holds (or why it cannot say)."""
        st = self.states[conn]
        if st.wait_asking is not None:   # about jobs forgotten while waited for (answer_wait asked)
            asked, st.wait_asking = st.wait_asking, None
            st.wait_found.update(zip(asked, answer["result"]["jobs"] if answer.get("ok") else ()))
            for job_id in asked:   # what the archive cannot say (pruned, unreadable) is said to be unknown
                st.wait_found.setdefault(job_id, views.wait_entry(job_id, None))
            self.answer_wait(conn)
            return
        if answer.get("ok"):
            st.wait_archived = answer["result"]["jobs"]
        elif st.wait_rest is not None:
            # Each of them had ended when the first page was sent, and a single answer would have
            # said what it knew then of one forgotten since: unknown. The wait is not refused for it.
            st.wait_archived = [views.wait_entry(job_id, None) for job_id in st.wait_rest]
        else:
            self.reply(conn, answer, close=True)
            return
        if st.wait_left <= 0:
            self.answer_wait(conn)

    def answer_wait(self, conn: Conn) -> None:
        """Reply to a wait whose jobs have all ended (or wait for its user's replies to drain)."""
        st = self.states[conn]
        assert st.waiting is not None
        if st.wait_plan is not None and st.wait_archived is None:
            return   # the archive's part is still to come: archived_wait answers
        if self.held_back(conn):
            return   # answered when its user's unread replies drop below the budget
        jobs = self.engine.jobs
        archived = st.wait_archived or []
        plan = st.waiting if st.wait_plan is None else st.wait_plan
        found = st.wait_found
        if st.wait_asking is not None or self._ask_forgotten(conn, st, plan):
            return   # archived_wait answers once the archive has said how they ended
        conn.last = time.monotonic()   # the idle clock for reading the answer starts now

        def entry(x: Any) -> dict[str, Any]:
            if not isinstance(x, int):
                return archived[x[1]]
            job = jobs.get(x)
            return found[x] if job is None and x in found else views.wait_entry(x, job)
        done, n = waitpages.cut(plan, entry, protocol.WAIT_PAGE_JOBS, protocol.WAIT_PAGE_BYTES)
        if n == len(plan):
            self.reply(conn, protocol.ok(jobs=done, more=None) if st.wait_paged else protocol.ok(jobs=done),
                       close=True)
        elif not st.wait_paged:
            self.reply(conn, protocol.error(_UNPAGED.format(f"more than {protocol.WAIT_PAGE_BYTES >> 20} MiB")),
                       close=True)
        else:
            # The rest by id, each ended: the client's next waits are answered at once, a page each.
            rest = [x if isinstance(x, int) else archived[x[1]]["id"] for x in plan[n:]]
            self.reply(conn, protocol.ok(jobs=done, more=rest), close=True)

    def _ask_forgotten(self, conn: Conn, st: StreamState, plan: list) -> bool:
        """Ask the archive how the jobs of the answer's first page that the daemon forgot
        (``--keep-finished``) while they were waited for ended; True: asked, archived_wait goes on.

        A job is let go only once its row is durable in the archive (archive.py), so it is there to
        be read; said to be unknown instead, its exit status would be lost to the waiter. The pages
        after the first are asked for by id, which the archive answers the same way (:meth:`wait`).
        """
        jobs, found = self.engine.jobs, st.wait_found
        lost = [x for x in plan[:protocol.WAIT_PAGE_JOBS] if isinstance(x, int) and x not in found and x not in jobs]
        if not lost:
            return False
        st.wait_asking = lost   # (set first: an archive could answer before ask_archive returns)
        busy = self.ask_archive(conn, self.engine.archive_query(conn.caller, "wait", None, time.time(),
                                                                 refs=tuple(lost)))
        if busy is None:
            return True
        # The archive cannot take the question now (too many under way): they are said to be unknown.
        st.wait_asking = None
        found.update((job_id, views.wait_entry(job_id, None)) for job_id in lost)
        return False

    # -- watch --------------------------------------------------------------------
    def watch(self, conn: Conn, req: Any, now: float) -> None:
        """A stream of the caller's job changes: "watching" at once, then one "job" event per change.

        A client learns of a start and an end as they happen, over one
        connection however many jobs it follows, instead of asking again and
        again. Only changes are sent: a client that (re)connects reads the
        current state with show or list.
        """
        self.states.setdefault(conn, StreamState()).watching = True
        self.watchers.setdefault(conn.caller.uid, set()).add(conn)
        self.reply(conn, protocol.event("watching"))

    def _tell_watchers(self, job_id: int) -> None:
        job = self.engine.jobs.get(job_id)
        conns = self.watchers.get(job.uid) if job is not None else None
        if job is None or not conns:
            return
        frame = framing.encode(protocol.event("job", job=views.watch_job(job, self.engine.machine)), framing.MAX_REPLY)
        for conn in list(conns):
            if len(conn.out) > WATCH_BACKLOG:
                # It stopped reading: drop it rather than buffer without end; it asks afresh on reconnecting.
                rlog.warning(f"watch-{conn.caller.uid}", "uid %d does not read its watch events; dropped",
                             conn.caller.uid)
                self.close(conn)
                continue
            conn.out += frame
            self.flush(conn)

    # -- attach -----------------------------------------------------------------
    def attach(self, conn: Conn, req: protocol.Attach, now: float) -> None:
        """dispatch attach: the job's output so far, then as it comes, then its end."""
        job = self.engine.lookup(conn.caller, req.id)
        kept = joboutput.has_kept_buffer(job, self.engine.store.job_dir(job.id))
        if job.state == FINISHED and not kept:
            self.reply(conn, self._end_event(job), close=True)
            return
        # A finished job's kept buffer (its delivery failed) is streamed like a running job's
        # rest: what the client has not yet seen, then the end.
        self.states.setdefault(conn, StreamState()).attach = AttachState(job=job.id, fd=None, offset=req.offset,
                                                                          ending=kept)
        self.attached.setdefault(job.id, set()).add(conn)
        self.reply(conn, protocol.event("attached", id=job.id, state=job.state))
        if job.state not in (QUEUED, WAITING):
            self._open_stream(conn)
            self.pump(conn)

    def _open_stream(self, conn: Conn) -> None:
        st = self.states[conn].attach
        assert st is not None  # only for an attached conn
        if st.fd is not None:
            return
        path = joboutput.buffer_path(self.engine.store.job_dir(st.job))
        st.fd = joboutput.open_buffer(path)
        if st.fd is None:
            return
        if self.inotify and not st.ending and st.job not in self.job_wd:
            try:
                wd = self.inotify.add(path)
                self.job_wd[st.job] = wd
                self.wds[wd] = st.job
            except OSError:
                pass

    def pump(self, conn: Conn) -> None:
        """Send what the job wrote since the last look; finish the stream at job end."""
        st = self.attach_of(conn)
        if st is None or st.done:
            return
        if st.fd is not None:
            while len(conn.out) < CHUNK * 4:
                try:
                    data = os.pread(st.fd, CHUNK, st.offset)
                except OSError:
                    data = b""   # a buffer that cannot be read ends the stream, not the daemon
                if not data:
                    break
                st.offset += len(data)
                conn.out += framing.encode(protocol.event(
                    "output", data=data.decode("utf-8", "surrogateescape"), offset=st.offset))
            else:
                self.flush(conn)  # the client is behind: continue when it drains
                return
        if st.ending:
            job = self.engine.jobs.get(st.job)
            if job is not None:
                end = self._end_event(job)
            else:   # let go (--keep-finished) while a slow client read the rest: as it ended
                end = protocol.event("end", **(st.end or views.forgotten_end(st.job)))
            conn.out += framing.encode(end)
            st.done = True
            conn.closing = True
        self.flush(conn)

    def _end_event(self, job: Job) -> dict[str, Any]:
        return protocol.event("end", **views.end_fields(job))

    def _detach(self, conn: Conn) -> None:
        st = self.states[conn].attach
        assert st is not None  # called only for an attached conn
        conns = self.attached.get(st.job)
        if conns is not None:
            conns.discard(conn)
            if not conns:
                del self.attached[st.job]
                wd = self.job_wd.pop(st.job, None)
                if wd is not None:
                    assert self.inotify is not None  # watches exist only with one
                    self.wds.pop(wd, None)
                    self.inotify.remove(wd)
        if st.fd is not None:
            os.close(st.fd)
            st.fd = None


# The verbs whose connection stays open for the daemon to speak next: verb -> how it begins
# (streams, conn, validated payload, now); the server's other verbs are handlers.HANDLERS.
STREAMING: dict[str, Callable[[Streams, Conn, Any, float], None]] = {
    "attach": Streams.attach, "wait": Streams.wait, "watch": Streams.watch}

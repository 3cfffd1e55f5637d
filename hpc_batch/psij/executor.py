"""hpc-batch as a PSI/J executor: ``JobExecutor.get_instance("hpc-batch")``.

Installed with the ``[psij]`` extra; PSI/J finds it through the descriptor
the wheel puts in ``psij-descriptors/`` (``psij_descriptor.py``) and loads
this file by its path. A job is submitted with ``dispatch new --json``, run
in the job's directory, so it goes through exactly what a user's submit
does (the output check as the user, the flags' own validation). Every job the
executor follows is tracked over one ``watch`` connection, on which the
daemon pushes each start and end as it happens: no polling, and one
connection however many jobs. ``kill``, ``show`` and ``list`` are plain
requests. The mapping itself is the pure ``psij_mapping``.
"""

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

from psij import InvalidJobException, Job, JobExecutor, JobExecutorConfig, JobState, JobStatus, SubmitException

from hpc_batch import defaults
from hpc_batch.client.connection import Connection, Unreachable
from hpc_batch.psij import mapping as psij_mapping

log = logging.getLogger(__name__)

SUBMIT_TIMEOUT = 60.0       # seconds a dispatch new may take before the submit counts as failed (daemon hung)
RECONNECT_FIRST = 0.1       # after losing the watch (a reload or restart), first retry in this many seconds,
RECONNECT_MOST = 5.0        # doubling up to this while the daemon stays away


def socket_path(url: str | None) -> str | None:
    """The daemon's socket from the executor's *url* (``unix:///path`` or a path); None: the usual one."""
    if not url:
        return None
    path = url[len("unix://"):] if url.startswith("unix://") else url
    if not path.startswith("/"):
        raise ValueError(f"hpc-batch executor url {url!r}: give the daemon's socket as an absolute path "
                         f"or unix:///path, or no url for ${defaults.SOCKET_ENV} or {defaults.SOCKET}")
    return path


def dispatch_command() -> str:
    """The ``dispatch`` beside this Python (the same install), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "dispatch")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("dispatch")
    if found is None:
        raise SubmitException("cannot find the dispatch command: install hpc-batch in this Python's "
                              "environment, or put dispatch on PATH")
    return found


class HpcBatchJobExecutor(JobExecutor):
    """Runs PSI/J jobs on this machine's hpc-batch daemon, as the user who runs PSI/J."""

    def __init__(self, url: str | None = None, config: JobExecutorConfig | None = None) -> None:
        """*url*: the daemon's socket (a path or ``unix:///path``); by default $HPC_BATCH_SOCKET or the system's."""
        super().__init__(url=url, config=config if config else JobExecutorConfig())
        self._socket = socket_path(url)
        # One lock orders everything: a submit holds it from before its job exists until the job is
        # registered, so the watch thread cannot see the job's start before its QUEUED is reported.
        self._lock = threading.RLock()
        self._jobs: dict[int, Job] = {}       # native id -> the job, until it reaches a final state
        self._watch: Connection | None = None

    # -- PSI/J's interface ------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue *job*; raises InvalidJobException for what hpc-batch cannot run, SubmitException otherwise."""
        spec = self._check_job(job)
        try:
            plan = psij_mapping.submission(spec)
        except psij_mapping.Unsupported as exc:
            raise InvalidJobException(str(exc)) from None
        if plan.cwd is not None and not os.path.isdir(plan.cwd):
            raise InvalidJobException(f"directory {plan.cwd} does not exist (the job's spec.directory)")
        with self._lock:
            with job._status_cv:
                if job.status.state == JobState.CANCELED:
                    raise SubmitException("the job was cancelled before it was submitted")
            self._ensure_watch()
            reply = self._dispatch_new(plan)
            native = int(reply["id"])
            job._native_id = native
            self._jobs[native] = job
            self._set_job_status(job, JobStatus(JobState.QUEUED, time=time.time(),
                                                metadata={"nativeId": str(native)}))

    def cancel(self, job: Job) -> None:
        """Kill the job if it runs, cancel it if it waits; its CANCELED comes from the daemon."""
        if job.native_id is None:
            self._set_job_status(job, JobStatus(JobState.CANCELED, message="cancelled before it was submitted"))
            return
        reply = self._call("kill", id=int(job.native_id))
        if not reply.get("ok") and reply.get("code") != "finished":   # one that has ended keeps its result
            raise SubmitException(f"cannot cancel job {job.native_id}: {reply.get('error')}")

    def list(self) -> list[str]:
        """The ids of this user's queued, waiting and running jobs, however they were submitted."""
        ids: list[str] = []
        cursor: int | None = 0
        while cursor is not None:   # the daemon answers in pages; "more" is the next page's cursor
            reply = self._call("list", all=False, finished=False, after=cursor)
            if not reply.get("ok"):
                raise SubmitException(f"cannot list jobs: {reply.get('error')}")
            ids += [str(j["id"]) for j in reply["result"]["jobs"]]
            more = reply["result"].get("more")
            cursor = more if isinstance(more, int) and more > cursor else None
        return ids

    def attach(self, job: Job, native_id: str) -> None:
        """Follow a job submitted earlier (by id); *job* takes its state at once."""
        if job.status.state != JobState.NEW:
            raise InvalidJobException("a job must be NEW to be attached")
        try:
            native = int(native_id)
        except ValueError:
            raise InvalidJobException(f"{native_id!r} is not an hpc-batch job id") from None
        job.executor = self
        with self._lock:
            self._ensure_watch()    # first, so no change after the show below is missed
            reply = self._call("show", id=native)
            if not reply.get("ok"):
                raise InvalidJobException(f"cannot attach to job {native}: {reply.get('error')}")
            job._native_id = native
            self._jobs[native] = job
            self._apply(reply["result"]["job"])

    # -- submitting ---------------------------------------------------------------
    def _dispatch_new(self, plan: psij_mapping.Submission) -> dict[str, Any]:
        env = dict(os.environ)
        if self._socket is not None:
            env[defaults.SOCKET_ENV] = self._socket
        try:
            run = subprocess.run(plan.argv(dispatch_command()), cwd=plan.cwd, env=env, stdin=subprocess.DEVNULL,
                                 capture_output=True, text=True, timeout=SUBMIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise SubmitException(f"dispatch new did not answer within {SUBMIT_TIMEOUT:.0f}s", transient=True) from None
        except OSError as exc:
            raise SubmitException(f"cannot run dispatch: {exc}", exception=exc) from None
        try:
            doc = json.loads(run.stdout)
        except ValueError:
            doc = None
        if run.returncode == 0 and isinstance(doc, dict) and isinstance(doc.get("id"), int):
            return doc
        if isinstance(doc, dict):
            why, code = str(doc.get("error")), doc.get("code")
        else:   # docopt's usage errors are text on stderr
            why = run.stderr.strip().splitlines()[0] if run.stderr.strip() else f"dispatch new exited {run.returncode}"
            code = "usage" if run.returncode == 2 else None
        kind = psij_mapping.refusal(code)
        if kind == "invalid":
            raise InvalidJobException(f"hpc-batch refused the job: {why}")
        raise SubmitException(f"hpc-batch could not take the job: {why}", transient=kind == "transient")

    def _call(self, op: str, **args: Any) -> dict[str, Any]:
        """One request on a connection of its own; the daemon unreachable is a transient SubmitException."""
        try:
            conn = Connection(self._socket)
        except Unreachable as exc:
            raise SubmitException(str(exc), transient=True) from None
        try:
            return conn.call(op, **args)
        except (Unreachable, OSError) as exc:
            raise SubmitException(str(exc), transient=True) from None
        finally:
            conn.close()

    # -- following ----------------------------------------------------------------
    def _ensure_watch(self) -> None:
        """Open the watch stream (once) and start the thread that reads it; with the lock held."""
        if self._watch is not None:
            return
        try:
            self._watch = self._subscribe()
        except Unreachable as exc:
            raise SubmitException(str(exc), transient=True) from None
        threading.Thread(target=self._follow, name="hpc-batch psij watch", daemon=True).start()

    def _subscribe(self) -> Connection:
        conn = Connection(self._socket)
        try:
            conn.send("watch")
            first = conn.receive()
        except OSError:
            first = None
        if not first or first.get("event") != "watching":
            conn.close()
            why = first.get("error") if first else "it closed the connection"
            raise Unreachable(f"hpc-batchd at {conn.path} would not stream job changes: {why}")
        return conn

    def _follow(self) -> None:
        """The watch thread: apply each change; across a daemon reload or restart, reconnect and catch up.

        With no job left to follow when the stream ends, the thread ends too
        (the next submit starts another) rather than wait for a daemon
        nobody needs.
        """
        while True:
            conn = self._watch
            assert conn is not None
            while True:
                try:
                    msg = conn.receive()
                except OSError:
                    msg = None
                if msg is None:
                    break
                if msg.get("event") == "job":
                    try:
                        with self._lock:
                            self._apply(msg["job"])
                    except Exception:   # a bad event must not end the thread every job relies on
                        log.exception("hpc-batch executor: cannot apply %r", msg)
            conn.close()
            with self._lock:
                if not self._jobs:
                    self._watch = None
                    return
            self._reconnect()

    def _reconnect(self) -> None:
        delay = RECONNECT_FIRST
        while True:
            try:
                conn = self._subscribe()
                break
            except Unreachable:
                time.sleep(delay)
                delay = min(delay * 2, RECONNECT_MOST)
        with self._lock:
            self._watch = conn
            # Changes while nobody watched were not sent: ask for each job still followed.
            for native in list(self._jobs):
                try:
                    reply = self._call("show", id=native)
                except SubmitException:
                    continue    # gone again: the next reconnect asks again
                if reply.get("ok"):
                    self._apply(reply["result"]["job"])
                elif reply.get("code") == "not_found":
                    self._finish_unknown(native)

    def _apply(self, info: dict[str, Any]) -> None:
        """Report what the daemon says of one job (a watch event or a show); with the lock held."""
        native = info.get("id")
        job = self._jobs.get(native) if isinstance(native, int) else None
        if job is None or not isinstance(native, int):
            return  # not one of ours (the user's other jobs are on the same stream)
        for st in psij_mapping.statuses(info):
            self._set_job_status(job, JobStatus(JobState[st.state], time=st.time, exit_code=st.exit_code,
                                                message=st.message, metadata=st.metadata))
        if job.status.final:
            del self._jobs[native]

    def _finish_unknown(self, native: int) -> None:
        job = self._jobs.pop(native)
        self._set_job_status(job, JobStatus(JobState.FAILED, message=(
            f"hpc-batchd no longer knows job {native} (it keeps --keep-finished jobs a user); how it ended is lost"),
            metadata={"nativeId": str(native)}))

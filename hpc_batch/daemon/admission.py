"""Admission: the checks a submit must pass, and the jobs it makes (pure).

``Engine.submit`` reads what these need (whether the state disk is short of
room, how many jobs the user holds, the user's passwd entry, the jobs named
by ``--after``) and acts on the outcome; here is only the rule. The checks
run in a fixed order, so a submit that breaks several rules is told of the
first: user mode, ``--max-time``, size, room on the state disk, the per-user
cap, whether the request could ever fit the machine, then (once the user's
passwd entry is read) the jobs it follows. Each refusal names
the admin's flag or the user's option it is about
(``tests/unit/test_admission.py``).
"""

import os
from collections.abc import Callable
from dataclasses import dataclass

from ..core import dependencies as deps
from ..core import requestcheck, resources
from ..core.durations import format_duration
from ..core.jobnames import log_name
from ..core.jobrequest import JobRequest
from ..core.jobs import FINISHED, QUEUED, WAITING, Job, exit_column
from ..core.sizes import format_mem
from ..wire.protocol import NewJob
from .refusal import Refused


@dataclass(frozen=True)
class Admitted:
    """A submit that passed the checks: the terms its jobs are made with."""

    max_time: int
    elements: list[tuple[tuple[str, ...], int | None]]   # (argv, array index) of each job, in submission order
    wanted: JobRequest                      # the request its jobs keep
    budget: resources.Budget
    bulk: bool                              # an --array or --commands submit, or more than one job
    shared_argv: list[str] | None           # an --array's one argv list, stored once (Store.add_jobs)


def admit(cfg, machine: resources.Machine, limits: resources.Limits, *, uid: int, daemon_uid: int,
          root_mode: bool, held: int, short_of_room: str | None, req: NewJob) -> Admitted:
    """The terms *req* from *uid* is admitted under, or Refused naming what to change.

    *cfg* is the daemon's Config (its ``user_name``, ``max_lifetime``, ``max_job_size`` and
    ``max_queued_per_user``), *held* the jobs the user has queued, waiting or being stored,
    *short_of_room* why the state disk cannot take more (None: it can).
    """
    if not root_mode and uid != daemon_uid:
        raise Refused(f"this hpc-batchd runs as {cfg.user_name} in user mode and only accepts "
                      f"jobs from that user", "forbidden")
    max_time = req.max_time if req.max_time is not None else cfg.max_lifetime
    if max_time > cfg.max_lifetime:
        raise Refused(f"--max-time {format_duration(max_time)} exceeds the limit of "
                      f"{format_duration(cfg.max_lifetime)} set by the admin (--max-lifetime)")
    size = req.size()
    if size > cfg.max_job_size:
        raise Refused(f"the command and its environment take {format_mem(size)}, more than the "
                      f"{format_mem(cfg.max_job_size)} a job may carry (the admin's --max-job-size); "
                      f"submit a script instead, or drop --env", "too_large")
    if short_of_room is not None:   # compaction, and the jobs already taken, keep room to finish
        raise Refused(short_of_room, "busy")
    elements = req.elements()
    if held + len(elements) > cfg.max_queued_per_user:
        many = f"these {len(elements)} jobs would make {held + len(elements)}" if len(elements) > 1 else \
            f"you already have {held}"
        raise Refused(f"{many} queued or waiting, more than the {cfg.max_queued_per_user} one user may "
                      f"have (the admin's --max-queued-per-user); wait for some to start", "queue_full")
    request = resources.Request(
        cpus=req.cpus, mem=req.mem, gpus=req.gpus, exclusive=req.exclusive,
        numa_local=req.numa_local or req.benchmark is not None,   # --benchmark keeps memory local
        numa_local_gpu=req.numa_local_gpu, gpu_link=req.gpu_link, benchmark=req.benchmark, whole_l3=req.whole_l3)
    recording = req.record_to is not None or req.record_env
    wanted = JobRequest(request, aslr=req.aslr, thp=req.thp, record_to=req.record_to,
                        record_is_dir=recording and req.record_is_dir, record_env=req.record_env, notify=req.notify)
    try:
        budget = requestcheck.check_request(request, machine, limits)
    except requestcheck.RequestError as exc:
        raise Refused(str(exc), "never_fits") from None
    bulk = len(elements) > 1 or bool(req.array or req.commands)
    # An --array's elements share one argv list, stored once (Store.add_jobs); --commands' differ.
    shared_argv = list(req.argv) if req.array and not req.commands else None
    return Admitted(max_time, elements, wanted, budget, bulk, shared_argv)


def dependencies(req: NewJob, lookup: Callable[[int | str], Job]) -> list[int]:
    """The ids of the jobs *req* follows (--after / --after-ok), or Refused naming the flag: one
    unknown or another user's, or for --after-ok one that has already ended other than exit 0
    (it could only wait, then fail as dependency-failed). One *lookup* (the submitter's) a job named."""
    flag = "--after-ok" if req.after_ok else "--after"
    ids = []
    for ref in req.after:
        try:
            dep = lookup(ref)
        except Refused as exc:
            raise Refused(f"{flag} {ref}: {exc}", exc.code) from None
        if req.after_ok and dep.state == FINISHED and not deps.ok(result := dep.result):
            raise Refused(f"{flag} {ref}: job {dep.id} has already ended with exit {exit_column(result)}, not 0, "
                          f"so this job could never start (--after starts it however that one ended)",
                          "finished")
        ids.append(dep.id)
    return ids


@dataclass(frozen=True)
class Maker:
    """Makes the jobs of one admitted submit, the k-th (0-based) a call: at once for a small
    submit, a slice per turn for a bulk (bulks.py)."""

    req: NewJob
    admitted: Admitted
    uid: int
    gid: int
    user: str
    first: int           # the first job's id; the others follow on
    after: list[int]     # the ids of the jobs it follows (--after / --after-ok)
    now: float

    def __call__(self, k: int) -> Job:
        req, adm, first = self.req, self.admitted, self.first
        argv, index = adm.elements[k]
        job_id = first + k
        output = None
        if not req.no_output:
            # Checked by dispatch, as the user; the shepherd writes it as the user, never following links.
            target = req.output or req.cwd
            output = os.path.join(target, log_name(job_id)) if req.output is None or req.output_is_dir \
                else target
        return Job(id=job_id, uid=self.uid, gid=self.gid, user=self.user,
                   argv=adm.shared_argv if adm.shared_argv is not None else list(argv),
                   cwd=req.cwd, submitted=self.now, max_time=adm.max_time,
                   request=adm.wanted,
                   budget={"mem": adm.budget.mem, "assigned": adm.budget.assigned},
                   output=output, umask=req.umask, name=req.name, after=sorted(set(self.after)),
                   after_ok=req.after_ok, state=WAITING if self.after else QUEUED,
                   array=None if not adm.bulk else {"first": first, "index": index, "limit": req.array_limit,
                                                     "count": len(adm.elements)})

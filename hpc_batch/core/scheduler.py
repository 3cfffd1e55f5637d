"""The three scheduling policies (pure: callers pass ``now`` and the state).

Jobs are always considered in submission order. Every policy starts jobs
from the front of the queue while they fit; they differ only in what may
happen behind a head job that does not fit:

* ``fifo-strict``: nothing. The head blocks everyone behind it.
* ``easy-backfill``: when a head first cannot fit, the resources idle at
  that moment become a frozen backfill budget. Later jobs start while they
  fit within what remains of it; resources freed afterwards are held for
  the head. The budget is dropped when that head starts or leaves.
* ``strict-backfill``: the head gets a reserved start time, the earliest
  moment it fits if every running job holds its resources until its
  deadline. A later job may start only if it fits now and its own deadline
  (now + max_time) is no later than that reserved start, so it provably
  cannot delay the head.

A head that can never start on this machine (its request or budget exceeds
what the machine now offers) is reported in ``Decision.failures`` instead of
blocking the queue. Policy state is a JSON-safe dict returned in
``Decision.state``; the caller persists it and passes it back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .allocator import Free
from .requestcheck import why_never_fits
from .resources import Allocation, Budget, Limits, Machine, Request, capacity

POLICIES = ("fifo-strict", "easy-backfill", "strict-backfill")


@dataclass(frozen=True)
class QueuedJob:
    """A job waiting to start; ``max_time`` is in seconds."""

    id: int
    request: Request
    budget: Budget
    max_time: float


@dataclass(frozen=True)
class RunningJob:
    """A job holding resources until at most ``deadline`` (epoch seconds)."""

    id: int
    alloc: Allocation
    deadline: float


@dataclass(frozen=True)
class Decision:
    """Jobs to start now, jobs that can never start, and the state to keep."""

    starts: list[tuple[int, Allocation]]
    failures: list[tuple[int, str]]
    state: dict[str, Any]


# Resources held until a deadline: (epoch seconds, what is held).
Hold = tuple[float, Allocation]


def schedule(
    policy: str,
    queue: Iterable[QueuedJob],
    running: Sequence[RunningJob],
    machine: Machine,
    limits: Limits,
    state: dict[str, Any],
    now: float,
) -> Decision:
    """Decide which queued jobs start now under ``policy``.

    ``queue`` is in submission order, ``state`` is the ``Decision.state``
    of the previous call (``{}`` the first time). Raises ValueError for an
    unknown policy.

    ``queue`` may be any iterable, read in order: ``fifo-strict`` reads it
    only up to its blocked head, so a pass behind a blocked head costs the
    same with 10 or 100,000 jobs queued (the caller need not copy its
    queue for it); the backfill policies look behind the head, and take
    the whole queue as a list.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown scheduling policy {policy!r}; choose one of {', '.join(POLICIES)}")
    state = state if isinstance(state, dict) else {}  # tolerate a lost/odd state file
    free = Free.of(capacity(machine, limits), (r.alloc for r in running))
    starts: list[tuple[int, Allocation]] = []
    failures: list[tuple[int, str]] = []
    if policy == "fifo-strict":
        _start_in_order(queue, free, machine, limits, starts, failures)
        return Decision(starts, failures, {})
    queue = queue if isinstance(queue, Sequence) else list(queue)
    head = _start_in_order(queue, free, machine, limits, starts, failures)
    if head == len(queue):
        return Decision(starts, failures, {})
    if policy == "easy-backfill":
        new_state = _easy_backfill(queue, head, free, state, starts)
    else:
        # Jobs started in this pass hold their resources until their deadline too.
        started = {j.id: j.max_time for j in queue[:head]}
        holds = [(r.deadline, r.alloc) for r in running]
        holds += [(now + started[jid], a) for jid, a in starts]
        new_state = _strict_backfill(queue, head, free, holds, state, now, starts)
    return Decision(starts, failures, new_state)


def _start_in_order(queue: Iterable[QueuedJob], free: Free, machine: Machine, limits: Limits,
                    starts: list[tuple[int, Allocation]], failures: list[tuple[int, str]]) -> int:
    """Start jobs from the front while they fit; return the blocked head's index (the number
    of jobs read when none blocked). Reads *queue* no further than its blocked head.

    Heads that can never fit are failed and skipped.
    """
    read = 0
    for job in queue:
        alloc = free.fit(job.request, job.budget)
        if alloc is not None:
            starts.append((job.id, alloc))
            free.take(alloc)
        else:
            reason = why_never_fits(job.request, job.budget, machine, limits)
            if reason is None:
                return read
            failures.append((job.id, reason))
        read += 1
    return read


def _easy_backfill(queue: Sequence[QueuedJob], head: int, free: Free, state: dict[str, Any],
                   starts: list[tuple[int, Allocation]]) -> dict[str, Any]:
    """Backfill within the head's frozen budget; return the new state."""
    head_id = queue[head].id
    budget = None
    if state.get("policy") == "easy-backfill" and state.get("head") == head_id:
        budget = Free.from_dict(free.cap, state.get("budget"))
    if budget is None:
        budget = free.copy()  # the head just blocked: freeze what is idle now
    view = free.within(budget)
    for i in range(head + 1, len(queue)):
        if view.max_cpus() == 0:
            break  # every job needs a core: nothing later can fit
        job = queue[i]
        alloc = view.fit(job.request, job.budget)
        if alloc is not None:
            starts.append((job.id, alloc))
            view.take(alloc)
            budget.take(alloc)
    return {"policy": "easy-backfill", "head": head_id, "budget": budget.to_dict()}


def reserved_start(req: Request, budget: Budget, free: Free, holds: Sequence[Hold], now: float) -> float | None:
    """Earliest time ``req`` fits if each hold is released at its deadline.

    ``holds`` is (deadline, Allocation) for everything running; a deadline
    already past counts as ``now``. None when it never fits.
    """
    sim = free.copy()
    if sim.fit(req, budget) is not None:
        return now
    for deadline, alloc in sorted(holds, key=lambda h: h[0]):
        sim.release(alloc)
        if sim.fit(req, budget) is not None:
            return max(deadline, now)
    return None


def _strict_backfill(queue: Sequence[QueuedJob], head: int, free: Free, holds: Sequence[Hold],
                     state: dict[str, Any], now: float, starts: list[tuple[int, Allocation]]) -> dict[str, Any]:
    """Backfill jobs that end before the head's reserved start."""
    job = queue[head]
    start = reserved_start(job.request, job.budget, free, holds, now)
    if start is None:
        return {}  # no provable reservation: backfill nothing
    old = state.get("start") if state.get("policy") == "strict-backfill" else None
    if state.get("head") == job.id and isinstance(old, (int, float)):
        start = min(start, old)  # a reservation never slips later
    for i in range(head + 1, len(queue)):
        if free.max_cpus() == 0:
            break
        later = queue[i]
        if now + later.max_time > start:
            continue
        alloc = free.fit(later.request, later.budget)
        if alloc is not None:
            starts.append((later.id, alloc))
            free.take(alloc)
    return {"policy": "strict-backfill", "head": job.id, "start": start}

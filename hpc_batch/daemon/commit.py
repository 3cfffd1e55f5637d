"""The commit path's state: staged journal lines, their sequence numbers and batches.

Changes are staged (each with the next sequence number) and made durable a
batch at a time: one journal append and one fdatasync per turn of the
daemon's loop (Store.commit orders the rest of a commit around it).
"""

from ..core.jobs import FINISHED, Job
from .journal import Journal, end_line, line

# The journal lines an unfinished job may still write, beyond its submit: a start, an end (or a
# stop, a change of its max time) and its drop. Each is its record without the command (format 2).
LINES_TO_COME = 3


class Staging:
    """What waits for the next commit, and the counters the journal's lines carry."""

    def __init__(self, journal: Journal):
        self.journal = journal
        self.pending: list[tuple[int | None, bytes]] = []   # staged lines: (job id or None, line)
        self.seq = 0
        self.batch = 0                     # the last batch the journal holds durably
        self.live: set[int] = set()        # jobs the journal holds a record of
        self.owes: dict[int, int] = {}     # unfinished job -> bytes of journal lines it may still write
        self.owed = 0                      # their sum: what the disk reserve keeps for them
        self.meta: dict = {}

    def next_seq(self) -> int:
        """The sequence number of the next line."""
        self.seq += 1
        return self.seq

    def stage(self, job_id: int | None, entry: dict) -> None:
        """Stage *entry* as a journal line (of *job_id*'s, or None: of no job's)."""
        self.pending.append((job_id, line(entry)))

    @property
    def has_pending(self) -> bool:
        """True while staged changes wait for a commit."""
        return bool(self.pending)

    def write_batch(self) -> None:
        """Append the staged lines as one batch, durable with one fdatasync; OSError leaves them staged."""
        self.seq += 1
        data = b"".join(data for _, data in self.pending)
        self.journal.append(data + end_line(self.seq, self.batch + 1, len(self.pending)))
        self.batch += 1
        self.pending.clear()

    def forget(self, job_ids: set) -> None:
        """Unstage the lines of jobs a failed commit refused, and what they were owed."""
        self.pending = [(j, data) for j, data in self.pending if j not in job_ids]
        self.live -= job_ids
        for job_id in job_ids:
            self.owed -= self.owes.pop(job_id, 0)

    def owe(self, job: Job, size: int) -> None:
        """Count what an unfinished job's journal lines to come may take (*size*: one of them)."""
        self.owed -= self.owes.pop(job.id, 0)
        if job.state != FINISHED:
            self.owes[job.id] = LINES_TO_COME * (size + 64)   # 64: a line's seq and keys
            self.owed += self.owes[job.id]

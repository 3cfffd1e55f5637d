"""The format versions of the daemon's own state files, and the refusal of a newer one.

A daemon reads what older versions wrote (their records keep loading: the
0.1.0 state in tests/data is the proof), but it cannot know what a newer
one means by a record: reading it anyway would act on a guess. So each file
says which format it is, and a daemon that meets a newer format than it
knows says so in one line, naming the file and both versions:

- the journal (``journal.py``): its first line, ``{"seq": N, "format": F}``,
  written at the head of every snapshot, so it is read before anything else
  in the file. A newer journal stops the daemon from starting (exit 78):
  it is the truth about every job, and replacing it with what this daemon
  understands would lose the newer version's records.
- ``job.json`` (``jobcache.py``): a ``"format"`` key. A newer one is set aside
  in ``quarantine/`` with its job directory, as a damaged record is, and the
  daemon starts without that job.

A file without the key was written before formats were numbered, by 0.1.0
and its successors up to this one: it is format 1. Raise a number only when
an older daemon would misread the new records; add the step to CHANGELOG.md
("Formats").
"""

from .. import __version__

JOURNAL = 2     # the journal's lines (journal.py's docstring); 2: a change of a job names its argv "same"
JOB = 1         # jobs/<id>/job.json: Job.to_dict() with the store's seq and batch
UNNUMBERED = 1  # what a file without a format key is


class NewerFormat(Exception):
    """A state file in a format newer than this daemon knows; the message is one line naming it."""


def format_of(record: dict) -> int | None:
    """The format a record says it has (UNNUMBERED when it says none), or None when its key is unusable."""
    value = record.get("format", UNNUMBERED)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def check(record: dict, known: int, path: str, what: str) -> None:
    """Raise NewerFormat unless *record* (the content of *path*, a *what*) is in a format up to *known*."""
    found = format_of(record)
    if found is None:
        raise NewerFormat(f"{path}: the {what}'s format {record.get('format')!r} is not a format number; "
                          f"this hpc-batchd ({__version__}) reads {what} formats 1 to {known}")
    if found > known:
        raise NewerFormat(f"{path}: {what} format {found} is newer than this hpc-batchd ({__version__}) "
                          f"reads (formats 1 to {known}); a newer hpc-batch wrote it")

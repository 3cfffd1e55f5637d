"""The job.json caches (jobs/<id>/job.json): their checksummed form, writing one, reading one back.

A cache is written at every change of a job, without fsyncs: the journal is
the truth (store.py). The loader and the compaction read them back.
"""

import os
import stat
import zlib

from shepherd.base.records import dumps_wire, write_atomic

from ..core.jobs import Job
from . import formats
from .statefiles import read_json

# A job.json this daemon writes: ``{"crc":NNNNNNNNNN,"format":...`` (a CRC-32, right-aligned in ten
# places) and the rest of the record in compact JSON, whose checksum it is, then spaces up to the
# file's old length. The checksum is what lets the cache be rewritten in place (no new file per
# change of state): a rewrite cut short (a kill -9 between pages, a power cut) fails it and reads
# as no cache at all. A file in any other form (an older daemon's, one an admin edited and saved
# with other spacing) is read as it is.
_CRC_HEAD = b'{"crc":'
_CRC_BODY = len(_CRC_HEAD) + 11       # where the checksummed bytes begin (after the digits and a comma)
_BLOCK = 4096                         # a rewrite within the blocks a file holds never needs a new one


def _cache_bytes(record: bytes) -> bytes:
    """job.json's content for *record* (the job's compact JSON, as its journal line holds it)."""
    rest = b'"format":%d,' % formats.JOB + record[1:]
    return b'%s%10d,%s' % (_CRC_HEAD, zlib.crc32(rest), rest)


def _checked_cache(raw: bytes) -> bool:
    """False for a job.json in this daemon's checksummed form whose checksum fails (a torn rewrite)."""
    if not (raw.startswith(_CRC_HEAD) and raw[_CRC_BODY - 1:_CRC_BODY + 9] == b',"format":'):
        return True
    digits = raw[len(_CRC_HEAD):_CRC_BODY - 1].lstrip(b" ")
    return digits.isdigit() and zlib.crc32(raw[_CRC_BODY:].rstrip(b" ")) == int(digits)


class JobCache:
    """Every job's directory under jobs/ and the job.json cache in it."""

    def __init__(self, jobs_dir: str):
        self.dir = jobs_dir
        self.fresh: set[int] = set()      # jobs submitted in the batch not yet committed (cache: renamed)
        self.torn: set[int] = set()       # jobs whose in-place cache rewrite failed half way

    def job_dir(self, job_id: int) -> str:
        """Directory of one job."""
        return os.path.join(self.dir, str(job_id))

    def create_job_dir(self, job_id: int, gid: int | None) -> str:
        """Make the job's directory: root-owned so no user can plant entries in it.

        Not fsynced: the journal line of the job's first record is what makes
        it durable, and the loader re-creates a directory a crash lost.
        """
        d = self.job_dir(job_id)
        os.mkdir(d, 0o751)
        if os.geteuid() == 0 and gid is not None:
            os.chown(d, -1, gid)
        os.chmod(d, 0o751)
        return d

    def write(self, job: Job, data: dict, record: bytes | None = None) -> None:
        """Write job.json: in place over the last one when that is safe, else a new file renamed in.

        In place costs no new inode (on ext4 a create and the free of the file it replaces are
        most of a write's cost). It is safe once the job's submit is durable (a torn rewrite then
        reads as no cache, and the journal's record stands in) and while the record fits in the
        blocks the file already holds (so it cannot run out of room half way). A submit's first
        write is always renamed in: a job the journal lacks is told apart by its cache.
        """
        content = _cache_bytes(record if record is not None else dumps_wire(data).encode("ascii"))
        path = os.path.join(self.job_dir(job.id), "job.json")
        if job.id not in self.fresh and self._rewrite(job.id, path, content):
            return
        try:
            write_atomic(path, content, durable=False)
        except FileNotFoundError:   # its directory is gone (a crash lost it): the loader makes it again
            os.makedirs(self.job_dir(job.id), 0o751, exist_ok=True)
            write_atomic(path, content, durable=False)
        self.torn.discard(job.id)

    def _rewrite(self, job_id: int, path: str, content: bytes) -> bool:
        """Overwrite *path* with *content* (padded with spaces to its length); False: not done."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or \
                    len(content) > -(-st.st_size // _BLOCK) * _BLOCK:
                return False
            view = memoryview(content.ljust(st.st_size, b" "))
            self.torn.add(job_id)
            offset = 0
            while offset < len(view):
                offset += os.pwrite(fd, view[offset:], offset)
            self.torn.discard(job_id)
            return True
        except OSError:
            return False    # renamed in instead (or the write's error is raised from there)
        finally:
            os.close(fd)

    def read(self, job_id: int) -> dict | None:
        """A job's job.json, less its format key (None when it cannot be read); formats.NewerFormat
        when it is in a format this daemon does not know."""
        path = os.path.join(self.job_dir(job_id), "job.json")
        data = read_json(path, _checked_cache)
        if data is not None:
            formats.check(data, formats.JOB, path, "job.json")
            data.pop("format", None)
            data.pop("crc", None)
        return data


"""The file a job may write its own figures to (``$HPC_BATCH_METRICS_FILE``; docs/record.md).

The shepherd, root, makes it just before it forks the job: a new file in
/tmp under an unpredictable name (``O_EXCL``: a name planted there only
costs the job its variable), given to the job's user. At the job's end it
reads it back without trusting the name: the job may have put anything
there. It is read only if it is a regular file of the job's user with one
link, never through a link, never more than :data:`figures.MAX_BYTES`, and
without blocking (a FIFO is opened ``O_NONBLOCK`` and refused); then the
name is removed if it still is that file. Standard library only.
"""

import os
import stat

from . import figures

try:
    from shepherd.base import sysread
except ImportError:  # run as a file: the base is a top-level package
    from base import sysread  # type: ignore[no-redef]

DIRECTORY = "/tmp"
PREFIX = "hpc-batch-metrics."
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def create(job_id, uid: int, gid: int, directory: str | None = None) -> tuple[str, str | None]:
    """Make the job's empty file, 0600, its user's: ``(path, None)``, or ``(path, why not)``."""
    path = os.path.join(directory or DIRECTORY, f"{PREFIX}{job_id}.{os.urandom(8).hex()}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o600)
    except OSError as exc:
        return path, f"cannot create it ({sysread.error_text(exc)})"
    try:
        if os.geteuid() == 0:
            os.fchown(fd, uid, gid)
        elif os.geteuid() != uid:   # a daemon run as a user runs jobs as itself only
            raise PermissionError(1, "not root")
    except OSError as exc:
        os.close(fd)
        remove(path)
        return path, f"cannot give it to uid {uid} ({sysread.error_text(exc)})"
    os.close(fd)
    return path, None


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def kind(mode: int) -> str:
    """What a file of *mode* is, in words."""
    for test, words in _KINDS:
        if test(mode):
            return words
    return "a regular file" if stat.S_ISREG(mode) else "an unknown kind of file"


def read(path: str, uid: int, limit: int = figures.MAX_BYTES) -> dict:
    """The figures at *path* as a record field (null with why when refused); removes the file."""
    try:
        fd = os.open(path, _READ)
    except FileNotFoundError:
        return sysread.field(None, path, "the job removed the file: nothing read")
    except OSError as exc:   # ELOOP: a symbolic link; ENXIO: a socket
        try:
            found = kind(os.lstat(path).st_mode)
        except OSError:
            found = "something"
        return sysread.field(None, path, f"found {found}, not read ({sysread.error_text(exc)})")
    try:
        st = os.fstat(fd)
        why = None
        if not stat.S_ISREG(st.st_mode):
            why = f"found {kind(st.st_mode)}, not read"
        elif st.st_uid != uid:
            why = f"found a file of uid {st.st_uid}, not the job's user ({uid}): not read"
        elif st.st_nlink != 1:
            why = f"found a file with {st.st_nlink} hard links: not read"
        data = b"" if why else sysread.read_upto(fd, limit + 1)
    except OSError as exc:
        return sysread.field(None, path, f"cannot read it ({sysread.error_text(exc)})")
    finally:
        os.close(fd)
    if st.st_uid == uid and not stat.S_ISDIR(st.st_mode):
        _remove_if_same(path, st)
    if why:
        return sysread.field(None, path, why)
    cut = len(data) > limit
    value = figures.parse(data[:limit], cut)
    value["bytes"] = min(len(data), limit)
    if cut:
        value["cut"] = (f"the file held more than {limit} bytes ({st.st_size} when read): "
                        "the rest, and the line the bound cut, were not read")
    return sysread.field(value, path)


def _remove_if_same(path: str, st: os.stat_result) -> None:
    """Unlink *path* if it still names the file *st* describes (the job may have swapped it since)."""
    try:
        now = os.lstat(path)
    except OSError:
        return
    if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
        remove(path)

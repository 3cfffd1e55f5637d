"""The output destination, checked by ``dispatch`` as the user who submits.

The check runs in the client, with the user's own permissions, so the root
daemon never touches a path a user controls to answer a submit (a FIFO, a
stalled network mount or a stopped helper could otherwise hold it up), and
never approves a destination only because root could write there. It is a
courtesy, not the safeguard: the shepherd writes the log as the user, never
through a link and never into another user's file, whatever the client said.
"""

import os
import stat


class OutputError(ValueError):
    """The output destination is unusable; the message says why and what to do."""


def log_name(job_id: int) -> str:
    """The default log file name."""
    return f"output.{job_id}.log"


def check_destination(cwd: str, output: str | None) -> tuple:
    """Check where a job's log will go; returns ``(path, is_dir)``.

    *output* is a directory, a file, or None (the submit directory). A
    directory gets ``output.<id>.log`` in it once the daemon assigns the id.
    """
    target = output or cwd
    try:
        st = os.stat(target)
        is_dir = stat.S_ISDIR(st.st_mode)
    except FileNotFoundError:
        is_dir = False
    except OSError as exc:
        raise OutputError(f"cannot use output path {target}: {exc.strerror}") from None
    parent = target if is_dir else (os.path.dirname(target) or "/")
    if not os.path.isdir(parent):
        raise OutputError(f"output directory {parent} does not exist; create it or pick another --output")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write to {parent}: permission denied; "
                          f"pick a directory you can write with --output, or use --no-output")
    if is_dir:
        return target, True
    try:
        lst = os.lstat(target)
    except FileNotFoundError:
        return target, False
    except OSError as exc:
        raise OutputError(f"cannot use output file {target}: {exc.strerror}") from None
    if stat.S_ISLNK(lst.st_mode):
        raise OutputError(f"output file {target} is a symbolic link; hpc-batch never writes through "
                          f"links: remove it or pick another --output")
    if not stat.S_ISREG(lst.st_mode):
        raise OutputError(f"output path {target} exists and is not a regular file")
    if lst.st_uid != os.geteuid():
        raise OutputError(f"output file {target} belongs to another user; hpc-batch never writes into "
                          f"another user's file: pick another --output")
    if not os.access(target, os.W_OK):
        raise OutputError(f"cannot overwrite {target}: permission denied")
    return target, False

"""The output destination, checked by ``dispatch`` as the user who submits.

The check runs in the client, with the user's own permissions, so the root
daemon never touches a path a user controls to answer a submit (a FIFO, a
stalled network mount or a stopped helper could otherwise hold it up), and
never approves a destination only because root could write there. It is a
courtesy, not the safeguard: the shepherd writes the log as the user, never
through a link and never into another user's file, whatever the client said.
"""

import stat

from .posixcalls import W_OK, X_OK, access, dirname, geteuid, is_dir, lstat, stat_of


class OutputError(ValueError):
    """The output destination is unusable; the message says why and what to do."""



def check_destination(cwd: str, output: str | None, flag: str = "--output") -> tuple:
    """Check where a job's log will go; returns ``(path, is_dir)``.

    *output* is a directory, a file, or None (the submit directory). A
    directory gets ``output.<id>.log`` in it once the daemon assigns the id.
    *flag* names the option in messages (``--record`` checks its file the same way).
    """
    what = flag.lstrip("-")
    target = output or cwd
    try:
        st = stat_of(target)
        a_dir = stat.S_ISDIR(st.st_mode)
    except FileNotFoundError:
        a_dir = False
    except OSError as exc:
        raise OutputError(f"cannot use {what} path {target}: {exc.strerror}; pick another {flag}") from None
    parent = target if a_dir else (dirname(target) or "/")
    if not is_dir(parent):
        raise OutputError(f"{what} directory {parent} does not exist; create it or pick another {flag}")
    if not access(parent, W_OK | X_OK):
        raise OutputError(f"cannot write to {parent}: permission denied; "
                          f"pick a directory you can write with {flag}"
                          + (", or use --no-output" if flag == "--output" else ""))
    if a_dir:
        return target, True
    try:
        lst = lstat(target)
    except FileNotFoundError:
        return target, False
    except OSError as exc:
        raise OutputError(f"cannot use {what} file {target}: {exc.strerror}") from None
    if stat.S_ISLNK(lst.st_mode):
        raise OutputError(f"{what} file {target} is a symbolic link; hpc-batch never writes through "
                          f"links: remove it or pick another {flag}")
    if not stat.S_ISREG(lst.st_mode):
        raise OutputError(f"{what} path {target} exists and is not a regular file")
    if lst.st_uid != geteuid():
        raise OutputError(f"{what} file {target} belongs to another user; hpc-batch never writes into "
                          f"another user's file: pick another {flag}")
    if not access(target, W_OK):
        raise OutputError(f"cannot overwrite {target}: permission denied")
    return target, False


def read_user_json(path: str, limit: int):
    """The JSON document in the user's file *path* (a record to compare), at most *limit* bytes.

    Read as the user, but still never blocking on a FIFO or a device: only a
    regular file is read. Raises OSError or ValueError saying why not.
    """
    import os  # (record diff only: not on the path of a submit)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"larger than {limit >> 10} KiB, more than any record")
    from shepherd.base.jsoncodec import loads
    return loads(data.decode("utf-8", "replace"))

"""Filesystem checks made *as the submitting user*, never as root.

Root must not follow a path a user controls, and must not approve a
destination only because root could write there. So the submit-time check of
the output destination runs in a forked child that has dropped to the user's
uid/gid (a root daemon) or in-process (a user-mode daemon, which already is
that user). The child's verdict comes back over a pipe.
"""

import os
import stat


class OutputError(ValueError):
    """The output destination is unusable; the message says why and what to do."""


def log_name(job_id: int) -> str:
    """The default log file name."""
    return f"output.{job_id}.log"


def resolve_output(job_id: int, cwd: str, output: str | None) -> str:
    """Check *output* (a directory, a file or None = *cwd*) and return the log path.

    Runs with the caller's own permissions; see :func:`check_output_as`.
    """
    target = output or cwd
    try:
        st = os.stat(target)
        is_dir = stat.S_ISDIR(st.st_mode)
    except FileNotFoundError:
        is_dir = False
    except OSError as exc:
        raise OutputError(f"cannot use output path {target}: {exc.strerror}") from None
    path = os.path.join(target, log_name(job_id)) if is_dir else target
    parent = os.path.dirname(path) or "/"
    if not os.path.isdir(parent):
        raise OutputError(f"output directory {parent} does not exist; create it or pick another --output")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write to {parent}: permission denied; "
                          f"pick a directory you can write with --output, or use --no-output")
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise OutputError(f"cannot use output file {path}: {exc.strerror}") from None
    if stat.S_ISLNK(lst.st_mode):
        raise OutputError(f"output file {path} is a symbolic link; hpc-batch never writes through "
                          f"links: remove it or pick another --output")
    if not stat.S_ISREG(lst.st_mode):
        raise OutputError(f"output path {path} exists and is not a regular file")
    if not os.access(path, os.W_OK):
        raise OutputError(f"cannot overwrite {path}: permission denied")
    return path


def check_output_as(uid: int, gid: int, user: str, job_id: int, cwd: str, output: str | None) -> str:
    """:func:`resolve_output` run with *uid*'s permissions; returns the log path."""
    if os.geteuid() != 0 or uid == 0:
        return resolve_output(job_id, cwd, output)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: become the user, decide, report, vanish
        code = 1
        try:
            os.close(rfd)
            os.initgroups(user, gid)
            os.setgid(gid)
            os.setuid(uid)
            msg = "ok\0" + resolve_output(job_id, cwd, output)
            code = 0
        except OutputError as exc:
            msg = "error\0" + str(exc)
        except BaseException as exc:  # report, never raise into the daemon's copy of the stack
            msg = f"error\0cannot check the output destination as {user}: {exc}"
        try:
            os.write(wfd, msg.encode("utf-8", "surrogateescape"))
        finally:
            os._exit(code)
    os.close(wfd)
    chunks = []
    while True:
        data = os.read(rfd, 65536)
        if not data:
            break
        chunks.append(data)
    os.close(rfd)
    os.waitpid(pid, 0)
    kind, _, text = b"".join(chunks).decode("utf-8", "surrogateescape").partition("\0")
    if kind != "ok":
        raise OutputError(text or "cannot check the output destination")
    return text

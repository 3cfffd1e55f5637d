"""``dispatch new --notify``: its forms, its variables, its line, and utmp; pure (no I/O).

The one definition of each: the client and the daemon check a request
against :data:`FORMS`, and the shepherd's notifier (``notify.py``) does what
it says. Standard library only, and cheap to import: the shepherd pays for
every import at each job's start.
"""

import struct

TTY = "tty"     # a line on each terminal the submitter is logged in on, as write(1) puts one
CMD = "cmd"     # the submitter's command, run as the submitter (--notify-command)
FORMS = (TTY, CMD)

LIMIT = 30.0          # seconds the command may run before its process group gets SIGTERM
KILL_GRACE = 2.0      # then SIGKILL after this
TTY_WRITE_LIMIT = 1.0  # seconds one terminal may take to accept the line before it is skipped
MAX_COMMAND = 4096    # bytes of --notify-command
MAX_TERMINALS = 32    # login terminals of one user written to (a utmp can list thousands)

# The command's environment on top of the job's: the one place these names are spelled.
ENV_ID = "HPC_BATCH_JOB_ID"
ENV_NAME = "HPC_BATCH_JOB_NAME"          # its --name, or empty
ENV_RESULT = "HPC_BATCH_JOB_RESULT"      # exited, signalled, killed, timeout, oom or error
ENV_EXIT = "HPC_BATCH_JOB_EXIT"          # list --finished's <exit>: the code, signal name, or the result
ENV_CODE = "HPC_BATCH_JOB_CODE"          # the exit code when it exited on its own, else empty
ENV_OUTPUT = "HPC_BATCH_JOB_OUTPUT"      # the delivered log, or empty (none, or not delivered)
ENV_WALL = "HPC_BATCH_JOB_WALL"          # seconds it ran, whole
ENV_NAMES = (ENV_ID, ENV_NAME, ENV_RESULT, ENV_EXIT, ENV_CODE, ENV_OUTPUT, ENV_WALL)


def parse_forms(text: str | None, has_command: bool) -> list:
    """The forms of ``--notify=TEXT`` (comma-separated), in :data:`FORMS` order; ValueError naming
    what is wrong. *has_command*: ``--notify-command`` was given (it implies ``cmd``)."""
    words = [w.strip() for w in text.split(",")] if text is not None else []
    for word in words:
        if word not in FORMS:
            cut = word if len(word) <= 40 else word[:40] + "..."   # (a megabyte of junk is not echoed)
            shown = repr(cut) if cut.isprintable() else ascii(cut)
            raise ValueError(f"--notify {shown}: {'an empty form' if not word else 'unknown form'}; "
                             f"give {' or '.join(FORMS)}, comma-separated, e.g. --notify tty,cmd")
    chosen = set(words) | ({CMD} if has_command else set())
    if CMD in chosen and not has_command:
        raise ValueError("--notify cmd needs the command: add --notify-command 'CMD'")
    return [f for f in FORMS if f in chosen]


def check_command(command: str) -> str:
    """*command* as ``--notify-command`` may hold it; ValueError naming what is wrong."""
    if not command.strip():
        raise ValueError("--notify-command is empty: give a shell command line, "
                         "e.g. --notify-command 'echo done >> ~/jobs.ended'")
    if "\0" in command or len(command.encode("utf-8", "surrogatepass")) > MAX_COMMAND:
        raise ValueError(f"--notify-command holds a NUL or is longer than {MAX_COMMAND} bytes: "
                         f"put it in a script and give its path")
    return command


def check_request(notify) -> None:
    """Raise ValueError unless *notify* is a stored request's ``notify`` (``{"forms", "command"}``)."""
    if not isinstance(notify, dict) or not isinstance(notify.get("forms"), list) or not notify["forms"]:
        raise ValueError("request.notify must be an object with a list of forms")
    if any(f not in FORMS for f in notify["forms"]):
        raise ValueError(f"request.notify.forms may hold only {', '.join(FORMS)}")
    command = notify.get("command")
    if (command is None) == (CMD in notify["forms"]) or (command is not None and not isinstance(command, str)):
        raise ValueError("request.notify.command must be text exactly when its forms hold cmd")
    if command is not None:
        check_command(command)


def escape(text: str) -> str:
    """*text* with every character a terminal could act on (controls, escapes, bidi marks) as ``\\xNN``."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def duration(seconds: float) -> str:
    """``3m12s``, ``2h0m5s``, ``4s``: whole seconds, largest unit first."""
    left = max(0, int(seconds))
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if left >= size or out:
            out += f"{left // size}{unit}"
            left %= size
    return f"{out}{left}s"


def label(job_id, name, argv, width: int = 40) -> str:
    """How the line names the job: ``12 (prep)``, or ``12 (sh -c ...)`` from its command cut to *width*."""
    what = name or " ".join(argv or ())
    if len(what) > width:
        what = what[:width - 3] + "..."
    return f"{job_id} ({escape(what)})" if what else str(job_id)


def line(job_id, name, argv, exit_word: str, wall: float | None) -> bytes:
    """The terminal line, ``\\r\\n``-framed as write(1)'s are, so a terminal in raw mode shows it whole."""
    words = f"exit {exit_word}" if exit_word.isdigit() else exit_word
    after = f" after {duration(wall)}" if wall is not None else ""
    text = f"hpc-batch: job {label(job_id, name, argv)} ended: {escape(words)}{after}"
    return f"\r\n{text}\r\n".encode("utf-8", "backslashreplace")


# utmp(5) as glibc writes it on Linux (64-bit time as two int32s): 384 bytes a record.
UTMP_PATH = "/run/utmp"
UTMP = struct.Struct("<hxxi32s4s32s256shhiii4i20x")
USER_PROCESS = 7


def terminals(data: bytes, user: str) -> list:
    """The ``/dev``-relative lines (``pts/3``) of *user*'s login sessions in utmp *data*; a line that
    is not a plain device name below /dev (``..``, absolute, odd characters) is left out."""
    found = []
    for off in range(0, len(data) - UTMP.size + 1, UTMP.size):
        kind, _pid, raw_line, _id, raw_user = UTMP.unpack_from(data, off)[:5]
        if kind != USER_PROCESS or raw_user.split(b"\0", 1)[0].decode("utf-8", "replace") != user:
            continue
        name = raw_line.split(b"\0", 1)[0].decode("ascii", "replace")
        parts = name.split("/")
        if name and all(p and p not in (".", "..") and all(c.isalnum() or c in "-_." for c in p) for p in parts) \
                and name not in found:
            found.append(name)
    return found


def utmp_record(user: str, tty_line: str, pid: int = 0) -> bytes:
    """One USER_PROCESS record, as login(1) writes it (for tests that register a terminal)."""
    return UTMP.pack(USER_PROCESS, pid, tty_line.encode(), tty_line[-4:].encode(), user.encode(), b"",
                     0, 0, 0, 0, 0, 0, 0, 0, 0)

"""dispatch: the hpc-batch client.

Every verb sends one request over the daemon's unix socket and prints the
reply; the daemon learns who is asking from the socket itself. Parsing is
docopt (a usage error exits 2 with the usage), and this module imports as
little as it can: it runs on every submit.
"""

import os
import re
import sys

from . import __version__

USAGE = """dispatch: submit and manage hpc-batch jobs.

Usage:
  dispatch new [options] [--] <command>...
  dispatch list [--all] [--finished]
  dispatch attach <id>
  dispatch kill <id>
  dispatch job <id> max-time (get | set <duration> | add <duration>)
  dispatch (-h | --help)
  dispatch --version

Commands:
  new      Queue a job; everything after "--" is its command line.
  list     Show queued and running jobs (--finished: recent ones too).
  attach   Follow a running job's output.
  kill     Kill a running job, or remove a queued one.
  job      Read a job's max time; admins can set it or add to it.

Run 'dispatch <command> --help' for a command's options. The daemon's socket
is $HPC_BATCH_SOCKET, or /run/hpc-batch/hpc-batch.sock.
"""

NEW_USAGE = """Queue a job. Everything after "--" is its command line; leading NAME=VALUE
words become its environment, as env(1) reads them.

Usage:
  dispatch new [--cpu N] [--gpu-cores N] [--gpu-link CLASS] [--max-mem GB] [--max-time D]
               [--exclusive] [--numa-local] [--numa-local-mem] [--numa-local-gpu] [--env]
               [--output PATH | --no-output] [--] <command>...
  dispatch new (-h | --help)

Options:
  --cpu N           Cores, all from one NUMA node (default 1; with --exclusive, all).
  --gpu-cores N     GPUs; the job sees them in CUDA_VISIBLE_DEVICES [default: 0].
  --gpu-link CLASS  Wait for GPUs linked at worst by CLASS: NV for any NVLink,
                    NV4 for 4 NVLinks or more, PIX, PXB, PHB, NODE or SYS.
  --max-mem GB      Hard memory budget in GiB (or 512M, 64G). Default: the share
                    of a NUMA node its cores represent.
  --max-time D      Kill the job after this long: 3600, 45m, 2h, 1h30m, 1d.
                    Default and ceiling: the daemon's --max-lifetime.
  --exclusive       Run alone on the machine (waits until it is idle).
  --numa-local      Both of the next two.
  --numa-local-mem  Wait for one NUMA node that fits the whole budget rather
                    than spreading it over nodes.
  --numa-local-gpu  Take CPUs only on the NUMA node the job's GPUs hang off.
  --env             Forward this environment instead of a clean one.
  --output PATH     Directory or file for the log [default: ./output.<id>.log].
  --no-output       Discard the output when the job ends.
  -h --help         Show this help.
"""

LIST_USAGE = """List jobs: <username> <id> <command> <start> <uptime> <max-time> <mem> <exclusive>;
with --finished also <state> <exit>.

Usage:
  dispatch list [--all] [--finished]
  dispatch list (-h | --help)

Options:
  --all        Every user's jobs (admins, or everyone with --list-is-public).
  --finished   Include recently finished jobs and their exit status.
  -h --help    Show this help.
"""

ATTACH_USAGE = """Follow a job's output until it ends, then print its final state.

Usage:
  dispatch attach <id>
  dispatch attach (-h | --help)

Options:
  -h --help    Show this help.
"""

KILL_USAGE = """Kill a running job (state killed) or remove a queued one.

Usage:
  dispatch kill <id>
  dispatch kill (-h | --help)

Options:
  -h --help    Show this help.
"""

JOB_USAGE = """Read a job's max time, or (admins only) change it: set a new one, or add to it.
A running job's deadline moves with it (counted from when it started).

Usage:
  dispatch job <id> max-time get
  dispatch job <id> max-time set <duration>
  dispatch job <id> max-time add <duration>
  dispatch job (-h | --help)

Options:
  -h --help    Show this help.
"""

SUBCOMMANDS = {"new": NEW_USAGE, "list": LIST_USAGE, "attach": ATTACH_USAGE, "kill": KILL_USAGE,
               "job": JOB_USAGE}
EX_USAGE = 2
EX_UNAVAILABLE = 69
_ENV_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


class UsageError(Exception):
    """A bad flag value: printed with a hint, exit 2."""


def _die(msg: str, status: int = 1) -> int:
    print(f"dispatch: {msg}", file=sys.stderr)
    return status


def parse_mem(text: str) -> int:
    """``--max-mem``: GiB by default, or a K/M/G/T suffix; returns bytes."""
    from .sizes import SizeError, parse_size
    try:
        return parse_size(text, "G")
    except SizeError as exc:
        raise UsageError(f"--max-mem {exc}") from None


def _positive(flag: str, text: str, minimum: int) -> int:
    if not re.fullmatch(r"-?\d+", text.strip()) or int(text) < minimum:
        raise UsageError(f"{flag} {text!r}: expected a whole number of at least {minimum}")
    return int(text)


def split_env(words):
    """Leading NAME=VALUE words (env(1) style) and the command after them."""
    env = {}
    i = 0
    while i < len(words) and _ENV_WORD.match(words[i]):
        name, _, value = words[i].partition("=")
        env[name] = value
        i += 1
    return env, list(words[i:])


def _job_id(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) == 0:
        raise UsageError(f"job id {text!r}: expected a positive number, as shown by dispatch list")
    return int(text)


def cmd_new(conn, a) -> int:
    from .durations import DurationError, parse_duration
    job_env, argv = split_env(a["<command>"])
    if not argv:
        raise UsageError("no command given: put it after '--', e.g. dispatch new -- echo hello")
    try:
        cwd = os.getcwd()
    except OSError as exc:
        raise UsageError(f"cannot submit from this directory ({exc.strerror}): cd somewhere that exists") from None
    args = {"argv": argv, "cwd": cwd, "job_env": job_env,
            "cpus": None if a["--cpu"] is None else _positive("--cpu", a["--cpu"], 1),
            "gpus": _positive("--gpu-cores", a["--gpu-cores"], 0),
            "mem": None if a["--max-mem"] is None else parse_mem(a["--max-mem"]),
            "exclusive": a["--exclusive"], "numa_local": a["--numa-local"] or a["--numa-local-mem"],
            "numa_local_gpu": a["--numa-local-gpu"] or (a["--numa-local"] and a["--gpu-cores"] not in ("0", None)),
            "no_output": a["--no-output"],
            "base_env": {k: os.environ[k] for k in ("PATH", "LANG") if k in os.environ}}
    if a["--gpu-link"] is not None:
        args["gpu_link"] = a["--gpu-link"]
    if a["--max-time"] is not None:
        try:
            args["max_time"] = parse_duration(a["--max-time"])
        except DurationError as exc:
            raise UsageError(f"--max-time: {exc}") from None
    if a["--output"] and a["--output"] != "./output.<id>.log":
        args["output"] = os.path.abspath(os.path.expanduser(a["--output"]))
    if not a["--no-output"]:
        from .userio import OutputError, check_destination
        try:
            _, args["output_is_dir"] = check_destination(cwd, args.get("output"))
        except OutputError as exc:
            return _die(str(exc))
    mask = os.umask(0o077)
    os.umask(mask)
    args["umask"] = mask
    if a["--env"]:
        args["env"] = dict(os.environ)
    reply = conn().call("new", **args)
    if not reply.get("ok"):
        return _die(reply.get("error", "the daemon refused the job"))
    r = reply["result"]
    from .listing import format_mem
    how = "assigned by default" if r.get("mem_assigned") else "requested"
    where = f"output to {r['output']}" if r.get("output") else "output discarded"
    print(f"job {r['id']} {r['state']}; memory budget {format_mem(r['mem'])} ({how}); {where}")
    return 0


def cmd_list(conn, a) -> int:
    from .listing import format_rows
    reply = conn().call("list", all=a["--all"], finished=a["--finished"])
    if not reply.get("ok"):
        return _die(reply.get("error", "list failed"))
    import time
    for line in format_rows(reply["result"]["jobs"], time.time(), a["--finished"]):
        print(line)
    return 0


def cmd_kill(conn, a) -> int:
    job_id = _job_id(a["<id>"])
    reply = conn().call("kill", id=job_id)
    if not reply.get("ok"):
        return _die(reply.get("error", "kill failed"))
    was = reply["result"].get("was")
    print(f"job {job_id} removed from the queue" if was == "queued" else f"job {job_id} is being killed")
    return 0


def cmd_job(conn, a) -> int:
    from .durations import DurationError, format_duration, parse_duration
    job_id = _job_id(a["<id>"])
    action = "set" if a["set"] else "add" if a["add"] else "get"
    args = {"id": job_id, "setting": "max_time", "action": action}
    if action != "get":
        try:
            args["seconds"] = parse_duration(a["<duration>"])
        except DurationError as exc:
            raise UsageError(f"max-time {action}: {exc}") from None
    reply = conn().call("job", **args)
    if not reply.get("ok"):
        return _die(reply.get("error", "the daemon refused"))
    r = reply["result"]
    line = f"job {job_id} max-time {format_duration(r['max_time'])}"
    if r.get("deadline") and r.get("state") == "running":
        import time
        line += f" (ends by {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r['deadline']))})"
    print(line)
    return 0


def _end_line(ev: dict) -> str:
    jid = ev.get("id")
    if ev.get("state") == "removed":
        return f"job {jid} was removed from the queue before it started"
    line = f"job {jid} {ev.get('state')}: exit {ev.get('exit')}"
    if ev.get("note"):
        line += f" ({ev['note']})"
    return line


def cmd_attach(conn, a) -> int:
    import time

    from .client import Unreachable
    job_id = _job_id(a["<id>"])
    offset, out = 0, sys.stdout.buffer
    deadline = None
    while True:
        try:
            c = conn()
        except Unreachable as exc:
            if deadline is None or time.monotonic() > deadline:
                return _die(f"{exc}" if deadline is None else
                            f"hpc-batchd restarted and is not back; job {job_id} may still be running: "
                            f"run dispatch attach {job_id} again later", EX_UNAVAILABLE)
            time.sleep(0.2)
            continue
        c.send("attach", id=job_id, offset=offset)
        while True:
            msg = c.receive()
            if msg is None:
                break
            if not msg.get("ok"):
                return _die(msg.get("error", "attach failed"))
            ev = msg.get("event")
            if ev == "output":
                data = msg["data"].encode("utf-8", "surrogateescape")
                out.write(data)
                out.flush()
                offset = msg.get("offset", offset + len(data))
            elif ev == "attached" and msg.get("state") == "queued" and offset == 0:
                print(f"job {job_id} is queued; waiting for it to start", file=sys.stderr)
            elif ev == "end":
                out.flush()
                if offset == 0 and deadline is None and msg.get("state") == "finished":
                    where = msg.get("output")
                    tail = (f"its output is in {where}" if where and not msg.get("output_error")
                            else f"its output was not delivered: {msg['output_error']}" if msg.get("output_error")
                            else "its output was discarded (--no-output)")
                    print(f"{_end_line(msg)}; {tail}", file=sys.stderr)
                else:
                    print(_end_line(msg), file=sys.stderr)
                return 0
        c.close()
        # The daemon went away mid-stream (reload or restart): reconnect and resume.
        print(f"dispatch: hpc-batchd restarted; reconnecting to job {job_id}", file=sys.stderr)
        deadline = time.monotonic() + 30


COMMANDS = {"new": cmd_new, "list": cmd_list, "attach": cmd_attach, "kill": cmd_kill, "job": cmd_job}


def main(argv=None) -> int:
    """Entry point of ``dispatch``."""
    from docopt import DocoptExit, docopt
    args = sys.argv[1:] if argv is None else list(argv)
    verb = args[0] if args and args[0] in COMMANDS else None
    try:
        if verb is None:
            # Only --help / --version get here legitimately; docopt exits for them.
            docopt(USAGE, argv=args, version=f"dispatch {__version__}")
            raise DocoptExit()
        sub = docopt(SUBCOMMANDS[verb], argv=args)
    except DocoptExit as exc:
        from .usage import explain
        if verb is None:
            what = f"unknown command {args[0]!r}" if args and not args[0].startswith("-") else "no command given"
            explain("dispatch", exc, USAGE, what, first=args[0] if args else None)
        else:
            explain(f"dispatch {verb}", exc, SUBCOMMANDS[verb],
                    "missing the command: put it after '--'" if verb == "new" else "missing or invalid arguments",
                    first=verb)
        return EX_USAGE

    from .client import Connection, Unreachable
    try:
        return COMMANDS[verb](Connection, sub)
    except UsageError as exc:
        print(f"dispatch: {exc}", file=sys.stderr)
        return EX_USAGE
    except Unreachable as exc:
        return _die(str(exc), EX_UNAVAILABLE)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (dispatch list | head): stop quietly, like other tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())

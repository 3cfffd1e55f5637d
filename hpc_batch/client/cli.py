"""dispatch: the hpc-batch client.

Every verb sends one request over the daemon's unix socket and prints the
reply; the daemon learns who is asking from the socket itself. Parsing is
docopt (a usage error exits 2 with the usage), and this module imports as
little as it can: it runs on every submit.
"""

import os
import sys

from .. import __version__
from ..core.jobnames import env_word
from ..wire.messages import CLIENT_FAILURES  # (no imports of its own: free for dispatch's start-up)
from .argscan import scan, scan_flags
from .cli_usage import SUBCOMMANDS, USAGE

EX_USAGE = CLIENT_FAILURES["usage"]
EX_UNAVAILABLE = CLIENT_FAILURES["unreachable"]


class UsageError(Exception):
    """A bad flag value: printed with a hint, exit 2."""


class Out:
    """Where a verb's result and refusals go: lines for people, or one JSON document (--json)."""

    def __init__(self, json_doc: bool):
        self.json = json_doc

    def doc(self, obj) -> None:
        import json
        print(json.dumps(obj, indent=1, sort_keys=True))

    def fail(self, msg: str, status: int, code: str | None = None) -> int:
        """A refusal or failure: one line on stderr, or a JSON error document; returns the exit status."""
        if self.json:
            self.doc({"ok": False, "error": msg, "code": code, "exit": status})
        else:
            print(f"dispatch: {msg}", file=sys.stderr)
        return status

    def refused(self, reply: dict, what: str) -> int:
        """The daemon's error reply, with the exit status its code stands for."""
        from ..wire.messages import REFUSALS
        code = str(reply.get("code"))
        return self.fail(reply.get("error") or what, REFUSALS.get(code, 1), code)


def _die(msg: str, status: int = 1) -> int:
    return Out(False).fail(msg, status)


def parse_mem(text: str) -> int:
    """``--max-mem``: GiB by default, or a K/M/G/T suffix; returns bytes."""
    from ..core.sizes import SizeError, parse_size
    try:
        return parse_size(text, "G")
    except SizeError as exc:
        raise UsageError(f"--max-mem {exc}") from None


def _positive(flag: str, text: str, minimum: int) -> int:
    digits = text.strip().removeprefix("-")
    if not (digits.isascii() and digits.isdigit()) or int(text) < minimum:
        raise UsageError(f"{flag} {text!r}: expected a whole number of at least {minimum}")
    return int(text)



def split_env(words):
    """Leading NAME=VALUE words (env(1) style) and the command after them."""
    env = {}
    i = 0
    while i < len(words) and env_word(words[i]):
        name, _, value = words[i].partition("=")
        env[name] = value
        i += 1
    return env, list(words[i:])


def job_ref(text: str):
    """A <job> as typed: an id (digits), a job's --name, or USER:NAME (another user's, for admins)."""
    if text.isascii() and text.isdigit():
        if int(text) == 0:
            raise UsageError(f"job id {text!r}: expected a positive number, as shown by dispatch list")
        return int(text)
    from ..core.jobnames import split_ref
    if split_ref(text) is None:
        from ..core.jobnames import NAME_RULE
        raise UsageError(f"{text!r} is neither a job id nor a job name ({NAME_RULE}; "
                         f"USER:NAME for another user's)")
    return text


def job_refs(words, most: int = 100_000) -> list:
    """<job> words as typed: ids, names, and FIRST-LAST ranges expanded to their ids."""
    from ..core.arrays import is_range, parse_range
    refs: list = []
    for word in words:
        if is_range(word):
            try:
                refs += parse_range(word, most - len(refs))
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        else:
            refs.append(job_ref(word))
    return refs


def _bulk(a) -> dict:
    """The request fields of --array / --commands (empty without them)."""
    if a.get("--commands") is None and a.get("--array") is None:
        return {}
    from ..core import arrays
    from ..wire.framing import MAX_FRAME as BULK_BYTES  # a --commands file: what one request can carry
    if a.get("--commands") is not None and a.get("--array") is not None:
        raise UsageError("give --array or --commands, not both")
    if a.get("--commands") is not None:
        source = a["--commands"]
        try:
            if source == "-":
                text = sys.stdin.buffer.read(BULK_BYTES + 1)
            else:
                with open(source, "rb") as f:
                    text = f.read(BULK_BYTES + 1)
        except OSError as exc:
            raise UsageError(f"--commands {source}: cannot read it ({exc.strerror})") from None
        if len(text) > BULK_BYTES:
            raise UsageError(f"--commands {source}: more than {BULK_BYTES >> 20} MiB; split it into several submits")
        try:
            return {"commands": arrays.parse_commands(text.decode("utf-8", "surrogateescape"), source)}
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if a.get("--array") is not None:
        try:
            indices, cap = arrays.parse_array(a["--array"])
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return {"array": indices, "array_limit": cap}
    return {}


def _bench_args(a) -> dict:
    """The request fields of --benchmark, --whole-l3, --aslr and --thp (only those given)."""
    out: dict = {}
    mode = a.get("--benchmark")
    if mode is not None:
        if mode not in ("warn", "strict"):
            raise UsageError(f"--benchmark={mode}: choose --benchmark (warn) or --benchmark=strict")
        out["benchmark"] = mode
    if a.get("--whole-l3"):
        if mode is None:
            raise UsageError("--whole-l3 goes with --benchmark")
        out["whole_l3"] = True
    for flag, key in (("--aslr", "aslr"), ("--thp", "thp")):
        value = a.get(flag) or "on"
        if value not in ("on", "off"):
            raise UsageError(f"{flag} {value!r}: expected on or off")
        if value != "on":
            out[key] = value
    return out


def _meant_as_mode(word: str, rest: list) -> bool:
    """Whether the word after a bare ``--benchmark`` was meant as its mode, not as the command:
    a ``--`` still follows it, or it is a near miss of warn or strict (``stirct``)."""
    if "--" in rest:
        return True
    return any(_near(word.lower(), mode) for mode in ("warn", "strict"))


def _near(a: str, b: str) -> bool:
    """At most two edits (insert, delete, change, or swap of neighbours) apart."""
    if abs(len(a) - len(b)) > 2:
        return False
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1] <= 2


def _values_given(argv: list) -> None:
    """Refuse an option of ``new`` that takes a value but is followed by ``--`` or nothing:
    docopt would only say the command is missing."""
    from .argscan import options
    takes = {n for o in options(SUBCOMMANDS["new"]) if o.takes_value for n in o.names}
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--" or not word.startswith("-"):
            return
        if word in takes:
            if i + 1 >= len(argv) or argv[i + 1] == "--":
                raise UsageError(f"{word} needs a value, e.g. {word} {_EXAMPLE.get(word, 'VALUE')} "
                                 f"(see dispatch new --help)")
            i += 1
        i += 1


_EXAMPLE = {"--cpu": "4", "--max-mem": "8G", "--max-time": "2h", "--gpu-cores": "1", "--name": "prep",
            "--after": "12", "--after-ok": "12", "--array": "1-10", "--output": "logs/"}


def bare_benchmark(argv: list) -> list:
    """``--benchmark`` written alone (before the command) as ``--benchmark=warn``, and
    ``--benchmark strict`` as ``--benchmark=strict``: docopt knows no option whose value may be
    left out."""
    from .argscan import options
    takes = {n for o in options(SUBCOMMANDS["new"]) if o.takes_value for n in o.names}
    out = list(argv)
    i = 1
    while i < len(out):
        word = out[i]
        if word == "--" or not word.startswith("-"):
            break
        if word == "--benchmark":
            if i + 1 < len(out) and out[i + 1] in ("warn", "strict"):   # --benchmark strict
                out[i:i + 2] = [f"--benchmark={out[i + 1]}"]
            elif i + 1 < len(out) and not out[i + 1].startswith("-") and _meant_as_mode(out[i + 1], out[i + 2:]):
                raise UsageError(f"--benchmark {out[i + 1]!r}: expected warn or strict (a bare --benchmark "
                                 f"is warn; the command goes after '--')")
            else:
                out[i] = "--benchmark=warn"
        elif word in takes:
            i += 1   # its value follows
        i += 1
    return out


def cmd_new(conn, a) -> int:
    out = Out(a["--json"])
    bulk = _bulk(a)
    job_env, argv = split_env(a["<command>"])
    if not argv and "commands" not in bulk:
        raise UsageError("no command given: put it after '--', e.g. dispatch new -- echo hello")
    if a["--output"] not in (None, "./output.<id>.log") and a["--no-output"]:
        raise UsageError("give --output or --no-output, not both")
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
    args.update(bulk)
    if "commands" in bulk:
        del args["argv"]
    if a["--gpu-link"] is not None:
        args["gpu_link"] = a["--gpu-link"]
    args.update(_bench_args(a))
    if a["--name"] is not None:
        from ..core.jobnames import NAME_RULE, valid_name
        if not valid_name(a["--name"]):
            raise UsageError(f"--name {a['--name']!r}: {NAME_RULE}")
        args["name"] = a["--name"]
    if a["--after"] is not None and a["--after-ok"] is not None:
        raise UsageError("give --after or --after-ok, not both")
    deps = a["--after"] if a["--after"] is not None else a["--after-ok"]
    if deps is not None:
        flag = "--after" if a["--after"] is not None else "--after-ok"
        words = [word.strip() for word in deps.split(",")]
        if not all(words):
            raise UsageError(f"{flag} {deps!r}: an empty job between commas; give job ids or names, "
                             f"comma-separated, e.g. {flag} 12,prep")
        args["after"] = [job_ref(word) for word in words]
        args["after_ok"] = a["--after-ok"] is not None
    if a["--max-time"] is not None:
        from ..core.durations import DurationError, parse_duration
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
            return out.fail(str(exc), 1, "refused")
    if a["--record"] is not None:
        from .userio import OutputError, check_destination
        path = os.path.abspath(os.path.expanduser(a["--record"]))
        try:
            args["record_to"], args["record_is_dir"] = check_destination(cwd, path, "--record")
        except OutputError as exc:
            return out.fail(str(exc), 1, "refused")
        if not args["record_is_dir"] and ("commands" in bulk or "array" in bulk):
            raise UsageError(f"--record {a['--record']}: a bulk submit writes one record a job; "
                             f"give a directory (record.<id>.json in it)")
    if a["--record-env"]:
        args["record_env"] = True
    mask = os.umask(0o077)
    os.umask(mask)
    args["umask"] = mask
    if a["--env"]:
        args["env"] = dict(os.environ)
    from ..wire.framing import FrameError
    try:
        reply = conn().call("new", **args)
    except FrameError:
        raise UsageError("the request is larger than the 4 MiB one submit may carry: split the --commands "
                         "file, or drop --env") from None
    if not reply.get("ok"):
        return out.refused(reply, "the daemon refused the job")
    r = reply["result"]
    ids = list(range(r["id"], r.get("last", r["id"]) + 1))
    if not out.json:
        from ..core.sizes import format_mem
        how = "assigned by default" if r.get("mem_assigned") else "requested"
        where = f"output to {r['output']}" if r.get("output") else "output discarded"
        if "count" in r:
            if r.get("output") and r["count"] > 1:
                where = f"output to {os.path.join(os.path.dirname(r['output']), 'output.<id>.log')}" \
                    if r["output"].endswith(f"output.{r['id']}.log") else where
            cap = f", at most {r['limit']} at once" if r.get("limit") else ""
            waiting = "waiting" if r.get("after") else "queued"
            print(f"jobs {r['id']}-{r['last']}: {r['count']} submitted, {r['starting']} starting now, "
                  f"{r['count'] - r['starting']} {waiting}{cap}; memory budget {format_mem(r['mem'])} each ({how}); "
                  f"{where}", flush=True)
        else:
            print(f"job {r['id']} {r['state']}; memory budget {format_mem(r['mem'])} ({how}); {where}", flush=True)
    if out.json and "count" in r:
        r = dict(r, ids=ids)
    if not a["--wait"]:
        if out.json:
            out.doc(r)
        return 0
    return _wait(conn, ids, out, submitted=r)


def cmd_list(conn, a) -> int:
    out = Out(a["--json"])
    wanted = set(job_refs(a["<job>"])) if a["<job>"] else None
    # The text form of the whole list: the daemon writes the rows of jobs that never started.
    text = {"text": True} if not out.json and wanted is None else {}
    # The daemon answers in pages (a bounded reply each): ask on one connection until the last.
    c = conn()
    jobs: list = []
    rows = False
    cursor: int | None = 0
    while cursor is not None:
        reply = c.call("list", all=a["--all"], finished=a["--finished"], after=cursor, **text)
        if not reply.get("ok"):
            return out.refused(reply, "list failed")
        rows = "rows" in reply["result"]   # a daemon before the text form answers jobs
        page = reply["result"]["rows" if rows else "jobs"]
        if wanted is not None:
            page = [j for j in page if j.get("id") in wanted or (j.get("name") and j["name"] in wanted)]
        jobs += page
        more = reply["result"].get("more")
        cursor = more if isinstance(more, int) and more > cursor else None   # a daemon before paging: one reply
    c.close()
    if out.json:
        out.doc({"jobs": jobs})
        return 0
    import time
    now = time.time()
    if rows:   # in id order already, page after page
        from ..core.listrows import format_row
        lines = [r if isinstance(r, str) else format_row(r, now, a["--finished"]) for r in jobs]
    else:
        from .listing import format_rows
        lines = format_rows(jobs, now, a["--finished"])
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    return 0


def cmd_kill(conn, a) -> int:
    from ..core.arrays import is_range
    refs = job_refs(a["<job>"])
    ranged = len(refs) > 1 or any(is_range(w) for w in a["<job>"])
    if not ranged:
        reply = conn().call("kill", id=refs[0])
        if not reply.get("ok"):
            return Out(False).refused(reply, "kill failed")
        r = reply["result"]
        print(f"job {r['id']} is being killed" if r.get("was") == "running"
              else f"job {r['id']} cancelled (removed from the queue before it started)")
        return 0
    # Several: one connection, a request each; an already-ended job in a range is no failure.
    from ..core.arrays import format_ids
    c = conn()
    done: dict[str, list] = {"killed": [], "cancelled": [], "ended": []}
    status = 0
    for ref in refs:
        reply = c.call("kill", id=ref)
        if reply.get("ok"):
            r = reply["result"]
            done["killed" if r.get("was") == "running" else "cancelled"].append(r["id"])
        elif reply.get("code") == "finished":
            done["ended"].append(ref)
        else:
            status = status or Out(False).refused(reply, f"kill {ref} failed")
    c.close()
    parts = [f"{len(v)} {k if k != 'ended' else 'had already ended'} ({format_ids(v)})" for k, v in done.items() if v]
    print(f"jobs {format_ids(refs)}: {'; '.join(parts) or 'nothing to do'}")
    return status


def cmd_show(conn, a) -> int:
    out = Out(a["--json"])
    if a["--record"]:
        reply = conn().call("record", id=job_ref(a["<job>"]))
        if not reply.get("ok"):
            return out.refused(reply, "show --record failed")
        if out.json:
            out.doc(reply["result"]["record"])
        else:
            from .recorddiff import render
            print(render(reply["result"]["record"]))
        return 0
    reply = conn().call("show", id=job_ref(a["<job>"]))
    if not reply.get("ok"):
        return out.refused(reply, "show failed")
    if out.json:
        out.doc(reply["result"]["job"])
    else:
        from .listing import format_show
        for line in format_show(reply["result"]["job"], reply["result"]["now"]):
            print(line)
    return 0


def cmd_record(conn, a) -> int:
    """``dispatch record diff A B``: exit 0 when the two setups match, 1 when they differ."""
    out = Out(a["--json"])
    loaded = []
    for word in (a["<a>"], a["<b>"]):
        got = _load_record(conn, word)
        if isinstance(got, dict) and "record" in got:
            loaded.append(got["record"])
        else:
            return out.refused(got, f"cannot read the record {word!r}")
    from .recorddiff import comparable, diff_json, differences, format_diff
    diffs = differences(loaded[0], loaded[1])
    if out.json:
        out.doc(diff_json(diffs, a["<a>"], a["<b>"]))
    else:
        print(format_diff(diffs, a["<a>"], a["<b>"]))
    return 0 if comparable(diffs) else 1


def _load_record(conn, word: str) -> dict:
    """A record from a file (read as the user) when *word* is a path, else from the daemon: a reply.

    A path has a ``/`` or ends in ``.json``; any other word is a job (an id or a name), whatever
    the current directory holds: a file another user planted there is never read for a job
    (``./5`` names the file)."""
    if "/" in word or word.endswith(".json"):
        from .userio import read_user_json
        try:
            data = read_user_json(word, 1 << 20)
        except (OSError, ValueError) as exc:
            return {"ok": False, "error": f"cannot read the record file {word}: {exc}", "code": "refused"}
        if not isinstance(data, dict) or "schema" not in data:
            return {"ok": False, "error": f"{word} is not a record (no \"schema\" key)", "code": "refused"}
        return {"record": data}
    reply = conn().call("record", id=job_ref(word))
    return reply["result"] if reply.get("ok") else reply


def cmd_status(conn, a) -> int:
    out = Out(a["--json"])
    reply = conn().call("status")
    if not reply.get("ok"):
        return out.refused(reply, "status failed")
    if out.json:
        out.doc(reply["result"])
    else:
        from .listing import format_status
        for line in format_status(reply["result"]):
            print(line)
    return 0


def cmd_wait(conn, a) -> int:
    return _wait(conn, job_refs(a["<job>"]), Out(a["--json"]))


def _wait(conn, refs: list, out: Out, submitted: dict | None = None) -> int:
    """Block until the jobs end (woken by the daemon, not a poll); reconnect across a reload or restart."""
    import time

    from .connection import Unreachable
    deadline = None
    jobs: list = []
    asked: list = refs
    left: list | None = None   # once all have ended: the ids of those whose entries are still to come
    while True:
        try:
            c = _connect(conn, deadline)
        except Unreachable as exc:
            return out.fail(str(exc) if deadline is None else
                            "hpc-batchd restarted and is not back; the jobs may still be running: "
                            "run dispatch wait again later", EX_UNAVAILABLE)
        try:
            c.send("wait", ids=asked, paged=True, rest=left is not None)
            msg = c.receive()
        except OSError:
            msg = None
        c.close()
        if msg is None:   # the daemon went away (reload or restart): ask again
            if not out.json and left is None:
                print("dispatch: hpc-batchd restarted; waiting again", file=sys.stderr)
            deadline = time.monotonic() + 30
            continue
        if not msg.get("ok"):
            return out.refused(msg, "wait failed")
        result = msg["result"]
        if left is None:   # the first answer: every job has ended; the rest come a page at a time
            jobs += result["jobs"]
            left = list(result.get("more") or ())
        else:
            from ..core.waitpages import take
            got, again = take(asked, result["jobs"])
            if not got:   # every page holds a job: one without any would be asked for again without end
                return out.refused({"error": "hpc-batchd answered a page of the wait with none of its jobs",
                                    "code": "internal"}, "wait failed")
            jobs += got
            left[:0] = again
        if not left:
            break
        from ..wire.protocol import WAIT_PAGE_JOBS
        asked, left = left[:WAIT_PAGE_JOBS], left[WAIT_PAGE_JOBS:]
    status = next((j["wait_status"] for j in jobs if j["wait_status"] != 0), 0)
    if out.json:
        out.doc({"jobs": jobs, "exit": status} if submitted is None
                else dict(submitted, wait={"jobs": jobs, "exit": status}))
    else:
        for j in jobs:
            print(_end_line(j))
    return status


def cmd_job(conn, a) -> int:
    from ..core.durations import DurationError, format_duration, parse_duration
    ref = job_ref(a["<job>"])
    action = "set" if a["set"] else "add" if a["add"] else "get"
    args = {"id": ref, "setting": "max_time", "action": action}
    if action != "get":
        try:
            args["seconds"] = parse_duration(a["<duration>"])
        except DurationError as exc:
            raise UsageError(f"max-time {action}: {exc}") from None
    reply = conn().call("job", **args)
    if not reply.get("ok"):
        return Out(False).refused(reply, "the daemon refused")
    r = reply["result"]
    line = f"job {r['id']} max-time {format_duration(r['max_time'])}"
    if r.get("deadline") and r.get("state") == "running":
        import time
        line += f" (ends by {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r['deadline']))})"
    print(line)
    return 0


def _connect(conn, deadline: float | None):
    """A connection; once the daemon has gone away mid-call (*deadline* set), keep trying until then.

    Raises Unreachable when the daemon cannot be reached (at once the first time).
    """
    import time

    from .connection import Unreachable
    while True:
        try:
            return conn()
        except Unreachable:
            if deadline is None or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _end_line(ev: dict) -> str:
    line = f"job {ev.get('id')} {ev.get('state')}: exit {ev.get('exit')}"
    if ev.get("note"):
        line += f" ({ev['note']})"
    return line


def cmd_attach(conn, a) -> int:
    import time

    from .connection import Unreachable
    job_id = job_ref(a["<job>"])
    offset, out = 0, sys.stdout.buffer
    deadline = None
    while True:
        try:
            c = _connect(conn, deadline)
        except Unreachable as exc:
            return _die(f"{exc}" if deadline is None else
                        f"hpc-batchd restarted and is not back; job {job_id} may still be running: "
                        f"run dispatch attach {job_id} again later", EX_UNAVAILABLE)
        c.send("attach", id=job_id, offset=offset)
        while True:
            msg = c.receive()
            if msg is None:
                break
            if not msg.get("ok"):
                return Out(False).refused(msg, "attach failed")
            ev = msg.get("event")
            if ev == "output":
                data = msg["data"].encode("utf-8", "surrogateescape")
                out.write(data)
                out.flush()
                offset = msg.get("offset", offset + len(data))
            elif ev == "attached" and msg.get("state") in ("queued", "waiting") and offset == 0:
                print(f"job {job_id} is {msg['state']}; waiting for it to start", file=sys.stderr)
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


def cmd_history(conn, a) -> int:
    from .history import cmd_history as history
    return history(conn, a, Out(a["--json"]))


def cmd_report(conn, a) -> int:
    from .history import cmd_report as report
    return report(conn, a, Out(a["--json"]))


COMMANDS = {"new": cmd_new, "list": cmd_list, "attach": cmd_attach, "kill": cmd_kill, "wait": cmd_wait,
            "show": cmd_show, "record": cmd_record, "status": cmd_status, "job": cmd_job,
            "history": cmd_history, "report": cmd_report}


def main(argv=None) -> int:
    """Entry point of ``dispatch``."""
    args = sys.argv[1:] if argv is None else list(argv)
    verb = args[0] if args and args[0] in COMMANDS else None
    if verb == "new":
        try:
            if "--benchmark" in args:
                args = bare_benchmark(args)
            _values_given(args)
        except UsageError as exc:
            return Out("--json" in args).fail(str(exc), EX_USAGE, "usage")
    sub = (scan(args, "new", SUBCOMMANDS["new"]) if verb == "new" else
           scan_flags(args, "list", SUBCOMMANDS["list"], "<job>") if verb == "list" else None)
    return run(verb, sub or _docopt(args, verb))


def leave(code) -> None:
    """Exit with *code* (main's) at once, once stdout and stderr are flushed.

    What the interpreter does at a normal exit, freeing every module, is
    about a tenth of a short command's run, and dispatch keeps nothing that
    needs it: no atexit hook, no file of its own left to close. A flush that
    fails (a closed pipe) takes the normal exit, which reports it.
    """
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        sys.exit(code)
    if not isinstance(code, int) or isinstance(code, bool):
        sys.exit(code)
    os._exit(code & 0xFF)


def _docopt(args: list, verb: str | None):
    """docopt's parse of *args*, or the exit status of the usage error it printed."""
    from docopt import DocoptExit, docopt
    try:
        if verb is None:
            # Only --help / --version get here legitimately; docopt exits for them.
            docopt(USAGE, argv=args, version=f"dispatch {__version__}")
            raise DocoptExit()
        sub = docopt(SUBCOMMANDS[verb], argv=args)
    except DocoptExit as exc:
        from ..usage import explain
        if verb is None:
            what = f"unknown command {args[0]!r}" if args and not args[0].startswith("-") else "no command given"
            explain("dispatch", exc, USAGE, what, first=args[0] if args else None)
        else:
            explain(f"dispatch {verb}", exc, SUBCOMMANDS[verb],
                    "missing the command: put it after '--'" if verb == "new" else "missing or invalid arguments",
                    first=verb)
        return EX_USAGE
    return sub


def run(verb, sub) -> int:
    """Carry out a parsed command line (*sub* is an exit status when parsing failed)."""
    if isinstance(sub, int):
        return sub
    from .connection import Connection, Unreachable
    out = Out(bool(sub.get("--json")))
    try:
        return COMMANDS[verb](Connection, sub)
    except UsageError as exc:
        return out.fail(str(exc), EX_USAGE, "usage")
    except Unreachable as exc:
        return out.fail(str(exc), EX_UNAVAILABLE, "unreachable")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (dispatch list | head): stop quietly, like other tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())

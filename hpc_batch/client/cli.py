"""dispatch: the hpc-batch client.

Every verb sends one request over the daemon's unix socket and prints the
reply; the daemon learns who is asking from the socket itself. Parsing is
docopt (a usage error exits 2 with the usage), and this module imports as
little as it can: it runs on every submit.
"""

import sys

from .. import __version__
from ..bounds import MAX_CPUS, MAX_GPUS, shown
from ..core.jobnames import env_word
from ..wire.messages import CLIENT_FAILURES, REFUSALS  # (no imports of its own: free for dispatch's start-up)
from .argscan import scan, scan_flags
from .cli_usage import SUBCOMMANDS, USAGE
from .posixcalls import environ, exit_now, getcwd, getenv, getuid, umask

EX_USAGE = CLIENT_FAILURES["usage"]
EX_UNAVAILABLE = CLIENT_FAILURES["unreachable"]
EX_NO_INPUT = CLIENT_FAILURES["no_input"]


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
    """``--max-mem``: GiB by default, or a K/M/G/T suffix; returns bytes, at least MIN_JOB_MEM."""
    from ..bounds import MIN_JOB_MEM, shown
    from ..core.sizes import SizeError, format_size, parse_size
    try:
        value = parse_size(text, "G")
    except SizeError as exc:
        raise UsageError(f"--max-mem {exc}") from None
    if value < MIN_JOB_MEM:
        raise UsageError(f"--max-mem {shown(text)}: less than the {format_size(MIN_JOB_MEM)} a job needs "
                         f"to start; give at least {format_size(MIN_JOB_MEM)}")
    return value


def _positive(flag: str, text: str, minimum: int, maximum: int) -> int:
    from ..bounds import shown
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or len(digits) > len(str(maximum)) \
            or not minimum <= int(digits) <= maximum:
        raise UsageError(f"{flag} {shown(text)}: expected a whole number from {minimum} to {maximum}")
    return int(digits)



def split_env(words):
    """Leading NAME=VALUE words (env(1) style) and the command after them."""
    env = {}
    i = 0
    while i < len(words) and env_word(words[i]):
        name, _, value = words[i].partition("=")
        env[name] = value
        i += 1
    return env, list(words[i:])


def job_ref(text: str, whole: bool = False):
    """A <job> as typed: an id (digits), a job's --name, USER:NAME (another user's, for admins), or
    an array element, ``6_3``; with *whole*, a whole array too, ``6_*`` (arrayref.py)."""
    from ..bounds import MAX_ID, shown
    from ..core import arrayref
    try:
        aref = arrayref.parse(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if aref is not None:
        if aref.index is None and not whole:
            raise UsageError(f"{shown(text)} names a whole array; this takes one job: an id, a name, "
                             f"or one element, e.g. {arrayref.element_name(aref.first, 1)}")
        return str(aref)
    number = text.strip().removeprefix("-").removeprefix("+")
    if number.isascii() and number.isdigit():
        # -1 and 0 are no ids (nor names: a name is never a number), whatever a job is named
        if number != text or not number.strip("0"):
            raise UsageError(f"job id {shown(text)}: job ids are whole numbers from 1, as dispatch list shows them")
        if len(number) > len(str(MAX_ID)) or int(number) > MAX_ID:
            raise UsageError(f"job id {shown(text)}: no job has an id that large (they go up to {MAX_ID})")
        return int(text)
    from ..core.jobnames import split_ref
    if split_ref(text) is None:
        from ..core.jobnames import NAME_RULE
        raise UsageError(f"{shown(text)} is neither a job id nor a job name ({NAME_RULE}; "
                         f"USER:NAME for another user's)")
    return text


def job_refs(words, most: int = 100_000) -> list:
    """<job> words as typed: ids, names, array elements and whole arrays (``6_*``, left for
    ``array_ids`` to expand), and FIRST-LAST ranges expanded to their ids."""
    from ..core.arrays import is_range, parse_range
    refs: list = []
    for word in words:
        if is_range(word):
            try:
                refs += parse_range(word, most - len(refs))
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        else:
            refs.append(job_ref(word, whole=True))
    return refs


def array_ids(c, refs: list, held: bool) -> "tuple[list, dict | None]":
    """*refs* with each whole array (``6_*``) replaced by its ids, asked of the daemon on the
    connection *c*: those it still holds (*held*: what kill can act on), or all from first to
    last (what wait reports on: an ended one forgotten is answered from the history). The
    second value is the daemon's refusal of one, or None."""
    from ..core import arrayref
    out: list = []
    for ref in refs:
        aref = arrayref.parse(ref) if isinstance(ref, str) else None
        if aref is None or aref.index is not None:
            out.append(ref)
            continue
        reply = c.call("show", id=ref)
        if not reply.get("ok"):
            return out, reply
        doc = reply["result"]["array"]
        out += doc["ids"] if held else list(range(doc["first"], doc["last"] + 1))
    return out, None


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
        value = "on" if a.get(flag) is None else a[flag]
        if value not in ("on", "off"):
            raise UsageError(f"{flag} {shown(value)}: expected on or off")
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


def bare_benchmark(argv: list) -> list:
    """``--benchmark`` written alone (before the command) as ``--benchmark=warn``, and
    ``--benchmark strict`` as ``--benchmark=strict``: docopt knows no option whose value may be
    left out."""
    from .argscan import options
    takes = {n for o in options(SUBCOMMANDS["new"]) if o.takes_value for n in o.names}
    every = {n for o in options(SUBCOMMANDS["new"]) for n in o.names}
    out = list(argv)
    i = 1
    while i < len(out):
        word = out[i]
        if word == "--" or not word.startswith("-"):
            break
        if word == "--benchmark":
            if i + 1 < len(out) and out[i + 1] in ("warn", "strict"):   # --benchmark strict
                out[i:i + 2] = [f"--benchmark={out[i + 1]}"]
            elif i + 1 < len(out) and out[i + 1] != "--" and out[i + 1].partition("=")[0] not in every \
                    and (out[i + 1].startswith("-") or _meant_as_mode(out[i + 1], out[i + 2:])):
                raise UsageError(f"--benchmark {shown(out[i + 1])}: expected warn or strict (a bare --benchmark "
                                 f"is warn; the command goes after '--')")
            else:
                out[i] = "--benchmark=warn"
        elif word in takes:
            i += 1   # its value follows
        i += 1
    return out


def _notify_args(forms: str | None, command: str | None) -> dict:
    """The request fields of --notify and --notify-command (shepherd/base/notifytext.py checks them)."""
    from shepherd.base.notifytext import check_command, parse_forms
    try:
        if command is not None:
            check_command(command)
        return {"notify": parse_forms(forms, command is not None), "notify_command": command}
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _checked_words(a) -> dict:
    """The request fields of new's flags whose words dispatch checks itself (each refusal names
    its flag): --gpu-link, --name, --after/--after-ok, --max-time; and an empty --output/--record."""
    for flag in ("--output", "--record"):
        if a[flag] is not None and not a[flag].strip():
            raise UsageError(f"{flag} {a[flag]!r}: give a directory or a file name")
    fields: dict = {}
    if a["--gpu-link"] is not None:
        from ..core.gputopo import TopoError, parse_link_class
        try:
            parse_link_class(a["--gpu-link"])
        except TopoError as exc:
            raise UsageError(f"--gpu-link: {exc}") from None
        fields["gpu_link"] = a["--gpu-link"]
    if a["--name"] is not None:
        from ..core.jobnames import NAME_RULE, valid_name
        if not valid_name(a["--name"]):
            raise UsageError(f"--name {shown(a['--name'])}: {NAME_RULE}")
        fields["name"] = a["--name"]
    if a["--after"] is not None and a["--after-ok"] is not None:
        raise UsageError("give --after or --after-ok, not both")
    deps = a["--after"] if a["--after"] is not None else a["--after-ok"]
    if deps is not None:
        flag = "--after" if a["--after"] is not None else "--after-ok"
        words = [word.strip() for word in deps.split(",")]
        if not all(words):
            raise UsageError(f"{flag} {deps!r}: an empty job between commas; give job ids or names, "
                             f"comma-separated, e.g. {flag} 12,prep")
        try:
            fields["after"] = [job_ref(word) for word in words]
        except UsageError as exc:
            raise UsageError(f"{flag}: {exc}") from None
        fields["after_ok"] = a["--after-ok"] is not None
    if a["--max-time"] is not None:
        from ..core.durations import DurationError, parse_duration
        try:
            fields["max_time"] = parse_duration(a["--max-time"])
        except DurationError as exc:
            raise UsageError(f"--max-time: {exc}") from None
    return fields


def _printing_new() -> None:
    """What printing a submit's reply imports, while the daemon commits the submit."""
    from ..core import arrays  # noqa: F401
    from . import submitted  # noqa: F401


def cmd_new(conn, a) -> int:
    out = Out(a["--json"])
    bulk = _bulk(a)
    job_env, argv = split_env(a["<command>"])
    if not argv and "commands" not in bulk:
        raise UsageError("no command given: put it after '--', e.g. dispatch new -- echo hello")
    if a["--parsable"] and out.json:
        raise UsageError("give --parsable (the id alone) or --json (the whole reply), not both")
    if a["--output"] not in (None, "./output.<id>.log") and a["--no-output"]:
        raise UsageError("give --output or --no-output, not both")
    try:
        cwd = getcwd()
    except OSError as exc:
        raise UsageError(f"cannot submit from this directory ({exc.strerror}): cd somewhere that exists") from None
    args = {"argv": argv, "cwd": cwd, "job_env": job_env,
            "cpus": None if a["--cpu"] is None else _positive("--cpu", a["--cpu"], 1, MAX_CPUS),
            "gpus": _positive("--gpu-cores", a["--gpu-cores"], 0, MAX_GPUS),
            "mem": None if a["--max-mem"] is None else parse_mem(a["--max-mem"]),
            "exclusive": a["--exclusive"], "numa_local": a["--numa-local"] or a["--numa-local-mem"],
            "numa_local_gpu": a["--numa-local-gpu"] or (a["--numa-local"] and a["--gpu-cores"] not in ("0", None)),
            "no_output": a["--no-output"],
            "base_env": {k: v for k in ("PATH", "LANG") if (v := getenv(k)) is not None}}
    args.update(bulk)
    if "commands" in bulk:
        del args["argv"]
    args.update(_checked_words(a))
    args.update(_bench_args(a))
    if a["--notify"] is not None or a["--notify-command"] is not None:
        args.update(_notify_args(a["--notify"], a["--notify-command"]))
    if a["--output"] and a["--output"] != "./output.<id>.log":
        import os
        args["output"] = os.path.abspath(os.path.expanduser(a["--output"]))
    if not a["--no-output"]:
        from .userio import OutputError, check_destination
        try:
            _, args["output_is_dir"] = check_destination(cwd, args.get("output"))
        except OutputError as exc:
            return out.fail(str(exc), 1, "refused")
    if a["--record"] is not None:
        import os

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
    mask = umask(0o077)
    umask(mask)
    args["umask"] = mask
    if a["--env"]:
        args["env"] = environ()
    from ..wire.framing import FrameError
    try:
        reply = conn().call("new", meanwhile=_printing_new, **args)
    except FrameError:
        raise UsageError("the request is larger than the 4 MiB one submit may carry: split the --commands "
                         "file, or drop --env") from None
    if not reply.get("ok"):
        return out.refused(reply, "the daemon refused the job")
    r = reply["result"]
    ids = list(range(r["id"], r.get("last", r["id"]) + 1))
    if a["--parsable"]:   # the id alone, as sbatch --parsable prints it; a bulk's as list and kill take it
        from ..core.arrays import format_ids
        print(format_ids(ids), flush=True)
    elif not out.json:
        from .submitted import memory_words
        where = f"output to {r['output']}" if r.get("output") else "output discarded"
        if "count" in r:
            if r.get("output") and r["count"] > 1:
                import os
                where = f"output to {os.path.join(os.path.dirname(r['output']), 'output.<id>.log')}" \
                    if r["output"].endswith(f"output.{r['id']}.log") else where
            cap = f", at most {r['limit']} at once" if r.get("limit") else ""
            waiting = "waiting" if r.get("after") else "queued"
            print(f"jobs {r['id']}-{r['last']}: {r['count']} submitted, {r['starting']} starting now, "
                  f"{r['count'] - r['starting']} {waiting}{cap}; {memory_words(r, each=True)}; "
                  f"{where}", flush=True)
        else:
            print(f"job {r['id']} {r['state']}; {memory_words(r)}; {where}", flush=True)
    if out.json and "count" in r:
        r = dict(r, ids=ids)
    if not a["--wait"]:
        if out.json:
            out.doc(r)
        return 0
    return _wait(conn, ids, out, submitted=r, quiet=a["--parsable"])


def _list_columns(a, out: Out) -> list | None:
    """The columns of ``dispatch list``'s table, or None for the plain rows (a pipe's, the spec's)."""
    if a["--format"] is None and not a["--no-header"] and (out.json or not sys.stdout.isatty()):
        return None
    if out.json:
        raise UsageError("--format and --no-header shape the table; --json prints every field: drop one")
    from .listtable import FormatError, default_columns, parse_format
    if a["--format"] is None:
        return default_columns(a["--all"], a["--finished"])
    try:
        return parse_format(a["--format"])
    except FormatError as exc:
        raise UsageError(str(exc)) from None


def cmd_list(conn, a) -> int:
    out = Out(a["--json"])
    columns = _list_columns(a, out)
    wanted = set(job_refs(a["<job>"])) if a["<job>"] else None
    # The text form of the whole list: the daemon writes the rows of jobs that never started.
    text = {"text": True} if columns is None and not out.json and wanted is None else {}
    if columns is not None:   # the table's: each job as a short list of values, not its summary
        text = {"table": True}
        from .listtable import job_of, job_of_summary
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
        if columns is not None:
            page = [job_of(j) if rows else job_of_summary(j) for j in page]
        if wanted is not None:
            from .listnamed import array_words
            page = [j for j in page if j.get("id") in wanted or (j.get("name") and (
                j["name"] in wanted or f"{j.get('user')}:{j['name']}" in wanted))
                or not wanted.isdisjoint(array_words(j))]
        jobs += page
        more = reply["result"].get("more")
        cursor = more if isinstance(more, int) and more > cursor else None   # a daemon before paging: one reply
    unlisted = _unlisted(c, a, jobs) if wanted is not None else []
    c.close()
    if columns is not None and a["--format"] is None and any(j.get("array") for j in jobs):
        from .listtable import default_columns
        columns = default_columns(a["--all"], a["--finished"], arrays=True)
    if out.json:
        out.doc({"jobs": jobs, "errors": [u.doc() for u in unlisted]} if unlisted else {"jobs": jobs})
        return unlisted[0].status if unlisted else 0
    import time
    now = time.time()
    if columns is not None:
        from .listtable import render
        width = None
        if sys.stdout.isatty():   # cut to the terminal; a pipe gets every cell whole
            import shutil
            width = shutil.get_terminal_size().columns
        lines = render(sorted(jobs, key=lambda j: j["id"]), columns, now, width, header=not a["--no-header"])
    elif rows:   # in id order already, page after page
        from ..core.listrows import format_row
        lines = [r if isinstance(r, str) else format_row(r, now, a["--finished"]) for r in jobs]
    else:
        from .listing import format_rows
        lines = format_rows(jobs, now, a["--finished"])
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    for u in unlisted:
        print(f"dispatch: {u.message}", file=sys.stderr)
    return unlisted[0].status if unlisted else 0


def _unlisted(c, a, jobs: list) -> list:
    """The jobs named on the command line that the listing lacks, each with why (listnamed)."""
    from ..core.arrays import is_range
    from .listnamed import explain, unmatched
    named = [(word, job_refs([word]) if is_range(word) else job_ref(word, whole=True)) for word in a["<job>"]]
    return explain(c.call, unmatched(named, jobs), a["--finished"], a["--all"], getuid())


def cmd_kill(conn, a) -> int:
    from ..core.arrays import is_range
    refs = job_refs(a["<job>"])
    whole = [r for r in refs if isinstance(r, str) and r.endswith("_*")]
    ranged = len(refs) > 1 or bool(whole) or any(is_range(w) for w in a["<job>"])
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
    refs, refused = array_ids(c, refs, held=True)
    if refused is not None:
        c.close()
        return Out(False).refused(refused, "kill failed")
    if whole:   # last first: a queued element is cancelled before a kill's freed room could start it
        refs.reverse()
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
    def ids(v: list) -> str:   # (ids and names apart: sorted() cannot compare the two)
        return format_ids(sorted(v, key=lambda x: (isinstance(x, str), x)))
    parts = [f"{len(v)} {k if k != 'ended' else 'had already ended'} ({ids(v)})" for k, v in done.items() if v]
    label = " ".join(a["<job>"]) if whole else f"jobs {format_ids(refs)}"
    print(f"{label}: {'; '.join(parts) or 'nothing to do'}")
    return status


def cmd_show(conn, a) -> int:
    out = Out(a["--json"])
    ref = job_ref(a["<job>"], whole=not a["--record"])   # (before connecting: a bad one never reaches the daemon)
    if isinstance(ref, str) and ref.endswith("_*"):
        return _show_array(conn, ref, out)
    if a["--record"]:
        reply = conn().call("record", id=ref)
        if not reply.get("ok"):
            return out.refused(reply, "show --record failed")
        if out.json:
            out.doc(reply["result"]["record"])
        else:
            from .recorddiff import render
            print(render(reply["result"]["record"]))
        return 0
    reply = conn().call("show", id=ref)
    if not reply.get("ok"):
        return out.refused(reply, "show failed")
    if out.json:
        out.doc(reply["result"]["job"])
    else:
        from .listing import format_show
        for line in format_show(reply["result"]["job"], reply["result"]["now"]):
            print(line)
    return 0


def _show_array(conn, ref: str, out: Out) -> int:
    """``dispatch show 6_*``: the array as a whole (its elements: ``list 6_*``)."""
    reply = conn().call("show", id=ref)
    if not reply.get("ok"):
        return out.refused(reply, "show failed")
    if out.json:
        out.doc(reply["result"]["array"])
    else:
        from .listing import format_array
        for line in format_array(reply["result"]["array"]):
            print(line)
    return 0


def cmd_record(conn, a) -> int:
    """``dispatch record diff A B``: exit 0 when the two setups match, 1 when they differ, and
    another status when a record cannot be had (EX_NO_INPUT, or the daemon's refusal's)."""
    out = Out(a["--json"])
    # Each word's job reference is checked before anything is read or asked.
    sources = [(word, None if _is_record_file(word) else job_ref(word)) for word in (a["<a>"], a["<b>"])]
    loaded = []
    for word, ref in sources:
        got = _read_record_file(word) if ref is None else _ask_record(conn, ref)
        if "record" not in got:
            # The daemon's plain refusal (a job with no record) would read as 1, "they differ".
            code = "no_input" if got.get("code") in ("refused", None) else str(got["code"])
            status = EX_NO_INPUT if code == "no_input" else REFUSALS.get(code, EX_NO_INPUT)
            return out.fail(got.get("error") or f"cannot read the record {word!r}", status, code)
        loaded.append(got["record"])
    from .recorddiff import comparable, diff_json, differences, format_diff
    diffs = differences(loaded[0], loaded[1])
    if out.json:
        out.doc(diff_json(diffs, a["<a>"], a["<b>"]))
    else:
        print(format_diff(diffs, a["<a>"], a["<b>"]))
    return 0 if comparable(diffs) else 1


def _is_record_file(word: str) -> bool:
    """A path has a ``/`` or ends in ``.json``; any other word is a job (an id or a name), whatever
    the current directory holds: a file another user planted there is never read for a job
    (``./5`` names the file)."""
    return "/" in word or word.endswith(".json")


def _read_record_file(path: str) -> dict:
    """``{"record": ...}`` from the user's file (read as the user), or an error reply saying why not."""
    from .userio import read_user_json
    try:
        data = read_user_json(path, 1 << 20)
    except OSError as exc:
        return {"error": f"cannot read the record file {path}: {exc.strerror or exc}"}
    except ValueError as exc:
        return {"error": f"cannot read the record file {path}: not a record ({exc})"}
    if not isinstance(data, dict) or "schema" not in data:
        return {"error": f"{path} is not a record (no \"schema\" key): give a file written by "
                         f"dispatch new --record, or saved from dispatch show --record --json"}
    return {"record": data}


def _ask_record(conn, ref) -> dict:
    """``{"record": ...}`` of job *ref* from the daemon, or its refusal."""
    reply = conn().call("record", id=ref)
    return reply["result"] if reply.get("ok") else reply


def cmd_status(conn, a) -> int:
    out = Out(a["--json"])
    from . import statusscreen
    if a.get("--watch"):
        try:
            seconds = statusscreen.check_watch(a.get("--interval"))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return statusscreen.watch(conn, seconds)
    reply = conn().call("status")
    if not reply.get("ok"):
        return out.refused(reply, "status failed")
    if out.json:
        out.doc(reply["result"])
    else:
        statusscreen.show(reply["result"], bool(a.get("--map")))
    return 0


def cmd_wait(conn, a) -> int:
    out = Out(a["--json"])
    refs = job_refs(a["<job>"])
    if any(isinstance(r, str) and r.endswith("_*") for r in refs):
        c = conn()
        refs, refused = array_ids(c, refs, held=False)
        c.close()
        if refused is not None:
            return out.refused(refused, "wait failed")
    return _wait(conn, refs, out)


def _wait(conn, refs: list, out: Out, submitted: dict | None = None, quiet: bool = False) -> int:
    """Block until the jobs end (woken by the daemon, not a poll); reconnect across a reload or restart.
    *quiet*: only the exit status says how they ended (new --parsable --wait)."""
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
    elif not quiet:
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
    from .joblog import follow
    end = follow(conn, job_ref(a["<job>"]), read_delivered=True)
    return end if isinstance(end, int) else 0


def cmd_log(conn, a) -> int:
    from .joblog import cmd_log as log
    return log(conn, a)


def cmd_history(conn, a) -> int:
    from .history import cmd_history as history
    return history(conn, a, Out(a["--json"]))


def cmd_report(conn, a) -> int:
    from .history import cmd_report as report
    return report(conn, a, Out(a["--json"]))


COMMANDS = {"new": cmd_new, "list": cmd_list, "attach": cmd_attach, "log": cmd_log, "kill": cmd_kill,
            "wait": cmd_wait,
            "show": cmd_show, "record": cmd_record, "status": cmd_status, "job": cmd_job,
            "history": cmd_history, "report": cmd_report}


def main(argv=None) -> int:
    """Entry point of ``dispatch``."""
    args = sys.argv[1:] if argv is None else list(argv)
    verb = args[0] if args and args[0] in COMMANDS else None
    from .argcheck import BadArgs, check
    try:
        check(args, SUBCOMMANDS)
    except BadArgs as exc:
        return Out("--json" in args).fail(str(exc), EX_USAGE, "usage")
    if verb == "new":
        try:
            if "--benchmark" in args:
                args = bare_benchmark(args)
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
    exit_now(code & 0xFF)


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
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())

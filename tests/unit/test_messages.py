"""protocol.parse_request: every verb, every field's bounds and types (a table per verb).

Also that the three sides of a verb agree: the CLI's commands, the
protocol's request types and the daemon's handlers.
"""

import pytest

from hpc_batch import bounds
from hpc_batch.client import cli
from hpc_batch.daemon.handlers import HANDLERS
from hpc_batch.daemon.streams import STREAMING
from hpc_batch.wire import protocol

NEW = {"argv": ["true"], "cwd": "/tmp"}


def req(op, **args):
    return {"v": 1, "op": op, "args": args}


def parse(op, **args):
    return protocol.parse_request(req(op, **args))


def test_minimal_requests_of_every_verb():
    assert parse("new", **NEW)[1].argv == ("true",)
    assert parse("list")[1] == protocol.ListJobs()
    assert parse("kill", id=3)[1] == protocol.JobRef(id=3)
    assert parse("attach", id=3)[1] == protocol.Attach(id=3, offset=0)
    assert parse("ping")[0] == "ping"


def test_new_defaults():
    job = parse("new", **NEW)[1]
    assert (job.cpus, job.gpus, job.mem, job.max_time, job.exclusive, job.numa_local) == \
        (None, 0, None, None, False, False)
    assert (job.output, job.output_is_dir, job.no_output, job.env, job.umask) == (None, True, False, None, 0o077)


# (field, value that must be accepted) for dispatch new
GOOD = [
    ("cpus", 1), ("cpus", bounds.MAX_CPUS), ("cpus", None), ("gpus", 0), ("gpus", bounds.MAX_GPUS),
    ("mem", bounds.MIN_JOB_MEM), ("mem", bounds.MAX_MEM), ("max_time", 1), ("max_time", bounds.MAX_SECONDS),
    ("umask", 0), ("umask", 0o777), ("output", "/x/y.log"), ("output", None), ("output_is_dir", False),
    ("env", {"A": "1", "B": ""}), ("env", None), ("job_env", {"CC": "gcc"}), ("exclusive", True),
    ("numa_local", True), ("no_output", True), ("cwd", "/" + "d" * (bounds.MAX_PATH - 1)),
]


@pytest.mark.parametrize("field,value", GOOD)
def test_new_accepts(field, value):
    job = parse("new", **dict(NEW, **{field: value}))[1]
    assert getattr(job, field) == (tuple(value) if isinstance(value, list) else value)


# (field, bad value, words the error must contain)
BAD = [
    ("argv", [], "no command"), ("argv", [""], "no command"), ("argv", "sh", "wrong type"),
    ("argv", ["a\0b"], "without NUL"), ("argv", [1], "strings"),
    ("cwd", "relative", "absolute"), ("cwd", "/a\0b", "absolute"), ("cwd", 7, "wrong type"),
    ("cwd", "/" + "d" * bounds.MAX_PATH, "at most"),
    ("cpus", 0, "from 1"), ("cpus", -1, "from 1"), ("cpus", bounds.MAX_CPUS + 1, "to"), ("cpus", True, "wrong type"),
    ("cpus", 1.0, "wrong type"), ("cpus", "2", "wrong type"),
    ("gpus", -1, "from 0"), ("gpus", None, "wrong type"), ("gpus", 2 ** 63, "to"),
    ("mem", 0, f"from {bounds.MIN_JOB_MEM}"), ("mem", bounds.MIN_JOB_MEM - 1, f"from {bounds.MIN_JOB_MEM}"),
    ("mem", bounds.MAX_MEM + 1, "to"), ("mem", -10 ** 400, f"from {bounds.MIN_JOB_MEM}"),
    ("max_time", 0, "from 1"), ("max_time", -10, "from 1"), ("max_time", 10 ** 400, "to"),
    ("max_time", -10 ** 400, "from 1"), ("max_time", 1.5, "wrong type"), ("max_time", float("nan"), "wrong type"),
    ("umask", -1, "from 0"), ("umask", 0o1000, "to 511"),
    ("exclusive", 1, "wrong type"), ("exclusive", None, "wrong type"),
    ("output", "rel.log", "absolute"), ("output", ["/x"], "wrong type"), ("output_is_dir", "yes", "wrong type"),
    ("env", {"": "x"}, "invalid variable"), ("env", {"A=B": "x"}, "invalid variable"),
    ("env", {"A": 1}, "invalid variable"), ("env", {"A": "\0"}, "invalid variable"), ("env", ["A=1"], "wrong type"),
    ("job_env", {"A\0": "x"}, "invalid variable"),
]


@pytest.mark.parametrize("field,value,needle", BAD)
def test_new_refuses(field, value, needle):
    with pytest.raises(protocol.ProtocolError, match=needle) as info:
        parse("new", **dict(NEW, **{field: value}))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("missing", ["argv", "cwd"])
def test_new_requires(missing):
    args = dict(NEW)
    del args[missing]
    with pytest.raises(protocol.ProtocolError, match=f"lacks field '{missing}'"):
        parse("new", **args)


def test_base_env_keeps_only_path_and_lang():
    job = parse("new", **NEW, base_env={"PATH": "/bin", "LANG": "C", "LD_PRELOAD": "/evil.so"})[1]
    assert job.base_env == {"PATH": "/bin", "LANG": "C"}


def test_new_size_counts_command_and_environment():
    job = parse("new", argv=["ab", "c"], cwd="/", env={"K": "vv"}, job_env={"X": ""})[1]
    assert job.size() == (3 + 2) + (2 + 3) + (2 + 1)


@pytest.mark.parametrize("op,args,needle", [
    ("kill", {"id": 0}, "job ids"), ("kill", {"id": -1}, "job ids"), ("kill", {"id": bounds.MAX_ID + 1}, "job ids"),
    ("kill", {"id": True}, "wrong type"), ("kill", {"id": "3"}, "neither a job id nor a job name"),
    ("kill", {"id": "bad name!"}, "neither"), ("kill", {"id": 1.0}, "wrong type"), ("kill", {}, "lacks field 'id'"),
    ("wait", {"ids": []}, "1 to"), ("wait", {"ids": [1, "x" * 65]}, "neither"), ("wait", {"ids": "1"}, "wrong type"),
    ("show", {"id": [1]}, "wrong type"),
    ("attach", {"id": 1, "offset": -1}, "offset"), ("attach", {"id": 1, "offset": 2 ** 63}, "offset"),
    ("attach", {"id": 1, "offset": 1.0}, "wrong type"), ("attach", {"id": 2 ** 70}, "job ids"),
    ("list", {"all": 1}, "wrong type"), ("list", {"finished": "yes"}, "wrong type"),
    ("log", {}, "lacks field 'id'"), ("log", {"id": 1, "offset": -1}, "offset"),
    ("log", {"id": 1, "until": 2 ** 63}, "until"), ("log", {"id": 1, "until": "10"}, "wrong type"),
])
def test_other_verbs_refuse(op, args, needle):
    with pytest.raises(protocol.ProtocolError, match=needle):
        protocol.parse_request(req(op, **args))


def test_job_refs_by_id_or_name():
    assert parse("kill", id="prep.v2")[1].id == "prep.v2"
    assert parse("wait", ids=[3, "prep"])[1].ids == (3, "prep")
    job = parse("new", **NEW, name="run-1", after=[2, "prep"], after_ok=True)[1]
    assert (job.name, job.after, job.after_ok) == ("run-1", (2, "prep"), True)
    for bad in ({"name": "123"}, {"name": "a b"}, {"after": [0]}, {"after": list(range(1, 70))}):
        with pytest.raises(protocol.ProtocolError):
            parse("new", **dict(NEW, **bad))


def test_a_log_page_request_starts_at_0_and_until_is_the_first_replys():
    assert parse("log", id="prep")[1] == protocol.LogPage(id="prep", offset=0, until=None)
    assert parse("log", id=3, offset=5, until=None)[1] == protocol.LogPage(id=3, offset=5, until=None)
    assert parse("log", id=3, offset=5, until=bounds.MAX_OFFSET)[1].until == bounds.MAX_OFFSET


def test_attach_offset_bounds():
    assert parse("attach", id=1, offset=bounds.MAX_OFFSET)[1].offset == bounds.MAX_OFFSET


@pytest.mark.parametrize("msg,needle", [
    ({"v": 2, "op": "list", "args": {}}, "version 2"),
    ({"v": True, "op": "list", "args": {}}, "version"),
    ({"v": "1", "op": "list", "args": {}}, "version"),
    ({"op": "list", "args": {}}, "version"),
    ({"v": 1, "op": "launch", "args": {}}, "unknown command 'launch'"),
    ({"v": 1, "op": ["list"], "args": {}}, "unknown command"),
    ({"v": 1, "op": {"a": 1}, "args": {}}, "unknown command"),
    ({"v": 1, "op": "x" * 1000, "args": {}}, r"\.\.\."),
    ({"v": 1, "op": "list", "args": []}, "'args' must be an object"),
])
def test_envelope_errors(msg, needle):
    with pytest.raises(protocol.ProtocolError, match=needle) as info:
        protocol.parse_request(msg)
    assert len(str(info.value)) < 200 and "\n" not in str(info.value)


def test_unknown_fields_are_ignored_not_identity():
    assert parse("ping", uid=0, user="root")[0] == "ping"


def test_verbs_agree_between_cli_protocol_and_daemon():
    # Every request has a handler (attach, wait and watch hold their
    # connection, so the server owns them) and every CLI command sends one;
    # ping is the protocol's own liveness probe and watch is the event stream
    # programs read (the PSI/J executor), neither a command of their own;
    # report is history's rows set side by side, so it sends history.
    assert set(protocol.REQUESTS) == set(HANDLERS) | set(STREAMING)
    assert set(cli.COMMANDS) == set(protocol.REQUESTS) - {"ping", "watch"} | {"report"}
    assert set(cli.SUBCOMMANDS) == set(cli.COMMANDS)

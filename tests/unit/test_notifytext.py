"""dispatch new --notify: its forms, checks, line, utmp reading and the shepherd's own outcome words."""

import os
import re
from types import SimpleNamespace

import pytest

from hpc_batch.client import cli
from hpc_batch.client.cli_usage import NEW_USAGE
from hpc_batch.client.listing import format_show
from hpc_batch.core.jobrequest import JobRequest
from hpc_batch.core.jobs import Job, exit_column
from hpc_batch.daemon import outcome
from hpc_batch.wire.protocol import NewJob, ProtocolError
from shepherd.base import notifytext
from shepherd.base.records import ExitRecord, LaunchSpec


@pytest.mark.parametrize("forms, command, want", [
    ("tty", None, ["tty"]),
    ("cmd,tty", "true", ["tty", "cmd"]),
    (" tty , cmd ", "true", ["tty", "cmd"]),
    (None, "true", ["cmd"]),                 # --notify-command alone implies cmd
    ("tty", "true", ["tty", "cmd"]),
])
def test_forms_accepted(forms, command, want):
    assert cli._notify_args(forms, command) == {"notify": want, "notify_command": command}


@pytest.mark.parametrize("forms, command, message", [
    ("bogus", None, "--notify 'bogus': unknown form; give tty or cmd"),
    ("stirct", None, "unknown form"),
    ("", None, "an empty form"),
    ("tty,,cmd", "x", "an empty form"),
    ("cmd", None, "--notify cmd needs the command: add --notify-command"),
    ("tty\x1b[2J", None, r"'tty\x1b[2J'"),   # a control character is shown escaped, never sent
    ("télé", None, "'télé': unknown form"),
    (None, "", "--notify-command is empty"),
    (None, "   ", "--notify-command is empty"),
    (None, "a\0b", "holds a NUL"),
    (None, "x" * (notifytext.MAX_COMMAND + 1), f"longer than {notifytext.MAX_COMMAND} bytes"),
])
def test_bad_values_are_one_line_usage_errors(forms, command, message):
    with pytest.raises(cli.UsageError) as caught:
        cli._notify_args(forms, command)
    text = str(caught.value)
    assert message in text and "\n" not in text and "\x1b" not in text


def test_the_daemon_checks_the_request_too():
    base = {"argv": ["true"], "cwd": "/tmp"}
    assert NewJob.from_args(base).notify is None
    got = NewJob.from_args(dict(base, notify=["tty", "cmd"], notify_command="echo done"))
    assert got.notify == {"forms": ["tty", "cmd"], "command": "echo done"}
    for bad in ({"notify": ["cmd"]}, {"notify": ["wall"]}, {"notify": ["tty"], "notify_command": 5},
                {"notify": "tty"}, {"notify": ["tty", "tty", "cmd"], "notify_command": "x"}):
        with pytest.raises(ProtocolError):
            NewJob.from_args(dict(base, **bad))


def test_a_stored_job_with_a_bad_notify_is_refused():
    job = Job(id=1, uid=1000, gid=1000, user="u", argv=["true"], cwd="/", submitted=1.0, max_time=60,
              budget={"mem": 1 << 30}, request=JobRequest.from_dict({"notify": {"forms": ["tty"], "command": None}}))
    job.check()
    stored = job.to_dict()
    assert Job.from_dict(stored) == job
    for bad in ({"forms": []}, {"forms": ["cmd"], "command": None}, {"forms": ["tty"], "command": "x"},
                "not an object"):
        with pytest.raises(ValueError):
            Job.from_dict(stored | {"request": stored["request"] | {"notify": bad}})


def test_show_names_the_forms_and_the_command():
    lines = format_show({"id": 3, "state": "queued", "notify": {"forms": ["tty", "cmd"], "command": "echo hi"}}, 0)
    assert "notify: tty, cmd (echo hi)" in lines


def test_the_help_gives_the_limit_and_every_variable():
    text = " ".join(NEW_USAGE.split())
    assert f"killed after {int(notifytext.LIMIT)}s" in text
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for page in ("hpc_batch/data/man/dispatch.1", "docs/usage.md", "docs/security.md"):
        with open(os.path.join(root, page)) as f:
            said = " ".join(f.read().split())
        assert re.search(rf"after {int(notifytext.LIMIT)} ?s(econds)?\b", said), page
        assert page.endswith("security.md") or all(name.replace("HPC_BATCH_JOB", "") in said.replace("\\", "")
                                                   for name in notifytext.ENV_NAMES), page
    for name in notifytext.ENV_NAMES:
        short = name if name == notifytext.ENV_ID else "_" + name.rsplit("_", 1)[1]
        assert short in text, name


def test_escape_leaves_nothing_a_terminal_acts_on():
    text = notifytext.escape("a\x1b]0;title\x07b\r\n\x9bc\u202ed\u00e9")
    assert text.isprintable() and "\x1b" not in text and "\u202e" not in text
    assert text.startswith("a\\x1b]0;title\\x07b\\r\\n\\x9bc\\u202ed") and text.endswith("é")


@pytest.mark.parametrize("seconds, want", [(0, "0s"), (4.9, "4s"), (192, "3m12s"), (7205, "2h0m5s"),
                                           (90061, "1d1h1m1s")])
def test_duration(seconds, want):
    assert notifytext.duration(seconds) == want


def test_the_line():
    assert notifytext.line(12, "prep", ["x"], "0", 192) == b"\r\nhpc-batch: job 12 (prep) ended: exit 0 after 3m12s\r\n"
    assert notifytext.line(5, None, ["sleep", "9"], "timeout", None) == \
        b"\r\nhpc-batch: job 5 (sleep 9) ended: timeout\r\n"
    long = notifytext.line(5, None, ["echo", "\x1b[31m" + "x" * 80], "SIGSEGV", 1)
    assert b"\x1b" not in long and b"...) ended: SIGSEGV after 1s" in long


def test_terminals_from_utmp():
    rec = notifytext.utmp_record
    other_kind = bytearray(rec("alice", "pts/9"))
    other_kind[0] = 8    # DEAD_PROCESS: a session that ended
    data = b"".join([rec("alice", "pts/3"), rec("bob", "pts/4"), bytes(other_kind), rec("alice", "../etc/x"),
                     rec("alice", "/etc/shadow"), rec("alice", "pts/3"), rec("alice", "tty1"),
                     rec("alice", "pts/a b"), b"\0" * 17])    # a torn tail is ignored
    assert notifytext.UTMP.size == 384
    assert notifytext.terminals(data, "alice") == ["pts/3", "tty1"]
    assert notifytext.terminals(data, "bob") == ["pts/4"]
    assert notifytext.terminals(b"", "alice") == []


@pytest.mark.parametrize("rec", [
    ExitRecord(status=0, code=0), ExitRecord(status=3 << 8, code=3), ExitRecord(signal=11),
    ExitRecord(signal=64), ExitRecord(signal=15, stopped="killed"), ExitRecord(signal=9, stopped="timeout"),
    ExitRecord(code=127, error="exec failed"), ExitRecord(signal=9, oom_kill=1),
])
def test_the_shepherds_outcome_is_the_daemons(rec):
    """ExitRecord.outcome (the shepherd's, for --notify) says what the daemon will make of the record."""
    job = SimpleNamespace(stop_reason=None, stop_sent=None)
    result = outcome.result_of(job, rec)   # type: ignore[arg-type]
    assert rec.outcome() == (result.kind, exit_column(result))


def test_the_launch_spec_carries_notify():
    spec = LaunchSpec(user="u", uid=1, gid=1, cwd="/", argv=["true"], env={},
                      notify={"tty": True, "command": None, "limit": 30.0, "name": None})
    again = LaunchSpec.from_dict(spec.to_dict())
    assert again is not None and again.notify == spec.notify
    assert LaunchSpec.from_dict(dict(spec.to_dict(), notify="x")).notify is None   # mistyped: absent
    assert re.fullmatch(r"HPC_BATCH_JOB_[A-Z]+", notifytext.ENV_WALL)

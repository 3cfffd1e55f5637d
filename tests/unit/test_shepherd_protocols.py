"""The daemon-to-shepherd protocols, each encoded and decoded in the one file that owns it.

launch.json (records.LaunchSpec), the control FIFO's lines (shepherd/control.py) and the
fork server's request and answer lines (shepherd/forkserver.py): what one side writes, the
other reads back, and what neither should ever see is refused or ignored.
"""

import errno
import os

import pytest

from hpc_batch.core import jobs
from shepherd import control, forkserver
from shepherd.base import records

FULL = {"user": "alice", "uid": 1000, "gid": 1000, "cwd": "/home/alice", "argv": ["sh", "-c", "true"],
        "env": {"PATH": "/bin"}}


def test_a_launch_spec_reads_back_as_written(tmp_path):
    spec = records.LaunchSpec(**FULL, id=7, output="/home/alice/out.log", umask=0o022, admin_gid=10,
                              cpus=[2, 3], deadline=1e9, max_output_buffer=1 << 20, aslr="off",
                              record={"to": "/home/alice/r.json", "version": "1"})
    path = str(tmp_path / records.LAUNCH)
    spec.write(path)
    assert os.stat(path).st_mode & 0o777 == 0o600      # it holds the environment
    back = records.read_record(path, records.LaunchSpec)
    assert back is not None and back.to_dict() == spec.to_dict()
    assert back.replace(output="/x").output == "/x" and back.output == "/home/alice/out.log"


def test_a_spec_from_an_older_daemon_gets_the_defaults():
    spec = records.LaunchSpec.from_dict(dict(FULL))
    assert spec is not None
    assert (spec.kill_grace, spec.delivery_limit, spec.fork_retry, spec.max_output_buffer, spec.umask) == (
        records.LaunchSpec.KILL_GRACE, records.LaunchSpec.DELIVERY_LIMIT, records.LaunchSpec.FORK_RETRY,
        records.LaunchSpec.MAX_OUTPUT_BUFFER, records.LaunchSpec.UMASK)
    assert (spec.aslr, spec.thp, spec.record, spec.deadline, spec.cgroup) == ("on", "on", None, None, None)


@pytest.mark.parametrize("key, bad", [("user", None), ("uid", "0"), ("gid", True), ("cwd", 3), ("argv", []),
                                      ("argv", ["sh", 1]), ("env", ["PATH=/bin"])])
def test_a_spec_missing_what_a_job_needs_reads_as_none(key, bad):
    assert records.LaunchSpec.from_dict({**FULL, key: bad}) is None
    assert records.LaunchSpec.from_dict({k: v for k, v in FULL.items() if k != key}) is None


def test_a_mistyped_optional_value_reads_as_its_default():
    spec = records.LaunchSpec.from_dict({**FULL, "kill_grace": "5", "deadline": "soon", "cpus": ["0"]})
    assert spec is not None
    assert (spec.kill_grace, spec.deadline, spec.cpus) == (records.LaunchSpec.KILL_GRACE, None, None)


def test_the_daemons_max_output_buffer_default_is_the_specs():
    from hpc_batch import defaults
    from hpc_batch.core.sizes import parse_size
    assert parse_size(defaults.MAX_OUTPUT_BUFFER, "M") == records.LaunchSpec.MAX_OUTPUT_BUFFER


def test_the_stop_reasons_are_the_results_of_the_same_names():
    assert records.STOP_REASONS == (jobs.KILLED, jobs.TIMEOUT)
    assert set(records.STOP_REASONS) <= set(jobs.RESULTS)


@pytest.mark.parametrize("reason", records.STOP_REASONS)
def test_a_stop_line_reads_back(reason):
    assert control.parse(control.encode_stop(reason)) == (control.STOP, reason)


def test_a_deadline_line_reads_back_to_the_millisecond():
    kind, when = control.parse(control.encode_deadline(1234567890.1234))
    assert kind == control.DEADLINE and when == pytest.approx(1234567890.123)


def test_an_unknown_stop_reason_is_not_encoded_but_still_read_as_a_stop():
    with pytest.raises(ValueError):
        control.encode_stop("because")
    assert control.parse("stop because") == (control.STOP, records.KILLED)
    assert control.parse("stop") == (control.STOP, records.KILLED)


@pytest.mark.parametrize("line", ["", "   ", "deadline", "deadline soon", "deadline nan", "deadline inf",
                                  "deadline 1e13", "deadline 1 2", "start", "STOP killed"])
def test_lines_that_are_no_command_are_ignored(line):
    assert control.parse(line) is None


def test_the_fifo_carries_the_commands_the_daemon_sends(tmp_path):
    rfd, keeper = control.create(str(tmp_path))
    try:
        reader = control.Reader(rfd)
        assert control.stop(str(tmp_path), records.TIMEOUT)
        assert control.deadline(str(tmp_path), 2e9)
        assert control.send(str(tmp_path), "nonsense")
        assert reader.commands() == [(control.STOP, records.TIMEOUT), (control.DEADLINE, 2e9)]
    finally:
        os.close(rfd)
        os.close(keeper)
    assert not control.stop(str(tmp_path), records.KILLED)   # nobody reads it any more


def test_a_fork_request_reads_back():
    line = forkserver.encode_request(12, "alice", "/var/lib/hpc-batch/jobs/12 with space")
    assert line.endswith(b"\n")
    assert forkserver.parse_request(line[:-1]) == (12, "alice", "/var/lib/hpc-batch/jobs/12 with space")


@pytest.mark.parametrize("line", [b"", b"12 alice", b"x alice /d", b"\xff alice /d"])
def test_a_malformed_fork_request_reads_as_none(line):
    assert forkserver.parse_request(line) is None


def test_a_fork_answer_reads_back():
    assert forkserver.parse_answer(forkserver.encode_answer(321, 99).encode() + b"\n") == (321, 99)
    assert forkserver.parse_answer(forkserver.encode_answer(321, None).encode()) == (321, 0)   # gone: no match


def test_a_failed_fork_says_its_errno_name():
    answer = forkserver.fork_error(OSError(errno.EAGAIN, "Resource temporarily unavailable"))
    with pytest.raises(forkserver.ForkFailed) as failed:
        forkserver.parse_answer(answer.encode())
    assert failed.value.name == "EAGAIN" and failed.value.name in records.NOT_NOW_NAMES
    assert "Resource temporarily unavailable" in failed.value.text
    with pytest.raises(forkserver.ForkFailed) as failed:
        forkserver.parse_answer(b"error malformed request\n")
    assert (failed.value.name, failed.value.text) == ("", "malformed request")


@pytest.mark.parametrize("line", [b"", b"\n", b"12", b"x 3"])
def test_an_answer_that_is_neither_is_a_value_error(line):
    with pytest.raises(ValueError):
        forkserver.parse_answer(line)

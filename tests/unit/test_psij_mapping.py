"""The PSI/J job spec in dispatch new's terms, and the daemon's job states in PSI/J's (no daemon here)."""

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from psij import JobAttributes, JobSpec, ResourceSpecV1

from hpc_batch.client import cli
from hpc_batch.client.cli_usage import NEW_USAGE
from hpc_batch.psij import mapping as psij_mapping
from hpc_batch.psij.mapping import SHELL, WRAPPER_NAME, Unsupported, job_name, statuses, submission


def spec(**kw):
    kw.setdefault("executable", "/bin/echo")
    kw.setdefault("inherit_environment", False)
    return JobSpec(**kw)


def flags(s):
    return list(submission(s).flags)


def test_a_bare_job():
    sub = submission(spec(arguments=["a b", "c"]))
    # PSI/J's default duration is 10 minutes; the name is the executable's; no stdout means none kept.
    assert sub.flags == ("--max-time", "600", "--name", "echo", "--no-output")
    assert sub.command == ("/bin/echo", "a b", "c")
    assert sub.cwd is None
    assert sub.argv("/x/dispatch") == ["/x/dispatch", "new", "--json", *sub.flags, "--", "/bin/echo", "a b", "c"]


def test_every_mapped_field():
    s = spec(arguments=["x"], directory="/work/run", name="train run/7", inherit_environment=True,
             environment={"A": "1", "B_2": 3}, stdout_path=Path("out.txt"), stderr_path="out.txt",
             resources=ResourceSpecV1(process_count=2, cpu_cores_per_process=3, gpu_cores_per_process=1,
                                      memory=(1 << 30) + 1, exclusive_node_use=True),
             attributes=JobAttributes(duration=timedelta(minutes=90, seconds=0.5), custom_attributes={
                 "hpc-batch.numa-local": True, "hpc-batch.numa-local-mem": False, "hpc-batch.numa-local-gpu": True,
                 "hpc-batch.gpu-link": "NV", "slurm.constraint": "haswell"}))
    sub = submission(s)
    # Cores and GPUs are per process, memory is rounded up to KiB and the duration to a second; a name
    # that is only digits would read as a job id.
    assert sub.flags == ("--cpu", "6", "--gpu-cores", "2", "--max-mem", f"{(1 << 20) + 1}K", "--exclusive",
                         "--max-time", "5401", "--gpu-link", "NV", "--numa-local", "--numa-local-gpu",
                         "--name", "job-7", "--env", "--output", "out.txt")
    # stderr_path equal to stdout_path: one output, no wrapper.
    assert sub.command == ("A=1", "B_2=3", "/bin/echo", "x")
    assert sub.cwd == "/work/run"


def test_the_flags_are_ones_dispatch_new_takes():
    # Every flag the mapping can emit is in dispatch new's usage, so a rename there fails here.
    s = spec(stdout_path="o", resources=ResourceSpecV1(cpu_cores_per_process=1, gpu_cores_per_process=1,
                                                       memory=1, exclusive_node_use=True),
             inherit_environment=True,
             attributes=JobAttributes(custom_attributes={f"hpc-batch.{n}": True for n in psij_mapping.SWITCHES}
                                      | {"hpc-batch.gpu-link": "NV"}))
    emitted = {f for f in flags(s) if f.startswith("--")} | {"--no-output"}
    assert emitted - set(NEW_USAGE.split()) == set()
    assert len(emitted) == 13


@pytest.mark.parametrize("resources, expected", [
    (ResourceSpecV1(), []),
    (ResourceSpecV1(process_count=4), ["--cpu", "4"]),                   # one core each, as slurm gives
    (ResourceSpecV1(processes_per_node=2, cpu_cores_per_process=2), ["--cpu", "4"]),
    (ResourceSpecV1(node_count=1, process_count=3), ["--cpu", "3"]),
    (ResourceSpecV1(gpu_cores_per_process=0), []),
    (ResourceSpecV1(memory=1), ["--max-mem", "16384K"]),              # raised to the least budget a job has
    (ResourceSpecV1(memory=(16 << 20) + 1), ["--max-mem", "16385K"]),
    (ResourceSpecV1(exclusive_node_use=True), ["--exclusive"]),
])
def test_resources(resources, expected):
    assert flags(spec(resources=resources, attributes=JobAttributes(duration=timedelta(seconds=1))))[:-5] == expected


@pytest.mark.parametrize("resources, needle", [
    (ResourceSpecV1(node_count=2), "asks for 2 nodes"),
    (ResourceSpecV1(process_count=8, processes_per_node=4), "asks for 2 nodes"),
    (ResourceSpecV1(cpu_cores_per_process=0), "cpu_cores_per_process 0"),
    (ResourceSpecV1(gpu_cores_per_process=-1), "gpu_cores_per_process -1"),
    (ResourceSpecV1(memory=0), "memory 0"),
])
def test_what_one_machine_cannot_express_is_refused(resources, needle):
    with pytest.raises(Unsupported, match=needle) as info:
        submission(spec(resources=resources))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kw, needle", [
    ({"executable": None}, "no executable"),
    ({"launcher": "mpirun"}, "launcher 'mpirun'"),
    ({"pre_launch": "/p.sh"}, "pre_launch"),
    ({"post_launch": "/p.sh"}, "post_launch"),
    ({"environment": {"1A": "x"}}, "'1A'"),
    ({"environment": {"A-B": "x"}}, "'A-B'"),
    ({"environment": {"A": "x\0y"}}, "NUL"),
    ({"attributes": JobAttributes(duration=timedelta(0))}, "duration"),
    ({"attributes": JobAttributes(custom_attributes={"hpc-batch.numa-local": "yes"})}, "True or False"),
    ({"attributes": JobAttributes(custom_attributes={"hpc-batch.gpu-link": 4})}, "link class"),
    ({"attributes": JobAttributes(custom_attributes={"hpc-batch.cpus": 4})}, "unknown custom attribute"),
])
def test_fields_without_an_equivalent_are_refused(kw, needle):
    with pytest.raises(Unsupported, match=needle):
        submission(spec(**kw))


def test_single_launcher_and_other_executors_attributes_are_fine():
    s = spec(launcher="single", attributes=JobAttributes(
        queue_name="debug", account="a1", custom_attributes={"slurm.qos": "x", "pbs.c": "y"}))
    assert flags(s) == ["--max-time", "600", "--name", "echo", "--no-output"]


def _run(argv, cwd):
    """Run a mapped command line as the job would (env words dropped: dispatch takes those)."""
    env, cmd = cli.split_env(argv)
    return subprocess.run(cmd, cwd=cwd, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True)


@pytest.mark.parametrize("out, err, wrapped_err", [
    (None, None, None),           # --no-output discards both
    ("o", "o", None),             # one file: hpc-batch's output
    ("o", None, "/dev/null"),     # PSI/J discards an unnamed stderr
    ("o", "e", "e"),
    (None, "e", "e"),
])
def test_stdout_and_stderr(out, err, wrapped_err):
    sub = submission(spec(stdout_path=out, stderr_path=err))
    assert ("--no-output" in sub.flags) == (out is None)
    if wrapped_err is None:
        assert sub.command[0] == "/bin/echo"
    else:
        assert sub.command[:2] == (SHELL, "-c") and sub.command[3:5] == (WRAPPER_NAME, wrapped_err)


def test_the_wrapper_redirects_and_keeps_exit_codes_and_arguments(tmp_path):
    (tmp_path / "in").write_text("from stdin\n")
    script = 'cat; echo "$#:$1:$2" ; echo oops >&2; exit 3'
    sub = submission(spec(executable="/bin/sh", arguments=["-c", script, "sh", "two words", "*"],
                          stdin_path="in", stdout_path="o", stderr_path="e"))
    r = _run(list(sub.command), tmp_path)
    assert r.returncode == 3
    assert r.stdout == "from stdin\n2:two words:*\n"   # stdout is hpc-batch's output: here, ours
    assert (tmp_path / "e").read_text() == "oops\n"


def test_the_wrapper_execs_so_a_signal_stays_a_signal(tmp_path):
    sub = submission(spec(executable="/bin/sh", arguments=["-c", "kill -SEGV $$"], stdout_path="o"))
    assert sub.command[0] == SHELL
    assert _run(list(sub.command), tmp_path).returncode == -11


def test_an_executable_that_looks_like_an_environment_word_is_still_run():
    sub = submission(spec(executable="A=b", stdout_path="o", stderr_path="o"))
    assert sub.command == (SHELL, "-c", 'exec "$@"', WRAPPER_NAME, "A=b")
    env, argv = cli.split_env(list(sub.command))
    assert env == {} and argv[-1] == "A=b"


@pytest.mark.parametrize("name, expected", [
    ("/bin/echo", "echo"), ("my job", "my_job"), ("42", "job-42"), ("a" * 80, "a" * 64),
    ("dir/", "dir"), ("/", None), ("", None), (None, None), ("ok.v1_2-3", "ok.v1_2-3"), ("é", "_"),
])
def test_job_name(name, expected):
    assert job_name(name) == expected


def _job(state, result=None, **kw):
    job = {"id": 7, "state": state, "submitted": 1.0, "started": None, "ended": None, "result": result,
           "exit": None, "output": "/o", "output_error": None}
    job.update(kw)
    return job


def _states(job):
    return [(s.state, s.exit_code) for s in statuses(job)]


def test_states_in_order():
    assert _states(_job("waiting")) == [("QUEUED", None)]
    assert _states(_job("queued")) == [("QUEUED", None)]
    assert _states(_job("running", started=2.0)) == [("QUEUED", None), ("ACTIVE", None)]
    done = statuses(_job("finished", {"kind": "exited", "code": 0}, started=2.0, ended=3.0, exit="0"))
    assert [(s.state, s.time) for s in done] == [("QUEUED", 1.0), ("ACTIVE", 2.0), ("COMPLETED", 3.0)]
    assert done[-1].metadata == {"nativeId": "7", "result": "exited", "exit": "0", "output": "/o"}
    assert done[-1].message is None


@pytest.mark.parametrize("result, exit_col, started, expected", [
    ({"kind": "exited", "code": 3}, "3", 2.0, ("FAILED", 3, None)),
    ({"kind": "signalled", "signal": 11}, "SIGSEGV", 2.0, ("FAILED", 139, "killed by SIGSEGV")),
    ({"kind": "killed", "signal": 15}, "killed", 2.0, ("CANCELED", None, "killed while it ran (dispatch kill)")),
    ({"kind": "cancelled"}, "cancelled", None, ("CANCELED", None, "cancelled before it started")),
    ({"kind": "cancelled", "note": "cancelled by bob before it started"}, "cancelled", None,
     ("CANCELED", None, "cancelled by bob before it started")),
    ({"kind": "killed", "note": "shepherd killed"}, "killed", 2.0,
     ("CANCELED", None, "killed while it ran (dispatch kill): shepherd killed")),
    ({"kind": "timeout"}, "timeout", 2.0, ("FAILED", None, "ran past its duration and was stopped")),
    ({"kind": "oom"}, "oom", 2.0, ("FAILED", None, "went over its memory budget and was killed")),
    ({"kind": "error", "note": "exec: No such file"}, "error", None,
     ("FAILED", None, "could not be run: exec: No such file")),
    ({"kind": "lost"}, "lost", 2.0, ("FAILED", None, "its shepherd vanished while no daemon watched; "
                                                     "how it ended is unknown")),
])
def test_how_a_job_ended(result, exit_col, started, expected):
    out = statuses(_job("finished", result, started=started, ended=3.0, exit=exit_col))
    assert [s.state for s in out[:-1]] == (["QUEUED", "ACTIVE"] if started else ["QUEUED"])
    assert (out[-1].state, out[-1].exit_code, out[-1].message) == expected
    assert out[-1].metadata["result"] == result["kind"]


def test_undelivered_output_is_said():
    out = statuses(_job("finished", {"kind": "exited", "code": 0}, started=2.0, output_error="disk full"))
    assert out[-1].state == "COMPLETED" and out[-1].message == "output not delivered: disk full"
    assert out[-1].metadata["output_error"] == "disk full"


@pytest.mark.parametrize("code, kind", [
    ("never_fits", "invalid"), ("usage", "invalid"), ("refused", "invalid"), ("too_large", "invalid"),
    ("bad_request", "invalid"), ("busy", "transient"), ("queue_full", "transient"), ("unreachable", "transient"),
    ("forbidden", "submit"), ("internal", "submit"), (None, "submit"),
])
def test_refusals(code, kind):
    assert psij_mapping.refusal(code) == kind


def test_the_core_never_imports_psij():
    # The executor alone needs psij; the daemon, the client and the mapping run without it.
    code = ("import sys, hpc_batch.client.cli, hpc_batch.daemon.main, hpc_batch.daemon.server, hpc_batch.psij.mapping; "
            "sys.exit(' '.join(m for m in sys.modules if m.split('.')[0] == 'psij') or None)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

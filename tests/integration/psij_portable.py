"""One PSI/J script, run unchanged through any executor: the portability check.

    python psij_portable.py EXECUTOR WORKDIR [URL]

Submits the same few jobs through PSI/J's EXECUTOR (hpc-batch, local,
slurm), each with its files in WORKDIR, waits for them all, and prints one
JSON document: for each job the states its callback saw, in order, its final
state, exit code, and the contents of its stdout and stderr files. Only
features every one of those executors has are used, so the documents can be
compared. The integration tests run it as root and as a test user (it is
copied where that user can read it, hence no imports from the tests), and
the slurm test against a real Slurm.
"""

import json
import os
import sys
import threading
from datetime import timedelta
from pathlib import Path

from psij import Job, JobAttributes, JobExecutor, JobSpec, ResourceSpecV1

# key -> what the job runs and how; paths are relative to WORKDIR.
JOBS = {
    # Each executor takes its own custom attributes and leaves the others' alone.
    "hello": {"executable": "/bin/echo", "arguments": ["hello", "two  words", "*"], "stdout": "hello.out",
              "custom": {"hpc-batch.numa-local-mem": True, "slurm.comment": "portable"}},
    "env": {"executable": "/bin/sh", "arguments": ["-c", 'echo "$PORTABLE_VAR"'],
            "environment": {"PORTABLE_VAR": "value with spaces"}, "stdout": "env.out"},
    "directory": {"executable": "/bin/pwd", "directory": "sub", "stdout": "directory.out"},
    "streams": {"executable": "/bin/sh", "arguments": ["-c", "echo to-out; echo to-err >&2"],
                "stdout": "streams.out", "stderr": "streams.err"},
    "stdin": {"executable": "/bin/cat", "stdin": "stdin.in", "stdout": "stdin.out"},
    "fails": {"executable": "/bin/sh", "arguments": ["-c", "echo failing; exit 3"], "stdout": "fails.out"},
    "user": {"executable": "/usr/bin/id", "arguments": ["-un"], "stdout": "user.out"},
}


def spec_of(work: Path, how: dict) -> JobSpec:
    return JobSpec(executable=how["executable"], arguments=how.get("arguments"),
                   directory=work / how["directory"] if "directory" in how else work,
                   environment=how.get("environment"),
                   stdin_path=work / how["stdin"] if "stdin" in how else None,
                   stdout_path=work / how["stdout"] if "stdout" in how else None,
                   stderr_path=work / how["stderr"] if "stderr" in how else None,
                   resources=ResourceSpecV1(process_count=1),
                   attributes=JobAttributes(duration=timedelta(minutes=5), custom_attributes=how.get("custom")))


def executor_for(name: str, url: str | None) -> JobExecutor:
    if name == "slurm":
        # Asked every second rather than every 30 (its default), so the test takes seconds.
        from psij.executors.batch.slurm import SlurmExecutorConfig
        return JobExecutor.get_instance(name, config=SlurmExecutorConfig(queue_polling_interval=1))
    return JobExecutor.get_instance(name, url=url)


def main(argv: list[str]) -> int:
    name, work = argv[1], Path(argv[2])
    url = argv[3] if len(argv) > 3 else None
    (work / "sub").mkdir(exist_ok=True)
    (work / "stdin.in").write_text("line one\nline two\n")
    ex = executor_for(name, url)
    seen: dict[str, list[str]] = {key: [] for key in JOBS}
    changed = threading.Condition()
    jobs = {}
    for key, how in JOBS.items():
        job = Job(spec_of(work, how))

        def record(job, status, key=key):
            with changed:
                seen[key].append(status.state.name)
                changed.notify_all()

        job.set_job_status_callback(record)
        ex.submit(job)
        jobs[key] = job
    out = {}
    for key, job in jobs.items():
        status = job.wait(timeout=timedelta(minutes=3))
        if status is None:
            out[key] = {"final": "timed out"}
            continue
        files = {}
        for stream in ("stdout", "stderr"):
            path = JOBS[key].get(stream)
            if path:
                p = work / path
                files[stream] = p.read_text() if p.exists() else None
        # Job.wait can return before the callback for that state has run: wait for it too.
        with changed:
            changed.wait_for(lambda key=key, status=status: status.state.name in seen[key], timeout=30)
            states = list(seen[key])
        out[key] = {"states": states, "final": status.state.name, "exit_code": status.exit_code, **files}
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main(sys.argv))

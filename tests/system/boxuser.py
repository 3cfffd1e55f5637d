"""What the install tests (install.sh in test_install_guest.py, the Debian package in
test_deb_guest.py) do to a guest of their own: scenario steps in order, and one test user who
submits, lists and waits for jobs through the installed ``dispatch``."""

import functools
import re
import time

import pytest


def scenario_steps():
    """A ``step(name, needs=())`` decorator for one module's scenario: a step fails at once (never
    skips) unless every step it needs passed, naming them."""
    done = set()

    def step(name, needs=()):
        def wrap(fn):
            @functools.wraps(fn)
            def run_step(*args, **kwargs):
                missing = [n for n in needs if n not in done]
                if missing:
                    pytest.fail("cannot run: the earlier step(s) %s did not pass" % ", ".join(missing))
                fn(*args, **kwargs)
                done.add(name)
            return run_step
        return wrap
    return step


def report(box, *results):
    return "\n".join([r.describe() for r in results] + [box.unit_report("hpc-batch")])


def wait_for(check, seconds, interval=1.0):
    """``check()``'s first true value within *seconds*, else its last (false) one."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def held(flag, code=0):
    """A job command that runs until the test creates ``flag``, then exits ``code``."""
    return "sh -c 'while [ ! -e %s ]; do sleep 1; done; exit %d'" % (flag, code)


class BoxUser:
    """The test user *name* on a guest, with ``dispatch`` in *bin* and *deadline* seconds for a job
    to start or end."""

    def __init__(self, name, bin, deadline):
        self.name, self.bin, self.deadline = name, bin, deadline

    def login(self, box, cmd, timeout=120):
        """``cmd`` in a new login shell of the test user: PATH as users get it."""
        return box.run(["runuser", "-l", self.name, "-c", cmd], timeout=timeout)

    def submit(self, box, command, flags=""):
        """Submit ``command`` as the test user from a login shell; (id, state)."""
        r = self.login(box, "cd ~ && dispatch new %s -- %s" % (flags, command))
        m = re.search(r"\bjob (\d+) (\w+)", r.out)
        assert r.ok and m, report(box, r)
        return m.group(1), m.group(2)

    def listing(self, box, finished=True):
        """{id: words} of the test user's jobs, from the plain (piped) listing."""
        r = box.run("%s/dispatch list%s" % (self.bin, " --finished" if finished else ""),
                    user=self.name, timeout=120)
        rows = {}
        for line in r.out.splitlines():
            words = re.sub(r" \(.*\)$", "", line).split()  # drop a trailing (note)
            if len(words) > 2 and words[0] == self.name and words[1].isdigit():
                rows[words[1]] = words
        return rows

    def wait_running(self, box, job_id):
        def running():
            row = self.listing(box, finished=False).get(job_id)
            return row is not None and "queued" not in row
        assert wait_for(running, self.deadline), (
            "job %s never started\n%s" % (job_id, box.unit_report("hpc-batch")))

    def wait_exit(self, box, job_id, seconds=None):
        """The exit column of a finished job (waits for it)."""
        def done():
            # One listing: with --finished, unfinished jobs read "running -"/"queued -".
            row = self.listing(box).get(job_id)
            return row if row and row[-2] not in ("running", "queued") else None
        row = wait_for(done, self.deadline if seconds is None else seconds, interval=2)
        assert row, "job %s never finished:\n%s\n%s" % (
            job_id, box.run("%s/dispatch list --finished" % self.bin, user=self.name).describe(),
            box.unit_report("hpc-batch"))
        return row[-1]

    def wait_ready(self, box):
        """The daemon is active and answers."""
        def ready():
            return (box.run("systemctl is-active hpc-batch", timeout=60).out.strip() == "active"
                    and box.run("%s/dispatch list" % self.bin, user=self.name, timeout=120).ok)
        assert wait_for(ready, 120, interval=2), box.unit_report("hpc-batch")

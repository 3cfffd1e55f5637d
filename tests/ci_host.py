"""What CI's host always has, and what a test does when a machine lacks it.

CI runs the host tests as root on a 2-CPU Linux machine with tmpfs mounts,
writable /proc/irq affinities and the cgroup v1 pids controller (a v1/v2
hybrid). A test that needs one of those fails where it is missing, rather
than skip: a skip there would hide that CI stopped testing it. On another
machine (a laptop, a container) HPC_BATCH_TEST_ALLOW_GAPS=1 makes them skip.
docs/development.md lists every skip that remains and why.
"""

import functools
import os

import pytest

ALLOW = "HPC_BATCH_TEST_ALLOW_GAPS"


def require(present: bool, what: str) -> None:
    """Go on if *present*; else fail (CI's host has it), or skip under HPC_BATCH_TEST_ALLOW_GAPS=1."""
    if present:
        return
    if os.environ.get(ALLOW) == "1":
        pytest.skip(f"{what} ({ALLOW}=1: a gap of this machine, not of CI's)")
    pytest.fail(f"{what}: CI's host always has it, so here it is a fault, not a reason to skip; on a machine "
                f"that lacks it, {ALLOW}=1 skips instead (docs/development.md, 'Skips')", pytrace=False)


def needs(present: bool, what: str):
    """:func:`require` as a decorator (checked when the test runs, not when it is collected)."""
    def wrap(fn):
        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            require(present, what)
            return fn(*args, **kwargs)
        return guarded
    return wrap

"""A full state directory: submits that cannot be stored are refused, nothing accepted is lost."""

import os
import subprocess

import pytest
from conftest import exit_of, wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def tiny_state(scratch):
    path = os.path.join(scratch, "state")
    os.mkdir(path)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0711", "tmpfs", path], check=True)
    yield path
    subprocess.run(["umount", "-l", path], check=False)


def _fill(path):
    """Fill the filesystem completely; returns the filler's path."""
    filler = os.path.join(path, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def test_full_disk_refuses_submits_and_loses_nothing(daemon_factory, users, tiny_state, scratch):
    d = daemon_factory("--state-reserve", "0")   # below 64M free every submit would be refused at once
    assert d.state_dir == tiny_state
    flag = os.path.join(scratch, "go")
    accepted = [d.submit("sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; exit {i}")
                for i in range(3)]
    filler = _fill(tiny_state)
    refused = 0
    for _ in range(5):
        r = d.dispatch("new", "--", "true")
        if r.returncode != 0:
            assert "nothing was queued" in r.stderr and r.stderr.count("\n") == 1
            refused += 1
    assert refused == 5
    assert d.proc.poll() is None
    open(flag, "w").close()            # jobs end while the disk is still full
    wait_for(lambda: "disk" in d.log() or "cannot" in d.log(), timeout=30, what="a logged write failure")
    os.unlink(filler)                  # space comes back: everything is recorded
    for i, job in enumerate(accepted):
        assert exit_of(d.wait_finished(job, timeout=60)) == str(i)
    rows = d.rows("--finished")
    assert sorted(rows) == accepted    # nothing refused was half-accepted
    assert d.submit("true") == accepted[-1] + 1

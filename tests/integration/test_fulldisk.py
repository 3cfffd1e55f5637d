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


@pytest.fixture
def small_state(scratch):
    path = os.path.join(scratch, "state")
    os.mkdir(path)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m,mode=0711", "tmpfs", path], check=True)
    yield path
    subprocess.run(["umount", "-l", path], check=False)


def test_cancels_of_big_commands_never_fill_the_state_disk(daemon_factory, users, small_state, scratch):
    """G8 (third review): alice submits 1 MB commands until refused, then cancels them all. Each
    cancel used to journal the whole command again: the state disk filled, the journal could no
    longer be written and bob was refused for good. A cancel now journals what changed."""
    alice, bob = users["alice"].pw_name, users["bob"].pw_name
    d = daemon_factory("--state-reserve", "8M", "--reserve-cpu", "0",
                       "--reserve-mem", "0", "--keep-finished", "50")
    hold = d.submit("sleep", "300", user=alice, cwd="/tmp", flags=("--no-output", "--name", "blocker"))
    d.wait_running(hold, user=alice)
    words = ["w" * 100_000] * 10
    taken = []
    for _ in range(60):
        r = d.dispatch("new", "--no-output", "--after", "blocker", "--", "true", *words, user=alice, cwd="/tmp")
        if r.returncode != 0:
            assert r.returncode == 9 and "reserve" in r.stderr, r.stderr
            break
        taken.append(int(r.stdout.split()[1]))
    else:
        raise AssertionError("60 MB of commands fitted a 48 MB state disk")
    journal = os.path.join(small_state, "journal")
    before = os.path.getsize(journal)
    d.ok("kill", *map(str, taken), user=alice)
    wait_for(lambda: all(" finished " in d.rows("--finished", str(j), user=alice).get(j, "") for j in taken),
             timeout=60, what="alice's cancels to be recorded")
    grown = os.path.getsize(journal) - before
    assert grown < len(taken) * 16_384, f"{len(taken)} cancels journalled {grown} bytes"
    assert "No space left" not in d.log() and "cannot write the journal" not in d.log(), d.log()[-2000:]
    d.ok("kill", str(hold), user=alice)
    wait_for(lambda: d.dispatch("new", "--no-output", "--", "true", user=bob).returncode == 0,
             timeout=60, interval=0.2, what="bob's submit to be taken")

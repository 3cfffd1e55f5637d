"""One start, one shepherd: the pidfile the daemon empties for each start says whether a shepherd
has taken it (launcher.claimed), and a second shepherd of the same start leaves it alone
(shepherd/main.py's _take_lock), whatever order they come in."""

import fcntl
import os
import threading
import time

from hpc_batch.daemon import launcher
from shepherd import main as shepherd_main
from shepherd.base import proc, records


def _empty_pidfile(job_dir):
    os.close(os.open(os.path.join(job_dir, records.PIDFILE), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def test_an_empty_unlocked_pidfile_is_a_start_no_shepherd_has_taken(tmp_path):
    _empty_pidfile(tmp_path)
    began = time.monotonic()
    assert launcher.claimed(str(tmp_path)) is None
    assert time.monotonic() - began < 0.25   # nobody holds the lock: nothing to wait for


def test_a_pid_in_the_pidfile_is_the_starts_shepherd_alive_or_not(tmp_path):
    (tmp_path / records.PIDFILE).write_text("4242 777\n")   # gone long ago: the caller's pidfd check says so
    assert launcher.claimed(str(tmp_path)) == (4242, 777)


def test_a_held_lock_is_waited_for_until_its_pid_is_written(tmp_path):
    _empty_pidfile(tmp_path)
    path = os.path.join(tmp_path, records.PIDFILE)
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        writer = threading.Timer(0.1, lambda: os.pwrite(fd, b"99 123\n", 0))
        writer.start()
        assert launcher.claimed(str(tmp_path), settle=5) == (99, 123)
        writer.join()
    finally:
        os.close(fd)


def test_a_held_lock_whose_pid_never_comes_is_waited_for_only_so_long(tmp_path):
    _empty_pidfile(tmp_path)
    fd = os.open(os.path.join(tmp_path, records.PIDFILE), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        began = time.monotonic()
        assert launcher.claimed(str(tmp_path), settle=0.2) is None
        assert 0.2 <= time.monotonic() - began < 2
    finally:
        os.close(fd)


def test_a_shepherd_takes_a_start_whose_pidfile_is_empty(tmp_path):
    _empty_pidfile(tmp_path)
    taken = shepherd_main._take_lock(str(tmp_path))
    assert taken is not None
    try:
        assert records.read_pidfile(str(tmp_path)) == (os.getpid(), proc.proc_starttime(os.getpid()))
    finally:
        os.close(taken[0])


def test_a_second_shepherd_leaves_a_start_another_had_and_its_records_alone(tmp_path):
    # The first shepherd ran the job and ended: its pid and exit record stay, the lock is free.
    (tmp_path / records.PIDFILE).write_text("4242 777\n")
    (tmp_path / records.EXIT).write_text('{"code": 7}')
    assert shepherd_main._take_lock(str(tmp_path)) is None
    assert (tmp_path / records.PIDFILE).read_text() == "4242 777\n"
    assert (tmp_path / records.EXIT).read_text() == '{"code": 7}'

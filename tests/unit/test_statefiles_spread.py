"""statefiles.spread_subdirectories: chattr +T on the state directory's jobs/, where the file system has it.

Checked against the real file system the test's directory is on (this host's ext4, or whatever a CI
machine has): on ext2, ext3 and ext4 the flag must be set, as ``lsattr`` reads it; on any other the
call must say False and change nothing.
"""

import os
import subprocess

from bench.benchkit import machine
from hpc_batch.daemon import statefiles
from hpc_batch.daemon.store import Store


def _ext(path):
    with open("/proc/self/mountinfo") as f:
        return machine.mount_of(str(path), f.read())[1] in ("ext2", "ext3", "ext4")


def _lsattr(path):
    return subprocess.run(["lsattr", "-d", str(path)], capture_output=True, text=True, check=True).stdout.split()[0]


def test_the_jobs_directory_of_a_store_is_the_top_of_unrelated_trees_where_the_file_system_has_the_flag(tmp_path):
    s = Store(str(tmp_path / "state"))
    s.open()
    jobs = tmp_path / "state" / "jobs"
    if _ext(tmp_path):
        assert "T" in _lsattr(jobs)
        assert statefiles.spread_subdirectories(str(jobs)) is True   # again: already set, still true
    else:
        assert statefiles.spread_subdirectories(str(jobs)) is False
    assert "T" not in _lsattr(tmp_path / "state")   # only jobs/: the rest of the layout stays together


def test_nothing_is_changed_through_a_link_on_a_file_or_on_a_machine_of_another_ioctl_encoding(tmp_path, monkeypatch):
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "file").write_text("")
    assert statefiles.spread_subdirectories(str(tmp_path / "link")) is False
    assert statefiles.spread_subdirectories(str(tmp_path / "file")) is False
    assert statefiles.spread_subdirectories(str(tmp_path / "absent")) is False
    assert "T" not in _lsattr(target)
    monkeypatch.setattr(statefiles.os, "uname", lambda: os.uname_result(("Linux", "h", "6.1", "#1", "ppc64le")))
    assert statefiles.spread_subdirectories(str(target)) is False
    assert "T" not in _lsattr(target)


def test_the_request_numbers_are_linux_fs_h_s_for_the_size_of_a_long():
    # include/uapi/linux/fs.h: FS_IOC_GETFLAGS _IOR('f', 1, long), FS_IOC_SETFLAGS _IOW('f', 2, long)
    want = {8: (0x80086601, 0x40086602), 4: (0x80046601, 0x40046602)}[statefiles._LONG]
    assert want == (statefiles.GETFLAGS, statefiles.SETFLAGS)

"""bench/benchkit/machine.py: the scratch directory's file system in the machine's table."""

import os

from bench.benchkit import machine

# Lines of /proc/self/mountinfo as read on the development host (2026-12-06), /dev/shm mounted twice
# as it was there, and one mount point with a space, escaped the way the kernel writes it.
MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=12334792k,nr_inodes=3083698,mode=755
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24683784k
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard,resv_strict,resuid=65534,resgid=65534
30 25 0:27 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24683784k
41 27 8:17 / /srv/scratch\\040disk rw,relatime shared:5 - xfs /dev/sdb1 rw,attr2
"""


def test_the_deepest_mount_holds_a_path_and_a_stacked_one_wins():
    assert machine.mount_of("/var/tmp/hpcb-bench-1", MOUNTINFO) == ("/", "ext4", "/dev/vda", "254:0")
    assert machine.mount_of("/dev/shm/x", MOUNTINFO) == ("/dev/shm", "tmpfs", "tmpfs", "0:27")
    assert machine.mount_of("/dev/null", MOUNTINFO)[0] == "/dev"
    assert machine.mount_of("/devices", MOUNTINFO)[0] == "/"        # a prefix of the name is not a parent
    assert machine.mount_of("/srv/scratch disk/b", MOUNTINFO) == ("/srv/scratch disk", "xfs", "/dev/sdb1", "8:17")
    assert machine.mount_of("/x", "garbage\n\n1 2 3 - only\n") is None


def _sysfs(tmp_path, task):
    """A /sys with /sys/dev/block/254:0 -> the vda device and ext4's journal_task for it."""
    dev = tmp_path / "devices" / "virtual" / "block" / "vda"
    dev.mkdir(parents=True)
    (tmp_path / "dev" / "block").mkdir(parents=True)
    os.symlink(dev, tmp_path / "dev" / "block" / "254:0")
    if task is not None:
        (tmp_path / "fs" / "ext4" / "vda").mkdir(parents=True)
        (tmp_path / "fs" / "ext4" / "vda" / "journal_task").write_text(task)
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    return str(info), str(tmp_path)


def test_an_ext4_without_a_journal_is_named_as_such(tmp_path):
    info, sys_root = _sysfs(tmp_path, "<none>\n")
    text = machine.file_system("/var/tmp", info, sys_root)
    assert text.startswith("ext4 (/dev/vda) mounted at /, without a journal: ")
    assert "recently deleted inode" in text


def test_a_journalled_ext4_and_other_file_systems_say_only_what_they_are(tmp_path):
    info, sys_root = _sysfs(tmp_path, "jbd2/vda-8\n")
    assert machine.file_system("/var/tmp", info, sys_root) == "ext4 (/dev/vda) mounted at /, journalled"
    assert machine.file_system("/dev/shm/x", info, sys_root) == "tmpfs (tmpfs) mounted at /dev/shm"


def test_what_cannot_be_read_is_said_plainly(tmp_path):
    info, sys_root = _sysfs(tmp_path, None)          # no journal_task: nothing said of a journal
    assert machine.file_system("/var/tmp", info, sys_root) == "ext4 (/dev/vda) mounted at /"
    assert machine.file_system("/var/tmp", str(tmp_path / "absent"), sys_root) == "unknown"

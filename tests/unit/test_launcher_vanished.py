"""The note of a job whose shepherd is gone at recovery: a pidfile older than this boot names the
machine's restart (a power cut), anything else the shepherd's death."""

import os

from hpc_batch.daemon import launcher
from shepherd.base import records


def _pidfile(tmp_path, mtime=None):
    path = tmp_path / records.PIDFILE
    path.write_text("4242 123\n")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return str(tmp_path)


def test_a_pidfile_from_before_this_boot_says_the_machine_restarted(tmp_path):
    assert "the machine restarted while it ran" in launcher.vanished(_pidfile(tmp_path, mtime=1.0))


def test_a_pidfile_of_this_boot_says_the_shepherd_vanished(tmp_path):
    assert "shepherd was killed or vanished" in launcher.vanished(_pidfile(tmp_path))


def test_no_pidfile_says_the_shepherd_vanished(tmp_path):
    assert "shepherd was killed or vanished" in launcher.vanished(str(tmp_path))

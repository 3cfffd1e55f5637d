"""--metrics-file's directory (F11) and the file's mode (F6): who may write there, who reads the file."""

import grp
import logging
import os
import stat

import pytest
from ci_host import require

from hpc_batch.daemon import metrics_file
from hpc_batch.daemon.metrics_file import MetricsError, check, others_may_write, write_atomic


@pytest.fixture(autouse=True)
def _as_root():
    require(os.geteuid() == 0, "chown and other owners need root")


def some_group():
    """A group other than root's, for the group-writable cases."""
    for name in ("hpcb-admins", "adm", "users", "nogroup"):
        try:
            return grp.getgrnam(name)
        except KeyError:
            continue
    require(False, "no group other than root to test with")


@pytest.fixture
def textdir(tmp_path):
    d = tmp_path / "textfile"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    os.chmod(tmp_path, 0o755)
    return d


def test_a_root_only_directory_is_accepted(textdir):
    assert others_may_write(str(textdir), 0) is None
    assert check(str(textdir / "m.prom")) == (str(textdir / "m.prom"), os.stat(textdir).st_gid)


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o757])
def test_a_directory_anyone_can_write_is_refused_in_one_line(textdir, mode):
    os.chmod(textdir, mode)
    with pytest.raises(MetricsError) as info:
        check(str(textdir / "m.prom"))
    msg = str(info.value)
    assert str(textdir) in msg and "writable by everyone" in msg and "\n" not in msg


def test_a_group_may_write_only_when_named_as_the_metrics_group(textdir):
    g = some_group()
    os.chown(textdir, 0, g.gr_gid)
    os.chmod(textdir, 0o775)
    with pytest.raises(MetricsError) as info:
        check(str(textdir / "m.prom"))
    assert f"writable by its group {g.gr_name}" in str(info.value)
    assert check(str(textdir / "m.prom"), g.gr_name) == (str(textdir / "m.prom"), g.gr_gid)
    with pytest.raises(MetricsError, match="no such group"):
        check(str(textdir / "m.prom"), "no-such-group-hpcb")


def test_a_directory_of_another_user_or_under_a_writable_parent_is_refused(textdir, tmp_path):
    os.chown(textdir, 65534, -1)
    assert "belongs to uid 65534" in others_may_write(str(textdir), 0)
    os.chown(textdir, 0, -1)
    os.chmod(tmp_path, 0o777)           # anyone could rename textdir away and put their own in its place
    assert "writable by everyone" in others_may_write(str(textdir), 0)
    os.chmod(tmp_path, 0o1777)          # sticky, like /tmp: only root may rename root's directory
    assert others_may_write(str(textdir), 0) is None


def test_an_acl_letting_a_user_write_is_refused(textdir):
    # user::rwx, user:65534:rwx, group::r-x, mask::rwx, other::r-x (the kernel's xattr blob)
    import struct
    blob = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *x) for x in (
        (0x01, 7, 0xFFFFFFFF), (0x02, 7, 65534), (0x04, 5, 0xFFFFFFFF), (0x10, 7, 0xFFFFFFFF),
        (0x20, 5, 0xFFFFFFFF)))
    try:
        os.setxattr(textdir, "system.posix_acl_access", blob)
    except OSError:
        require(False, "no ACLs on the filesystem of the test's temporary directory")
    assert "uid 65534 write" in others_may_write(str(textdir), 0)


def test_the_file_is_0640_in_its_group_and_the_temporary_name_cannot_be_foreseen(textdir, monkeypatch):
    g = some_group()
    path = str(textdir / "m.prom")
    seen = []
    real = metrics_file.records.write_atomic

    def spy(*a, **kw):
        seen.append(kw["tmp"])
        return real(*a, **kw)
    monkeypatch.setattr(metrics_file.records, "write_atomic", spy)
    write_atomic(path, b"a 1\n", g.gr_gid)
    write_atomic(path, b"a 2\n", g.gr_gid)
    st = os.stat(path)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, g.gr_gid, 0o640)
    assert len(set(seen)) == 2 and all(os.path.basename(t).startswith(".m.prom.") for t in seen)
    assert str(os.getpid()) not in "".join(seen)
    assert os.listdir(textdir) == ["m.prom"]


def test_stale_temporary_files_are_cleared_at_start(textdir, caplog):
    for name in (".m.prom.1234.tmp", ".m.prom.0123456789abcdef.tmp"):
        (textdir / name).write_text("half")
    (textdir / ".other.prom.1.tmp").write_text("not ours to clear")
    (textdir / ".m.prom.d.tmp").mkdir()          # not a plain file: left
    metrics_file.remove_stale_temps(str(textdir / "m.prom"))
    assert sorted(os.listdir(textdir)) == [".m.prom.d.tmp", ".other.prom.1.tmp"]


def test_a_root_group_file_is_warned_about(textdir, caplog):
    os.chown(textdir, 0, 0)
    with caplog.at_level(logging.WARNING, "hpc-batchd"):
        check(str(textdir / "m.prom"))
    assert "--metrics-group" in caplog.text

"""hpc_batch/client/posixcalls.py: the client's calls without os give what os gives."""

import os
import subprocess
import sys

import pytest

from hpc_batch.client import posixcalls

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("path", ["", "/", "//", "///", "a", "a/", "a/b", "a/b/", "/a", "/a/b", "/a/b//",
                                  "//a", "a//b", "./x", "../x/y", "/a/./b", "\udcff/x"])
def test_dirname_is_os_paths(path):
    assert posixcalls.dirname(path) == os.path.dirname(path)


def test_is_dir_is_os_paths(tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    (tmp_path / "to-d").symlink_to(tmp_path / "d")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name in ("f", "d", "to-d", "dangling", "missing", "f/below"):
        path = str(tmp_path / name)
        assert posixcalls.is_dir(path) == os.path.isdir(path), name
    assert posixcalls.is_dir("a\0b") is False     # os.path.isdir says False for a NUL too


def test_the_environment_reads_as_os_environ_reads_it():
    # A child with undecodable bytes in a name and a value: both sides must read them the same way.
    env = {b"PATH": b"/usr/bin:/bin", b"HPCB_T\xff": b"v\xfe", b"HPCB_EMPTY": b"", b"LANG": b"C.UTF-8"}
    code = ("import os, sys; sys.path.insert(0, %r); from hpc_batch.client import posixcalls as p; "
            "assert p.environ() == dict(os.environ), (p.environ(), dict(os.environ)); "
            "assert all(p.getenv(k) == v for k, v in os.environ.items()); "
            "assert p.getenv('HPCB_ABSENT') is None; print('same')") % ROOT
    r = subprocess.run([sys.executable, "-I", "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "same"

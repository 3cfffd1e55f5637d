"""The installer's version layout: a copied venv points at itself, the prefix switches in one rename, old ones go."""

import os
import sys
from pathlib import Path

import pytest

from hpc_batch.install import versions


class Notes:
    def __init__(self):
        self.lines = []

    def note(self, message):
        self.lines.append(message)


def fake_venv(path: Path, version: str) -> Path:
    """A venv's shape: bin/python, a script whose #! names the venv, pyvenv.cfg, a version file."""
    (path / "bin").mkdir(parents=True)
    os.symlink(sys.executable, path / "bin" / "python")
    (path / "bin" / "dispatch").write_text(f"#!{path}/bin/python -S\nsys.path += ['{path}/lib/site']\n")
    os.chmod(path / "bin" / "dispatch", 0o755)
    (path / "pyvenv.cfg").write_text(f"home = /usr/bin\ncommand = /usr/bin/python3 -m venv {path}\n")
    (path / "VERSION").write_text(version)
    return path


def test_relocate_points_the_copy_at_itself(tmp_path):
    old = fake_venv(tmp_path / "hb", "1")
    new = tmp_path / "hb.versions" / "2"
    import shutil
    shutil.copytree(old, new, symlinks=True)
    versions.relocate(new, old)
    script = (new / "bin" / "dispatch").read_text()
    assert script.startswith(f"#!{new}/bin/python -S\n") and f"'{new}/lib/site'" in script
    assert str(old) + "/" not in script
    assert os.stat(new / "bin" / "dispatch").st_mode & 0o777 == 0o755
    assert (new / "pyvenv.cfg").read_text().endswith(f"-m venv {new}\n")
    assert os.readlink(new / "bin" / "python") == sys.executable
    assert (old / "bin" / "dispatch").read_text().startswith(f"#!{old}/bin/python")


def test_switch_flips_a_link_and_moves_the_older_layout_in(tmp_path):
    prefix = tmp_path / "hb"
    legacy = fake_venv(prefix, "1")
    assert versions.current(prefix) == legacy
    first = fake_venv(versions.versions_dir(prefix) / "a", "2")
    notes = Notes()
    before = versions.switch(prefix, first, notes)
    # The venv that was the prefix is kept under .versions, whole, and the prefix is a link.
    assert prefix.is_symlink() and versions.current(prefix) == first
    assert before is not None and before.parent == versions.versions_dir(prefix)
    assert (before / "VERSION").read_text() == "1"
    assert not os.path.lexists(tmp_path / ".hb.switch")

    second = fake_venv(versions.versions_dir(prefix) / "b", "3")
    assert versions.switch(prefix, second, notes) == first
    assert (prefix / "VERSION").read_text() == "3"
    assert not os.path.isabs(os.readlink(prefix))   # relative: the tree can be moved whole


def test_prune_keeps_the_current_venv_and_those_in_use(tmp_path):
    prefix = tmp_path / "hb"
    vdir = versions.versions_dir(prefix)
    live, used, stale, partial = (fake_venv(vdir / n, n) for n in ("live", "used", "stale", "partial"))
    os.symlink("hb.versions/live", prefix)
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cmdline").write_bytes(f"{used}/bin/python\0-E\0shepherd.py\0".encode())
    (proc / "self").mkdir()
    notes = Notes()
    versions.prune(prefix, notes, proc=proc)
    assert sorted(p.name for p in vdir.iterdir()) == ["live", "used"]
    assert any("running process" in line for line in notes.lines)
    assert live.is_dir() and used.is_dir() and not stale.exists() and not partial.exists()


@pytest.mark.parametrize("layout", ["link", "venv"])
def test_check_prefix_refuses_what_is_not_a_venv(tmp_path, layout):
    from hpc_batch.install.common import InstallError
    from hpc_batch.install.steps import check_prefix
    prefix = tmp_path / "hb"
    check_prefix(prefix)    # missing: fine, created
    if layout == "link":
        os.symlink("elsewhere", prefix)
    else:
        prefix.mkdir()
        (prefix / "notes.txt").write_text("mine")
    with pytest.raises(InstallError, match="is not a venv"):
        check_prefix(prefix)

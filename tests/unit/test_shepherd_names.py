"""No module of shepherd/ may take a standard-library module's name.

The shepherd and its fork server run as a plain file
(``python -E -s -S shepherd/hpc-batch-shepherd.py``), so the shepherd's
directory is first on sys.path and its modules are imported top-level: a
``shepherd/signal.py`` would be what ``import signal`` finds there, in the
shepherd and in every library module it imports.
"""

import os
import sys

import pytest

import shepherd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def top_level_names(directory: str) -> set:
    """The names ``import NAME`` finds in *directory* when it is on sys.path."""
    names = set()
    for entry in os.listdir(directory):
        path = os.path.join(directory, entry)
        stem, dot, suffix = entry.partition(".")
        if os.path.isdir(path) and entry.isidentifier() and entry != "__pycache__":
            names.add(entry)                     # a package (or a namespace package)
        elif dot and stem.isidentifier() and (suffix in ("py", "so") or suffix.endswith(".so")):
            names.add(stem)
    return names


def stdlib_shadows(directory: str) -> list:
    """The names in *directory* that a standard-library module also has."""
    return sorted(top_level_names(directory) & set(sys.stdlib_module_names))


@pytest.mark.parametrize("directory", [os.path.join(ROOT, "shepherd"), os.path.dirname(shepherd.__file__)],
                         ids=["checkout", "installed"])
def test_no_shepherd_module_shadows_the_standard_library(directory):
    assert "main" in top_level_names(directory)        # the directory is the shepherd's
    assert stdlib_shadows(directory) == []


def test_a_shadowing_name_is_found(tmp_path):
    for name in ("signal.py", "select.cpython-311-x86_64-linux-gnu.so", "records.py", "hpc-batch-shepherd.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "json").mkdir()
    assert stdlib_shadows(str(tmp_path)) == ["json", "select", "signal"]

"""The wheel carries what an install needs: the unit, the shepherd, the entry points."""

import os
import re
import subprocess
import sys
import zipfile

import pytest

from hpc_batch import __version__

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), ROOT],
                   check=True, capture_output=True)
    (path,) = [p for p in out.iterdir() if p.suffix == ".whl"]
    return path


def test_wheel_name_carries_the_single_version(wheel):
    assert wheel.name.startswith(f"hpc_batch-{__version__}-")


def test_wheel_contents(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("hpc_batch/data/hpc-batch.service", "hpc_batch/daemon/main.py", "hpc_batch/client/cli.py",
                   "shepherd/main.py", "shepherd/hpc-batch-shepherd.py", "hpc_batch/install/__init__.py"):
        assert needed in names, needed
    dist = f"hpc_batch-{__version__}.dist-info"
    assert any(n.startswith(dist) and n.endswith("LICENSE") for n in names)
    eps = zipfile.ZipFile(wheel).read(f"{dist}/entry_points.txt").decode()
    for script in ("hpc-batchd", "hpc-batch-shepherd", "hpc-batch-install"):
        assert f"{script} = " in eps
    # dispatch is a plain script (no console-script wrapper and its import of re), its first line
    # left for the installer to point at the venv's python.
    script = zipfile.ZipFile(wheel).read(f"hpc_batch-{__version__}.data/scripts/dispatch").decode()
    assert script.startswith("#!python\n") and "from hpc_batch.client.cli import leave, main" in script
    assert "dispatch = " not in eps
    unit = zipfile.ZipFile(wheel).read("hpc_batch/data/hpc-batch.service").decode()
    for line in ("Delegate=cpuset memory pids", "KillMode=process", "RestartPreventExitStatus=78"):
        assert line in unit


def test_the_manual_pages_are_in_the_wheel_as_in_the_tree(wheel):
    # hpc-batch-install installs them from the venv's copy (hpc_batch/install/manpages.py).
    from hpc_batch.install import manpages
    with zipfile.ZipFile(wheel) as z:
        for page in manpages.PAGES:
            with open(os.path.join(ROOT, *manpages.DATA, page), "rb") as f:
                assert z.read("/".join((*manpages.DATA, page))) == f.read(), page


def test_the_psij_descriptor_is_where_psij_looks(wheel):
    # PSI/J imports every module of the psij-descriptors namespace package (no __init__.py) and
    # loads the class it names by path, from the same site-packages.
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "psij-descriptors/hpc_batch.py" in names and "psij-descriptors/__init__.py" not in names
    assert "dist/psij-descriptors/hpc_batch.py" not in names and "hpc_batch/psij/executor.py" in names
    text = zipfile.ZipFile(wheel).read("psij-descriptors/hpc_batch.py").decode()
    assert "__PSI_J_EXECUTORS__" in text and 'cls="hpc_batch.psij.executor.HpcBatchJobExecutor"' in text
    dist = f"hpc_batch-{__version__}.dist-info"
    meta = zipfile.ZipFile(wheel).read(f"{dist}/METADATA").decode()
    assert "Provides-Extra: psij" in meta
    assert any(re.fullmatch(r"""Requires-Dist: psij-python>=[0-9.]+; extra == ["']psij["']""", line)
               for line in meta.splitlines())


def test_metadata_license_and_dependencies(wheel):
    dist = f"hpc_batch-{__version__}.dist-info"
    meta = zipfile.ZipFile(wheel).read(f"{dist}/METADATA").decode()
    assert "License-Expression: AGPL-3.0-or-later" in meta
    requires = sorted(line.split()[1] for line in meta.splitlines()
                      if line.startswith("Requires-Dist:") and "extra ==" not in line)
    assert requires == ["docopt-ng"]
    # --metrics-file's prometheus_client is an extra, never a dependency of the core.
    assert any(line.startswith("Requires-Dist: prometheus-client") and "extra == 'metrics'" in line.replace('"', "'")
               for line in meta.splitlines())

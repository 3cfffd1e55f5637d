"""clientscript: the installed dispatch rewritten to start without the site import.

The scripts here are pip's (``#!PYTHON`` and the packaged body) for this
test venv's python, rewritten and run for real: against a socket that does
not exist, so the parse, the imports and the connect attempt all happen.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_batch.install import clientscript

PACKAGED = Path(__file__).resolve().parents[2] / "hpc_batch" / "data" / "dispatch"
# Run by the rewritten script's python, in place of the client: what it was started with.
SPY = "import sys; print(sys.flags.no_site, 'site' in sys.modules, sys.modules['hpc_batch'].__file__)\n"


def _pip_script(tmp_path: Path, python: str = sys.executable) -> Path:
    """The packaged dispatch as pip installs it: first line pointed at *python*."""
    body = PACKAGED.read_text().split("\n", 1)[1]
    script = tmp_path / "dispatch"
    script.write_text(f"#!{python}\n{body}")
    script.chmod(0o755)
    return script


def _run(script: Path, *args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HPC_BATCH_SOCKET=str(tmp_path / "none.sock"))
    return subprocess.run([str(script), *args], env=env, capture_output=True, text=True, cwd=str(tmp_path),
                          timeout=60)


def test_rewritten_script_starts_without_site_and_runs_the_client(tmp_path):
    script = _pip_script(tmp_path)
    mode = script.stat().st_mode
    assert clientscript.rewrite(script) == sys.executable
    text = script.read_text()
    assert text.startswith(f"#!{sys.executable} -S\n") and clientscript.MARK in text
    assert script.stat().st_mode == mode
    for args in (["list"], ["new", "--no-output", "--", "true"]):
        r = _run(script, *args, tmp_path=tmp_path)
        assert r.returncode == 69 and "cannot reach hpc-batchd" in r.stderr, (args, r.stderr)
    r = _run(script, "--version", tmp_path=tmp_path)   # docopt's path: found on the written sys.path
    assert r.returncode == 0 and r.stdout.startswith("dispatch ")
    # The interpreter really skipped site, and found the hpc_batch the venv's python finds.
    spy = tmp_path / "spy"
    spy.write_text(text.replace("from hpc_batch.client.cli import leave, main", "import hpc_batch; main = None")
                   .replace("leave(main())", SPY))
    spy.chmod(0o755)
    installed = subprocess.run([sys.executable, "-I", "-c", "import hpc_batch; print(hpc_batch.__file__)"],
                               capture_output=True, text=True, cwd=str(tmp_path)).stdout.strip()
    assert _run(spy, tmp_path=tmp_path).stdout.split() == ["1", "False", installed]


def test_rewriting_again_gives_the_same_script(tmp_path):
    script = _pip_script(tmp_path)
    clientscript.rewrite(script)
    first = script.read_text()
    clientscript.rewrite(script)
    assert script.read_text() == first


def test_a_script_whose_paths_went_stale_falls_back_to_site(tmp_path):
    script = _pip_script(tmp_path)
    clientscript.rewrite(script)
    text = script.read_text()
    start = text.index("sys.path += [")
    end = text.index("]\n", start)
    script.write_text(text[:start] + "sys.path += ['/nonexistent/site-packages'" + text[end:])
    r = _run(script, "list", tmp_path=tmp_path)
    assert r.returncode == 69 and "cannot reach hpc-batchd" in r.stderr, r.stderr


@pytest.mark.parametrize("first", ["#!/bin/sh", "#!python", "#!/usr/bin/env python3", "import sys"])
def test_a_first_line_that_is_not_a_plain_python_is_left_alone(tmp_path, first):
    script = tmp_path / "dispatch"
    script.write_text(f"{first}\nprint('hi')\n")
    with pytest.raises(clientscript.Declined):
        clientscript.rewrite(script)
    assert script.read_text() == f"{first}\nprint('hi')\n"


def test_a_python_that_cannot_import_the_client_is_left_alone(tmp_path):
    # The base interpreter of this venv (no site-packages of ours), found through a link.
    base = os.path.realpath(sys.executable)
    probe = subprocess.run([base, "-I", "-c", "import hpc_batch"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{base} imports hpc_batch itself")
    script = _pip_script(tmp_path, base)
    before = script.read_text()
    with pytest.raises(clientscript.Declined, match="cannot import"):
        clientscript.rewrite(script)
    assert script.read_text() == before


def test_a_python_path_too_long_or_with_blanks_for_a_flag_is_refused():
    with pytest.raises(clientscript.Declined):
        clientscript.render("/opt/my venv/bin/python", [])
    with pytest.raises(clientscript.Declined):
        clientscript.render("/" + "v" * 130 + "/bin/python", [])
    assert clientscript.render("/opt/hpc-batch/bin/python", ["/x"]).startswith("#!/opt/hpc-batch/bin/python -S\n")


def test_the_module_finds_the_installed_script_and_says_why_it_declines(tmp_path, capsys):
    found = clientscript.installed_script()
    assert found is not None and found.name == "dispatch" and found.is_file()
    odd = tmp_path / "dispatch"
    odd.write_text("#!/bin/sh\nexit 0\n")
    assert clientscript.main([str(odd)]) == 0
    assert "left" in capsys.readouterr().err
    assert clientscript.main([str(tmp_path / "missing")]) == 1

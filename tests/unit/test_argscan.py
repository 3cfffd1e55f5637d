"""argscan: the docopt-free parse of ``dispatch new`` must be docopt's, or step aside.

Each argument list is parsed by both: where the fast path answers, its
dict must equal docopt's; where docopt refuses, the fast path must return
None (so docopt prints the usage error). A subprocess then checks what the
fast path is for: ``dispatch new`` imports none of the heavy modules.
"""

import os
import subprocess
import sys

import pytest
from docopt import DocoptExit, docopt

from hpc_batch.client import argscan
from hpc_batch.client.cli_usage import NEW_USAGE

CASES = [
    "new -- true", "new true", "new - a", "new --cpu 2 -- sleep 1", "new --cpu=2 --json echo hi",
    "new --max-mem 5G --max-time 1h --exclusive --numa-local --env -- a b c",
    "new --name foo --after 1,2 -- x", "new --gpu-cores 2 --gpu-link NV -- a", "new --output=/tmp/o -- a",
    "new --wait --after-ok 3 -- a", "new -- -x --y", "new -- a -- b", "new --name --json -- a",
    "new --no-output --numa-local-gpu --numa-local-mem -- a", "new --array 1-10%2 -- a",
    "new --output x --no-output -- a",   # docopt takes both; dispatch refuses the pair itself
    # docopt's business: errors, help, abbreviations, options after the command
    "new echo --cpu 2", "new --cpu", "new --cpu 2", "new --cpu --",
    "new --excl -- a", "new -h", "new --help", "new --cpu 1 --cpu 2 -- a", "new --json=1 -- a",
    "new A=1 B=2 -- env", "new a -- b", "new --bogus -- a", "new", "list",
]


def _docopt(argv):
    try:
        return dict(docopt(NEW_USAGE, argv=argv))
    except (DocoptExit, SystemExit):
        return None


@pytest.mark.parametrize("line", CASES)
def test_fast_path_is_docopt_or_steps_aside(line, capsys):
    argv = line.split()
    fast = argscan.scan(argv, "new", NEW_USAGE)
    slow = _docopt(argv)
    if slow is None:
        assert fast is None
    elif fast is not None:
        assert fast == slow


def test_common_forms_take_the_fast_path():
    for line in ("new -- true", "new --cpu 2 --max-mem 4G -- python train.py", "new --no-output -- true"):
        assert argscan.scan(line.split(), "new", NEW_USAGE) is not None, line


def test_options_table_reads_defaults_from_the_usage():
    table = {o.key: o for o in argscan.options(NEW_USAGE)}
    assert table["--gpu-cores"].takes_value and table["--gpu-cores"].default == "0"
    assert table["--output"].default == "./output.<id>.log"
    assert not table["--exclusive"].takes_value and table["--help"].names == ["-h", "--help"]


def test_dispatch_new_imports_nothing_heavy(tmp_path):
    # Against a socket that does not exist: the parse and the connect attempt both run.
    code = ("import sys; from hpc_batch.client.cli import main; rc = main(['new', '--no-output', '--', 'true']); "
            "print(' '.join(sorted(m for m in ('docopt', 're', 'typing', 'json', 'socket', 'enum') "
            "if m in sys.modules)))")
    env = dict(os.environ, HPC_BATCH_SOCKET=str(tmp_path / "none.sock"))
    r = subprocess.run([sys.executable, "-I", "-c", code], env=env, capture_output=True, text=True,
                       cwd=str(tmp_path), timeout=60)
    assert "cannot reach hpc-batchd" in r.stderr
    assert r.stdout.strip() == ""

"""Every shell block of docs/usage.md and docs/development.md tagged ``sh runnable`` runs as written.

The blocks of one page run in order, each in its own ``bash -e``, as the test
user alice, in one working directory of hers (so a later block finds what an
earlier one left), against a scratch daemon (``$HPC_BATCH_SOCKET``), with the
test venv's ``dispatch`` and ``hpc-batchd`` first on ``PATH``, as after
``PATH=$(./scripts/try --print-bin):$PATH``. ``./scripts/try`` is there too (a
copy: the checkout may be out of alice's reach), using the test venv as it is
(``HPC_BATCH_TRY_VENV``) rather than building one. ``mktemp`` makes its
directories under the test's scratch directory, and whatever a block leaves
running (a daemon it started) is ended with its process group.

A failure names the page and the line of the block's opening fence. Which
blocks are marked, and why the others are not, is said in the pages.
"""

import os
import shutil
import signal
import subprocess
from pathlib import Path

import docblocks
import pytest
from conftest import BIN

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["docs/usage.md", "docs/development.md"]


def _run(block, cwd, user, env):
    p = subprocess.Popen(["runuser", "-u", user, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                          "bash", "-e", "-c", block.text], cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        out = "(killed after 120s)"
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)     # what the block left running
        except ProcessLookupError:
            pass
        p.wait()
    return p.returncode, out


@pytest.mark.parametrize("page", PAGES)
def test_the_runnable_blocks_of_a_page_run_in_order(page, daemon, users, scratch):
    blocks = docblocks.runnable_blocks((ROOT / page).read_text())
    assert blocks, f"{page} has no ```sh runnable block"
    alice = users["alice"]
    home = os.path.join(scratch, "reader")
    tmp = os.path.join(home, "tmp")
    os.makedirs(os.path.join(home, "scripts"))
    os.mkdir(tmp)
    shutil.copy(ROOT / "scripts" / "try", os.path.join(home, "scripts", "try"))
    for d, _, files in os.walk(home):
        for p in [d, *(os.path.join(d, f) for f in files)]:
            os.chown(p, alice.pw_uid, alice.pw_gid)
    env = {"PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
           "USER": alice.pw_name, "SHELL": "/bin/sh", "TMPDIR": tmp,
           "HPC_BATCH_SOCKET": daemon.socket, "HPC_BATCH_TRY_VENV": os.path.dirname(BIN)}
    for block in blocks:
        status, out = _run(block, home, alice.pw_name, env)
        assert status == 0, (f"{page}:{block.line}: the block exits {status}\n--- block:\n{block.text}"
                             f"--- its output:\n{out}\n--- daemon log:\n{daemon.log()}")


def test_a_failing_block_is_reported_with_its_status(users, scratch):
    # The runner itself: under bash -e a failing line fails the block, and it runs as the test user.
    alice = users["alice"]
    home = os.path.join(scratch, "reader")
    os.mkdir(home)
    os.chown(home, alice.pw_uid, alice.pw_gid)
    env = {"PATH": "/usr/bin:/bin", "HOME": home}
    assert _run(docblocks.Block(1, "false\necho not reached\n"), home, alice.pw_name, env) == (1, "")
    assert _run(docblocks.Block(1, "id -un\n"), home, alice.pw_name, env) == (0, f"{alice.pw_name}\n")

"""argscan: the docopt-free parse of ``dispatch new`` and ``list`` must be docopt's, or step aside.

Each argument list is parsed by both: where the fast path answers, its
dict must equal docopt's; where docopt refuses, the fast path must return
None (so docopt prints the usage error). A subprocess then checks what the
fast path is for: ``dispatch new`` imports none of the heavy modules.
"""

import os
import socket
import subprocess
import sys
import threading

import pytest
from docopt import DocoptExit, docopt
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc_batch.client import argscan
from hpc_batch.client.cli_usage import LIST_USAGE, NEW_USAGE

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


def _docopt(argv, usage=NEW_USAGE):
    try:
        return dict(docopt(usage, argv=argv))
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


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAVY = ('docopt', 're', 'typing', 'json', 'socket', 'enum', 'shlex')


# What the site import loads anyway, so only an interpreter started as dispatch is (-S) can show them
# kept out: os and its helpers, a millisecond of every submit and listing (client/posixcalls.py).
HEAVY_WITHOUT_SITE = ('os', '_collections_abc', 'posixpath', 'shepherd.base.records')


def _heavy_loaded(tmp_path, args, sock, heavy=HEAVY, flags=("-I",)):
    """The *heavy* modules a fresh interpreter has loaded after ``main(args)`` against *sock*."""
    # -I keeps the user's site out; this checkout goes first on the path, as the tree is what is tested.
    code = (f"import sys; sys.path.insert(0, {ROOT!r}); from hpc_batch.client.cli import main; rc = main({args!r}); "
            f"print(' '.join(sorted(m for m in {heavy!r} if m in sys.modules)))")
    env = dict(os.environ, HPC_BATCH_SOCKET=str(sock))
    return subprocess.run([sys.executable, *flags, "-c", code], env=env, capture_output=True, text=True,
                          cwd=str(tmp_path), timeout=60)


@pytest.mark.parametrize("args", [["new", "--no-output", "--", "true"], ["list"], ["list", "--all", "3"]])
def test_dispatch_new_and_list_import_nothing_heavy(tmp_path, args):
    # Against a socket that does not exist: the parse and the connect attempt both run.
    r = _heavy_loaded(tmp_path, args, tmp_path / "none.sock")
    assert "cannot reach hpc-batchd" in r.stderr
    assert r.stdout.strip() == ""


def _heavy_loaded_against_a_stand_in(tmp_path, args, result, **run):
    """``(ops the stand-in daemon was sent, the run)``: ``main(args)`` against a stand-in that
    answers each request with *result*, as hpc-batchd would, so the reply's path runs too
    (*run*: :func:`_heavy_loaded`'s *heavy* and *flags*)."""
    from hpc_batch.wire import framing, messages
    path = tmp_path / "d.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(60)

    asked = []   # the ops the stand-in was sent: checked by the caller, as an assert in its thread fails nothing

    def answer():
        conn, _ = server.accept()
        with conn:
            decoder = framing.Decoder()
            while True:
                while (msg := decoder.next()) is None:
                    data = conn.recv(1 << 16)
                    if not data:
                        return
                    decoder.feed(data)
                asked.append(msg["op"])
                conn.sendall(framing.encode(messages.ok(**result)))

    daemon = threading.Thread(target=answer, daemon=True)
    daemon.start()
    try:
        r = _heavy_loaded(tmp_path, args, path, **run)
    finally:
        daemon.join(60)
        server.close()
    return asked, r


@pytest.mark.parametrize("args", [["new", "--no-output", "--", "true"], ["new", "--", "true"]])
def test_a_submit_and_its_reply_import_nothing_heavy(tmp_path, args):
    result = {"id": 3, "state": "running", "mem": 1 << 30, "mem_assigned": True, "mem_enforced": True}
    if "--no-output" not in args:
        result["output"] = str(tmp_path / "output.3.log")
    asked, r = _heavy_loaded_against_a_stand_in(tmp_path, args, result)
    assert asked == ["new"]
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("job 3 running; memory budget 1G (assigned by default)")
    assert r.stdout.splitlines()[-1].strip() == ""


def test_a_list_and_its_rows_import_nothing_heavy(tmp_path):
    # A finished job's row is formatted by the client (core/listrows.py), its verdict checked against the
    # record's words: that module once took shepherd.base.records, and with it signal and enum, into
    # every `dispatch list`.
    row = {"id": 4, "user": "alice", "command": "true", "state": "finished", "started": 1000.0,
           "ended": 1002.0, "max_time": 86400, "mem": 1 << 30, "cpus": [0], "exit": "0",
           "stats": {"cpu_time": 0.5, "peak_mem": 1 << 20, "verdict": "clean"}}
    asked, r = _heavy_loaded_against_a_stand_in(tmp_path, ["list", "--finished"],
                                                 {"rows": ["alice 3 true - queued 1d 1G no - -", row]})
    assert asked == ["list"]
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "alice 3 true - queued 1d 1G no - -"
    assert lines[1].startswith("alice 4 true ") and " clean finished 0" in lines[1], lines
    assert lines[-1].strip() == ""


FINISHED_ROW = {"id": 4, "user": "alice", "command": "true", "state": "finished", "started": 1000.0,
                "ended": 1002.0, "max_time": 86400, "mem": 1 << 30, "cpus": [0], "exit": "0",
                "stats": {"cpu_time": 0.5, "peak_mem": 1 << 20, "verdict": "clean"}}


@pytest.mark.parametrize("args,result,first", [
    (["new", "--", "true"], {"id": 3, "state": "running", "mem": 1 << 30, "mem_assigned": True,
                             "mem_enforced": True, "output": "OUT"}, "job 3 running; memory budget 1G"),
    (["new", "--no-output", "--env", "--", "true"], {"id": 3, "state": "queued", "mem": 1 << 30,
                                                     "mem_assigned": True, "mem_enforced": True},
     "job 3 queued; memory budget 1G"),
    (["list", "--finished"], {"rows": ["alice 3 true - queued 1d 1G no - -", FINISHED_ROW]},
     "alice 3 true - queued 1d 1G no - -"),
])
def test_a_submit_and_a_list_run_as_dispatch_keep_os_out(tmp_path, args, result, first):
    result = {k: str(tmp_path / "output.3.log") if v == "OUT" else v for k, v in result.items()}
    asked, r = _heavy_loaded_against_a_stand_in(tmp_path, args, result, heavy=HEAVY_WITHOUT_SITE,
                                                flags=("-I", "-S"))
    assert asked == [args[0]]
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(first), r.stdout
    assert r.stdout.splitlines()[-1].strip() == "", r.stdout


LIST_CASES = [
    "list", "list --all", "list --finished --json", "list --json --all --finished", "list 5", "list 3-7 foo",
    "list 3 --all", "list --all bob:x 4 --json", "list ''",
    # docopt's business: help, abbreviations, repeats, values, short options, "--", "-"
    "list -h", "list --help", "list --al", "list --fin", "list --all --all", "list --all=1", "list -- -3",
    "list 3 -4", "list -", "list --bogus", "list --", "new -- true", "status",
    # --format takes a value: either way it is written; the short -o, a missing or option-like value are docopt's
    "list --format id,state", "list --format=id 3", "list 3 --no-header --format id --all", "list --format",
    "list -o id", "list -oid", "list --format --all", "list --format=", "list --format id --format id",
    "list --no-header=1", "list --form id",
]


@pytest.mark.parametrize("line", LIST_CASES)
def test_list_fast_path_is_docopt_or_steps_aside(line):
    argv = [w.strip("'") for w in line.split()]
    fast = argscan.scan_flags(argv, "list", LIST_USAGE, "<job>")
    slow = _docopt(argv, LIST_USAGE)
    if slow is None:
        assert fast is None
    elif fast is not None:
        assert fast == slow


def test_list_common_forms_take_the_fast_path():
    for line in ("list", "list --all", "list --finished --json", "list 12 13-20 train", "list --format id,command",
                 "list --no-header --format=id"):
        assert argscan.scan_flags(line.split(), "list", LIST_USAGE, "<job>") is not None, line


WORDS = st.sampled_from(["--all", "--finished", "--json", "--help", "-h", "--al", "--json=1", "--", "-", "-3",
                         "7", "3-9", "name", "bob:x", "", "list", "--bogus", "--format", "--format=id", "-o",
                         "--no-header", "id,state"])


@given(st.lists(WORDS, max_size=6))
@settings(max_examples=300, deadline=None)
def test_list_fast_path_agrees_with_docopt_on_any_words(words):
    argv = ["list", *words]
    fast = argscan.scan_flags(argv, "list", LIST_USAGE, "<job>")
    slow = _docopt(argv, LIST_USAGE)
    assert fast is None or fast == slow


def test_flags_scan_declines_new_and_reads_lists_values():
    assert argscan.scan_flags(["new", "--", "true"], "new", NEW_USAGE, "<command>") is None
    got = argscan.scan_flags(["list", "--format", "id"], "list", LIST_USAGE, "<job>")
    assert got is not None and got["--format"] == "id" and got["--no-header"] is False
    assert argscan.scan_flags(["list"], "list", LIST_USAGE, "<job>")["--format"] is None

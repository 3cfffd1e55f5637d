"""Shell completion of dispatch: the bash function run in a real bash, the zsh
file checked statically and run in a real zsh (Debian's package, from
scripts/install-host-deps --host: without it the zsh tests fail), both
checked against every verb and option of hpc_batch/client/cli_usage.py, and both in
the wheel."""

import fcntl
import json
import os
import pty
import re
import select
import shlex
import shutil
import struct
import subprocess
import sys
import termios
import time
import zipfile
from pathlib import Path

import pytest

from hpc_batch.client import cli_usage
from hpc_batch.install.texts import COMPLETION_MARKER, is_our_completion

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "hpc_batch" / "data" / "completion"
BASH_FILE = DATA / "dispatch.bash"
ZSH_FILE = DATA / "_dispatch"
# The test venv's own dispatch, as tests/conftest.py runs it.
REAL_DISPATCH = Path(sys.executable).parent / "dispatch"
GPU_LINKS = ["NV", "NV2", "NV4", "NV6", "NV8", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"]

# ---------------------------------------------------------------- the usage text

_OPTION = re.compile(r"(?<![\w-])(--?[a-z][a-z0-9-]*)")


def _usage_lines(text: str) -> list[str]:
    """The lines of the Usage: section (up to the first blank line)."""
    lines = text.split("Usage:", 1)[1].strip("\n").splitlines()
    return lines[:lines.index("")] if "" in lines else lines


def _option_rows(text: str) -> list[list[str]]:
    """The Options: section's first column, split in words: [["--cpu", "N"], ["-h", "--help"]]."""
    if "Options:" not in text:
        return []
    rows = []
    for line in text.split("Options:", 1)[1].splitlines():
        if line.startswith("  -"):
            rows.append(line.strip().split("  ")[0].split())
    return rows


def usage_options(text: str) -> set[str]:
    """Every option a verb's usage names, in its Usage: lines or its Options: section."""
    found = {m for line in _usage_lines(text) for m in _OPTION.findall(line)}
    found |= {word for row in _option_rows(text) for word in row if word.startswith("-")}
    return found


def valued_options(text: str) -> set[str]:
    """The options that take a value (``--cpu N``, both names of ``-o COLS, --format COLS``)."""
    return {word.rstrip(",") for row in _option_rows(text) if not row[-1].startswith("-")
            for word in row if word.startswith("-")}


VERBS = re.findall(r"^  ([a-z]+) {2,}", cli_usage.USAGE.split("Commands:", 1)[1], re.M)
TOP_OPTIONS = {m for line in _usage_lines(cli_usage.USAGE)
               if line.split()[1] not in VERBS for m in _OPTION.findall(line)}
JOB_VERBS = ["attach", "log", "kill", "wait", "show", "job"]


def test_the_usage_parser_sees_the_verbs_and_options():
    # Guards the helpers above: a parser that found nothing would pass every check below.
    assert list(cli_usage.SUBCOMMANDS) == VERBS
    assert {"-h", "--help", "--version"} == TOP_OPTIONS
    assert usage_options(cli_usage.LIST_USAGE) == {"--all", "--finished", "--json", "-o", "--format", "--no-header",
                                                   "-h", "--help"}
    new = usage_options(cli_usage.NEW_USAGE)
    assert {"--gpu-link", "--no-output", "--after-ok", "--numa-local-gpu"} <= new
    assert "--max-lifetime" not in new and "--list-is-public" not in new
    assert valued_options(cli_usage.NEW_USAGE) == {
        "--cpu", "--gpu-cores", "--gpu-link", "--max-mem", "--max-time", "--output", "--name",
        "--after", "--after-ok", "--array", "--commands", "--benchmark", "--aslr", "--thp", "--record",
        "--notify", "--notify-command"}


def test_every_verb_and_option_appears_in_both_files():
    for path in (BASH_FILE, ZSH_FILE):
        text = path.read_text()
        for word in [*VERBS, *TOP_OPTIONS, *(o for t in cli_usage.SUBCOMMANDS.values()
                                            for o in usage_options(t))]:
            assert re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text), (path.name, word)


def test_both_files_carry_the_installers_marker():
    for path in (BASH_FILE, ZSH_FILE):
        assert is_our_completion(path.read_text()), path


# ---------------------------------------------------------------- bash

# Runs the function `complete -p dispatch` names, as readline would, with
# set -u; compopt is recorded (readline is not running) in $COMPOPT_LOG.
HARNESS = r"""
set -u
compopt() { printf '%s\n' "$*" >>"$COMPOPT_LOG"; }
source "$1"
shift
eval "${EXTRA_SETUP:-}"
spec=$(complete -p dispatch)
[[ $spec =~ -F\ ([^ ]+) ]] || { echo "no complete -F for dispatch: $spec" >&2; exit 99; }
COMP_WORDS=("$@")
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
COMP_LINE="${COMP_WORDS[*]}"
COMP_POINT=${#COMP_LINE}
"${BASH_REMATCH[1]}" dispatch "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]-}"
for word in ${COMPREPLY[@]+"${COMPREPLY[@]}"}; do printf '%s\n' "$word"; done
"""


class Completion:
    def __init__(self, run: subprocess.CompletedProcess, compopt: str, seconds: float):
        self.words = run.stdout.splitlines()
        self.stderr = run.stderr
        self.compopt = compopt.splitlines()
        self.seconds = seconds


def search_path(tmp_path: Path, path_dirs=()) -> str:
    """``path_dirs``, then one whose python3 (which the job lister runs) is this one, then the system's."""
    python_dir = tmp_path / "python-bin"
    if not python_dir.is_dir():
        python_dir.mkdir()
        (python_dir / "python3").symlink_to(sys.executable)
    return os.pathsep.join([*map(str, path_dirs), str(python_dir), "/usr/bin", "/bin"])


def complete(words: list[str], tmp_path: Path, *, path_dirs=(), env=None, cwd=None,
             setup: str = "") -> Completion:
    """Complete ``words`` (the last is the word under the cursor) in bash."""
    log = tmp_path / "compopt.log"
    log.write_text("")
    full_env = {"PATH": search_path(tmp_path, path_dirs),
                "HOME": str(tmp_path), "LC_ALL": "C", "COMPOPT_LOG": str(log),
                "EXTRA_SETUP": setup, **(env or {})}
    started = time.monotonic()
    run = subprocess.run(["bash", "--norc", "--noprofile", "-c", HARNESS, "harness",
                          str(BASH_FILE), *words], capture_output=True, text=True,
                         env=full_env, cwd=cwd or tmp_path, timeout=60)
    seconds = time.monotonic() - started
    assert run.returncode == 0, run.stderr
    return Completion(run, log.read_text(), seconds)


def test_bash_syntax():
    run = subprocess.run(["bash", "-n", str(BASH_FILE)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stderr == "", run.stderr


@pytest.mark.parametrize("words, expected", [
    (["dispatch", ""], VERBS),
    (["dispatch", "ne"], ["new"]),
    (["dispatch", "s"], ["show", "status"]),
    (["dispatch", "new", "--ma"], ["--max-mem", "--max-time"]),
    (["dispatch", "new", "--numa-local"], ["--numa-local", "--numa-local-mem", "--numa-local-gpu"]),
    (["dispatch", "new", "--gpu-link", ""], GPU_LINKS),
    (["dispatch", "new", "--gpu-link", "N"], ["NV", "NV2", "NV4", "NV6", "NV8", "NV12", "NV18", "NODE"]),
    # --gpu-link=P: bash splits the word at "=" (COMP_WORDBREAKS) ...
    (["dispatch", "new", "--gpu-link", "=", "P"], ["PIX", "PXB", "PHB"]),
    (["dispatch", "new", "--gpu-link", "="], GPU_LINKS),
    # ... or, with "=" taken out of it, keeps it whole.
    (["dispatch", "new", "--gpu-link=P"], ["--gpu-link=PIX", "--gpu-link=PXB", "--gpu-link=PHB"]),
    (["dispatch", "new", "--cpu", ""], []),
    (["dispatch", "new", "--max-time", "2"], []),
    (["dispatch", "new", "--exclusive", "--cpu", "4", "--ex"], []),
    (["dispatch", "new", "--cpu", "4", "--wa"], ["--wait"]),
    (["dispatch", "job", "3", ""], ["max-time"]),
    (["dispatch", "job", "3", "max-time", ""], ["get", "set", "add"]),
    (["dispatch", "job", "3", "max-time", "s"], ["set"]),
    (["dispatch", "job", "3", "max-time", "add", ""], []),
    (["dispatch", "list", "--all", "--"], ["--finished", "--json", "--format", "--no-header", "--help"]),
    (["dispatch", "list", "--format", "id,st"], ["id,start", "id,state"]),
    (["dispatch", "list", "-o", "m"], ["max-time", "mem"]),
    (["dispatch", "list", "--format=c"], ["--format=command", "--format=cpus", "--format=cpu"]),
    (["dispatch", "status", ""], ["--json", "--map", "--watch", "--interval", "-h", "--help"]),
    (["dispatch", "status", "--watch", "--interval", ""], []),
    (["dispatch", "bogus", ""], []),
])
def test_bash_completes(tmp_path, words, expected):
    got = complete(words, tmp_path)
    assert got.words == expected
    assert got.stderr == ""


@pytest.mark.parametrize("verb", VERBS)
def test_bash_offers_exactly_each_verbs_options(tmp_path, verb):
    expected = usage_options(cli_usage.SUBCOMMANDS[verb]) | ({"--"} if verb == "new" else set())
    got = complete(["dispatch", verb, "-"], tmp_path)
    assert sorted(got.words) == sorted(expected)


def test_bash_and_zsh_offer_every_list_column_and_no_other(tmp_path):
    from hpc_batch.client.listtable import COLUMNS
    assert complete(["dispatch", "list", "--format", ""], tmp_path).words == list(COLUMNS)
    # zsh's -o and --format offer the same names.
    offered = re.findall(r"^\s*'\(--json --format -o\)(?:-o\+|--format=)\[[^]]*\]:columns:_sequence compadd - "
                         r"([^']*)'", ZSH_FILE.read_text(), re.M)
    assert [names.split() for names in offered] == [list(COLUMNS)] * 2


def test_bash_offers_exactly_the_top_level_options(tmp_path):
    assert sorted(complete(["dispatch", "-"], tmp_path).words) == sorted(TOP_OPTIONS)


@pytest.mark.parametrize("option", sorted(usage_options(cli_usage.NEW_USAGE)))
def test_bash_knows_which_options_of_new_take_a_value(tmp_path, option):
    # The command begins after the option (and its value, if it takes one):
    # a completion that mistook one kind for the other would complete "ech"
    # as an argument or a value instead, and offer nothing.
    words = ["dispatch", "new", option]
    if option in valued_options(cli_usage.NEW_USAGE):
        words.append("x")
    got = complete([*words, "ech"], tmp_path)
    assert "echo" in got.words


@pytest.mark.parametrize("words, command_at", [
    (["dispatch", "new", "--", "ech"], 3),
    (["dispatch", "new", "--cpu", "2", "--", "ech"], 5),
    (["dispatch", "new", "--after", "=", "3", "ech"], 5),
    (["dispatch", "new", "--gpu-link=NV", "ech"], 3),
])
def test_bash_completes_the_command_of_new(tmp_path, words, command_at):
    got = complete(words, tmp_path)
    assert "echo" in got.words and got.compopt == []
    # Its arguments: readline's file names (-o default) ...
    args = complete([*words[:-1], "echo", ""], tmp_path)
    assert args.words == [] and args.compopt == ["-o default"]
    # ... or, with bash-completion loaded, the command's own completion.
    stub = '_command_offset() { COMPREPLY=("offset:$1"); }'
    with_bc = complete([*words[:-1], "echo", "-"], tmp_path, setup=stub)
    assert with_bc.words == [f"offset:{command_at}"]


def test_bash_completes_file_names_for_output(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for name in ("out.log", "other.txt"):
        (work / name).write_text("")
    (work / "outdir").mkdir()
    got = complete(["dispatch", "new", "--output", "ou"], tmp_path, cwd=work)
    assert sorted(got.words) == ["out.log", "outdir"]
    assert got.compopt == ["-o filenames"]


LIST_DOC = {"jobs": [
    {"id": 7, "name": "prep", "user": "alice", "state": "running", "command": "sleep 30"},
    {"id": 12, "name": None, "user": "alice", "state": "queued", "command": "make"},
    {"id": 13, "name": "not a plain name", "user": "alice", "state": "queued", "command": "x"},
]}


def fake_dispatch(tmp_path: Path, body: str) -> Path:
    """A directory holding a ``dispatch`` that logs its arguments, then runs ``body``."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "dispatch"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >>"{tmp_path}/calls"\n{body}\n')
    script.chmod(0o755)
    return bin_dir


@pytest.fixture
def listing(tmp_path):
    doc = tmp_path / "list.json"
    doc.write_text(json.dumps(LIST_DOC, indent=1, sort_keys=True))
    return fake_dispatch(tmp_path, f'cat "{doc}"')


@pytest.mark.parametrize("verb", JOB_VERBS)
def test_bash_completes_job_ids_and_names(tmp_path, listing, verb):
    got = complete(["dispatch", verb, ""], tmp_path, path_dirs=[listing])
    # Job 12 has no name; job 13 one no shell word could hold plainly.
    assert got.words == ["7", "prep", "12", "13"]
    assert got.stderr == ""
    assert (tmp_path / "calls").read_text() == "list --json\n"


@pytest.mark.parametrize("words, expected", [
    (["dispatch", "kill", "p"], ["prep"]),
    (["dispatch", "kill", "1"], ["12", "13"]),
    (["dispatch", "wait", "7", "13", ""], ["prep", "12"]),
    (["dispatch", "show", "--json", ""], ["7", "prep", "12", "13"]),
    (["dispatch", "new", "--after", ""], ["7", "prep", "12", "13"]),
    (["dispatch", "new", "--after-ok", "p"], ["prep"]),
    (["dispatch", "new", "--after", "12,"], ["12,7", "12,prep", "12,13"]),
    (["dispatch", "new", "--after", "12,13,"], ["12,13,7", "12,13,prep"]),
    (["dispatch", "new", "--after", "=", "12,p"], ["12,prep"]),
    (["dispatch", "new", "--after-ok", "="], ["7", "prep", "12", "13"]),
    (["dispatch", "new", "--after=7,"], ["--after=7,prep", "--after=7,12", "--after=7,13"]),
])
def test_bash_completes_job_lists(tmp_path, listing, words, expected):
    assert complete(words, tmp_path, path_dirs=[listing]).words == expected


@pytest.mark.parametrize("words", [
    ["dispatch", "kill", "7", ""], ["dispatch", "attach", "prep", ""],
    ["dispatch", "job", "7", "max-time", "get", ""],
])
def test_bash_offers_no_second_job_where_one_is_taken(tmp_path, listing, words):
    assert complete(words, tmp_path, path_dirs=[listing]).words == []


def test_bash_runs_the_dispatch_being_completed(tmp_path, listing):
    # /path/to/dispatch kill <TAB> asks that dispatch, not the first on PATH.
    got = complete([str(listing / "dispatch"), "kill", ""], tmp_path)
    assert got.words == ["7", "prep", "12", "13"]


UNREACHABLE = ('echo \'{"code": "unreachable", "error": "cannot reach hpc-batchd", "exit": 69, '
               '"ok": false}\'\necho "dispatch: cannot reach hpc-batchd at /run/x" >&2\nexit 69')


@pytest.mark.parametrize("words", [["dispatch", "kill", ""], ["dispatch", "new", "--after", "3,"]])
def test_bash_is_silent_when_the_daemon_is_unreachable(tmp_path, words):
    got = complete(words, tmp_path, path_dirs=[fake_dispatch(tmp_path, UNREACHABLE)])
    assert got.words == [] and got.stderr == ""
    assert (tmp_path / "calls").read_text() == "list --json\n"  # it did ask


def test_bash_is_silent_with_the_real_dispatch_and_no_daemon(tmp_path):
    assert REAL_DISPATCH.is_file(), f"{REAL_DISPATCH} missing: install the package into the test venv"
    env = {"HPC_BATCH_SOCKET": str(tmp_path / "no-such.sock")}
    direct = subprocess.run([str(REAL_DISPATCH), "list", "--json"], capture_output=True, text=True,
                            env={**os.environ, **env}, timeout=60)
    assert direct.returncode == 69  # the case below is the unreachable one
    got = complete(["dispatch", "kill", ""], tmp_path, path_dirs=[REAL_DISPATCH.parent], env=env)
    assert got.words == [] and got.stderr == ""


def test_bash_is_silent_without_dispatch_on_path(tmp_path):
    got = complete(["dispatch", "show", ""], tmp_path, path_dirs=[tmp_path / "empty"])
    assert got.words == [] and got.stderr == ""


def test_bash_gives_up_on_a_daemon_that_does_not_answer(tmp_path):
    # A wedged daemon must not hang the user's shell: at most ~2 seconds.
    got = complete(["dispatch", "kill", ""], tmp_path,
                   path_dirs=[fake_dispatch(tmp_path, "exec sleep 60")])
    assert got.words == [] and got.stderr == ""
    assert got.seconds < 20


class Terminal:
    """An interactive shell (bash unless *argv* says) on a pseudo-terminal, to type into as a user would."""

    def __init__(self, env: dict, cwd: Path, argv=("/bin/bash", "--norc", "--noprofile", "-i"),
                 rows: int = 24, columns: int = 80):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: its terminal's size, then exec
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
                os.chdir(cwd)
                os.execve(argv[0], [os.path.basename(argv[0]), *argv[1:]], env)
            finally:
                os._exit(127)
        self.seen = b""

    def expect(self, pattern: str, timeout: float = 20.0) -> str:
        """Read until the output (from the last expect on) matches ``pattern``."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern.encode(), self.seen)
            if found:
                text = self.seen[:found.end()].decode(errors="replace")
                self.seen = self.seen[found.end():]
                return text
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} in {self.seen!r}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    self.seen += os.read(self.fd, 4096)
                except OSError:  # the shell is gone
                    raise AssertionError(f"the shell exited; no {pattern!r} in {self.seen!r}") from None

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def close(self) -> None:
        try:
            self.type("\x15exit\n")  # ^U: drop the line typed so far
        except OSError:
            pass
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("keys, line", [
    ("dispatch ne\t", "dispatch new "),
    ("dispatch kill pr\t", "dispatch kill prep "),
    ("dispatch new --gpu-link=PH\t", "dispatch new --gpu-link=PHB "),
    ("dispatch new --after=pr\t", "dispatch new --after=prep "),
    ("dispatch new --after 7,p\t", "dispatch new --after 7,prep "),
    ("dispatch new --output out.\t", "dispatch new --output out.log "),
    ("dispatch new --output outd\t", "dispatch new --output outdir/"),
    ("dispatch new -- ls outd\t", "dispatch new -- ls outdir/"),
    ("dispatch job 7 max-time s\t", "dispatch job 7 max-time set "),
])
def test_bash_completes_through_readline(tmp_path, listing, keys, line):
    # The real thing: bash -i on a terminal, set -u, TAB typed; the line as readline leaves it.
    work = tmp_path / "work"
    (work / "outdir").mkdir(parents=True)
    (work / "out.log").write_text("")
    env = {"PATH": search_path(tmp_path, [listing]), "HOME": str(tmp_path), "TERM": "dumb",
           "INPUTRC": "/dev/null", "PS1": "$ ", "LC_ALL": "C"}
    term = Terminal(env, work)
    try:
        term.type(f"source {shlex.quote(str(BASH_FILE))}; set -u; echo READY-$((6 * 7))\n")
        term.expect("READY-42")
        term.expect(r"\$ ")
        term.type(keys)
        term.expect(re.escape(line))
        term.type(" \x15echo DONE-$((6 * 7))\n")  # the shell still works: set -u did not kill it
        term.expect("DONE-42")
    finally:
        term.close()


# ---------------------------------------------------------------- zsh

ZSH = shutil.which("zsh") or ("/usr/bin/zsh" if os.path.exists("/usr/bin/zsh") else None)


def need_zsh() -> str:
    """zsh's path; a failure, not a skip, without it (CI installs it, so its absence is a fault)."""
    assert ZSH, "zsh is missing: scripts/install-host-deps --host installs it"
    return ZSH


def _zsh_blocks(text: str) -> dict[str, str]:
    """The body of each ``verb)`` branch of _dispatch's case, by verb."""
    blocks = {}
    for labels, body in re.findall(r"^ {4}([a-z|]+)\)\n(.*?)^ {6};;$", text, re.M | re.S):
        for verb in labels.split("|"):
            blocks[verb] = body
    return blocks


def test_zsh_file(tmp_path):
    """What the file must hold, read as text (the zsh tests below run it)."""
    text = ZSH_FILE.read_text()
    lines = text.splitlines()
    assert lines[0] == "#compdef dispatch"
    assert lines[1] == COMPLETION_MARKER
    assert lines[-1] == '_dispatch "$@"'
    # Its quoting and nesting balance as a POSIX-family parser sees them
    # (the file keeps to syntax bash can parse too).
    run = subprocess.run(["bash", "-n", str(ZSH_FILE)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr

    verbs = re.search(r"verbs=\(\n(.*?)\n  \)", text, re.S)
    assert verbs, "no verbs=( ... ) list"
    described = re.findall(r"^ {4}'([a-z]+):[^'\[\]]+'$", verbs.group(1), re.M)
    assert described == VERBS

    blocks = _zsh_blocks(text)
    assert sorted(blocks) == sorted(VERBS)
    assert re.search(r"help=\( '\(- \*\)'\{-h,--help\}'\[[^]']+\]' \)", text)
    for verb, usage in cli_usage.SUBCOMMANDS.items():
        body = blocks[verb]
        assert re.search(r"_arguments\b[^\n]*\$help", body), verb
        for option in usage_options(usage) - {"-h", "--help"}:
            # A value: --opt=VALUE or the next word; -oVALUE or the next word.
            form = ("=" if option.startswith("--") else "+") if option in valued_options(usage) else ""
            # '--opt[what it does]' or '--opt=[what it does]:value...', maybe
            # after an exclusion list: each option is described.
            spec = rf"'(?:\([^)]*\))?{re.escape(option + form)}\[[^]']+\]"
            assert re.search(spec, body), (verb, option)
    for verb in JOB_VERBS:
        assert "_dispatch_jobs" in blocks[verb], verb
    assert blocks["new"].count("_sequence _dispatch_jobs") == 2  # --after, --after-ok
    assert " ".join(GPU_LINKS) in blocks["new"]
    assert "run=( ${_dispatch_exe:-dispatch} list --json )" in text


def test_zsh_syntax():
    run = subprocess.run([need_zsh(), "-n", str(ZSH_FILE)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stderr == "", run.stderr


# A zsh as a user has it (no rc files; compinit with the file's directory on
# $fpath, as hpc-batch-install puts it on a site's), on a terminal tall and
# wide enough that every list shows whole, one "match -- description" a line.
ZSH_SETUP = (f"fpath=({shlex.quote(str(DATA))} $fpath); autoload -U compinit; compinit -u -D; "
             "unset zle_bracketed_paste; PS1='%% '; echo READY-$((6 * 7))\n")
_LISTED = re.compile(r"^(\S.*?) +-- (.*)$")


def zsh_tab(tmp_path: Path, keys: str, until: str, path_dirs=()) -> str:
    """Type *keys* (TABs among them) into a real zsh; what it shows up to the pattern *until*."""
    env = {"PATH": search_path(tmp_path, path_dirs), "HOME": str(tmp_path), "TERM": "dumb", "LC_ALL": "C"}
    term = Terminal(env, tmp_path, argv=(need_zsh(), "-f", "-i"), rows=100, columns=250)
    try:
        term.type(ZSH_SETUP)
        term.expect("READY-42")
        term.expect("% ")
        term.type(keys)
        shown = term.expect(until, timeout=30)
        term.type("\x15echo DONE-$((6 * 7))\n")   # the shell still works
        term.expect("DONE-42")
    finally:
        term.close()
    return shown.replace("\r", "")


def listed(shown: str) -> dict[str, str]:
    """The matches of a zsh list, each with its description (``--help -h -- show this help``: two)."""
    out = {}
    for line in shown.split("\n"):
        found = _LISTED.match(line.rstrip())
        if found:
            out.update(dict.fromkeys(found.group(1).split(), found.group(2)))
    return out


def until_redrawn(line: str) -> str:
    """The pattern for a list shown and the prompt drawn again below it, holding *line*."""
    return r"\n% " + re.escape(line)


def test_zsh_lists_the_verbs_described(tmp_path):
    shown = zsh_tab(tmp_path, "dispatch \t", until_redrawn("dispatch "))
    verbs = listed(shown)
    assert sorted(verbs) == sorted(VERBS)
    # Each with its description from the file's verbs=( ... ) list.
    assert verbs["new"] == "queue a job; everything after -- is its command line"
    assert verbs["status"] == "the machine at a glance, and the queue"


@pytest.mark.parametrize("verb", VERBS)
def test_zsh_lists_exactly_each_verbs_long_options(tmp_path, verb):
    expected = sorted(o for o in usage_options(cli_usage.SUBCOMMANDS[verb]) if o.startswith("--"))
    if len(expected) == 1:   # the one there is goes on the line, with no list
        zsh_tab(tmp_path, f"dispatch {verb} --\t", re.escape(f"dispatch {verb} {expected[0]} "))
        return
    shown = zsh_tab(tmp_path, f"dispatch {verb} --\t", until_redrawn(f"dispatch {verb} --"))
    assert sorted(listed(shown)) == expected


@pytest.mark.parametrize("keys, line", [
    ("dispatch ne\t", "dispatch new "),
    ("dispatch st\t", "dispatch status "),
    ("dispatch new --max-t\t", "dispatch new --max-time="),
    ("dispatch new --gpu-link=PH\t", "dispatch new --gpu-link=PHB "),
    ("dispatch new --aslr=o\t", "dispatch new --aslr=o"),          # on or off: no single match
    ("dispatch list --format=id,comm\t", "dispatch list --format=id,command"),
    ("dispatch job 7 max-time s\t", "dispatch job 7 max-time set "),
])
def test_zsh_completes_the_word(tmp_path, keys, line):
    zsh_tab(tmp_path, keys, re.escape(line))


def test_zsh_lists_job_ids_and_names(tmp_path, listing):
    shown = zsh_tab(tmp_path, "dispatch kill \t", until_redrawn("dispatch kill "), path_dirs=[listing])
    # Job 12 has no name; job 13 one no shell word could hold plainly.
    assert listed(shown) == {"7": "running sleep 30", "prep": "job 7", "12": "queued make", "13": "queued x"}
    assert (tmp_path / "calls").read_text() == "list --json\n"


# ---------------------------------------------------------------- the wheel

@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel, built as tests/unit/test_packaging.py builds it."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
                   check=True, capture_output=True)
    (path,) = [p for p in out.iterdir() if p.suffix == ".whl"]
    return path


@pytest.mark.timeout(300)
def test_wheel_carries_both_completion_files(wheel):
    with zipfile.ZipFile(wheel) as whl:
        for source in (BASH_FILE, ZSH_FILE):
            name = f"hpc_batch/data/completion/{source.name}"
            assert whl.read(name) == source.read_bytes(), name
            assert whl.getinfo(name).external_attr >> 16 & 0o777 == 0o644, name

"""Every flag of every verb, and every positional word, given bad values (issue 32, item 7).

The verbs and their flags come from the usage texts (``cli_usage.SUBCOMMANDS``, read the way
docopt reads them), so a flag added there is in this table at once; its metavar (``N``, ``GB``,
...) says which values it takes, and a metavar this file does not know fails the test, to be
given its row here.

Each case runs ``dispatch`` in this process against a socket path where no daemon is, so its
outcome tells the two apart: a refusal by dispatch itself (the daemon never saw it: dispatch did
not even try to connect) or a request it sent (it tried, and says it cannot reach hpc-batchd,
exit 69). A value dispatch can judge must be refused by it: one line naming the flag (a
docopt usage error may follow it with the usage), a documented exit status, no traceback, no
raw errno, no wire field names, no megabyte of the value echoed back. A value only the
daemon can judge (a job name that may exist) must be sent.
"""

import pytest

from hpc_batch.client import cli
from hpc_batch.client.argscan import options
from hpc_batch.client.cli_usage import SUBCOMMANDS
from hpc_batch.core import jobs
from hpc_batch.wire.messages import CLIENT_FAILURES, REFUSALS

NOWHERE = "/nonexistent/hpc-batch-bad-input.sock"
UNREACHABLE = CLIENT_FAILURES["unreachable"]
DOCUMENTED = {*REFUSALS.values(), *CLIENT_FAILURES.values()} - {UNREACHABLE}

# What a verb's command line holds around the flag under test: the words before it, and after it
# (its positional words: a job, a command). A verb missing here fails test_every_verb_has_a_base.
BASES = {
    "new": (["new"], ["--", "true"]),
    "list": (["list"], []),
    "attach": (["attach"], ["5"]),
    "log": (["log"], ["5"]),
    "kill": (["kill"], ["5"]),
    "wait": (["wait"], ["5"]),
    "show": (["show"], ["5"]),
    "record": (["record", "diff"], ["5", "6"]),
    "status": (["status"], []),
    "history": (["history"], []),
    "report": (["report"], ["5"]),             # (it needs the runs named)
    "job": (["job", "5", "max-time"], ["get"]),
}

# The bad values, by kind. "missing" is the flag with no value: last, or right before "--".
KINDS = {
    "empty": "",
    "negative": "-1",
    "zero": "0",
    "huge": "9" * 5000,
    "fractional": "1.5",
    "word": "bogus",
    "unicode": "\u00bd\u00fc",
}

# By metavar: the kinds of value that are good ones (sent to the daemon); every other kind must be
# refused by dispatch. "zero" is good for a count that may be 0.
GOOD = {
    "N": set(),                                   # --cpu, --limit: a whole number from 1
    "GB": {"fractional"},                         # 1.5 (GiB)
    "D": set(),                                   # durations: 45m, 2h
    "CLASS": set(),                               # NV, PIX, ...
    "MODE": set(),                                # warn/strict, on/off
    "PATH": {"negative", "zero", "fractional", "word", "unicode"},   # any name a file may have
    "NAME": {"fractional", "word"},               # a job name: letters, digits, . _ -
    "JOBS": {"fractional", "word"},               # ids or names: 1.5 and bogus are names
    "SPEC": {"zero"},                             # --array 1-10; 0 is an index
    "FILE": set(),                                # --commands: a file to read now (none of these exists)
    "ID": set(),                                  # history --array: a job id
    "RESULT": set(),                              # --state: one of the results
    "V": set(),                                   # --verdict
    "TIME": set(),                                # a date, or a duration ago
    "DIGEST": set(),                              # sha256:..., 8+ hex digits
    "USER": {"word", "fractional", "zero"},       # a login name
    "COLS": set(),                                # list --format: column names
    "SECONDS": {"fractional"},                    # status --interval
    "FORMS": set(),                               # --notify tty,cmd
    "CMD": {"negative", "zero", "fractional", "word", "unicode"},   # a shell command line
}

# (verb, flag) whose values differ from their metavar's.
OVERRIDES = {
    ("new", "--gpu-cores"): {"zero"},                       # a count of GPUs: 0 is the default
    ("report", "--plot"): set(),                             # a file written later: NAME.svg, none of these
    ("report", "--metric"): {"word"},                       # a figure's name: a letter or _ first
    ("status", "--interval"): set(),                        # without --watch, none
}


def _value_options(verb: str) -> list[tuple[str, str | None]]:
    """(flag, metavar) of each option of *verb*, metavar None for a switch; the long name when there is one."""
    metavars = {}
    for line in SUBCOMMANDS[verb].split("Options:", 1)[-1].splitlines():
        words = line.strip().split("  ")[0].replace(",", " ").replace("=", " ").split()
        if words and words[0].startswith("-"):
            for name in words:
                metavars[name] = next((w for w in words if not w.startswith("-")), None)
    return [(opt.key, metavars[opt.key]) for opt in options(SUBCOMMANDS[verb]) if opt.key not in ("--help", "-h")]


def _cases():
    for verb in SUBCOMMANDS:
        head, tail = BASES.get(verb, ([verb], []))
        for flag, metavar in _value_options(verb):
            if metavar is None:
                yield pytest.param(verb, flag, "=bogus", [*head, f"{flag}=bogus", *tail], False,
                                   id=f"{verb} {flag}=bogus")
                continue
            good = OVERRIDES.get((verb, flag), GOOD.get(metavar))
            last = [*head, flag] if verb == "new" else [*head, *tail, flag]   # (new's command would take it)
            yield pytest.param(verb, flag, "missing", last, False, id=f"{verb} {flag} (last)")
            yield pytest.param(verb, flag, "missing", [*head, flag, "--", "true"],
                               (verb, flag) == ("new", "--benchmark"),     # bare --benchmark: warn
                               id=f"{verb} {flag} -- true")
            for kind, value in KINDS.items():
                yield pytest.param(verb, flag, kind, [*head, flag, value, *tail],
                                   good is not None and kind in good, id=f"{verb} {flag} {kind}")
        # The unknown flag, in the shape the issue found: dispatch <verb> --x -- cmd.
        yield pytest.param(verb, "--x", "unknown", [*head, "--x", "--", "cmd"], False, id=f"{verb} --x -- cmd")


@pytest.fixture
def nowhere(monkeypatch, tmp_path):
    monkeypatch.setenv("HPC_BATCH_SOCKET", NOWHERE)
    monkeypatch.chdir(tmp_path)      # a --output or --record path is checked here, as the user


def _run(capsys, args):
    status = cli.main(args)
    out, err = capsys.readouterr()
    return status, out, err


# A path is echoed whole: the system's error (ENAMETOOLONG) is about it.
PATHS = {"--output", "--record", "--commands", "--plot"}


def assert_refused_by_dispatch(status, out, err, names, whole=False):
    """One line naming *names*, a documented status, and no sign that the daemon was asked."""
    lines = err.splitlines()
    assert status in DOCUMENTED, (status, err)
    assert lines, "refused without a word"
    assert "cannot reach" not in err, f"sent to the daemon: {err}"
    assert lines[0].startswith("dispatch"), lines[0]
    assert len(lines) == 1 or lines[1].startswith("Usage:"), f"more than one line: {err}"
    assert whole or len(lines[0]) < 500, f"the value echoed back whole: {lines[0][:200]}..."
    for bad in ("Traceback", "[Errno", "field '", "Error:"):
        assert bad not in err, f"{bad!r} in {err}"
    if names:
        assert names in lines[0], f"{names!r} not named in {lines[0]!r}"
    assert out == ""


def assert_sent(status, out, err):
    assert status == UNREACHABLE and "cannot reach" in err, f"refused (exit {status}): {err}"


def test_every_verb_has_a_base_and_every_metavar_a_row():
    assert set(SUBCOMMANDS) <= set(BASES), "give the new verb its words in BASES"
    metavars = {m for verb in SUBCOMMANDS for _, m in _value_options(verb) if m}
    assert metavars <= set(GOOD), f"give these metavars their good kinds in GOOD: {metavars - set(GOOD)}"


@pytest.mark.parametrize("verb,flag,kind,args,good", list(_cases()))
def test_a_bad_value_for_any_flag_is_refused_by_dispatch(capsys, nowhere, verb, flag, kind, args, good):
    status, out, err = _run(capsys, args)
    if good:
        assert_sent(status, out, err)
    else:
        # A bare --benchmark is warn: then it is the command that is missing, and said so.
        bare = (verb, flag, kind) == ("new", "--benchmark", "missing")
        assert_refused_by_dispatch(status, out, err, "missing the command" if bare else flag,
                                   whole=flag in PATHS)


# Positional words: a <job> (an id, a name, a range), a <duration>, a record.
JOB_VERBS = [v for v in ("attach", "log", "kill", "wait", "show", "list") if v in SUBCOMMANDS]


def _positional_cases():
    for verb in JOB_VERBS:
        for kind, value in KINDS.items():
            yield pytest.param([verb, value], kind in ("fractional", "word"), id=f"{verb} <job> {kind}")
        yield pytest.param([verb, f"1-{'9' * 5000}"], False, id=f"{verb} <job> huge range")
    for kind, value in KINDS.items():
        yield pytest.param(["job", value, "max-time", "get"], kind in ("fractional", "word"), id=f"job <job> {kind}")
        for action in ("set", "add"):
            yield pytest.param(["job", "5", "max-time", action, value], False, id=f"job max-time {action} {kind}")
            yield pytest.param(["job", "5", "max-time", action, f"-5m{value}"], False,
                               id=f"job max-time {action} -5m{kind}")
        for verb in ("history", "report"):     # ids and ranges only: a name goes to --name
            yield pytest.param([verb, value], False, id=f"{verb} <job> {kind}")
        yield pytest.param(["record", "diff", value, "6"], kind in ("fractional", "word"), id=f"record diff {kind}")


@pytest.mark.parametrize("args,good", list(_positional_cases()))
def test_a_bad_positional_word_is_refused_by_dispatch(capsys, nowhere, args, good):
    status, out, err = _run(capsys, args)
    if good:
        assert_sent(status, out, err)
    else:
        assert_refused_by_dispatch(status, out, err, None)


def test_a_refusal_status_is_never_one_of_dispatch_waits():
    # The table leans on it: a status in DOCUMENTED is a refusal, never how a job ended.
    assert not DOCUMENTED & set(jobs.WAIT_STATUS.values())

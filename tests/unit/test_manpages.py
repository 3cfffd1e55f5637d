"""The manual pages say what the programs' own usage texts say, so they cannot drift.

Each page (hpc_batch/data/man) is written by hand, in the shape of s6's
program pages (interface, options, signals, exit codes, files, notes); these
tests hold its SYNOPSIS, OPTIONS and EXIT STATUS to the texts the programs
print and the codes they use: dispatch's usage (hpc_batch/client/cli_usage.py),
the daemon's USAGE and its defaults, the installer's argparse parser, and the
shepherd's usage line.
"""

import re
from pathlib import Path

import pytest

from hpc_batch.client import cli_usage
from hpc_batch.core import jobs
from hpc_batch.daemon import main as daemon_main
from hpc_batch.install import build_parser, manpages
from hpc_batch.wire import messages
from shepherd import main as shepherd_main

MAN = Path(__file__).resolve().parents[2].joinpath(*manpages.DATA)
HELP = {"-h", "--help", "--version"}
FLAG = re.compile(r"(?<![\w-])--?[a-z0-9][a-z0-9-]*")
SECTIONS = ("NAME", "SYNOPSIS", "DESCRIPTION", "INTERFACE", "OPTIONS", "SIGNALS", "EXIT STATUS", "FILES",
            "SEE ALSO")


def page(name: str) -> str:
    return (MAN / name).read_text()


def plain(roff: str) -> str:
    """The text of roff source with the escapes these pages use undone."""
    return re.sub(r"\\f[BIRP]", "", roff.replace("\\-", "-"))


def section(text: str, title: str) -> str:
    """The source of ``.SH title`` up to the next ``.SH``."""
    m = re.search(rf"^\.SH {re.escape(title)}\n(.*?)(?=^\.SH |\Z)", text, re.M | re.S)
    assert m, f"no section {title}"
    return m.group(1)


def subsections(text: str) -> dict[str, str]:
    """``.SS`` title -> its source, within one section."""
    parts = re.split(r"^\.SS (.*)\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def tagged_flags(text: str) -> set[str]:
    """The flags named on the tag line of each ``.TP`` item."""
    return {f for tag in re.findall(r"^\.TP\n(.*)\n", text, re.M) for f in FLAG.findall(plain(tag))} - HELP


def usage_flags(usage: str) -> set[str]:
    """The flags an ``Options:`` section of a docopt usage text defines."""
    opts = usage.split("Options:", 1)[1]
    return {f for line in opts.splitlines() if re.match(r"^  -", line)
            for f in FLAG.findall(re.split(r"\s{2,}", line.strip())[0])} - HELP


def usage_lines(usage: str) -> list[str]:
    block = usage.split("Usage:", 1)[1].split("\n\n", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip()]


def synopsis(text: str) -> list[str]:
    return [line.strip() for line in plain(section(text, "SYNOPSIS")).splitlines() if not line.startswith(".")]


@pytest.mark.parametrize("name", manpages.PAGES)
def test_each_page_has_the_program_page_shape_and_the_installers_marker(name):
    text = page(name)
    assert manpages.is_marked(text)
    prog, number = name.rsplit(".", 1)
    assert re.search(rf'^\.TH {re.escape(prog.upper())} {number} ', text, re.M)
    titles = re.findall(r"^\.SH (.*)$", text, re.M)
    assert [t for t in titles if t in SECTIONS] == list(SECTIONS), titles


def test_dispatch_synopsis_is_the_usage():
    lines = synopsis(page("dispatch.1"))
    for line in usage_lines(cli_usage.USAGE):
        if not re.search(r"--help|--version", line):
            assert line in lines, line


def test_dispatch_options_are_each_commands_options():
    options = subsections(section(page("dispatch.1"), "OPTIONS"))
    for command, usage in cli_usage.SUBCOMMANDS.items():
        expected = usage_flags(usage)
        title = "record diff" if command == "record" else command
        assert tagged_flags(options.get(title, "")) == expected, command
    assert set(options) <= {"record diff", *cli_usage.SUBCOMMANDS}


def test_dispatch_commands_are_the_usages_commands():
    commands = re.findall(r"^  (\w+)\s{2,}", cli_usage.USAGE.split("Commands:", 1)[1].split("\n\n")[0], re.M)
    tags = re.findall(r"^\.TP\n\.B (.*)$", section(page("dispatch.1"), "COMMANDS"), re.M)
    assert [t.split()[0] for t in tags] == commands


def _statuses(text: str) -> dict[int, str]:
    """Each ``.TP`` / ``.B N`` / ``\\fBname\\fR`` item: status -> name."""
    return {int(n): name.replace("\\-", "-")
            for n, name in re.findall(r"^\.TP\n\.B (\d+)\n\\fB([^\\]*(?:\\-[^\\]*)*)\\fR", text, re.M)}


def test_dispatch_exit_statuses_are_the_refusal_codes_and_the_wait_statuses():
    exits = section(page("dispatch.1"), "EXIT STATUS")
    refusals, wait = exits.split(".SS dispatch wait\n")
    expected = {status: code for code, status in {**messages.REFUSALS, **messages.CLIENT_FAILURES}.items()}
    assert _statuses(refusals) == expected
    assert _statuses(wait) == {status: kind for kind, status in jobs.WAIT_STATUS.items()}
    # The usage text says the same, status by status.
    said = cli_usage.USAGE.split("Exit status:", 1)[1]
    for status in [*expected, *jobs.WAIT_STATUS.values()]:
        assert re.search(rf"\b{status}\b", said), status


def test_daemon_synopsis_options_and_defaults_are_its_usage():
    text = page("hpc-batchd.8")
    assert synopsis(text) == usage_lines(daemon_main.USAGE)
    options = section(text, "OPTIONS")
    assert tagged_flags(options) == usage_flags(daemon_main.USAGE)
    # Each [default: X] of the usage is the page's "Default: X." for that flag.
    items = dict(re.findall(r"^\.TP\n.*?(--[a-z0-9-]+).*\n((?:(?!\.TP).*\n)*)", plain(options), re.M))
    for flag, default in re.findall(r"^  (--[a-z0-9-]+).*?(?:\n(?!  -).*?)*?\[default: ([^\]]+)\]",
                                    daemon_main.USAGE, re.M):
        assert f"Default: {default}." in " ".join(items[flag].split()), flag


def test_installer_options_are_its_parser():
    text = page("hpc-batch-install.8")
    flags = {s for action in build_parser()._actions for s in action.option_strings} - HELP
    assert tagged_flags(section(text, "OPTIONS")) == flags
    assert FLAG.findall(" ".join(synopsis(text))) and set(FLAG.findall(" ".join(synopsis(text)))) == flags


def test_shepherd_synopsis_is_its_usage_line(capsys):
    assert shepherd_main.main([]) == 2
    usage = capsys.readouterr().err.splitlines()[0]
    assert usage.startswith("usage: ")
    text = page("hpc-batch-shepherd.8")
    assert synopsis(text) == [usage[len("usage: "):]]
    assert tagged_flags(section(text, "OPTIONS")) == set(FLAG.findall(usage))

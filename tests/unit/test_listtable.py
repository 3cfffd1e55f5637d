"""dispatch list's table (pure): columns, alignment, cutting to a width, escaping."""

import time

import pytest

from hpc_batch.client import cli_usage
from hpc_batch.client.listtable import (
    COLUMNS,
    FormatError,
    cell_width,
    cut_to,
    default_columns,
    format_elapsed,
    job_of,
    job_of_summary,
    parse_format,
    render,
)
from hpc_batch.core.cut import MARK
from hpc_batch.core.listrows import TABLE_FIELDS, format_row, table_row

NOW = time.mktime((2026, 11, 30, 15, 0, 0, 0, 0, -1))


def job(**kw):
    base = {"id": 7, "user": "alice", "name": None, "command": "sleep 30", "state": "running",
            "started": NOW - 65, "ended": None, "max_time": 5400, "mem": 32 << 30, "spread": False,
            "exclusive": False, "exit": None, "result": None, "mem_assigned": True, "output_error": None,
            "cpus": [2, 3], "held_cpus": [2, 3], "cores": [[2], [3]], "gpu_label": None}
    base.update(kw)
    return job_of_summary(base)


def test_header_and_aligned_columns():
    jobs = [job(), job(id=1234, name="prep", state="queued", started=None, mem=512 << 20, command="true")]
    lines = render(jobs, ["id", "name", "state", "mem", "command"], NOW)
    assert lines == [
        "  ID NAME STATE    MEM COMMAND",
        "   7 -    running  32G sleep 30",
        "1234 prep queued  512M true",
    ]


def test_no_header():
    assert render([job()], ["id", "state"], NOW, header=False) == ["7 running"]


def test_an_empty_list_is_its_header():
    assert render([], ["id", "command"], NOW) == ["ID COMMAND"]


def test_the_name_has_a_column_of_its_own():
    line = render([job(name="prep", command="sh -c x")], ["name", "command"], NOW, header=False)[0]
    assert line == "prep sh -c x" and "[prep]" not in line


def test_the_command_is_cut_to_the_width_and_no_line_is_wider():
    long = "python train.py" + " --flag" * 40
    lines = render([job(command=long), job(id=8)], default_columns(False, False), NOW, width=80)
    assert all(cell_width(line) <= 80 for line in lines)
    assert lines[1].endswith(MARK) and len(lines[1]) == 80
    assert lines[1].split()[-1].endswith(MARK) and "python train.py" in lines[1]
    # Nothing to cut: every cell whole.
    whole = render([job(command=long)], ["id", "command"], NOW)
    assert whole[1] == " 7 " + long


def test_the_widest_cut_column_gives_way_first():
    lines = render([job(name="n" * 20, command="c" * 200)], ["id", "name", "command"], NOW, width=60)
    _, name, command = lines[1].split()
    assert name == "n" * 20 and len(command) == 60 - 2 - 1 - 20 - 1 and command.endswith(MARK)
    # Both wider than their share: cut to the same width.
    lines = render([job(name="n" * 64, command="c" * 64)], ["name", "command"], NOW, width=41)
    name, command = lines[1].split()
    assert len(name) == len(command) == 20 and name.endswith(MARK) and command.endswith(MARK)


def test_a_width_too_narrow_for_the_fixed_columns_still_never_wraps():
    lines = render([job()], default_columns(True, True), NOW, width=30)
    assert all(cell_width(line) <= 30 for line in lines)
    lines = render([job(command="x" * 50)], ["command"], NOW, width=5)
    assert lines[1] == "xx" + MARK


def test_right_and_left_alignment():
    lines = render([job(id=3, user="al"), job(id=12345, user="bobby")], ["user", "id"], NOW)
    assert lines == ["USER     ID", "al        3", "bobby 12345"]


@pytest.mark.parametrize("text", ["\x1b[31mred", "a\nb", "\x07bell", "x\u202ey", "\u200bzero", "\x9b31m"])
def test_control_characters_are_escaped_never_raw(text):
    lines = render([job(command=text, name=text, user=text)], ["user", "name", "command"], NOW, width=200)
    shown = "\n".join(lines)
    assert all(c.isprintable() for line in lines for c in line)
    assert repr(text[1] if text[0].isprintable() else text[0])[1:-1] in shown


def test_an_escape_cut_in_half_is_still_text():
    lines = render([job(command="\x1b" * 40)], ["command"], NOW, width=12)
    assert lines[1] == "\\x1b\\x1b\\" + MARK and all(c.isprintable() for c in lines[1])


def test_wide_characters_count_two_cells():
    assert cell_width("漢字") == 4 and cell_width("e\u0301") == 1 and cell_width("abc") == 3
    lines = render([job(id=1, command="漢字漢字"), job(id=2, command="ab")], ["command", "id"], NOW)
    assert lines == ["COMMAND  ID", "漢字漢字  1", "ab        2"]
    cut = cut_to("漢字漢字漢字", 7)
    assert cut == "漢字" + MARK and cell_width(cut) == 7


def test_cut_to_keeps_text_that_fits_and_marks_a_cut():
    assert cut_to("abcdef", 6) == "abcdef"
    assert cut_to("abcdefg", 6) == "abc" + MARK
    assert cut_to("abcdefg", 2) == MARK[:2]


@pytest.mark.parametrize("seconds,text", [(0, "0:00"), (65, "1:05"), (3600, "1:00:00"), (86399, "23:59:59"),
                                          (90061, "1-01:01:01"), (-5, "0:00")])
def test_elapsed_time_reads_as_squeue_writes_it(seconds, text):
    assert format_elapsed(seconds) == text


def test_cells_of_each_state():
    queued = job(command="true", state="queued", started=None, cpus=None, held_cpus=None, cores=None, spread=True,
                 exclusive=True)
    done = job(command="true", state="finished", ended=NOW - 5, exit="oom", result={"kind": "oom"}, mem_assigned=False,
               stats={"cpu_time": 12.34, "peak_mem": 210 << 20, "verdict": "clean"}, gpu_label="2:NV12")
    names = list(COLUMNS)
    q, d = (dict(zip(names, render([j], names, NOW, header=False)[0].split(None, len(names) - 1)))
            for j in (queued, done))
    assert q["start"] == "-" and q["uptime"] == "-" and q["mem"] == "32G+" and q["exclusive"] == "yes"
    assert q["cpus"] == "-" and q["exit"] == "-" and q["cpu"] == "-"
    done_line = render([done], names, NOW, header=False)[0]
    assert " 1:00 " in done_line and " 2/2c 2:NV12 12.3s 210M clean finished oom " in done_line
    assert done_line.endswith(" budget requested with --max-mem was 32G")


def test_default_columns():
    assert default_columns(False, False) == ["id", "state", "name", "start", "uptime", "max-time", "mem",
                                             "cpus", "gpus", "command"]
    cols = default_columns(True, True)
    assert cols.index("user") < cols.index("name") and cols[-2:] == ["command", "note"]
    assert "exit" in cols and all(c in COLUMNS for c in cols)


def test_parse_format():
    assert parse_format("id,STATE, command") == ["id", "state", "command"]
    for bad, says in (("id,bogus", "unknown column 'bogus'"), ("id,,state", "an empty column name"),
                      ("", "an empty column name"), ("\x1b[2J", "unknown column '\\x1b[2J'")):
        with pytest.raises(FormatError) as err:
            parse_format(bad)
        assert says in str(err.value) and ",".join(COLUMNS) in str(err.value)
        assert "\n" not in str(err.value) and "\x1b" not in str(err.value)


def test_the_help_names_every_column_and_every_plain_field():
    text = " ".join(cli_usage.LIST_USAGE.split())
    assert ", ".join(COLUMNS) + "." in text
    plain = text.split("Piped, each job is one line of words (the format scripts read, unchanged): ")[1]
    named = plain.split(",")[0].split()
    assert named == ["<username>", "<id>", "<command>", "<start>", "<uptime>", "<max-time>", "<mem>",
                     "<exclusive>", "<cpus>", "<gpus>"]
    # As many as a row has words (a one-word command, started today).
    summary = {"id": 7, "user": "alice", "command": "true", "state": "running", "started": NOW - 65,
               "max_time": 60, "mem": 1 << 30}
    assert len(format_row(summary, NOW, False).split()) == len(named)


def test_a_reply_row_and_a_summary_make_the_same_job():
    done = {"id": 3, "user": "bob", "name": "x", "command": "true", "state": "finished", "started": NOW - 9,
            "ended": NOW - 1, "max_time": 60, "mem": 1 << 30, "spread": True, "exclusive": False,
            "cpus": [0], "gpu_label": "1", "exit": "0", "result": {"kind": "exited", "code": 0},
            "output_error": "disk full", "stats": {"cpu_time": 1.0, "peak_mem": 1 << 20, "verdict": "clean"}}
    row = job_of(table_row(done))
    assert row == job_of_summary(done) and set(row) == set(TABLE_FIELDS)
    assert row["cpus"] == "1/1c" and row["note"] == "output not delivered: disk full"
    assert row["cpu_time"] == 1.0 and row["verdict"] == "clean"
    # Accounting is a finished job's only, as in the plain row.
    assert job_of_summary(dict(done, state="running"))["cpu_time"] is None

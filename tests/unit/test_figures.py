"""A job's own figures (issue 30): the parser (shepherd/record/figures.py), the file (shepherd/record/figurefile.py),
their place in the record (shepherd/record/recorder.py) and how show --record and record diff read them.

The file tests use real files, links and FIFOs in a temporary directory: the
shepherd reads what a hostile job leaves there as root, so each refusal is
checked against the real system calls, and a FIFO with a deadline.
"""

import json
import os
import resource
import stat
import time

import pytest

from hpc_batch.client import recorddiff
from hpc_batch.core import setup
from shepherd.base import records
from shepherd.record import bounds, figurefile, figures, recorder, software

NAME_RULE, UNIT_RULE = figures.NAME_RULE, figures.UNIT_RULE


# -- the parser ------------------------------------------------------------------
# (a line, what it gives: (name, value, unit), None for a line skipped, or the reason it is invalid)
LINES = [
    (b"time 1.5 s", ("time", 1.5, "s")),
    (b"time 1.5", ("time", 1.5, None)),
    (b"  time\t1.5\t s  ", ("time", 1.5, "s")),
    (b"time 1.5 s\r", ("time", 1.5, "s")),
    (b"time -2e-3 s", ("time", -0.002, "s")),
    (b"time +7", ("time", 7.0, None)),
    (b"time .5", ("time", 0.5, None)),
    (b"_x 0", ("_x", 0.0, None)),
    (b"a.b:c/d-e_9 1", ("a.b:c/d-e_9", 1.0, None)),
    (b"n" * 64 + b" 1", ("n" * 64, 1.0, None)),
    (b"bw 12 GB/s", ("bw", 12.0, "GB/s")),
    (b"t 1 " + b"u" * 16, ("t", 1.0, "u" * 16)),
    (b"t 1 s # the third run", ("t", 1.0, "s")),
    (b"t 1 s#x", ("t", 1.0, "s#x")),
    (b"", None),
    (b"   \t ", None),
    (b"# time 1 s", None),
    (b"   #", None),
    (b"time", "expected NAME VALUE [UNIT], found 1 field"),
    (b"time 1 s extra", "expected NAME VALUE [UNIT], found 4 fields"),
    (b"1time 1", NAME_RULE),
    (b"-x 1", NAME_RULE),
    (b"n" * 65 + b" 1", NAME_RULE),
    (b"ti\x1bme 1", NAME_RULE),
    (b"ti$me 1", NAME_RULE),
    (b"t\xc3\xa9 1", NAME_RULE),
    (b"time nan", "the value is not a number"),
    (b"time NaN", "the value is not a number"),
    (b"time inf", "the value is not a number"),
    (b"time -Infinity", "the value is not a number"),
    (b"time 1_000", "the value is not a number"),
    (b"time 0x10", "the value is not a number"),
    (b"time \xd9\xa1", "the value is not a number"),     # an Arabic-Indic one: float() would take it
    (b"time 1.2.3", "the value is not a number"),
    (b"time e", "the value is not a number"),
    (b"time 1e999", "the value is not finite"),
    (b"time -1e999", "the value is not finite"),
    (b"t 1 " + b"u" * 17, UNIT_RULE),
    (b"t 1 \xc2\xb5s", UNIT_RULE),       # UTF-8, but not ASCII: "us"
    (b"t \xff 1", "not UTF-8"),
    (b"\xff\xfe 1", "not UTF-8"),
    (b"t\x00 1", NAME_RULE),
]


@pytest.mark.parametrize("line,want", LINES)
def test_each_line_is_a_figure_a_skip_or_invalid_with_its_reason(line, want):
    got = figures.parse(line + b"\n")
    if want is None:
        assert got["names"] == {} and got["invalid"]["count"] == 0
    elif isinstance(want, tuple):
        name, value, unit = want
        assert got["invalid"] == {"count": 0, "first": []}, got
        assert got["names"] == {name: {"unit": unit, "values": [value], "count": 1, "last": value}}
    else:
        assert got["names"] == {}
        assert got["invalid"]["count"] == 1
        assert got["invalid"]["first"] == [{"line": 1, "text": figures.escape(line), "why": want}]


def test_a_name_keeps_its_values_in_order_its_first_unit_and_its_last_value():
    got = figures.parse(b"t 3 s\ngflops 31\nt 1 s\nt 2 ms\nt 2 s\n")
    assert got["names"]["t"] == {"unit": "s", "values": [3.0, 1.0, 2.0], "count": 3, "last": 2.0}
    assert got["names"]["gflops"]["unit"] is None
    assert got["invalid"]["first"] == [{"line": 4, "text": "t 2 ms",
                                        "why": "unit ms, where this name's first line had s"}]
    assert got["lines"] == 5
    without = figures.parse(b"t 3\nt 3 s\n")["invalid"]["first"][0]["why"]
    assert without == "unit s, where this name's first line had (none)"


def test_the_bounds_names_values_and_quoted_lines():
    many = b"".join(b"n%d 1\n" % i for i in range(figures.MAX_NAMES + 5))
    got = figures.parse(many)
    assert len(got["names"]) == figures.MAX_NAMES
    assert got["invalid"]["count"] == 5 and got["invalid"]["first"][0]["why"] == "a name past the first 256"
    assert "n0" in got["names"] and f"n{figures.MAX_NAMES}" not in got["names"]
    again = figures.parse(many + b"n0 2\n")          # a name already kept still takes values
    assert again["names"]["n0"]["values"] == [1.0, 2.0]
    iters = b"".join(b"t %d\n" % i for i in range(figures.MAX_VALUES + 500))
    t = figures.parse(iters)["names"]["t"]
    assert t["values"] == [float(i) for i in range(figures.MAX_VALUES)]
    assert t["count"] == figures.MAX_VALUES + 500 and t["last"] == float(figures.MAX_VALUES + 499)
    bad = figures.parse(b"".join(b"bad line %d x\n" % i for i in range(50)))["invalid"]
    assert bad["count"] == 50 and len(bad["first"]) == figures.MAX_QUOTED
    assert [q["line"] for q in bad["first"]] == list(range(1, figures.MAX_QUOTED + 1))


def test_a_quoted_line_is_escaped_and_cut():
    got = figures.parse(b"\x1b]0;owned\x07 \xff" + b"z" * 500 + b"\n")["invalid"]["first"][0]
    assert got["why"] == "not UTF-8"
    text = got["text"]
    assert text.isprintable() and text.startswith("\\x1b]0;owned\\x07 \\xff")
    assert len(text) == figures.QUOTE_CAP and text.endswith("...")
    assert figures.escape(b"\xe2\x80\xae rtl \xc2\x85") == "\\u202e rtl \\x85"


def test_a_cut_read_drops_the_line_the_bound_cut_and_a_whole_one_keeps_its_last_line():
    assert figures.parse(b"t 1\nt 12", cut=True)["names"]["t"]["values"] == [1.0]
    assert figures.parse(b"t 1\nt 12\n", cut=True)["names"]["t"]["values"] == [1.0, 12.0]
    assert figures.parse(b"t 1\nt 12")["names"]["t"]["values"] == [1.0, 12.0]   # no final newline
    assert figures.parse(b"") == {"names": {}, "lines": 0, "invalid": {"count": 0, "first": []}}


def test_any_bytes_give_a_bounded_json_able_answer():
    import random
    rng = random.Random(30)
    for _ in range(200):
        data = bytes(rng.choice(b" \t\n#.e+-0123456789abcz\x00\xff\x1b") for _ in range(rng.randrange(400)))
        got = figures.parse(data)
        records.dumps(got)        # the record's codec: no NaN, no infinity
        assert len(got["invalid"]["first"]) <= figures.MAX_QUOTED


# -- the file ----------------------------------------------------------------------
ME = os.getuid()


def test_create_makes_a_new_private_file_of_the_users_under_an_unpredictable_name(tmp_path):
    path, why = figurefile.create(12, ME, os.getgid(), str(tmp_path))
    assert why is None
    assert os.path.basename(path).startswith("hpc-batch-metrics.12.") and len(os.path.basename(path)) == 21 + 16
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == 0
    assert st.st_uid == ME
    other, _ = figurefile.create(12, ME, os.getgid(), str(tmp_path))
    assert other != path


def test_a_name_planted_before_is_never_opened_and_the_variable_is_left_unset(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "urandom", lambda n: b"\0" * n)
    target = tmp_path / "target"
    target.write_text("keep")
    planted = tmp_path / ("hpc-batch-metrics.5." + "00" * 8)
    planted.symlink_to(target)
    path, why = figurefile.create(5, ME, os.getgid(), str(tmp_path))
    assert path == str(planted) and why is not None and "File exists" in why
    assert target.read_text() == "keep" and planted.is_symlink()
    # The recorder says so in the record, and leaves the job's environment without the variable.
    monkeypatch.setattr(figurefile, "DIRECTORY", str(tmp_path))
    rec = recorder.Recorder("/proc/self/no-job-dir", _spec(id=5))
    env = {"PATH": "/usr/bin"}
    rec.make_figures_file(env)
    assert figures.ENV not in env
    field = rec._figures()
    assert field["value"] is None and field["source"] == str(planted)
    assert "File exists" in field["error"] and "HPC_BATCH_METRICS_FILE was not set" in field["error"]


def _made(tmp_path, data=b""):
    path, why = figurefile.create(1, ME, os.getgid(), str(tmp_path))
    assert why is None
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_a_real_file_is_read_parsed_and_removed(tmp_path):
    path = _made(tmp_path, b"time 1.5 s\ntime 2.5 s\noops\n")
    field = figurefile.read(path, ME)
    assert field["source"] == path and "error" not in field
    value = field["value"]
    assert value["names"] == {"time": {"unit": "s", "values": [1.5, 2.5], "count": 2, "last": 2.5}}
    assert value["invalid"]["count"] == 1 and value["bytes"] == 27 and "cut" not in value
    assert not os.path.lexists(path)


def test_a_file_renamed_over_it_by_the_job_is_read(tmp_path):
    path = _made(tmp_path)
    tmp = tmp_path / "atomic"
    tmp.write_bytes(b"t 4\n")
    os.rename(tmp, path)
    assert figurefile.read(path, ME)["value"]["names"]["t"]["values"] == [4.0]


def test_a_symlink_is_not_followed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("rootsecret 42\n")
    path = _made(tmp_path)
    os.unlink(path)
    os.symlink(secret, path)
    field = figurefile.read(path, ME)
    assert field["value"] is None and "symbolic link" in field["error"], field
    assert "rootsecret" not in json.dumps(field)     # (the path's random hex may hold any digits)
    assert os.path.islink(path) and secret.read_text() == "rootsecret 42\n"


@pytest.mark.timeout(10)
def test_a_fifo_is_refused_without_blocking(tmp_path):
    path = _made(tmp_path)
    os.unlink(path)
    os.mkfifo(path, 0o600)
    began = time.monotonic()
    field = figurefile.read(path, ME)     # no writer: a blocking open or read would never return
    assert time.monotonic() - began < 2
    assert field["value"] is None and "FIFO" in field["error"], field
    assert not os.path.lexists(path)      # the job's own FIFO at the name: removed


def test_a_hard_link_is_refused(tmp_path):
    path = _made(tmp_path, b"t 1\n")
    os.link(path, tmp_path / "kept")
    field = figurefile.read(path, ME)
    assert field["value"] is None and "2 hard links" in field["error"], field
    assert not os.path.lexists(path) and (tmp_path / "kept").read_bytes() == b"t 1\n"


def test_a_directory_is_refused_and_left(tmp_path):
    path = _made(tmp_path)
    os.unlink(path)
    os.mkdir(path)
    field = figurefile.read(path, ME)
    assert field["value"] is None and "directory" in field["error"], field
    assert os.path.isdir(path)


def test_a_file_of_another_owner_is_refused_and_left(tmp_path):
    path = _made(tmp_path, b"t 1\n")
    field = figurefile.read(path, ME + 1)
    assert field["value"] is None and f"uid {ME}" in field["error"], field
    assert os.path.exists(path)


def test_a_gone_file_says_so(tmp_path):
    path = _made(tmp_path)
    os.unlink(path)
    field = figurefile.read(path, ME)
    assert field["value"] is None and "removed" in field["error"]


def test_an_oversize_file_is_read_to_the_bound_and_says_it_was_cut(tmp_path, monkeypatch):
    line = b"t 1.25 s\n"
    big = line * (figures.MAX_BYTES // len(line) + 5000)
    path = _made(tmp_path, big)
    with open(path, "r+b") as f:   # sparse and huge: only the bound is ever read
        f.truncate(1 << 40)
    reads = []
    real = os.read

    def counting(fd, n):
        data = real(fd, n)
        reads.append(len(data))
        return data
    monkeypatch.setattr(os, "read", counting)
    field = figurefile.read(path, ME)
    monkeypatch.undo()
    assert sum(reads) <= figures.MAX_BYTES + 1
    value = field["value"]
    assert value["bytes"] == figures.MAX_BYTES and str(1 << 40) in value["cut"]
    whole = figures.MAX_BYTES // len(line)
    assert value["names"]["t"]["count"] == whole and value["invalid"]["count"] == 0   # the cut line is dropped
    assert not os.path.lexists(path)


# -- the record --------------------------------------------------------------------
def _spec(**kw):
    spec = {"id": 9, "user": "root", "uid": ME, "gid": os.getgid(), "cwd": "/", "argv": ["true"],
            "env": {"PATH": "/usr/bin"}, "record": {"cpus": [min(os.sched_getaffinity(0))], "root": "/",
                                                      "version": "?"}}
    spec.update(kw)
    return records.LaunchSpec.from_dict(spec)


def test_the_record_has_the_jobs_figures_and_the_file_is_gone(tmp_path, monkeypatch):
    monkeypatch.setattr(figurefile, "DIRECTORY", str(tmp_path))
    spec = _spec()
    rec = recorder.Recorder("/proc/self/no-job-dir", spec)
    rec.make_figures_file(spec.env)
    path = spec.env[figures.ENV]
    assert os.path.dirname(path) == str(tmp_path)
    with open(path, "ab") as f:
        f.write(b"gflops 31.5\n")
    out = json.loads(bounds.bounded(rec.complete(resource.getrusage(resource.RUSAGE_SELF))))
    assert out["metrics"]["source"] == path
    assert out["metrics"]["value"]["names"]["gflops"]["values"] == [31.5]
    assert not os.path.exists(path)


def test_a_job_never_forked_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(figurefile, "DIRECTORY", str(tmp_path))
    rec = recorder.Recorder("/proc/self/no-job-dir", _spec())
    env: dict = {}
    rec.make_figures_file(env)
    rec.drop_figures_file()
    assert os.listdir(tmp_path) == []
    assert "metrics" not in rec.complete(None)


def test_the_variable_is_per_job_so_the_submitted_digest_leaves_it_out():
    assert figures.ENV == "HPC_BATCH_METRICS_FILE" == recorder.FIGURES_ENV
    assert figures.ENV in software.PER_JOB_VARS
    assert set(setup.PER_JOB_VARS) == set(software.PER_JOB_VARS)      # the client's copy of the list
    a = software.software(_spec(env={"PATH": "/usr/bin", figures.ENV: "/tmp/a"}), False)["environment"]
    b = software.software(_spec(env={"PATH": "/usr/bin", figures.ENV: "/tmp/b"}), False)["environment"]
    assert a["sha256"] != b["sha256"] and a["submitted_sha256"] == b["submitted_sha256"]
    assert setup.classify("software", f"environment.values.{figures.ENV}", "/tmp/a", "/tmp/b") == "noted"


def _big(names):
    return {"schema": 1, "job": 1, "complete": True, "software": {"argv": {"value": ["x"] * 10, "source": "s"}},
            "sentinels": {"start": {"interrupts": {"x": "y" * 1000}}, "end": {}, "delta": {}},
            "verdict": {"verdict": "unknown", "reasons": []},
            "metrics": {"value": {"names": names, "lines": 1, "invalid": {"count": 0, "first": []}},
                        "source": "/tmp/f"}}


def test_a_record_over_its_bound_drops_the_figures_values_last_keeping_count_and_last():
    names = {f"n{i}": {"unit": "s", "values": [1.5] * 1500, "count": 1800, "last": 2.5} for i in range(60)}
    data = bounds.bounded(_big(names))
    out = json.loads(data)
    assert len(data) <= bounds.MAX_BYTES   # the file as written (compact) is what the bound holds
    assert out["cut"][-1] == "metrics.value.names.*.values"
    assert "software.argv" in out["cut"] and "sentinels.start.interrupts" in out["cut"]
    assert out["metrics"]["value"]["names"]["n7"] == {"unit": "s", "count": 1800, "last": 2.5}
    small = json.loads(bounds.bounded(_big({"t": {"unit": None, "values": [1.0], "count": 1, "last": 1.0}})))
    assert "cut" not in small and small["metrics"]["value"]["names"]["t"]["values"] == [1.0]


# -- reading it: show --record and record diff -------------------------------------
def _with(metrics):
    return {"schema": 1, "job": 4, "complete": True, "verdict": {"verdict": "unknown", "reasons": []},
            "kernel": {"release": {"value": "6.1", "source": "/proc/sys/kernel/osrelease"}}, "metrics": metrics}


def test_show_record_gives_each_name_readably_and_escapes_what_the_file_said():
    value = figures.parse(b"time 1.5 s\ntime 2 s\ngflops 31\n\x1b[2J 1\nt 1 \x1b\n")
    value["bytes"] = 40
    lines = recorddiff.render(_with({"value": value, "source": "/tmp/hpc-batch-metrics.4.ab"})).splitlines()
    at = lines.index("metrics (/tmp/hpc-batch-metrics.4.ab)")
    assert lines[at - 1].startswith("record: ") and lines[at + 1:at + 3] == [
        "  time: last 2 s, 2 values: 1.5, 2", "  gflops: last 31, 1 value: 31"]
    assert lines[at + 3] == "  invalid lines: 2, the first 2:"
    assert lines[at + 4].startswith('    line 4: "\\x1b[2J 1" (a name is')
    assert lines[at + 5].startswith('    line 5: "t 1 \\x1b" (a unit is')
    assert lines[at + 6] == "kernel"
    assert "\x1b" not in "\n".join(lines)
    # A name with more values than kept says how many it shows.
    many = figures.parse(b"".join(b"t %d\n" % i for i in range(1500)))
    said = recorddiff.render(_with({"value": many, "source": "/tmp/f"}), width=80).splitlines()
    row = next(line for line in said if line.startswith("  t: "))
    assert row.startswith("  t: last 1499, 1500 values (the first 1000): 0, 1, 2") and len(row) <= 80


def test_show_record_gives_why_no_figures_were_read():
    field = {"value": None, "source": "/tmp/x", "error": "found a symbolic link, not read\x1b[31m"}
    lines = recorddiff.render(_with(field)).splitlines()
    at = lines.index("metrics (/tmp/x)")
    assert lines[at + 1] == "  null (found a symbolic link, not read\\x1b[31m)"
    empty = figures.parse(b"")
    assert "  (none written)" in recorddiff.render(_with({"value": empty, "source": "/tmp/x"})).splitlines()


def test_record_diff_reports_figures_as_the_run_never_the_setup():
    a = _with({"value": figures.parse(b"t 1 s\n"), "source": "/tmp/a"})
    b = _with({"value": figures.parse(b"t 2 s\nu 3\n"), "source": "/tmp/b"})
    diffs = recorddiff.differences(a, b)
    assert diffs and all(d.section == "metrics" for d in diffs)
    assert {recorddiff.classify(*d) for d in diffs} == {"run"}
    assert recorddiff.comparable(diffs)
    out = recorddiff.format_diff(diffs, "a", "b")
    assert out.startswith("comparable:") and "names.t.values: 1.0 | 2.0" in out

"""dispatch's pure parts and its usage errors (no daemon needed)."""

import json

import pytest

from hpc_batch.client import cli


@pytest.mark.parametrize("words,env,argv", [
    (["make", "CC=gcc"], {}, ["make", "CC=gcc"]),
    (["A=1", "B=x=y", "env"], {"A": "1", "B": "x=y"}, ["env"]),
    (["A=1"], {"A": "1"}, []),
    (["1A=2", "x"], {}, ["1A=2", "x"]),
])
def test_split_env(words, env, argv):
    assert cli.split_env(words) == (env, argv)


@pytest.mark.parametrize("text,value", [("84", 84 << 30), ("1.5", 3 << 29), ("512M", 512 << 20),
                                        ("64G", 64 << 30), ("2GiB", 2 << 30), ("1T", 1 << 40)])
def test_parse_mem(text, value):
    assert cli.parse_mem(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-1", "0", "5X"])
def test_parse_mem_rejects(text):
    with pytest.raises(cli.UsageError):
        cli.parse_mem(text)


@pytest.mark.parametrize("args,needle", [
    (["new"], "missing the command"),
    (["bogus"], "unknown command 'bogus'"),
    ([], "no command given"),
    (["new", "--frob", "--", "x"], "unknown option '--frob'"),
    (["kill"], "missing or invalid arguments"),
])
def test_usage_errors_exit_2_with_one_clear_line(capsys, args, needle):
    assert cli.main(args) == 2
    err = capsys.readouterr().err.splitlines()
    assert needle in err[0] and (len(err) == 1 or err[1].startswith("Usage:"))


# Bad input the first hour found (issue 32), refused by dispatch before any daemon is asked: each
# with one line naming the flag and what it takes. HPC_BATCH_SOCKET points nowhere, so anything
# that slipped through would say "cannot reach" instead.
@pytest.mark.parametrize("args,needle", [
    (["new", "--cpu", "--", "echo", "hi"], "--cpu needs a value, e.g. --cpu 4"),
    (["new", "--max-time"], "--max-time needs a value"),
    (["new", "--benchmark", "bogus", "--", "echo", "hi"], "--benchmark 'bogus': expected warn or strict"),
    (["new", "--benchmark", "stirct", "./bench"], "--benchmark 'stirct': expected warn or strict"),
    (["new", "--after", "1,,2", "--", "true"], "--after '1,,2': an empty job between commas"),
    (["new", "--after-ok", "3,", "--", "true"], "--after-ok '3,': an empty job between commas"),
    (["new", "--max-mem", "99999999999", "--", "true"], "larger than any machine's memory"),
    (["new", "--max-time", "99999d", "--", "true"], "longer than the 100 years"),
])
def test_bad_input_to_new_is_one_line_naming_the_flag(capsys, monkeypatch, args, needle):
    monkeypatch.setenv("HPC_BATCH_SOCKET", "/nonexistent/hpc-batch.sock")
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


@pytest.mark.parametrize("args", [
    ["new", "--benchmark", "--cpu", "2", "--", "x"],
    ["new", "--benchmark", "strict", "--", "x"],
    ["new", "--benchmark", "./bench"],           # a command after a bare --benchmark is still one
    ["new", "--after", "1, 2", "--", "true"],
])
def test_good_input_to_new_reaches_for_the_daemon(capsys, monkeypatch, args):
    monkeypatch.setenv("HPC_BATCH_SOCKET", "/nonexistent/hpc-batch.sock")
    assert cli.main(args) == 69
    assert "cannot reach" in capsys.readouterr().err


@pytest.mark.parametrize("a,b,near", [("stirct", "strict", True), ("strit", "strict", True),
                                      ("wran", "warn", True), ("bogus", "strict", False),
                                      ("./bench", "warn", False), ("make", "warn", False)])
def test_a_near_miss_of_a_mode_is_two_edits_at_most(a, b, near):
    assert cli._near(a, b) is near


# Issue 32, items 6 and 7: the rest of the first hour's bad input.
@pytest.mark.parametrize("args,needle", [
    (["new", "--max-mem", "1k", "--", "true"], "--max-mem '1k': less than the 16M a job needs"),
    (["new", "--max-mem", "10KB", "--", "true"], "--max-mem '10KB': less than the 16M"),
    (["new", "--max-mem", "512B", "--", "true"], "--max-mem '512B': expected a number in GiB"),
    (["show", "-1"], "job id '-1': job ids are whole numbers from 1"),
    (["show", "0"], "job id '0'"),
    (["kill", "+5"], "job id '+5'"),
    (["job", "1", "max-time", "add", "-5m"], "max-time add '-5m': a duration is longer than zero seconds"),
    (["new", "--after", "-3", "--", "true"], "--after: job id '-3'"),
    (["new", "--gpu-link", "NV0", "--", "true"], "--gpu-link: unknown GPU link class 'NV0'"),
    (["history", "--limit"], "--limit needs a value, e.g. --limit 20"),
    (["status", "--json=yes"], "--json takes no value"),
])
def test_more_bad_input_is_one_line_naming_what(capsys, monkeypatch, args, needle):
    monkeypatch.setenv("HPC_BATCH_SOCKET", "/nonexistent/hpc-batch.sock")
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


@pytest.mark.parametrize("text,value", [("16M", 16 << 20), ("10KB", None), ("64GB", 64 << 30), ("1kib", None),
                                        ("16384k", 16 << 20)])
def test_kb_and_kib_are_k_and_a_job_gets_16m_at_least(text, value):
    if value is None:
        with pytest.raises(cli.UsageError, match="less than the 16M"):
            cli.parse_mem(text)
    else:
        assert cli.parse_mem(text) == value


def test_the_help_names_the_units_and_the_floor():
    from hpc_batch.bounds import MIN_JOB_MEM
    from hpc_batch.client.cli_usage import NEW_USAGE
    from hpc_batch.core.sizes import format_size
    text = " ".join(NEW_USAGE.split())
    assert f"at least {format_size(MIN_JOB_MEM)}" in text and "K, M, G or T" in text


@pytest.mark.parametrize("args,needle", [
    (["record", "diff", "missing.json", "5"], "cannot read the record file missing.json: No such file or directory"),
    (["record", "diff", "./notarecord", "5"], "./notarecord is not a record"),
    (["record", "diff", "./garbage", "5"], "./garbage: not a record"),
])
def test_record_diff_says_why_it_cannot_read_a_file_and_exits_66_not_1(capsys, monkeypatch, tmp_path, args, needle):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HPC_BATCH_SOCKET", "/nonexistent/hpc-batch.sock")
    (tmp_path / "notarecord").write_text('{"jobs": []}')
    (tmp_path / "garbage").write_text("not json")
    assert cli.main(args) == cli.EX_NO_INPUT == 66
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "[Errno" not in err[0], err


class _Conn:
    """A daemon that answers one new request with *result*."""

    def __init__(self, result):
        self.result = result

    def __call__(self):
        return self

    def call(self, op, meanwhile=None, **args):
        assert op == "new"
        if meanwhile is not None:
            meanwhile()
        return {"ok": True, "result": self.result}


@pytest.mark.parametrize("result,printed", [
    ({"id": 12, "state": "queued", "mem": 1 << 30, "output": None}, "12\n"),
    ({"id": 12, "last": 15, "count": 4, "starting": 1, "state": "queued", "mem": 1 << 30, "output": None},
     "12-15\n"),
])
def test_new_parsable_prints_the_id_alone_and_a_bulks_range(capsys, monkeypatch, tmp_path, result, printed):
    monkeypatch.chdir(tmp_path)
    a = cli.scan(["new", "--parsable", "--no-output", "--", "true"], "new", cli.SUBCOMMANDS["new"])
    assert cli.cmd_new(_Conn(result), a) == 0
    assert capsys.readouterr().out == printed


def test_parsable_and_json_are_one_or_the_other(capsys, monkeypatch):
    monkeypatch.setenv("HPC_BATCH_SOCKET", "/nonexistent/hpc-batch.sock")
    assert cli.main(["new", "--parsable", "--json", "--", "true"]) == 2
    doc = json.loads(capsys.readouterr().out)   # --json: the refusal is a JSON document too
    assert doc["code"] == "usage" and "give --parsable (the id alone) or --json" in doc["error"]

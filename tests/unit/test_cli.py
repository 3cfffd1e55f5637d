"""dispatch's pure parts and its usage errors (no daemon needed)."""

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
    (["new", "--frob", "--", "x"], "unexpected argument '--frob'"),
    (["kill"], "missing or invalid arguments"),
])
def test_usage_errors_exit_2_with_one_clear_line(capsys, args, needle):
    assert cli.main(args) == 2
    err = capsys.readouterr().err.splitlines()
    assert needle in err[0] and err[1].startswith("Usage:")


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

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

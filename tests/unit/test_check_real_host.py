"""tests/bench-mode/check-real-host: its pure parts (the command line, the statistics, the SMT
refusal over recorded sysfs trees). The run itself needs a real SMT host and has not run here."""

import importlib.machinery
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "bench-mode", "check-real-host")
SYSFS = os.path.join(ROOT, "tests", "fixtures", "sysfs")


def _load():
    loader = importlib.machinery.SourceFileLoader("check_real_host", SCRIPT)
    spec = importlib.util.spec_from_loader("check_real_host", loader)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_real_host"] = mod   # its dataclasses look their module up there
    loader.exec_module(mod)
    return mod


crh = _load()


def test_the_script_is_executable():
    assert os.access(SCRIPT, os.X_OK)


def test_defaults_and_choices():
    args = crh.parse_args([])
    assert args.runs == 30 and args.only == {"a", "b", "c"} and args.mib == 64 and args.sysfs == "/sys"
    args = crh.parse_args(["--runs", "5", "--only", "a, c", "--other-user", "bob"])
    assert args.runs == 5 and args.only == {"a", "c"} and args.other_user == "bob"


def test_calibrate_takes_its_own_defaults():
    """--calibrate measures the verdict's error rate (bench/verdict's code) instead of the conditions a-c."""
    args = crh.parse_args(["--calibrate"])
    assert args.calibrate and args.runs == 20 and args.seconds == 1.0 and args.kinds is None
    args = crh.parse_args(["--calibrate", "--runs", "5", "--kinds", "busy,irq", "--verdicts-only"])
    assert args.runs == 5 and args.kinds == "busy,irq" and args.verdicts_only


@pytest.mark.parametrize("argv", [["--only", "a,d"], ["--only", ","], ["--runs", "0"], ["--mib", "-1"],
                                  ["--runs", "x"], ["--calibrate", "--seconds", "0"]])
def test_bad_command_lines_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        crh.parse_args(argv)
    assert exc.value.code == 2
    assert "check-real-host" in capsys.readouterr().err


def test_spread_median_min_max_iqr():
    s = crh.spread([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.n, s.median, s.low, s.high) == (5, 3.0, 1.0, 5.0)
    assert (s.q1, s.q3, s.iqr) == (2.0, 4.0, 2.0)
    one = crh.spread([0.5])
    assert one.iqr == 0 and one.median == 0.5
    with pytest.raises(ValueError):
        crh.spread([])
    assert "median 3.0000 s" in s.text() and "IQR 2.0000" in s.text()


def test_verdict_says_what_was_measured():
    a = crh.spread([1.00, 1.01, 0.99, 1.00])
    b = crh.spread([1.30, 1.31, 1.29, 1.30])
    line = crh.verdict({"a": a, "b": b, "c_bench": a, "c_plain": crh.spread([1.0, 1.02, 0.99, 1.01])})
    assert line.startswith("verdict: ")
    assert "held idle: +30.0% (clear)" in line
    assert "not steered vs steered: +0.5% (within the noise)" in line
    assert crh.verdict({}) == "verdict: nothing measured"


@pytest.mark.parametrize("tree,cores", [("qemu-2s-smt-adjacent", 4), ("intel-2s-xeon-gold-6248", 40),
                                        ("laptop-1node", 4), ("intel-i9-12900k-hybrid", 8)])
def test_smt_trees_pass(tree, cores):
    smt = crh.require_smt(os.path.join(SYSFS, tree))
    assert len(smt) == cores and all(len(g) == 2 for g in smt)


def test_a_tree_without_smt_is_refused():
    root = os.path.join(SYSFS, "dev-container-real")
    with pytest.raises(crh.Refused, match="needs a host with 2 threads per core"):
        crh.require_smt(root)


def test_refusal_through_main_exits_2(capsys):
    rc = crh.main(["--sysfs", os.path.join(SYSFS, "dev-container-real")])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("check-real-host: needs a host with 2 threads per core") and err.count("\n") == 1


def test_device_irqs_counts_numbered_lines_on_the_cpus_asked():
    text = ("           CPU0       CPU1       CPU2\n"
            "  24:         10          5          1   PCI-MSI  virtio0\n"
            "  25:          0        100          0   PCI-MSI  nvme0q1\n"
            "LOC:       9999       9999       9999   Local timer interrupts\n"
            " ERR:          0\n")
    assert crh.device_irqs(text, {1}) == 105
    assert crh.device_irqs(text, {0, 2}) == 11
    assert crh.device_irqs("", {0}) == 0

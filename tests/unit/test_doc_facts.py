"""The docs and usage texts say what the code does: each fact they repeat is checked here.

The tables are found by their header row wherever they live (README.md or a page under
docs/), so moving a table between pages keeps it checked; losing one fails.

- the exit-status table and every list of dispatch's exit statuses against
  ``messages.REFUSALS``, ``messages.CLIENT_FAILURES`` and ``jobs.WAIT_STATUS``;
- the daemon-flag table against the daemon's usage (its flags and defaults);
- the metrics table against the metric families the daemon writes;
- every ``module.name`` and ``file.py`` docs/architecture.md names must exist.
"""

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import shepherd
from hpc_batch.client import cli_usage
from hpc_batch.core import jobs, metrics
from hpc_batch.daemon import main as daemon_main
from hpc_batch.wire.messages import CLIENT_FAILURES, REFUSALS

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _tables():
    """Every markdown table in the docs: (file, header cells lowercased, rows of cells)."""
    for path in DOCS:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].lstrip().startswith("|") and i + 1 < len(lines) and re.match(r"\s*\|\s*-", lines[i + 1]):
                header = [c.strip().lower() for c in lines[i].strip().strip("|").split("|")]
                rows = []
                i += 2
                while i < len(lines) and lines[i].lstrip().startswith("|"):
                    rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                    i += 1
                yield path.relative_to(ROOT), header, rows
            else:
                i += 1


def _tables_headed(test) -> list:
    found = [(path, rows) for path, header, rows in _tables() if test(header)]
    assert found, "no such table in README.md or docs/*.md any more"
    return found


def _code(cell: str) -> str:
    """The text inside a cell's backticks ("" when it has none)."""
    m = re.search(r"`([^`]*)`", cell)
    return m.group(1) if m else ""


# -- exit statuses ------------------------------------------------------------------------

def _exit_statuses() -> dict[int, str]:
    return {0: "", **{status: code for code, status in {**REFUSALS, **CLIENT_FAILURES}.items()}}


def test_the_psij_bridge_sorts_only_codes_dispatch_gives():
    from hpc_batch.psij import mapping
    assert {*REFUSALS, *CLIENT_FAILURES} >= mapping.INVALID | mapping.TRANSIENT


def test_the_codes_never_share_a_status():
    statuses = [*REFUSALS.values(), *CLIENT_FAILURES.values()]
    assert len(set(statuses)) == len(statuses) and 0 not in statuses
    assert not set(statuses) & set(jobs.WAIT_STATUS.values())   # dispatch wait's block is its own


def test_the_exit_status_table_lists_every_code_with_its_status():
    for path, rows in _tables_headed(lambda h: h[:2] == ["status", "code"]):
        table = {int(row[0]): _code(row[1]) for row in rows}
        assert table == _exit_statuses(), path


def test_the_usage_lists_every_exit_status():
    text = " ".join(cli_usage.USAGE.split())
    listed = text.split("Exit status:", 1)[1].split("dispatch wait", 1)[0]
    statuses = [int(re.match(r"\s*(\d+) ", part).group(1)) for part in listed.split(";")]   # type: ignore[union-attr]
    assert sorted(statuses) == sorted(_exit_statuses())


def _wait_statuses(text: str, quote: str = "") -> dict[str, int]:
    """``240 killed`` (usage) or, with *quote* a backtick, ``240 `killed``` and ``| 240 | `killed` |`` (docs)."""
    text = " ".join(text.split())
    pairs = re.findall(rf"\b(2[0-9]{{2}}) (?:\| )?{quote}([a-z][a-z-]+){quote}", text)
    return {name: int(status) for status, name in pairs if name in jobs.RESULTS}


@pytest.mark.parametrize("name", ["USAGE", "WAIT_USAGE"])
def test_the_usage_texts_give_dispatch_waits_statuses(name):
    assert _wait_statuses(getattr(cli_usage, name)) == jobs.WAIT_STATUS


def test_the_docs_give_dispatch_waits_statuses():
    every: dict[str, int] = {}
    for path in DOCS:
        found = _wait_statuses(path.read_text(), "`")
        for name, status in found.items():
            assert jobs.WAIT_STATUS.get(name) == status, f"{path.name}: {status} {name}"
        every.update(found)
    assert every == jobs.WAIT_STATUS, "some of dispatch wait's statuses are in no page"


# -- the daemon's flags -------------------------------------------------------------------

def _usage_options() -> dict[str, str | None]:
    """The daemon usage's options: flag -> its [default: ...] (None without one)."""
    options: dict[str, list[str]] = {}
    flag = None
    for line in daemon_main.USAGE.split("Options:", 1)[1].splitlines():
        m = re.match(r"  (?:-\w )?(--[\w-]+)", line)
        if m:
            flag = m.group(1)
            options[flag] = []
        if flag is not None:
            options[flag].append(line)
    out = {}
    for flag, lines in options.items():
        m = re.search(r"\[default: ([^\]]*)\]", " ".join(lines))
        out[flag] = m.group(1) if m else None
    return out


def test_the_flag_table_lists_every_daemon_flag_with_its_default():
    expected = {flag: default for flag, default in _usage_options().items() if flag not in ("--help", "--version")}
    for path, rows in _tables_headed(lambda h: h[:2] == ["flag", "default"]):
        table = {_code(row[0]).split()[0]: row[1] for row in rows}
        assert sorted(table) == sorted(expected), path
        for flag, default in expected.items():
            if default is None:   # off, none, a sentence: never a value in backticks
                assert not _code(table[flag]), (path, flag, table[flag])
            else:
                assert _code(table[flag]) == default, (path, flag, table[flag])


# -- metrics ------------------------------------------------------------------------------

def _metric_samples() -> dict[str, set[str]]:
    """Sample name -> label names, as the daemon writes them (one of everything present)."""
    snap = metrics.Snapshot(
        version="0", start_time=0.0, jobs=(("alice", tuple(1 for _ in metrics.JOB_GAUGES)),),
        submitted=1, started=1, finished=tuple((kind, 0) for kind in jobs.RESULTS),
        nodes=tuple(("0", key, part, 1) for key, part, _, _ in metrics.NODE_GAUGES))
    out: dict[str, set[str]] = {}
    for family in metrics.families(snap):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def test_the_metrics_table_lists_every_metric_with_its_labels():
    expected = _metric_samples()
    for path, rows in _tables_headed(lambda h: h[:2] == ["metric", "labels"]):
        table = {_code(row[0]): set(re.findall(r"`([^`]+)`", row[1])) for row in rows}
        assert table == expected, path


# -- docs/architecture.md's names ---------------------------------------------------------

def _modules() -> dict[str, list[str]]:
    """Short module name -> the full names of the project's modules of that name."""
    out: dict[str, list[str]] = {}
    for package in (importlib.import_module("hpc_batch"), shepherd):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith("__main__") or "-" in info.name:   # programs, run when imported
                continue
            out.setdefault(info.name.rsplit(".", 1)[1], []).append(info.name)
    out.setdefault("shepherd", []).append("shepherd")
    return out


def _resolves(dotted: str, modules: dict[str, list[str]]) -> bool:
    first, *rest = dotted.split(".")
    if first[0].isupper():   # Class.attr: a class of that name in any module
        candidates = [getattr(importlib.import_module(m), first) for ms in modules.values() for m in ms
                      if inspect.isclass(getattr(importlib.import_module(m), first, None))]
    else:
        candidates = [importlib.import_module(m) for m in modules.get(first, [])]
    return any(_has_path(obj, rest) for obj in candidates)


def _has_path(obj, path: list[str]) -> bool:
    for i, name in enumerate(path):
        nxt = getattr(obj, name, None)
        if nxt is None and inspect.ismodule(obj):
            try:
                nxt = importlib.import_module(f"{obj.__name__}.{name}")
            except ImportError:
                nxt = None
            if nxt is None:   # module.method, the method of the module's class (server.watch_pidfd)
                return any(_has_path(cls, path[i:]) for _, cls in inspect.getmembers(obj, inspect.isclass)
                           if cls.__module__ == obj.__name__)
        if nxt is None:
            return False
        obj = nxt
    return True


FILE_NAMES = (".json", ".jsonl", ".pid", ".md", ".log", ".prom", ".sock", ".service")


def test_every_module_name_docs_architecture_gives_exists():
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)`", text))
    modules = _modules()
    files = {p.name for p in ROOT.glob("hpc_batch/**/*.py")} | {p.name for p in ROOT.glob("shepherd/**/*.py")} \
        | {p.name for p in ROOT.glob("dist/**/*.py")}
    missing = []
    for dotted in sorted(named):
        if dotted.endswith(FILE_NAMES):
            continue
        if dotted.endswith(".py"):
            if dotted not in files:
                missing.append(dotted)
        elif not _resolves(dotted, modules):
            missing.append(dotted)
    for path in sorted(set(re.findall(r"`((?:hpc_batch|shepherd|dist|tests|bench|scripts)/[\w./-]+)`", text))):
        if not (ROOT / path).exists():
            missing.append(path)
    assert not missing, f"docs/architecture.md names what is not there: {', '.join(missing)}"

"""Reading a job's record: ``dispatch show --record`` and ``dispatch record diff`` (pure).

A record (``jobs/<id>/record.json``, written by the shepherd; docs/record.md)
is nested sections whose leaves are *fields*: ``{"value": V, "source": S}``,
or ``{"value": null, "source": S, "error": why}``. Both functions here look
at values only: sources say where a value came from, not what it is.

``differences`` pairs two records leaf by leaf. ``format_diff`` answers the
question a reader has first, "can these two numbers be compared?", by
sorting each difference into one of four kinds (:func:`classify`):

- ``setup``: the machine, kernel, CPU, frequency and memory settings, the
  allocation's shape, the GPUs and the job's software. Only these decide
  "comparable".
- ``noted``: shown, not counted: which CPUs or GPUs of the same shape the
  job got (placement), the hpc-batch version, the boot, the schema.
- ``run``: what happened during each run (the sentinels' deltas, the
  verdict, GPU temperatures and clock-event reasons, the job's own
  figures) and the machine's state at the start (free memory, the other
  jobs beside it); reported in a block of its own.
- ``ignored``: never shown: times, the job id, the digest, the raw sentinel
  snapshots, pids, the job's cgroup path.

The pairing and the rules are ``hpc_batch/core/setup.py``'s (the daemon
digests each record's setup with them); this module formats what they find,
and re-exports ``differences``, ``classify`` and ``comparable`` for the CLI.
"""

from __future__ import annotations

import json
import shlex
import textwrap
from typing import Any

from ..core.cut import one_line
from ..core.setup import Difference, classify, comparable
from ..core.setup import differences as differences  # re-exported: cli.py's record diff
from ..core.setup import is_field as _is_field
from ..core.setup import is_scalar as _is_scalar
from ..core.setup import join_key as _join
from ..core.setup import unwrap as _unwrap

WIDTH = 100     # a terminal's width and a bit; longer values wrap or are cut, --json has them whole

# The record's sections in the order people read them (after the verdict).
SECTIONS = ("collector", "kernel", "cpu", "frequency", "memory", "allocation", "machine", "gpu",
            "software", "sentinels")

# What "comparable" lists as the same, in order: (section, words).
SETUP_WORDS = (("collector", "machine"), ("kernel", "kernel"), ("cpu", "CPU"),
               ("frequency", "frequency"), ("memory", "memory"),
               ("allocation", "allocation shape"), ("machine", "IRQs"),
               ("gpu", "GPUs"), ("software", "software"))


def summary(diffs: list[Difference]) -> str:
    """The first line of :func:`format_diff`: whether the records compare, and if not, where they differ."""
    counted: dict[str, int] = {}
    for d in diffs:
        if classify(*d) == "setup":
            counted[d.section] = counted.get(d.section, 0) + 1
    if not counted:
        return "comparable: same " + ", ".join(w for _, w in SETUP_WORDS[:-1]) + " and " + SETUP_WORDS[-1][1]
    order = {s: i for i, s in enumerate(SECTIONS)}
    parts = []
    for n, (section, count) in enumerate(sorted(counted.items(), key=lambda kv: (order.get(kv[0], 99), kv[0]))):
        noun = (" difference" if count == 1 else " differences") if n == 0 else ""
        parts.append(f"{count}{noun} in {section}")
    return "not comparable: " + ", ".join(parts)


def _text(value: Any, key: str = "") -> str:
    """One value as people read it: JSON's words for null and booleans, lists joined, escaped.

    A command line (a key ending in ``argv``) is written as a shell would take it back.
    """
    if key.endswith("argv") and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return one_line(shlex.join(value))
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return one_line(value) if value else '""'     # an empty file (no isolated CPUs) is not nothing
    if isinstance(value, list) and all(map(_is_scalar, value)):
        return ", ".join(_text(v) for v in value) if value else "(none)"
    if isinstance(value, (dict, list)):
        return one_line(json.dumps(value, sort_keys=True))
    return str(value)


def _cut(text: str, room: int, start: int = 0) -> str:
    """*text* in at most *room* characters (from about *start*), saying how much was left out."""
    room = max(room, 24)
    if len(text) <= room:
        return text
    if start > 0:
        start = max(0, start - 10)
        text = "..." + text[start:]
        if len(text) <= room:
            return text
    kept = room - len(f"... ({len(text)} more)")
    return f"{text[:kept]}... ({len(text) - kept} more)"


def _tokens(value: Any) -> list[str] | None:
    """The items of a list of plain values, or the words of a long string (a command line)."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):   # numbers: a | b says more
        return [_text(v) for v in value]
    if isinstance(value, str) and " " in value.strip() and len(value) > 40:
        return [one_line(word) for word in value.split()]     # a word may hold an escape sequence
    return None


def _diff_lines(key: str, a: Any, b: Any, indent: str, width: int) -> list[str]:
    """The lines of one difference: ``key: a | b`` when it fits, else what was added and taken away."""
    label = one_line(key) or "(value)"
    ta, tb = (None, None) if key.endswith("argv") else (_tokens(a), _tokens(b))   # an argv's order counts
    if ta is not None and tb is not None and set(ta) != set(tb):
        only_a = [t for t in ta if t not in set(tb)]
        only_b = [t for t in tb if t not in set(ta)]
        said = "; ".join(part for part in (
            "only in a: " + ", ".join(only_a) if only_a else "",
            "only in b: " + ", ".join(only_b) if only_b else "") if part)
        line = f"{indent}{label}: {said}"
        if len(line) <= width:
            return [line]
        # Long items (a verdict's reasons, long arguments): one a line.
        return [f"{indent}{label}:"] + [line for side, items in (("a", only_a), ("b", only_b)) for item in items
                                         for line in _wrapped(f"only in {side}: {item}", indent + "  ", width, 3)]
    xa, xb = _text(a, key), _text(b, key)
    line = f"{indent}{label}: {xa} | {xb}"
    if len(line) <= width:
        return [line]
    first = next((i for i, (ca, cb) in enumerate(zip(xa, xb)) if ca != cb), min(len(xa), len(xb)))
    room = width - len(indent) - 5
    return [f"{indent}{label}:", f"{indent}  a: {_cut(xa, room, first)}", f"{indent}  b: {_cut(xb, room, first)}"]


def _grouped(diffs: list[Difference], indent: str, width: int) -> list[str]:
    order = {s: i for i, s in enumerate(SECTIONS)}
    lines: list[str] = []
    by_section: dict[str, list[Difference]] = {}
    for d in diffs:
        by_section.setdefault(d.section, []).append(d)
    for section in sorted(by_section, key=lambda s: (order.get(s, -1 if s in ("verdict", "complete") else 99), s)):
        items = by_section[section]
        if len(items) == 1 and not items[0].key:
            lines += _diff_lines(section, items[0].a, items[0].b, indent, width)
            continue
        lines.append(f"{indent}{one_line(section)}")
        for d in items:
            lines += _diff_lines(d.key, d.a, d.b, indent + "  ", width)
    return lines


def format_diff(diffs: list[Difference], a_name: str, b_name: str, width: int = WIDTH) -> str:
    """``dispatch record diff A B`` for people: whether A and B compare, then only what differs.

    The first line answers "can these two be compared?" from the ``setup``
    differences; they follow, grouped by section; then the ``noted`` ones
    (where each ran, the tool's version) and what happened during the runs,
    each in a block of its own. ``ignored`` differences are left out.
    """
    kinds: dict[str, list[Difference]] = {"setup": [], "noted": [], "run": [], "ignored": []}
    for d in diffs:
        kinds[classify(*d)].append(d)
    lines = [summary(diffs), f"a: {one_line(a_name)}", f"b: {one_line(b_name)}"]
    if kinds["setup"]:
        lines += ["", "setup (these decide):"] + _grouped(kinds["setup"], "  ", width)
    if kinds["noted"]:
        lines += ["", "where each ran and what recorded it (not counted):"] + _grouped(kinds["noted"], "  ", width)
    if kinds["run"]:
        lines += ["", "the machine's state and the runs (reported, not counted):"] + \
            _grouped(kinds["run"], "  ", width)
    if not any(kinds[k] for k in ("setup", "noted", "run")):
        lines += ["", "nothing else differs"]
    return "\n".join(lines)


def diff_json(diffs: list[Difference], a_name: str, b_name: str) -> dict[str, Any]:
    """``dispatch record diff --json``: the summary and every shown difference with its kind."""
    return {"a": a_name, "b": b_name, "comparable": comparable(diffs), "summary": summary(diffs),
            "differences": [{"section": d.section, "key": d.key, "a": d.a, "b": d.b, "kind": kind}
                            for d in diffs if (kind := classify(*d)) != "ignored"]}


RENDER_LINES = 4    # a long value (a kernel command line) wraps onto this many lines at most, then is cut


def _wrapped(text: str, indent: str, width: int, most: int = RENDER_LINES) -> list[str]:
    """*text* (its first line at *indent*) wrapped to *width*, on at most *most* lines, the last cut."""
    if len(text) <= width - len(indent):
        return [indent + text]
    later = indent + "    "
    lines = textwrap.wrap(text, max(width, 24), initial_indent=indent, subsequent_indent=later,
                          break_on_hyphens=False, drop_whitespace=True)
    if len(lines) <= most:
        return lines
    shown = lines[:most - 1]
    rest = " ".join(line.strip() for line in lines[most - 1:])
    return shown + [_cut(later + rest, width)]


def _render_node(node: Any, key: str, indent: str, width: int, lines: list[str]) -> None:
    if _is_field(node):
        value = node.get("value")
        if value is None and node.get("error"):
            lines += _wrapped(f"{one_line(key)}: null ({one_line(str(node['error']))})", indent, width)
            return
        if isinstance(value, (dict, list)) and not (isinstance(value, list) and all(map(_is_scalar, value))):
            _render_node(value, key, indent, width, lines)
            return
        lines += _wrapped(f"{one_line(key)}: {_text(value, key)}", indent, width)
    elif isinstance(node, dict):
        if not node:
            lines.append(f"{indent}{key}: (none)")
        for k, v in node.items():
            _render_node(v, _join(key, one_line(str(k))), indent, width, lines)
    elif isinstance(node, list) and not all(map(_is_scalar, node)):
        for i, v in enumerate(node):
            _render_node(v, f"{key}[{i}]", indent, width, lines)
    else:
        lines += _wrapped(f"{one_line(key)}: {_text(node, key)}", indent, width)


def _verdict_lines(verdict: Any, width: int) -> list[str]:
    verdict = _unwrap(verdict)
    if not isinstance(verdict, dict):
        return [f"verdict: {_text(verdict) if verdict is not None else 'none (the record is incomplete)'}"]
    lines = [f"verdict: {_text(_unwrap(verdict.get('verdict')))}"]
    for reason in _unwrap(verdict.get("reasons")) or []:     # the verdict's grounds: wrapped, never cut short
        lines += _wrapped(f"- {_text(reason)}", "  ", width, most=8)
    thresholds = _unwrap(verdict.get("thresholds"))
    if isinstance(thresholds, dict) and thresholds:
        said = ", ".join(f"{one_line(str(k))}={_text(_unwrap(v))}" for k, v in sorted(thresholds.items()))
        lines += textwrap.wrap(f"thresholds: {said}", max(width, 24), initial_indent="  ", subsequent_indent="    ",
                               break_on_hyphens=False)
    for note in _unwrap(verdict.get("notes")) or []:     # sentinels that could not be judged
        lines += _wrapped(f"note: {_text(note)}", "  ", width)
    for k, v in verdict.items():
        if k not in ("verdict", "reasons", "thresholds", "notes"):
            _render_node(v, one_line(str(k)), "  ", width, lines)
    return lines


def _number(value: Any) -> str:
    """A figure as people write it: ``31`` for 31.0, else as JSON has it."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return _text(value)


def _metrics_lines(node: Any, width: int) -> list[str]:
    """The job's own figures: one line a name (its last value and unit, then its values), then the
    invalid lines quoted. Every string from the job's file is escaped (``one_line``)."""
    source = node.get("source") if _is_field(node) else None
    lines = [_cut("metrics" + (f" ({one_line(str(source))})" if source is not None else ""), width)]
    value = _unwrap(node)
    if value is None and isinstance(node, dict) and node.get("error"):
        return lines + _wrapped(f"null ({one_line(str(node['error']))})", "  ", width)
    if not isinstance(value, dict) or not isinstance(value.get("names"), dict):
        _render_node(value, "value", "  ", width, lines)
        return lines
    if not value["names"]:
        lines.append("  (none written)")
    for name, entry in value["names"].items():
        if not isinstance(entry, dict):
            lines += _wrapped(f"{one_line(str(name))}: {_text(entry)}", "  ", width)
            continue
        unit = f" {one_line(str(entry['unit']))}" if entry.get("unit") else ""
        count = entry.get("count")
        said = f"{one_line(str(name))}: last {_number(entry.get('last'))}{unit}, " \
               f"{_text(count)} value{'' if count == 1 else 's'}"
        values = entry.get("values")
        if isinstance(values, list) and values:
            kept = f" (the first {len(values)})" if isinstance(count, int) and count > len(values) else ""
            said += f"{kept}: " + ", ".join(_number(v) for v in values)
        lines += _wrapped(said, "  ", width)
    if value.get("cut"):
        lines += _wrapped(f"cut: {_text(value['cut'])}", "  ", width)
    invalid = value.get("invalid")
    if isinstance(invalid, dict) and invalid.get("count"):
        first = [q for q in invalid.get("first") or [] if isinstance(q, dict)]
        lines.append(f"  invalid lines: {_text(invalid['count'])}" + (f", the first {len(first)}:" if first else ""))
        for q in first:
            lines += _wrapped(f"line {_text(q.get('line'))}: \"{_text(q.get('text'))}\" ({_text(q.get('why'))})",
                              "    ", width)
    return lines


def render(record: dict[str, Any], width: int = WIDTH) -> str:
    """``dispatch show --record JOB`` for people: the verdict first, then each section, one line a value.

    A line is ``key: value``, a null one says why (``null (No such file or
    directory)``). Lines fit *width*: a long value wraps onto a few more
    lines, indented, and is then cut (``--json`` has everything). The
    sentinels' start and end snapshots are left to ``--json``: their
    differences (``delta``) are what a reader looks at. The job's own
    figures (``metrics``) come right after the header: they are its results.
    """
    lines = _verdict_lines(record.get("verdict"), width)
    head = [f"schema {_text(_unwrap(record.get('schema')))}", f"job {_text(_unwrap(record.get('job')))}"]
    complete = _unwrap(record.get("complete"))
    head.append("complete" if complete is True else "INCOMPLETE (the job's end was not recorded)")
    lines.append(_cut("record: " + ", ".join(head), width))
    if record.get("digest") is not None:
        lines.append(_cut(f"digest: {_text(_unwrap(record['digest']))}", width))
    if "metrics" in record:
        lines += _metrics_lines(record["metrics"], width)
    known = set(SECTIONS) | {"verdict", "schema", "job", "complete", "digest", "metrics"}
    for section in list(SECTIONS) + [k for k in record if k not in known]:
        if section not in record:
            continue
        node = record[section]
        lines.append(section)
        if section == "sentinels" and isinstance(node, dict):
            _render_node(node.get("delta"), "delta", "  ", width, lines)
            if "start" in node or "end" in node:
                lines.append("  (the raw start and end snapshots: --json)")
            continue
        if _is_field(node) or not isinstance(node, (dict, list)):
            _render_node(node, section, "  ", width, lines)
        else:
            before = len(lines)
            items = node.items() if isinstance(node, dict) else ((f"[{i}]", v) for i, v in enumerate(node))
            for k, v in items:
                _render_node(v, one_line(str(k)), "  ", width, lines)
            if len(lines) == before:
                lines.append("  (none)")
    return "\n".join(lines)

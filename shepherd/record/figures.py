"""A job's own figures: the ``name value [unit]`` lines it wrote to ``$HPC_BATCH_METRICS_FILE`` (pure).

One figure a line, fields separated by ASCII whitespace; blank lines and
comments (a field that begins with ``#`` starts one, to the end of its line)
are skipped. A name is a letter or ``_`` and then up to 63 letters, digits or
``_.:/-``; a value is a finite decimal number; a unit, optional, is at most 16
printable ASCII characters. A name keeps the unit of its first line, its
first :data:`MAX_VALUES` values, how many it had and the last. Anything else
is an invalid line: counted, and the first :data:`MAX_QUOTED` quoted with
why, escaped and cut. The reading of the file is ``figurefile``'s. Standard
library only, and no ``re``: the fork server keeps it out (docs/architecture.md).
"""

ENV = "HPC_BATCH_METRICS_FILE"   # the job's variable naming its file
MAX_BYTES = 64 << 10    # read of the file; past it the rest, and the line the bound cuts, are ignored
MAX_NAMES = 256         # distinct names; a line naming one more is invalid
MAX_VALUES = 1000       # values kept a name (benchmarks print one line an iteration); the rest only counted
MAX_NAME = 64
MAX_UNIT = 16
MAX_QUOTED = 10         # invalid lines quoted
QUOTE_CAP = 120         # characters of a quoted line, escaped, "..." included

_LETTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"
_NAME_REST = _LETTERS + b"0123456789.:/-"
_NUMBER = b"0123456789+-.eE"    # float() alone takes "nan", "inf", "1_0" and non-ASCII digits
_PRINTABLE = bytes(range(0x21, 0x7f))
_INF = float("inf")

NAME_RULE = "a name is a letter or _, then up to 63 letters, digits or _.:/-"
UNIT_RULE = "a unit is at most 16 printable ASCII characters"


def _only(field: bytes, allowed: bytes) -> bool:
    return not field.translate(None, allowed)


def escape(raw: bytes, limit: int = QUOTE_CAP) -> str:
    """*raw* as printable text (invalid UTF-8 and control characters as escapes), at most *limit* characters."""
    text = raw.decode("utf-8", "backslashreplace")
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def name_problem(name: str) -> str | None:
    """Why *name* cannot be a figure's name (NAME_RULE), or None: for a name a user types (report --metric)."""
    raw = name.encode("utf-8", "surrogateescape")
    if not raw or len(raw) > MAX_NAME or raw[:1] not in _LETTERS or not _only(raw, _NAME_REST):
        return NAME_RULE
    return None


def _figure(fields: list[bytes]) -> tuple[str, float, str | None] | str:
    """``(name, value, unit)`` of one line's fields, or why they are not a figure."""
    if len(fields) not in (2, 3):
        return f"expected NAME VALUE [UNIT], found {len(fields)} field{'' if len(fields) == 1 else 's'}"
    try:
        for field in fields:
            field.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8"
    name, value = fields[0], fields[1]
    if len(name) > MAX_NAME or name[:1] not in _LETTERS or not _only(name, _NAME_REST):
        return NAME_RULE
    if not _only(value, _NUMBER):
        return "the value is not a number"
    try:
        number = float(value)
    except ValueError:
        return "the value is not a number"
    if number in (_INF, -_INF):
        return "the value is not finite"
    unit = fields[2] if len(fields) == 3 else None
    if unit is not None and (len(unit) > MAX_UNIT or not _only(unit, _PRINTABLE)):
        return UNIT_RULE
    return name.decode(), number, None if unit is None else unit.decode()


def parse(data: bytes, cut: bool = False) -> dict:
    """The figures in *data*; *cut*: it stops at the read bound, so its last, unended line is dropped.

    ``{"names": {NAME: {"unit", "values", "count", "last"}}, "lines",
    "invalid": {"count", "first": [{"line", "text", "why"}]}}``.
    """
    lines = data.split(b"\n")
    if cut or lines[-1] == b"":
        lines.pop()
    names: dict[str, dict] = {}
    bad = 0
    quoted: list[dict] = []
    for number, raw in enumerate(lines, 1):
        fields = raw.split()
        for i, field in enumerate(fields):
            if field.startswith(b"#"):
                del fields[i:]
                break
        if not fields:
            continue
        got = _figure(fields)
        if not isinstance(got, str):
            name, value, unit = got
            entry = names.get(name)
            if entry is None and len(names) >= MAX_NAMES:
                got = f"a name past the first {MAX_NAMES}"
            elif entry is None:
                entry = names[name] = {"unit": unit, "values": [], "count": 0, "last": None}
            if entry is not None and entry["unit"] != unit:
                got = f"unit {unit or '(none)'}, where this name's first line had {entry['unit'] or '(none)'}"
            elif entry is not None:
                entry["count"] += 1
                entry["last"] = value
                if len(entry["values"]) < MAX_VALUES:
                    entry["values"].append(value)
                continue
        bad += 1
        if len(quoted) < MAX_QUOTED:
            quoted.append({"line": number, "text": escape(raw), "why": got})
    return {"names": names, "lines": len(lines), "invalid": {"count": bad, "first": quoted}}

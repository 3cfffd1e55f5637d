"""The ``gpu`` section of a job's record, from ``nvidia-smi``: argv builders and parsers.

The shepherd runs ``nvidia-smi`` itself, in a child with a deadline, once
right after the job has started (the static facts and the start state) and
once at its end (temperature and clock event reasons again). This module
holds the pure pieces: what to run, how to read what it printed, and how to
shape the record's ``gpu`` list. The one impure-looking helper, :func:`query`,
takes the runner as an argument, so the shepherd keeps control of children
and deadlines and tests can hand it the fake ``nvidia-smi``.

Clock event reasons. Drivers from R535 on call them ``clocks_event_reasons.*``
and still accept the older ``clocks_throttle_reasons.*`` names (printing the
new ones in the CSV header); older drivers know only the old names and answer
a new one with ``Field "..." is not a valid field to query.`` (on stdout, exit
status non-zero). We ask with the current names first and, on that answer,
ask once more with the old names (:func:`retry_fields`); a field a driver does
not know at all (``mig.mode.current`` before the Ampere-era drivers, say) is
dropped from the next try and recorded as null with the reason. Either way the record's keys are
the current names, and each field's ``source`` names the field that was
actually queried.

The CUDA version is no ``--query-gpu`` field (asking for ``cuda_version``
fails): it comes from the ``CUDA Version`` line of ``nvidia-smi -q``, asked
with ``-d COMPUTE`` so that the output is a few lines per GPU instead of the
full report (:func:`cuda_argv`, :func:`parse_cuda_version`).

Standard library only (the shepherd loads this).
"""


try:
    from shepherd.base.sysread import field
except ImportError:  # run as a file: the base is a top-level package
    from base.sysread import field  # type: ignore[no-redef]

CURRENT = "clocks_event_reasons."
LEGACY = "clocks_throttle_reasons."

# The reasons nvidia-smi has a query field for (``--help-query-gpu``), current
# names. ``active`` is the bitmask of all of them (it also carries reasons with
# no field of their own, e.g. the display clock setting).
REASONS = (
    "active",
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
    "sync_boost",
)
REASON_FIELDS = tuple(CURRENT + r for r in REASONS)

# Facts that do not move while a job runs, then the start state.
STATIC_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "vbios_version",
    "persistence_mode",
    "ecc.mode.current",
    "mig.mode.current",
    "compute_mode",
    "clocks.applications.graphics",
    "clocks.applications.memory",
    "clocks.max.sm",
    "clocks.max.memory",
    "power.limit",
    "temperature.gpu",
    *REASON_FIELDS,
)

# The end snapshot: what may have changed, and the UUID to match it by.
DYNAMIC_FIELDS = ("uuid", "temperature.gpu", *REASON_FIELDS)

# Record key (units in the name: the query asks for ``nounits``) per static field.
STATIC_KEYS = {
    "index": "index",
    "uuid": "uuid",
    "name": "name",
    "pci.bus_id": "pci_bus_id",
    "driver_version": "driver_version",
    "vbios_version": "vbios_version",
    "persistence_mode": "persistence_mode",
    "ecc.mode.current": "ecc_mode",
    "mig.mode.current": "mig_mode",
    "compute_mode": "compute_mode",
    "clocks.applications.graphics": "clocks_applications_graphics_mhz",
    "clocks.applications.memory": "clocks_applications_memory_mhz",
    "clocks.max.sm": "clocks_max_sm_mhz",
    "clocks.max.memory": "clocks_max_memory_mhz",
    "power.limit": "power_limit_w",
}

_INTS = {"index", "temperature.gpu", "clocks.applications.graphics", "clocks.applications.memory",
         "clocks.max.sm", "clocks.max.memory"}
_FLOATS = {"power.limit"}
# The three patterns below are read with str methods, not the re module: re (and what it loads)
# would be in the fork server, and so mapped by every shepherd, for these alone.
_INVALID_START, _INVALID_END = 'Field "', '" is not a valid field to query'
_CUDA = "CUDA Version"
_SPACE = " \t\n\r\f\v"


def _strip_ansi(text: str) -> str:
    """*text* without its colour codes (``ESC [ digits-and-semicolons m``)."""
    if "\x1b[" not in text:
        return text
    out, pos = [], 0
    while True:
        esc = text.find("\x1b[", pos)
        if esc < 0:
            out.append(text[pos:])
            return "".join(out)
        end = esc + 2
        while end < len(text) and (text[end].isdigit() and text[end].isascii() or text[end] == ";"):
            end += 1
        if end < len(text) and text[end] == "m":
            out.append(text[pos:esc])
            pos = end + 1
        else:   # not a colour code: kept as it is
            out.append(text[pos:esc + 1])
            pos = esc + 1
OUTPUT_CAP = 200        # characters of nvidia-smi's words kept in a reason


def query_argv(nvidia_smi: str, ids: list[str], fields: tuple[str, ...] | list[str] = STATIC_FIELDS) -> list[str]:
    """One ``nvidia-smi --query-gpu`` call for *fields* of the GPUs *ids* (indices, UUIDs or bus ids)."""
    return [nvidia_smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits", "-i", ",".join(ids)]


def dynamic_argv(nvidia_smi: str, ids: list[str], fields: tuple[str, ...] | list[str] = DYNAMIC_FIELDS) -> list[str]:
    """The end snapshot's call: UUID, temperature and clock event reasons of *ids*."""
    return query_argv(nvidia_smi, ids, fields)


def cuda_argv(nvidia_smi: str, ids: list[str]) -> list[str]:
    """The call whose header says the driver's CUDA version (``-q``, cut to the COMPUTE block)."""
    return [nvidia_smi, "-q", "-i", ",".join(ids), "-d", "COMPUTE"]


def canonical(name: str) -> str:
    """The current name of a queried field (``clocks_throttle_reasons.x`` -> ``clocks_event_reasons.x``)."""
    return CURRENT + name[len(LEGACY):] if name.startswith(LEGACY) else name


def invalid_field(output: str) -> str | None:
    """The field nvidia-smi refused (``Field "x" is not a valid field to query.``), or None."""
    start = output.find(_INVALID_START)
    while start >= 0:
        name_at = start + len(_INVALID_START)
        quote = output.find('"', name_at)
        if quote < 0:
            return None
        if quote > name_at and output.startswith(_INVALID_END, quote):
            return output[name_at:quote]
        start = output.find(_INVALID_START, start + 1)
    return None


def retry_fields(queried: list[str], output: str) -> list[str] | None:
    """The fields to ask for next after *queried* failed with *output*, or None if retrying cannot help.

    A refused current reason name: every reason is asked again by its old
    name (an older driver). Any other refused field: that field is dropped.
    """
    bad = invalid_field(output)
    if bad is None or bad not in queried:
        return None
    if bad.startswith(CURRENT):
        return [LEGACY + f[len(CURRENT):] if f.startswith(CURRENT) else f for f in queried]
    return [f for f in queried if f != bad]


def _source(name: str) -> str:
    return f"nvidia-smi --query-gpu={name}"


def _value(name: str, text: str):
    """*text* as the record keeps field *name*; raises ValueError on a malformed number."""
    if name in _INTS:
        return int(text)
    if name in _FLOATS:
        return float(text)
    if name.startswith(CURRENT) and name not in (CURRENT + "active", CURRENT + "supported"):
        if text not in ("Active", "Not Active"):
            raise ValueError(f"neither Active nor Not Active: {text[:OUTPUT_CAP]!r}")
        return text == "Active"
    return text


def _cell(name: str, queried: str, text: str) -> dict:
    """One CSV cell as a field; nvidia-smi's ``[N/A]``, ``[Not Supported]`` etc. are null with that reason."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        return field(None, _source(queried), f"nvidia-smi: {text[1:-1][:OUTPUT_CAP]}")
    if text == "N/A":
        return field(None, _source(queried), "nvidia-smi: N/A")
    try:
        return field(_value(name, text), _source(queried))
    except ValueError as exc:
        return field(None, _source(queried), f"unparsable: {exc}")


def parse_query(text: str, queried: tuple[str, ...] | list[str] = STATIC_FIELDS,
                wanted: tuple[str, ...] | list[str] | None = None) -> list[dict]:
    """Rows of ``--format=csv,noheader,nounits`` output of a query for *queried*.

    Each row maps every *wanted* field's current name (default: *queried*'s)
    to a field. A wanted field that was not queried (the driver refused it)
    is null with that reason; a line with the wrong number of values gives a
    row of nulls saying so. Never raises.
    """
    names = [canonical(q) for q in queried]
    want = [canonical(w) for w in (wanted if wanted is not None else queried)]
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = line.split(",")
        row = {}
        if len(cells) != len(queried):
            why = f"nvidia-smi printed {len(cells)} values for {len(queried)} fields: {line.strip()[:OUTPUT_CAP]!r}"
            row = {n: field(None, _source(q), why) for n, q in zip(names, queried)}
        else:
            row = {n: _cell(n, q, c) for n, q, c in zip(names, queried, cells)}
        for w in want:
            if w not in row:
                row[w] = field(None, _source(w), "not a field this driver's nvidia-smi knows")
        rows.append({w: row[w] for w in want})
    return rows


def parse_dynamic(text: str, queried: tuple[str, ...] | list[str] = DYNAMIC_FIELDS) -> list[dict]:
    """Rows of the end snapshot's output (:func:`dynamic_argv`), keyed by current field names."""
    return parse_query(text, queried, DYNAMIC_FIELDS)


def unavailable(ids: list[str], why: str, fields: tuple[str, ...] | list[str] = STATIC_FIELDS,
                source: str = "nvidia-smi --query-gpu") -> list[dict]:
    """One row of null fields per requested GPU, each saying *why* (nvidia-smi missing, failed, timed out)."""
    return [{canonical(f): field(None, source, why) for f in fields} for _ in ids]


def _failure(rc: int, output: str) -> str:
    words = " ".join(_strip_ansi(output).split())[:OUTPUT_CAP]
    return f"nvidia-smi exited {rc}: {words}" if rc >= 0 else (words or "nvidia-smi did not run")


def query(run, nvidia_smi: str, ids: list[str], fields: tuple[str, ...] | list[str] = STATIC_FIELDS) -> list[dict]:
    """Ask for *fields* of *ids*, retrying with old names or without refused fields; rows as :func:`parse_query`.

    ``run(argv) -> (status, output)`` runs one nvidia-smi call (the
    shepherd's child with a deadline): *status* is the exit status, or -1
    when it could not run or was stopped, with *output* then saying why.
    At most one call per field, so a confused driver cannot loop us.
    """
    tried = list(fields)
    for _ in range(len(fields)):
        rc, out = run(query_argv(nvidia_smi, ids, tried))
        if rc == 0:
            return parse_query(out, tried, fields)
        nxt = retry_fields(tried, out) if rc > 0 else None
        if nxt is None:
            return unavailable(ids, _failure(rc, out), fields)
        tried = nxt
    return unavailable(ids, "nvidia-smi refused every field", fields)


def parse_cuda_version(text: str) -> dict:
    """The ``CUDA Version`` of ``nvidia-smi -q`` (or of its banner) as a field."""
    source = "nvidia-smi -q -d COMPUTE"
    at = text.find(_CUDA)
    while at >= 0:
        rest = text[at + len(_CUDA):].lstrip(_SPACE)
        if rest.startswith(":"):
            rest = rest[1:].lstrip(_SPACE)
            n = 0
            while n < len(rest) and (rest[n] in "0123456789" or (n and rest[n] == ".")):
                n += 1
            if n:
                return field(rest[:n], source)
        at = text.find(_CUDA, at + 1)
    return field(None, source, "no CUDA Version line in the output (a driver before CUDA 10?)")


def cuda_version(run, nvidia_smi: str, ids: list[str]) -> dict:
    """Run :func:`cuda_argv` with *run* (as in :func:`query`) and return the CUDA version field."""
    rc, out = run(cuda_argv(nvidia_smi, ids))
    if rc != 0:
        return field(None, "nvidia-smi -q -d COMPUTE", _failure(rc, out))
    return parse_cuda_version(out)


def topo_rows(text: str, uuids: dict[int, str]) -> dict[str, str]:
    """Each GPU's row of ``nvidia-smi topo -m``, keyed by UUID (*uuids*: index -> UUID).

    The driver separates cells with tabs; then a row reads as
    ``"GPU1=NV12 NIC0=PXB CPU Affinity=0-63 NUMA Affinity=0"`` (the GPU's own
    ``X`` cell left out). A copy whose tabs became spaces keeps the row's
    words as they are. Never raises; a GPU without a row is left out.
    """
    lines = [_strip_ansi(ln).rstrip("\n") for ln in text.splitlines()]
    # The header is the first line indented before "GPU0"; the rows start at column 0.
    header = next((ln for ln in lines if ln[:1].isspace() and ln.strip().startswith("GPU0")), None)
    columns = [c.strip() for c in header.split("\t")] if header is not None and "\t" in header else None
    if columns is not None and columns and columns[0] == "":
        columns = columns[1:]
    out = {}
    for ln in lines:
        name = ln.split("\t")[0].split(" ")[0].strip()
        if not name.startswith("GPU") or not name[3:].isdigit() or int(name[3:]) not in uuids:
            continue
        cells = [c.strip() for c in ln.split("\t")[1:]]
        if columns is not None and len(cells) > len(columns):
            cells = [c for c in cells if c]     # newer drivers print an empty cell before "GPU NUMA ID"
        if columns is not None and "\t" in ln and len(cells) == len(columns):
            row = " ".join(f"{col}={cell}" for col, cell in zip(columns, cells) if col and cell != "X")
        else:
            row = " ".join(ln.split()[1:])
        out[uuids[int(name[3:])]] = row
    return out


def _state(row: dict | None, why: str) -> dict:
    """The temperature and clock event reasons of one snapshot row (nulls saying *why* without a row)."""
    def get(name):
        if row is None:
            return field(None, "nvidia-smi --query-gpu", why)
        return row[name]
    return {
        "temperature_c": get("temperature.gpu"),
        "clocks_event_reasons": {r: get(CURRENT + r) for r in REASONS},
    }


def section(static_rows: list[dict], topo_rows: dict[str, str], end_rows: list[dict],
            cuda: dict | None = None) -> list:
    """The record's ``gpu`` list: one entry per GPU of *static_rows*.

    Each entry holds the static fields under :data:`STATIC_KEYS`' names,
    ``cuda_version`` (the field *cuda*), ``topo`` (the GPU's row of
    ``nvidia-smi topo -m`` from *topo_rows*), and ``start`` and ``end``:
    ``{"temperature_c": field, "clocks_event_reasons": {reason: field}}``.
    End rows are matched by UUID, else by position (both calls ask for the
    same ``-i`` list, and nvidia-smi prints GPUs in index order).
    """
    by_uuid = {r["uuid"]["value"]: r for r in end_rows if r.get("uuid", {}).get("value")}
    gpus = []
    for i, row in enumerate(static_rows):
        uuid = row.get("uuid", {}).get("value")
        end = by_uuid.get(uuid) if uuid else None
        if end is None and i < len(end_rows) and (uuid is None or not end_rows[i].get("uuid", {}).get("value")):
            end = end_rows[i]       # one side's UUID is unknown (its call failed): same -i list, same order
        entry = {key: row.get(name, field(None, _source(name), "not queried")) for name, key in STATIC_KEYS.items()}
        entry["cuda_version"] = cuda if cuda is not None else field(None, "nvidia-smi -q -d COMPUTE", "not asked")
        if uuid in topo_rows:
            entry["topo"] = field(topo_rows[uuid], "nvidia-smi topo -m")
        else:
            entry["topo"] = field(None, "nvidia-smi topo -m", "no row for this GPU")
        entry["start"] = _state(row, "")
        entry["end"] = _state(end, "no end snapshot of this GPU")
        gpus.append(entry)
    return gpus

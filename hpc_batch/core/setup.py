"""A job record's *setup*: the values that decide whether two runs can be compared (pure).

A record (``jobs/<id>/record.json``, docs/record.md) is nested sections
whose leaves are *fields*, ``{"value": V, "source": S}`` (a null one adds
``error``). Two records are paired leaf by leaf (:func:`differences`), values
only, and each difference is of one kind (:func:`classify`):

- ``setup``: the machine, kernel, CPU, frequency and memory settings, the
  allocation's shape, the GPUs and the job's software. Only these decide
  whether two runs compare.
- ``noted``: where the job ran when the shape is the same (which CPUs,
  NUMA node or GPUs: *placement*, compared by count), what recorded it.
- ``run``: what happened during the run and the machine's state at its start.
- ``ignored``: times, the job id, the digest, raw snapshots, pids, the cgroup's path.

:func:`setup_digest` condenses one record's setup into a digest, so that the
daemon can stamp each finished job with it and ``dispatch report`` can group a
series of runs without pairing every two records: two digests are equal
exactly when :func:`differences` finds no ``setup`` difference between the
records (the tests hold the two to each other over fixture records).

``dispatch record diff`` (``hpc_batch/client/recorddiff.py``) formats what is
found here; this module only decides.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, NamedTuple

# Part of what is hashed: a change of the rules below changes every digest, so a digest
# archived under older rules is never taken for one under the new ones. Raise it with them.
DIGEST_RULES = 1

# What the daemon sets in each job's environment (shepherd/record/software.py PER_JOB_VARS, which the
# shepherd cannot import from here): with --record-env their values differ between any two jobs.
PER_JOB_VARS = ("HPC_BATCH_JOB_ID", "HPC_BATCH_ARRAY_INDEX", "HPC_BATCH_ARRAY_JOB_ID", "CUDA_VISIBLE_DEVICES",
                "HPC_BATCH_METRICS_FILE")


class Difference(NamedTuple):
    """One value that differs: its *section*, its dotted *key* inside it, and the value in each record.

    A value that is null, or absent from a record, is ``None``.
    """

    section: str
    key: str
    a: Any
    b: Any


class _Absent:
    """A key one record lacks (an older schema, a section that was not collected)."""


_ABSENT = _Absent()


def is_field(node: Any) -> bool:
    """Whether *node* is a field: a dict with a ``value`` and a ``source``."""
    return isinstance(node, dict) and "value" in node and "source" in node


def unwrap(node: Any) -> Any:
    """A field's value (None for a null one); anything else as it is."""
    return node.get("value") if is_field(node) else node


def is_scalar(value: Any) -> bool:
    """Whether *value* is neither a dict nor a list."""
    return not isinstance(value, (dict, list))


def join_key(path: str, label: str) -> str:
    """*label* under the dotted *path*."""
    return f"{path}.{label}" if path else label


_NUMBERED = re.compile(r"^(\D*?)(\d+)$")


def _numbered(keys: list[str]) -> list[tuple[str, int, str]] | None:
    """(prefix, number, key) for each key, in numeric order, if every key is a name and a number."""
    out = []
    for k in keys:
        m = _NUMBERED.match(k)
        if m is None:
            return None
        out.append((m.group(1), int(m.group(2)), k))
    return sorted(out)


def _pair_keys(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    """(label, key in a, key in b) for the keys of two dicts.

    Per-CPU, per-node and per-policy dicts (``cpu2``, ``node1``, ``policy4``,
    ``"3"``) of two jobs placed on different CPUs have different keys for
    the same role: when every key of both is a name and a number and the
    names match one for one, they are paired in numeric order and the label
    says both (``policy2(b:policy4)``).
    """
    if set(a) != set(b):
        na, nb = _numbered(list(a)), _numbered(list(b))
        if na is not None and nb is not None and len(na) == len(nb) \
                and [p for p, _, _ in na] == [p for p, _, _ in nb]:
            return [(ka if ka == kb else f"{ka}(b:{kb})", ka, kb) for (_, _, ka), (_, _, kb) in zip(na, nb)]
    keys = list(a) + [k for k in b if k not in a]
    return [(k, k if k in a else None, k if k in b else None) for k in keys]


def _walk(a: Any, b: Any, path: str, out: list[tuple[str, Any, Any]]) -> None:
    a, b = unwrap(a), unwrap(b)
    if isinstance(a, dict) or isinstance(b, dict):
        if isinstance(a, dict) and isinstance(b, dict):
            pairs = _pair_keys(a, b)
        elif isinstance(a, dict):      # the other is null, absent or not a dict: each leaf of this one differs
            pairs = [(k, k, None) for k in a]
        else:
            pairs = [(k, None, k) for k in b]
        da = a if isinstance(a, dict) else {}
        db = b if isinstance(b, dict) else {}
        if not pairs and not (isinstance(a, dict) and isinstance(b, dict)):
            out.append((path, a, b))
        for label, ka, kb in pairs:
            _walk(da[ka] if ka is not None else _ABSENT, db[kb] if kb is not None else _ABSENT,
                  join_key(path, label), out)
        return
    structured = [v for v in (a, b) if isinstance(v, list) and not all(map(is_scalar, v))]
    if structured:                      # lists of sections (GPUs, caches): entry by entry
        la = a if isinstance(a, list) else []
        lb = b if isinstance(b, list) else []
        for i in range(max(len(la), len(lb))):
            _walk(la[i] if i < len(la) else _ABSENT, lb[i] if i < len(lb) else _ABSENT, f"{path}[{i}]", out)
        return
    va = None if isinstance(a, _Absent) else a
    vb = None if isinstance(b, _Absent) else b
    if va != vb or type(va) is bool and type(vb) is not bool or type(vb) is bool and type(va) is not bool:
        out.append((path, va, vb))


def _split(path: str) -> tuple[str, str]:
    """(section, key) of a dotted path: ``gpu[0].name`` is section ``gpu``, key ``[0].name``."""
    section, _, key = path.partition(".")
    if "[" in section and not key:      # a top-level list entry: "gpu[0]" -> section gpu
        section, _, rest = section.partition("[")
        key = "[" + rest
    elif "[" in section:
        section, _, rest = section.partition("[")
        key = "[" + rest + "." + key
    return section, key


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[Difference]:
    """Every value that differs between records *a* and *b*, in the records' order.

    Fields compare by value only (never source or error); lists of plain
    values compare whole, lists of sections entry by entry. Every
    difference is listed, of every kind: :func:`classify` says which count.
    """
    out: list[tuple[str, Any, Any]] = []
    _walk(a, b, "", out)
    return [Difference(*_split(path), va, vb) for path, va, vb in out]


# classify's rules. Keys are matched as written in a Difference (dotted, with
# [i] for list entries); kernel names with dots ("pids.max",
# "cpuset.cpus.effective") stay readable, so the patterns take care with them.
_PID = re.compile(r"(^|\.)(pid|pids|[a-z_]+_pid)($|\[|\.(?!max))")
_TIME = re.compile(r"(^|\.)(utc|monotonic|uptime|time|now|clock|started|ended)[a-z_]*($|\.)")
_RUN_MEMORY = re.compile(r"(free|used|rsvd|surp|swaps)", re.I)
_RUN_GPU = re.compile(r"(^|\.)(start|end)(\.|$)|temperature|clocks_event_reasons|throttle_reasons")
_PLACEMENT_GPU = re.compile(r"(^|\.)(uuid|pci\.bus_id|pci_bus_id|bus_id|index|minor_number|topo[a-z_]*)$")
_PLACEMENT_ALLOC = re.compile(r"(cpus|cpu_list|cpulist|policies|siblings|l3|mems|gpus|nodes?)[a-z_.]*$")
# The daemon's own allocation (jobrecord.spec): every CPU held, those held idle, the cores
# (one list of threads each), and the node's and L3's CPUs around the job.
_PLACEMENT_HELD = re.compile(r"requested\.(held|idle|cores(\[\d+\])?)")
_PLACEMENT_MACHINE = re.compile(r"node_cpus|l3_cpus")
# A benchmark job's quiet record (machine.quiet): which IRQs its start moved, which it could
# not, where each lands now, and the policy files it set depend on where the job landed and
# what was there (reported, not counted); the CPU lists in it are placement.
_RUN_QUIET = re.compile(r"quiet\.(irqs\.(?!to$).*|cpufreq\.(changed|refused)([.\[].*)?)")
_PLACEMENT_QUIET = re.compile(r"quiet\.(irqs\.to|cpufreq\.state\.(policies\[\d+\]\.cpus|epb\.[^.]+))")
_PER_JOB_ENV = re.compile(r"environment\.values\.(" + "|".join(PER_JOB_VARS) + ")")


def _count(value: Any) -> int | None:
    """How many ids a list or a kernel cpulist ("0-3,8") holds; None if it is neither."""
    if isinstance(value, list):
        return len(value)
    if isinstance(value, str):
        n = 0
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or hi and not hi.isdigit():
                return None
            n += int(hi) - int(lo) + 1 if hi else 1
        return n
    return None


# Sections no key of which is setup (key_kind): the digest does not walk them, and the
# sentinels' snapshots are most of a record's bytes.
NEVER_SETUP = frozenset(("job", "digest", "sentinels", "verdict", "complete", "metrics", "side_errors", "cut",
                         "schema"))


def key_kind(section: str, key: str) -> str:
    """What a value at *section*.*key* is, before its values are seen.

    ``setup``, ``noted``, ``run``, ``ignored``, or ``placement``: a list of
    CPUs, nodes or GPUs, which is ``noted`` between two records when both
    hold as many ids, and ``setup`` otherwise (:func:`classify`).
    """
    if section in ("job", "digest") or _PID.search(key):
        return "ignored"
    if section == "sentinels":      # the raw snapshots are in the deltas, which are what happened
        return "run" if key.startswith("delta") else "ignored"
    if section in ("verdict", "complete", "metrics", "side_errors"):
        return "run"                # what the run gave: its verdict, its own figures, side tasks that failed
    if section == "cut":
        return "noted"              # what the size bound dropped: the dropped values differ on their own
    if section == "collector":
        if key == "job":
            return "ignored"
        if key.startswith("hostname"):
            return "setup"
        return "ignored" if _TIME.search(key) else "noted"   # version, commit, boot_id, schema
    if section == "schema":
        return "noted"
    if section == "allocation" and re.search(r"(^|\.)cgroup($|\.)", key):
        return "ignored"            # the cgroup's path names the job id
    if section == "memory" and _RUN_MEMORY.search(key.rpartition(".")[2] or key):
        return "run"
    if section == "software" and re.fullmatch(r"environment\.(sha256|bytes)", key):
        return "noted"              # these count the job's own id; submitted_sha256 leaves it out
    if section == "software" and _PER_JOB_ENV.fullmatch(key):
        return "noted"              # the job's id and GPUs, with --record-env
    if section == "machine":
        if "job" in key:
            return "run"            # the other jobs beside this one: the state, not the setup
        if _RUN_QUIET.fullmatch(key):
            return "run"
        if _PLACEMENT_MACHINE.fullmatch(key) or _PLACEMENT_QUIET.fullmatch(key):
            return "placement"
    if section == "gpu":
        if _RUN_GPU.search(key):
            return "run"
        if _PLACEMENT_GPU.search(key):
            return "noted"
    if section == "allocation" and _PLACEMENT_HELD.fullmatch(key):
        return "placement"
    if section in ("allocation", "frequency") and _PLACEMENT_ALLOC.search(key):
        return "placement"
    return "setup"


def classify(section: str, key: str, a: Any = None, b: Any = None) -> str:
    """``setup``, ``noted``, ``run`` or ``ignored``: what a difference at *section*.*key* means.

    *a* and *b* matter for placement: two jobs on different CPUs (or GPUs,
    or NUMA nodes) of the same count differ in where they ran, not in shape.
    """
    kind = key_kind(section, key)
    if kind != "placement":
        return kind
    ca, cb = _count(a), _count(b)
    return "noted" if ca is not None and ca == cb else "setup"


def comparable(diffs: list[Difference]) -> bool:
    """Whether no difference of kind ``setup`` is among *diffs*."""
    return not any(classify(*d) == "setup" for d in diffs)


# -- one record's setup ------------------------------------------------------------

def _plain(value: Any) -> Any:
    """*value* as it compares: an integral float as the int it equals (``_walk`` finds 2 == 2.0)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


_ENCODE_STR = json.encoder.encode_basestring_ascii   # what json.dumps encodes a str with


def _item_text(item: Any) -> str:
    """``json.dumps(item)`` for one element of a canonical path (a key, an index, a rank triple)."""
    if type(item) is str:
        return _ENCODE_STR(item)
    if type(item) is int:
        return int.__repr__(item)
    return json.dumps(item)


def _leaves(node: Any, path: str, canon: list[Any], out: list[tuple[str, list[Any], Any, str]],
            text: str) -> None:
    """Each leaf of one record as ``_walk`` meets it against a record that lacks it.

    *path* is the leaf's dotted key, as :func:`classify` reads it; *canon*
    its place as :func:`_pair_keys` pairs it: a numbered key (``cpu2``,
    ``policy4``, ``"1"``) stands as its name and its rank among its
    siblings, so per-CPU entries of two placements meet. *text* is
    ``json.dumps(canon)`` less its closing bracket, built a step at a time
    (what the terms are sorted by; one ``dumps`` a leaf was most of a
    digest's cost). A null leaf is left out: ``_walk`` finds no
    difference between null and absent.
    """
    node = unwrap(node)
    if isinstance(node, dict):
        if not node:                    # an empty section differs from a missing one
            out.append((path, canon, {}, text))
            return
        numbered = _numbered(list(node))
        if numbered is not None:
            for rank, (prefix, _, key) in enumerate(numbered):
                step = ["#", prefix, rank]
                _leaves(node[key], join_key(path, key), [*canon, step], out, f"{text}, {_item_text(step)}")
        else:
            for key in node:
                _leaves(node[key], join_key(path, key), [*canon, key], out, f"{text}, {_item_text(key)}")
        return
    if isinstance(node, list) and not all(map(is_scalar, node)):
        for i, entry in enumerate(node):
            _leaves(entry, f"{path}[{i}]", [*canon, i], out, f"{text}, {i}")
        return
    if node is not None:
        out.append((path, canon, _plain(node), text))


# Each path's key_kind, kept: the records of one machine share their paths, and the patterns
# were a third of a digest's cost. Bounded, since a record's paths include a user's names.
KINDS_KEPT = 4096
_KINDS: dict[str, str] = {}


def setup_terms(record: dict[str, Any]) -> list[list[Any]]:
    """The setup of *record*, one ``[canonical path, how, value]`` a value, sorted.

    *how* is ``"="`` for a value that must match, ``"#"`` for a placement
    given by its count. What :func:`setup_digest` hashes: two records'
    terms say where their digests part.
    """
    found: list[tuple[str, list[Any], Any, str]] = []
    for section, node in record.items():
        if section not in NEVER_SETUP:
            _leaves(node, section, [section], found, "[" + _item_text(section))
    keyed = []
    for path, canon, value, text in found:
        kind = _KINDS.get(path)
        if kind is None:
            if len(_KINDS) >= KINDS_KEPT:
                _KINDS.clear()
            kind = _KINDS[path] = key_kind(*_split(path))
        if kind == "placement" and (count := _count(value)) is not None:
            keyed.append((text + "]", [canon, "#", count]))
        elif kind in ("setup", "placement"):
            keyed.append((text + "]", [canon, "=", value]))
    keyed.sort(key=lambda kt: kt[0])     # by json.dumps of each path, which are unique
    return [term for _, term in keyed]


def setup_digest(record: dict[str, Any]) -> str | None:
    """``sha256:<hex>`` of the record's setup; None for something that is not a record (no ``schema``).

    Two records have the same digest exactly when :func:`differences`
    finds no ``setup`` difference between them (:func:`comparable`): runs
    of the same shape on other CPUs, NUMA nodes or GPUs, at other times,
    with other verdicts, sentinels or metrics share it; another kernel, CPU
    model, governor, allocation shape, executable, argv or submitted
    environment does not. The rules are those of :func:`classify`
    (``DIGEST_RULES`` is hashed with them).
    """
    if not isinstance(record, dict) or "schema" not in record:
        return None
    body = json.dumps([DIGEST_RULES, setup_terms(record)], sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()

"""GPU topology: how the GPUs are wired, and which of them a job should get.

Pure: no I/O, no subprocess, no clock. The caller runs ``nvidia-smi topo -m``
(and ``-L`` / ``-q``, or reads ``/proc/driver/nvidia/gpus/*/information``)
and hands the text to the parsers here.

Link classes
------------
``nvidia-smi topo -m`` labels every GPU pair with the path between them.
Best to worst:

* ``NV<n>``  a bonded set of n NVLinks; more links is better, and any
  NVLink beats any PCIe path. ``Link.rank`` is ``-n`` for these.
* ``PIX``  at most one PCIe bridge (same switch)            rank 1
* ``PXB``  several PCIe bridges, no host bridge              rank 2
* ``PHB``  through a PCIe host bridge (the CPU)              rank 3
* ``NODE`` between host bridges inside one NUMA node         rank 4
* ``SYS``  across the socket interconnect (QPI/UPI/xGMI)     rank 5;
  drivers before ~2018 print ``SOC`` for the same thing.
* anything else                                              rank 6

Lower rank is closer. ``NV`` with no count (``Link("NV")``, rank 0) only
appears as a user's limit ("any NVLink"), never in a parsed matrix.

Choosing GPUs
-------------
A collective (all-reduce and friends) runs at the speed of its slowest
pair, so candidate sets are ordered by:

1. the worst link among the set's pairs (lower rank wins);
2. islands split: prefer to carve a job out of an island that is already
   partly in use rather than break up one that is still whole, so whole
   islands stay available for the jobs that need them. Islands, finest
   first, compared in that order:

   * NVLink island: GPUs connected (transitively) by NV links;
   * PCIe-switch island: GPUs connected by links of PXB rank or better
     (NV, PIX, PXB), i.e. below a common switch and never through the CPU;
   * host-bridge island: GPUs connected by links of PHB rank or better,
     i.e. behind one host bridge (a pair of GPUs on one CPU root complex,
     common on boxes without switches or NUMA information);
   * NUMA island: GPUs whose ``NUMA Affinity`` is the same node (a GPU
     with unknown affinity is an island of its own).

   A set "splits" an island when the island is intact (every member is
   free) and the set takes some but not all of it. The count of such
   splits per level is compared as a tuple, NVLink level first;
3. the sum of the pairwise ranks (the tighter set overall);
4. the lowest GPU indices.

Step 2 is deliberately before NUMA locality of the set itself: on an
NVSwitch box every pair is NV12/NV18, so a 2-GPU job may get two leftover
GPUs on different sockets. A caller that wants the GPUs next to the job's
CPUs passes ``node``.

Up to ``ENUMERATION_LIMIT`` candidate sets (C(free, count)) are all scored,
which covers every current single host (C(16, 8) = 12,870). Beyond that the
search grows a set from each free GPU in turn, always adding the GPU whose
worst and then summed link to the set so far is smallest, and scores the
grown sets as above; among equally linked GPUs growth prefers one from an
island the set already touches, so a uniform fabric still yields whole
islands. Greedy growth can miss the best set on exotic wiring, but its
cost stays polynomial.

Minor numbers
-------------
``nvidia-smi`` numbers GPUs by PCI bus order; the device node
``/dev/nvidia<minor>`` uses the driver's minor number, and the two differ
on real machines (an 8x A100 node where GPU 0 is ``/dev/nvidia2`` is in
the fixtures). Device access must therefore be matched through the UUID
(``-L`` gives index -> UUID, ``-q`` gives UUID -> minor) or through
``/proc/driver/nvidia/gpus/<bus>/information``, never by assuming index N
is ``/dev/nvidiaN``.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from .. import bounds

ENUMERATION_LIMIT = 20_000

_PCIE_RANK = {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
_UNKNOWN_RANK = 6
_SINGLE_RANK = -(10**6)  # a one-GPU set has no links: ties with every other one

# CSI sequences: nvidia-smi underlines the header (ESC[4m ... ESC[0m) on a tty.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_GPU_COLUMN = re.compile(r"GPU(\d+)")
# Multi-word header columns; cells are separated by tabs or by runs of spaces
# in recordings, so these cannot be found by splitting alone.
_ATTRIBUTE = re.compile(r"CPU\s+Affinity|NUMA\s+Affinity|GPU\s+NUMA\s+ID")
_LINK_CELL = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_NV = re.compile(r"NV(\d+)")
_LIST_LINE = re.compile(r"GPU (\d+): .*\(UUID: (GPU-[0-9A-Za-z-]+)\)\s*$")
_QUERY_GPU = re.compile(r"\s*GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]\s*$")
_QUERY_UUID = re.compile(r"\s*GPU UUID\s*:\s*(GPU-[0-9A-Za-z-]+)\s*$")
_QUERY_MINOR = re.compile(r"\s*Minor Number\s*:\s*(\S+)\s*$")
_PROC_BUS = re.compile(r"^Bus Location:\s*(\S+)\s*$", re.M)
_PROC_MINOR = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.M)


class TopoError(ValueError):
    """Unusable ``nvidia-smi topo -m`` output or GPU link class."""


@dataclass(frozen=True)
class Link:
    """The path between two GPUs: a class name, plus the NVLink count for NV."""

    kind: str
    nvlinks: int = 0

    @property
    def rank(self) -> int:
        """Comparable closeness: lower is better; NV ranks below PIX, by count."""
        if self.kind == "NV":
            return -self.nvlinks
        return _PCIE_RANK.get(self.kind, _UNKNOWN_RANK)

    def __str__(self) -> str:
        if self.kind == "NV" and self.nvlinks:
            return f"NV{self.nvlinks}"
        return self.kind


_UNKNOWN_LINK = Link("?")


@dataclass(frozen=True)
class Topology:
    """GPU indices, a Link per pair (keyed low index first) and NUMA affinity."""

    gpus: tuple[int, ...]
    links: dict[tuple[int, int], Link]
    numa: dict[int, int | None]

    def link(self, a: int, b: int) -> Link:
        """The link between GPUs ``a`` and ``b`` in either order (KeyError if unknown)."""
        if a == b:
            raise ValueError(f"GPU {a} has no link to itself")
        return self.links[(min(a, b), max(a, b))]


def _parse_cell(cell: str) -> Link:
    name = cell.upper()
    if name == "SOC":
        return Link("SYS")
    m = _NV.fullmatch(name)
    if m is not None:
        return Link("NV", int(m.group(1)))
    return Link(name)


def _split_header(line: str) -> tuple[list[str], list[str]]:
    """Device columns (GPUs, NICs) and the attribute columns after them."""
    devices: list[str] = []
    attributes: list[str] = []
    pos = 0
    for m in _ATTRIBUTE.finditer(line):
        (attributes if attributes else devices).extend(line[pos:m.start()].split())
        attributes.append(" ".join(m.group(0).split()))
        pos = m.end()
    (attributes if attributes else devices).extend(line[pos:].split())
    return devices, attributes


def parse_topo(text: str) -> Topology:
    """Parse ``nvidia-smi topo -m`` output (tabs or spaces, ANSI or not).

    NIC columns and rows are ignored; a missing ``NUMA Affinity`` column or
    an ``N/A`` value leaves that GPU's node None. Raises TopoError on output
    without a GPU header or with rows that do not match it.
    """
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    start = None
    for i, line in enumerate(lines):
        if line.strip().startswith("Legend"):
            break
        tokens = line.split()
        # Data rows always hold their own "X"; the header never does.
        if tokens and _GPU_COLUMN.fullmatch(tokens[0]) and "X" not in tokens:
            start = i
            break
    if start is None:
        raise TopoError("no GPU header line (GPU0 GPU1 ...) in the nvidia-smi topo -m output")
    devices, attributes = _split_header(lines[start])
    if len(set(devices)) != len(devices):
        raise TopoError(f"duplicate column in the header: {' '.join(devices)}")
    gpu_columns = {name: int(m.group(1)) for name in devices if (m := _GPU_COLUMN.fullmatch(name))}

    rows: dict[str, list[str]] = {}
    for line in lines[start + 1:]:
        if line.strip().startswith("Legend"):
            break
        tokens = line.split()
        if not tokens or tokens[0] not in gpu_columns:
            continue  # blank line, NIC row, or something that is not a GPU row
        if tokens[0] in rows:
            raise TopoError(f"two rows for {tokens[0]}")
        rows[tokens[0]] = tokens[1:]

    numa_at = attributes.index("NUMA Affinity") if "NUMA Affinity" in attributes else None
    numa: dict[int, int | None] = {}
    for name, index in gpu_columns.items():
        cells = rows.get(name)
        if cells is None:
            raise TopoError(f"no row for {name}")
        if not len(devices) <= len(cells) <= len(devices) + len(attributes):
            raise TopoError(
                f"row {name} has {len(cells)} cells for {len(devices)} device and {len(attributes)} attribute columns"
            )
        own = devices.index(name)
        if cells[own] != "X":
            raise TopoError(f"row {name} has {cells[own]!r} in its own column instead of X")
        for other in gpu_columns:
            cell = cells[devices.index(other)]
            if other != name and not _LINK_CELL.fullmatch(cell):
                raise TopoError(f"row {name}, column {other}: {cell!r} is not a link class")
        values = cells[len(devices):]
        value = values[numa_at] if numa_at is not None and numa_at < len(values) else ""
        numa[index] = int(value) if value.isdigit() else None

    links: dict[tuple[int, int], Link] = {}
    for (name_a, a), (name_b, b) in itertools.combinations(sorted(gpu_columns.items(), key=lambda kv: kv[1]), 2):
        forward = _parse_cell(rows[name_a][devices.index(name_b)])
        backward = _parse_cell(rows[name_b][devices.index(name_a)])
        # The matrix should be symmetric; when it is not, trust the slower path.
        links[(a, b)] = backward if backward.rank > forward.rank else forward
    return Topology(tuple(sorted(gpu_columns.values())), links, numa)


def parse_link_class(text: str) -> Link:
    """Parse a user's ``--gpu-link`` class: NV, NV<n>, PIX, PXB, PHB, NODE or SYS."""
    name = text.strip().upper()
    if name == "NV":
        return Link("NV", 0)
    m = _NV.fullmatch(name)
    if m is not None and int(m.group(1)) > 0:
        return Link("NV", int(m.group(1)))
    if name in _PCIE_RANK:
        return Link(name)
    raise TopoError(
        f"unknown GPU link class {bounds.shown(text)}: use NV (any NVLink), NV<n> (at least n NVLinks, e.g. NV4), "
        "PIX, PXB, PHB, NODE or SYS"
    )


def worst_link(topo: Topology, gpus: Iterable[int]) -> Link | None:
    """The worst link among the pairs of ``gpus``; None for fewer than two.

    A pair the topology does not know counts as worst of all.
    """
    worst: Link | None = None
    for a, b in itertools.combinations(sorted(set(gpus)), 2):
        link = topo.links.get((a, b), _UNKNOWN_LINK)
        if worst is None or link.rank > worst.rank:
            worst = link
    return worst


def crosses_host(link: Link | None) -> bool:
    """True when the path goes through a host bridge or between sockets (PHB, NODE, SYS)."""
    return link is not None and link.rank >= _PCIE_RANK["PHB"]


def label(topo: Topology | None, gpus: Sequence[int]) -> str:
    """Listing column: "-", "1", "2:NV12", "4:SYS!" ("!" = crosses a host bridge)."""
    if not gpus:
        return "-"
    if len(gpus) == 1 or topo is None:
        return str(len(gpus))
    worst = worst_link(topo, gpus)
    return f"{len(gpus)}:{worst}{'!' if crosses_host(worst) else ''}"


def gpu_node(topo: Topology | None, gpus: Iterable[int]) -> int | None:
    """The NUMA node all of ``gpus`` hang off, or None if unknown or mixed."""
    if topo is None:
        return None
    nodes = {topo.numa.get(g) for g in gpus}
    if len(nodes) != 1:
        return None
    return nodes.pop()


def _bits(mask: int) -> Iterator[int]:
    """The GPU indices set in ``mask``."""
    g = 0
    while mask:
        if mask & 1:
            yield g
        mask >>= 1
        g += 1


def _islands(gpus: Sequence[int], joined: Callable[[int, int], bool]) -> dict[int, int]:
    """Map each GPU to the lowest member of its connected component."""
    owner: dict[int, int] = {}
    for g in gpus:
        if g in owner:
            continue
        owner[g] = g
        todo = [g]
        while todo:
            cur = todo.pop()
            for other in gpus:
                if other not in owner and joined(cur, other):
                    owner[other] = g
                    todo.append(other)
    return owner


class _Scorer:
    """Ranks candidate sets for one choose_gpus call."""

    def __init__(self, topo: Topology, free: Sequence[int]) -> None:
        self._rank = {
            (a, b): topo.links.get((a, b), _UNKNOWN_LINK).rank for a, b in itertools.combinations(free, 2)
        }

        def link(a: int, b: int) -> Link:
            return topo.links.get((min(a, b), max(a, b)), _UNKNOWN_LINK)

        known = list(topo.gpus)
        pxb, phb = _PCIE_RANK["PXB"], _PCIE_RANK["PHB"]
        self._owners = [
            _islands(known, lambda a, b: link(a, b).kind == "NV"),
            _islands(known, lambda a, b: link(a, b).rank <= pxb),
            _islands(known, lambda a, b: link(a, b).rank <= phb),
            _islands(known, lambda a, b: topo.numa.get(a) is not None and topo.numa.get(a) == topo.numa.get(b)),
        ]
        free_set = set(free)
        # Islands as bit masks over GPU indices; only intact ones can be split.
        self._intact: list[list[int]] = []
        for owner in self._owners:
            members: dict[int, int] = {}
            for g, island in owner.items():
                members[island] = members.get(island, 0) | 1 << g
            # A one-GPU island is taken whole or not at all: it never splits.
            whole = [m for m in members.values() if m & (m - 1) and all(g in free_set for g in _bits(m))]
            self._intact.append(whole)

    def rank(self, a: int, b: int) -> int:
        return self._rank[(a, b) if a < b else (b, a)]

    def links(self, gpus: tuple[int, ...]) -> tuple[int, int]:
        """(worst rank, summed rank) over the pairs of ``gpus``."""
        if len(gpus) < 2:
            return _SINGLE_RANK, 0
        ranks = [self._rank[pair] for pair in itertools.combinations(gpus, 2)]
        return max(ranks), sum(ranks)

    def splits(self, gpus: tuple[int, ...]) -> tuple[int, ...]:
        """Per island level, how many intact islands ``gpus`` take only part of."""
        mask = 0
        for g in gpus:
            mask |= 1 << g
        return tuple(sum(1 for isl in level if mask & isl not in (0, isl)) for level in self._intact)

    def _island_keys(self, g: int) -> list[int]:
        # A GPU the topology lacks is an island of its own (negative id).
        return [owner.get(g, -1 - g) for owner in self._owners]

    def grown(self, cands: Sequence[int], count: int, limit: int | None) -> Iterator[tuple[int, ...]]:
        """Greedy sets, one grown from each candidate GPU."""
        keys = {g: self._island_keys(g) for g in cands}
        for start in cands:
            chosen = [start]
            touched = [{k} for k in keys[start]]
            worst = {g: self.rank(start, g) for g in cands if g != start}
            total = dict(worst)
            while len(chosen) < count:
                # Closest first; among equals, one from islands the set already uses.
                steps = [
                    (worst[g], total[g], [k not in seen for k, seen in zip(keys[g], touched)], g)
                    for g in worst
                    if limit is None or worst[g] <= limit
                ]
                if not steps:
                    break
                pick = min(steps)[-1]
                chosen.append(pick)
                for k, seen in zip(keys[pick], touched):
                    seen.add(k)
                del worst[pick], total[pick]
                for g in worst:
                    r = self.rank(pick, g)
                    worst[g] = max(worst[g], r)
                    total[g] += r
            if len(chosen) == count:
                yield tuple(sorted(chosen))


def choose_gpus(
    topo: Topology | None,
    free: Iterable[int],
    count: int,
    max_link: Link | None = None,
    node: int | None = None,
) -> tuple[int, ...] | None:
    """Pick ``count`` GPUs from ``free``, or None when none fit now.

    Without a topology: the lowest free indices, and None for a request
    that names a link limit (for two or more GPUs) or a node, since neither
    can be checked. With one: the best set as described in the module
    header, refusing sets whose worst link ranks worse than ``max_link``
    and GPUs whose NUMA affinity is not ``node``.
    """
    if count < 0:
        raise ValueError(f"cannot choose {count} GPUs")
    if count == 0:
        return ()
    pool = sorted(set(free))
    limit = max_link.rank if max_link is not None and count > 1 else None
    if topo is None:
        if limit is not None or node is not None or len(pool) < count:
            return None
        return tuple(pool[:count])
    cands = [g for g in pool if node is None or topo.numa.get(g) == node]
    if len(cands) < count:
        return None
    scorer = _Scorer(topo, pool)
    sets: Iterable[tuple[int, ...]]
    if math.comb(len(cands), count) <= ENUMERATION_LIMIT:
        sets = itertools.combinations(cands, count)
    else:
        sets = sorted(set(scorer.grown(cands, count, limit)))
    best: tuple[int, tuple[int, ...], int, tuple[int, ...]] | None = None
    for gpus in sets:
        worst, total = scorer.links(gpus)
        if (limit is not None and worst > limit) or (best is not None and worst > best[0]):
            continue
        key = (worst, scorer.splits(gpus), total, gpus)
        if best is None or key < best:
            best = key
    return None if best is None else best[3]


def parse_uuids(text: str) -> dict[int, str]:
    """Index -> GPU UUID from ``nvidia-smi -L``; indented MIG lines are skipped."""
    out: dict[int, str] = {}
    for line in text.splitlines():
        m = _LIST_LINE.match(line)
        if m is not None:
            out[int(m.group(1))] = m.group(2)
    return out


def parse_query_minors(text: str) -> dict[str, int]:
    """GPU UUID -> ``Minor Number`` from ``nvidia-smi -q`` output.

    Each ``GPU <bus id>`` section is read on its own so a value never pairs
    with a neighbour's; a minor of ``N/A`` (no device node) is left out.
    """
    out: dict[str, int] = {}
    uuid: str | None = None
    minor: str | None = None
    for line in text.splitlines():
        if _QUERY_GPU.match(line):
            uuid = minor = None
            continue
        if uuid is None and (m := _QUERY_UUID.match(line)) is not None:
            uuid = m.group(1)
        elif minor is None and (m := _QUERY_MINOR.match(line)) is not None:
            minor = m.group(1)
        if uuid is not None and minor is not None and minor.isdigit() and uuid not in out:
            out[uuid] = int(minor)
    return out


def parse_proc_information(text: str) -> tuple[str | None, int | None]:
    """(``Bus Location``, ``Device Minor``) from ``/proc/driver/nvidia/gpus/<bus>/information``."""
    bus = _PROC_BUS.search(text)
    minor = _PROC_MINOR.search(text)
    return (bus.group(1) if bus else None, int(minor.group(1)) if minor else None)

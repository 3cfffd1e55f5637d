"""Unit tests for hpc_batch.core.gputopo against recorded nvidia-smi outputs.

Every fixture under tests/fixtures/gpu/ is a recording from a real machine;
tests/fixtures/README.md names the source of each one.
"""

import itertools
from pathlib import Path

import pytest

from hpc_batch.core import gputopo
from hpc_batch.core.gputopo import (
    Link,
    TopoError,
    Topology,
    choose_gpus,
    crosses_host,
    gpu_node,
    label,
    parse_link_class,
    parse_proc_information,
    parse_query_minors,
    parse_topo,
    parse_uuids,
    worst_link,
)

GPU = Path(__file__).resolve().parent.parent / "fixtures" / "gpu"


def text(name):
    return (GPU / name).read_text(encoding="utf-8")


def topo(name):
    return parse_topo(text(name))


NV3, NV12, PIX, PHB, NODE, SYS = Link("NV", 3), Link("NV", 12), Link("PIX"), Link("PHB"), Link("NODE"), Link("SYS")


# --- parsing ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name, gpus, numa, links",
    [
        # DGX A100: NVSwitch, 12 mlx5 NIC columns and rows, tabs.
        ("dgx-a100-topo.txt", 8, {0: 3, 1: 3, 2: 1, 3: 1, 4: 7, 5: 7, 6: 5, 7: 5},
         {(0, 1): NV12, (0, 7): NV12, (3, 6): NV12}),
        # Two NV3 pairs on a 2-socket POWER9 (NUMA nodes 0 and 8).
        ("traverse-v100-4-topo.txt", 4, {0: 0, 1: 0, 2: 8, 3: 8},
         {(0, 1): NV3, (2, 3): NV3, (0, 2): SYS, (1, 3): SYS}),
        # PCIe-only matrix (topo -mp) of a DGX-1.
        ("dgx1-v100-topo-mp.txt", 8, {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1},
         {(0, 1): PIX, (0, 2): PHB, (6, 7): PIX, (3, 4): SYS}),
        # Old driver: SOC means SYS, and there is no NUMA Affinity column.
        ("k40m-4-soc-topo.txt", 4, {0: None, 1: None, 2: None, 3: None},
         {(0, 1): PHB, (2, 3): PHB, (0, 2): SYS, (1, 3): SYS}),
        # Tabs expanded to spaces, multi-word columns, GPU NUMA ID.
        ("club3090-5gpu-spaces-topo.txt", 5, {0: 1, 1: 0, 2: 0, 3: 0, 4: 0},
         {(1, 2): PHB, (3, 4): PHB, (1, 3): NODE, (0, 4): SYS}),
        # NIC0/NIC1 rows, the empty cell before "GPU NUMA ID", all SYS.
        ("rtx4090-8-topo.txt", 8, {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1},
         {(0, 1): SYS, (6, 7): SYS, (0, 7): SYS}),
    ],
)
def test_parse_recorded_outputs(name, gpus, numa, links):
    t = topo(name)
    assert t.gpus == tuple(range(gpus))
    assert t.numa == numa
    # NIC columns never become GPUs or links: exactly one link per GPU pair.
    assert set(t.links) == set(itertools.combinations(range(gpus), 2))
    for (a, b), link in links.items():
        assert t.link(a, b) == link
        assert t.link(b, a) == link


def test_nvswitch_box_is_uniform():
    t = topo("dgx-a100-topo.txt")
    assert {str(link) for link in t.links.values()} == {"NV12"}


def test_ansi_escapes_are_stripped():
    raw = text("rtx4090-8-ansi-topo.txt")
    assert "\x1b[4m" in raw and "\x1b[0m" in raw
    assert parse_topo(raw) == topo("rtx4090-8-topo.txt")


@pytest.mark.parametrize("name", ["traverse-v100-4-topo.txt", "dgx-a100-topo.txt", "rtx4090-8-topo.txt"])
def test_spaces_parse_like_tabs(name):
    spaced = "\n".join(line.expandtabs(8) for line in text(name).splitlines())
    assert "\t" not in spaced
    assert parse_topo(spaced) == topo(name)


def _without_numa_column(raw):
    lines = []
    for line in raw.splitlines():
        if "NUMA Affinity" in line:
            line = line.replace("\tNUMA Affinity", "")
        elif line.startswith("GPU"):
            line = line.rsplit("\t", 1)[0]  # the NUMA value is the last cell
        lines.append(line)
    return "\n".join(lines)


@pytest.mark.parametrize("name", ["dgx-a100-topo.txt", "traverse-v100-4-topo.txt"])
def test_missing_numa_column_is_tolerated(name):
    variant = _without_numa_column(text(name))
    assert "NUMA Affinity" not in variant
    t = parse_topo(variant)
    assert t.links == topo(name).links
    assert set(t.numa.values()) == {None}


def test_na_numa_affinity_is_none():
    variant = text("rtx4090-8-topo.txt").replace("\t0\t\tN/A", "\tN/A\t\tN/A")
    assert parse_topo(variant).numa == {0: None, 1: None, 2: None, 3: None, 4: 1, 5: 1, 6: 1, 7: 1}


@pytest.mark.parametrize(
    "cell01, cell10, expected",
    [
        ("NV3", "SYS", SYS),  # directions disagree: keep the worse
        ("PIX", "NV3", PIX),
        ("NV2", "NV3", Link("NV", 2)),
        ("SOC", "SOC", SYS),
        ("WEIRD", "NV3", Link("WEIRD")),  # unknown ranks worst
    ],
)
def test_asymmetric_and_unknown_cells(cell01, cell10, expected):
    lines = text("traverse-v100-4-topo.txt").splitlines()
    lines[1] = lines[1].replace("\tNV3\t", f"\t{cell01}\t", 1)
    lines[2] = lines[2].replace("GPU1\tNV3\t", f"GPU1\t{cell10}\t", 1)
    assert parse_topo("\n".join(lines)).link(0, 1) == expected


def test_stops_at_legend():
    extra = "\nNIC Legend:\n\n  NIC0: mlx5_0\nGPU0\t X \tPIX\tPIX\n"
    assert parse_topo(text("traverse-v100-4-topo.txt") + extra) == topo("traverse-v100-4-topo.txt")


def test_prompt_and_blank_lines_before_the_header_are_skipped():
    assert parse_topo("$ nvidia-smi topo -m\n\n" + text("k40m-4-soc-topo.txt")) == topo("k40m-4-soc-topo.txt")


def _traverse_with(old, new):
    raw = text("traverse-v100-4-topo.txt")
    assert old in raw
    return raw.replace(old, new, 1)


@pytest.mark.parametrize(
    "raw, reason",
    [
        ("", "no GPU header"),
        ("No devices were found\n", "no GPU header"),
        ("Legend:\n\tGPU0\tGPU1\n", "no GPU header"),
        ("\tGPU0\tGPU1\tCPU Affinity\n", "no row for GPU0"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV1\n", "no row for GPU1"),
        (_traverse_with("GPU2\tSYS\tSYS\t X \tNV3\t", "GPU2\tSYS\t X \tNV3\t"), "row GPU2 has"),
        (_traverse_with("GPU1\tNV3\t X \t", "GPU1\tNV3\tNV3\t"), "instead of X"),
        (_traverse_with("GPU3\tSYS\tSYS\tNV3\t X \t", "GPU3\tSYS\t0-1\tNV3\t X \t"), "not a link class"),
        (_traverse_with("\nmlx5_0\t", "\n" + text("traverse-v100-4-topo.txt").splitlines()[2] + "\nmlx5_0\t"),
         "two rows"),
        ("\tGPU0\tGPU0\nGPU0\t X \tX\n", "duplicate column"),
    ],
)
def test_unusable_output_raises(raw, reason):
    with pytest.raises(TopoError, match=reason) as err:
        parse_topo(raw)
    assert "\n" not in str(err.value)
    assert isinstance(err.value, ValueError)


def test_topology_link_lookup():
    t = topo("traverse-v100-4-topo.txt")
    assert t.link(3, 2) == t.link(2, 3) == NV3
    with pytest.raises(ValueError):
        t.link(1, 1)
    with pytest.raises(KeyError):
        t.link(0, 9)


# --- link classes ----------------------------------------------------------


def test_link_rank_order():
    best_to_worst = [Link("NV", 18), NV12, Link("NV", 4), Link("NV", 1), Link("NV"), PIX, Link("PXB"), PHB, NODE,
                     SYS, Link("SPB")]
    ranks = [link.rank for link in best_to_worst]
    assert ranks == sorted(ranks)
    assert len(set(ranks)) == len(ranks)


@pytest.mark.parametrize(
    "link, shown",
    [(Link("NV", 18), "NV18"), (Link("NV"), "NV"), (PIX, "PIX"), (SYS, "SYS"), (Link("?"), "?")],
)
def test_link_str(link, shown):
    assert str(link) == shown


@pytest.mark.parametrize(
    "given, link",
    [
        ("NV", Link("NV", 0)),
        ("nv", Link("NV", 0)),
        ("NV4", Link("NV", 4)),
        ("nv18", Link("NV", 18)),
        ("pix", PIX),
        ("PXB", Link("PXB")),
        ("PHB", PHB),
        (" Node ", NODE),
        ("SYS", SYS),
    ],
)
def test_parse_link_class(given, link):
    assert parse_link_class(given) == link


@pytest.mark.parametrize("given", ["", "NV0", "NV-4", "SOC", "fast", "X", "NV 4"])
def test_parse_link_class_rejects(given):
    with pytest.raises(TopoError) as err:
        parse_link_class(given)
    for form in ("NV", "NV<n>", "PIX", "PXB", "PHB", "NODE", "SYS"):
        assert form in str(err.value)


# --- worst_link, crosses_host, label, gpu_node ------------------------------


@pytest.mark.parametrize(
    "name, gpus, worst",
    [
        ("traverse-v100-4-topo.txt", (0, 1), NV3),
        ("traverse-v100-4-topo.txt", (2, 0, 1), SYS),
        ("traverse-v100-4-topo.txt", (0,), None),
        ("traverse-v100-4-topo.txt", (), None),
        ("dgx1-v100-topo-mp.txt", (0, 1, 2, 3), PHB),
        ("dgx1-v100-topo-mp.txt", (4, 5), PIX),
        ("club3090-5gpu-spaces-topo.txt", (1, 2, 3), NODE),
        ("traverse-v100-4-topo.txt", (0, 9), Link("?")),  # a pair the topology lacks is worst
    ],
)
def test_worst_link(name, gpus, worst):
    assert worst_link(topo(name), gpus) == worst


@pytest.mark.parametrize(
    "link, crosses",
    [(None, False), (NV12, False), (PIX, False), (Link("PXB"), False), (PHB, True), (NODE, True), (SYS, True),
     (Link("?"), True)],
)
def test_crosses_host(link, crosses):
    assert crosses_host(link) is crosses


@pytest.mark.parametrize(
    "name, gpus, shown",
    [
        ("dgx-a100-topo.txt", (), "-"),
        ("dgx-a100-topo.txt", (3,), "1"),
        ("dgx-a100-topo.txt", (0, 1), "2:NV12"),
        ("traverse-v100-4-topo.txt", (0, 1), "2:NV3"),
        ("traverse-v100-4-topo.txt", (0, 2), "2:SYS!"),
        ("dgx1-v100-topo-mp.txt", (0, 1), "2:PIX"),
        ("dgx1-v100-topo-mp.txt", (0, 1, 2, 3), "4:PHB!"),
        ("club3090-5gpu-spaces-topo.txt", (1, 3), "2:NODE!"),
        ("k40m-4-soc-topo.txt", (0, 1, 2, 3), "4:SYS!"),
        (None, (0, 1, 2), "3"),
        (None, (), "-"),
    ],
)
def test_label(name, gpus, shown):
    assert label(topo(name) if name else None, gpus) == shown


@pytest.mark.parametrize(
    "name, gpus, node",
    [
        ("dgx-a100-topo.txt", (0, 1), 3),
        ("dgx-a100-topo.txt", (6,), 5),
        ("dgx-a100-topo.txt", (0, 2), None),
        ("dgx-a100-topo.txt", (), None),
        ("traverse-v100-4-topo.txt", (2, 3), 8),
        ("k40m-4-soc-topo.txt", (0, 1), None),
        (None, (0, 1), None),
    ],
)
def test_gpu_node(name, gpus, node):
    assert gpu_node(topo(name) if name else None, gpus) == node


# --- choose_gpus -------------------------------------------------------------

ALL8 = range(8)

CHOICES = [
    # name, free, count, max_link, node, chosen
    # Two NVLink pairs: a 2-GPU job gets a pair.
    ("traverse-v100-4-topo.txt", range(4), 2, None, None, (0, 1)),
    ("traverse-v100-4-topo.txt", {1, 2, 3}, 2, None, None, (2, 3)),
    # GPU 0 busy: take GPU 1 from the broken {0,1} island, keep {2,3} whole.
    ("traverse-v100-4-topo.txt", {1, 2, 3}, 1, None, None, (1,)),
    ("traverse-v100-4-topo.txt", range(4), 1, None, None, (0,)),
    # No free NVLinked pair: "NV" makes the job wait, without a limit it spans.
    ("traverse-v100-4-topo.txt", {1, 2}, 2, "NV", None, None),
    ("traverse-v100-4-topo.txt", {1, 2}, 2, None, None, (1, 2)),
    ("traverse-v100-4-topo.txt", range(4), 2, "NV3", None, (0, 1)),
    ("traverse-v100-4-topo.txt", range(4), 2, "NV4", None, None),
    ("traverse-v100-4-topo.txt", range(4), 4, "SYS", None, (0, 1, 2, 3)),
    ("traverse-v100-4-topo.txt", range(4), 4, "PHB", None, None),
    ("traverse-v100-4-topo.txt", {1, 2}, 1, "NV", None, (1,)),  # one GPU has no links to limit
    ("traverse-v100-4-topo.txt", range(4), 2, None, 8, (2, 3)),
    ("traverse-v100-4-topo.txt", range(4), 1, None, 8, (2,)),
    ("traverse-v100-4-topo.txt", {0, 1, 3}, 2, None, 8, None),
    ("traverse-v100-4-topo.txt", range(4), 1, None, 5, None),
    ("traverse-v100-4-topo.txt", range(4), 5, None, None, None),
    # NVSwitch: links are all equal, so NUMA islands decide.
    ("dgx-a100-topo.txt", ALL8, 8, None, None, tuple(ALL8)),
    ("dgx-a100-topo.txt", ALL8, 8, "NV12", None, tuple(ALL8)),
    ("dgx-a100-topo.txt", ALL8, 2, "NV18", None, None),
    ("dgx-a100-topo.txt", ALL8, 2, None, None, (0, 1)),
    ("dgx-a100-topo.txt", range(1, 8), 1, None, None, (1,)),
    ("dgx-a100-topo.txt", ALL8, 4, None, None, (0, 1, 2, 3)),
    ("dgx-a100-topo.txt", {1, 3, 4, 5, 6, 7}, 2, None, None, (1, 3)),
    ("dgx-a100-topo.txt", ALL8, 2, None, 5, (6, 7)),
    ("dgx-a100-topo.txt", {1, 2, 3}, 2, None, 3, None),
    # PCIe only: PIX pairs first, a job stays inside one switch / one node.
    ("dgx1-v100-topo-mp.txt", ALL8, 2, None, None, (0, 1)),
    ("dgx1-v100-topo-mp.txt", range(1, 8), 1, None, None, (1,)),
    ("dgx1-v100-topo-mp.txt", range(1, 8), 2, None, None, (2, 3)),
    ("dgx1-v100-topo-mp.txt", ALL8, 4, None, None, (0, 1, 2, 3)),
    ("dgx1-v100-topo-mp.txt", ALL8, 2, None, 1, (4, 5)),
    ("dgx1-v100-topo-mp.txt", {0, 2, 4, 6}, 2, None, None, (0, 2)),
    ("dgx1-v100-topo-mp.txt", {0, 2, 4, 6}, 2, "PIX", None, None),
    ("dgx1-v100-topo-mp.txt", {0, 2, 4, 6}, 2, "PHB", None, (0, 2)),
    ("club3090-5gpu-spaces-topo.txt", range(5), 2, None, None, (1, 2)),
    # GPU 0 is alone on its node and SYS to all: the best home for a 1-GPU job.
    ("club3090-5gpu-spaces-topo.txt", {0, 2, 3, 4}, 1, None, None, (0,)),
    # GPU 4 busy: GPU 3 comes from the broken PHB pair {3,4}, {1,2} stays whole.
    ("club3090-5gpu-spaces-topo.txt", {1, 2, 3}, 1, None, None, (3,)),
    ("club3090-5gpu-spaces-topo.txt", {0, 1, 3}, 2, None, None, (1, 3)),
    ("club3090-5gpu-spaces-topo.txt", range(5), 4, None, None, (1, 2, 3, 4)),
    ("club3090-5gpu-spaces-topo.txt", range(5), 1, None, 1, (0,)),
    # All SYS: only NUMA islands separate the sets.
    ("rtx4090-8-topo.txt", ALL8, 4, None, None, (0, 1, 2, 3)),
    ("rtx4090-8-topo.txt", range(1, 8), 2, None, None, (1, 2)),
    ("rtx4090-8-topo.txt", range(1, 8), 4, None, None, (4, 5, 6, 7)),
    ("rtx4090-8-topo.txt", ALL8, 2, "NODE", None, None),
    # No NUMA column: a node cannot be matched.
    ("k40m-4-soc-topo.txt", range(4), 2, None, None, (0, 1)),
    ("k40m-4-soc-topo.txt", {0, 2, 3}, 2, None, None, (2, 3)),
    ("k40m-4-soc-topo.txt", {0, 2, 3}, 1, None, None, (0,)),
    ("k40m-4-soc-topo.txt", {1, 2, 3}, 1, None, None, (1,)),
    ("k40m-4-soc-topo.txt", {0, 1, 3}, 1, None, None, (3,)),
    ("k40m-4-soc-topo.txt", range(4), 1, None, 0, None),
]


def _choose(name, free, count, max_link, node):
    limit = parse_link_class(max_link) if max_link else None
    return choose_gpus(topo(name), free, count, limit, node)


@pytest.mark.parametrize("name, free, count, max_link, node, chosen", CHOICES)
def test_choose_gpus(name, free, count, max_link, node, chosen):
    assert _choose(name, free, count, max_link, node) == chosen


@pytest.mark.parametrize("name, free, count, max_link, node, chosen", CHOICES)
def test_choose_gpus_greedy_fallback(monkeypatch, name, free, count, max_link, node, chosen):
    # Force the greedy path; on these machines it finds the same sets.
    monkeypatch.setattr(gputopo, "ENUMERATION_LIMIT", 0)
    assert _choose(name, free, count, max_link, node) == chosen


def test_choose_gpus_honours_the_limit_on_a_large_box():
    # 24 GPUs in NV18 quads, SYS between quads: C(24, 12) is past the
    # enumeration limit, so this runs the greedy search.
    gpus = tuple(range(24))
    links = {(a, b): Link("NV", 18) if a // 4 == b // 4 else SYS for a, b in itertools.combinations(gpus, 2)}
    box = Topology(gpus, links, {g: g // 12 for g in gpus})
    assert gputopo.math.comb(24, 12) > gputopo.ENUMERATION_LIMIT
    assert choose_gpus(box, gpus, 4) == (0, 1, 2, 3)
    assert choose_gpus(box, set(gpus) - {0}, 4) == (4, 5, 6, 7)
    assert choose_gpus(box, set(gpus) - {0}, 3) == (1, 2, 3)
    assert choose_gpus(box, gpus, 12) == tuple(range(12))
    assert choose_gpus(box, set(gpus) - {1, 5, 9, 13, 17, 21}, 4, parse_link_class("NV")) is None
    assert choose_gpus(box, set(gpus) - {1, 5, 9, 13, 17, 21}, 3, parse_link_class("NV")) == (0, 2, 3)


def test_choose_gpus_on_the_nvswitch_box_any_set_is_equally_linked():
    t = topo("dgx-a100-topo.txt")
    worst = {worst_link(t, s) for s in itertools.combinations(range(8), 4)}
    assert worst == {NV12}


def test_choose_gpus_free_gpu_unknown_to_the_topology():
    t = topo("traverse-v100-4-topo.txt")
    assert choose_gpus(t, {0, 9}, 2) == (0, 9)
    assert choose_gpus(t, {0, 9}, 2, parse_link_class("SYS")) is None  # unknown link ranks worst
    assert choose_gpus(t, {1, 9}, 1) == (1,)


@pytest.mark.parametrize(
    "free, count, max_link, node, chosen",
    [
        ({3, 1, 2}, 2, None, None, (1, 2)),
        ([0, 1, 2, 3], 4, None, None, (0, 1, 2, 3)),
        ({5}, 2, None, None, None),
        ({1, 2}, 0, None, None, ()),
        ({1, 2}, 2, "NV", None, None),  # a limit cannot be checked without a topology
        ({1, 2}, 1, "NV", None, (1,)),
        ({1, 2}, 1, None, 0, None),
    ],
)
def test_choose_gpus_without_topology(free, count, max_link, node, chosen):
    limit = parse_link_class(max_link) if max_link else None
    assert choose_gpus(None, free, count, limit, node) == chosen


def test_choose_zero_and_negative():
    t = topo("dgx-a100-topo.txt")
    assert choose_gpus(t, [], 0) == ()
    assert choose_gpus(t, ALL8, 0, parse_link_class("NV18"), 9) == ()
    with pytest.raises(ValueError):
        choose_gpus(t, ALL8, -1)


# --- minor numbers -----------------------------------------------------------


def test_parse_uuids_skips_mig_lines():
    uuids = parse_uuids(text("a100-4-mig-list.txt"))
    assert uuids == {
        0: "GPU-513536b6-7d19-9063-b049-1e69664bb298",
        1: "GPU-d8594bd4-0fc3-8595-e355-7c98138f3b95",
        2: "GPU-5e375e7e-b41f-155b-dcdc-534524c356fc",
        3: "GPU-69ec2344-ebac-b028-f88f-452abb3d7f11",
    }


@pytest.mark.parametrize(
    "uuid, minor",
    [
        # In bus order (nvidia-smi index 0..7); the minors are not 0..7.
        ("GPU-eb0003d2-77b4-70fd-4ab9-3ef1c9853c49", 2),
        ("GPU-39cbea41-34d5-0fca-4f58-d64c23221021", 3),
        ("GPU-5d945aa0-a30b-973f-bb3e-267c5ffa79fd", 0),
        ("GPU-66381ad0-d80c-3f88-483f-3e2da8feab6c", 1),
        ("GPU-a92fa75d-5ce7-adf8-3870-35f48a7a057e", 6),
        ("GPU-783404ba-3094-6935-3135-d98bb3fa1f9e", 7),
        ("GPU-8df4a71b-3215-368d-ec7f-c05db8832af8", 4),
        ("GPU-d1070142-12c4-2d40-17b0-ec928b5dbc13", 5),
    ],
)
def test_parse_query_minors(uuid, minor):
    minors = parse_query_minors(text("a100-8-query-excerpt.txt"))
    assert len(minors) == 8
    assert minors[uuid] == minor


def test_parse_query_minors_skips_na_and_keeps_sections_apart():
    raw = text("a100-8-query-excerpt.txt")
    # The first section loses its minor: it must not borrow the next one's.
    variant = raw.replace("Minor Number                          : 2", "Minor Number                          : N/A")
    minors = parse_query_minors(variant)
    assert "GPU-eb0003d2-77b4-70fd-4ab9-3ef1c9853c49" not in minors
    assert minors["GPU-39cbea41-34d5-0fca-4f58-d64c23221021"] == 3
    assert len(minors) == 7
    assert parse_query_minors("") == {}


@pytest.mark.parametrize(
    "edit, expected",
    [
        (None, ("0000:70:00.0", 0)),
        (("Device Minor: \t 0", "Device Minor: \t 3"), ("0000:70:00.0", 3)),
        (("Device Minor: \t 0\n", ""), ("0000:70:00.0", None)),
        (("Bus Location: \t 0000:70:00.0\n", ""), (None, 0)),
    ],
)
def test_parse_proc_information(edit, expected):
    raw = text("l4-proc-information.txt")
    if edit is not None:
        assert edit[0] in raw
        raw = raw.replace(*edit)
    assert parse_proc_information(raw) == expected

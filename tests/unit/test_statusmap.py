"""dispatch status's machine map: the daemon's data (core/machinemap) and the terminal view (client/statusview).

Machines:

* ``EPYC``: tests/fixtures/sysfs/amd-epyc-7502p-nps4 (4 NUMA nodes, each two
  L3s of 4 cores x 2 threads, siblings N and N+32; synthesised in the
  kernel's format, see tests/fixtures/README.md) read by the real discovery code;
* ``small()``: the same shape scaled down to 2 nodes x 2 L3s x 2 cores x 2
  threads (an EPYC in NPS2 mode with 2-core CCXs; siblings N and N+8), built
  here so every cell of the map can be written out, with three GPUs: one on
  each node and one the driver gives no node (as ``nvidia-smi topo -m`` says
  ``N/A``).
"""

import json
import re
from pathlib import Path

import pytest

from hpc_batch.client import statusview
from hpc_batch.client.statusscreen import colour_wanted
from hpc_batch.core import cputopo, gputopo, machinemap, report
from hpc_batch.core.machinemap import Holder
from hpc_batch.core.resources import Allocation, Limits, Machine, Node
from hpc_batch.daemon.discovery import read_cpu_topology, read_numa

GiB = 1 << 30
EPYC = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs" / "amd-epyc-7502p-nps4"
SGR = re.compile(r"\x1b\[[0-9;]*m")


def small() -> Machine:
    cpus = []
    for core in range(8):
        l3 = cputopo.Cache(3, "Unified", core // 2, tuple(sorted({c for k in (core - core % 2, core - core % 2 + 1)
                                                                   for c in (k, k + 8)})))
        for cpu in (core, core + 8):
            cpus.append(cputopo.Cpu(cpu, core // 4, core % 4, (core, core + 8), (l3,)))
    nodes = (Node(0, (0, 1, 2, 3, 8, 9, 10, 11), 8 * GiB), Node(1, (4, 5, 6, 7, 12, 13, 14, 15), 8 * GiB))
    gpus = gputopo.Topology((0, 1, 2), {}, {0: 0, 1: 1, 2: None})
    return Machine(nodes, (0, 1, 2), gpus, cpu_topology=cputopo.build(cpus))


def alloc(cpus, cores=(), gpus=(), node=0, mem=GiB) -> Allocation:
    return Allocation(tuple(cpus), ((node, mem),), tuple(gpus), False, tuple(cores))


# Job 5 (alice): a whole core on node 0 and GPU 0. Job 7 (bob): a benchmark job on CPU 4, its
# sibling 12 held idle. Job 9: another user's, which the caller may not see.
HOLDERS = [Holder(7, "bob", alloc([4], cores=[(4, 12)], node=1)),
           Holder(5, "alice", alloc([2, 10], cores=[(2, 10)], gpus=[0])),
           Holder(None, None, alloc([6, 14], cores=[(6, 14)], gpus=[1], node=1))]
LIMITS = Limits(reserve_cpu=1, reserve_mem=0, min_job_mem=0, housekeeping=(0, 8))


def status(m=None, holders=HOLDERS, limits=LIMITS):
    m = m or small()
    st = report.status(m, limits, [h.alloc for h in holders], "fifo-strict", 2, 0,
                       {"id": 11, "user": "alice", "name": None, "why": "it needs 8 CPUs"})
    st["map"] = machinemap.build(m, (0, 8), holders)
    return st


# ------------------------------------------------------------------ the daemon's data


def test_the_map_follows_nodes_then_l3_groups_then_cores_with_their_threads_from_sysfs():
    nodes = read_numa(str(EPYC))
    topo, _ = read_cpu_topology(str(EPYC), [c for n in nodes for c in n.cpus])
    got = machinemap.build(Machine(nodes, cpu_topology=topo), (), [])
    assert got["cache_level"] == 3
    assert [n["id"] for n in got["nodes"]] == [0, 1, 2, 3]
    for i, node in enumerate(got["nodes"]):
        assert len(node["caches"]) == 2                              # two CCXs per NPS4 node
        for j, group in enumerate(node["caches"]):
            first = 8 * i + 4 * j
            assert group == [[c, c + 32] for c in range(first, first + 4)]


def test_jobs_carry_their_cpus_idle_siblings_and_gpus_and_hidden_ones_are_merged_without_names():
    hidden_too = HOLDERS + [Holder(None, None, alloc([7, 15], cores=[(7, 15)], node=1))]
    got = machinemap.build(small(), (0, 8), hidden_too)
    assert got["jobs"] == [
        {"id": 5, "user": "alice", "cpus": [2, 10], "idle": [], "gpus": [0]},
        {"id": 7, "user": "bob", "cpus": [4], "idle": [12], "gpus": []},
        {"id": None, "user": None, "cpus": [6, 7, 14, 15], "idle": [], "gpus": [1]},
    ]
    assert got["reserved"] == [0, 8]
    assert got["gpus"] == [{"index": 0, "node": 0}, {"index": 1, "node": 1}, {"index": 2, "node": None}]
    assert got["nodes"][1]["caches"] == [[[4, 12], [5, 13]], [[6, 14], [7, 15]]]


def test_a_machine_whose_kernel_describes_no_cache_is_one_group_a_node():
    m = Machine((Node(0, (0, 1), GiB), Node(1, (2, 3), GiB)))
    got = machinemap.build(m, (), [])
    assert got["cache_level"] is None
    assert got["nodes"] == [{"id": 0, "caches": [[[0], [1]]]}, {"id": 1, "caches": [[[2], [3]]]}]


def test_the_map_is_bounded_by_the_cpus_not_the_queue():
    # 512 CPUs each held by a job of its own: the most running jobs such a machine can have.
    cpus = tuple(range(512))
    m = Machine((Node(0, cpus[:256], GiB), Node(1, cpus[256:], GiB)))
    holders = [Holder(100_000 + c, "u" * 32, alloc([c])) for c in cpus]
    got = machinemap.build(m, (), holders)
    assert len(got["jobs"]) == 512
    assert len(json.dumps(got)) < 64 * 1024


# ------------------------------------------------------------------ the terminal view


def test_every_cpu_shows_its_job_reserved_idle_housekeeping_or_free_and_every_gpu_its_job():
    lines = statusview.render(status(), 120, colour=False)
    mapped = lines[lines.index(next(x for x in lines if x.startswith("MACHINE"))):]
    assert mapped[1:] == [
        "NUMA node 0  CPUs 0-3,8-11",
        "  L3 cache: CPUs 0-1,8-9",
        "    [ 0H reserved |  8H reserved] [ 1  free     |  9  free    ]",
        "  L3 cache: CPUs 2-3,10-11",
        "    [ 2  #5 alice | 10  #5 alice] [ 3  free     | 11  free    ]",
        "NUMA node 1  CPUs 4-7,12-15",
        "  L3 cache: CPUs 4-5,12-13",
        "    [ 4  #7 bob   | 12~ #7 bob  ] [ 5  free     | 13  free    ]",
        "  L3 cache: CPUs 6-7,14-15",
        "    [ 6  busy     | 14  busy    ] [ 7  free     | 15  free    ]",
        "GPUs",
        "    [GPU 0 (node 0) #5 alice] [GPU 1 (node 1) busy    ] [GPU 2 (no node) free    ]",
    ]


def test_another_users_job_shows_neither_its_id_nor_its_user():
    text = "\n".join(statusview.render(status(holders=[Holder(None, None, alloc([2, 10]))]), 120, colour=False))
    assert "busy" in text and "#" not in text.split("MACHINE", 1)[1].split("\n", 1)[1]


def test_cores_wrap_at_the_width_and_no_line_passes_it():
    for width in (40, 60, 80, 120):
        lines = statusview.render(status(), width, colour=False)
        assert all(len(line) <= width for line in lines), width
    narrow = statusview.render(status(), 40, colour=False)
    assert "    [ 0H reserved |  8H reserved]" in narrow and "    [ 1  free     |  9  free    ]" in narrow


def test_the_summary_is_labelled_with_a_header_and_no_packed_cells():
    lines = statusview.render(status(), 120, colour=False)
    assert lines[0].split() == ["policy", "fifo-strict"]
    assert "head          job 11 (alice): it needs 8 CPUs" in lines
    header = next(x for x in lines if x.startswith("NODE"))
    assert header.split() == ["NODE", "RESOURCE", "TOTAL", "RESERVED", "IN", "USE", "FREE"]
    body = lines[lines.index(header) + 1:lines.index(header) + 9]
    assert body[0].split() == ["0", "CPUs", "8", "2", "2", "4"]
    assert body[1].split() == ["cores", "4", "1", "1", "2"]                     # SMT: cores counted too
    assert body[4].split() == ["1", "CPUs", "8", "0", "4", "4", "1", "held", "idle", "by", "benchmark", "jobs"]
    assert not any(re.search(r"\d+/\d+/\d+", x) for x in lines)
    # Columns line up under the header: each figure ends where its heading does.
    assert header.index("FREE") + len("FREE") == len(body[0].rstrip())


def test_colour_only_paints_and_a_users_escapes_never_reach_the_terminal():
    hostile = "\x1b[31m\x1b]0;owned\x07\u202eevil"
    st = status(holders=[Holder(5, hostile, alloc([2, 10], gpus=[0]))])
    st["head"] = {"id": 11, "user": hostile, "name": None, "why": "waits \x1b[2J"}
    plain = "\n".join(statusview.render(st, 200, colour=False))
    painted = "\n".join(statusview.render(st, 200, colour=True))
    assert "\x1b" not in plain and "\u202e" not in plain
    assert "#5 \\x1b[31m" in plain and "\\u202e" in plain
    assert painted != plain and SGR.sub("", painted) == plain      # colour adds SGR codes and nothing else


def test_colour_is_wanted_on_a_terminal_unless_no_color_is_set(monkeypatch):
    class Tty:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert colour_wanted(Tty(True)) and not colour_wanted(Tty(False))
    monkeypatch.setenv("NO_COLOR", "1")
    assert not colour_wanted(Tty(True))
    monkeypatch.setenv("NO_COLOR", "")          # no-color.org: set and empty does not count
    assert colour_wanted(Tty(True))


def test_a_daemon_without_the_map_is_said_rather_than_a_crash():
    st = status()
    del st["map"]
    assert "older than this dispatch" in statusview.render(st, 100, colour=False)[-1]


def test_a_screen_too_short_says_how_much_is_hidden():
    lines = [[(f"line {i}", None)] for i in range(100)]
    shown = statusview.frame(lines, 24)
    assert len(shown) == 23 and shown[21] == [("line 21", None)]
    assert shown[-1][0][0].startswith("... 78 more lines")
    assert statusview.frame(lines[:5], 24) == lines[:5]


def test_a_cut_line_ends_in_a_mark_and_keeps_its_styles():
    line = [("abc", "head"), ("defgh", None)]
    assert statusview.cut(line, 5) == [("abc", "head"), ("d", None), ("\u2026", None)]
    assert statusview.cut(line, 5, unicode=False)[-1] == (">", None)
    assert statusview.cut(line, 8) == line


@pytest.mark.parametrize("text, seconds", [("2", 2.0), ("0.5", 0.5), ("3600", 3600.0), (" 10 ", 10.0)])
def test_interval_takes_seconds(text, seconds):
    assert statusview.parse_interval(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0.1", "-1", "3601", "99999999999", "abc", "1e3", "inf", "nan",
                                  "2s", "1,5", "\u0663", "2."])
def test_interval_refuses_what_is_not_seconds_in_range(text):
    with pytest.raises(ValueError, match=r"^--interval .*: expected"):
        statusview.parse_interval(text)

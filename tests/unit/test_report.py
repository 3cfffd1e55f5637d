"""dispatch status and why a job waits, from the pure report module.

The machine is tests/fixtures/sysfs/intel-2s-xeon-gold-6248 (two NUMA nodes
of 40 CPUs; synthesised in the kernel's format, see tests/fixtures/README.md)
read by the real discovery code, with four GPUs whose topology is a recorded
``topo -m`` (two NV3 pairs, one on each node's side).
"""

from pathlib import Path

from hpc_batch.client import listing
from hpc_batch.core import gputopo, report
from hpc_batch.core.allocator import Free, allocate
from hpc_batch.core.requestcheck import check_request
from hpc_batch.core.resources import Budget, Limits, Machine, Request, capacity
from hpc_batch.daemon.discovery import read_numa

FIX = Path(__file__).resolve().parent.parent / "fixtures"
GiB = 1 << 30


def machine():
    nodes = read_numa(str(FIX / "sysfs" / "intel-2s-xeon-gold-6248"))
    topo = gputopo.parse_topo((FIX / "gpu" / "traverse-v100-4-topo.txt").read_text())
    topo = gputopo.Topology(topo.gpus, topo.links, {0: 0, 1: 0, 2: 1, 3: 1})   # this box's nodes are 0 and 1
    return Machine(nodes, (0, 1, 2, 3), topo)


LIMITS = Limits(reserve_cpu=2, reserve_mem=2 * GiB, min_job_mem=2 * GiB)


def test_status_per_node_totals_reserves_use_and_free():
    m = machine()
    req = Request(cpus=8, mem=16 * GiB, gpus=2)
    a = allocate(req, check_request(req, m, LIMITS), m, LIMITS, [])
    st = report.status(m, LIMITS, [a], "easy-backfill", queued=3, waiting=1,
                       head={"id": 9, "user": "alice", "name": None, "why": "it needs ..."})
    n0, n1 = st["nodes"]
    assert n0["cpus"]["total"] == 40 and n0["cpus"]["reserved"] == 2 and n1["cpus"]["reserved"] == 0
    home = 0 if set(a.cpus) <= set(range(0, 20)) | set(range(40, 60)) else 1
    used = (n0, n1)[home]
    assert used["cpus"]["in_use"] == 8 and used["mem"]["in_use"] == 16 * GiB
    assert used["cpus"]["free"] == used["cpus"]["total"] - used["cpus"]["reserved"] - 8
    assert n0["mem"]["reserved"] == 2 * GiB and n1["mem"]["reserved"] == 0
    assert (n0["gpus"]["total"], n1["gpus"]["total"]) == (2, 2)
    assert (n0, n1)[home]["gpus"]["in_use"] == 2 and sorted(a.gpus) in ([0, 1], [2, 3])
    assert st["jobs"] == {"running": 1, "queued": 3, "waiting": 1} and st["head"]["id"] == 9
    lines = listing.format_status(st)
    assert lines[0] == "policy easy-backfill; memory budgeted per NUMA node"
    assert lines[3].split()[:2] == ["0", f"40/2/{n0['cpus']['in_use']}/{n0['cpus']['free']}"]
    assert lines[-1] == "head: job 9 (alice): it needs ..."
    # Another user's head, the list not public: the daemon sent its id only.
    st["head"] = {"id": 9, "user": None, "name": None, "why": None}
    assert listing.format_status(st)[-1] == "head: job 9 (another user's)"


def test_why_a_job_waits():
    m = machine()
    cap = capacity(m, LIMITS)
    big = Request(cpus=38, mem=8 * GiB)
    a = allocate(big, check_request(big, m, LIMITS), m, LIMITS, [])
    b = allocate(big, check_request(big, m, LIMITS), m, LIMITS, [a])     # one per node: 0 and 2 cores left
    free = Free.of(cap, [a, b])
    wide = Request(cpus=30)
    why = report.why_waiting(wide, Budget(2 * GiB, True), 1, None, free, "fifo-strict", {})
    assert why == "it needs 30 cores on one NUMA node; the most free on one is 2"
    assert "behind job 5" in report.why_waiting(Request(), Budget(GiB, True), 2, 5, free, "fifo-strict", {})
    gpus = report.why_waiting(Request(gpus=5), Budget(GiB, True), 1, None, Free.of(cap, []), "fifo-strict", {})
    assert gpus == "it needs 5 GPUs; 4 are free"
    alone = report.why_waiting(Request(exclusive=True), Budget(GiB, True), 1, None, free, "fifo-strict", {})
    assert alone.startswith("it runs alone, and 2 jobs are running")
    held = report.why_waiting(Request(), Budget(GiB, True), 2, 5, free, "easy-backfill", {})
    assert "backfill budget held for job 5" in held

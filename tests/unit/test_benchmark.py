"""Benchmark mode on the fixture trees: one thread per core in the cpuset, siblings held, L3
exclusivity, housekeeping CPUs, refusals, shortfalls, and the strict wait's counters.

The machines are read by the real discovery code from tests/fixtures/sysfs
(see tests/fixtures/README.md): the Xeon (siblings N and N+40, one L3 per
socket), the EPYC in NPS4 (siblings N and N+32, an L3 per 4-core CCX, two
CCXs per node), the QEMU guest (siblings next to each other) and the hybrid
i9 (one L3 over P- and E-cores).
"""

import random
from pathlib import Path

import pytest

from hpc_batch.client import cli, listing
from hpc_batch.client.listing import cpu_column, format_show
from hpc_batch.core import benchmark, report
from hpc_batch.core.allocator import Free, allocate
from hpc_batch.core.jobrequest import JobRequest
from hpc_batch.core.requestcheck import RequestError, check_request
from hpc_batch.core.resources import Allocation, Budget, GiB, Limits, Machine, Request, capacity, default_share
from hpc_batch.daemon import probe
from hpc_batch.daemon.benchmode import housekeeping
from hpc_batch.daemon.discovery import read_cpu_topology, read_numa
from hpc_batch.wire.protocol import NewJob, ProtocolError

SYSFS = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"
SMT = ("intel-2s-xeon-gold-6248", "amd-epyc-7502p-nps4", "qemu-2s-smt-adjacent", "intel-i9-12900k-hybrid")


def machine(name, allowed=None):
    nodes = read_numa(str(SYSFS / name), allowed_cpus=allowed)
    topo, _ = read_cpu_topology(str(SYSFS / name), [c for n in nodes for c in n.cpus])
    return Machine(nodes, (), None, cpu_topology=topo)


def limits(m, reserve=0, whole_cores=True, hk=None):
    """Limits whose housekeeping CPUs are chosen as the daemon chooses them (auto) unless given."""
    base = Limits(reserve_cpu=reserve, reserve_mem=0, min_job_mem=0, whole_cores=whole_cores)
    if hk is None:
        hk, _ = housekeeping.choose(m, capacity(m, base).reserved_cpus, housekeeping.AUTO)
    return Limits(reserve_cpu=reserve, reserve_mem=0, min_job_mem=0, whole_cores=whole_cores, housekeeping=hk)


def place(m, req, running=(), lim=None):
    lim = lim or limits(m)
    return allocate(req, check_request(req, m, lim), m, lim, list(running))


def bench(cpus, mode="warn", l3=False, mem=GiB):
    return Request(cpus=cpus, mem=mem, benchmark=mode, whole_l3=l3, numa_local=True)


def llc(m, cpu):
    return set(m.cpu_topology.last_level_cache(cpu).cpus)


# -- one thread per core, siblings held -------------------------------------------------------
@pytest.mark.parametrize("name", SMT)
def test_a_benchmark_job_gets_one_thread_of_each_core_and_holds_the_siblings(name):
    m = machine(name)
    lim = limits(m, reserve=2)
    a = place(m, bench(2), lim=lim)
    topo = m.cpu_topology
    assert len(a.cpus) == 2 and len(a.cores) == 2
    for cpu, core in zip(a.cpus, a.cores):
        assert core == topo.siblings(cpu)            # every thread of its core is held
        assert cpu == core[0]                        # the cpuset has its lowest thread only
    assert set(a.idle) == {c for core in a.cores for c in core} - set(a.cpus)
    assert set(a.held) == set(a.cpus) | set(a.idle) and not set(a.idle) & set(a.cpus)
    if topo.smt and all(len(c) > 1 for c in a.cores):
        assert len(a.idle) == sum(len(c) - 1 for c in a.cores) > 0
    assert len({n.id for n in m.nodes if set(a.cpus) <= set(n.cpus)}) == 1   # one NUMA node


@pytest.mark.parametrize("name", SMT)
@pytest.mark.parametrize("seed", range(3))
def test_held_siblings_are_never_in_another_jobs_cpuset_and_housekeeping_never_goes_to_benchmarks(name, seed):
    m = machine(name)
    rng = random.Random(seed)
    for whole_cores in (True, False):
        lim = limits(m, reserve=rng.choice((0, 2)), whole_cores=whole_cores)
        running: list[tuple[Request, Allocation]] = []
        placed = 0
        for _ in range(300):
            if running and rng.random() < 0.3:
                running.pop(rng.randrange(len(running)))
            req = (bench(rng.choice((1, 2, 3)), rng.choice(("warn", "strict")), rng.random() < 0.2)
                   if rng.random() < 0.5 else Request(cpus=rng.choice((1, 2, 3)), mem=GiB))
            try:
                a = place(m, req, [x for _, x in running], lim)
            except RequestError:
                continue           # wider than this machine offers benchmark jobs
            if a is None:
                continue
            running.append((req, a))
            placed += bool(req.benchmark)
            _check_invariants(m, lim, running)
        assert placed


def _check_invariants(m, lim, running):
    hk_cores = {c for h in lim.housekeeping for c in m.cpu_topology.siblings(h)}
    owner: dict[int, int] = {}
    for i, (_, a) in enumerate(running):
        for c in a.held:
            assert owner.setdefault(c, i) == i, f"CPU {c} held by two jobs"
    for i, (req, a) in enumerate(running):
        if req.benchmark:
            assert not set(a.held) & hk_cores, "a benchmark job got a housekeeping core"
            if req.benchmark == "strict":
                assert all(core == m.cpu_topology.siblings(core[0]) for core in a.cores)
            if req.whole_l3 and req.benchmark == "strict":
                for c in a.cpus:   # no other job holds a CPU of its cache
                    assert all(owner.get(x, i) == i for x in llc(m, c)), f"job {i} shares its L3"
    cpusets = {c for _, a in running for c in a.cpus}
    idle = {c for _, a in running for c in a.idle}
    assert not cpusets & idle, "a held sibling is in some job's cpuset"


def test_warn_takes_a_core_whose_sibling_is_busy_and_says_so_where_strict_waits():
    m = machine("qemu-2s-smt-adjacent")       # cores 0-1, 2-3 | 4-5, 6-7
    lim = limits(m, whole_cores=False)        # threads packed: another job may sit on a sibling
    assert lim.housekeeping == (0, 1)
    others = [Allocation((c,), ((c // 4, 1 << 20),), (), False) for c in (3, 5, 7)]
    a = place(m, bench(1), others, lim)
    assert a.cpus == (2,) and a.cores == ((2,),) and a.idle == ()
    cap = capacity(m, lim)
    notes = benchmark.shortfalls(Request(benchmark="warn"), a, cap, cgroups=True)
    assert notes == ["sibling 3 of CPU 2 could not be held (in use by another job)"]
    strict = bench(1, "strict")
    assert place(m, strict, others, lim) is None
    free = Free.of(cap, others)
    why = report.why_waiting(strict, Budget(GiB, False), 1, None, free, "fifo-strict", {})
    assert "whole cores whose every thread is free" in why and "the most on one is 0" in why
    # Once the sibling's job ends, strict starts on the whole core.
    b = place(m, strict, others[1:], lim)
    assert b.cpus == (2,) and b.cores == ((2, 3),)


def test_a_sibling_the_daemon_may_not_give_is_a_shortfall_and_limits_strict():
    m = machine("qemu-2s-smt-adjacent", allowed={0, 1, 2, 3, 4, 6, 7})   # CPU 5 is not ours
    lim = limits(m)
    with pytest.raises(RequestError) as e:
        check_request(bench(2, "strict"), m, lim)
    assert str(e.value) == ("--benchmark=strict --cpu 2 can never fit: the largest NUMA node offers 1 whole core "
                            "with every thread free to hold to benchmark jobs (CPUs 0-1 and their cores are "
                            "kept for housekeeping)")
    a = place(m, bench(2), lim=lim)           # warn: node 1 has two cores, one of them without its sibling
    assert a.cpus == (4, 6) and a.cores == ((4,), (6, 7))
    assert benchmark.shortfalls(Request(), a, capacity(m, lim), True) == [
        "sibling 5 of CPU 4 could not be held (not a CPU the daemon gives to jobs)"]


def test_a_request_no_node_can_meet_is_refused_naming_the_limit():
    m = machine("intel-2s-xeon-gold-6248")
    lim = limits(m, reserve=2)                 # CPUs 0 and 40 reserved, and kept for housekeeping
    assert place(m, bench(20), lim=lim).cpus == tuple(range(20, 40))    # node 1 is whole
    with pytest.raises(RequestError, match=r"--benchmark --cpu 21 can never fit: the largest NUMA node offers "
                                           r"20 whole cores to benchmark jobs \(CPUs 0,40 and their cores"):
        check_request(bench(21), m, lim)
    lim = limits(m, hk=(0, 20))                # a housekeeping core on each node
    with pytest.raises(RequestError, match="offers 19 whole cores"):
        check_request(bench(20), m, lim)


def test_the_default_memory_share_counts_every_thread_of_its_cores():
    m = machine("intel-2s-xeon-gold-6248")
    lim = limits(m, reserve=2)
    assert check_request(Request(cpus=2, benchmark="warn"), m, lim) == Budget(default_share(4, m), True)


# -- the whole last-level cache ---------------------------------------------------------------
def test_whole_l3_holds_the_rest_of_its_ccx_and_no_other_job_gets_any_of_it():
    m = machine("amd-epyc-7502p-nps4")        # L3 per CCX of 4 cores: 0-3,32-35 | 4-7,36-39 | ...
    lim = limits(m)                            # housekeeping: CPU 0's core (0, 32)
    assert lim.housekeeping == (0, 32)
    a = place(m, bench(2, "strict", l3=True), lim=lim)
    cache = llc(m, a.cpus[0])
    assert not cache & {0, 32}                 # CCX 0 holds a housekeeping CPU: not quiet
    threads = {c for core in a.cores for c in core}
    assert set(a.held) == cache and len(a.cpus) == 2 and set(a.l3_idle) == cache - threads
    running = [a]
    while (b := place(m, Request(cpus=1, mem=GiB), running, lim)) is not None:
        running.append(b)
        assert not set(b.held) & cache
    assert len(running) > 20


def test_whole_l3_takes_the_fewest_caches_and_strict_waits_for_quiet_ones():
    m = machine("amd-epyc-7502p-nps4")
    lim = limits(m)
    a = place(m, bench(5, "strict", l3=True), lim=lim)
    caches = {tuple(sorted(llc(m, c))) for c in a.cpus}
    assert len(caches) == 2 and set(a.held) == set().union(*map(set, caches))
    with pytest.raises(RequestError, match=r"--benchmark=strict --cpu 9 can never fit: the largest NUMA node "
                                           r"offers 8 whole cores"):
        check_request(bench(9, "strict", l3=True), m, lim)
    per_node = limits(m, hk=(0, 8, 16, 24, 32, 40, 48, 56))     # a housekeeping core on every node
    check_request(bench(5, "strict"), m, per_node)
    with pytest.raises(RequestError, match=r"--whole-l3 --benchmark=strict --cpu 5 can never fit: .* at most "
                                           r"4 whole cores on one NUMA node"):
        check_request(bench(5, "strict", l3=True), m, per_node)
    # A plain job in every CCX but CCX 0 (housekeeping's): strict waits, warn runs and says why.
    busy = [Allocation((c,), ((c // 8, GiB),), (), False, ((c, c + 32),)) for c in range(4, 32, 4)]
    assert place(m, bench(1, "strict", l3=True), busy, lim) is None
    w = place(m, bench(1, "warn", l3=True), busy, lim)
    assert w is not None
    notes = benchmark.shortfalls(Request(whole_l3=True), w, capacity(m, lim), True)
    assert any(n.startswith("its last-level cache is shared with CPUs") for n in notes), notes


def test_whole_l3_on_a_socket_wide_cache_takes_the_other_socket():
    m = machine("intel-2s-xeon-gold-6248")
    lim = limits(m, reserve=2)
    a = place(m, bench(1, "strict", l3=True), lim=lim)
    assert set(a.held) == set(range(20, 40)) | set(range(60, 80)) and a.cpus == (20,)
    b = place(m, Request(cpus=4, mem=GiB), [a], lim)
    assert set(b.cpus) <= set(range(0, 20)) | set(range(40, 60))


def test_whole_l3_where_every_cache_holds_housekeeping_is_refused_strict_and_noted_warn():
    m = machine("intel-i9-12900k-hybrid")     # one L3 over every core
    lim = limits(m)
    with pytest.raises(RequestError, match="last-level caches that hold no housekeeping or reserved CPU offer "
                                           "at most 0 whole cores"):
        check_request(bench(1, "strict", l3=True), m, lim)
    a = place(m, bench(1, l3=True), lim=lim)
    notes = benchmark.shortfalls(Request(whole_l3=True), a, capacity(m, lim), True)
    assert "its last-level cache is shared with CPUs 0-1 (housekeeping: 0-1)" in notes


def test_whole_l3_never_holds_a_thread_of_a_housekeeping_core():
    # Threads handed out one by one (whole cores off) and the housekeeping CPU 0 alone: its sibling 40
    # is a job CPU, free, and in socket 0's cache. With socket 1 taken, a warn job lands on socket 0
    # and holds the rest of its cache idle, but never 40: that core is the daemon's.
    m = machine("intel-2s-xeon-gold-6248")    # siblings N and N+40, one L3 a socket
    lim = limits(m, whole_cores=False, hk=(0,))
    socket1 = sorted(m.nodes[1].cpus)
    taken = Allocation(cpus=tuple(socket1), mem_by_node=((1, GiB),), gpus=(), exclusive=False)
    a = place(m, bench(1, l3=True), [taken], lim)
    assert a is not None and set(a.cpus) <= set(m.nodes[0].cpus)
    assert a.l3_idle and set(a.l3_idle) <= llc(m, 0)
    assert not {0, 40} & set(a.held), a


def test_plain_jobs_take_a_housekeeping_cpu_last():
    # --reserve-cpu 0: the housekeeping core is a job core too, but the daemon and the shepherds run
    # there, so a job gets it only once nothing else is free.
    m = machine("qemu-2s-smt-adjacent")
    lim = limits(m)
    hk = set(lim.housekeeping)
    assert hk
    running = []
    others = sum(len(n.cpus) for n in m.nodes) - len({c for h in hk for c in m.cpu_topology.siblings(h)})
    while True:
        a = place(m, Request(cpus=1, mem=GiB // 8), running, lim)
        if a is None:
            break
        running.append(a)
        if len(running) * len(a.cpus) <= others:
            assert not hk & set(a.cpus), (len(running), a)
    assert any(hk & set(x.cpus) for x in running)   # and then it is used


def test_an_exclusive_benchmark_job_has_one_thread_per_core_and_holds_everything():
    m = machine("qemu-2s-smt-adjacent")
    lim = limits(m)
    a = place(m, Request(exclusive=True, benchmark="warn"), lim=lim)
    assert a.exclusive and a.cpus == (2, 4, 6) and set(a.held) == set(range(8))


# -- records, show, list, status --------------------------------------------------------------
def test_the_allocation_round_trips_and_an_older_record_loads():
    a = Allocation((2, 4), ((0, GiB),), (), False, ((2, 3), (4, 5)), (6, 7))
    assert Allocation.from_dict(a.to_dict()) == a
    d = a.to_dict()
    del d["l3_idle"]
    assert Allocation.from_dict(d).l3_idle == ()
    assert a.idle == (3, 5, 6, 7) and a.held == tuple(range(2, 8))


def test_list_show_and_status_say_what_is_held_idle():
    m = machine("qemu-2s-smt-adjacent")
    lim = limits(m)
    a = place(m, bench(2), lim=lim)
    job = {"cpus": list(a.cpus), **report.cpu_fields(m, a)}
    assert cpu_column(job) == "2+2i/2c"
    fields = report.bench_fields(JobRequest(Request(benchmark="warn"), aslr="off"), a, ["no housekeeping CPUs"])
    text = format_show({"state": "running", **job, **fields}, 0)
    assert "benchmark: warn" in text
    assert a.cpus == (4, 6)                     # node 0 has one core left beside housekeeping's
    assert "held idle: 5,7 (in no job's cpuset, charged to this one)" in text
    assert "fell short: no housekeeping CPUs" in text and "aslr: off" in text
    assert "transparent huge pages: on" in text
    st = report.status(m, lim, [a], "fifo-strict", 0, 0, None)
    assert [n["held_idle"] for n in st["nodes"]] == [0, 2]   # 5 and 7 and st["housekeeping"] == [0, 1]
    lines = "\n".join(listing.format_status(st))
    assert "held idle by benchmark jobs" in lines and "2 CPUs on node 1" in lines
    assert "housekeeping CPUs (never given to benchmark jobs): 0-1" in lines


# -- housekeeping -------------------------------------------------------------------------------
def test_housekeeping_defaults_to_the_reserve_then_the_lowest_core():
    m = machine("intel-2s-xeon-gold-6248")
    assert housekeeping.choose(m, (0, 40), "auto") == ((0, 40), "the CPUs --reserve-cpu keeps for the OS")
    cpus, why = housekeeping.choose(m, (), "auto")
    assert cpus == (0, 40) and "core of CPU 0" in why
    assert housekeeping.choose(m, (), (3, 5)) == ((3, 5), "as --housekeeping-cpus says")
    assert housekeeping.choose(m, (0, 40), "none")[0] == ()
    with pytest.raises(ValueError, match="names CPUs 80-81, which this daemon may not use"):
        housekeeping.choose(m, (), (80, 81))
    one = Machine(machine("dev-container-real").nodes[:1], ())
    assert housekeeping.choose(Machine((type(one.nodes[0])(0, (0,), GiB),)), (), "auto")[0] == ()
    assert housekeeping.parse_flag("0-1,4") == (0, 1, 4) and housekeeping.parse_flag("none") == "none"
    with pytest.raises(ValueError):
        housekeeping.parse_flag("zero")


def test_shortfalls_name_missing_housekeeping_and_cgroups():
    m = machine("qemu-2s-smt-adjacent")
    lim = limits(m, hk=())
    a = place(m, bench(1), lim=lim)
    assert a.cpus == (0,)                       # nothing is kept back
    assert benchmark.shortfalls(Request(), a, capacity(m, lim), cgroups=False) == [
        "no housekeeping CPUs: the daemon and the shepherds may run on its cores",
        "swap is not forbidden and memory is not kept on its NUMA node (--no-cgroups)"]


# -- the strict preconditions: swap and throttle counters ---------------------------------------
def _tree(root, pswpout=0, throttle=None):
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "vmstat").write_text(f"nr_free_pages 1000\npswpin 7\npswpout {pswpout}\npgfault 99\n")
    for cpu, count in (throttle or {}).items():
        d = root / f"sys/devices/system/cpu/cpu{cpu}/thermal_throttle"
        d.mkdir(parents=True, exist_ok=True)
        (d / "core_throttle_count").write_text(f"{count}\n")
        (d / "package_throttle_count").write_text("2\n")


def test_the_collector_reads_swap_and_throttle_counters_under_a_root(tmp_path):
    _tree(tmp_path, pswpout=12, throttle={0: 5, 1: 0})
    s = probe.read(100.0, str(tmp_path))
    assert s.swap == (7, 12) and s.throttle == {0: 7, 1: 2}
    assert probe.read(1.0, str(tmp_path), cpus=[1, 9]).throttle == {1: 2}
    assert probe.read(1.0, str(tmp_path / "nowhere")) == benchmark.Sample(1.0, None, {})
    assert benchmark.Sample.from_dict(s.to_dict()) == s


def test_strict_waits_while_swapping_or_throttling_and_the_watch_says_why(tmp_path):
    w = benchmark.Watch(1.0)
    _tree(tmp_path, pswpout=0, throttle={0: 1, 3: 1})
    assert w.due(10.0) == 10.0
    assert not w.feed(probe.read(10.0, str(tmp_path)))
    assert w.hold is not None and "a second reading is due 1s after the first" in w.hold
    assert w.due(10.5) == 11.0
    _tree(tmp_path, pswpout=40, throttle={0: 1, 3: 4})
    assert w.feed(probe.read(11.0, str(tmp_path)))
    assert w.hold == ("--benchmark=strict: the machine is swapping (0 pages swapped in, 40 out in 1.0s); "
                      "the thermal throttle counters of CPU 3 are rising")
    assert w.feed(probe.read(12.0, str(tmp_path)))    # nothing rose since the last reading: quiet
    assert w.hold is None
    w.forget()
    assert w.reasons is None and w.due(20.0) == 20.0


def test_unquiet_looks_at_the_cpus_asked_about():
    before = benchmark.Sample(0.0, (1, 1), {0: 1, 1: 1})
    after = benchmark.Sample(2.0, (1, 1), {0: 1, 1: 3})
    assert benchmark.unquiet(before, after, [0]) == []
    assert benchmark.unquiet(before, after) == ["the thermal throttle counters of CPU 1 are rising"]


# -- the client and the protocol -----------------------------------------------------------------
def test_a_bare_benchmark_flag_means_warn_and_the_options_are_checked():
    argv = cli.bare_benchmark(["new", "--max-time", "1h", "--benchmark", "--cpu", "2", "--", "x", "--benchmark"])
    assert argv == ["new", "--max-time", "1h", "--benchmark=warn", "--cpu", "2", "--", "x", "--benchmark"]
    assert cli.bare_benchmark(["new", "--benchmark", "strict", "x"]) == ["new", "--benchmark=strict", "x"]
    assert cli.bare_benchmark(["new", "--benchmark", "--", "warn"]) == ["new", "--benchmark=warn", "--", "warn"]
    assert cli._bench_args({"--benchmark": "strict", "--whole-l3": True, "--aslr": "off", "--thp": "on"}) == {
        "benchmark": "strict", "whole_l3": True, "aslr": "off"}
    with pytest.raises(cli.UsageError, match="--whole-l3 goes with --benchmark"):
        cli._bench_args({"--whole-l3": True})
    with pytest.raises(cli.UsageError, match="choose --benchmark"):
        cli._bench_args({"--benchmark": "loud"})
    with pytest.raises(cli.UsageError, match="expected on or off"):
        cli._bench_args({"--thp": "never"})


def test_the_protocol_checks_the_benchmark_fields():
    base = {"argv": ["x"], "cwd": "/"}
    job = NewJob.from_args({**base, "benchmark": "strict", "whole_l3": True, "aslr": "off", "thp": "off"})
    assert (job.benchmark, job.whole_l3, job.aslr, job.thp) == ("strict", True, "off", "off")
    assert NewJob.from_args(base).aslr == "on" and NewJob.from_args(base).benchmark is None
    for bad in ({"benchmark": "loud"}, {"whole_l3": True}, {"aslr": "maybe"}, {"thp": 0}):
        with pytest.raises(ProtocolError):
            NewJob.from_args({**base, **bad})

"""The machine's ledger of shared settings (hpc_batch.daemon.benchmode.ledger): begin and end of benchmark
jobs in any order -> what is written, and the values from before hpc-batch back at the end.

A fake kernel is a dict of file -> value; every step goes through the ledger's JSON form, as the
daemon persists it between steps, so what is checked is also what a new daemon would carry on from.
"""

import itertools
import json

import pytest

from hpc_batch.core.cputopo import format_cpulist, parse_cpulist
from hpc_batch.daemon.benchmode import irqsteer
from hpc_batch.daemon.benchmode.ledger import Ledger

pytestmark = pytest.mark.timeout(60)

IRQ = irqsteer.affinity_path
TURBO = "sys/devices/system/cpu/intel_pstate/no_turbo"


def reload(book):
    """The ledger as the next daemon reads it back from disk."""
    return Ledger.from_dict(json.loads(json.dumps(book.to_dict())))


def apply(files, writes, refuse=()):
    done, refused = [], []
    for w in writes:
        if w.path in refuse:
            refused.append(w)
        else:
            files[w.path] = w.new
            done.append(w)
    return done, refused


def begin(book, files, holder, wants, refuse=(), avoid=()):
    writes = book.begin(holder, {p: ("text" if p == TURBO else "cpulist", v) for p, v in wants.items()},
                        {p: files.get(p) for p in wants}, avoid)
    book = reload(book)
    done, refused = apply(files, writes, refuse)
    book.settle(done, refused, holder=holder)
    return reload(book), writes


def end(book, files, *holders, refuse=(), avoid=()):
    gone = set(holders)
    ended = book.end(gone, {p: files.get(p) for p, e in book.entries.items()
                            if not e.holders or gone & set(e.holders)}, avoid)
    book = reload(book)
    done, refused = apply(files, ended.writes, refuse)
    book.settle(done, refused)
    return reload(book), ended


# -- a table of cases: (events, the files after each) --------------------------
ORIG = {IRQ(24): "0-3", IRQ(25): "2", TURBO: "0"}
# Each event: ("begin", holder, wants) | ("end", holder) | ("set", path, value): someone else's
# write | ("begin-refused", holder, wants, refused paths) | ("end-refused", holder, refused paths).
CASES = {
    "one job: steered, then put back": [
        (("begin", "a", {IRQ(24): "0", IRQ(25): "0", TURBO: "1"}), {IRQ(24): "0", IRQ(25): "0", TURBO: "1"}),
        (("end", "a"), ORIG),
    ],
    "two jobs, same target: the first out leaves it, the last puts it back": [
        (("begin", "a", {IRQ(24): "0"}), {IRQ(24): "0"}),
        (("begin", "b", {IRQ(24): "0", IRQ(25): "0"}), {IRQ(24): "0", IRQ(25): "0"}),
        (("end", "a"), {IRQ(24): "0", IRQ(25): "0"}),
        (("end", "b"), ORIG),
    ],
    "two jobs, the first out is the last in": [
        (("begin", "a", {IRQ(24): "0"}), {IRQ(24): "0"}),
        (("begin", "b", {IRQ(24): "0"}), {IRQ(24): "0"}),
        (("end", "b"), {IRQ(24): "0"}),
        (("end", "a"), ORIG),
    ],
    "--housekeeping-cpus none: each wants every CPU but its own; they get the CPUs all accept": [
        (("begin", "a", {IRQ(24): "0,2-3"}), {IRQ(24): "0,2-3"}),
        (("begin", "b", {IRQ(24): "0-1,3", IRQ(25): "0-1,3"}), {IRQ(24): "0,3", IRQ(25): "0-1,3"}),
        (("end", "a"), {IRQ(24): "0-1,3", IRQ(25): "0-1,3"}),   # back onto A's CPU, not B's
        (("end", "b"), ORIG),
    ],
    "no CPU suits both: left as the first had it, put back after the last": [
        (("begin", "a", {IRQ(24): "1"}), {IRQ(24): "1"}),
        (("begin", "b", {IRQ(24): "0"}), {IRQ(24): "1"}),
        (("end", "a"), {IRQ(24): "0"}),
        (("end", "b"), ORIG),
    ],
    "someone else's change while held wins, and is not written over at an end": [
        (("begin", "a", {IRQ(24): "0"}), {IRQ(24): "0"}),
        (("begin", "b", {IRQ(24): "0"}), {IRQ(24): "0"}),
        (("set", IRQ(24), "3"), {IRQ(24): "3"}),
        (("end", "a"), {IRQ(24): "3"}),
        (("end", "b"), {IRQ(24): "3"}),
    ],
    "someone else's change, then a new job: its value is what goes back": [
        (("begin", "a", {IRQ(24): "0"}), {IRQ(24): "0"}),
        (("set", IRQ(24), "1-3"), {IRQ(24): "1-3"}),
        (("begin", "b", {IRQ(24): "0"}), {IRQ(24): "0"}),
        (("end", "a"), {IRQ(24): "0"}),
        (("end", "b"), {IRQ(24): "1-3"}),
    ],
    "put back by hand before the end: nothing to do": [
        (("begin", "a", {IRQ(24): "0"}), {IRQ(24): "0"}),
        (("set", IRQ(24), "0-3"), {}),
        (("end", "a"), {}),
    ],
    "a refused write holds nothing, and is never put back": [
        (("begin-refused", "a", {IRQ(24): "0", IRQ(25): "0"}, {IRQ(25)}), {IRQ(24): "0"}),
        (("set", IRQ(25), "0"), {IRQ(24): "0", IRQ(25): "0"}),   # someone else's, as we tried
        (("end", "a"), {IRQ(25): "0"}),
    ],
    "a refused rewrite at the first end keeps the value; the last end puts it back": [
        (("begin", "a", {IRQ(24): "0,2-3"}), {IRQ(24): "0,2-3"}),
        (("begin", "b", {IRQ(24): "0-1,3"}), {IRQ(24): "0,3"}),
        (("end-refused", "a", {IRQ(24)}), {IRQ(24): "0,3"}),
        (("end", "b"), {}),
    ],
}


@pytest.mark.parametrize("steps", CASES.values(), ids=CASES.keys())
def test_the_table(steps):
    book, files = Ledger(), dict(ORIG)
    for event, expect in steps:
        kind = event[0]
        if kind == "begin":
            book, _ = begin(book, files, event[1], event[2])
        elif kind == "begin-refused":
            book, _ = begin(book, files, event[1], event[2], refuse=event[3])
        elif kind == "end":
            book, _ = end(book, files, event[1])
        elif kind == "end-refused":
            book, _ = end(book, files, event[1], refuse=event[2])
        else:
            files[event[1]] = event[2]
        assert files == {**ORIG, **expect}, event
    assert book.entries == {}


def test_what_an_end_reports():
    book, files = Ledger(), dict(ORIG)
    book, _ = begin(book, files, "a", {IRQ(24): "0", IRQ(25): "0"})
    book, _ = begin(book, files, "b", {IRQ(24): "0"})
    files[IRQ(25)] = "1"   # someone else's
    book, ended = end(book, files, "a")
    assert (ended.restored, ended.kept, ended.left) == ([], [IRQ(24)], [(IRQ(25), "changed since (holds '1')")])
    book, ended = end(book, files, "b")
    assert (ended.restored, ended.kept, ended.left) == ([IRQ(24)], [], [])


def test_an_unreadable_file_is_not_held_and_a_vanished_one_is_let_go():
    book, files = Ledger(), dict(ORIG)
    del files[IRQ(25)]
    book, writes = begin(book, files, "a", {IRQ(24): "0", IRQ(25): "0"})
    assert [w.path for w in writes] == [IRQ(24)] and book.held_by("a") == [IRQ(24)]
    del files[IRQ(24)]   # the device went away
    book, ended = end(book, files, "a")
    assert ended.left == [(IRQ(24), "gone")] and book.entries == {}


def test_a_damaged_entry_is_dropped_on_load():
    book = Ledger.from_dict({IRQ(24): {"kind": "cpulist"}, IRQ(25): {"kind": "cpulist", "original": "2",
                                                                     "holders": [["a", "0"]], "written": "0"}})
    assert list(book.entries) == [IRQ(25)] and book.holders() == {"a"}


# -- every order of three overlapping jobs -------------------------------------
# A 4-CPU machine; the jobs hold CPUs 1, 2 and 3. Housekeeping "0" (auto, or a list): every job
# wants its IRQs on CPU 0. "none": each wants every CPU but its own.
JOBS = {"a": (1,), "b": (2,), "c": (3,)}
START = {24: "0-3", 25: "1", 26: "2-3", 27: "0", 28: "1-2"}


def orders():
    """Every interleaving of the three jobs' begins and ends (each begins before it ends)."""
    events = [(kind, job) for job in JOBS for kind in ("begin", "end")]
    seen = set()
    for order in itertools.permutations(events):
        if order in seen:
            continue
        seen.add(order)
        if all(order.index(("begin", j)) < order.index(("end", j)) for j in JOBS):
            yield order


ORDERS = list(orders())


def wants(book, files, job, housekeeping):
    """What the job's start asks for, as quiet.begin plans it (irqsteer.plan over the ledger's originals)."""
    current = {irq: files[IRQ(irq)] for irq in START}
    originals = {irq: o for irq in START if (o := book.original(IRQ(irq))) is not None}
    out = {w.path: w.new for w in irqsteer.plan(current, JOBS[job], housekeeping, originals)}
    out[TURBO] = "1"
    return out


def busy(running):
    return set().union(*(JOBS[j] for j in running))


def check_while_running(files, running):
    """CPU 0 is never a job's, so no IRQ may sit on a running job's CPU; turbo is off while any runs."""
    for irq in START:
        assert not set(parse_cpulist(files[IRQ(irq)])) & busy(running), (irq, files[IRQ(irq)], running)
    assert files[TURBO] == ("1" if running else "0")


@pytest.mark.parametrize("housekeeping", [(0,), (0, 1, 2, 3)], ids=["housekeeping 0", "housekeeping none"])
@pytest.mark.parametrize("crash", [False, True], ids=["", "a daemon dies mid-write"])
def test_every_order_of_three_overlapping_jobs_ends_with_the_original_values(housekeeping, crash):
    assert len(ORDERS) == 90
    original = {**{IRQ(i): v for i, v in START.items()}, TURBO: "0"}
    for order in ORDERS:
        book, files, running = Ledger(), dict(original), []
        for kind, job in order:
            if kind == "begin":
                book, _ = begin(book, files, job, wants(book, files, job, housekeeping), avoid=busy(running))
                running.append(job)
                check_while_running(files, running)
                continue
            running.remove(job)
            if crash:
                # The daemon persists the end's plan, writes half of it and dies; the next daemon
                # sees the job end again (its quiet file is still there) and finishes the rest.
                ended = book.end({job}, {p: files.get(p) for p in book.entries}, busy(running))
                book = reload(book)
                apply(files, ended.writes[: len(ended.writes) // 2])
            book, _ = end(book, files, job, avoid=busy(running))
            check_while_running(files, running)
        assert files == original, order
        assert book.entries == {}, order


def test_the_reviews_chain_a_b_c_with_housekeeping_none():
    """G7's part 2: two CPUs, A on 0, then B on 1 beside it, A ends, C on 0 beside B, B ends, C ends."""
    book, files = Ledger(), {IRQ(i): "0-1" for i in (24, 25, 26, 27)}
    every = (0, 1)

    def start(job, cpu):
        nonlocal book
        current = {i: files[IRQ(i)] for i in (24, 25, 26, 27)}
        originals = {i: o for i in current if (o := book.original(IRQ(i))) is not None}
        book, _ = begin(book, files, job, {w.path: w.new for w in irqsteer.plan(current, (cpu,), every, originals)})

    start("A", 0)
    assert files[IRQ(24)] == "1"
    start("B", 1)
    assert files[IRQ(24)] == "1"     # nowhere suits both: as A had it
    book, _ = end(book, files, "A")
    assert files[IRQ(24)] == "0"     # off B's CPU now
    start("C", 0)
    book, _ = end(book, files, "B")
    assert files[IRQ(24)] == "1"     # off C's CPU
    book, _ = end(book, files, "C")
    assert set(files.values()) == {"0-1"} and book.entries == {}


def test_a_start_that_died_mid_write_is_undone_by_its_end():
    """The daemon persisted a start's plan, wrote half and died: the job never ran; its end (as the
    next daemon queues it again) puts back what was written, and nothing else."""
    book, files = Ledger(), dict(ORIG)
    book, _ = begin(book, files, "a", {IRQ(25): "0"})
    writes = book.begin("b", {IRQ(24): ("cpulist", "0"), IRQ(25): ("cpulist", "0")},
                        {IRQ(24): files[IRQ(24)], IRQ(25): files[IRQ(25)]})
    book = reload(book)
    apply(files, writes[:1])
    assert files[IRQ(24)] == "0"
    book, _ = end(book, files, "b")
    assert files == {**ORIG, IRQ(25): "0"}
    book, _ = end(book, files, "a")
    assert files == ORIG and book.entries == {}


@pytest.mark.parametrize("values", [["0-3"], ["1", "2"], ["1-3", "0,2", "2"]])
def test_cpulists_are_compared_as_sets(values):
    book, files = Ledger(), {IRQ(24): "0-3"}
    for n, v in enumerate(values):
        book, _ = begin(book, files, str(n), {IRQ(24): v})
    common = set.intersection(*(set(parse_cpulist(v)) for v in values))
    assert set(parse_cpulist(files[IRQ(24)])) == (common or set(parse_cpulist(values[0])))
    files[IRQ(24)] = format_cpulist(sorted(set(parse_cpulist(files[IRQ(24)]))))   # another spelling: still ours
    for n in range(len(values)):
        book, _ = end(book, files, str(n))
    assert files == {IRQ(24): "0-3"}

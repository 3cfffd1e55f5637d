"""undelivered/: the pure policy (which files go, and why) and the sweeping directory."""

import logging
import os

from hpc_batch.daemon.undelivered import SWEEP_EVERY, Bounds, Entry, Held, Undelivered, owner_of, to_drop

T0 = 1_800_000_000.0
DAY = 86400.0
M = 1 << 20


def e(name, size, age_days, owner):
    return Entry(name, size, T0 - age_days * DAY, owner)


def names(dropped):
    return [(x.name, why.split()[0]) for x, why in dropped]


def test_owner_comes_from_the_name():
    assert owner_of("output.12.alice.log") == "alice"
    assert owner_of("output.12.a.b.log") == "a.b"
    assert owner_of("output.12.log") == ""           # an earlier version's name
    assert owner_of("notes.txt") == "" and owner_of("output.x.alice.log") == ""


def test_nothing_goes_within_the_bounds():
    b = Bounds(max_total=10 * M, per_user=5 * M, max_age=30 * DAY)
    assert to_drop([e("a", M, 1, "alice"), e("b", M, 29, "bob")], T0, b) == []
    assert to_drop([], T0, b) == []


def test_too_old_goes_whoever_it_is():
    b = Bounds(max_total=10 * M, per_user=5 * M, max_age=30 * DAY)
    dropped = to_drop([e("old", 1, 31, "bob"), e("new", 1, 1, "bob")], T0, b)
    assert names(dropped) == [("old", "older")]


def test_a_users_oldest_go_past_their_share_and_others_are_untouched():
    b = Bounds(max_total=100 * M, per_user=5 * M, max_age=30 * DAY)
    entries = [e("bob1", 2 * M, 5, "bob")] + [e(f"al{i}", 2 * M, 4 - i * 0.1, "alice") for i in range(6)]
    dropped = to_drop(entries, T0, b)
    assert [x.name for x, _ in dropped] == ["al0", "al1", "al2", "al3"]   # 12 MiB -> 4 MiB, oldest first
    assert all("alice's files past --undelivered-per-user" in why for _, why in dropped)


def test_a_file_larger_than_the_share_goes_at_once():
    b = Bounds(max_total=100 * M, per_user=5 * M, max_age=30 * DAY)
    assert names(to_drop([e("big", 6 * M, 0, "alice")], T0, b)) == [("big", "alice's")]


def test_past_the_total_among_equal_holders_the_oldest_goes_first():
    b = Bounds(max_total=5 * M, per_user=4 * M, max_age=30 * DAY)
    entries = [e("a", 2 * M, 3, "alice"), e("b", 2 * M, 2, "bob"), e("c", 2 * M, 1, "carol")]
    assert names(to_drop(entries, T0, b)) == [("a", "all")]


def test_past_the_total_the_biggest_holder_goes_first_never_a_smaller_one():
    # G2's principle for bytes: bob's one old file stays while alice, who holds the most, is over.
    b = Bounds(max_total=6 * M, per_user=8 * M, max_age=30 * DAY)
    entries = [e("bob", 3 * M, 9, "bob")] + [e(f"al{i}", 2 * M, 5 - i, "alice") for i in range(3)]
    dropped = to_drop(entries, T0, b)
    assert [x.name for x, _ in dropped] == ["al0", "al1"]      # 9 MiB -> 5 MiB, alice's oldest first
    assert all("its owner holds the most bytes" in why for _, why in dropped)


def test_many_empty_files_of_one_user_never_push_out_anothers_output():
    # G2: 10,000 empty files of alice's made the sweep drop bob's only copy of his output.
    b = Bounds(max_total=1 << 40, per_user=1 << 40, max_age=30 * DAY, max_files=100)
    entries = [e("bob", 3 * M, 20, "bob")] + [e(f"al{i:03}", 0, 10 - i / 1000, "alice") for i in range(100)]
    dropped = to_drop(entries, T0, b)
    assert "bob" not in [x.name for x, _ in dropped]
    assert [x.name for x, _ in dropped] == [f"al{i:03}" for i in range(11)]   # 101 -> 90, alice's oldest
    assert all("its owner holds the most of them" in why for _, why in dropped)


def test_past_the_file_count_a_tenth_more_goes():
    b = Bounds(max_total=1 << 40, per_user=1 << 40, max_age=30 * DAY, max_files=100)
    entries = [e(f"f{i:03}", 1, 10 - i / 1000, f"u{i}") for i in range(101)]
    dropped = to_drop(entries, T0, b)
    assert [x.name for x, _ in dropped] == [f"f{i:03}" for i in range(11)]   # 101 -> 90
    assert all("more than 100 files" in why for _, why in dropped)


def test_keep_moves_in_sweeps_when_a_bound_is_crossed_and_logs_each_drop(tmp_path, caplog):
    u = Undelivered(str(tmp_path), Bounds(max_total=10 * M, per_user=3 * M, max_age=30 * DAY))
    bufs = tmp_path / "bufs"
    bufs.mkdir()

    def buffer(job_id, size):
        p = bufs / f"{job_id}"
        p.write_bytes(b"x" * size)
        return str(p)

    with caplog.at_level(logging.INFO, "hpc-batchd"):
        u.keep(1, "bob", buffer(1, M), T0)
        for i in range(2, 6):
            u.keep(i, "alice", buffer(i, M), T0 + i)
    d = tmp_path / "undelivered"
    assert sorted(os.listdir(d)) == ["output.1.bob.log", "output.3.alice.log", "output.4.alice.log",
                                     "output.5.alice.log"]
    assert f"dropped {d / 'output.2.alice.log'} ({M} bytes" in caplog.text
    assert "alice's files past --undelivered-per-user" in caplog.text
    assert oct(os.stat(d).st_mode & 0o777) == "0o700"
    # A buffer already gone (never written) is no error.
    u.keep(9, "bob", str(bufs / "missing"), T0 + 9)


def test_the_tick_sweeps_at_start_then_every_few_minutes(tmp_path, caplog):
    d = tmp_path / "undelivered"
    d.mkdir()
    old = d / "output.7.log"                # an earlier version's name, kept long ago
    old.write_bytes(b"x")
    os.utime(old, (T0 - 40 * DAY, T0 - 40 * DAY))
    (d / "sub").mkdir()                      # not a plain file: left alone
    u = Undelivered(str(tmp_path), Bounds(max_total=10 * M, per_user=3 * M, max_age=30 * DAY))
    with caplog.at_level(logging.WARNING, "hpc-batchd"):
        assert u.tick(T0) == T0 + SWEEP_EVERY
    assert sorted(os.listdir(d)) == ["sub"] and "older than --undelivered-max-age" in caplog.text
    assert u.tick(T0 + 1) == T0 + SWEEP_EVERY                  # not due: nothing looked at
    assert u.tick(T0 - 10 * SWEEP_EVERY) == T0 - 9 * SWEEP_EVERY  # the clock went back: no stall
    # No directory at all (nothing ever undelivered): fine.
    assert Undelivered(str(tmp_path / "none"), u.bounds).tick(T0) == T0 + SWEEP_EVERY


def test_taking_files_in_never_sweeps_the_directory_again(tmp_path, monkeypatch):
    """G1: each file moved in past a bound costs what it makes go, not a pass over 9,000 others."""
    d = tmp_path / "undelivered"
    d.mkdir()
    for i in range(200):                                   # a busy machine's directory
        (d / f"output.{1000 + i}.carol.log").write_bytes(b"")
        os.utime(d / f"output.{1000 + i}.carol.log", (T0, T0))
    u = Undelivered(str(tmp_path), Bounds(max_total=100 * M, per_user=2 * M, max_age=30 * DAY))
    u.tick(T0)                                             # start-up: the one pass that builds the index
    passes = []
    real = os.scandir
    monkeypatch.setattr(os, "scandir", lambda p: passes.append(p) or real(p))
    bufs = tmp_path / "bufs"
    bufs.mkdir()
    for i in range(1, 11):
        p = bufs / str(i)
        p.write_bytes(b"x" * M)
        u.keep(i, "alice", str(p), T0 + i)
    assert passes == []
    assert sorted(n for n in os.listdir(d) if ".alice." in n) == ["output.10.alice.log", "output.9.alice.log"]
    assert u.held.owned["alice"] == 2 * M and u.held.count == 202


def test_the_index_agrees_with_a_fresh_sweep_whatever_comes_in():
    """Held.trim, file by file, leaves what to_drop leaves of all of them at once (age aside)."""
    b = Bounds(max_total=10, per_user=6, max_age=DAY, max_files=8)
    users = ["alice", "bob", "carol"]
    entries = [Entry(f"f{i:02}", (i * 7) % 4, T0 + i, users[(i * 5) % 3]) for i in range(30)]
    held = Held([])
    for x in entries:
        held.add(x)
        held.trim(x.owner, b)
    left = [x for q in held.files.values() for x in q]
    fresh = {x.name for x, _ in to_drop(left, T0 + 30, b)}
    assert not fresh, f"the index kept what the bounds drop: {sorted(fresh)}"
    assert held.total <= b.max_total and held.count <= b.max_files
    assert all(n <= b.per_user for n in held.owned.values())


def test_a_buffer_kept_in_its_job_directory_counts_from_the_jobs_end(tmp_path):
    """G1: failed deliveries of jobs still remembered count against their owner's share; past it
    the oldest goes from its job's directory, and the engine is told which job's it was."""
    u = Undelivered(str(tmp_path), Bounds(max_total=100 * M, per_user=2 * M, max_age=30 * DAY))
    jobs = tmp_path / "jobs"
    bufs = {}
    for i in range(1, 4):
        (jobs / str(i)).mkdir(parents=True)
        bufs[i] = jobs / str(i) / "output"
        bufs[i].write_bytes(b"x" * M)
        u.hold(i, "alice", str(bufs[i]), T0 + i)
    assert not bufs[1].exists() and bufs[2].exists() and bufs[3].exists()
    [(job, why)] = u.take_dropped()
    assert job == 1 and "alice's files past --undelivered-per-user" in why
    assert u.take_dropped() == []
    u.tick(T0 + 10)                          # a sweep keeps counting them
    assert u.held.owned["alice"] == 2 * M and bufs[2].exists()
    # Evicted: it moves in, counted once, its age from the job's end.
    where = u.keep(2, "alice", str(bufs[2]), T0 + 20)
    assert where == u.path(2, "alice") and os.path.getmtime(where) == T0 + 2
    assert u.held.owned["alice"] == 2 * M and u.held.count == 2

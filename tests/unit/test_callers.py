"""access.Callers: a connection's user, remembered for a while instead of looked up on the loop each time."""

import os

import pytest

from hpc_batch.daemon import access


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def world(tmp_path, monkeypatch):
    """Callers over two stand-in user files, counting the lookups it makes."""
    files = (str(tmp_path / "passwd"), str(tmp_path / "group"))
    for path in files:
        with open(path, "w") as f:
            f.write("root:x:0:\n")
    looked = []

    def lookup(uid, gid, pid, admin_gid):
        looked.append((uid, gid))
        return access.Caller(uid=uid, gid=gid, pid=pid, name=f"u{uid}", is_admin=gid == admin_gid)
    monkeypatch.setattr(access, "make_caller", lookup)
    clock = Clock()
    return access.Callers(50, clock=clock, files=files), clock, files, looked


# (what happens between two connections of uid 1000, whether the second looks the user up again)
CASES = [
    ("nothing", lambda clock, files: None, False),
    ("a while, within the time it is kept", lambda clock, files: setattr(clock, "now", clock.now + 29), False),
    ("longer than that", lambda clock, files: setattr(clock, "now", clock.now + access.CALLER_FRESH), True),
    ("a change to the group file", lambda clock, files: _append(files[1], "admins:x:50:u1000\n"), True),
    ("a change to the passwd file", lambda clock, files: _append(files[0], "u1000:x:1000:1000::/:/bin/sh\n"), True),
    ("the group file replaced", lambda clock, files: _replace(files[1]), True),
]


def _append(path, text):
    with open(path, "a") as f:
        f.write(text)


def _replace(path):
    os.rename(path, path + ".old")
    with open(path, "w") as f:
        f.write("root:x:0:\n")


@pytest.mark.parametrize("between, again", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_user_is_looked_up_again_only_when_it_may_have_changed(world, between, again):
    callers, clock, files, looked = world
    first = callers.caller(1000, 1000, pid=11)
    between(clock, files)
    second = callers.caller(1000, 1000, pid=12)
    assert looked == [(1000, 1000)] * (2 if again else 1)
    assert (second.name, second.is_admin, second.pid, second.uid) == (first.name, first.is_admin, 12, 1000)


def test_each_user_and_group_has_its_own_answer(world):
    callers, clock, files, looked = world
    assert not callers.caller(1000, 1000, pid=1).is_admin
    assert callers.caller(1000, 50, pid=2).is_admin      # the same user, with the admin group as its gid
    assert not callers.caller(1000, 1000, pid=3).is_admin
    assert looked == [(1000, 1000), (1000, 50)]


def test_what_it_remembers_is_bounded(world, monkeypatch):
    callers, clock, files, looked = world
    monkeypatch.setattr(access, "CALLERS_KEPT", 3)
    for uid in range(1, 8):
        callers.caller(uid, uid, pid=uid)
    assert len(callers._known) <= 3


def test_the_real_lookup_names_root_and_makes_it_admin():
    caller = access.Callers(None).caller(0, 0, pid=os.getpid())
    assert (caller.name, caller.is_admin) == ("root", True)

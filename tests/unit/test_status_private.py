"""engine.status with --list-is-public off: the head of the queue is another user's by id only (F6)."""

from test_engine import ALICE, ROOT, start_pending, submit, world  # noqa: F401  (world is a fixture)

from hpc_batch.daemon.access import Caller

BOB = Caller(uid=4343, gid=4343, pid=4, name="bob", is_admin=False)


def test_the_head_is_named_to_its_owner_and_admins_only(world):  # noqa: F811
    eng, _, _, _ = world
    submit(eng, cpus=2)                                   # takes the machine
    start_pending(eng)
    head = submit(eng, cpus=2, name="secret-project-x")["id"]
    eng.jobs[head].uid = ALICE.uid                         # alice's, queued behind it
    full = eng.status(0.0, ROOT)["head"]
    assert full["id"] == head and full["name"] == "secret-project-x" and full["why"]
    assert eng.status(0.0, ALICE)["head"] == full
    assert eng.status(0.0, BOB)["head"] == {"id": head, "user": None, "name": None, "why": None}
    eng.cfg.list_is_public = True                          # everyone may list every job anyway
    assert eng.status(0.0, BOB)["head"] == full


def test_the_map_names_a_running_job_to_its_owner_and_admins_only(world):  # noqa: F811
    eng, _, _, _ = world
    job = submit(eng, cpus=2)["id"]
    start_pending(eng)
    eng.jobs[job].uid = ALICE.uid                          # alice's, running
    user = eng.jobs[job].user
    cpus = eng.table.running[job].alloc.cpus
    seen = eng.status(0.0, ALICE)["map"]["jobs"]
    assert seen == eng.status(0.0, ROOT)["map"]["jobs"]
    assert [(j["id"], j["user"], j["cpus"]) for j in seen] == [(job, user, list(cpus))]
    hidden = eng.status(0.0, BOB)["map"]["jobs"]
    assert [(j["id"], j["user"], j["cpus"]) for j in hidden] == [(None, None, list(cpus))]
    eng.cfg.list_is_public = True
    assert eng.status(0.0, BOB)["map"]["jobs"] == seen

"""Row (5b) of bench/run in a guest with 20 CPUs: 20 silent shepherds' PSS against the floor's 20.

Under ``--no-cgroups`` each job takes a whole CPU, so a 2-CPU host cannot run
the row's 20 jobs at once and leaves it n/a. This module boots a guest of its
own (two NUMA nodes of 10 CPUs; TCG is slow, but a silent shepherd only
sleeps), installs the wheel, copies this checkout's bench/ beside its
hpc_batch/ and shepherd/ (bench/run checks that the venv holds the same
code) and runs ``bench/run --only many`` there. Like test_bench_guest it
asserts only that the figure was measured and is well formed: the size is
judged by bench/run's table, never by a test. The row is printed; with
``$HPC_BATCH_VM_MANY_REPORT`` set the guest's JSON report is copied there.
"""

import json
import os
import shutil
import sys

import pytest
from conftest import install_project
from harness import Guest

pytestmark = [pytest.mark.system, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from benchkit.rows import MANY_SHEPHERDS  # noqa: E402

SHAPE = {"nodes": 2, "cpus_per_node": MANY_SHEPHERDS // 2, "mem_per_node_mb": 2048}
CHECKOUT = "/root/hpcb-many"
VENV = "/opt/hpc-batch"


@pytest.fixture(scope="module")
def many_guest(guest_image, project_wheel, request, tmp_path_factory):
    """A guest of this module's own with MANY_SHEPHERDS CPUs, the project installed (by hand: quicker under
    TCG; the installer is tested on the first guest); powered off at the end."""
    g = Guest(guest_image, str(tmp_path_factory.mktemp("vm-many")), boot_timeout=900, lifetime=3600,
              log=lambda msg: sys.stderr.write("[many vm] %s\n" % msg), **SHAPE)
    try:
        g.start()
        install_project(g, project_wheel, str(request.config.rootpath), by_hand=True)
        yield g
    finally:
        g.close()


@pytest.mark.timeout(1200, func_only=True)
def test_row_5b_in_a_guest_with_20_cpus(many_guest):
    g = many_guest
    assert g.run("nproc", timeout=60).out.strip() == str(MANY_SHEPHERDS)
    share = os.path.join(g.share_dir, "many")
    shutil.rmtree(share, ignore_errors=True)
    for part in ("bench", "hpc_batch", "shepherd"):
        shutil.copytree(os.path.join(ROOT, part), os.path.join(share, part),
                        ignore=shutil.ignore_patterns("__pycache__"))
    r = g.run(f"rm -rf {CHECKOUT} && cp -r /mnt/host/many {CHECKOUT} && PYTHONDONTWRITEBYTECODE=1 "
              f"{VENV}/bin/python {CHECKOUT}/bench/run --venv {VENV} --no-install --only many --scratch /root "
              f"--output /root/many.md --json /root/many.json", timeout=1000)
    assert r.ok, r.describe()
    report = json.loads(g.read_bytes("/root/many.json"))
    figures = {f["key"]: f for f in report["figures"]}
    fig = figures["shepherd_pss_many"]
    assert fig["value"] is not None, fig["missing"]
    for side in ("value", "baseline"):
        v = fig[side]
        assert v["n"] >= MANY_SHEPHERDS and 0 < v["min"] <= v["median"] <= v["max"] < 64 << 20, (side, v)
    notes = [n for n in report.get("notes", []) if "checkout" in n]
    assert notes and "WARNING" not in notes[0], notes
    text = g.read_bytes("/root/many.md").decode()
    print("\n" + "\n".join(line for line in text.splitlines() if "(5b)" in line or "20 silent" in line))
    out = os.environ.get("HPC_BATCH_VM_MANY_REPORT")
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)

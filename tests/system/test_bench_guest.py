"""bench/run inside the guest: row (12) of docs/benchmarks.md, cgroups on against ``--no-cgroups``.

The test ships bench/ and a static probe built here into the guest, runs
``bench/run --in-guest`` there against the installed service (cgroups on)
and a scratch ``--no-cgroups`` twin, and prints the figures. It asserts
only that every figure was measured and is well formed: speed is judged by
bench/run's table, never by a test. With ``$HPC_BATCH_VM_BENCH_REPORT`` set
the JSON is also written there, for ``bench/run --vm-json PATH``;
``$HPC_BATCH_VM_BENCH_RUNS`` sets the samples per daemon (default 5).
"""

import json
import os
import shutil
import sys

import pytest

pytestmark = [pytest.mark.system, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from benchkit import probe, report, rows, vm  # noqa: E402
from benchkit.context import FULL  # noqa: E402

RUNS = int(os.environ.get("HPC_BATCH_VM_BENCH_RUNS", "5"))
GUEST_DIR = "/root/hpcb-bench"
VENV = "/opt/hpc-batch"


@pytest.mark.timeout(300 + 120 * RUNS, func_only=True)
def test_row_12_in_the_guest(guest, installed, tmp_path, request):
    assert guest.run("systemctl is-active hpc-batch", timeout=60).out.strip() == "active", \
        guest.unit_report("hpc-batch")
    exe, what = probe.build(str(tmp_path))
    assert "static" in what and len(exe) == 1, f"no static probe could be built here: {what}"
    share = os.path.join(guest.share_dir, "bench")
    shutil.rmtree(share, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "bench"), share, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(exe[0], os.path.join(guest.share_dir, "stamp"))
    r = guest.run(f"rm -rf {GUEST_DIR} && cp -r /mnt/host/bench {GUEST_DIR} && cp /mnt/host/stamp /root/stamp "
                  f"&& chmod 755 /root/stamp && PYTHONDONTWRITEBYTECODE=1 {VENV}/bin/python {GUEST_DIR}/run "
                  f"--venv {VENV} --in-guest /root/vm.json --runs {RUNS} --probe /root/stamp",
                  timeout=240 + 120 * RUNS)
    assert r.ok, r.describe() + "\n" + guest.unit_report("hpc-batch")
    data = json.loads(guest.read_bytes("/root/vm.json"))

    got = vm.load_data(data)
    assert "--no-cgroups" in got["daemons"]["no_cgroups"].split(), got["daemons"]
    assert "--no-cgroups" not in got["daemons"]["cgroups"], got["daemons"]
    for row in ("new", "latency"):
        for kind in vm.KINDS:
            samples = got[row][kind]
            assert len(samples) == RUNS and all(0 < s < 600 for s in samples), (row, kind, samples)
    # The cgroup daemon really made job cgroups (and the twin never did).
    assert guest.run("test -d /sys/fs/cgroup/hpc-batch", timeout=30).ok

    figs = {f.key: f for f in rows.table(FULL)}
    vm.fill(figs["vm"], got)
    line = report.table_rows([figs["vm"]])[0]
    assert not line[1].startswith("n/a") and line[3].endswith("x"), line
    out = os.environ.get("HPC_BATCH_VM_BENCH_REPORT")
    if out:
        with open(out, "w") as f:
            json.dump(got, f, indent=1)
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    text = ["", "row (12) in the guest: " + " | ".join(line[1:4]), *figs["vm"].details,
            f"(JSON{' in ' + out if out else ''}; bench/run --vm-json PATH puts it in the table)"]
    for t in text:
        (tr.write_line if tr else print)(t)

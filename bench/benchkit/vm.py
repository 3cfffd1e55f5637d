"""Row vm: rows (1) and (2) inside the system tier's guest, with cgroups on and with ``--no-cgroups``.

Two halves, joined by a JSON report:

* ``bench/run --in-guest OUT.json`` runs *in* the guest (Debian, systemd,
  cgroup v2, the installed wheel in /opt/hpc-batch; tests/system drives it,
  see tests/system/test_bench_guest.py). It times ``dispatch new -- true``
  and submit to the probe's first instruction against two daemons in
  turn: the installed service (cgroups on, as deployed) and a scratch
  ``--no-cgroups`` daemon with the service's other flags, which goes first
  alternates. The guest runs under TCG, so only the ratio means anything.
* ``bench/run --vm-json OUT.json`` (on the host) puts those figures in row
  (12) of its table: :func:`fill`.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
from typing import Any

from hpc_batch import __version__, defaults

from . import probe
from .client import submit_to_stamp
from .report import Figure
from .scratchd import ScratchDaemon
from .stats import summarize

KIND = "hpc-batch bench/run --in-guest"
SERVICE = "hpc-batch"
POLL = 0.01          # idle polls every 10 ms: under TCG a 2 ms loop would eat a vCPU of the guest's 4
KINDS = ("cgroups", "no_cgroups")
BASELINE = "`--no-cgroups` in the VM"


class _GuestDaemon(ScratchDaemon):
    """A scratch daemon polled gently (see POLL)."""

    def wait_idle(self, timeout: float = 600.0, poll: float = POLL) -> float:
        return super().wait_idle(timeout, poll)


class ServiceDaemon(_GuestDaemon):
    """The installed service on its own socket, driven like a scratch daemon; never started or stopped
    here (its jobs' logs go to *directory*/work)."""

    def __init__(self, directory: str):
        super().__init__(directory)
        self.sock = defaults.SOCKET
        self.env[defaults.SOCKET_ENV] = self.sock

    def start(self, timeout: float = 120.0) -> ServiceDaemon:
        self.wait_serving(lambda reply: True, timeout, poll=POLL)
        return self

    def stop(self) -> None:
        pass  # the service is the guest's, as installed


def service_flags() -> list[str]:
    """The service's hpc-batchd flags (from systemd), less ``--admin-group`` (a scratch daemon picks its own)."""
    out = subprocess.run(["systemctl", "show", "-p", "ExecStart", "--value", SERVICE], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    start = out.find("argv[]=")
    if start < 0:
        raise RuntimeError(f"cannot read the {SERVICE} unit's command line from {out.strip()!r}")
    argv = shlex.split(out[start + len("argv[]="):].split(" ;", 1)[0])[1:]
    flags: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word == "--admin-group":
            skip = True
        elif not word.startswith("--admin-group="):
            flags.append(word)
    return flags


def twin_args(flags: list[str]) -> tuple[str, ...]:
    """The scratch twin's flags: the service's, with the reserves it has by default made explicit (a
    scratch daemon otherwise reserves nothing), and ``--no-cgroups`` (ScratchDaemon adds it)."""
    extra = []
    if not any(f.startswith("--reserve-cpu") for f in flags):
        extra += ["--reserve-cpu", str(defaults.RESERVE_CPU)]
    if not any(f.startswith("--reserve-mem") for f in flags):
        extra += ["--reserve-mem", str(defaults.RESERVE_MEM_GB)]
    return (*flags, *extra)


def _guest_facts() -> dict[str, str]:
    virt = subprocess.run(["systemd-detect-virt"], capture_output=True, text=True, timeout=30).stdout.strip()
    with open("/proc/self/cgroup") as f:
        own = f.read().strip()
    return {"kernel": f"{platform.system()} {platform.release()}", "cpus": str(os.cpu_count()),
            "virtualization": virt or "none", "hpc-batch": __version__, "bench cgroup": own,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def run_in_guest(scratch: str, runs: int, out_path: str, probe_path: str | None, say: Any) -> None:
    """Measure both daemons, alternating, and write the JSON report to *out_path*."""
    if probe_path:
        argv, what = [probe_path], "the static C probe built on the host (clock_gettime first thing)"
    else:
        argv, what = probe.build(scratch)
    flags = service_flags()
    daemons = {"cgroups": ServiceDaemon(os.path.join(scratch, "cgroups")).start(),
               "no_cgroups": _GuestDaemon(os.path.join(scratch, "nocg"), None, twin_args(flags)).start()}
    try:
        for d in daemons.values():  # both warm: the first start in a fresh guest reads from its disk
            d.timed("new", "--", "true")
            d.wait_idle()
            submit_to_stamp(d, argv, "stamp.warm.log")
        new: dict[str, list[float]] = {k: [] for k in KINDS}
        lat: dict[str, list[float]] = {k: [] for k in KINDS}
        for i in range(runs):
            for kind in (KINDS if i % 2 == 0 else KINDS[::-1]):
                d = daemons[kind]
                new[kind].append(d.timed("new", "--", "true"))
                d.wait_idle()
                lat[kind].append(submit_to_stamp(d, argv, f"stamp.{i}.log"))
            say(f"run {i + 1}/{runs}: new {new['cgroups'][-1] * 1e3:.0f}/{new['no_cgroups'][-1] * 1e3:.0f} ms, "
                f"first instruction {lat['cgroups'][-1] * 1e3:.0f}/{lat['no_cgroups'][-1] * 1e3:.0f} ms "
                "(cgroups/--no-cgroups)")
        report = {"kind": KIND, "runs": runs, "probe": what, "guest": _guest_facts(),
                  "daemons": {"cgroups": f"the {SERVICE} service: hpc-batchd {' '.join(flags)}".strip(),
                              "no_cgroups": " ".join(daemons["no_cgroups"].argv()[1:])},
                  "new": new, "latency": lat}
    finally:
        daemons["no_cgroups"].stop()
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


def load(path: str) -> dict[str, Any]:
    """A report :func:`run_in_guest` wrote; ValueError when it is not one."""
    with open(path) as f:
        return load_data(json.load(f))


def load_data(r: Any) -> dict[str, Any]:
    """*r* if it is a report :func:`run_in_guest` wrote; ValueError when it is not one."""
    if not isinstance(r, dict) or r.get("kind") != KIND:
        raise ValueError(f"not a report of {KIND}")
    for row in ("new", "latency"):
        for kind in KINDS:
            if not r[row][kind]:
                raise ValueError(f"no {row} samples for {kind}")
    return r


def fill(fig: Figure, r: dict[str, Any]) -> None:
    """Row vm from report *r*: submit to first instruction with cgroups against ``--no-cgroups``; the
    `dispatch new` figures of the same run, judged the same way, in its note."""
    fig.value, fig.baseline = summarize(r["latency"]["cgroups"], "ms"), summarize(r["latency"]["no_cgroups"], "ms")
    fig.baseline_label, fig.missing, fig.baseline_missing = BASELINE, None, None
    new_cg, new_no = summarize(r["new"]["cgroups"], "ms"), summarize(r["new"]["no_cgroups"], "ms")
    ratio = new_cg.median / new_no.median
    bound = fig.target.bound if fig.target else 1.5
    g = r["guest"]
    fig.details += [
        f"`dispatch new -- true` in the same run: {new_cg.text()} with cgroups, {new_no.text()} with "
        f"`--no-cgroups`: {ratio:.2f}x ({'within' if ratio <= bound else 'NOT within'} {bound:g}x).",
        f"This run: {r['runs']} samples of each, {g['virtualization']} guest with {g['cpus']} CPUs, "
        f"{g['kernel']}, hpc-batch {g['hpc-batch']}, {g['date']}; the probe: {r['probe']}. Daemons: "
        f"{r['daemons']['cgroups']}; twin: hpc-batchd {r['daemons']['no_cgroups']}.",
    ]

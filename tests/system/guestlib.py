"""Helpers for system tests that drive hpc-batch in the guest as real users."""

import re
import shlex
import time

GUEST_BIN = "/opt/bin"
DROPIN_DIR = "/etc/systemd/system/hpc-batch.service.d"


def wait_for(check, timeout, interval=1.0, what="condition"):
    """Poll *check* until it returns a truthy value; fail with *what* after *timeout*."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def dispatch(guest, user, *args, timeout=120, cwd="~"):
    """Run dispatch in the guest as *user* from *cwd* (a Result)."""
    cmd = f"cd {cwd} && {GUEST_BIN}/dispatch " + " ".join(shlex.quote(a) for a in args)
    return guest.run(cmd, user=user, timeout=timeout)


def submit(guest, user, *cmd, flags=(), cwd="~") -> int:
    """Submit a job as *user*; returns its id."""
    r = dispatch(guest, user, "new", *flags, "--", *cmd, cwd=cwd)
    assert r.ok, r.describe() + "\n" + guest.unit_report("hpc-batch")
    m = re.match(r"job (\d+) ", r.out)
    assert m, r.describe()
    return int(m.group(1))


def rows(guest, user, *flags) -> dict:
    """``dispatch list`` rows keyed by job id."""
    r = dispatch(guest, user, "list", *flags)
    assert r.ok, r.describe()
    out = {}
    for line in r.out.splitlines():
        words = line.split()
        if len(words) > 1 and words[1].isdigit():
            out[int(words[1])] = line
    return out


def state(guest, user, job) -> str:
    row = rows(guest, user, "--finished").get(job, "")
    return "finished" if " finished " in row else "queued" if " queued " in row else "running"


def wait_finished(guest, user, job, timeout=240) -> str:
    """The job's finished row, once it is."""
    def done():
        row = rows(guest, user, "--finished").get(job)
        return row if row and " finished " in row else None
    return wait_for(done, timeout, what=f"job {job} to finish")


def wait_running(guest, user, job, timeout=240) -> None:
    wait_for(lambda: state(guest, user, job) == "running" and
             guest.run(f"test -e /var/lib/hpc-batch/jobs/{job}/status.json", timeout=30).ok,
             timeout, what=f"job {job} to run")


def exit_of(row: str) -> str:
    words = row.split()
    return words[words.index("finished") + 1]


def home(guest, user) -> str:
    return guest.run(f"getent passwd {user} | cut -d: -f6", timeout=30, check=True).out.strip()


def read(guest, path, user=None) -> str:
    r = guest.run(["cat", path], user=user, timeout=60)
    assert r.ok, r.describe()
    return r.out


def main_pid(guest) -> int:
    return int(guest.run("systemctl show -p MainPID --value hpc-batch", timeout=30, check=True).out.strip())


def ready_count(guest) -> int:
    r = guest.run("journalctl -u hpc-batch -o cat --no-pager | grep -c 'ready on' || true", timeout=60)
    return int(r.out.strip() or 0)


def set_flags(guest, flags, how="reload", admin_group=None) -> None:
    """Override the daemon's flags with a drop-in, applied by reload or restart."""
    group = admin_group or guest.run(
        "systemctl show -p ExecStart --value hpc-batch | grep -o -- '--admin-group [^ ;]*' | cut -d' ' -f2",
        timeout=30).out.strip() or "adm"
    conf = ("[Service]\nExecStart=\nExecStart=%s/hpc-batchd --admin-group %s %s\n"
            % (GUEST_BIN, group, " ".join(flags)))
    guest.run(f"mkdir -p {DROPIN_DIR}", timeout=30, check=True)
    guest.put_bytes(conf, f"{DROPIN_DIR}/50-test-flags.conf", mode=0o644)
    apply(guest, how)


def clear_flags(guest, how="reload") -> None:
    guest.run(f"rm -f {DROPIN_DIR}/50-test-flags.conf", timeout=30, check=True)
    apply(guest, how)


def apply(guest, how) -> None:
    """daemon-reload, then reload or restart, and wait until the daemon answers again."""
    before = ready_count(guest)
    r = guest.run(f"systemctl daemon-reload && systemctl {how} hpc-batch", timeout=300)
    assert r.ok, r.describe() + "\n" + guest.unit_report("hpc-batch")
    wait_for(lambda: ready_count(guest) > before, 180, what=f"hpc-batch to be ready after {how}")


def expect_refusal(guest, dropin: str, content: str, *needles: str) -> None:
    """With *content* as drop-in *dropin*, the daemon refuses to start: exit 78, no restart loop,
    and a journal naming each of *needles*; the drop-in goes and the daemon comes back after."""
    conf = f"{DROPIN_DIR}/{dropin}"
    guest.put_bytes(content, conf, mode=0o644)
    try:
        guest.run("systemctl daemon-reload; systemctl restart hpc-batch", timeout=300)
        wait_for(lambda: guest.run("systemctl show -p ExecMainStatus --value hpc-batch",
                                   timeout=30).out.strip() == "78", 120, what="exit 78")
        time.sleep(5)   # the window a restart loop would need to show as NRestarts > 0
        show = guest.run("systemctl show -p NRestarts -p ActiveState --value hpc-batch", timeout=30).out.split()
        assert show[0] == "0" and show[1] in ("failed", "inactive"), show
        journal = guest.run("journalctl -u hpc-batch -o cat --no-pager | tail -5", timeout=60).out
        assert all(n in journal for n in needles), journal
    finally:
        guest.run(f"rm -f {conf}; systemctl daemon-reload; systemctl reset-failed hpc-batch; "
                  "systemctl start hpc-batch", timeout=300)
        wait_for(lambda: guest.run("systemctl is-active hpc-batch", timeout=30).out.strip() == "active",
                 120, what="hpc-batch active again")


def daemon_cmdline(guest) -> str:
    return guest.run(f"tr '\\0' ' ' < /proc/{main_pid(guest)}/cmdline", timeout=30, check=True).out


def job_cgroup(job) -> str:
    return f"/sys/fs/cgroup/hpc-batch/job-{job}"


# --- the daemon's flags and the guest's CPU topology (the SMT guest's tests) -----------------

def start_daemon(guest, *flags, how="restart") -> str:
    """Run the daemon with *flags* (a drop-in, as set_flags does), applied by *how* (restart or
    reload), and wait until it answers; returns its journal from then on (its start-up lines).

    Flags already in place with the daemon active are left as they are (no restart), and the
    journal of the last start is returned instead, so each test may ask for the flags it needs.
    """
    conf = f"{DROPIN_DIR}/50-test-flags.conf"
    wanted = " ".join(flags)
    current = guest.run(f"cat {conf} 2>/dev/null | sed -n 's/^ExecStart=.*--admin-group [^ ]* //p'",
                        timeout=30).out.strip()
    active = guest.run("systemctl is-active hpc-batch", timeout=30).out.strip() == "active"
    if current == wanted and active and how == "restart":
        return last_start_log(guest)
    cursor = guest.run("journalctl -u hpc-batch -n 1 -o cat --no-pager --show-cursor "
                       "| sed -n 's/^-- cursor: //p'", timeout=60).out.strip()
    set_flags(guest, flags, how=how)
    since = f"--after-cursor={shlex.quote(cursor)}" if cursor else ""
    return guest.run(f"journalctl -u hpc-batch -o cat --no-pager {since}", timeout=60, check=True).out


def last_start_log(guest) -> str:
    """The daemon's journal from its last start (or reload) on: from the last 'CPU topology:' line."""
    out = guest.run("journalctl -u hpc-batch -o cat --no-pager", timeout=60, check=True).out
    at = out.rfind("CPU topology:")
    return out[at:] if at >= 0 else out


def parse_cpulist(text) -> frozenset:
    """'0-3,8' (the kernel's list format) as a set of CPU numbers."""
    cpus = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cpus)


class CpuTopology:
    """The guest's CPUs as its sysfs says: threads of each core, packages, NUMA nodes, caches."""

    SCRIPT = r"""
cd /sys/devices/system/cpu || exit 1
for d in cpu[0-9]*; do
    [ -d "$d/topology" ] || continue
    printf 'cpu %s %s %s\n' "${d#cpu}" "$(cat $d/topology/thread_siblings_list)" \
        "$(cat $d/topology/physical_package_id)"
    for c in $d/cache/index*; do
        [ -d "$c" ] && printf 'cache %s %s %s %s\n' "${d#cpu}" "$(cat $c/level)" "$(cat $c/type)" \
            "$(cat $c/shared_cpu_list)"
    done
done
for n in /sys/devices/system/node/node[0-9]*; do printf 'node %s %s\n' "${n##*node}" "$(cat $n/cpulist)"; done
"""

    def __init__(self, guest):
        self.core_of = {}       # cpu -> frozenset of its core's threads (thread_siblings_list)
        self.package_of = {}    # cpu -> physical_package_id
        self.node_cpus = {}     # NUMA node -> frozenset of CPUs
        self.caches = set()     # (level, type, frozenset of CPUs sharing it)
        for line in guest.run(self.SCRIPT, timeout=60, check=True).out.splitlines():
            kind, *words = line.split()
            if kind == "cpu":
                cpu = int(words[0])
                self.core_of[cpu] = parse_cpulist(words[1])
                self.package_of[cpu] = int(words[2])
            elif kind == "cache":
                self.caches.add((int(words[1]), words[2], parse_cpulist(words[3])))
            elif kind == "node":
                self.node_cpus[int(words[0])] = parse_cpulist(words[1])
        self.cpus = sorted(self.core_of)
        self.cores = sorted(set(self.core_of.values()), key=min)
        self.node_of = {c: n for n, cpus in self.node_cpus.items() for c in cpus}

    def cores_of(self, cpus) -> set:
        """The cores (sibling sets) that any of *cpus* is a thread of."""
        return {self.core_of[c] for c in cpus}

    def node_cores(self, node) -> list:
        return [core for core in self.cores if core <= self.node_cpus[node]]

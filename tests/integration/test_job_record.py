"""The reproducibility record (issue 22) through the real daemon, shepherd and dispatch on this host.

Jobs run as real users (hpcb-alice, hpcb-bob). This host has no cpufreq and
no thermal throttle counters (a VM), so a record read from the machine
itself must never say `clean`; the verdicts `clean` and `noisy` are driven
through a fixture tree the daemon is pointed at (HPC_BATCH_PROBE_ROOT),
whose throttle counter this test raises while a job runs. The tree is
synthesised in the kernel's formats (see tests/fixtures/README.md,
"record/").
"""

import hashlib
import json
import os
import pwd
import shutil
import stat
import subprocess

import pytest
from conftest import USERS, exit_of, wait_for

pytestmark = pytest.mark.timeout(180)

ALICE, BOB = USERS["alice"], USERS["bob"]
VERDICTS = ("clean", "noisy", "unknown")
SECTIONS = ("collector", "kernel", "cpu", "frequency", "memory", "allocation", "machine", "gpu", "software",
            "sentinels", "verdict")


def _sub(d, *cmd, flags=(), user=ALICE, **kw):
    """Submit as *user* from their home directory (where the log goes)."""
    kw.setdefault("cwd", pwd.getpwnam(user).pw_dir)
    return d.submit(*cmd, flags=flags, user=user, **kw)


def _record(d, job, user=ALICE):
    return json.loads(d.ok("show", "--record", "--json", str(job), user=user))


def _partial(d, job, user=ALICE):
    """The running job's record once its shepherd has written the start sections, else None
    (until then show --record refuses: no record yet)."""
    r = d.dispatch("show", "--record", "--json", str(job), user=user)
    if r.returncode != 0:
        return None
    rec = json.loads(r.stdout)
    return rec if rec.get("software") else None


def _finished(d, job, user=ALICE):
    return d.wait_finished(job, user=user, timeout=60)


def _marker_job(d, marker, user=ALICE, flags=()):
    """A job that waits (bounded) until *marker* exists, so the test can act while it runs."""
    script = f"i=0; while [ ! -e {marker} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"
    return _sub(d, "sh", "-c", script, flags=flags, user=user)


def test_a_finished_job_has_a_complete_record_its_owner_can_read_and_nobody_else(daemon, users, scratch):
    d = daemon
    job = _sub(d, "sh", "-c", "echo hi")
    row = _finished(d, job)
    rec = _record(d, job)
    assert rec["schema"] == 1 and rec["job"] == job and rec["complete"] is True
    for section in SECTIONS:
        assert section in rec, (section, sorted(rec))
    assert rec["digest"].startswith("sha256:") and len(rec["digest"]) == 7 + 64
    # This host (no cpufreq, no throttle counters) can never be judged clean.
    assert rec["verdict"]["verdict"] in ("noisy", "unknown"), rec["verdict"]
    assert rec["verdict"]["verdict"] in row.split(), row               # list --finished: one word
    assert exit_of(row) == "0"
    # Software: what ran, the executable (read as the user) and the environment's digest, no values.
    sw = rec["software"]
    assert sw["argv"]["value"] == ["sh", "-c", "echo hi"]
    exe = sw["executable"]["value"]
    with open(exe["realpath"], "rb") as f:
        assert exe["sha256"] == hashlib.sha256(f.read()).hexdigest()
    assert "values" not in sw["environment"] and "PATH" in sw["environment"]["keys"]["value"]
    # Allocation as the daemon made it.
    shown = json.loads(d.ok("show", "--json", str(job), user=ALICE))
    assert rec["allocation"]["requested"]["cpus"] == shown["cpus"]
    # Each value names where it came from.
    assert rec["kernel"]["cmdline"]["source"] == "/proc/cmdline"
    # The file: root's, 0640, in the job's directory.
    path = os.path.join(d.state_dir, "jobs", str(job), "record.json")
    st = os.stat(path)
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o640
    # bob may not see alice's record: to him the job does not exist (the list is not public).
    r = d.dispatch("show", "--record", str(job), user=BOB)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    # For people: the verdict first.
    text = d.ok("show", "--record", str(job), user=ALICE)
    assert text.splitlines()[0].lower().startswith("verdict"), text[:300]
    # The history row carries the verdict, its causes and the digest.
    def row():
        rows = json.loads(d.ok("history", "--json", str(job), user=ALICE))["jobs"]
        return rows[0] if rows else None
    line = wait_for(row, what=f"job {job} in the history")
    assert line["verdict"] == rec["verdict"]["verdict"] and line["record_digest"] == rec["digest"]
    assert line["causes"] == rec["verdict"]["causes"][:5]


def test_a_queued_job_has_no_record_yet_and_a_running_one_has_a_partial_one(daemon, users, scratch):
    d = daemon
    marker = os.path.join(scratch, "go")
    first = _marker_job(d, marker, flags=("--exclusive",))
    d.wait_running(first, user=ALICE)
    queued = _sub(d, "true", flags=("--exclusive",))
    r = d.dispatch("show", "--record", str(queued), user=ALICE)
    assert r.returncode == 1 and "has not started" in r.stderr, r.stderr
    partial = wait_for(lambda: _partial(d, first), what="the partial record")
    assert partial["complete"] is False and "verdict" not in partial
    open(marker, "w").close()
    _finished(d, first)
    _finished(d, queued)
    assert _record(d, first)["complete"] is True


def test_new_record_writes_it_as_the_user_and_never_through_a_link(daemon, users, scratch):
    d = daemon
    home = os.path.join(scratch, "alice")
    os.makedirs(home)
    os.chown(home, users["alice"].pw_uid, users["alice"].pw_gid)
    dest = os.path.join(home, "run.record.json")
    job = _sub(d, "true", flags=("--record", dest), user=ALICE, cwd=home)
    _finished(d, job)
    wait_for(lambda: os.path.exists(dest), what="the record file")
    st = os.stat(dest)
    assert st.st_uid == users["alice"].pw_uid
    with open(dest) as f:
        assert json.load(f) == _record(d, job)
    # A directory: record.<id>.json in it, one a job of a bulk submit.
    out = d.ok("new", "--array", "1-2", "--record", home, "--", "true", user=ALICE, cwd=home)
    first = int(out.split()[1].split("-")[0])
    for job_id in (first, first + 1):
        _finished(d, job_id)
        wait_for(lambda j=job_id: os.path.exists(os.path.join(home, f"record.{j}.json")), what="bulk records")
    # A symbolic link is refused at submit, naming the flag.
    link = os.path.join(home, "link.json")
    os.symlink("/etc/passwd", link)
    r = d.dispatch("new", "--record", link, "--", "true", user=ALICE, cwd=home)
    assert r.returncode == 1 and "--record" in r.stderr and "symbolic link" in r.stderr, r.stderr
    # One planted after the submit is not followed either: the delivery fails and says so.
    late = os.path.join(home, "late.json")
    marker = os.path.join(scratch, "go")
    job = _marker_job(d, marker, flags=("--record", late))
    os.symlink("/etc/shadow", late)
    open(marker, "w").close()
    row = _finished(d, job)
    assert "record was not written" in row and "symbolic link" in row, row
    assert os.path.islink(late)


def test_record_diff_names_the_one_environment_key_that_differs(daemon, users, scratch):
    d = daemon
    a = _sub(d, "env", "ONLY_IN_A=1", "true")
    b = _sub(d, "true")
    for job in (a, b):
        _finished(d, job)
    r = d.dispatch("record", "diff", str(a), str(b), user=ALICE)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "software" in r.stdout and "argv" in r.stdout, r.stdout
    # Forwarded environments that differ by one key: the key is named.
    e1 = _sub(d, "true", flags=("--env",), user=ALICE, env={"HPCB_KEY_A": "1"})
    e2 = _sub(d, "true", flags=("--env",), user=ALICE, env={"HPCB_KEY_A": "1", "HPCB_KEY_B": "2"})
    for job in (e1, e2):
        _finished(d, job)
    r = d.dispatch("record", "diff", "--json", str(e1), str(e2), user=ALICE)
    doc = json.loads(r.stdout)
    assert doc["comparable"] is False
    assert "HPCB_KEY_B" in json.dumps(doc["differences"])
    # Files work as well as ids: the same record twice differs in nothing.
    f = os.path.join(scratch, "e1.json")
    with open(f, "w") as out:
        out.write(d.ok("show", "--record", "--json", str(e1), user=ALICE))
    os.chmod(f, 0o644)
    r = d.dispatch("record", "diff", f, str(e1), user=ALICE)
    assert r.returncode == 0, (r.stdout, r.stderr)


def test_record_env_puts_the_values_in_only_when_asked(daemon, users):
    d = daemon
    plain = _sub(d, "true", flags=("--env",), user=ALICE, env={"HPCB_SECRET": "hunter2"})
    asked = _sub(d, "true", flags=("--env", "--record-env"), user=ALICE, env={"HPCB_SECRET": "hunter2"})
    for job in (plain, asked):
        _finished(d, job)
    assert "hunter2" not in json.dumps(_record(d, plain))
    # The same environment submitted twice: the same digest once the job's own id is left out.
    assert _record(d, plain)["software"]["environment"]["submitted_sha256"]["value"] == \
        _record(d, asked)["software"]["environment"]["submitted_sha256"]["value"]
    assert _record(d, asked)["software"]["environment"]["values"]["value"]["HPCB_SECRET"] == "hunter2"


def test_records_none_and_bad_thresholds(daemon_factory, users):
    d = daemon_factory("--records", "none")
    job = _sub(d, "true")
    row = _finished(d, job)
    r = d.dispatch("show", "--record", str(job), user=ALICE)
    assert r.returncode == 1 and "no record" in r.stderr and "--records none" in r.stderr, r.stderr
    assert not any(v in row.split() for v in VERDICTS), row
    d.stop()
    bad = daemon_factory("--record-thresholds", "no_such=1", start=False)
    bad.start(wait=False)
    assert bad.proc.wait(timeout=30) == 2
    assert "--record-thresholds" in bad.log() and "no_such" in bad.log()


def _fixture_root(scratch):
    """A procfs/sysfs tree with cpufreq and throttle counters for this host's CPUs (copied from the
    synthesised record fixture), so a record read under it can be clean, or noisy when a counter rises."""
    src = os.path.join(os.path.dirname(__file__), "..", "fixtures", "sentinels", "intel-8cpu")
    root = os.path.join(scratch, "root")
    shutil.copytree(src, root, symlinks=True)
    return root


def test_the_verdict_is_clean_on_a_quiet_machine_and_noisy_when_a_throttle_counter_rises(daemon_factory,
                                                                                          users, scratch):
    root = _fixture_root(scratch)
    d = daemon_factory("--reserve-cpu", "0", env={"HPC_BATCH_PROBE_ROOT": root})
    quiet = _sub(d, "true", flags=("--cpu", "1"))
    _finished(d, quiet)
    rec = _record(d, quiet)
    assert rec["verdict"]["verdict"] == "clean", rec["verdict"]
    marker = os.path.join(scratch, "go")
    job = _marker_job(d, marker, flags=("--cpu", "1"))
    cpus = wait_for(lambda: json.loads(d.ok("show", "--json", str(job), user=ALICE)).get("cpus"),
                    what="the job's cpus")
    wait_for(lambda: _partial(d, job), what="the job's partial record")
    counter = os.path.join(root, f"sys/devices/system/cpu/cpu{cpus[0]}/thermal_throttle/core_throttle_count")
    with open(counter, "w") as f:
        f.write("7\n")
    open(marker, "w").close()
    row = _finished(d, job)
    rec = _record(d, job)
    assert rec["verdict"]["verdict"] == "noisy", rec["verdict"]
    assert any("thermal throttling" in why for why in rec["verdict"]["reasons"]), rec["verdict"]
    assert "noisy" in row.split()


def test_a_record_survives_a_daemon_restart_mid_job(daemon_factory, users, scratch):
    d = daemon_factory()
    marker = os.path.join(scratch, "go")
    job = _marker_job(d, marker)
    wait_for(lambda: _partial(d, job), what="the partial record")
    d.kill9()
    d.start()
    open(marker, "w").close()
    _finished(d, job)
    rec = _record(d, job)
    assert rec["complete"] is True and rec["verdict"]["verdict"] in VERDICTS
    assert rec["sentinels"]["delta"], rec["sentinels"]


# -- the job's own figures (issue 30) -------------------------------------------------

def test_a_jobs_own_figures_are_kept_in_its_record_and_bad_lines_quoted_escaped(daemon, users, scratch):
    d = daemon
    # The file is the job's own, new and empty; a value forwarded with --env never wins.
    script = ('case "$HPC_BATCH_METRICS_FILE" in /tmp/hpc-batch-metrics.*) ;; *) exit 8;; esac; '
              '[ -f "$HPC_BATCH_METRICS_FILE" ] && [ -O "$HPC_BATCH_METRICS_FILE" ] '
              '&& [ ! -s "$HPC_BATCH_METRICS_FILE" ] || exit 9; '
              'printf "solve 1.5 s\\nsolve 2.5 s\\n# a comment\\ngflops 31\\nnot a figure line\\n'
              '\\033[31mred 1\\nsolve nan s\\n" >> "$HPC_BATCH_METRICS_FILE"')
    job = _sub(d, "sh", "-c", script, flags=("--env",), env={"HPC_BATCH_METRICS_FILE": "/tmp/forwarded"})
    row = _finished(d, job)
    assert exit_of(row) == "0", row
    rec = _record(d, job)
    metrics = rec["metrics"]
    path = metrics["source"]
    assert path.startswith(f"/tmp/hpc-batch-metrics.{job}."), metrics
    value = metrics["value"]
    assert value["names"] == {"solve": {"unit": "s", "values": [1.5, 2.5], "count": 2, "last": 2.5},
                              "gflops": {"unit": None, "values": [31.0], "count": 1, "last": 31.0}}
    assert value["invalid"]["count"] == 3
    assert [(q["line"], q["text"]) for q in value["invalid"]["first"]] == [
        (5, "not a figure line"), (6, "\\x1b[31mred 1"), (7, "solve nan s")]
    assert not os.path.lexists(path)     # removed once read
    # The variable is in the environment the record describes, and left out of the submitted digest.
    assert "HPC_BATCH_METRICS_FILE" in rec["software"]["environment"]["keys"]["value"]
    assert "HPC_BATCH_METRICS_FILE" in rec["software"]["environment"]["submitted_sha256"]["source"]
    # For people: one line a name, nothing from the file reaching the terminal unescaped.
    text = d.ok("show", "--record", str(job), user=ALICE)
    assert "  solve: last 2.5 s, 2 values: 1.5, 2.5" in text.splitlines(), text
    assert "\x1b" not in text and '"\\x1b[31mred 1"' in text


def test_figures_replaced_by_a_symlink_or_a_fifo_are_refused_and_the_daemon_goes_on(daemon, users, scratch):
    d = daemon
    # alice cannot read /etc/shadow; root must not read it for her through the name it gave her.
    link = _sub(d, "sh", "-c", 'ln -sf /etc/shadow "$HPC_BATCH_METRICS_FILE"')
    fifo = _sub(d, "sh", "-c", 'rm -f "$HPC_BATCH_METRICS_FILE" && mkfifo "$HPC_BATCH_METRICS_FILE"')
    left = []
    try:
        for job in (link, fifo):
            assert exit_of(_finished(d, job)) == "0"
        got = _record(d, link)["metrics"]
        left.append(got["source"])
        assert set(got) == {"value", "source", "error"} and got["value"] is None, got
        assert "symbolic link" in got["error"] and "not read" in got["error"], got
        assert os.path.islink(got["source"]) and os.readlink(got["source"]) == "/etc/shadow"
        # A FIFO with no writer: opened without blocking, never read; the shepherd finished the record.
        got = _record(d, fifo)["metrics"]
        left.append(got["source"])
        assert got["value"] is None and "FIFO" in got["error"], got
        assert not os.path.lexists(got["source"])
        # The daemon and the next job's shepherd go on as ever.
        after = _sub(d, "sh", "-c", 'echo "t 1" > "$HPC_BATCH_METRICS_FILE"')
        _finished(d, after)
        assert _record(d, after)["metrics"]["value"]["names"]["t"]["values"] == [1.0]
        assert d.ping()
    finally:
        for path in left:
            if os.path.islink(path):
                os.unlink(path)


def test_a_big_executable_is_hashed_once_idle_on_the_jobs_own_cpus(daemon, users, scratch):
    # G6: the hash ran on the housekeeping CPUs, outside the job, for every job.
    d = daemon
    work = os.path.join(scratch, "g6")
    os.mkdir(work)
    os.chmod(work, 0o1777)
    big = os.path.join(work, "big")
    made = subprocess.run(["runuser", "-u", ALICE, "--", "sh", "-c",
                           f"printf '#!/bin/sh\\nexit 0\\n' > {big} && truncate -s 256M {big} && chmod +x {big}"])
    assert made.returncode == 0
    h = hashlib.sha256()
    with open(big, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    first = _sub(d, "./big", cwd=work)
    _finished(d, first)
    rec = _record(d, first)
    exe = rec["software"]["executable"]
    assert exe["value"]["sha256"] == h.hexdigest() and exe["value"]["size"] == 256 << 20, exe
    assert exe["identity"]["executable"]["hash_from"] == "read", exe
    hasher = exe["hasher"]
    assert hasher["policy"] == "SCHED_IDLE", hasher
    assert hasher["cpus"] == rec["allocation"]["requested"]["cpus"], (hasher, rec["allocation"]["requested"])
    assert hasher["cpu_s"] > 0.05, hasher   # 256 MiB of sha256, in the job's account now
    second = _sub(d, "./big", cwd=work)
    _finished(d, second)
    again = _record(d, second)["software"]["executable"]
    assert again["identity"]["executable"]["hash_from"] == "cache", again
    assert again["value"] == exe["value"] and again["hasher"]["cpu_s"] < hasher["cpu_s"] / 4, (again, hasher)
    diff = d.dispatch("record", "diff", str(first), str(second), user=ALICE)
    assert "executable" not in diff.stdout, diff.stdout   # compared by name and sha256: the same file
    # The cache is root's, one file per user, in the daemon's state.
    cache = os.path.join(d.state_dir, "jobs", ".exe-hashes")
    st = os.stat(cache)
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
    assert os.listdir(cache) == [str(users["alice"].pw_uid)]

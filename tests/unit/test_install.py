"""hpc-batch-install's pure parts, its host steps against scratch paths, the
non-root refusals, and hpc_batch.sdnotify's datagrams."""

import functools
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hpc_batch import install as inst
from hpc_batch import sdnotify

REPO = Path(__file__).resolve().parents[2]
UNIT_TEMPLATE = REPO / "dist" / "systemd" / "hpc-batch.service"
TEST_USER = "hpcbatch-test"


# ---------------------------------------------------------------- pure parts


@pytest.mark.parametrize("groups, expected", [
    (["root", "wheel", "sudo", "adm"], "wheel"),
    (["root", "adm", "sudo"], "sudo"),
    (["staff", "adm"], "adm"),
    (["root", "staff"], None),
    ([], None),
])
def test_pick_admin_group(groups, expected):
    assert inst.pick_admin_group(groups) == expected


def test_packaged_unit_keeps_what_the_daemon_relies_on():
    text = UNIT_TEMPLATE.read_text()
    for line in ("Type=notify", "Delegate=cpuset memory pids", "KillMode=process",
                 "RestartPreventExitStatus=78", "Restart=on-failure",
                 "RuntimeDirectory=hpc-batch", "StateDirectory=hpc-batch",
                 "ExecStart=@BIN_DIR@/hpc-batchd --admin-group @ADMIN_GROUP@"):
        assert line in text.splitlines(), line
    reload_line = next(l for l in text.splitlines() if l.startswith("ExecReload="))
    assert "-HUP" in reload_line and "$MAINPID" in reload_line


def test_render_unit_fills_every_placeholder():
    text = inst.render_unit(UNIT_TEMPLATE.read_text(), {
        "BIN_DIR": "/usr/local/bin", "ADMIN_GROUP": "adm", "PREFIX": "/opt/x"})
    assert "ExecStart=/usr/local/bin/hpc-batchd --admin-group adm" in text.splitlines()
    assert "@" not in text.replace("$MAINPID", "")


def test_render_unit_refuses_an_unfilled_placeholder():
    with pytest.raises(ValueError, match="@NEW_THING@"):
        inst.render_unit("ExecStart=@BIN_DIR@/x @NEW_THING@\n", {"BIN_DIR": "/b"})


def _login_path(snippet: str, path: str, times: int = 1) -> str:
    script = f'PATH={path}\n' + '. "$1"\n' * times + 'printf %s "$PATH"'
    with tempfile.NamedTemporaryFile("w", suffix=".sh") as f:
        f.write(snippet)
        f.flush()
        return subprocess.run(["sh", "-c", script, "sh", f.name], capture_output=True,
                              text=True, check=True).stdout


@pytest.mark.parametrize("before, after", [
    ("/usr/bin:/bin", "/usr/bin:/bin:/opt/bin"),
    ("/opt/bin:/usr/bin", "/opt/bin:/usr/bin"),
    ("/usr/bin:/opt/bin", "/usr/bin:/opt/bin"),
    ("/usr/bin:/opt/bin/x", "/usr/bin:/opt/bin/x:/opt/bin"),
    ("''", "/opt/bin"),
])
def test_profile_snippet_adds_the_bin_dir_once(before, after):
    snippet = inst.profile_snippet("/opt/bin")
    assert _login_path(snippet, before) == after
    assert _login_path(snippet, before, times=3) == after


def test_profile_snippet_is_marked_as_ours():
    assert inst.profile_snippet("/opt/bin").startswith(inst.PROFILE_MARKER)


@pytest.mark.parametrize("spec, expected", [
    ("0.2.0", "hpc-batch==0.2.0"),
    ("v1.0", "hpc-batch==1.0"),
    ("0.3.0rc1", "hpc-batch==0.3.0rc1"),
    ("hpc-batch", "hpc-batch"),
    ("hpc-batch>=0.2", "hpc-batch>=0.2"),
    (".", "/work/co"),
    ("dist/hpc_batch-0.2.0-py3-none-any.whl", "/work/co/dist/hpc_batch-0.2.0-py3-none-any.whl"),
    ("hpc_batch-0.2.0-py3-none-any.whl", "/work/co/hpc_batch-0.2.0-py3-none-any.whl"),
    ("/srv/hpc-batch/", "/srv/hpc-batch"),
    ("git+https://example.org/hpc-batch", "git+https://example.org/hpc-batch"),
])
def test_normalize_spec(spec, expected):
    assert inst.normalize_spec(spec, "/work/co") == expected


DEFAULTS = {"prefix": "/opt/hpc-batch", "bin_dir": "/opt/bin",
            "admin_group": "sudo", "spec": "hpc-batch"}
RECORD = {"prefix": "/srv/hb", "bin_dir": "/usr/local/bin",
          "admin_group": "adm", "spec": "/tmp/a.whl"}


@pytest.mark.parametrize("recorded, explicit, expected", [
    (None, {}, DEFAULTS),
    (None, {"bin_dir": "/usr/local/bin"}, {**DEFAULTS, "bin_dir": "/usr/local/bin"}),
    (RECORD, {}, RECORD),
    (RECORD, {"prefix": None, "admin_group": None}, RECORD),
    (RECORD, {"prefix": "/srv/hb", "admin_group": "adm"}, RECORD),
    (RECORD, {"spec": "hpc-batch==0.2.0"}, {**RECORD, "spec": "hpc-batch==0.2.0"}),
])
def test_merge_choices(recorded, explicit, expected):
    assert inst.merge_choices(recorded, explicit, DEFAULTS) == expected


def test_merge_choices_refuses_a_contradicting_flag():
    with pytest.raises(inst.ChoiceConflict) as caught:
        inst.merge_choices(RECORD, {"bin_dir": "/opt/bin", "admin_group": "wheel",
                                    "spec": "x"}, DEFAULTS)
    assert caught.value.conflicts == [("bin_dir", "/opt/bin", "/usr/local/bin"),
                                      ("admin_group", "wheel", "adm")]
    message = inst.conflict_message(caught.value, Path("/etc/hpc-batch/install.json"))
    first = message.splitlines()[0]
    assert "--bin-dir /opt/bin differs from /usr/local/bin" in first
    assert "/etc/hpc-batch/install.json" in first
    assert "--uninstall" in first and "--force" in first


def test_merge_choices_with_force_takes_the_flag():
    merged = inst.merge_choices(RECORD, {"admin_group": "wheel"}, DEFAULTS, force=True)
    assert merged == {**RECORD, "admin_group": "wheel"}


@pytest.mark.parametrize("choices, bad", [
    (DEFAULTS, []),
    ({**DEFAULTS, "bin_dir": "opt/bin"}, ["--bin-dir"]),
    ({**DEFAULTS, "bin_dir": "/opt/my bin"}, ["--bin-dir"]),
    ({**DEFAULTS, "prefix": "/"}, ["--prefix"]),
    ({**DEFAULTS, "prefix": "/opt/$x"}, ["--prefix"]),
    ({**DEFAULTS, "admin_group": None}, ["pass --admin-group"]),
    ({**DEFAULTS, "admin_group": "a b\nExecStart=/evil"}, ["--admin-group"]),
])
def test_check_choices(choices, bad):
    problems = inst.check_choices(choices)
    assert len(problems) == len(bad)
    for problem, word in zip(problems, bad):
        assert word in problem


def test_exec_start_argv_takes_the_last_setting_of_unit_and_dropins():
    unit = "[Service]\nExecStart=/opt/bin/hpc-batchd --admin-group adm\n"
    dropin = ("[Service]\nExecStart=\n# ExecStart=/not/this\n"
              "ExecStart=-/opt/bin/hpc-batchd --state-dir=/srv/state \\\n"
              "    --dev-dir /dev/hb --socket '/run/hb/s.sock'\n")
    assert inst.exec_start_argv([unit]) == ["/opt/bin/hpc-batchd", "--admin-group", "adm"]
    argv = inst.exec_start_argv([unit, dropin])
    assert inst.daemon_dirs(argv) == {"state_dir": "/srv/state", "dev_dir": "/dev/hb",
                                      "socket": "/run/hb/s.sock"}
    assert inst.daemon_dirs(inst.exec_start_argv([unit])) == {
        "state_dir": "/var/lib/hpc-batch", "dev_dir": "/dev/hpc-batch",
        "socket": "/run/hpc-batch/hpc-batch.sock"}


@pytest.mark.parametrize("cmdline, comm, expected", [
    (["/opt/hpc-batch/bin/python", "/opt/hpc-batch/bin/hpc-batch-shepherd", "--job", "1"],
     "hpc-batch-sheph", True),
    (["/opt/hpc-batch/bin/python", "/opt/hpc-batch/bin/hpc-batch-shepherd"], "python", True),
    (["hpc-batch-shepherd", "--job", "1"], "whatever", True),
    (["python3", "-m", "shepherd", "--job", "1"], "python3", True),
    (["/opt/hpc-batch/bin/python", "-E", "-s", "-S",
      "/opt/hpc-batch/lib/python3.11/site-packages/shepherd/hpc-batch-shepherd.py",
      "--job", "3", "--user", "alice", "/var/lib/hpc-batch/jobs/3"], "python", True),
    (["python3", "-X", "dev", "/x/hpc-batch-shepherd.py"], "python3", True),
    (["python3", "-c", "import x", "hpc-batch-shepherd"], "python3", False),
    (["python3", "/usr/bin/other", "hpc-batch-shepherd"], "python3", False),
    (["python3", "-X", "hpc-batch-shepherd"], "python3", False),
    (["vim", "/opt/bin/hpc-batch-shepherd"], "vim", False),
    (["less", "x", "hpc-batch-shepherd"], "less", False),
    ([], "", False),
])
def test_is_shepherd(cmdline, comm, expected):
    assert inst.is_shepherd(cmdline, comm) is expected


def test_descendants():
    parent_of = {1: 0, 10: 1, 11: 10, 12: 11, 13: 10, 20: 1, 21: 20}
    assert inst.descendants(parent_of, [10]) == {10, 11, 12, 13}
    assert inst.descendants(parent_of, [12, 21]) == {12, 21}
    assert inst.descendants(parent_of, []) == set()


@pytest.mark.parametrize("path, ok", [
    ("/var/lib/hpc-batch", True), ("/run/hpc-batch", True), ("/opt/bin", True),
    ("/", False), ("/var/lib", False), ("/var/lib/", False), ("/dev", False),
    ("/usr/local/bin", False), ("relative/dir", False), ("/srv", False),
])
def test_safe_to_remove(path, ok):
    assert inst.safe_to_remove(path) is ok


# ---------------------------------------------------------------- host steps


class FakeSystemd:
    """Records systemctl calls; is-active answers from ``active``."""

    def __init__(self, active=False):
        self.active = active
        self.calls = []

    def __call__(self, *args):
        self.calls.append(" ".join(args))
        if args[0] == "is-active":
            return 0 if self.active else 3
        if args[:2] == ("enable", "--now"):
            self.active = True
        if args[:2] == ("disable", "--now"):
            self.active = False
        return 0


def fake_prefix(root: Path, version="0.1.0", exec_args="") -> Path:
    """A venv-shaped directory with the entry points and the packaged unit."""
    prefix = root / "venv"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "pyvenv.cfg").write_text("home = /usr/bin\n")
    for name in inst.ENTRY_POINTS:
        script = prefix / "bin" / name
        script.write_text("#!/bin/sh\nexit 0\n")
        script.chmod(0o755)
    site = prefix / "lib" / "python3.11" / "site-packages"
    (site / "hpc_batch" / "data").mkdir(parents=True)
    (site / f"hpc_batch-{version}.dist-info").mkdir()
    template = UNIT_TEMPLATE.read_text().replace(
        "--admin-group @ADMIN_GROUP@", f"--admin-group @ADMIN_GROUP@{exec_args}")
    (site / "hpc_batch" / "data" / "hpc-batch.service").write_text(template)
    return prefix


def scratch_paths(root: Path) -> inst.Paths:
    booted = root / "run-systemd"
    booted.mkdir()
    return inst.Paths(
        unit=root / "etc/systemd/system/hpc-batch.service",
        dropins=root / "etc/systemd/system/hpc-batch.service.d",
        profile=root / "etc/profile.d/hpc-batch.sh",
        record=root / "etc/hpc-batch/install.json",
        cgroup=root / "cgroup/hpc-batch",
        proc=root / "proc",
        systemd_booted=booted,
        state_dir=root / "var/lib/hpc-batch",
        dev_dir=root / "dev/hpc-batch",
        run_dir=root / "run/hpc-batch")


@pytest.fixture
def scratch(tmp_path):
    paths = scratch_paths(tmp_path)
    systemd = FakeSystemd()
    lines = []
    host = inst.Host(paths=paths, systemctl=systemd, out=lines.append)
    umask = os.umask(0o022)  # main() sets it; give the rest of the run its own back
    yield tmp_path, paths, systemd, host, lines
    os.umask(umask)


def _required(missing: bool, reason: str):
    """Fail (never skip) a test whose precondition is missing: CI always has it."""
    def wrap(fn):
        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            if missing:
                pytest.fail(reason)
            return fn(*args, **kwargs)
        return guarded
    return wrap


needs_root = _required(os.geteuid() != 0, "hpc-batch-install needs root: run the tests as root, as CI does")


@needs_root
def test_install_upgrade_conflict_and_uninstall(scratch, capsys):
    root, paths, systemd, host, _ = scratch
    prefix = fake_prefix(root)
    bin_dir = root / "opt" / "bin"
    args = ["--no-pip", "--prefix", str(prefix), "--bin-dir", str(bin_dir)]

    assert inst.main([*args, "--admin-group", "adm"], host) == 0
    for name in inst.ENTRY_POINTS:
        assert os.readlink(bin_dir / name) == str(prefix / "bin" / name)
    assert stat.S_IMODE(bin_dir.stat().st_mode) == 0o755
    assert paths.profile.read_text() == inst.profile_snippet(str(bin_dir))
    assert f"ExecStart={bin_dir}/hpc-batchd --admin-group adm" in paths.unit.read_text()
    record = json.loads(paths.record.read_text())
    assert {k: record[k] for k in ("prefix", "bin_dir", "admin_group", "spec")} == {
        "prefix": str(prefix), "bin_dir": str(bin_dir), "admin_group": "adm",
        "spec": "hpc-batch"}
    assert record["version"] == "0.1.0"
    assert systemd.calls == ["daemon-reload", "is-active --quiet hpc-batch",
                             "enable --now hpc-batch"]

    # An upgrade repeats the recorded choices and reloads the running daemon.
    systemd.calls.clear()
    assert inst.main(["--no-pip"], host) == 0
    assert json.loads(paths.record.read_text())["admin_group"] == "adm"
    assert systemd.calls == ["daemon-reload", "is-active --quiet hpc-batch",
                             "reload hpc-batch"]

    # A contradicting choice is refused before anything changes.
    systemd.calls.clear()
    unit_before = paths.unit.read_text()
    assert inst.main(["--no-pip", "--admin-group", "sudo"], host) == 1
    err = capsys.readouterr().err
    assert "--admin-group sudo differs from adm" in err and "--force" in err
    assert paths.unit.read_text() == unit_before and systemd.calls == []

    # --force moves the bin dir and takes the old links away.
    new_bin = root / "usr" / "local" / "bin"
    assert inst.main(["--no-pip", "--bin-dir", str(new_bin), "--force"], host) == 0
    assert not bin_dir.exists()
    assert os.readlink(new_bin / "dispatch") == str(prefix / "bin" / "dispatch")
    assert json.loads(paths.record.read_text())["bin_dir"] == str(new_bin)

    # --uninstall keeps the state dir; everything else goes.
    paths.state_dir.mkdir(parents=True)
    (paths.state_dir / "queue.json").write_text("[]")
    systemd.calls.clear()
    assert inst.main(["--uninstall"], host) == 0
    assert systemd.calls[0] == "disable --now hpc-batch"
    for gone in (paths.unit, paths.profile, paths.record, paths.record.parent,
                 new_bin / "dispatch", prefix):
        assert not os.path.lexists(gone), gone
    assert (paths.state_dir / "queue.json").read_text() == "[]"


@needs_root
def test_install_refuses_a_missing_group_and_a_foreign_file(scratch, capsys):
    root, paths, _, host, _ = scratch
    prefix = fake_prefix(root)
    bin_dir = root / "bin"
    args = ["--no-pip", "--prefix", str(prefix), "--bin-dir", str(bin_dir)]
    assert inst.main([*args, "--admin-group", "no-such-group-here"], host) == 1
    assert "--admin-group no-such-group-here does not exist" in capsys.readouterr().err
    bin_dir.mkdir()
    (bin_dir / "dispatch").write_text("someone else's\n")
    assert inst.main([*args, "--admin-group", "adm"], host) == 1
    assert "is not a link" in capsys.readouterr().err
    assert not paths.unit.exists() and not paths.record.exists()


@needs_root
def test_install_without_a_package_in_the_prefix_says_so(scratch, capsys):
    root, _, _, host, _ = scratch
    empty = root / "nothing"
    assert inst.main(["--no-pip", "--prefix", str(empty), "--bin-dir", str(root / "b"),
                      "--admin-group", "adm"], host) == 1
    assert "without --no-pip" in capsys.readouterr().err


@needs_root
def test_install_outside_systemd_only_enables(scratch):
    root, paths, systemd, host, _ = scratch
    paths.systemd_booted.rmdir()
    prefix = fake_prefix(root)
    assert inst.main(["--no-pip", "--prefix", str(prefix), "--bin-dir", str(root / "b"),
                      "--admin-group", "adm"], host) == 0
    assert systemd.calls == ["enable hpc-batch"]


def _fake_proc_entry(proc: Path, pid: int, ppid: int, comm: str, argv: list[str]):
    entry = proc / str(pid)
    entry.mkdir(parents=True)
    entry.joinpath("stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0\n")
    entry.joinpath("cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


@needs_root
def test_purge_kills_shepherds_and_removes_everything(scratch):
    root, paths, systemd, host, _ = scratch
    state, dev, run = root / "srv/state", root / "srv/dev", root / "srv/run/hpc-batch"
    prefix = fake_prefix(root, exec_args=f" --state-dir {state} --dev-dir {dev} "
                                         f"--socket {run}/hpc-batch.sock")
    bin_dir = root / "opt" / "bin"
    assert inst.main(["--no-pip", "--prefix", str(prefix), "--bin-dir", str(bin_dir),
                      "--admin-group", "adm"], host) == 0
    for d in (state / "jobs/3", dev / "jobs", run, paths.state_dir, paths.dropins):
        d.mkdir(parents=True)
    (paths.cgroup / "job-3").mkdir(parents=True)
    # A shepherd with a job below it, and an unrelated process; the table is
    # fake so no real shepherd on this machine is touched.
    shepherd = subprocess.Popen(["sleep", "300"])
    job = subprocess.Popen(["sleep", "300"])
    bystander = subprocess.Popen(["sleep", "300"])
    _fake_proc_entry(paths.proc, shepherd.pid, 1, "python3",
                     ["/usr/bin/python3", "-E", "-s", "-S",
                      str(prefix / "lib/shepherd/hpc-batch-shepherd.py"), "--job", "3"])
    _fake_proc_entry(paths.proc, job.pid, shepherd.pid, "sleep", ["sleep", "300"])
    _fake_proc_entry(paths.proc, bystander.pid, 1, "sleep", ["sleep", "300"])
    try:
        assert inst.main(["--purge"], host) == 0
        assert shepherd.wait(timeout=5) == -9 and job.wait(timeout=5) == -9
        assert bystander.poll() is None
    finally:
        for p in (shepherd, job, bystander):
            p.kill()
            p.wait()
    for gone in (state, dev, run, paths.state_dir, paths.dropins, paths.cgroup,
                 paths.unit, paths.profile, paths.record, bin_dir, prefix):
        assert not os.path.lexists(gone), gone
    assert "disable --now hpc-batch" in systemd.calls


def test_reexec_hands_over_every_choice():
    choices = {"prefix": "/opt/hb", "bin_dir": "/opt/bin", "admin_group": "adm",
               "spec": "/tmp/hpc_batch-0.2.0-py3-none-any.whl"}
    assert inst.reexec_argv(Path("/opt/hb"), choices, force=False) == [
        "/opt/hb/bin/hpc-batch-install", "--no-pip", "--prefix", "/opt/hb",
        "--bin-dir", "/opt/bin", "--admin-group", "adm",
        "--spec", "/tmp/hpc_batch-0.2.0-py3-none-any.whl"]
    assert inst.reexec_argv(Path("/opt/hb"), choices, force=True)[-1] == "--force"


def test_unit_template_prefers_the_venvs_copy(tmp_path):
    prefix = fake_prefix(tmp_path, version="0.3.0")
    found = inst.find_unit_template(prefix)
    assert found == prefix / "lib/python3.11/site-packages/hpc_batch/data/hpc-batch.service"
    assert inst.installed_version(prefix) == "0.3.0"
    # Without one, this package's own copy or the checkout's.
    fallback = inst.find_unit_template(tmp_path / "nowhere")
    assert fallback.read_text() == UNIT_TEMPLATE.read_text()
    assert inst.installed_version(tmp_path / "nowhere") is None


def test_uninstall_and_spec_do_not_mix():
    with pytest.raises(SystemExit) as caught:
        inst.main(["--uninstall", "--spec", "0.2.0"])
    assert caught.value.code == 2


# ---------------------------------------------------------------- processes


def _copy_package(dest: Path) -> Path:
    """A world-readable copy of the package, runnable by another user."""
    dest.chmod(0o755)
    shutil.copytree(REPO / "hpc_batch", dest / "hpc_batch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "dist", dest / "dist")
    for sh in ("install.sh", "uninstall.sh"):
        shutil.copy(REPO / sh, dest / sh)
    for path in dest.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


@pytest.fixture
def world_readable_tmp():
    path = Path(tempfile.mkdtemp(prefix="hpc-batch-install-test."))
    yield path
    shutil.rmtree(path)


def test_runs_help_when_the_rest_of_the_package_is_broken(world_readable_tmp):
    copy = _copy_package(world_readable_tmp)
    (copy / "hpc_batch" / "daemon.py").write_text("def main(:\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(copy)}
    broken = subprocess.run([sys.executable, "-c", "import hpc_batch.daemon"],
                            env=env, capture_output=True, text=True, cwd=copy)
    assert "SyntaxError" in broken.stderr
    ok = subprocess.run([sys.executable, "-m", "hpc_batch.install", "--help"],
                        env=env, capture_output=True, text=True, cwd=copy)
    assert ok.returncode == 0, ok.stderr
    assert "--uninstall" in ok.stdout and "--purge" in ok.stdout


def _test_user() -> str:
    if subprocess.run(["id", TEST_USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/sh",
                        TEST_USER], check=True, capture_output=True)
    return TEST_USER


def _python_for(user: str) -> str:
    """An interpreter ``user`` can run (root's pyenv is not one)."""
    for candidate in (os.path.realpath(sys.executable), "/usr/bin/python3"):
        probe = subprocess.run(["runuser", "-u", user, "--", candidate, "-c", "pass"],
                               capture_output=True)
        if probe.returncode == 0:
            return candidate
    pytest.fail(f"no Python that {user} can run")


needs_runuser = _required(
    os.geteuid() != 0 or not shutil.which("runuser") or not shutil.which("useradd"),
    "needs root, runuser and useradd to act as another user")


@needs_runuser
def test_non_root_is_refused(world_readable_tmp):
    copy = _copy_package(world_readable_tmp)
    user = _test_user()
    python = _python_for(user)
    run = subprocess.run(
        ["runuser", "-u", user, "--", "env", f"PYTHONPATH={copy}", python,
         "-m", "hpc_batch.install", "--no-pip"],
        capture_output=True, text=True, cwd=copy)
    assert run.returncode == inst.EX_NOPERM
    assert run.stderr.strip() == "hpc-batch-install: must be run as root (try: sudo hpc-batch-install)"
    # --help needs no root.
    helped = subprocess.run(
        ["runuser", "-u", user, "--", "env", f"PYTHONPATH={copy}", python,
         "-m", "hpc_batch.install", "--help"], capture_output=True, text=True, cwd=copy)
    assert helped.returncode == 0


@needs_runuser
@pytest.mark.parametrize("script", ["install.sh", "uninstall.sh"])
def test_scripts_refuse_non_root(world_readable_tmp, script):
    copy = _copy_package(world_readable_tmp)
    run = subprocess.run(["runuser", "-u", _test_user(), "--", "sh", str(copy / script)],
                         capture_output=True, text=True, cwd=copy)
    assert run.returncode == 1
    assert "must be run as root" in run.stderr


@pytest.mark.parametrize("script", ["install.sh", "uninstall.sh"])
def test_scripts_are_posix_sh(script):
    shell = shutil.which("dash") or "sh"
    assert subprocess.run([shell, "-n", str(REPO / script)]).returncode == 0


# ---------------------------------------------------------------- sdnotify


@pytest.fixture
def notify_socket(monkeypatch, tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    sock.bind(str(path))
    sock.settimeout(2)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield sock
    sock.close()


def test_notify_without_socket_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", "")
    assert sdnotify.notify("READY=1") is False


def test_notify_to_a_vanished_socket_is_false(monkeypatch, tmp_path):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert sdnotify.ready() is False


def test_ready_stopping_status(notify_socket):
    assert sdnotify.ready() is True
    assert notify_socket.recv(4096) == b"READY=1"
    assert sdnotify.stopping() is True
    assert notify_socket.recv(4096) == b"STOPPING=1"
    assert sdnotify.status("3 running\n2 queued") is True
    assert notify_socket.recv(4096) == b"STATUS=3 running 2 queued"
    assert sdnotify.notify("A=1", "B=2") is True
    assert notify_socket.recv(4096) == b"A=1\nB=2"


def test_reloading_sends_the_monotonic_time(notify_socket):
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert sdnotify.reloading() is True
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    first, second = notify_socket.recv(4096).decode().split("\n")
    assert first == "RELOADING=1"
    assert second.startswith("MONOTONIC_USEC=")
    assert before <= int(second.split("=", 1)[1]) <= after


def test_notify_abstract_namespace(monkeypatch):
    name = f"hpc-batch-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.ready() is True
        assert sock.recv(4096) == b"READY=1"
    # The variable stays: the daemon re-execs and must notify again.
    assert os.environ["NOTIFY_SOCKET"] == "@" + name

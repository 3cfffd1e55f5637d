"""hpc-batch-install's pure parts (choices, safety, texts), its host steps against scratch paths, the
non-root refusals, and hpc_batch.daemon.sdnotify's datagrams."""

import errno
import functools
import json
import os
import re
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
from hpc_batch.daemon import sdnotify
from hpc_batch.install import manpages
from hpc_batch.install.choices import (
    ChoiceConflict,
    check_choices,
    conflict_message,
    merge_choices,
    normalize_spec,
    pick_admin_group,
    spec_path,
)
from hpc_batch.install.common import EX_NOPERM, InstallError
from hpc_batch.install.host import Host, Paths, find_unit_template, installed_version, man_sources, write_atomic
from hpc_batch.install.purge import descendants, is_shepherd, process_table
from hpc_batch.install.safety import Unsafe, find_unsafe, require_root_only, safe_to_remove, unsafe_message
from hpc_batch.install.steps import ENTRY_POINTS, install_completions, reexec_argv, remove_completions
from hpc_batch.install.texts import (
    COMPLETION_MARKER,
    PROFILE_MARKER,
    daemon_dirs,
    exec_start_argv,
    is_our_completion,
    profile_snippet,
    render_unit,
)

REPO = Path(__file__).resolve().parents[2]
UNIT_TEMPLATE = REPO / "dist" / "systemd" / "hpc-batch.service"
COMPLETION_SOURCE = REPO / "hpc_batch" / "data" / "completion"
MAN_SOURCE = REPO.joinpath(*manpages.DATA)
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
    assert pick_admin_group(groups) == expected


def test_packaged_unit_keeps_what_the_daemon_relies_on():
    text = UNIT_TEMPLATE.read_text()
    for line in ("Type=notify", "Delegate=cpuset memory pids", "KillMode=process",
                 "RestartPreventExitStatus=78", "Restart=on-failure",
                 "RuntimeDirectory=hpc-batch", "StateDirectory=hpc-batch",
                 "ExecStart=@BIN_DIR@/hpc-batchd --admin-group @ADMIN_GROUP@"):
        assert line in text.splitlines(), line
    reload_line = next(line for line in text.splitlines() if line.startswith("ExecReload="))
    assert "-HUP" in reload_line and "$MAINPID" in reload_line


def test_render_unit_fills_every_placeholder():
    text = render_unit(UNIT_TEMPLATE.read_text(), {
        "BIN_DIR": "/usr/local/bin", "ADMIN_GROUP": "adm", "PREFIX": "/opt/x"})
    assert "ExecStart=/usr/local/bin/hpc-batchd --admin-group adm" in text.splitlines()
    assert "@" not in text.replace("$MAINPID", "")


def test_render_unit_refuses_an_unfilled_placeholder():
    with pytest.raises(ValueError, match="@NEW_THING@"):
        render_unit("ExecStart=@BIN_DIR@/x @NEW_THING@\n", {"BIN_DIR": "/b"})


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
    snippet = profile_snippet("/opt/bin")
    assert _login_path(snippet, before) == after
    assert _login_path(snippet, before, times=3) == after


def test_profile_snippet_is_marked_as_ours():
    assert profile_snippet("/opt/bin").startswith(PROFILE_MARKER)


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
    ("hpc_batch-0.2.0.tgz", "/work/co/hpc_batch-0.2.0.tgz"),
    ("hpc_batch-0.2.0.tar.bz2", "/work/co/hpc_batch-0.2.0.tar.bz2"),
])
def test_normalize_spec(spec, expected):
    assert normalize_spec(spec, "/work/co") == expected


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
    assert merge_choices(recorded, explicit, DEFAULTS) == expected


def test_merge_choices_refuses_a_contradicting_flag():
    with pytest.raises(ChoiceConflict) as caught:
        merge_choices(RECORD, {"bin_dir": "/opt/bin", "admin_group": "wheel",
                                    "spec": "x"}, DEFAULTS)
    assert caught.value.conflicts == [("bin_dir", "/opt/bin", "/usr/local/bin"),
                                      ("admin_group", "wheel", "adm")]
    message = conflict_message(caught.value, Path("/etc/hpc-batch/install.json"))
    first = message.splitlines()[0]
    assert "--bin-dir /opt/bin differs from /usr/local/bin" in first
    assert "/etc/hpc-batch/install.json" in first
    assert "--uninstall" in first and "--force" in first


def test_merge_choices_with_force_takes_the_flag():
    merged = merge_choices(RECORD, {"admin_group": "wheel"}, DEFAULTS, force=True)
    assert merged == {**RECORD, "admin_group": "wheel"}


@pytest.mark.parametrize("choices, bad", [
    (DEFAULTS, []),
    ({**DEFAULTS, "bin_dir": "opt/bin"}, ["--bin-dir"]),
    ({**DEFAULTS, "bin_dir": "/opt/my bin"}, ["--bin-dir"]),
    ({**DEFAULTS, "prefix": "/"}, ["--prefix"]),
    ({**DEFAULTS, "prefix": "/opt/$x"}, ["--prefix"]),
    ({**DEFAULTS, "admin_group": None}, ["pass --admin-group"]),
    ({**DEFAULTS, "admin_group": "a b\nExecStart=/evil"}, ["--admin-group"]),
    ({**DEFAULTS, "spec": "-e."}, ["--spec"]),
    ({**DEFAULTS, "spec": "--index-url=https://example.org"}, ["--spec"]),
])
def test_check_choices(choices, bad):
    problems = check_choices(choices)
    assert len(problems) == len(bad)
    for problem, word in zip(problems, bad):
        assert word in problem


def test_exec_start_argv_takes_the_last_setting_of_unit_and_dropins():
    unit = "[Service]\nExecStart=/opt/bin/hpc-batchd --admin-group adm\n"
    dropin = ("[Service]\nExecStart=\n# ExecStart=/not/this\n"
              "ExecStart=-/opt/bin/hpc-batchd --state-dir=/srv/state \\\n"
              "    --dev-dir /dev/hb --socket '/run/hb/s.sock'\n")
    assert exec_start_argv([unit]) == ["/opt/bin/hpc-batchd", "--admin-group", "adm"]
    argv = exec_start_argv([unit, dropin])
    assert daemon_dirs(argv) == {"state_dir": "/srv/state", "dev_dir": "/dev/hb",
                                      "socket": "/run/hb/s.sock"}
    assert daemon_dirs(exec_start_argv([unit])) == {
        "state_dir": "/var/lib/hpc-batch", "dev_dir": "/dev/hpc-batch",
        "socket": "/run/hpc-batch/hpc-batch.sock"}


IS_SHEPHERD_CASES = [pytest.param(*case) for case in [
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
]]


@pytest.mark.parametrize("cmdline, comm, expected", IS_SHEPHERD_CASES)
def test_is_shepherd(cmdline, comm, expected):
    assert is_shepherd(cmdline, comm) is expected


# A file name that "*" would expand to in a word-splitting, globbing
# is_shepherd (uninstall.sh's old one), which then sees a shepherd.
GLOB_BAIT = "hpc-batch-shepherd.py"

# (argv, comm, is a shepherd): argv words a user picks to fool a shell
# that splits or globs them, and the edges both readers must agree on.
HOSTILE_ARGV = [
    (["python3", "*"], "python3", False),
    (["python3", "-s", "* a b"], "python3", False),
    (["*"], "sleep", False),
    (["python3", "-s", "-m shepherd"], "python3", False),
    (["python3", "-W", "x y", "-m", "shepherd"], "python3", True),
    (["/x y/hpc-batch-shepherd", "*"], "sleep", True),
    (["python3", "/a b/[h]pc-batch-shepherd.py"], "python3", False),
    (["python3", "-E", "/opt/a b/hpc-batch-shepherd.py", "*"], "python3", True),
    (["python3", "-Q\nhpc-batch-shepherd"], "python3", False),
    (["python3", "x\n/hpc-batch-shepherd.py"], "python3", True),
    (["python3", "", "-m", "", "shepherd"], "python3", True),
    (["python3", "-a", "-b", "-c1", "-d", "-e", "-f", "hpc-batch-shepherd.py"], "python3", True),
    (["python3", "-a", "-b", "-c1", "-d", "-e", "-f", "-g", "hpc-batch-shepherd.py"],
     "python3", False),
    (["python3", "-m"], "python3", False),
]


def _shell_functions(names=("is_shepherd", "shepherd_argv")) -> str:
    """uninstall.sh's top-level functions ``names``, as shell text."""
    text = (REPO / "uninstall.sh").read_text()
    found = [re.search(rf"^{name}\(\) {{\n.*?^}}\n", text, re.M | re.S) for name in names]
    assert all(found), f"uninstall.sh lacks one of {names} at the top level"
    return "".join(m.group() for m in found)


def _shell_shepherds(dirs: list[Path], cwd: Path) -> set[str]:
    """Names of ``dirs`` that uninstall.sh's is_shepherd takes for shepherds."""
    script = _shell_functions() + 'for d; do if is_shepherd "$d"; then echo "${d##*/}"; fi; done\n'
    shell = shutil.which("dash") or "sh"
    run = subprocess.run([shell, "-c", script, "sh", *map(str, dirs)], cwd=cwd,
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    return set(run.stdout.split())


def test_shell_and_python_is_shepherd_agree_on_hostile_argv(tmp_path):
    # Cwd holds a file "*" would expand to: a globbing reader would fail.
    bait = tmp_path / "cwd"
    bait.mkdir()
    (bait / GLOB_BAIT).write_text("")
    proc = tmp_path / "proc"
    cases = HOSTILE_ARGV + [tuple(case.values) for case in IS_SHEPHERD_CASES]
    expected = set()
    for pid, (argv, comm, ok) in enumerate(cases, start=100):
        _fake_proc_entry(proc, pid, 1, comm, argv)
        (proc / str(pid) / "comm").write_text(comm + "\n")
        assert is_shepherd([a for a in argv if a], comm) is ok, argv
        if ok:
            expected.add(str(pid))
    # The last word without its NUL: a process may rewrite its argv so.
    _fake_proc_entry(proc, 99, 1, "python3", [])
    (proc / "99" / "cmdline").write_bytes(b"python3\0/x/hpc-batch-shepherd.py")
    (proc / "99" / "comm").write_text("python3\n")
    expected.add("99")

    _, python_says = process_table(proc)
    assert {str(pid) for pid in python_says} == expected
    assert _shell_shepherds(sorted(proc.iterdir()), bait) == expected


def test_shell_is_shepherd_does_not_glob_or_split_a_live_process_argv(tmp_path):
    (tmp_path / GLOB_BAIT).write_text("")
    # /bin/sh -s runs what comes on stdin, keeping argv[1:] as it is;
    # argv[0] poses as python. Popen may return before the exec is done,
    # so each shell answers a first command: then /proc shows its argv.
    argvs = {False: ["python3", "-s", "*", "a b"],
             True: ["python3", "-s", "/x y/hpc-batch-shepherd.py", "*"]}
    procs = {ok: subprocess.Popen(argv, executable="/bin/sh", stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
             for ok, argv in argvs.items()}
    try:
        for ok, p in procs.items():
            p.stdin.write("echo ready\n")
            p.stdin.flush()
            assert p.stdout.readline() == "ready\n"
            raw = Path(f"/proc/{p.pid}/cmdline").read_bytes()
            assert raw.split(b"\0")[:-1] == [a.encode() for a in argvs[ok]]
            assert is_shepherd(argvs[ok], "sh") is ok
        found = _shell_shepherds([Path(f"/proc/{p.pid}") for p in procs.values()], tmp_path)
        assert found == {str(procs[True].pid)}
    finally:
        for p in procs.values():
            p.stdin.close()  # end of its commands: the shell exits
            assert p.wait(timeout=10) == 0
            p.stdout.close()


def test_descendants():
    parent_of = {1: 0, 10: 1, 11: 10, 12: 11, 13: 10, 20: 1, 21: 20}
    assert descendants(parent_of, [10]) == {10, 11, 12, 13}
    assert descendants(parent_of, [12, 21]) == {12, 21}
    assert descendants(parent_of, []) == set()


@pytest.mark.parametrize("path, ok", [
    ("/var/lib/hpc-batch", True), ("/run/hpc-batch", True), ("/opt/bin", True),
    ("/", False), ("/var/lib", False), ("/var/lib/", False), ("/dev", False),
    ("/usr/local/bin", False), ("relative/dir", False), ("/srv", False),
])
def test_safe_to_remove(path, ok):
    assert safe_to_remove(path) is ok


# ---------------------------------------------------------------- root-only paths


def _stat(kind: str, uid: int, perm: int) -> os.stat_result:
    """A stat result of a directory ("d"), file ("f") or symlink ("l")."""
    fmt = {"d": stat.S_IFDIR, "f": stat.S_IFREG, "l": stat.S_IFLNK}[kind]
    return os.stat_result((fmt | perm, 1, 1, 1, uid, uid, 0, 0, 0, 0))


class FakeFS:
    """lstat and readlink over a table: path -> ("d"|"f", uid, mode),
    ("l", uid, target) or an exception to raise. Records the lstat calls."""

    def __init__(self, table: dict):
        self.table = table
        self.seen = []

    def lstat(self, path):
        self.seen.append(path)
        entry = self.table.get(path)
        if entry is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        if isinstance(entry, OSError):
            raise entry
        kind, uid, rest = entry
        return _stat(kind, uid, 0o777 if kind == "l" else rest)

    def readlink(self, path):
        kind, _, target = self.table[path]
        assert kind == "l", f"readlink on a {kind}: {path}"
        return target


BASE_FS = {"/": ("d", 0, 0o755), "/opt": ("d", 0, 0o755), "/tmp": ("d", 0, 0o1777),
           "/home": ("d", 0, 0o755), "/home/alice": ("d", 1000, 0o755),
           "/home/alice/co": ("d", 1000, 0o755), "/srv": ("d", 0, 0o755)}


@pytest.mark.parametrize("path, extra, missing_ok, expected", [
    # The path itself: owner root/other, modes 0755/0775/0777/1777.
    ("/opt/co", {"/opt/co": ("d", 0, 0o755)}, False, None),
    ("/opt/co", {"/opt/co": ("d", 1000, 0o755)}, False, ("/opt/co", "owner")),
    ("/opt/co", {"/opt/co": ("d", 0, 0o775)}, False, ("/opt/co", "writable")),
    ("/opt/co", {"/opt/co": ("d", 0, 0o777)}, False, ("/opt/co", "writable")),
    ("/opt/co", {"/opt/co": ("d", 0, 0o1777)}, False, ("/opt/co", "writable")),
    ("/tmp", {}, True, ("/tmp", "writable")),
    ("/opt/a.whl", {"/opt/a.whl": ("f", 0, 0o644)}, False, None),
    ("/opt/a.whl", {"/opt/a.whl": ("f", 0, 0o666)}, False, ("/opt/a.whl", "writable")),
    ("/opt/a.whl", {"/opt/a.whl": ("f", 1000, 0o644)}, False, ("/opt/a.whl", "owner")),
    # Its parents, / included.
    ("/home/alice/co", {}, False, ("/home/alice", "owner")),
    ("/srv/open/co", {"/srv/open": ("d", 0, 0o777), "/srv/open/co": ("d", 0, 0o755)},
     False, ("/srv/open", "writable")),
    ("/srv/team/co", {"/srv/team": ("d", 0, 0o2775), "/srv/team/co": ("d", 0, 0o755)},
     False, ("/srv/team", "writable")),
    ("/opt/co", {"/": ("d", 0, 0o777), "/opt/co": ("d", 0, 0o755)}, False, ("/", "writable")),
    ("/opt/co", {"/": ("d", 1000, 0o755), "/opt/co": ("d", 0, 0o755)}, False, ("/", "owner")),
    # A sticky parent passes only above a root-owned entry.
    ("/tmp/co", {"/tmp/co": ("d", 0, 0o755)}, False, None),
    ("/tmp/co/a.whl", {"/tmp/co": ("d", 0, 0o755), "/tmp/co/a.whl": ("f", 0, 0o644)},
     False, None),
    ("/tmp/co", {"/tmp/co": ("d", 1000, 0o755)}, False, ("/tmp/co", "owner")),
    ("/tmp/co/a.whl", {"/tmp/co": ("d", 1000, 0o755), "/tmp/co/a.whl": ("f", 0, 0o644)},
     False, ("/tmp/co", "owner")),
    # Symlinks: root's are followed, anyone else's refused.
    ("/opt/link", {"/opt/link": ("l", 0, "/opt/real"), "/opt/real": ("d", 0, 0o755)},
     False, None),
    ("/opt/link/a.whl", {"/opt/link": ("l", 0, "../srv/x"), "/srv/x": ("d", 0, 0o755),
                         "/srv/x/a.whl": ("f", 0, 0o644)}, False, None),
    ("/opt/link", {"/opt/link": ("l", 0, "/home/alice/co")}, False, ("/home/alice", "owner")),
    ("/opt/link", {"/opt/link": ("l", 0, "/tmp")}, False, ("/tmp", "writable")),
    ("/opt/link", {"/opt/link": ("l", 1000, "/opt/real"), "/opt/real": ("d", 0, 0o755)},
     False, ("/opt/link", "link-owner")),
    ("/opt/a", {"/opt/a": ("l", 0, "/opt/b"), "/opt/b": ("l", 0, "a")}, False, ("/opt/a", "loop")),
    # Missing: fine for a prefix or bin dir the installer creates as root,
    # not for a spec, nor straight inside a sticky directory.
    ("/opt/hb", {}, True, None),
    ("/opt/hb/deeper/still", {}, True, None),
    ("/opt/hb", {}, False, ("/opt/hb", "missing")),
    ("/tmp/hb", {}, True, ("/tmp/hb", "shared-missing")),
    ("/home/alice/venv", {}, True, ("/home/alice", "owner")),
    ("/opt/f/x", {"/opt/f": ("f", 0, 0o644),
                  "/opt/f/x": NotADirectoryError(errno.ENOTDIR, "Not a directory")},
     True, ("/opt/f/x", "unreadable")),
])
def test_find_unsafe(path, extra, missing_ok, expected):
    fs = FakeFS({**BASE_FS, **extra})
    found = find_unsafe(path, fs.lstat, fs.readlink, missing_ok=missing_ok)
    assert (found and (found.component, found.kind)) == expected
    if expected and expected[1] in ("owner", "link-owner"):
        assert found.uid == 1000


def test_find_unsafe_walks_every_parent_with_lstat_from_the_root():
    fs = FakeFS({**BASE_FS, "/opt/link": ("l", 0, "../srv/co"), "/srv/co": ("d", 0, 0o755)})
    assert find_unsafe("/opt/link", fs.lstat, fs.readlink) is None
    # ".." in the link's target goes back up to "/", looked at once more.
    assert fs.seen == ["/", "/opt", "/opt/link", "/", "/srv", "/srv/co"]
    with pytest.raises(ValueError):
        find_unsafe("opt/co", fs.lstat, fs.readlink)


def _who(uid):
    return {1000: "alice (uid 1000)"}.get(uid, f"uid {uid}")


@pytest.mark.parametrize("flag, path, found, words, not_words", [
    ("--spec", "/home/alice/co", Unsafe("/home/alice/co", "owner", uid=1000),
     ["/home/alice/co is owned by alice (uid 1000)", "chown -R root: /home/alice/co",
      "root-owned copy", "pip installs it as root"], []),
    ("--spec", "/home/alice/co/a.whl", Unsafe("/home/alice", "owner", uid=1000),
     ["/home/alice is owned by alice (uid 1000)", "root-owned copy"], ["chown -R root: /home"]),
    ("--prefix", "/home/alice/venv", Unsafe("/home/alice", "owner", uid=1000),
     ["choose a --prefix", "the daemon runs as root"], ["chown"]),
    ("--bin-dir", "/srv/bin", Unsafe("/srv/bin", "writable", uid=0, mode=0o40775),
     ["writable by its group (mode 0775)", "chmod go-w /srv/bin"], []),
    ("--prefix", "/tmp", Unsafe("/tmp", "writable", uid=0, mode=0o41777),
     ["its group and everyone (mode 1777)", "not /tmp itself"], ["chmod", "chown"]),
    ("--prefix", "/tmp/hb", Unsafe("/tmp/hb", "shared-missing", detail="/tmp"),
     ["anyone can create it first in /tmp", "mkdir -m 755 /tmp/hb"], []),
    ("--spec", "/opt/link", Unsafe("/opt/link", "link-owner", uid=1000),
     ["a symlink owned by alice (uid 1000)"], []),
    ("--spec", "/opt/nope.whl", Unsafe("/opt/nope.whl", "missing"),
     ["/opt/nope.whl does not exist"], ["root"]),
])
def test_unsafe_message(flag, path, found, words, not_words):
    message = unsafe_message(flag, path, found, _who)
    assert "\n" not in message and message.count(path) >= 1
    for word in words:
        assert word in message, word
    for word in not_words:
        assert word not in message, word


@pytest.mark.parametrize("spec, expected", [
    ("hpc-batch", None), ("hpc-batch==0.2.0", None), ("hpc-batch>=0.2", None),
    ("https://example.org/hpc_batch-0.2.0-py3-none-any.whl", None),
    ("git+https://example.org/hpc-batch@v1", None),
    ("/srv/co", "/srv/co"), (".", "/w"), ("dist/a.whl", "/w/dist/a.whl"),
    ("hpc_batch-0.2.0.tgz", "/w/hpc_batch-0.2.0.tgz"),
    ("file:///srv/a%20b/x.whl#sha256=00", "/srv/a b/x.whl"),
    ("hpc-batch @ file:///srv/co", "/srv/co"),
    ("git+file:///srv/repo@v1#egg=hpc-batch", "/srv/repo"),
    ("file:x.whl", "/w/x.whl"),
])
def test_spec_path(spec, expected):
    assert spec_path(spec, "/w") == expected


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
    for name in ENTRY_POINTS:
        script = prefix / "bin" / name
        script.write_text("#!/bin/sh\nexit 0\n")
        script.chmod(0o755)
    site = prefix / "lib" / "python3.11" / "site-packages"
    (site / "hpc_batch" / "data").mkdir(parents=True)
    (site / f"hpc_batch-{version}.dist-info").mkdir()
    template = UNIT_TEMPLATE.read_text().replace(
        "--admin-group @ADMIN_GROUP@", f"--admin-group @ADMIN_GROUP@{exec_args}")
    (site / "hpc_batch" / "data" / "hpc-batch.service").write_text(template)
    shutil.copytree(COMPLETION_SOURCE, site / "hpc_batch" / "data" / "completion")
    shutil.copytree(MAN_SOURCE, site.joinpath(*manpages.DATA))
    return prefix


def scratch_paths(root: Path) -> Paths:
    booted = root / "run-systemd"
    booted.mkdir()
    return Paths(
        unit=root / "etc/systemd/system/hpc-batch.service",
        dropins=root / "etc/systemd/system/hpc-batch.service.d",
        profile=root / "etc/profile.d/hpc-batch.sh",
        record=root / "etc/hpc-batch/install.json",
        deb_wheelhouse=root / "usr/share/hpc-batch/wheels",
        bash_completion=root / "usr/share/bash-completion/completions/dispatch",
        zsh_completion=root / "usr/share/zsh/vendor-completions/_dispatch",
        man_dir=root / "usr/local/share/man",
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
    host = Host(paths=paths, systemctl=systemd, out=lines.append)
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
    for name in ENTRY_POINTS:
        assert os.readlink(bin_dir / name) == str(prefix / "bin" / name)
    assert stat.S_IMODE(bin_dir.stat().st_mode) == 0o755
    assert paths.profile.read_text() == profile_snippet(str(bin_dir))
    assert f"ExecStart={bin_dir}/hpc-batchd --admin-group adm" in paths.unit.read_text()
    assert paths.bash_completion.read_text() == (COMPLETION_SOURCE / "dispatch.bash").read_text()
    assert paths.zsh_completion.read_text() == (COMPLETION_SOURCE / "_dispatch").read_text()
    assert man_pages(paths) == {page: (MAN_SOURCE / page).read_text() for page in manpages.PAGES}
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
                 paths.bash_completion, paths.zsh_completion, new_bin / "dispatch", prefix):
        assert not os.path.lexists(gone), gone
    assert man_pages(paths) == {}
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
                 paths.unit, paths.profile, paths.record, paths.bash_completion,
                 paths.zsh_completion, bin_dir, prefix):
        assert not os.path.lexists(gone), gone
    assert man_pages(paths) == {}
    assert "disable --now hpc-batch" in systemd.calls


NOBODY = 65534  # a uid that is not root's; it need not have a name


def _owned_by_nobody(path: Path) -> Path:
    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    return path


@needs_root
def test_require_root_only_on_the_real_filesystem(tmp_path):
    # tmp_path and its parents are root's (/tmp being sticky): all pass.
    require_root_only("--spec", str(tmp_path), missing_ok=False)
    ours = tmp_path / "root-co"
    ours.mkdir()
    ours.chmod(0o755)
    require_root_only("--spec", str(ours), missing_ok=False)
    require_root_only("--prefix", str(ours / "venv"), missing_ok=True)

    theirs = tmp_path / "user-co"
    theirs.mkdir()
    _owned_by_nobody(theirs)
    (theirs / "a.whl").write_text("")  # root's file, in their directory
    link = tmp_path / "link"
    link.symlink_to(theirs)
    for path in (theirs, theirs / "a.whl", link):
        with pytest.raises(InstallError) as caught:
            require_root_only("--spec", str(path), missing_ok=False)
        message = str(caught.value)
        assert f"--spec {path}: {theirs} is owned by" in message
        assert f"(uid {NOBODY})" in message and "\n" not in message

    shared = tmp_path / "open"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(InstallError, match=r"by its group and everyone \(mode 0777\)"):
        require_root_only("--prefix", str(shared / "venv"), missing_ok=True)


def _refuse_to_build(*args):
    raise AssertionError("pip or venv reached with a path others can change")


@needs_root
def test_install_refuses_paths_others_can_change_before_pip(scratch, capsys, monkeypatch):
    root, paths, systemd, host, _ = scratch
    prefix, bin_dir = fake_prefix(root), root / "opt" / "bin"
    theirs = root / "user-co"
    theirs.mkdir()
    _owned_by_nobody(theirs)
    ours = root / "root-co"
    ours.mkdir()
    monkeypatch.setattr(inst, "stage", _refuse_to_build)
    monkeypatch.setattr(inst, "prune", _refuse_to_build)
    args = ["--prefix", str(prefix), "--bin-dir", str(bin_dir), "--admin-group", "adm"]

    assert inst.main([*args, "--spec", str(theirs)], host) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"hpc-batch-install: refusing --spec {theirs}: ")
    assert f"(uid {NOBODY})" in err and f"chown -R root: {theirs}" in err
    assert not paths.record.exists() and systemd.calls == []

    # Root's own checkout is fine, and recorded.
    assert inst.main(["--no-pip", *args, "--spec", str(ours)], host) == 0
    assert json.loads(paths.record.read_text())["spec"] == str(ours)

    # Once a user owns it, a bare upgrade refuses the recorded spec.
    systemd.calls.clear()
    _owned_by_nobody(ours)
    assert inst.main([], host) == 1
    err = capsys.readouterr().err
    assert f"refusing --spec {ours}: {ours} is owned by" in err
    assert f"--spec comes from {paths.record}" in err and "--spec hpc-batch" in err
    assert systemd.calls == []

    for flag in ("--prefix", "--bin-dir"):
        assert inst.main(["--no-pip", flag, str(theirs / "x"), "--force"], host) == 1
        assert f"refusing {flag} {theirs / 'x'}: {theirs} is owned by" in capsys.readouterr().err


def _install_sh_check() -> str:
    """The Python that install.sh runs to refuse a spec or prefix."""
    found = re.search(r"^ROOT_ONLY_PY='\n(.*?)^'$", (REPO / "install.sh").read_text(),
                      re.M | re.S)
    assert found, "install.sh has no ROOT_ONLY_PY='...'"
    return found.group(1)


@pytest.fixture
def real_tree(tmp_path):
    """Paths of each kind find_unsafe tells apart, on the real filesystem."""
    t = tmp_path
    for name, mode, owner in (("ours", 0o755, 0), ("theirs", 0o755, NOBODY),
                              ("open", 0o777, 0), ("group", 0o775, 0),
                              ("sticky", 0o1777, 0), ("sticky/ours", 0o755, 0),
                              ("sticky/theirs", 0o755, NOBODY)):
        (t / name).mkdir()
        (t / name).chmod(mode)
        os.chown(t / name, owner, owner)
    (t / "ours/a.whl").write_text("")
    (t / "theirs/a.whl").write_text("")
    (t / "link-to-theirs").symlink_to(t / "theirs")
    (t / "their-link").symlink_to(t / "ours")
    _owned_by_nobody(t / "their-link")
    return t


# (flag, spec or path, {t} being the tree, whether only root can change it)
REAL_CASES = [
    ("--spec", "{t}/ours", True), ("--spec", "{t}/ours/a.whl", True),
    ("--spec", "{t}/theirs", False), ("--spec", "{t}/theirs/a.whl", False),
    ("--spec", "{t}/open", False), ("--spec", "{t}/group", False),
    ("--spec", "{t}/sticky", False), ("--spec", "{t}/sticky/ours", True),
    ("--spec", "{t}/sticky/theirs", False), ("--spec", "{t}/link-to-theirs", False),
    ("--spec", "{t}/their-link", False), ("--spec", "{t}/ours/missing.whl", False),
    ("--spec", "file://{t}/theirs/a.whl", False),
    ("--spec", "hpc-batch @ file://{t}/ours/a.whl", True),
    ("--spec", "hpc-batch", True), ("--spec", "hpc-batch==0.2.0", True),
    ("--prefix", "{t}/ours/venv", True), ("--prefix", "{t}/sticky/venv", False),
    ("--prefix", "{t}/theirs/venv", False), ("--prefix", "{t}/open/venv", False),
]


@needs_root
def test_install_sh_check_agrees_with_find_unsafe(real_tree):
    check = _install_sh_check()
    for flag, value, ok in REAL_CASES:
        value = value.format(t=real_tree)
        path = spec_path(value, "/") if flag == "--spec" else value
        python_ok = path is None or find_unsafe(path, missing_ok=flag == "--prefix") is None
        run = subprocess.run([sys.executable, "-I", "-c", check, flag, value],
                             capture_output=True, text=True, timeout=30)
        assert (python_ok, run.returncode == 0) == (ok, ok), (flag, value, run.stderr)
        if not ok:
            assert run.stderr.startswith(f"install.sh: refusing {flag} {value}: ")
            assert run.stderr.count("\n") == 1


@needs_root
def test_install_sh_refuses_a_spec_others_can_change_before_pip(real_tree):
    venv = real_tree / "ours" / "venv"
    run = subprocess.run(
        ["sh", str(REPO / "install.sh"), str(real_tree / "theirs"), "--prefix", str(venv),
         "--force"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "HPC_BATCH_PYTHON": sys.executable})
    assert run.returncode == 1
    assert f"refusing --spec {real_tree / 'theirs'}: " in run.stderr
    assert f"uid {NOBODY}" in run.stderr
    assert not venv.exists()  # refused before the venv, so before pip


def test_reexec_hands_over_every_choice():
    choices = {"prefix": "/opt/hb", "bin_dir": "/opt/bin", "admin_group": "adm",
               "spec": "/tmp/hpc_batch-0.2.0-py3-none-any.whl"}
    assert reexec_argv(Path("/opt/hb"), choices, force=False) == [
        "/opt/hb/bin/hpc-batch-install", "--no-pip", "--prefix", "/opt/hb",
        "--bin-dir", "/opt/bin", "--admin-group", "adm",
        "--spec", "/tmp/hpc_batch-0.2.0-py3-none-any.whl"]
    assert reexec_argv(Path("/opt/hb"), choices, force=True)[-1] == "--force"


def test_unit_template_prefers_the_venvs_copy(tmp_path):
    prefix = fake_prefix(tmp_path, version="0.3.0")
    found = find_unit_template(prefix)
    assert found == prefix / "lib/python3.11/site-packages/hpc_batch/data/hpc-batch.service"
    assert installed_version(prefix) == "0.3.0"
    # Without one, this package's own copy or the checkout's.
    fallback = find_unit_template(tmp_path / "nowhere")
    assert fallback.read_text() == UNIT_TEMPLATE.read_text()
    assert installed_version(tmp_path / "nowhere") is None


# ---------------------------------------------------------------- shell completion


def _venv_completion(prefix: Path, name: str) -> Path:
    return prefix / "lib/python3.11/site-packages/hpc_batch/data/completion" / name


@pytest.mark.parametrize("text, ours", [
    (f"{COMPLETION_MARKER}\ncomplete -F _dispatch dispatch\n", True),
    (f"#compdef dispatch\n{COMPLETION_MARKER}\n_dispatch \"$@\"\n", True),
    (f"#compdef dispatch\n# more\n{COMPLETION_MARKER}\n", True),
    (f"#compdef dispatch\n# more\n# and more\n{COMPLETION_MARKER}\n", False),
    (f"# {COMPLETION_MARKER}\n", False),
    ("complete -F _my_dispatch dispatch\n", False),
    ("", False),
])
def test_is_our_completion(text, ours):
    assert is_our_completion(text) is ours


def test_install_completions_writes_the_venvs_files_and_uninstall_removes_them(scratch):
    root, paths, _, host, lines = scratch
    prefix = fake_prefix(root)
    # The venv's copies differ from this checkout's: the venv's are the ones written.
    venv_text = {}
    for name, first in (("dispatch.bash", ""), ("_dispatch", "#compdef dispatch\n")):
        venv_text[name] = f"{first}{COMPLETION_MARKER}\n# the venv's {name}\n"
        _venv_completion(prefix, name).write_text(venv_text[name])
    assert not paths.bash_completion.parent.exists()  # created as needed

    install_completions(prefix, host)
    for dest, name in ((paths.bash_completion, "dispatch.bash"), (paths.zsh_completion, "_dispatch")):
        assert dest.read_text() == venv_text[name]
        assert stat.S_IMODE(dest.stat().st_mode) == 0o644
        assert stat.S_IMODE(dest.parent.stat().st_mode) == 0o755
        assert not [p for p in dest.parent.iterdir() if p != dest]  # no temporary left
    assert any(str(paths.bash_completion) in line and str(paths.zsh_completion) in line
               for line in lines)

    lines.clear()
    remove_completions(host)
    assert not os.path.lexists(paths.bash_completion) and not os.path.lexists(paths.zsh_completion)
    assert f"hpc-batch-install: removed {paths.bash_completion}" in lines
    assert f"hpc-batch-install: removed {paths.zsh_completion}" in lines
    lines.clear()
    remove_completions(host)  # nothing left: nothing said
    assert lines == []


def test_install_completions_falls_back_to_this_package(scratch):
    root, paths, _, host, _ = scratch
    install_completions(root / "no-venv", host)
    assert paths.bash_completion.read_bytes() == (COMPLETION_SOURCE / "dispatch.bash").read_bytes()
    assert paths.zsh_completion.read_bytes() == (COMPLETION_SOURCE / "_dispatch").read_bytes()


def test_an_upgrade_replaces_the_file_an_older_version_wrote(scratch):
    root, paths, _, host, _ = scratch
    paths.bash_completion.parent.mkdir(parents=True)
    paths.bash_completion.write_text(f"{COMPLETION_MARKER}\n# version 0.0.1\n")
    install_completions(fake_prefix(root), host)
    assert paths.bash_completion.read_bytes() == (COMPLETION_SOURCE / "dispatch.bash").read_bytes()


def test_completion_files_not_ours_are_left_alone(scratch):
    root, paths, _, host, lines = scratch
    prefix = fake_prefix(root)
    theirs = "# the distribution's own\ncomplete -F _their_dispatch dispatch\n"
    paths.bash_completion.parent.mkdir(parents=True)
    paths.bash_completion.write_text(theirs)
    # A link to a file with our marker is not ours either: it was not written here.
    paths.zsh_completion.parent.mkdir(parents=True)
    target = root / "elsewhere"
    target.write_text(f"#compdef dispatch\n{COMPLETION_MARKER}\n")
    paths.zsh_completion.symlink_to(target)

    install_completions(prefix, host)
    assert paths.bash_completion.read_text() == theirs
    assert paths.zsh_completion.is_symlink() and os.readlink(paths.zsh_completion) == str(target)
    for dest, shell in ((paths.bash_completion, "bash"), (paths.zsh_completion, "zsh")):
        assert (f"hpc-batch-install: left {dest} alone: it was not written by hpc-batch-install, "
                f"so {shell} completion for dispatch is not installed") in lines
    assert not any(line.startswith("hpc-batch-install: wrote") for line in lines)

    lines.clear()
    remove_completions(host)
    assert paths.bash_completion.read_text() == theirs
    assert paths.zsh_completion.is_symlink() and target.exists()
    assert lines == [f"hpc-batch-install: left {paths.bash_completion} alone: it was not written by "
                     "hpc-batch-install",
                     f"hpc-batch-install: left {paths.zsh_completion} alone: it was not written by "
                     "hpc-batch-install"]


def test_a_foreign_file_for_one_shell_does_not_stop_the_other(scratch):
    root, paths, _, host, _ = scratch
    paths.bash_completion.parent.mkdir(parents=True)
    paths.bash_completion.mkdir()  # not even a file
    install_completions(fake_prefix(root), host)
    assert paths.bash_completion.is_dir()
    assert paths.zsh_completion.read_bytes() == (COMPLETION_SOURCE / "_dispatch").read_bytes()
    remove_completions(host)
    assert paths.bash_completion.is_dir() and not paths.zsh_completion.exists()


def test_a_packaged_file_without_the_marker_is_not_installed(scratch):
    # --uninstall could never tell it from someone else's, so it is not written.
    root, paths, _, host, lines = scratch
    prefix = fake_prefix(root)
    _venv_completion(prefix, "_dispatch").write_text("#compdef dispatch\n_dispatch() { :; }\n")
    install_completions(prefix, host)
    assert not paths.zsh_completion.exists()
    assert any("lacks the line" in line and str(paths.zsh_completion) in line for line in lines)
    assert paths.bash_completion.exists()


def test_a_read_only_completion_dir_does_not_fail_the_install(scratch, monkeypatch):
    root, paths, _, host, lines = scratch

    def refuse(path, text, mode=0o644):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr("hpc_batch.install.steps.write_atomic", refuse)   # the one install_completions calls
    install_completions(fake_prefix(root), host)
    assert f"hpc-batch-install: could not write {paths.bash_completion}: Read-only file system" in lines
    assert not paths.bash_completion.exists()


def test_paths_default_to_debians_completion_dirs():
    paths = Paths()
    assert paths.bash_completion == Path("/usr/share/bash-completion/completions/dispatch")
    assert paths.zsh_completion == Path("/usr/share/zsh/vendor-completions/_dispatch")


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
    (copy / "hpc_batch" / "daemon" / "main.py").write_text("def main(:\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(copy)}
    broken = subprocess.run([sys.executable, "-c", "import hpc_batch.daemon.main"],
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
    assert run.returncode == EX_NOPERM
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


# ---------------------------------------------------------------- manual pages


def man_pages(paths: inst.Paths) -> dict[str, str]:
    """Page name -> text of each manual page installed under the scratch man dir."""
    return {page: manpages.destination(paths.man_dir, page).read_text() for page in manpages.PAGES
            if os.path.lexists(manpages.destination(paths.man_dir, page))}


def test_man_pages_go_where_man_looks_by_section():
    man = Path("/usr/local/share/man")
    assert inst.Paths().man_dir == man
    assert [manpages.destination(man, p) for p in manpages.PAGES] == [
        man / "man1/dispatch.1", man / "man8/hpc-batchd.8", man / "man8/hpc-batch-install.8",
        man / "man8/hpc-batch-shepherd.8"]


def test_install_writes_the_venvs_man_pages_and_uninstall_removes_them(scratch):
    root, paths, _, host, lines = scratch
    prefix = fake_prefix(root)
    venv_pages = prefix / "lib/python3.11/site-packages" / "/".join(manpages.DATA)
    texts = {page: f"{manpages.MARKER}\n.TH the venv's {page}\n" for page in manpages.PAGES}
    for page, text in texts.items():
        (venv_pages / page).write_text(text)

    manpages.install(man_sources(prefix), paths.man_dir, host.note, write_atomic)
    assert man_pages(paths) == texts
    for page in manpages.PAGES:
        dest = manpages.destination(paths.man_dir, page)
        assert stat.S_IMODE(dest.stat().st_mode) == 0o644
        assert stat.S_IMODE(dest.parent.stat().st_mode) == 0o755
        assert not [p for p in dest.parent.iterdir() if p.name.startswith(".")]  # no temporary left
    assert lines == [f"hpc-batch-install: wrote the manual pages {', '.join(manpages.PAGES)} "
                     f"under {paths.man_dir}"]

    lines.clear()
    manpages.remove(paths.man_dir, host.note)
    assert man_pages(paths) == {}
    assert lines == [f"hpc-batch-install: removed {manpages.destination(paths.man_dir, p)}"
                     for p in manpages.PAGES]
    lines.clear()
    manpages.remove(paths.man_dir, host.note)  # nothing left: nothing said
    assert lines == []


def test_man_pages_fall_back_to_this_package_and_replace_an_older_version(scratch):
    root, paths, _, host, _ = scratch
    old = manpages.destination(paths.man_dir, "dispatch.1")
    old.parent.mkdir(parents=True)
    old.write_text(f"{manpages.MARKER}\n.TH DISPATCH 1 version 0.0.1\n")
    manpages.install(man_sources(root / "no-venv"), paths.man_dir, host.note, write_atomic)
    assert man_pages(paths) == {page: (MAN_SOURCE / page).read_text() for page in manpages.PAGES}


def test_man_pages_not_ours_are_left_alone(scratch):
    root, paths, _, host, lines = scratch
    theirs = manpages.destination(paths.man_dir, "dispatch.1")
    theirs.parent.mkdir(parents=True)
    theirs.write_text(".TH DISPATCH 1 \"another dispatch\"\n")
    # A link to a page with our marker, a marker below the first line, a directory: none is ours.
    linked = manpages.destination(paths.man_dir, "hpc-batchd.8")
    linked.parent.mkdir(parents=True)
    target = root / "elsewhere.8"
    target.write_text(f"{manpages.MARKER}\n")
    linked.symlink_to(target)
    late = manpages.destination(paths.man_dir, "hpc-batch-install.8")
    late.write_text(f".TH X 8\n{manpages.MARKER}\n")
    manpages.destination(paths.man_dir, "hpc-batch-shepherd.8").mkdir()

    manpages.install(man_sources(fake_prefix(root)), paths.man_dir, host.note, write_atomic)
    assert theirs.read_text() == ".TH DISPATCH 1 \"another dispatch\"\n"
    assert os.readlink(linked) == str(target) and late.read_text() == f".TH X 8\n{manpages.MARKER}\n"
    for page in manpages.PAGES:
        dest = manpages.destination(paths.man_dir, page)
        assert f"hpc-batch-install: left {dest} alone: it was not written by hpc-batch-install" in lines

    lines.clear()
    manpages.remove(paths.man_dir, host.note)
    assert theirs.exists() and linked.is_symlink() and target.exists() and late.exists()
    assert manpages.destination(paths.man_dir, "hpc-batch-shepherd.8").is_dir()
    assert len(lines) == len(manpages.PAGES) and all("alone" in line for line in lines)


def test_a_packaged_page_without_the_marker_is_not_installed(scratch):
    # --uninstall could never tell it from someone else's, so it is not written.
    root, paths, _, host, lines = scratch
    source = root / "man"
    shutil.copytree(MAN_SOURCE, source)
    (source / "dispatch.1").write_text(".TH DISPATCH 1\n")
    (source / "hpc-batchd.8").unlink()
    manpages.install([source], paths.man_dir, host.note, write_atomic)
    assert set(man_pages(paths)) == {"hpc-batch-install.8", "hpc-batch-shepherd.8"}
    assert any("does not start with the line" in line and "dispatch.1 not written" in line for line in lines)
    assert f"hpc-batch-install: no packaged manual page hpc-batchd.8; " \
           f"{manpages.destination(paths.man_dir, 'hpc-batchd.8')} not written" in lines


def test_uninstall_sh_removes_the_same_pages_by_the_same_marker():
    # uninstall.sh works without the venv, so it names the pages itself: hold it to manpages.py.
    text = (REPO / "uninstall.sh").read_text()
    named = set(re.findall(r"/usr/local/share/man/man\d/[\w.-]+", text))
    assert named == {str(manpages.destination(inst.Paths().man_dir, p)) for p in manpages.PAGES}
    assert "installed by hpc-batch-install" in manpages.MARKER and "head -n 1" in text


@pytest.mark.parametrize("flags", [["--no-pip"], ["--uninstall"], ["--purge"]])
def test_nothing_is_done_where_the_debian_package_is_installed(scratch, capsys, flags):
    # dpkg manages that install (its venv, its unit in /lib): a second manager would undo it.
    from hpc_batch.install.debian import MANAGED_BY_PACKAGE
    root, paths, systemd, host, _ = scratch
    paths.deb_wheelhouse.mkdir(parents=True)
    assert inst.main([*flags, "--prefix", str(fake_prefix(root))], host) == 1
    assert capsys.readouterr().err == f"hpc-batch-install: {MANAGED_BY_PACKAGE}\n"
    assert systemd.calls == [] and not paths.unit.exists() and not paths.record.exists()

"""Root mode for many users: identity, privilege drop, admin group, paths, secrets, dev entries."""

import grp
import os
import stat
import subprocess

import pytest
from conftest import ADMIN_GROUP, Daemon, exit_of, wait_for

pytestmark = pytest.mark.timeout(120)


def home_of(pw):
    return pw.pw_dir


def test_job_runs_as_submitter(daemon, users):
    alice = users["alice"]
    job = daemon.submit("sh", "-c", 'id -u; id -G; echo "$HOME $USER"; pwd',
                        user=alice.pw_name, cwd=alice.pw_dir)
    assert exit_of(daemon.wait_finished(job, user=alice.pw_name)) == "0"
    log = os.path.join(alice.pw_dir, f"output.{job}.log")
    st = os.stat(log)
    assert (st.st_uid, st.st_gid) == (alice.pw_uid, alice.pw_gid)
    with open(log) as f:
        uid, gids, who, cwd = f.read().splitlines()
    assert uid == str(alice.pw_uid)
    expected = sorted(set(os.getgrouplist(alice.pw_name, alice.pw_gid)))
    assert sorted(int(g) for g in gids.split()) == expected and 0 not in expected
    assert who == f"{alice.pw_dir} {alice.pw_name}"
    assert cwd == alice.pw_dir


def test_other_users_cannot_see_or_touch(daemon, users):
    alice, bob, admin = (users[k].pw_name for k in ("alice", "bob", "admin"))
    job = daemon.submit("sleep", "60", user=alice, cwd=users["alice"].pw_dir)
    assert job not in daemon.rows(user=bob)
    r = daemon.dispatch("list", "--all", user=bob)
    assert r.returncode == 4 and "admin" in r.stderr
    for verb in ("attach", "kill", "show"):
        # Not found, exactly as a job that does not exist: nothing tells bob it is there.
        r = daemon.dispatch(verb, str(job), user=bob)
        assert r.returncode == 3 and r.stderr == f"dispatch: no such job: {job}\n", r
    assert "queued" not in daemon.rows(user=alice)[job] and job in daemon.rows(user=alice)
    # The admin can list, attach to and kill it.
    assert job in daemon.rows("--all", user=admin)
    p = subprocess.Popen(["runuser", "-u", admin, "--", "env", f"HPC_BATCH_SOCKET={daemon.socket}",
                          os.path.join(os.path.dirname(daemon.command()[0]), "dispatch"), "attach", str(job)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    daemon.ok("kill", str(job), user=admin)
    _, err = p.communicate(timeout=30)
    assert "exit killed" in err
    assert exit_of(daemon.wait_finished(job, user=alice)) == "killed"


def test_list_is_public(daemon_factory, users):
    d = daemon_factory("--list-is-public")
    alice, bob = users["alice"], users["bob"]
    job = d.submit("sleep", "30", user=alice.pw_name, cwd=alice.pw_dir)
    assert job in d.rows("--all", user=bob.pw_name)
    r = d.dispatch("kill", str(job), user=bob.pw_name)
    assert r.returncode == 4 and "belongs to another user" in r.stderr
    d.ok("kill", str(job), user=alice.pw_name)


def test_unwritable_directory_refused_even_though_root_could(daemon, users, scratch):
    alice = users["alice"]
    rootdir = os.path.join(scratch, "root-only")
    os.mkdir(rootdir, 0o755)
    r = daemon.dispatch("new", "--", "true", user=alice.pw_name, cwd=rootdir)
    assert r.returncode == 1 and "permission denied" in r.stderr
    r = daemon.dispatch("new", "--output", rootdir, "--", "true", user=alice.pw_name, cwd=alice.pw_dir)
    assert r.returncode == 1 and rootdir in r.stderr
    assert daemon.rows("--all", "--finished") == {}


def _shared_dir(scratch):
    d = os.path.join(scratch, "shared")
    os.mkdir(d)
    os.chmod(d, 0o1777)
    return d


def test_planted_symlink_refused_at_submit(daemon, users, scratch):
    alice, bob = users["alice"], users["bob"]
    target = os.path.join(scratch, "root-file")
    with open(target, "w") as f:
        f.write("precious\n")
    shared = _shared_dir(scratch)
    link = os.path.join(shared, "run.log")
    subprocess.run(["runuser", "-u", bob.pw_name, "--", "ln", "-s", target, link], check=True)
    r = daemon.dispatch("new", "--output", link, "--", "echo", "pwned", user=alice.pw_name, cwd=alice.pw_dir)
    assert r.returncode == 1 and "symbolic link" in r.stderr
    with open(target) as f:
        assert f.read() == "precious\n"


def test_symlink_planted_after_submit_is_not_followed(daemon, users, scratch):
    alice, bob = users["alice"], users["bob"]
    target = os.path.join(scratch, "root-file")
    with open(target, "w") as f:
        f.write("precious\n")
    shared = _shared_dir(scratch)
    dest = os.path.join(shared, "late.log")
    flag = os.path.join(shared, "go")
    job = daemon.submit("sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; echo pwned",
                        flags=("--output", dest), user=alice.pw_name, cwd=alice.pw_dir)
    subprocess.run(["runuser", "-u", bob.pw_name, "--", "ln", "-s", target, dest], check=True)
    subprocess.run(["runuser", "-u", alice.pw_name, "--", "touch", flag], check=True)
    row = daemon.wait_finished(job, user=alice.pw_name)
    with open(target) as f:
        assert f.read() == "precious\n"
    assert "output not delivered" in row
    kept = os.path.join(daemon.state_dir, "jobs", str(job), "output")
    with open(kept) as f:
        assert f.read() == "pwned\n"


def test_env_secret_never_readable_by_others(daemon, users, scratch):
    alice, bob = users["alice"], users["bob"]
    secret = "hunter2-" + os.urandom(4).hex()
    flag = os.path.join(scratch, "go")
    # Queue it behind a blocker so the secret sits in the state dir for a while.
    d = daemon
    job = d.submit("sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; echo done", flags=("--env",),
                   env={"MY_SECRET": secret}, user=alice.pw_name, cwd=alice.pw_dir)

    def bob_can_find_secret():
        r = subprocess.run(["runuser", "-u", bob.pw_name, "--", "grep", "-rs", secret, d.state_dir, d.dev_dir,
                            "/proc/self/environ"], capture_output=True, text=True)
        return secret in r.stdout

    assert not bob_can_find_secret()
    d.wait_running(job, user=alice.pw_name)
    status = os.path.join(d.state_dir, "jobs", str(job), "status.json")
    wait_for(lambda: os.path.exists(status), what="shepherd status")
    import json
    with open(status) as f:
        job_pid = json.load(f)["job_pid"]
    r = subprocess.run(["runuser", "-u", bob.pw_name, "--", "cat", f"/proc/{job_pid}/environ"],
                       capture_output=True)
    assert secret.encode() not in r.stdout
    assert not bob_can_find_secret()
    # Once started the secret is in no file at all.
    r = subprocess.run(["grep", "-rl", secret, d.state_dir, d.dev_dir], capture_output=True, text=True)
    assert r.stdout == ""
    open(flag, "w").close()
    d.wait_finished(job, user=alice.pw_name)


@pytest.mark.parametrize("public", [False, True])
def test_dev_dir_entry_owner_group_mode(daemon_factory, users, public):
    daemon = daemon_factory(*(("--list-is-public",) if public else ()))
    alice = users["alice"]
    job = daemon.submit("sleep", "30", user=alice.pw_name, cwd=alice.pw_dir)
    entry = os.path.join(daemon.dev_dir, "jobs", str(job))
    admin_gid = grp.getgrnam(ADMIN_GROUP).gr_gid
    lst = os.lstat(entry)
    # The submitter owns it only where everyone may list jobs anyway: otherwise an id says nobody's name.
    assert stat.S_ISLNK(lst.st_mode) and (lst.st_uid, lst.st_gid) == (alice.pw_uid if public else 0, admin_gid)
    # The files stay root's (a user could lease, chmod or truncate a file of
    # their own under the daemon); an ACL lets the submitter read them.
    for name in ("info.json", "output"):
        st = os.stat(os.path.join(entry, name))
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, admin_gid, 0o640), name
        assert os.getxattr(os.path.join(entry, name), "system.posix_acl_access"), name
        # Alice reads her own entry; bob cannot.
        r = subprocess.run(["runuser", "-u", alice.pw_name, "--", "cat", os.path.join(entry, name)],
                           capture_output=True, text=True)
        assert r.returncode == 0, (name, r.stderr)
        if name == "info.json":
            assert '"sleep 30"' in r.stdout and "env" not in r.stdout.lower().replace("environment", "")
        r = subprocess.run(["runuser", "-u", users["bob"].pw_name, "--", "cat", os.path.join(entry, name)],
                           capture_output=True, text=True)
        assert r.returncode != 0, name
    daemon.ok("kill", str(job))
    wait_for(lambda: not os.path.lexists(entry), what="entry removed")


def test_socket_world_reachable_state_dir_not_readable(daemon, users):
    assert os.stat(daemon.socket).st_mode & 0o777 == 0o666
    r = subprocess.run(["runuser", "-u", users["bob"].pw_name, "--", "ls", daemon.state_dir],
                       capture_output=True, text=True)
    assert r.returncode != 0


def test_missing_admin_group_refused_with_suggestions(scratch, users):
    d = Daemon(scratch, ("--admin-group", "no-such-group-hpcb"))
    r = subprocess.run(d.command(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 78
    assert "no-such-group-hpcb" in r.stderr and "groups that exist here" in r.stderr


def test_uncreatable_dev_dir_refused(scratch, users):
    d = Daemon(scratch, ("--dev-dir", "/proc/hpcb-nope"))
    r = subprocess.run(d.command(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 78 and "--no-dev-dir" in r.stderr


def test_no_dev_dir_runs_without_entries(daemon_factory, users):
    d = daemon_factory("--no-dev-dir")
    job = d.submit("true")
    assert exit_of(d.wait_finished(job)) == "0"
    assert not os.path.exists(d.dev_dir)

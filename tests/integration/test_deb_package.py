"""scripts/build-deb's package: lintian's verdict, its files, its version, and its postinst's venv.

The package is built as a user builds it, from this tree, twice: as it is and
with ``--local 1`` (a newer version of the same tree). What runs on a real
systemd machine (dpkg -i, upgrade, remove, purge) is tests/system/test_deb_guest.py;
here, the postinst's Python half makes its venvs under a scratch prefix.
"""

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from ci_host import require

from hpc_batch.install import debian

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD_DEB = os.path.join(ROOT, "scripts", "build-deb")
pytestmark = pytest.mark.timeout(900)


def _build(out, *flags):
    r = subprocess.run([BUILD_DEB, "--python", sys.executable, "--out", str(out), *flags],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    (deb,) = [line for line in r.stdout.splitlines() if line.endswith(".deb")]
    return deb


def _field(deb, name):
    return subprocess.run(["dpkg-deb", "-f", deb, name], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    require(shutil.which("dpkg-deb") is not None, "dpkg-deb (Debian's dpkg)")
    return {"first": _build(tmp_path_factory.mktemp("deb")),
            "next": _build(tmp_path_factory.mktemp("deb-next"), "--local", "1")}


@pytest.fixture(scope="module")
def unpacked(debs, tmp_path_factory):
    """Each package's files and control files, as dpkg-deb unpacks them."""
    out = {}
    for key, deb in debs.items():
        where = tmp_path_factory.mktemp("unpacked-" + key)
        subprocess.run(["dpkg-deb", "-x", deb, str(where / "root")], check=True)
        subprocess.run(["dpkg-deb", "-e", deb, str(where / "DEBIAN")], check=True)
        out[key] = where
    return out


def test_lintian_reports_nothing(debs):
    require(shutil.which("lintian") is not None, "lintian (scripts/install-host-deps --deb)")
    r = subprocess.run(["lintian", "--pedantic", debs["first"]], capture_output=True, text=True, timeout=600)
    # Overridden tags (dist/debian/lintian-overrides, each with its reason) are not reported.
    tags = [line for line in r.stdout.splitlines() if re.match(r"[EWIPX]: ", line)]
    assert r.returncode == 0 and not tags, r.stdout + r.stderr


def test_name_and_version_come_from_the_package_metadata(debs):
    from hpc_batch import __version__
    assert os.path.basename(debs["first"]) == f"hpc-batch_{debian.debian_version(__version__)}_all.deb"
    assert _field(debs["first"], "Version") == debian.debian_version(__version__)
    assert _field(debs["next"], "Version") == debian.debian_version(__version__ + "+1")
    r = subprocess.run(["dpkg", "--compare-versions", _field(debs["next"], "Version"), "gt",
                        _field(debs["first"], "Version")])
    assert r.returncode == 0
    assert _field(debs["first"], "Architecture") == "all"


def test_the_files_are_in_debians_places(unpacked):
    root = unpacked["first"] / "root"
    for path in (debian.UNIT_PATH, "/usr/share/man/man1/dispatch.1.gz", "/usr/share/man/man8/hpc-batchd.8.gz",
                 "/usr/share/man/man8/hpc-batch-shepherd.8.gz", "/usr/share/bash-completion/completions/dispatch",
                 "/usr/share/zsh/vendor-completions/_dispatch", f"{debian.DOC_DIR}/copyright",
                 f"{debian.DOC_DIR}/changelog.gz", debian.LINTIAN_OVERRIDES):
        assert (root / path.lstrip("/")).is_file(), path
    for name in debian.LINKED:
        assert os.readlink(root / "usr" / "bin" / name) == f"/opt/hpc-batch/bin/{name}"
    # dpkg owns no file under /opt (the venv is the postinst's) nor in /etc (no conffiles to merge).
    assert not (root / "opt").exists() and not (root / "etc").exists()
    unit = (root / debian.UNIT_PATH.lstrip("/")).read_text()
    assert "ExecStart=/usr/bin/hpc-batchd --admin-group sudo" in unit.splitlines()
    wheels = sorted(p.name for p in (root / debian.WHEELHOUSE.lstrip("/")).iterdir())
    assert [w.split("-")[0] for w in wheels] == ["docopt_ng", "hpc_batch"], wheels
    assert all(debian.is_pure_wheel(w) for w in wheels)


def test_the_postinst_installs_the_wheel_the_package_carries(unpacked):
    for where in unpacked.values():
        postinst = (where / "DEBIAN" / "postinst").read_text()
        (wheel,) = re.findall(r"^\s+(/\S+\.whl)$", postinst, re.M)
        assert (where / "root" / wheel.lstrip("/")).is_file(), wheel
        assert "@" not in postinst.replace('"$@"', "")
    postrm = (unpacked["first"] / "DEBIAN" / "postrm").read_text()
    with open(os.path.join(ROOT, "uninstall.sh")) as f:
        assert f.read().rstrip("\n") in postrm


def test_the_maintainer_scripts_pass_shellcheck(unpacked):
    require(shutil.which("shellcheck") is not None, "shellcheck (scripts/install-host-deps --host)")
    scripts = [str(unpacked["first"] / "DEBIAN" / name) for name in debian.SCRIPTS]
    r = subprocess.run(["shellcheck", "-s", "sh", *scripts], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


@pytest.mark.parametrize(("flags", "needle"), [
    (["--local", "A B"], "--local 'A B': use lower-case letters and digits"),
    (["--local"], "--local: expected one argument"),
    (["--python"], "--python needs a value"),
    (["--out"], "--out: expected one argument"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_a_bad_argument_is_refused_before_anything_is_built(flags, needle, tmp_path):
    # --python first: no throwaway venv is made for a refusal.
    r = subprocess.run([BUILD_DEB, "--python", sys.executable, *flags], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and r.stdout == "" and not list(tmp_path.iterdir())


def test_a_python_without_pip_is_refused(tmp_path):
    r = subprocess.run([BUILD_DEB, "--python", "/bin/false", "--out", str(tmp_path)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1 and r.stderr.strip() == ("build-deb: --python /bin/false: it cannot run pip; "
                                                      "name a python that can (a venv's)"), r.stderr
    assert not list(tmp_path.iterdir())


def _configure(wheel, prefix):
    # The postinst's Python half, run as the postinst runs it (from the wheel), on a scratch prefix.
    code = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
            "from hpc_batch.install.debhooks import configure; configure(Path(sys.argv[1]), Path(sys.argv[2]))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_INDEX_URL"] = "http://127.0.0.1:9/simple"   # no index: the wheels the package carries only
    r = subprocess.run(["python3", "-I", "-c", code, str(wheel), str(prefix)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _version_of(prefix):
    r = subprocess.run([str(prefix / "bin" / "dispatch"), "--version"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[-1]


def test_postinst_makes_a_venv_per_version_and_switches_the_prefix(unpacked, tmp_path):
    require(os.geteuid() == 0, "root (the venvs' directories must be root's, as under /opt)")
    os.chmod(tmp_path, 0o755)
    prefix = tmp_path / "hpc-batch"
    wheel = {}
    for key, where in unpacked.items():
        house = where / "root" / debian.WHEELHOUSE.lstrip("/")
        (wheel[key],) = house.glob("hpc_batch-*.whl")

    out = _configure(wheel["first"], prefix)
    assert prefix.is_symlink() and os.readlink(prefix).startswith("hpc-batch.versions/"), out
    first = prefix.resolve()
    with zipfile.ZipFile(wheel["first"]) as z:
        version = re.search(r'__version__ = "([^"]+)"', z.read("hpc_batch/__init__.py").decode()).group(1)
    assert _version_of(prefix) == version
    # dispatch starts without the site import, as after hpc-batch-install.
    with open(prefix / "bin" / "dispatch") as f:
        assert f.readline() == f"#!{first}/bin/python -S\n"

    out = _configure(wheel["next"], prefix)
    assert prefix.resolve() != first, out
    assert _version_of(prefix) == version + "+1"
    assert first.is_dir(), "the replaced venv is kept (a rollback, and its shepherds still run from it)"

"""The Debian package's texts (hpc_batch/install/debian.py): version, control, changelog, copyright, scripts."""

import os
import shutil
import subprocess

import pytest
from ci_host import require

from hpc_batch.defaults import ADMIN_GROUP_CANDIDATES
from hpc_batch.install import debian, manpages
from hpc_batch.install.steps import ENTRY_POINTS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(*parts):
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


@pytest.mark.parametrize(("pep440", "deb"), [
    ("0.1.0", "0.1.0"),
    ("0.2.0rc1", "0.2.0~rc1"),
    ("0.2.0a3", "0.2.0~a3"),
    ("0.2.0.dev4", "0.2.0~~dev4"),
    ("0.2.0rc1.dev2", "0.2.0~rc1~dev2"),
    ("0.2.0.post1", "0.2.0.post1"),
    ("0.2.0.post1.dev1", "0.2.0.post1~dev1"),
    ("0.1.0+1", "0.1.0+1"),
    ("0.1.0+ubuntu.2", "0.1.0+ubuntu.2"),
    ("1!2.0", "1:2.0"),
])
def test_debian_version_of_each_pep440_form(pep440, deb):
    assert debian.debian_version(pep440) == deb


@pytest.mark.parametrize("bad", ["", "v0.1.0", "0.1.0-1", "0.1.0+", "0.1.0 ", "0.1.0.RC1", "latest"])
def test_a_version_that_is_not_normalized_pep440_is_refused(bad):
    with pytest.raises(ValueError, match="not a normalized PEP 440 version"):
        debian.debian_version(bad)


def test_debian_orders_the_versions_as_pip_does():
    require(shutil.which("dpkg") is not None, "dpkg (Debian's, to compare versions)")
    # Ascending in PEP 440's order.
    ordered = ["0.2.0.dev1", "0.2.0a1", "0.2.0b1", "0.2.0rc1.dev1", "0.2.0rc1", "0.2.0", "0.2.0+1",
               "0.2.0+1.1", "0.2.0+2", "0.2.0.post1.dev1", "0.2.0.post1", "0.2.1", "1!0.1"]
    for low, high in zip(ordered, ordered[1:]):
        r = subprocess.run(["dpkg", "--compare-versions", debian.debian_version(low), "lt",
                            debian.debian_version(high)])
        assert r.returncode == 0, (low, high)


def test_with_local_adds_a_local_part():
    assert debian.with_local("0.1.0", "1") == "0.1.0+1"
    assert debian.with_local("0.1.0+1", "2") == "0.1.0+1.2"
    for bad in ("", "A", "1 2", "-1", "1..2", "ü"):
        with pytest.raises(ValueError, match="--local"):
            debian.with_local("0.1.0", bad)


def test_only_a_wheel_for_any_python3_and_any_machine_is_pure():
    assert debian.is_pure_wheel("hpc_batch-0.1.0-py3-none-any.whl")
    assert debian.is_pure_wheel("docopt_ng-0.9.0-py2.py3-none-any.whl")
    assert debian.is_pure_wheel("hpc_batch-0.1.0+1-py3-none-any.whl")
    assert not debian.is_pure_wheel("psutil-5.9.0-cp311-cp311-manylinux_2_17_x86_64.whl")
    assert not debian.is_pure_wheel("x-1.0-py2-none-any.whl")
    assert not debian.is_pure_wheel("x-1.0.tar.gz")


def test_maintainer_comes_from_debian_variables_else_the_default():
    assert debian.maintainer({}) == (f"{debian.DEFAULT_MAINTAINER_NAME} "
                                     f"<{debian.DEFAULT_MAINTAINER_EMAIL}>")
    assert debian.maintainer({"DEBFULLNAME": "A B", "DEBEMAIL": "a@b.example"}) == "A B <a@b.example>"
    assert debian.maintainer({"DEBEMAIL": "C D <c@d.example>"}) == "C D <c@d.example>"


def test_control_names_the_package_and_what_it_needs():
    text = debian.control("0.2.0rc1", 587, "A B <a@b.example>")
    fields = dict(line.split(": ", 1) for line in text.splitlines() if not line.startswith(" "))
    assert fields["Package"] == "hpc-batch"
    assert fields["Version"] == "0.2.0~rc1"
    assert fields["Architecture"] == "all"
    assert fields["Installed-Size"] == "587"
    assert fields["Maintainer"] == "A B <a@b.example>"
    assert "python3 (>= 3.10)" in fields["Depends"] and "python3-venv" in fields["Depends"]
    # Every line of the long description is indented, and none is longer than 80 columns.
    assert all(len(line) <= 80 for line in text.splitlines())
    assert text.endswith("\n") and "\n\n" not in text


def test_changelog_is_one_entry_in_debians_format():
    text = debian.changelog("0.1.0+1", "A B <a@b.example>", "Thu, 04 Dec 2025 16:00:00 +0000")
    lines = text.splitlines()
    assert lines[0] == "hpc-batch (0.1.0+1) unstable; urgency=medium"
    assert lines[-1] == " -- A B <a@b.example>  Thu, 04 Dec 2025 16:00:00 +0000"
    assert all(len(line) <= 80 for line in lines)


def test_copyright_carries_the_license_text_with_blank_lines_as_dots():
    text = debian.copyright_file("GNU AFFERO\n\nVersion 3\n")
    assert text.startswith("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n")
    assert text.endswith("License: AGPL-3.0-or-later\n GNU AFFERO\n .\n Version 3\n")


def test_the_packaged_unit_runs_the_linked_daemon_with_debians_admin_group():
    unit = debian.unit(_read("dist", "systemd", "hpc-batch.service"))
    assert f"ExecStart={debian.BIN_DIR}/hpc-batchd --admin-group {debian.ADMIN_GROUP}" in unit.splitlines()
    assert "@" not in unit.replace("$MAINPID", "")
    assert "hpc-batch-install on every" not in unit


def test_the_packages_choices_are_among_the_installers():
    assert debian.ADMIN_GROUP in ADMIN_GROUP_CANDIDATES
    assert set(debian.LINKED) < set(ENTRY_POINTS) and "hpc-batch-install" not in debian.LINKED
    assert set(debian.MAN_PAGES) < set(manpages.PAGES)


def test_script_fills_placeholders_and_refuses_one_left():
    assert debian.script("#!/bin/sh\necho @A@ @B@\n", {"A": "1", "B": "2"}) == "#!/bin/sh\necho 1 2\n"
    with pytest.raises(ValueError, match="@B@"):
        debian.script("echo @A@ @B@\n", {"A": "1"})


def test_postrm_embeds_uninstall_sh_as_a_function():
    values = {"PREFIX": "/opt/hpc-batch", "SERVICE": "hpc-batch", "STATE_DIR": "/var/lib/hpc-batch"}
    template = _read("dist", "debian", "postrm")
    with pytest.raises(ValueError, match="uninstall.sh"):
        debian.script(template, values)
    uninstall_sh = _read("uninstall.sh")
    text = debian.script(template, values, uninstall_sh)
    assert debian.PURGE_PLACEHOLDER not in text
    # Without the postrm's set -e: uninstall.sh goes on past a step with nothing to do, as `sh uninstall.sh` does.
    assert "hpc_batch_purge() (\nset +e\n" + uninstall_sh.rstrip("\n") + "\n)\n" in text
    assert "set -e" not in uninstall_sh
    # The purge branch calls it; the script parses as sh.
    assert text.index("hpc_batch_purge() (") < text.rindex("        hpc_batch_purge\n")
    r = subprocess.run(["sh", "-n"], input=text, text=True, capture_output=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name", debian.SCRIPTS)
def test_every_maintainer_script_fills_to_a_parsing_sh_script(name):
    values = {"WHEEL": "/usr/share/hpc-batch/wheels/hpc_batch-0.1.0-py3-none-any.whl",
              "WHEELHOUSE": debian.WHEELHOUSE, "PREFIX": "/opt/hpc-batch", "SERVICE": "hpc-batch",
              "RECORD": "/etc/hpc-batch/install.json", "STATE_DIR": "/var/lib/hpc-batch"}
    text = debian.script(_read("dist", "debian", name), values, _read("uninstall.sh"))
    assert text.startswith("#!/bin/sh\n") and "\nset -e\n" in text
    r = subprocess.run(["sh", "-n"], input=text, text=True, capture_output=True)
    assert r.returncode == 0, r.stderr


def test_install_sh_refuses_where_the_package_is_as_hpc_batch_install_does():
    text = _read("install.sh")
    assert f"[ ! -d {debian.WHEELHOUSE} ] || die {debian.MANAGED_BY_PACKAGE!r}".replace("'", '"') in text

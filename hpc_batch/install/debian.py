"""The Debian package's names and texts: its version, control file, changelog, copyright, scripts. Pure.

``scripts/build-deb`` (debbuild.py) writes what these return into
``hpc-batch_<version>_all.deb``; the package's postinst runs debhooks.py. The
package carries the project's wheels and makes the venv from them at install
time, so the layout under the prefix is hpc-batch-install's own (versions.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .common import DEFAULT_PREFIX, PACKAGE, SERVICE
from .texts import render_unit

HOMEPAGE = "https://github.com/Yiannis128/hpc-batch"
# Used when $DEBFULLNAME / $DEBEMAIL (Debian's own variables, as dch reads them) are unset:
# the project's author, at the address GitHub gives its owner.
DEFAULT_MAINTAINER_NAME = "Yiannis Charalambous"
DEFAULT_MAINTAINER_EMAIL = "Yiannis128@users.noreply.github.com"

# On every PATH (cron's and sudo's secure_path too), so the package needs no /etc/profile.d snippet.
BIN_DIR = "/usr/bin"
# Linked into BIN_DIR. Not hpc-batch-install: dpkg, not it, manages this install.
LINKED = ("dispatch", "hpc-batchd", "hpc-batch-shepherd")
MAN_PAGES = ("dispatch.1", "hpc-batchd.8", "hpc-batch-shepherd.8")
# Debian's base-passwd always has this group (gid 27); a drop-in changes it.
ADMIN_GROUP = "sudo"
WHEELHOUSE = "/usr/share/hpc-batch/wheels"
UNIT_PATH = f"/lib/systemd/system/{SERVICE}.service"
DOC_DIR = f"/usr/share/doc/{PACKAGE}"
LINTIAN_OVERRIDES = f"/usr/share/lintian/overrides/{PACKAGE}"
# python3-venv: ensurepip, for the venv postinst makes; the wheels need Python >= 3.10.
DEPENDS = "python3 (>= 3.10), python3-venv"
SECTION = "admin"

# What install.sh and hpc-batch-install say, and do nothing, where the package is installed.
MANAGED_BY_PACKAGE = (f"the Debian package {PACKAGE} manages hpc-batch on this machine; upgrade it with a "
                      f"newer package (sudo apt install ./{PACKAGE}_<version>_all.deb), or remove it first "
                      f"(sudo apt remove {PACKAGE} keeps queued jobs and history)")

SCRIPTS = ("preinst", "postinst", "prerm", "postrm")
# The line of the postrm template that uninstall.sh takes the place of.
PURGE_PLACEHOLDER = "@UNINSTALL_SH@"
# uninstall.sh runs without -e (as `sh uninstall.sh` does), so that a step that finds nothing to do
# (rmdir of a directory already gone) does not stop the rest; the postrm's own set -e stays outside.
PURGE_PREAMBLE = "set +e\n"

_PLACEHOLDER = re.compile(r"@[A-Z][A-Z_]*@")
# A normalized PEP 440 version (what a wheel's metadata holds): epoch, release, pre, post, dev, local.
_PEP440 = re.compile(r"^(?:(\d+)!)?(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.post(\d+))?(?:\.dev(\d+))?"
                     r"(?:\+([a-z0-9]+(?:\.[a-z0-9]+)*))?$")
_LOCAL = re.compile(r"^[a-z0-9]+(?:\.[a-z0-9]+)*$")
_UNIT_HEADER = "Rewritten by hpc-batch-install on every install/upgrade"


def debian_version(version: str) -> str:
    """The Debian version of a normalized PEP 440 ``version``, ordered as pip orders them.

    Pre-releases and dev releases sort before their release (``0.2.0rc1`` is
    ``0.2.0~rc1``, ``0.2.0.dev1`` is ``0.2.0~~dev1``), a post release after
    it, a local part (``0.2.0+1``) after the release and before its post
    release; an epoch ``N!`` is ``N:``.
    """
    found = _PEP440.match(version)
    if not found:
        raise ValueError(f"{version!r} is not a normalized PEP 440 version (e.g. 0.2.0, 0.2.0rc1, "
                         "0.2.0.post1, 0.2.0+1)")
    epoch, release, pre, pre_n, post, dev, local = found.groups()
    text = f"{epoch}:" if epoch else ""
    text += release
    if pre:
        text += f"~{pre}{pre_n}"
    if post:
        text += f".post{post}"
    if dev:
        # A dev release of a final one comes before its pre-releases too: "~~" sorts before "~a".
        text += f"~dev{dev}" if pre or post else f"~~dev{dev}"
    if local:
        text += f"+{local}"
    return text


def with_local(version: str, local: str) -> str:
    """``version`` with ``local`` added to its local part (``0.1.0`` and ``1``: ``0.1.0+1``)."""
    if not _LOCAL.match(local):
        raise ValueError(f"--local {local!r}: use lower-case letters and digits, dot-separated (e.g. 1)")
    return f"{version}.{local}" if "+" in version else f"{version}+{local}"


def is_pure_wheel(name: str) -> bool:
    """Whether a wheel file name says it runs on any Python 3 and any machine (an ``all`` package)."""
    parts = name[:-len(".whl")].split("-") if name.endswith(".whl") else []
    return len(parts) >= 5 and parts[-2:] == ["none", "any"] and "py3" in parts[-3].split(".")


def maintainer(env: Mapping[str, str]) -> str:
    """The Maintainer field: $DEBFULLNAME <$DEBEMAIL>, else the project's default."""
    name = env.get("DEBFULLNAME") or DEFAULT_MAINTAINER_NAME
    email = env.get("DEBEMAIL") or DEFAULT_MAINTAINER_EMAIL
    if "<" in email:   # dch accepts "Name <address>" in DEBEMAIL too
        return email.strip()
    return f"{name} <{email}>"


def control(version: str, installed_kib: int, maint: str) -> str:
    """The DEBIAN/control file of the package."""
    return (
        f"Package: {PACKAGE}\n"
        f"Version: {debian_version(version)}\n"
        "Architecture: all\n"
        f"Maintainer: {maint}\n"
        f"Installed-Size: {installed_kib}\n"
        f"Depends: {DEPENDS}\n"
        f"Section: {SECTION}\n"
        "Priority: optional\n"
        f"Homepage: {HOMEPAGE}\n"
        "Description: single-node batch queue with cgroup and NUMA isolation\n"
        " hpc-batch queues jobs on one shared Linux machine: users submit them with\n"
        " dispatch, and the root daemon hpc-batchd runs each in a cgroup of its own,\n"
        " on whole cores of one NUMA node, with the memory, time and GPUs it asked\n"
        " for, first come first served.\n"
        " .\n"
        f" The program lives in a Python venv under {DEFAULT_PREFIX}, made at install\n"
        " time from the wheels this package carries (no network needed).\n"
    )


def changelog(version: str, maint: str, date: str) -> str:
    """A one-entry Debian changelog (``date`` as RFC 2822) for a package built from a clone."""
    return (
        f"{PACKAGE} ({debian_version(version)}) unstable; urgency=medium\n"
        "\n"
        f"  * hpc-batch {version}, built by scripts/build-deb from a clone.\n"
        "    The project's changes are in its CHANGELOG.md, at\n"
        f"    {HOMEPAGE}\n"
        "\n"
        f" -- {maint}  {date}\n"
    )


def copyright_file(license_text: str) -> str:
    """The machine-readable debian/copyright, with the AGPL's full text (not in common-licenses)."""
    body = "\n".join(f" {line}" if line.strip() else " ." for line in license_text.strip("\n").splitlines())
    return (
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
        f"Upstream-Name: {PACKAGE}\n"
        f"Source: {HOMEPAGE}\n"
        "\n"
        "Files: *\n"
        f"Copyright: {DEFAULT_MAINTAINER_NAME}\n"
        "License: AGPL-3.0-or-later\n"
        "\n"
        "License: AGPL-3.0-or-later\n"
        f"{body}\n"
    )


def unit(template: str) -> str:
    """The packaged unit: the wheel's template filled, as the installer fills it, for BIN_DIR and ADMIN_GROUP."""
    text = render_unit(template, {"BIN_DIR": BIN_DIR, "ADMIN_GROUP": ADMIN_GROUP, "PREFIX": DEFAULT_PREFIX})
    return text.replace(_UNIT_HEADER, f"Replaced by every upgrade of the {PACKAGE} package")


def script(template: str, values: Mapping[str, str], uninstall_sh: str = "") -> str:
    """A maintainer script from its template in dist/debian: ``@KEY@`` filled from ``values``.

    The postrm's PURGE_PLACEHOLDER line becomes a function ``hpc_batch_purge``
    that runs uninstall.sh, whole, in a subshell without ``set -e``: a purge happens after dpkg
    removed the package's files, so only shell is left to do it, and
    uninstall.sh is the project's one way to purge without a venv.
    """
    text = template
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    left = sorted(set(_PLACEHOLDER.findall(text)) - {PURGE_PLACEHOLDER})
    if left:
        raise ValueError(f"unfilled placeholders: {', '.join(left)}")
    lines = text.splitlines(keepends=True)
    if PURGE_PLACEHOLDER + "\n" in lines:
        if not uninstall_sh:
            raise ValueError(f"{PURGE_PLACEHOLDER} needs uninstall.sh's text")
        embedded = ("# uninstall.sh, as the hpc-batch tree has it, run in a subshell.\n"
                    "hpc_batch_purge() (\n" + PURGE_PREAMBLE + uninstall_sh.rstrip("\n") + "\n)\n")
        text = "".join(embedded if line == PURGE_PLACEHOLDER + "\n" else line for line in lines)
    return text

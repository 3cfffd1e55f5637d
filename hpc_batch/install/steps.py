"""The install's steps: the links, unit, snippet, completions, the start."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

# A leaf module with no imports: one list of admin groups for the installer and the daemon.
from hpc_batch.defaults import ADMIN_GROUP_CANDIDATES

from . import manpages
from .choices import FIXED_CHOICES
from .common import FLAGS, PROG, SERVICE, InstallError
from .host import (
    Host,
    completion_files,
    completion_is_ours,
    find_completion,
    find_unit_template,
    group_exists,
    installed_version,
    man_sources,
    write_atomic,
)
from .safety import safe_to_remove
from .texts import COMPLETION_MARKER, is_our_completion, profile_snippet, render_unit

# Linked into the bin dir; the shepherd too, so admins find it with `ps`
# and `command -v` alike. A missing optional one is only a warning.
ENTRY_POINTS = ("dispatch", "hpc-batchd", "hpc-batch-install", "hpc-batch-shepherd")
REQUIRED_ENTRY_POINTS = ("dispatch", "hpc-batchd", "hpc-batch-install")


def plan_links(prefix: Path, bin_dir: Path) -> list[tuple[Path, Path]]:
    """(link, target) pairs to create; refuses to overwrite a file not a link."""
    pairs = []
    for name in ENTRY_POINTS:
        target = prefix / "bin" / name
        if not os.path.lexists(target):
            if name in REQUIRED_ENTRY_POINTS:
                raise InstallError(f"{target} is missing: {prefix} has no working "
                                   f"hpc-batch install; run {PROG} without --no-pip")
            continue
        link = bin_dir / name
        if os.path.lexists(link) and not link.is_symlink():
            raise InstallError(f"{link} exists and is not a link; move it away first")
        pairs.append((link, target))
    return pairs


def make_links(pairs: list[tuple[Path, Path]]) -> None:
    """Point each link at its target, replacing older links in one rename."""
    for link, target in pairs:
        if not link.parent.is_dir():
            link.parent.mkdir(parents=True)
            os.chmod(link.parent, 0o755)  # every user runs dispatch from here
        tmp = link.with_name(f".{link.name}.tmp")
        if os.path.lexists(tmp):
            tmp.unlink()
        os.symlink(target, tmp)
        os.replace(tmp, link)


def remove_links(prefix: Path, bin_dir: Path) -> list[Path]:
    """Remove links in ``bin_dir`` that point into ``prefix``/bin; return them."""
    removed = []
    ours = os.path.normpath(prefix / "bin")
    for name in ENTRY_POINTS:
        link = bin_dir / name
        if link.is_symlink() and os.path.dirname(os.path.normpath(os.readlink(link))) == ours:
            link.unlink()
            removed.append(link)
    if safe_to_remove(str(bin_dir)):
        try:
            bin_dir.rmdir()  # only if we left it empty
        except OSError:
            pass
    return removed


def check_prefix(prefix: Path) -> None:
    """Refuse a prefix that is something other than a venv (or the link to one) and not empty."""
    if (prefix / "bin" / "python").exists() or not os.path.lexists(prefix):
        return
    if prefix.is_symlink() or (prefix.is_dir() and any(prefix.iterdir())) or not prefix.is_dir():
        raise InstallError(f"{prefix} exists and is not a venv; pick another --prefix")


def reexec_argv(prefix: Path, choices: dict, force: bool) -> list[str]:
    """The command line that hands the rest of an install to the new version."""
    argv = [str(prefix / "bin" / PROG), "--no-pip"]
    for key in (*FIXED_CHOICES, "spec"):
        argv += [FLAGS[key], choices[key]]
    if force:
        argv.append("--force")
    return argv


def install(choices: dict, recorded: dict | None, host: Host) -> None:
    """Write links, PATH snippet, unit and record for an installed venv; start it."""
    paths = host.paths
    prefix, bin_dir = Path(choices["prefix"]), Path(choices["bin_dir"])
    if not group_exists(choices["admin_group"]):
        present = [g for g in ADMIN_GROUP_CANDIDATES if group_exists(g)]
        raise InstallError(f"--admin-group {choices['admin_group']} does not exist here"
                           + (f"; try {' or '.join(present)}" if present else ""))
    links = plan_links(prefix, bin_dir)
    template = find_unit_template(prefix)
    try:
        unit = render_unit(template.read_text(), {
            "BIN_DIR": str(bin_dir), "ADMIN_GROUP": choices["admin_group"],
            "PREFIX": str(prefix)})
    except ValueError as exc:
        raise InstallError(f"{template}: {exc}") from exc

    if recorded and recorded.get("bin_dir") and recorded["bin_dir"] != str(bin_dir):
        # --force moved the bin dir: do not leave the old links behind.
        remove_links(Path(recorded.get("prefix", prefix)), Path(recorded["bin_dir"]))
    if recorded and recorded.get("prefix") and recorded["prefix"] != str(prefix):
        host.note(f"the venv at {recorded['prefix']} was left in place; "
                  "delete it when nothing needs it")
    fast_dispatch(prefix, host)
    make_links(links)
    host.note(f"linked {', '.join(link.name for link, _ in links)} into {bin_dir}")
    write_atomic(paths.profile, profile_snippet(str(bin_dir)))
    write_atomic(paths.unit, unit)
    host.note(f"wrote {paths.unit} (admin group {choices['admin_group']})")
    install_completions(prefix, host)
    manpages.install(man_sources(prefix), paths.man_dir, host.note, write_atomic)
    version = installed_version(prefix)
    write_atomic(paths.record, json.dumps(
        {**choices, "version": version, "installed": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        indent=2, sort_keys=True) + "\n")
    os.chmod(paths.record.parent, 0o755)
    start_or_reload(host)
    host.note(f"hpc-batch {version or '(unknown version)'} is installed; new login "
              f"shells have {bin_dir} on PATH")


def fast_dispatch(prefix: Path, host: Host) -> None:
    """The venv's dispatch started without the site import (clientscript.py); a note when it cannot be."""
    from . import clientscript  # not at the top: python -m hpc_batch.install.clientscript runs it too
    script = prefix / "bin" / "dispatch"
    try:
        clientscript.rewrite(script)
    except clientscript.Declined as exc:
        host.note(f"left {script} starting with the site import: {exc}")
    except OSError as exc:
        host.note(f"left {script} starting with the site import: cannot rewrite it ({exc})")


def install_completions(prefix: Path, host: Host) -> None:
    """Write the packaged bash and zsh completion of dispatch (mode 0644).

    A file already there that is not ours is left alone, and so is a shell
    whose packaged file is missing: completion is a convenience, never a
    reason for an install to fail.
    """
    written = []
    for name, shell, dest in completion_files(host.paths):
        source = find_completion(prefix, name)
        try:
            text = source.read_text() if source else ""
        except (OSError, UnicodeDecodeError):
            text = ""
        if source is None:
            host.note(f"no packaged {shell} completion for dispatch ({name}); "
                      f"{dest} not written")
        elif not is_our_completion(text):
            # --uninstall could not tell it from someone else's file.
            host.note(f"{source} lacks the line {COMPLETION_MARKER!r}; {dest} not written")
        elif os.path.lexists(dest) and not completion_is_ours(dest):
            host.note(f"left {dest} alone: it was not written by {PROG}, so {shell} "
                      "completion for dispatch is not installed")
        else:
            try:
                write_atomic(dest, text, 0o644)
            except OSError as exc:  # a read-only /usr, say
                host.note(f"could not write {dest}: {exc.strerror or exc}")
                continue
            written.append(str(dest))
    if written:
        host.note(f"wrote {' and '.join(written)} (shell completion for dispatch)")


def remove_completions(host: Host) -> None:
    """Remove the completion files this installer wrote; leave anyone else's."""
    for _, _, dest in completion_files(host.paths):
        if not os.path.lexists(dest):
            continue
        if completion_is_ours(dest):
            try:
                dest.unlink()
            except OSError as exc:
                host.note(f"could not remove {dest}: {exc.strerror or exc}")
                continue
            host.note(f"removed {dest}")
        else:
            host.note(f"left {dest} alone: it was not written by {PROG}")


def start_or_reload(host: Host) -> None:
    """Reload a running daemon (jobs are re-adopted), or enable and start it."""
    if not host.booted:
        # A chroot or image build: enabling only writes links, which works.
        if host.systemctl("enable", SERVICE) != 0:
            raise InstallError(f"systemd is not running here and `systemctl enable "
                               f"{SERVICE}` failed")
        host.note("systemd is not running here: the unit is enabled and starts at boot")
        return
    if host.systemctl("daemon-reload") != 0:
        raise InstallError("systemctl daemon-reload failed")
    if host.systemctl("is-active", "--quiet", SERVICE) == 0:
        host.note("reloading the running daemon (running jobs are kept)")
        if host.systemctl("reload", SERVICE) != 0:
            raise InstallError(f"systemctl reload {SERVICE} failed; see "
                               f"journalctl -u {SERVICE}")
        return
    host.note("enabling and starting the daemon")
    if host.systemctl("enable", "--now", SERVICE) != 0:
        raise InstallError(f"the daemon did not start; see journalctl -u {SERVICE} "
                           "(exit status 78 is a refusal that names what is missing)")

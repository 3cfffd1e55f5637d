"""The texts the installer writes or reads: the unit, the PATH snippet, completion markers.

Pure: each function turns text into text (or a verdict on it).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from .common import DEFAULT_DEV_DIR, DEFAULT_SOCKET, DEFAULT_STATE_DIR, PROG

PROFILE_MARKER = "# Written by hpc-batch-install"

COMPLETION_MARKER = "# hpc-batch: shell completion for dispatch, installed by hpc-batch-install"
COMPLETION_MARKER_LINES = 3  # the marker is one of a file's first lines

_PLACEHOLDER = re.compile(r"@[A-Z][A-Z_]*@")


def render_unit(template: str, values: dict[str, str]) -> str:
    """Fill ``@KEY@`` placeholders in the unit ``template`` from ``values``.

    A placeholder left unfilled is an error: systemd would take it literally
    and the daemon would fail in a confusing way.
    """
    text = template
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    left = sorted(set(_PLACEHOLDER.findall(text)))
    if left:
        raise ValueError(f"unit template has unfilled placeholders: {', '.join(left)}")
    return text


def profile_snippet(bin_dir: str) -> str:
    """The /etc/profile.d script that appends ``bin_dir`` to PATH once.

    It tests PATH when each login shell starts, so nested login shells and
    a bin dir already on the system PATH do not get a second copy.
    """
    quoted = shlex.quote(bin_dir)
    return (
        f"{PROFILE_MARKER}; removed by {PROG} --uninstall.\n"
        "# Puts the hpc-batch commands (dispatch) on every login shell's PATH.\n"
        'case ":${PATH}:" in\n'
        f"    *:{quoted}:*) ;;\n"
        f'    *) PATH="${{PATH:+${{PATH}}:}}"{quoted}; export PATH ;;\n'
        "esac\n"
    )


def exec_start_argv(unit_texts: Iterable[str]) -> list[str]:
    """The effective ``ExecStart=`` argv of a unit file plus its drop-ins.

    Later files override earlier ones; an empty ``ExecStart=`` resets, as in
    systemd. Continuation lines are joined; the ``-@:+!`` prefixes dropped.
    """
    argv: list[str] = []
    for text in unit_texts:
        for line in text.replace("\\\n", " ").splitlines():
            line = line.strip()
            if not line.startswith("ExecStart="):
                continue
            command = line[len("ExecStart="):].strip().lstrip("-@:+!")
            try:
                argv = shlex.split(command)
            except ValueError:
                argv = command.split()
    return argv


def daemon_dirs(argv: list[str]) -> dict[str, str]:
    """The daemon's socket, state dir and dev dir as ``argv`` sets them."""
    found = {"--socket": DEFAULT_SOCKET, "--state-dir": DEFAULT_STATE_DIR,
             "--dev-dir": DEFAULT_DEV_DIR}
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in found:
            if eq:
                found[name] = value
            elif i + 1 < len(argv):
                found[name] = argv[i + 1]
    return {"socket": found["--socket"], "state_dir": found["--state-dir"],
            "dev_dir": found["--dev-dir"]}


def is_our_completion(head: str) -> bool:
    """Whether a completion file whose text begins with ``head`` is hpc-batch's.

    It is when one of its first lines is COMPLETION_MARKER: the marker, not
    the content, since an upgrade must replace (and --uninstall remove) the
    file an older version wrote.
    """
    return COMPLETION_MARKER in head.splitlines()[:COMPLETION_MARKER_LINES]

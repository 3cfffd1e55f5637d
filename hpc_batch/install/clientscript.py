"""Rewrite the installed ``dispatch`` to start its interpreter without the site import.

The wheel ships ``dispatch`` as a plain script whose first line the installer
points at the installing python (pip writes ``#!/path/to/python`` and drops
any flag on that line). Every run then pays for ``site``: the ``.pth`` files
of site-packages, ``sitecustomize`` and the rest, a good part of a bare
interpreter's start-up and more than the client's own work. Done once, at
install time, this writes the script anew: ``#!PYTHON -S``, with the
directories ``site`` would add for this install written into it, so that the
client starts at the interpreter's floor and still imports the same
``hpc_batch`` and ``docopt``.

hpc-batch-install runs it on its venv; ``scripts/lib/venv.sh`` on the test
venv; after a ``pip install --user`` or a system-wide one, run
``python3 -m hpc_batch.install.clientscript`` with the python that installed
it (a ``pip install`` of a new version writes the plain script back).

It leaves the script alone, saying why, when it cannot be sure the rewritten
one finds the same modules: a first line that is not a plain python (pip's
``/bin/sh`` trampoline for long paths), a path with blanks, or a check run of
the new ``sys.path`` that imports ``hpc_batch`` or ``docopt`` from elsewhere.
The script itself falls back to ``site`` if its imports ever fail (the
install moved), so a stale rewrite is slower, never broken.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

MARK = "# written by hpc_batch.install.clientscript"
SHEBANG_MAX = 127   # what every Linux kernel reads of a #! line (256 since 5.1)

# Prints where hpc_batch and docopt come from, and what site put on sys.path.
_PROBE = ("import json, sys, site, hpc_batch, docopt\n"
          "print(json.dumps({'path': sys.path, 'modules': [hpc_batch.__file__, docopt.__file__],\n"
          "  'user_site': site.getusersitepackages(), 'user_base': site.getuserbase()}))")
# The same imports with -S and the paths to be written into the script.
_CHECK = ("import json, sys\nsys.path += json.loads(sys.argv[1])\nimport hpc_batch, docopt\n"
          "print(json.dumps([hpc_batch.__file__, docopt.__file__]))")

TEMPLATE = '''#!{python} -S
# dispatch, the hpc-batch client. Started without the site import (-S), a good
# part of an interpreter's start-up: the directories site adds for this install
# are put on sys.path below instead (they are where pip put hpc_batch).
{mark}; a pip install
# of hpc-batch writes the plain script back, and running that module again redoes this.
import sys

sys.path += {paths!r}
try:
    from hpc_batch.client.cli import leave, main
except ImportError:   # the install has moved since: let site find it, as the plain script does
    import site

    site.main()
    from hpc_batch.client.cli import leave, main
leave(main())
'''


class Declined(Exception):
    """The script is left as pip wrote it; the message says why."""


def interpreter(script: Path) -> str:
    """The python on *script*'s first line: pip's ``#!PYTHON``, or ours, ``#!PYTHON -S``."""
    with open(script, "rb") as f:
        first = f.readline(4096).decode("utf-8", "replace").rstrip("\n")
    words = first[2:].split() if first.startswith("#!") else []
    if len(words) == 2 and words[1] == "-S":
        words = words[:1]
    if len(words) != 1 or not os.path.isabs(words[0]) or "python" not in os.path.basename(words[0]):
        raise Declined(f"its first line is not a plain python ({first[:80]!r})")
    return words[0]


def site_paths(python: str, script: Path) -> list[str]:
    """What site adds to *python*'s sys.path for *script*'s install, checked to import the same modules.

    Another user's site directory is left out: the installer's own (``~/.local``) is only
    this install's when the script sits under it (``pip install --user``).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([python, *argv], capture_output=True, text=True, cwd="/", env=env, timeout=120)

    with_site = run("-c", _PROBE)
    bare = run("-S", "-c", "import json, sys; print(json.dumps(sys.path))")
    if with_site.returncode != 0 or bare.returncode != 0:
        raise Declined(f"{python} cannot import hpc_batch and docopt: "
                       f"{(with_site.stderr or bare.stderr).strip().splitlines()[-1:]}")
    probe = json.loads(with_site.stdout)
    user = os.path.realpath(script).startswith(os.path.realpath(probe["user_base"]) + os.sep)
    floor = set(json.loads(bare.stdout))
    paths = [p for p in probe["path"] if p and p not in floor and (user or p != probe["user_site"])]
    check = run("-S", "-c", _CHECK, json.dumps(paths))
    if check.returncode != 0 or json.loads(check.stdout) != probe["modules"]:
        raise Declined(f"without site, {python} would not import the same hpc_batch and docopt "
                       f"from {paths}")
    return paths


def render(python: str, paths: list[str]) -> str:
    """The text of the rewritten script."""
    if any(c.isspace() for c in python) or len(f"#!{python} -S") > SHEBANG_MAX:
        raise Declined(f"{python} cannot go on a #! line with a flag (blanks, or longer than "
                       f"{SHEBANG_MAX} characters)")
    return TEMPLATE.format(python=python, paths=paths, mark=MARK)


def rewrite(script: Path) -> str:
    """Rewrite *script* in place (atomically, its mode kept); returns its python. Raises Declined."""
    python = interpreter(script)
    text = render(python, site_paths(python, script))
    with open(script) as f:
        if f.read() == text:
            return python   # written before: a live file is not replaced for nothing
    tmp = script.with_name(f".{script.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())   # on disk before its name is: a power cut leaves the old script or this one
    os.chmod(tmp, os.stat(script).st_mode & 0o7777)
    os.replace(tmp, script)
    return python


def installed_script() -> Path | None:
    """The ``dispatch`` pip installed with this hpc_batch (from its RECORD), or None."""
    from importlib import metadata
    try:
        files = metadata.distribution("hpc-batch").files or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "dispatch" and f.parent.name in ("bin", "Scripts"):
            return Path(os.path.normpath(f.locate()))
    return None


def main(argv: list[str] | None = None) -> int:
    """``python -m hpc_batch.install.clientscript [SCRIPT]``: 0 rewritten or declined (said why on
    stderr), 1 when there is no script or it cannot be written."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0].startswith("-"):
        print("usage: python -m hpc_batch.install.clientscript [PATH-OF-DISPATCH]", file=sys.stderr)
        return 2
    script = Path(args[0]) if args else installed_script()
    if script is None or not script.is_file():
        print(f"clientscript: no dispatch script at {script or '(none installed with this hpc_batch)'}",
              file=sys.stderr)
        return 1
    try:
        rewrite(script)
    except Declined as exc:
        print(f"clientscript: left {script} as it is: {exc}", file=sys.stderr)
    except OSError as exc:
        print(f"clientscript: cannot rewrite {script}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Long-lived processes import at start-up everything they will ever need.

``hpc-batch-install`` upgrades the package under a running daemon and then
reloads it. Until the reload, the old daemon (and its fork server, and every
shepherd that server forks) must not load a file of the new version: an
import inside a function, run for the first time after the upgrade, would mix
old and new code, or fail outright once a module has moved. So:

- no module of the daemon (``hpc_batch/daemon/``), nor the fork server's own,
  has an import inside a function, except those ALLOWED below (with the reason);
- a module they share with a quicker process, where lazy imports keep its
  start-up short (core and wire with ``dispatch``; the shepherd's modules with
  a shepherd exec'd without the server), may keep them only for modules the
  long-lived process has already loaded at start-up, so that such an import
  is a lookup, never a load;
- every module of ``hpc_batch/daemon/`` is loaded at start-up.

What a process loads at start-up is asked of a fresh interpreter that imports
its entry point: ``hpc_batch.daemon.main`` for the daemon; the shepherd's file,
run the way the daemon runs it (``-E -s -S``, its siblings top-level), for
the fork server.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (file, function) -> why it may import there. Keep this short: each entry is a load after start-up.
ALLOWED = {
    ("hpc_batch/daemon/metrics_file.py", "metrics_module"):
        "prometheus_client is an optional extra, loaded only with --metrics-file; check() calls this "
        "while the flags are parsed, so the load still happens at start-up",
    ("shepherd/record/executable.py", "_hash_part"):
        "the standard library's hashlib (not a file of this package, so an upgrade of hpc-batch cannot mix "
        "versions through it), for an executable's hash on a cache miss: at start-up it would map OpenSSL's "
        "libcrypto into the fork server and so into every shepherd's share of memory",
    ("shepherd/process.py", "_ctypes"):
        "the standard library's ctypes (not a file of this package), for a job with --aslr off or --thp off: "
        "at start-up it would map libffi into the fork server, and each shepherd would share its pages",
    ("shepherd/forkserver.py", "_set_cmdline"):
        "the standard library's ctypes, only where /proc/self/mem cannot be written (the name is written "
        "through that file): the same reason as process.py's",
}

# Print what an interpreter has loaded once *entry* ran: {module name: its file}.
LOADED = ("import json, sys\n{entry}\n"
          "print(json.dumps({{n: getattr(m, '__file__', None) for n, m in list(sys.modules.items())}}))")


def _loaded(argv, entry, cwd=ROOT):
    out = subprocess.run([sys.executable, *argv, "-c", LOADED.format(entry=entry)], cwd=cwd,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def _daemon_modules():
    return _loaded([], "import hpc_batch.daemon.main")


def _fork_server_modules():
    # As launcher.ForkServer starts it: the shepherd's directory first on the path, no site.
    shepherd = ROOT / "shepherd"
    return _loaded(["-E", "-s", "-S"], f"sys.path.insert(0, {str(shepherd)!r})\nimport forkserver", cwd=shepherd)


def _ours(modules):
    """{name: Path} of the project's own modules among *modules* (not the standard library's)."""
    out = {}
    for name, file in modules.items():
        if file and file.endswith(".py"):
            path = Path(file).resolve()
            if path.is_relative_to(ROOT) and not path.is_relative_to(ROOT / "tests"):
                out[name] = path
    return out


def _late_imports(path: Path):
    """(function name, line, ast node) of every import inside a function or method of *path*."""
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
            elif isinstance(child, (ast.Import, ast.ImportFrom)) and function is not None:
                found.append((function, child.lineno, child))
            else:
                visit(child, function)

    visit(ast.parse(path.read_text()), None)
    return found


def _targets(node, module: str, path: Path, modules) -> list[str]:
    """The modules an import statement in *module* (file *path*) loads, relative names resolved."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = module if path.name == "__init__.py" else module.rpartition(".")[0]
    if node.level:
        parts = base.split(".") if base else []
        parts = parts[:len(parts) - (node.level - 1)]
        source = ".".join(parts + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    out = [source]
    package = modules.get(source)
    for alias in node.names:   # `from package import module` loads the module too
        if package and package.endswith("__init__.py"):
            where = Path(package).parent
            if (where / f"{alias.name}.py").is_file() or (where / alias.name / "__init__.py").is_file():
                out.append(f"{source}.{alias.name}")
    return out


def _problems(modules, strict) -> list[str]:
    """What in *modules* (an interpreter's sys.modules) could load a file after start-up.

    A module for which *strict* is true may import nothing inside a function
    (ALLOWED aside); any other module of ours may, but only what is loaded already.
    """
    problems = []
    for name, path in sorted(_ours(modules).items()):
        rel = path.relative_to(ROOT).as_posix()
        for function, line, node in _late_imports(path):
            if (rel, function) in ALLOWED:
                continue
            what = f"{rel}:{line} in {function}(): {ast.unparse(node)}"
            if strict(name):
                problems.append(f"{what}: a long-lived process imports at start-up (move it to the top)")
                continue
            missing = [t for t in _targets(node, name, path, modules) if t and t not in modules]
            if missing:
                problems.append(f"{what}: loads {', '.join(missing)} after start-up (import it at start-up, "
                                f"or at the top of that module)")
    return problems


def test_the_daemon_loads_nothing_after_start_up():
    modules = _daemon_modules()
    assert _problems(modules, lambda name: name.startswith("hpc_batch.daemon")) == []


def test_the_daemon_loads_each_of_its_modules_at_start_up():
    modules = _daemon_modules()
    files = sorted((ROOT / "hpc_batch" / "daemon").glob("*.py"))
    assert files
    missing = [f.name for f in files if f.stem != "__main__" and f"hpc_batch.daemon.{f.stem}" not in modules
               and f.stem != "__init__"]
    assert missing == []


def test_the_daemon_does_not_load_the_client():
    # The daemon's start-up is no reason to load the client (and its own lazy imports).
    assert [m for m in _daemon_modules() if m.startswith("hpc_batch.client")] == []


def test_the_fork_server_loads_nothing_after_start_up():
    modules = _fork_server_modules()
    assert "main" in modules and "record" in modules     # the shepherd itself, not just the server
    # The shepherd's modules serve the exec'd shepherd too, which loads only what its job needs:
    # the server loads those at its start (forkserver.py's imports); ctypes aside (ALLOWED).
    assert _problems(modules, lambda name: name == "forkserver") == []


def test_an_import_inside_a_function_is_caught(tmp_path, monkeypatch):
    # The check itself: a daemon module with a late import is reported, an ALLOWED one is not.
    fake = ROOT / "hpc_batch" / "daemon" / "_late_probe.py"
    fake_rel = fake.relative_to(ROOT).as_posix()
    monkeypatch.setattr(Path, "read_text", _reading({fake: "def f():\n    import hpc_batch.psij\n"}))
    monkeypatch.setitem(ALLOWED, (fake_rel, "g"), "test")
    modules = {"hpc_batch.daemon._late_probe": str(fake)}
    problems = _problems(modules, lambda name: True)
    assert len(problems) == 1 and "_late_probe.py:2 in f()" in problems[0]
    problems = _problems(modules, lambda name: False)   # shared module: the target is not loaded
    assert len(problems) == 1 and "loads hpc_batch.psij after start-up" in problems[0]
    assert _problems({**modules, "hpc_batch.psij": None}, lambda name: False) == []


def _reading(files):
    real = Path.read_text

    def read_text(self, *args, **kwargs):
        return files[self] if self in files else real(self, *args, **kwargs)
    return read_text


def test_the_fork_server_keeps_heavy_stdlib_modules_out():
    # Every module the server holds is mapped, and its pages copied on write, by each shepherd:
    # these are large and the shepherd does without them (posix_spawn for nvidia-smi, str methods
    # for its parsing, no typing at run time, its name written through /proc/self/mem rather than
    # ctypes, which maps libffi). Listed without json, which itself loads re.
    shepherd = ROOT / "shepherd"
    code = f"import sys\nsys.path.insert(0, {str(shepherd)!r})\nimport forkserver\nprint(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-E", "-s", "-S", "-c", code], cwd=shepherd,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = set(out.stdout.split())
    assert "main" in loaded and "record" in loaded
    assert {"typing", "re", "subprocess", "threading", "ctypes", "_ctypes"} & loaded == set()

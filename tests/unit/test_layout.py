"""The import contract: each side of the package imports only what its place allows.

hpc_batch/ is laid out by side (docs/architecture.md, "The layout"): core (pure),
wire (client and daemon share it), client, daemon, install, psij, and the shared
leaves at the top (defaults, bounds, usage). shepherd/ is standard library only,
in three parts (shepherd/__init__.py): the base, the record, the supervisor.
This reads every module's imports (lazy ones inside functions too) and checks
them against the rules below; a new edge that breaks one fails here, naming it.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hpc_batch"
SHEPHERD = ROOT / "shepherd"
LEAVES = {"hpc_batch", "hpc_batch.defaults", "hpc_batch.bounds", "hpc_batch.usage"}
SIDES = ("core", "wire", "client", "daemon", "install", "psij")

# side -> the sides it may import (besides itself, the leaves and shepherd's stdlib-only base)
# (the shepherd's parts are checked on their own, below)
ALLOWED = {
    "leaf": set(),
    "core": set(),
    "wire": {"core"},
    "client": {"core", "wire"},
    "daemon": {"core", "wire"},
    "psij": {"core", "wire", "client"},
    "install": set(),
}


# shepherd part -> the parts it may import. "supervisor" is shepherd/ itself, outside the two packages.
SHEPHERD_ALLOWED = {
    "base": {"base"},
    "record": {"base", "record"},
    "supervisor": {"base", "record", "supervisor"},
}

# What hpc_batch imports of shepherd/ besides the base, each named, and the sides that may.
HPC_BATCH_FROM_SHEPHERD = {
    # the record's own rules, which the daemon and dispatch apply to what they are given
    "shepherd.record.verdict": {"client", "daemon"},   # the thresholds' names; the report reads verdicts
    "shepherd.record.figures": {"client"},             # a figure's name, checked as the shepherd checks it
    # the launcher speaks the shepherd's protocols, whose both ends live in one supervisor module each
    "shepherd": {"daemon"},                             # where the shepherd's file is
    "shepherd.control": {"daemon"},
    "shepherd.forkserver": {"daemon"},
}


def _side(module: str) -> str:
    if module in LEAVES:
        return "leaf"
    parts = module.split(".")
    assert parts[0] == "hpc_batch" and parts[1] in SIDES, module
    return parts[1]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(dotted: str) -> bool:
    path = ROOT / dotted.replace(".", "/")
    return path.with_suffix(".py").exists() or path.is_dir()


def _ours(target: str, importer: str) -> str | None:
    """*target* as the project names it, or None for the standard library's.

    A shepherd module run as a file finds its siblings top-level (``import
    control``, ``from base import records``): those are named as the package
    finds them (``shepherd.control``, ``shepherd.base.records``).
    """
    first = target.split(".")[0]
    if first in ("hpc_batch", "shepherd"):
        return target
    if importer.startswith("shepherd") and _is_module(f"shepherd.{first}"):
        return f"shepherd.{target}"
    return None


def _imports(path: Path, name: str | None = None) -> set[str]:
    """Every module or package of ours *path* (module *name*) imports, relative imports resolved."""
    name = name or _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found = _ours(target, name)
            if found is None:
                continue
            for alias in node.names:   # "from hpc_batch.daemon import engine" imports a module
                sub = f"{found}.{alias.name}"
                out.add(sub if _is_module(sub) else found)
        elif isinstance(node, ast.Import):
            out.update(t for t in (_ours(a.name, name) for a in node.names) if t)
    return out


def _part(module: str) -> str:
    """The shepherd's part *module* belongs to: base, record or supervisor."""
    parts = module.split(".")
    assert parts[0] == "shepherd", module
    return parts[1] if len(parts) > 1 and parts[1] in ("base", "record") else "supervisor"


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_module_sits_on_a_side():
    for path in _modules():
        _side(_module_name(path))   # asserts


def test_each_side_imports_only_what_it_may():
    broken = []
    for path in _modules():
        me = _module_name(path)
        side = _side(me)
        for target in _imports(path):
            if target.startswith("shepherd"):
                if _part(target) != "base" and side not in HPC_BATCH_FROM_SHEPHERD.get(target, ()):
                    broken.append(f"{me} ({side}) imports {target} (the shepherd's {_part(target)})")
                continue
            other = _side(target)
            if other in ("leaf", side) or other in ALLOWED[side]:
                continue
            broken.append(f"{me} ({side}) imports {target} ({other})")
    assert not broken, "\n".join(broken)


def test_the_installer_needs_only_the_standard_library_and_the_defaults():
    # It must run when the rest of the package is broken (an upgrade half done).
    for path in (PACKAGE / "install").rglob("*.py"):
        outside = {t for t in _imports(path) if not t.startswith(("hpc_batch.install", "shepherd"))}
        assert outside <= {"hpc_batch", "hpc_batch.defaults"}, (path, outside)


def _shepherd_modules():
    return sorted(p for p in SHEPHERD.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_shepherd_imports_nothing_of_hpc_batch():
    for path in _shepherd_modules():
        names = {n.module or "" for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)}
        names |= {a.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Import)
                  for a in n.names}
        assert not any(n.startswith("hpc_batch") for n in names), path


def test_each_part_of_the_shepherd_imports_only_what_it_may():
    broken = []
    for path in _shepherd_modules():
        me = _module_name(path)
        for target in _imports(path):
            if _part(target) not in SHEPHERD_ALLOWED[_part(me)]:
                broken.append(f"{me} ({_part(me)}) imports {target} ({_part(target)})")
    assert not broken, "\n".join(broken)


def test_each_named_edge_from_hpc_batch_into_the_shepherd_is_used():
    # A name left here after its import went would allow an edge nobody needs.
    used = {t for path in _modules() for t in _imports(path) if t.startswith("shepherd")}
    assert set(HPC_BATCH_FROM_SHEPHERD) <= used


def test_the_checker_sees_a_forbidden_edge(tmp_path):
    # Guards the reader above: a client module importing the engine must be caught.
    bad = tmp_path / "_layout_probe.py"
    bad.write_text("from ..daemon import engine\nfrom hpc_batch.daemon.store import Store\n")
    assert _imports(bad, "hpc_batch.client._layout_probe") == {"hpc_batch.daemon.engine", "hpc_batch.daemon.store"}


def test_the_checker_names_the_shepherds_file_run_imports(tmp_path):
    # Run as a file the supervisor finds its siblings top-level; those are its parts all the same.
    probe = tmp_path / "_layout_probe.py"
    probe.write_text("import control\nfrom base import records\nfrom record import verdict\nimport json\n")
    assert _imports(probe, "shepherd._layout_probe") == {
        "shepherd.control", "shepherd.base.records", "shepherd.record.verdict"}
    assert _part("shepherd.base.records") == "base" and _part("shepherd.record") == "record"
    assert _part("shepherd.control") == _part("shepherd") == "supervisor"


# The rooms store.py split into: the rest of the daemon reaches them through its facade, Store.
STORE_ROOMS = {f"hpc_batch.daemon.{name}" for name in (
    "stateload", "commit", "compaction", "jobcache", "envfiles", "quarantine", "statefiles")}
# room -> the modules outside the store that may import it all the same
STORE_ROOM_USERS = {
    "hpc_batch.daemon.envfiles": {"hpc_batch.daemon.bulks"},   # a bulk submit holds its Shared record
}


def test_the_stores_rooms_are_reached_only_through_the_store():
    broken = []
    for path in _modules():
        me = _module_name(path)
        if me in STORE_ROOMS:
            if "hpc_batch.daemon.store" in _imports(path):
                broken.append(f"{me} imports the store, its own facade")
            continue
        if me == "hpc_batch.daemon.store":
            continue
        for target in _imports(path) & STORE_ROOMS:
            if me not in STORE_ROOM_USERS.get(target, ()):
                broken.append(f"{me} imports {target}, a room of the store: use hpc_batch.daemon.store")
    assert not broken, "\n".join(broken)
    assert all((PACKAGE / "daemon" / (room.rpartition(".")[2] + ".py")).exists() for room in STORE_ROOMS)


# The rooms engine.py split into (docs/architecture.md): Engine composes them, and none reaches back
# into it or into what drives it, so each is read, and tested, alone.
ENGINE_ROOMS = {f"hpc_batch.daemon.{name}" for name in (
    "refusal", "outcome", "launchspec", "admission", "queries", "benchcores",
    "turn", "bulks", "finished", "engineparts", "recovery")}
ENGINE_DRIVERS = {f"hpc_batch.daemon.{name}" for name in ("engine", "server", "handlers", "streams", "main")}
# The pure ones: of the daemon they import only the refusal (the rest is core, wire, the leaves and
# the shepherd's base); the engine reads the files and the clock for them.
ENGINE_PURE_ROOMS = {f"hpc_batch.daemon.{name}" for name in ("refusal", "outcome", "launchspec", "admission")}


def test_the_engines_rooms_never_reach_back_into_the_engine():
    broken = []
    for room in sorted(ENGINE_ROOMS):
        path = PACKAGE / "daemon" / (room.rpartition(".")[2] + ".py")
        targets = _imports(path)
        broken += [f"{room} imports {t}, which drives it" for t in sorted(targets & ENGINE_DRIVERS)]
        if room in ENGINE_PURE_ROOMS:
            broken += [f"{room} (pure) imports {t}" for t in sorted(targets)
                       if t.startswith("hpc_batch.daemon") and t != "hpc_batch.daemon.refusal"]
    assert not broken, "\n".join(broken)


# The loop's one direction (docs/architecture.md): the server drives the engine and streams; the engine
# tells the loop through hooks built before both; a connection and the hooks know neither side.
LOOP_LEAVES = {f"hpc_batch.daemon.{name}": {"hpc_batch.daemon.access"} for name in ("conn", "hooks")}


def test_the_loop_runs_one_way():
    broken = []
    for room, may in sorted(LOOP_LEAVES.items()):
        path = PACKAGE / "daemon" / (room.rpartition(".")[2] + ".py")
        broken += [f"{room} imports {t}" for t in sorted(_imports(path))
                   if t.startswith("hpc_batch.daemon") and t not in may]
    for room in ("engine", "streams", "handlers"):   # driven by the server: none imports it
        if "hpc_batch.daemon.server" in _imports(PACKAGE / "daemon" / f"{room}.py"):
            broken.append(f"hpc_batch.daemon.{room} imports the server that drives it")
    if "hpc_batch.daemon.streams" in _imports(PACKAGE / "daemon" / "engine.py"):
        broken.append("the engine imports streams (it tells them of job events through its hooks)")
    assert not broken, "\n".join(broken)


def test_benchmark_modes_machine_side_stands_below_the_engine():
    """daemon/benchmode/ changes the machine for benchmark jobs; of the daemon it may use only itself
    and the cgroup helpers, so the engine's rooms call it and never the other way round."""
    folder = PACKAGE / "daemon" / "benchmode"
    allowed = {"hpc_batch.daemon", "hpc_batch.daemon.cgroups"}
    broken = []
    for path in sorted(folder.glob("*.py")):
        for target in sorted(_imports(path)):
            if (target.startswith("hpc_batch.daemon") and not target.startswith("hpc_batch.daemon.benchmode")
                    and target not in allowed):
                broken.append(f"{_module_name(path)} imports {target}")
    assert len(list(folder.glob("*.py"))) > 1 and not broken, broken


# The rooms resources.py split into: each stands on the model, and the model knows neither.
RESOURCE_ROOMS = {f"hpc_batch.core.{name}" for name in ("allocator", "requestcheck")}


def test_the_resource_model_stands_below_its_rooms():
    model = PACKAGE / "core" / "resources.py"
    assert not _imports(model) & RESOURCE_ROOMS, "hpc_batch.core.resources imports a room built on it"
    for room in sorted(RESOURCE_ROOMS):
        assert "hpc_batch.core.resources" in _imports(PACKAGE / "core" / (room.rpartition(".")[2] + ".py")), room

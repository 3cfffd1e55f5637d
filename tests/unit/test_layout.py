"""The import contract: each side of the package imports only what its place allows.

hpc_batch/ is laid out by side (docs/architecture.md, "The layout"): core (pure),
wire (client and daemon share it), client, daemon, install, psij, and the shared
leaves at the top (defaults, bounds, usage). shepherd/ is standard library only.
This reads every module's imports (lazy ones inside functions too) and checks
them against the rules below; a new edge that breaks one fails here, naming it.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hpc_batch"
LEAVES = {"hpc_batch", "hpc_batch.defaults", "hpc_batch.bounds", "hpc_batch.usage"}
SIDES = ("core", "wire", "client", "daemon", "install", "psij")

# side -> the sides it may import (besides itself, the leaves and shepherd's stdlib-only base)
ALLOWED = {
    "leaf": set(),
    "core": set(),
    "wire": {"core"},
    "client": {"core", "wire"},
    "daemon": {"core", "wire"},
    "psij": {"core", "wire", "client"},
    "install": set(),
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


def _imports(path: Path) -> set[str]:
    """Every hpc_batch module or package *path* imports, relative imports resolved."""
    name = _module_name(path)
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
            if not target.startswith("hpc_batch"):
                continue
            for alias in node.names:   # "from hpc_batch.daemon import engine" imports a module
                sub = f"{target}.{alias.name}"
                out.add(sub if (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists()
                        or (PACKAGE.parent / sub.replace(".", "/")).is_dir() else target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("hpc_batch"))
    return out


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
            other = _side(target)
            if other in ("leaf", side) or other in ALLOWED[side]:
                continue
            broken.append(f"{me} ({side}) imports {target} ({other})")
    assert not broken, "\n".join(broken)


def test_the_installer_needs_only_the_standard_library_and_the_defaults():
    # It must run when the rest of the package is broken (an upgrade half done).
    for path in (PACKAGE / "install").rglob("*.py"):
        outside = {t for t in _imports(path) if not t.startswith("hpc_batch.install")}
        assert outside <= {"hpc_batch", "hpc_batch.defaults"}, (path, outside)


def test_the_shepherd_imports_nothing_of_hpc_batch():
    for path in (ROOT / "shepherd").glob("*.py"):
        names = {n.module or "" for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)}
        names |= {a.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Import)
                  for a in n.names}
        assert not any(n.startswith("hpc_batch") for n in names), path


def test_the_checker_sees_a_forbidden_edge(tmp_path):
    # Guards the reader above: a client module importing the engine must be caught.
    bad = PACKAGE / "client" / "_layout_probe.py"
    bad.write_text("from ..daemon import engine\nfrom hpc_batch.daemon.store import Store\n")
    try:
        assert _imports(bad) == {"hpc_batch.daemon.engine", "hpc_batch.daemon.store"}
    finally:
        bad.unlink()

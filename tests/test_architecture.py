"""The import graph: one-way layers, no circles (function-level imports count too)."""

from __future__ import annotations

import ast
from pathlib import Path

import ckptfs

PACKAGE = Path(ckptfs.__file__).parent

LAYERS = [
    ["ckptfs.errors", "ckptfs.compiled", "ckptfs.limits", "ckptfs.gc_pause", "ckptfs.cache_dir", "ckptfs.counts",
     "ckptfs.output_files", "ckptfs.write_back", "ckptfs.background"],
    ["ckptfs.sources"],
    ["ckptfs.pickle"],
    ["ckptfs.model"],
    ["ckptfs.formats"],
    ["ckptfs.cache"],
    ["ckptfs.reading"],
    ["ckptfs.writing"],
    ["ckptfs.checkpoint"],
    ["ckptfs.fs", "ckptfs.saving"],
    ["ckptfs.fuse", "ckptfs.fsspec"],
    ["ckptfs.dask"],
    ["ckptfs.cli", "ckptfs.__main__"],
]
"""Bottom first: a module may import its own layer's modules and those of the layers below it."""
FACADE = "ckptfs"
"""``ckptfs/__init__.py``: the Python API, which re-exports from the layers up to the checkpoint."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    """Every ckptfs module ``path`` imports, wherever the import statement is."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: {m for m in _imports(path, name) if m in modules and m != name} for name, path in modules.items()}


def _layer(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS")


def test_every_module_has_a_layer_and_imports_only_downwards() -> None:
    upward = [(m, i) for m, imports in _graph().items() if m != FACADE
              for i in imports if i != FACADE and _layer(i) > _layer(m)]
    assert upward == []


def test_the_import_graph_has_no_circle() -> None:
    graph = _graph()
    for package in {m for m in graph if m != FACADE}:
        graph[package] = graph[package] - {FACADE}
    circles = []
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(trail[trail.index(target):] + [target])
            elif target not in state:
                visit(target, trail + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_no_module_is_over_400_lines() -> None:
    long = {_module_name(p): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}

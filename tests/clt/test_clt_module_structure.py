"""Module structure of the dictionary / RWKV / probing plugins: no import cycles between a
plugin's modules at import time (``TYPE_CHECKING`` and function-local imports aside), and no
module touches another object's private attributes (``obj._x`` with obj not self / cls).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGES = ["mi_clt", "mi_sae", "mi_rwkv", "mi_probing"]


def _modules(package: str) -> dict[str, Path]:
    root = Path(importlib.import_module(package).__file__).parent  # type: ignore[arg-type]
    out = {}
    for p in root.rglob("*.py"):
        rel = p.relative_to(root).with_suffix("")
        parts = [package, *rel.parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _top_level_imports(tree: ast.Module, package: str) -> set[str]:
    """Modules of `package` imported when the module is imported (not under TYPE_CHECKING,
    not inside functions)."""
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) else []:
            if isinstance(sub, ast.ImportFrom) and sub.module and sub.module.startswith(package):
                found.add(sub.module)
                found.update(f"{sub.module}.{a.name}" for a in sub.names)
            elif isinstance(sub, ast.Import):
                found.update(a.name for a in sub.names if a.name.startswith(package))
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_between_a_plugins_modules(package: str) -> None:
    mods = _modules(package)
    graph = {m: {d for d in _top_level_imports(ast.parse(p.read_text()), package)
                 if d in mods and d != m and not m.startswith(d + ".") and d != package}
             for m, p in mods.items() if m != package}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in graph.get(m, ()):
            assert state.get(d) != 1, f"import cycle: {' -> '.join(path + [m, d])}"
            if d not in state:
                visit(d, path + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_touches_another_objects_private_attributes(package: str) -> None:
    """Neither writes (``clt._steering[f] = ...``) nor reads / calls (``sae._reconstruct()``)."""
    bad = []
    for name, path in _modules(package).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                bad.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, bad

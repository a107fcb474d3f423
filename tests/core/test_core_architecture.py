"""The architecture the product promises, measured: ``import mi_core`` loads the kernel only
(at most 4,000 lines, closed under its own imports), the distribution requires only the
kernel's dependencies, the layers hold (import-linter), nothing imports in a circle (grimp,
function-local and type-checking imports included), and no file, function or signature
outgrows the size rules."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNEL_DEPS = {"torch", "pluggy", "safetensors", "huggingface_hub", "tokenizers", "attrs",
               "cattrs"}
RINGS = ("mi_core.interp", "mi_core.tl", "mi_core.viz", "mi_core.scale", "mi_core.util",
         "mi_core.recurrence", "mi_core.gguf", "mi_core.cli", "mi_cli")
PACKAGES = ["mi_core", "mi_cli", "mi_transformer", "mi_rwkv", "mi_ssm", "mi_sae", "mi_clt",
            "mi_probing", "mi_toy"]


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT).stdout


@pytest.fixture(scope="module")
def kernel() -> dict[str, str]:
    """{module name: file} of every mi_core module a fresh ``import mi_core`` loads."""
    code = ("import json, sys, mi_core; print(json.dumps({m: sys.modules[m].__file__ for m in "
            "sys.modules if m == 'mi_core' or m.startswith('mi_core.')}))")
    return json.loads(_fresh(code))


def test_import_mi_core_loads_the_kernel_only_and_at_most_4000_lines(kernel) -> None:
    assert {"mi_core.backend", "mi_core.hooks", "mi_core.interventions", "mi_core.plugins",
            "mi_core.hookspecs", "mi_core.loading", "mi_core.tokenizer", "mi_core.configread",
            "mi_core.capabilities", "mi_core.errors", "mi_core.plugin"} <= set(kernel)
    rings = [m for m in kernel if m.startswith(RINGS)]
    assert not rings, f"import mi_core loaded ring modules {rings}"
    lines = {m: Path(f).read_text(encoding="utf-8").count("\n") for m, f in kernel.items()}
    assert sum(lines.values()) <= 4000, sorted(lines.items(), key=lambda kv: -kv[1])


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in `path`: module level, inside functions and under
    TYPE_CHECKING alike; ``from pkg import name`` yields ``pkg.name`` (a submodule or not)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def test_the_kernel_is_closed_and_imports_only_its_dependencies(kernel) -> None:
    known = set(kernel)
    allowed = KERNEL_DEPS | set(sys.stdlib_module_names) | {"mi_core"}
    bad = []
    for name, file in kernel.items():
        for line, target in _imports(Path(file)):
            top = target.split(".")[0]
            if top == "mi_core":
                parts = target.split(".")
                module = ".".join(parts[:2]) if len(parts) > 1 else "mi_core"
                is_module = (ROOT / "mi_core" / f"{parts[1]}.py").exists() or (
                    ROOT / "mi_core" / parts[1]).is_dir() if len(parts) > 1 else True
                if is_module and module not in known:
                    bad.append(f"{name}:{line} imports {target} (outside the kernel)")
            elif top not in allowed:
                bad.append(f"{name}:{line} imports {target} (not a kernel dependency)")
    assert not bad, "\n".join(bad)


def test_the_distribution_requires_only_the_kernel_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip().lower()
             .replace("-", "_") for d in project["dependencies"]}
    assert names == KERNEL_DEPS
    # rings register exactly as third-party plugins do
    assert project["entry-points"]["mi_core"] == {"tl": "mi_core.tl.plugin",
                                                   "viz": "mi_core.viz.plugin"}
    assert set(project["entry-points"]["mi_cli"]) == {"core", "analysis", "scale"}


def test_the_layer_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--no-cache"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.stdout.count(" KEPT") == 3


def test_no_import_cycle_anywhere_even_inside_functions() -> None:
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False, cache_dir=None)
    index = {m: i for i, m in enumerate(sorted(graph.modules))}
    edges = {m: graph.find_modules_directly_imported_by(m) for m in index}
    cycles = _strongly_connected(edges)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(sorted(c)) for c in cycles)


def _strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative: the components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        {"a", "b", "c"}]
    assert _strongly_connected({"a": {"b"}, "b": set()}) == []


def _sources() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    return [ROOT / t for t in tracked if (ROOT / t).exists()]


def test_no_file_over_800_lines_no_function_over_80_no_wide_positional_signature() -> None:
    bad = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT)
        if text.count("\n") > 800:
            bad.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if node.end_lineno - node.lineno + 1 > 80:
                bad.append(f"{rel}:{node.lineno} {node.name}: "
                           f"{node.end_lineno - node.lineno + 1} lines")
            args = node.args.posonlyargs + node.args.args
            positional = len(args) - (1 if args and args[0].arg in ("self", "cls") else 0)
            if positional > 8 and not node.name.startswith("_"):
                bad.append(f"{rel}:{node.lineno} {node.name}: {positional} positional parameters")
    assert not bad, "\n".join(bad)


def test_mi_model_holds_kernel_behaviour_and_finds_conveniences_through_plugins() -> None:
    import mi_core as mi
    from mi_core.tl import TransformerLensMixin

    assert TransformerLensMixin not in mi.MIModel.__mro__
    own = set(vars(mi.MIModel))
    tl = {"run_with_cache", "run_with_hooks", "W_Q", "process_weights", "to_single_token",
          "test_prompt", "cfg", "norm_centres"}
    assert not own & tl
    # ... and yet they work, class and instance alike, through the TransformerLens ring's plugin
    assert mi.MIModel.run_with_cache is TransformerLensMixin.run_with_cache
    assert "run_with_cache" in dir(mi.MIModel) or hasattr(mi.MIModel, "run_with_cache")


def test_plugins_and_rings_register_through_entry_points_only() -> None:
    import importlib.metadata as md

    groups = {g: {ep.name: ep.value for ep in md.entry_points(group=g)}
              for g in ("mi_core", "mi_cli")}
    assert {"tl", "viz", "transformer", "rwkv", "sae", "clt", "probing"} <= set(groups["mi_core"])
    assert {"core", "analysis", "scale", "probing"} <= set(groups["mi_cli"])


def test_the_cli_parses_without_importing_torch_or_the_kernel() -> None:
    code = ("import sys; from mi_cli.main import build_parser; p = build_parser(); "
            "p.parse_args(['knockout', '--layers', '1-3', '--device', 'cpu']); "
            "print(sorted(m for m in ('torch', 'mi_core', 'numpy') if m in sys.modules))")
    assert _fresh(code).strip() == "[]"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    mi = Path(sys.executable).with_name("mi")
    for argv in (["--help"], ["--version"], ["knockout", "--layers", "x"]):
        proc = subprocess.run([str(mi), *argv], capture_output=True, text=True, env=env)
        assert proc.returncode in (0, 2), proc.stderr

"""Run TransformerLens' own demo notebooks cell by cell, on TransformerLens and on the port, and
compare what each cell shows.

The notebooks' code cells are stored verbatim in ``tests/examples/tl_demos/*.json`` (with the
repository, tag and commit they come from). A :class:`Demo` says what the test changes:

- the port (``side="mi"``) rewrites the import lines only (``transformer_lens`` ->
  ``mi_core.tl``, :func:`port_imports`) and the loading lines (``Demo.loads``);
- the reference (``side="tl"``) replaces the same loading lines by a TransformerLens model
  built on the same weights (the test's ``references``);
- both sides get the same trims (``Demo.trims``: a loop made shorter, each with its reason)
  and skip the same cells (``Demo.skip``: IPython setup, hub downloads, each with its reason).

:func:`run_cells` runs the cells in one namespace per side, as a notebook kernel does: each
cell's printed text, the figures it draws (plotting libraries are replaced by recorders: the
data of every ``imshow`` / ``line`` / ``scatter`` / attention view is a figure), the value of
its last expression and the kind of error it raises are recorded. :func:`compare` checks them:
text equal once numbers are set aside and class paths shortened, numbers equal to 1e-4
relative (or one unit of the last printed digit, the rounding of a printed figure), figures to
1e-4 of their largest value, errors of the same kind.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import random
import re
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable

import attrs
import torch

DEMO_DIR = Path(__file__).parents[1] / "examples" / "tl_demos"
_IMPORT = re.compile(r"^(\s*)(from|import)\s+transformer_lens\b(.*)$")


@attrs.define
class Demo:
    name: str
    #: cell -> (the notebook's loading line, the reference's line, the port's line)
    loads: dict[int, tuple[str, str, str]]
    #: (cell, old, new, why): applied to both sides
    trims: list[tuple[int, str, str, str]] = attrs.field(factory=list)
    #: cell -> why both sides skip it
    skip: dict[int, str] = attrs.field(factory=dict)
    #: tolerance of the plotted arrays, relative to their largest value (and why, when not
    #: the default 1e-4)
    figure_rel: float = 1e-4
    figure_rel_why: str = ""
    #: the notebook version: "" (v2.18.0, tl_demos/*.json) or a folder of tl_demos (v3.5.1)
    version: str = ""
    #: cell -> why its output is not compared (both sides still run it; errors and the
    #: number of figures compared)
    differs: dict[int, str] = attrs.field(factory=dict)


@attrs.define
class CellResult:
    index: int
    stdout: str = ""
    figures: list[tuple[str, list[Any]]] = attrs.field(factory=list)
    value: str | None = None
    error: BaseException | None = None
    compare_output: bool = True
    seconds: float = 0.0


def notebook(name: str, version: str = "") -> dict[str, Any]:
    return json.loads((DEMO_DIR / version / f"{name}.json").read_text())


def port_imports(src: str) -> str:
    """The port's imports: ``transformer_lens`` becomes ``mi_core.tl`` in import lines only
    (``import transformer_lens`` keeps its name: ``import mi_core.tl as transformer_lens``)."""
    out = []
    for line in src.split("\n"):
        m = _IMPORT.match(line)
        if m is None:
            out.append(line)
        elif m.group(2) == "import" and m.group(3).strip() == "":
            out.append(f"{m.group(1)}import mi_core.tl as transformer_lens")
        else:
            out.append(f"{m.group(1)}{m.group(2)} mi_core.tl{m.group(3)}")
    return "\n".join(out)


def prepare(demo: Demo, side: str) -> list[tuple[int, str, bool]]:
    """(cell index, source, compare its output) for `side` ("tl" or "mi")."""
    cells = []
    for index, src in notebook(demo.name, demo.version)["cells"]:
        if index in demo.skip:
            continue
        compare = True
        if index in demo.loads:
            original, tl_line, mi_line = demo.loads[index]
            assert original in src, (demo.name, index, original)
            src = src.replace(original, tl_line if side == "tl" else mi_line)
            compare = False  # loading prints differ (TransformerLens' own CI ignores them too)
        if index in demo.differs:
            compare = False
        for cell, old, new, _why in demo.trims:
            if cell == index:
                assert old in src, (demo.name, index, old)
                src = src.replace(old, new)
        if side == "mi":
            src = port_imports(src)
        cells.append((index, src, compare))
    return cells


def diff_lines(demo: Demo) -> list[tuple[int, str, str]]:
    """Every line where the port differs from the reference: (cell, reference, port)."""
    out = []
    for (i, a, _), (_, b, _) in zip(prepare(demo, "tl"), prepare(demo, "mi")):
        for x, y in zip(a.split("\n"), b.split("\n")):
            if x != y:
                out.append((i, x, y))
    return out


# -- stand-ins for the notebook's display libraries --------------------------------------------
class Recorder:
    """Collects the figures the cells draw."""

    def __init__(self) -> None:
        self.figures: list[tuple[str, list[Any]]] = []

    def record(self, kind: str, *args: Any, **kwargs: Any) -> "_Shown":
        items = [_data(a) for a in args] + [(k, _data(v)) for k, v in sorted(kwargs.items())
                                            if k not in ("renderer",)]
        self.figures.append((kind, items))
        return _Shown()

    def plotter(self, kind: str) -> Callable[..., "_Shown"]:
        return lambda *a, **k: self.record(kind, *a, **k)


class _Shown:
    def show(self, *args: Any, **kwargs: Any) -> None:
        return None

    def show_code(self) -> str:
        return ""

    def update_traces(self, *args: Any, **kwargs: Any) -> "_Shown":
        return self

    def __repr__(self) -> str:
        return "<figure>"


def _data(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double() if x.is_floating_point() or x.is_complex() else \
            x.detach().cpu()
    if type(x).__module__ == "numpy":
        return torch.as_tensor(x).double() if x.dtype.kind in "fc" else torch.as_tensor(x)
    if isinstance(x, (list, tuple)) and x and all(isinstance(v, (int, float)) for v in x):
        return torch.tensor(x, dtype=torch.float64)
    if isinstance(x, (list, tuple)):
        return [_data(v) for v in x]
    if isinstance(x, (str, int, float, bool, type(None))):
        return x
    return repr(x)


def _module(name: str, **attrs_: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs_)
    return mod


class _TensorType:
    def __class_getitem__(cls, item: Any) -> Any:
        return Any


class _Html(str):
    def __repr__(self) -> str:
        return f"HTML({str.__repr__(self)})"


def stub_modules(rec: Recorder) -> dict[str, types.ModuleType]:
    """plotly, circuitsvis, pysvelte, neel_plotly, IPython, torchtyping, tqdm.notebook:
    recorders or no-ops, the same on both sides."""
    import tqdm.std

    px = _module("plotly.express", imshow=rec.plotter("imshow"), line=rec.plotter("line"),
                 scatter=rec.plotter("scatter"), bar=rec.plotter("bar"))
    pio = _module("plotly.io", renderers=types.SimpleNamespace(default=None))
    plotly = _module("plotly", express=px, io=pio)
    attention = _module("circuitsvis.attention", attention_patterns=rec.plotter("cv.patterns"),
                        attention_heads=rec.plotter("cv.heads"),
                        attention_pattern=rec.plotter("cv.pattern"))
    cv = _module("circuitsvis", attention=attention,
                 examples=types.SimpleNamespace(hello=lambda *a, **k: None))
    ipython = types.SimpleNamespace(extension_manager=types.SimpleNamespace(
        loaded={"autoreload"}, load=lambda *a: None, load_extension=lambda *a: None),
        run_line_magic=lambda *a, **k: None)
    display_mod = _module("IPython.display", HTML=_Html, IFrame=rec.plotter("iframe"),
                          Markdown=_Html, display=rec.plotter("display"))
    return {
        "plotly": plotly, "plotly.express": px, "plotly.io": pio,
        "circuitsvis": cv, "circuitsvis.attention": attention,
        "pysvelte": _module("pysvelte", AttentionMulti=rec.plotter("pysvelte")),
        "neel_plotly": _module("neel_plotly", imshow=rec.plotter("imshow"),
                               line=rec.plotter("line"), scatter=rec.plotter("scatter")),
        "IPython": _module("IPython", get_ipython=lambda: ipython, display=display_mod),
        "IPython.display": display_mod,
        "torchtyping": _module("torchtyping", TensorType=_TensorType),
        "tqdm.notebook": tqdm.std,
    }


@contextlib.contextmanager
def notebook_environment(rec: Recorder) -> Any:
    """The stand-in modules, grad mode and RNG restored afterwards."""
    stubs = stub_modules(rec)
    saved = {k: sys.modules.get(k) for k in stubs}
    grad = torch.is_grad_enabled()
    sys.modules.update(stubs)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        torch.set_grad_enabled(grad)


def run_cells(cells: list[tuple[int, str, bool]], namespace: dict[str, Any]
              ) -> list[CellResult]:
    """Run the cells as a notebook kernel does (errors recorded, the next cell still runs)."""
    rec = Recorder()
    namespace.setdefault("__name__", "__notebook__")
    namespace.update(IN_COLAB=False, IN_GITHUB=False, DEVELOPMENT_MODE=False, DEBUG_MODE=False,
                     display=rec.plotter("display"), _same_rng=same_rng)
    results = []
    with notebook_environment(rec):
        torch.set_grad_enabled(True)
        for index, src, compare in cells:
            result = CellResult(index, compare_output=compare)
            torch.manual_seed(1000 + index)
            random.seed(1000 + index)
            start = len(rec.figures)
            out = io.StringIO()
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(out):
                try:
                    value = _exec_cell(src, namespace)
                    if value is not None:
                        result.value = repr(value)
                except Exception as exc:  # noqa: BLE001  (recorded, compared with the other side)
                    result.error = exc
            result.seconds = time.perf_counter() - t0
            result.stdout = out.getvalue()
            result.figures = rec.figures[start:]
            results.append(result)
    return results


def same_rng() -> Any:
    """The loading lines run under this (``with _same_rng(): model = ...``): building a
    model may draw random numbers (TransformerLens initialises its modules before loading the
    weights), which must not shift the draws of the cells that follow."""
    return torch.random.fork_rng(devices=[])


def _exec_cell(src: str, namespace: dict[str, Any]) -> Any:
    tree = ast.parse(src)
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    body = tree.body[:-1] if last is not None else tree.body
    exec(compile(ast.Module(body=body, type_ignores=[]), "<cell>", "exec"), namespace)
    if last is None:
        return None
    return eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)


# -- comparing ---------------------------------------------------------------------------------
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_CLASS = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>")


def _skeleton(text: str) -> tuple[str, list[str]]:
    text = _CLASS.sub(r"<class '\1'>", text)
    return _NUMBER.sub("#", text), _NUMBER.findall(text)


def _ulp(s: str) -> float:
    mant, _, exp = s.lower().partition("e")
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    return 10.0 ** (int(exp or 0) - decimals)


def same_text(ours: str, theirs: str, rel: float = 1e-4) -> str | None:
    """None when equal (numbers to `rel` or one unit of the last printed digit)."""
    a, na = _skeleton(ours)
    b, nb = _skeleton(theirs)
    if a != b or len(na) != len(nb):
        return f"text differs:\n--- ours\n{ours}\n--- TransformerLens\n{theirs}"
    for x, y in zip(na, nb):
        is_int = not any(c in y for c in ".eE")
        if is_int and x != y and not any(c in x for c in ".eE"):
            return f"integer {x} != {y}"
        fx, fy = float(x), float(y)
        if abs(fx - fy) > max(rel * abs(fy), 1.01 * max(_ulp(x), _ulp(y))):
            return f"number {x} != {y}"
    return None


def same_figure(a: Any, b: Any, rel: float = 1e-4) -> str | None:
    if isinstance(b, torch.Tensor):
        if not isinstance(a, torch.Tensor) or a.shape != b.shape:
            return f"figure data {getattr(a, 'shape', a)} vs {tuple(b.shape)}"
        if b.is_floating_point() or b.is_complex():
            scale = float(b.abs().nan_to_num(0).max()) if b.numel() else 0.0
            diff = (a - b).abs().nan_to_num(0).max().item() if b.numel() else 0.0
            if diff > rel * max(scale, 1e-2) or not torch.equal(a.isnan(), b.isnan()):
                return f"figure data differs by {diff:.3g} (scale {scale:.3g})"
            return None
        return None if torch.equal(a, b) else "integer figure data differ"
    if isinstance(b, (list, tuple)):
        if not isinstance(a, (list, tuple)) or len(a) != len(b):
            return f"figure items {a!r:.80} vs {b!r:.80}"
        for x, y in zip(a, b):
            err = same_figure(x, y, rel)
            if err:
                return err
        return None
    if isinstance(b, str):
        return same_text(a, b, rel) if isinstance(a, str) else f"{a!r:.80} vs {b!r:.80}"
    if isinstance(b, float) and isinstance(a, (int, float)):  # e.g. zmax=a computed baseline
        return None if abs(a - b) <= rel * max(abs(b), 1e-2) else f"{a!r} vs {b!r}"
    return None if a == b else f"{a!r:.80} vs {b!r:.80}"


def same_error(ours: BaseException | None, theirs: BaseException | None) -> str | None:
    """Both ran, or both raised an error of the same kind (the builtin class TransformerLens'
    error is an instance of, e.g. AssertionError, IndexError, RuntimeError)."""
    if theirs is None:
        return None if ours is None else f"ours raised {type(ours).__name__}: {ours}"
    if ours is None:
        return f"TransformerLens raised {type(theirs).__name__}: {theirs}; ours did not"
    kind = next(k for k in type(theirs).__mro__ if k.__module__ == "builtins")
    return None if isinstance(ours, kind) else (
        f"ours raised {type(ours).__name__}: {ours}; TransformerLens {kind.__name__}: {theirs}")


def compare(ours: list[CellResult], theirs: list[CellResult], figure_rel: float = 1e-4
            ) -> list[str]:
    """Every difference, as "cell N: ..." lines (empty: the port shows what the original does)."""
    problems = []
    for a, b in zip(ours, theirs):
        assert a.index == b.index
        errs = [same_error(a.error, b.error)]
        if b.compare_output:
            errs.append(same_text(a.stdout, b.stdout))
            if (a.value is None) != (b.value is None):
                errs.append(f"value {a.value!r:.80} vs {b.value!r:.80}")
            elif b.value is not None:
                errs.append(same_text(a.value, b.value))
        if len(a.figures) != len(b.figures):
            errs.append(f"{len(a.figures)} figures vs {len(b.figures)}")
        elif b.compare_output:
            for fa, fb in zip(a.figures, b.figures):
                errs.append(None if fa[0] == fb[0] else f"figure {fa[0]} vs {fb[0]}")
                errs.append(same_figure(fa[1], fb[1], figure_rel))
        problems += [f"cell {a.index}: {e}" for e in errs if e]
    return problems


def counted(results: list[CellResult]) -> dict[str, int]:
    """How much was compared: cells, printed numbers, figures."""
    numbers = sum(len(_skeleton(r.stdout)[1]) for r in results if r.compare_output)
    return {"cells": len(results), "numbers": numbers,
            "figures": sum(len(r.figures) for r in results),
            "errors": sum(r.error is not None for r in results)}


"""The API reference is built from the docstrings (scripts/api_docs.py, pdoc) and names every
public entry point with its signature, so it cannot rot; and nothing in the repository
points at files outside it."""

from __future__ import annotations

import html
import importlib.util
import inspect
import re
import subprocess
from pathlib import Path

import pytest

import mi_core as mi
import mi_core.interp

ROOT = Path(__file__).parents[2]


def _load_script():
    spec = importlib.util.spec_from_file_location("api_docs", ROOT / "scripts" / "api_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def api_dir(tmp_path_factory):
    pytest.importorskip("pdoc")
    out = tmp_path_factory.mktemp("api")
    index = _load_script().build(out)
    assert index.exists()
    return out


def _entry(api_dir: Path, obj) -> str:
    """The HTML of `obj`'s entry on its module's page (from its anchor to the next one)."""
    module = obj.__module__
    while "._" in module:  # defined in a private module: documented where it is re-exported
        module = module[: module.index("._")]
    page = api_dir / (module.replace(".", "/") + ".html")
    assert page.exists(), f"no page for {obj.__module__}"
    text = page.read_text(encoding="utf-8")
    m = re.search(rf'<section id="{re.escape(obj.__qualname__)}">(.*?)</section>', text, re.S)
    assert m, f"{obj.__module__}.{obj.__qualname__} is not in the API reference"
    return m.group(1)


def _signature_text(entry: str) -> str:
    m = re.search(r'<span class="signature[^"]*">(.*?)</span>\s*</div>', entry, re.S)
    assert m, "no signature"
    return html.unescape(re.sub(r"<[^>]+>", "", m.group(1)))


def _params(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p not in ("self", "cls")]


CORE = [mi.MIModel, mi.HookSpec, mi.HookCache, mi.HookPoint, mi.Knockout, mi.Steer, mi.Add,
        mi.Replace, mi.Zero, mi.Scale, mi.StateKnockoutSpec, mi.StateSteeringSpec]
METHODS = [mi.MIModel.from_pretrained, mi.MIModel.forward, mi.MIModel.run_with_cache,
           mi.MIModel.generate, mi.MIModel.to_tokens, mi.HookSpec.capture, mi.HookSpec.intervene]
ANALYSES = [getattr(mi_core.interp, n) for n in mi_core.interp.__all__]


@pytest.mark.slow
@pytest.mark.parametrize("obj", CORE + ANALYSES, ids=lambda o: o.__qualname__)
def test_every_public_class_and_analysis_is_documented_with_its_signature(api_dir, obj):
    entry = _entry(api_dir, obj)
    if inspect.isfunction(obj):
        sig = _signature_text(entry)
        for p in _params(obj):
            assert p in sig, f"{obj.__qualname__}: parameter {p} missing from {sig!r}"
    if obj.__doc__:  # the docstring is rendered: the words of its first line appear in order
        first = re.sub(r":\w+:", "", obj.__doc__.strip().split("\n")[0])  # rst roles
        words = re.findall(r"[A-Za-z]{3,}", first)[:3]
        text = html.unescape(re.sub(r"<[^>]+>", " ", entry))
        pos = 0
        for w in words:
            pos = text.find(w, pos)
            assert pos >= 0, f"{obj.__qualname__}: docstring word {w!r} not rendered"


@pytest.mark.slow
@pytest.mark.parametrize("fn", METHODS, ids=lambda f: f.__qualname__)
def test_model_and_hookspec_methods_carry_their_signatures(api_dir, fn):
    page = (api_dir / (fn.__module__.replace(".", "/") + ".html")).read_text(encoding="utf-8")
    m = re.search(rf'<div id="{re.escape(fn.__qualname__)}" class="classattr">(.*?)</section>',
                  page, re.S) or re.search(rf'id="{re.escape(fn.__qualname__)}"(.*?)</div>\s*</div>',
                                           page, re.S)
    assert m, f"{fn.__qualname__} is not in the API reference"
    sig = html.unescape(re.sub(r"<[^>]+>", "", m.group(1)))
    for p in _params(fn):
        assert p in sig, f"{fn.__qualname__}: parameter {p} missing"


#: Things that only exist on the machines this repository was written on.
OUTSIDE = [re.compile(p) for p in (r"\.\./shared", r"shared/design", r"/work/", r"\bAPI\.md\b")]


def test_nothing_in_the_repository_refers_to_files_outside_it():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    me = Path(__file__).relative_to(ROOT).as_posix()
    bad = []
    for name in files:
        path = ROOT / name
        if name == me or path.suffix not in {".py", ".md", ".toml", ".txt", ".cfg", ".yml",
                                               ".yaml", ".sh", ""} or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for i, line in enumerate(text.splitlines(), 1):
            if any(p.search(line) for p in OUTSIDE):
                bad.append(f"{name}:{i}: {line.strip()}")
        if path.suffix == ".md":  # relative links must stay inside the repository
            for target in re.findall(r"\]\(([^)#\s]+)", text):
                if "://" in target or target.startswith("mailto:"):
                    continue
                resolved = (path.parent / target).resolve()
                if not resolved.is_relative_to(ROOT.resolve()):
                    bad.append(f"{name}: link {target} leaves the repository")
                elif not resolved.exists():
                    bad.append(f"{name}: link {target} does not exist")
    assert not bad, "\n".join(bad)

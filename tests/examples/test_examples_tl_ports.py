"""The TransformerLens walk-through ports (examples/tl_*.py) print the same figures as their
TransformerLens originals on the same weights.

The original is the example's own source with its imports swapped back to TransformerLens
(the only lines that differ, as the ports claim), run on a HookedTransformer built from
SmolLM2's weights (the GGUF converted to an HF directory, tests.support.smollm2_hf, then
TransformerLens' own conversion and processing, tests.support.tl_hooked). Both sides process
the weights as TransformerLens' from_pretrained does (fold_ln, centring).

Tolerances: F32 on a model with massive activations; measured differences between the two
sides are ~2e-5 on logits of magnitude ~25. Figures compare to 1e-3 (relative 1e-4), rankings
exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mi_core as mi

from tests.support.smollm2_hf import smollm2_hf_dir
from tests.support.tl_hooked import hooked_llama

pytest.importorskip("transformer_lens")
pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).parents[2] / "examples"
FLAGS = dict(fold_ln=True, center_writing_weights=True, center_unembed=True)
#: the ports' import lines -> the TransformerLens originals'
ORIGINAL_IMPORTS = {
    "import mi_core as mi  # TL:": "import transformer_lens as mi  # port:",
    "from mi_core.interp import act_patching as patching  # TL:":
        "import transformer_lens.patching as patching  # port:",
}


def _load(name: str, original: bool) -> dict:
    src = (EXAMPLES / f"{name}.py").read_text()
    if original:
        for port, orig in ORIGINAL_IMPORTS.items():
            src = src.replace(port, orig)
        assert "mi_core" not in src.split('"""', 2)[2].split("def main")[0], \
            "the analysis must not use mi-core once the imports are swapped"
    ns: dict = {"__name__": f"{'tl' if original else 'mi'}_{name}"}
    exec(compile(src, str(EXAMPLES / f"{name}.py"), "exec"), ns)
    if name == "tl_ioi_exploratory":  # runtime: one prompt template, patching three layers
        ns["PROMPT_FORMAT"], ns["PATCH_LAYERS"] = ns["PROMPT_FORMAT"][:1], [4, 12, 20]
    return ns


@pytest.fixture(scope="module")
def models(smollm2_gguf_path):
    from transformers import AutoTokenizer

    ours = mi.MIModel.from_pretrained(smollm2_gguf_path, **FLAGS)
    d = smollm2_hf_dir(smollm2_gguf_path)
    theirs = hooked_llama(d, tokenizer=AutoTokenizer.from_pretrained(str(d)), **FLAGS)
    return ours, theirs


def _same(a, b, path="") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.shape == b.shape, path
        assert (a.float() - b.float().cpu()).abs().max().item() < 1e-3, path
    elif isinstance(a, float):
        assert a == pytest.approx(b, abs=1e-3, rel=1e-4), path
    else:
        assert a == b, path


@pytest.mark.parametrize("name", ["tl_ioi_exploratory", "tl_induction_heads"])
def test_port_prints_the_figures_of_the_transformerlens_original(models, name, capsys):
    ours, theirs = models
    got = _load(name, original=False)["analysis"](ours)
    printed_ours = capsys.readouterr().out
    with torch.no_grad():
        want = _load(name, original=True)["analysis"](theirs)
    printed_theirs = capsys.readouterr().out
    _same(got, want)
    assert printed_ours == printed_theirs
    if name == "tl_ioi_exploratory":
        # the behaviour the demo is about: SmolLM2 prefers the indirect object, and patching
        # the repeated name's position early on restores the clean answer (measured values)
        assert got["logit_diff"] > 1.0
        layer, pos, value = got["top_patches"][0]
        assert value > 0.9
    else:
        assert got["loss_second_half"] < got["loss_first_half"] / 2
        assert got["cache_matches_hooks"] and got["top_heads"][0][2] > 0.5
        assert got["ablated_loss_second_half"] > got["loss_second_half"]

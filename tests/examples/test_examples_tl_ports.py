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
    "from mi_core.tl import patching  # TL:":
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
    if name == "tl_ioi_exploratory":  # runtime: one prompt template, patching two layers
        ns["PROMPT_FORMAT"], ns["PATCH_LAYERS"] = ns["PROMPT_FORMAT"][:1], [4, 20]
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


def test_token_conveniences_and_test_prompt_match_transformerlens(models, capsys):
    from transformer_lens.utils import test_prompt

    ours, theirs = models
    prompt = "The capital of France is"
    assert ours.to_single_token(" Paris") == theirs.to_single_token(" Paris")
    assert ours.to_str_tokens(prompt) == theirs.to_str_tokens(prompt)
    ids = ours.to_tokens([prompt, "The capital of Spain is"])
    assert ours.to_string(ids) == theirs.to_string(ids)
    with pytest.raises(mi.TokenizerError, match="not a single token"):
        ours.to_single_token(" Parisian capital")
    ranks = ours.test_prompt(prompt, "Paris")
    mine = capsys.readouterr().out
    test_prompt(prompt, "Paris", theirs)
    tl_out = capsys.readouterr().out
    # TransformerLens prints the same lines (its rich markup aside) and the same ranks
    assert f"Ranks of the answer tokens: {ranks[0]}" in tl_out
    for line in mine.splitlines()[:3]:
        assert line in tl_out
    assert ranks[0][0] == (" Paris", 0)


def test_every_shared_hook_name_matches_hookedtransformer_on_smollm2(models):
    """SmolLM2, both sides processed as TransformerLens' from_pretrained. Tolerance as in
    test_transformer_tl_parity: atol 1e-4 + 1e-5 * max|ref| per tensor (massive activations)."""
    ours, theirs = models
    ids = ours.to_tokens("The capital of France is Paris, and the capital of Italy is")
    _, cache = ours.run_with_cache(ids)
    with torch.no_grad():
        _, tc = theirs.run_with_cache(ids)
    names = [k for k in tc.keys() if not k.startswith("unembed.")]
    assert len(names) > 30 * 20
    for k in names:
        a, b = cache[k], tc[k]
        assert a.shape == b.shape, k
        masked = torch.isneginf(a)
        a, b = a[~masked], b[~masked]
        assert (a - b).abs().max().item() <= 1e-4 + 1e-5 * b.abs().max().item(), k

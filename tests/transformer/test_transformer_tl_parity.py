"""Our hook values against TransformerLens' TransformerBridge on the same weights.

The bridge (transformer-lens 3.x) wraps the HF model itself (eager attention, raw HF weights,
no LayerNorm folding), booted offline from a local directory. It names its hook points as
TransformerLens does, and so do we; every name below exists on both sides with the same
shape. Differences, documented:

- ``ln*.hook_normalized``: TransformerLens' is ``x / scale`` *before* the norm's gain; ours
  (the API contract) is the norm's output, gain included (ln2's is the MLP input). We compare ours with
  the bridge's value times the HF norm weight.

- ``attn.hook_attn_scores``: masked (future) positions are ``-inf`` here and
  ``torch.finfo(float32).min`` in the bridge (HF's eager mask); both are compared as "masked"
  and the finite entries are compared by value.
- The bridge also has points we do not (``*.hook_in`` / ``hook_out`` of every wrapped module,
  ``attn.hook_cos`` / ``hook_sin``, ``mlp.hook_pre_linear`` (the up projection), ``hook_unembed``);
  we have ``attn.hook_result``, which it lacks. Those are not compared.

Tolerance: max abs diff < 1e-4 (F32) for the tiny model. For SmolLM2 the check is
``max|ours - bridge| <= 1e-4 + 1e-5 * max|bridge|`` per tensor: SmolLM2 has massive
activations (residual entries up to ~2e4 from layer ~10 on), and F32 rounding error scales with
them. Measured: the bridge equals transformers' eager forward exactly, and we differ from both
by <= 4e-6 of each tensor's largest entry (e.g. 7.8e-3 on resid_post values of 2.2e4),
by < 1e-4 wherever entries are O(10), and by 5e-5 on the logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mi_core as mi

from tests.support.smollm2_hf import smollm2_hf_dir

tl_bridge = pytest.importorskip("transformer_lens.model_bridge")

#: Per-layer hook points both sides provide (TransformerLens names, ours by the API contract).
LAYER_POINTS = [
    "hook_resid_pre", "ln1.hook_scale", "ln1.hook_normalized",
    "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_rot_q", "attn.hook_rot_k",
    "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z", "hook_attn_out",
    "hook_resid_mid", "ln2.hook_scale", "ln2.hook_normalized",
    "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out", "hook_resid_post",
]
GLOBAL_POINTS = ["hook_embed", "ln_final.hook_scale", "ln_final.hook_normalized"]


@pytest.fixture(autouse=True, scope="module")
def _offline():
    """The bridge must never reach the hub: every source here is a local directory.
    huggingface_hub reads the env var once at import, so its constant is set as well."""
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        yield


def _dummy_tokenizer():
    """The tiny checkpoint has no tokenizer; the bridge insists on one (it encodes "a")."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>")


def _boot(directory: Path, tokenizer=None):
    return tl_bridge.TransformerBridge.boot_transformers(
        str(directory), device="cpu", dtype=torch.float32, tokenizer=tokenizer)


def _norm_weights(directory: Path, num_layers: int) -> dict[str, torch.Tensor]:
    """TL norm name -> the HF RMSNorm gain applied after ``hook_normalized`` (from the files)."""
    from safetensors.torch import load_file

    sd = load_file(str(directory / "model.safetensors"))
    out = {"ln_final": sd["model.norm.weight"]}
    for i in range(num_layers):
        out[f"blocks.{i}.ln1"] = sd[f"model.layers.{i}.input_layernorm.weight"]
        out[f"blocks.{i}.ln2"] = sd[f"model.layers.{i}.post_attention_layernorm.weight"]
    return out


def _compare(model: mi.MIModel, directory: Path, ids: torch.Tensor, atol: float, rtol: float,
             tokenizer=None) -> None:
    bridge = _boot(directory, tokenizer)
    names = GLOBAL_POINTS + [f"blocks.{i}.{p}" for i in range(model.num_layers) for p in LAYER_POINTS]
    gains = _norm_weights(directory, model.num_layers)
    with torch.no_grad():
        ref_logits, ref = bridge.run_with_cache(ids)
    logits, ours = model.run_with_cache(ids, names_filter=names)
    bad = []
    for n in names:
        assert n in ref, f"bridge lacks {n}"
        a, b = ours[n], ref[n].to(torch.float32)
        assert a.shape == b.shape, f"{n}: ours {list(a.shape)} vs bridge {list(b.shape)}"
        if n.endswith("hook_normalized"):
            b = b * gains[n.rsplit(".", 1)[0]].float()
        if n.endswith("hook_attn_scores"):
            masked = torch.isneginf(a)
            assert torch.equal(masked, b <= torch.finfo(torch.float32).min / 2), n
            a, b = a[~masked], b[~masked]
        err, scale = (a - b).abs().max().item(), b.abs().max().item()
        if err > atol + rtol * scale:
            bad.append(f"{n}: max |diff| {err:.3g} (max |ref| {scale:.3g})")
    assert not bad, "\n".join(bad)
    assert (logits - ref_logits).abs().max().item() < 1e-4


def test_tiny_llama_hook_values_match_transformer_bridge(tiny_llama, llama_model, make_ids) -> None:
    _compare(llama_model, tiny_llama.path, make_ids(2, 12), atol=1e-4, rtol=0.0,
             tokenizer=_dummy_tokenizer())


def test_smollm2_hook_values_match_transformer_bridge(smollm2, smollm2_gguf_path: Path) -> None:
    texts = ["The capital of France is Paris, and the capital of Italy is",
             "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fib"]
    rows = [smollm2.tokenizer.encode(t) for t in texts]
    n = min(len(r) for r in rows)
    _compare(smollm2, smollm2_hf_dir(smollm2_gguf_path), torch.tensor([r[:n] for r in rows]),
             atol=1e-4, rtol=1e-5)

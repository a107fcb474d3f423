"""Three differences a differential audit against TransformerLens 3.9 found, pinned on the same
weights (SmolLM2's first two layers: grouped-query, rotary; a GPT-2-shaped tiny model; each
side with TransformerLens' defaults):

- ``use_split_qkv_input`` / ``use_attn_in``: ``ln1.hook_scale`` / ``hook_normalized`` have a
  head axis (ln1 normalises each head's copy; the cache keeps the values' input, with
  n_key_value_heads heads), an edit of one head's copy changes only that head's q / k / v, and
  the cache's methods that divide by ln1's scale raise the same RuntimeError;
- ``hook_rot_k`` in a KV-cached forward (``past_kv_cache=``, ``generate``) covers every
  position, and an edit there lasts one forward (the cache keeps the keys before it);
- ``from_pretrained(first_n_layers=n)``. TransformerLens' ``from_pretrained`` needs the hub
  for a model name, so its side is the same path built offline: ``cfg.n_layers = n`` and its
  own weight conversion of that many blocks (tests.support.tl_hooked ``n_layers=``), which is
  what ``first_n_layers`` does there.

F32; activations to 1e-5 of their scale (measured: <= 1e-6), logits 1e-5 relative.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_core.tl import HookedTransformer

TEXTS = ["The cat sat on the mat.", "Hello world"]


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-5) -> None:
    """Equal to `rel` of b's scale (masked scores: -inf at the same places)."""
    assert a.shape == b.shape
    finite = torch.isfinite(b)
    assert torch.equal(finite, torch.isfinite(a))
    a, b = a[finite], b[finite]
    assert (a - b).abs().max().item() <= rel * max(1.0, b.abs().max().item())


def _switch(models, mode: str) -> None:
    for m in models:  # (set_use_attn_in refuses grouped-query models, even to turn it off)
        m.cfg.use_split_qkv_input = mode in ("split", "both")
        m.cfg.use_attn_in = mode in ("attn_in", "both")


@pytest.mark.parametrize("name, mode", [("smollm2_2l", "split"), ("gpt2", "split"),
                                        ("gpt2", "attn_in"), ("gpt2", "both")])
def test_ln1_points_have_a_head_axis_with_per_head_inputs(pair, name, mode):
    ours, tl = pair(name)
    _switch((ours, tl), mode)
    tokens = tl.to_tokens(TEXTS)
    fired: dict = {}
    for side, m in (("ours", ours), ("tl", tl)):
        seen = fired.setdefault(side, [])
        m.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.startswith("blocks.0."),
                                             lambda x, hook: seen.append((hook.name, x.shape)))])
    assert fired["ours"] == fired["tl"]  # names, order and shapes, ln1's three calls included
    heads = tl.cfg.n_key_value_heads or tl.cfg.n_heads
    assert ("blocks.0.ln1.hook_scale", torch.Size([2, tokens.shape[1], heads, 1])) \
        in fired["tl"]

    def head_1(factor):
        def edit(x, hook):
            x[:, :, 1] = factor * x[:, :, 1]  # one head's copy, in place
            return x
        return edit

    caches = {}
    for side, m in (("ours", ours), ("tl", tl)):
        _, plain = m.run_with_cache(tokens)
        with m.hooks(fwd_hooks=[("blocks.0.ln1.hook_scale", head_1(0.8)),
                                ("blocks.0.ln1.hook_normalized", head_1(0.5))]):
            logits, edited = m.run_with_cache(tokens)
        caches[side] = (plain, edited, logits)
    for cache in (0, 1):
        assert list(caches["ours"][cache].keys()) == list(caches["tl"][cache].keys())
        for key in caches["tl"][cache].keys():
            _close(caches["ours"][cache][key], caches["tl"][cache][key])
    for p in ("q", "k", "v"):  # only head 1's query, key and value changed
        key = f"blocks.0.attn.hook_{p}"
        moved = (caches["ours"][1][key] - caches["ours"][0][key]).abs().amax(dim=(0, 1, 3))
        assert moved[1] > 1e-3 and float(moved[0]) == float(moved[2:].max()) == 0.0
    _close(caches["ours"][2], caches["tl"][2])


@pytest.mark.parametrize("name", ["smollm2_2l", "gpt2"])
def test_cache_methods_reading_ln1_scales_fail_as_transformerlens(pair, name):
    """TransformerLens' apply_ln at a block's ln1 divides by the per-head scale, which does not
    broadcast: a RuntimeError; the final norm's and ln2's scales have no head axis."""
    ours, tl = pair(name)
    _switch((ours, tl), "split")
    tokens = tl.to_tokens(TEXTS)
    (_, cache), (_, tcache) = ours.run_with_cache(tokens), tl.run_with_cache(tokens)
    calls = [lambda c: c.decompose_resid(layer=1, apply_ln=True),
             lambda c: c.accumulated_resid(layer=1, apply_ln=True),
             lambda c: c.stack_head_results(layer=1, apply_ln=True),
             lambda c: c.apply_ln_to_stack(c.decompose_resid(layer=1), layer=1)]
    for call in calls:
        for c in (tcache, cache):
            with pytest.raises(RuntimeError):
                call(c)
    for layer, mlp_input in ((None, False), (1, True)):
        a = cache.decompose_resid(layer=layer, mlp_input=mlp_input, apply_ln=True)
        _close(a, tcache.decompose_resid(layer=layer, mlp_input=mlp_input, apply_ln=True))
    _close(cache.logit_attrs(cache.accumulated_resid(pos_slice=-1), tokens[:, -1],
                             pos_slice=-1),
           tcache.logit_attrs(tcache.accumulated_resid(pos_slice=-1), tokens[:, -1],
                              pos_slice=-1))


def test_hook_rot_k_covers_cached_positions_and_its_edits_last_one_forward(pair):
    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

    from mi_core.tl.past_key_value_caching import HookedTransformerKeyValueCache

    ours, tl = pair("smollm2_2l")
    tokens = tl.to_tokens(["The cat sat on the mat, and then it"])

    def edit(x, hook):
        x = x.clone()
        x[:, 2:4] *= 0.3  # cached positions (in the second forward)
        x[:, -1] *= 1.7
        return x

    got = {}
    for side, m, kind in (("ours", ours, HookedTransformerKeyValueCache),
                          ("tl", tl, TransformerLensKeyValueCache)):
        cache, out, seen = kind.init_cache(m.cfg, "cpu", 1), [], []
        with m.hooks(fwd_hooks=[("blocks.1.attn.hook_rot_k", edit)]):
            out.append(m(tokens[:, :5], past_kv_cache=cache))
        with m.hooks(fwd_hooks=[(lambda n: n.startswith("blocks.0.attn.hook_"),
                                 lambda x, hook: seen.append((hook.name, x.shape))),
                                ("blocks.0.attn.hook_rot_k", edit)]):
            logits, act = m.run_with_cache(tokens[:, 5:8], past_kv_cache=cache)
        out += [logits, act["blocks.0.attn.hook_rot_k"], act["blocks.1.attn.hook_rot_k"],
                act["blocks.0.attn.hook_k"]]
        out.append(m(tokens[:, 8:], past_kv_cache=cache))  # no hooks: the cached keys
        # are those before the edits at hook_rot_k (their effect downstream is cached)
        got[side] = (out, seen)
    assert got["ours"][1] == got["tl"][1]  # hook_rot_k [1, 8, ...], hook_k / hook_q [1, 3, ...]
    assert got["tl"][0][2].shape[1] == 8 and got["tl"][0][4].shape[1] == 3
    for a, b in zip(got["ours"][0], got["tl"][0]):
        _close(a, b)
    gen = {}
    for side, m in (("ours", ours), ("tl", tl)):
        with m.hooks(fwd_hooks=[("blocks.1.attn.hook_rot_k", lambda x, hook: 1.5 * x),
                                ("blocks.0.attn.hook_rot_k", edit)]):
            gen[side] = m.generate(tokens[:, :6], max_new_tokens=6, do_sample=False,
                                   use_past_kv_cache=True, verbose=False)
    assert torch.equal(gen["ours"], gen["tl"])


@pytest.mark.parametrize("name", ["smollm2_2l", "gpt2"])
def test_first_n_layers_loads_the_first_blocks_as_transformerlens(tl_checkpoints, name):
    from transformers import AutoTokenizer

    from tests.support.tl_demo_models import TL_DEFAULTS
    from tests.support.tl_hooked import hooked_gpt2, hooked_llama

    directory = tl_checkpoints[name]
    build = hooked_gpt2 if name == "gpt2" else hooked_llama
    tl = build(directory, tokenizer=AutoTokenizer.from_pretrained(str(directory)), n_layers=1,
               **TL_DEFAULTS)
    ours = HookedTransformer.from_pretrained(directory, first_n_layers=1)
    assert ours.cfg.n_layers == tl.cfg.n_layers == 1 and len(ours.blocks) == 1
    tokens = tl.to_tokens(TEXTS)
    (logits, cache), (tlogits, tcache) = ours.run_with_cache(tokens), tl.run_with_cache(tokens)
    _close(logits, tlogits)
    assert list(cache.keys()) == list(tcache.keys())
    for key in tcache.keys():
        _close(cache[key], tcache[key])
    for weight in ("W_E", "W_U", "W_Q", "W_in"):
        _close(getattr(ours, weight), getattr(tl, weight))
    temporary = Path(ours.mi_model.source)
    assert temporary.exists() and temporary != Path(directory)
    del ours, cache
    gc.collect()
    assert not temporary.exists()  # removed with the model


def test_first_n_layers_refusals(tl_checkpoints, smollm2_gguf_path):
    with pytest.raises(mi.InputError, match="first_n_layers=3.*has 2 layers"):
        HookedTransformer.from_pretrained(tl_checkpoints["smollm2_2l"], first_n_layers=3)
    with pytest.raises(mi.CapabilityError, match="first_n_layers.*single-file"):
        HookedTransformer.from_pretrained(smollm2_gguf_path, first_n_layers=1)


def test_hook_attn_in_changes_nothing_when_split_input_is_on_too(pair):
    """TransformerLens with both switches computes hook_attn_in but reads q / k / v from the
    split inputs of resid_pre: a hook there runs and changes nothing."""
    ours, tl = pair("gpt2")
    _switch((ours, tl), "both")
    tokens = tl.to_tokens(TEXTS)
    calls = []

    def zero(x, hook):
        calls.append(hook.name)
        return torch.zeros_like(x)

    for m in (ours, tl):
        plain = m(tokens)
        _close(m.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_attn_in", zero)]), plain)
    assert calls == ["blocks.0.hook_attn_in"] * 2

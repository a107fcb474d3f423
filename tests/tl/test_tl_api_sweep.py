"""What a differential sweep of TransformerLens' public API found different, pinned against
TransformerLens 3.9 on the same weights (models as in test_tl_differential.py: SmolLM2's
first two layers, a GPT-2-shaped tiny model, each side with TransformerLens' defaults):
backward hooks given to ``run_with_hooks`` firing on a later ``backward()``, the components'
attributes (``cfg``, ``attn.attn_scale`` / ``layer_id``, ``mlp.act_fn`` / ``d_mlp``), the
cache's ``has_embed`` / ``has_pos_embed``, ``n_params_total`` / ``get_pos_offset``, a printed
``Slice``, the exception kinds of a few misuses, and ``model(tokens, past_kv_cache=cache)``.
F32, 1e-4 unless noted.
"""

from __future__ import annotations

import pytest
import torch

from mi_core.tl import HookedTransformer, utils

TEXTS = ["The cat sat on the mat.", "Hello world"]


@pytest.mark.parametrize("name", ["smollm2_2l", "gpt2"])
def test_run_with_hooks_backward_hooks_fire_after_it_returns(pair, name):
    """TransformerLens' backward hooks are torch's full backward hooks, taken when the module
    runs: those given to ``run_with_hooks`` (removed when it returns, reset_hooks_end=True)
    still fire when the returned loss is back-propagated, and a returned gradient replaces
    the incoming one upstream."""
    ours, tl = pair(name)
    tokens = tl.to_tokens(TEXTS)
    seen: dict = {}
    for side, m in (("ours", ours), ("tl", tl)):
        def keep(grad, hook, side=side):
            seen.setdefault(side, []).append((hook.name, grad.detach().clone()))

        def halve(grad, hook):
            return (grad * 0.5,)

        loss = m.run_with_hooks(tokens, return_type="loss", bwd_hooks=[
            ("blocks.1.hook_resid_pre", halve),
            (lambda n: n.endswith("hook_z"), keep), ("blocks.0.hook_resid_mid", keep)])
        assert not any(hp.bwd_hooks for hp in m.hook_dict.values())  # removed on return
        loss.backward()
        seen[side + "_grad"] = m.W_E.grad.detach().clone()
        m.zero_grad(set_to_none=True)
    assert [n for n, _ in seen["ours"]] == [n for n, _ in seen["tl"]]
    assert len(seen["ours"]) == 3
    for (_, a), (_, b) in zip(seen["ours"], seen["tl"]):
        assert (a - b).abs().max() < 1e-4 * max(1.0, b.abs().max().item())
    a, b = seen["ours_grad"], seen["tl_grad"]
    assert (a - b).abs().max() < 1e-4 * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("name", ["smollm2_2l", "gpt2"])
def test_component_attributes_as_transformerlens(pair, name):
    ours, tl = pair(name)
    for path in ("embed", "unembed", "ln_final", "blocks.1", "blocks.1.ln2", "blocks.1.attn",
                 "blocks.1.mlp"):
        assert ours.get_submodule(path).cfg is ours.cfg
    for layer in range(ours.cfg.n_layers):
        a, b = ours.blocks[layer].attn, tl.blocks[layer].attn
        assert (a.layer_id, a.attn_type) == (b.layer_id, b.attn_type)
        assert a.attn_scale == pytest.approx(float(b.attn_scale), rel=1e-6)
        assert ours.blocks[layer].mlp.d_mlp == tl.blocks[layer].mlp.d_mlp
    x = torch.linspace(-4, 4, 17)
    torch.testing.assert_close(ours.blocks[0].mlp.act_fn(x), tl.blocks[0].mlp.act_fn(x))


@pytest.mark.parametrize("name", ["smollm2_2l", "gpt2"])
def test_cache_and_model_attributes_as_transformerlens(pair, name):
    ours, tl = pair(name)
    tokens = tl.to_tokens(TEXTS[0])
    for names_filter in (None, "blocks.0.hook_resid_pre"):
        _, cache = ours.run_with_cache(tokens, names_filter=names_filter)
        _, tcache = tl.run_with_cache(tokens, names_filter=names_filter)
        assert (cache.has_embed, cache.has_pos_embed) == (tcache.has_embed, tcache.has_pos_embed)
    assert ours.n_params_total == sum(p.numel() for p in ours.parameters())
    assert ours.get_pos_offset(None, 2) == tl.get_pos_offset(None, 2) == 0
    from mi_core.tl import TransformerLensKeyValueCache
    with pytest.raises(AssertionError):  # a cache of another batch size, as TransformerLens
        ours.get_pos_offset(TransformerLensKeyValueCache.init_cache(ours.cfg, "cpu", 1), 2)
    import transformer_lens.utils as tl_utils
    for sl in ((1, 3), -1, None, [0, 2]):
        assert repr(utils.Slice(sl)) == repr(tl_utils.Slice(sl))


def test_misuse_raises_transformerlens_exception_kinds(pair):
    import mi_core as mi

    ours, tl = pair("smollm2_2l")
    with pytest.raises(AssertionError, match="not a single token"):
        tl.tokens_to_residual_directions(" the cat")
    with pytest.raises(AssertionError, match="not a single token") as err:
        ours.tokens_to_residual_directions(" the cat")
    assert isinstance(err.value, mi.InputError)
    with pytest.raises(ValueError):
        tl.all_composition_scores("X")
    with pytest.raises(ValueError) as err:
        ours.all_composition_scores("X")
    assert isinstance(err.value, mi.InputError)


def test_missing_activation_in_cache_methods_is_a_key_error(pair):
    """TransformerLens' cache methods raise the dict's KeyError for an activation a name
    filter left out; so do ours (an mi_core.HookError that is also a KeyError)."""
    import mi_core as mi

    ours, tl = pair("gpt2")
    tokens = tl.to_tokens(TEXTS[0])
    for m in (ours, tl):
        _, cache = m.run_with_cache(tokens, names_filter=lambda n: "resid_post" in n)
        with pytest.raises(KeyError):
            cache.accumulated_resid()
        with pytest.raises(KeyError):
            cache.stack_head_results()
    _, cache = ours.run_with_cache(tokens, names_filter=lambda n: "resid_post" in n)
    with pytest.raises(mi.HookError, match="not captured"):
        cache.decompose_resid()
    for m in (ours, tl):  # tokens where text belongs: the tokenizer's ValueError
        with pytest.raises(ValueError):
            m.to_tokens(tokens)


@pytest.mark.parametrize("name", ["smollm2_2l", "gpt2"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_forward_with_a_key_value_cache_as_transformerlens(pair, name, padding_side):
    """``model(tokens, past_kv_cache=cache)`` chunk by chunk gives TransformerLens' logits,
    offsets and mask (padded batch; a manual greedy loop equals generate); hooks see the new
    positions (TransformerLens' ``hook_rot_k`` alone re-rotates the cached keys: compared on
    the new positions)."""
    from transformer_lens import TransformerLensKeyValueCache

    from mi_core.tl.past_key_value_caching import HookedTransformerKeyValueCache

    ours, tl = pair(name)
    out = {}
    for side, m, kv in (("ours", ours, HookedTransformerKeyValueCache),
                        ("tl", tl, TransformerLensKeyValueCache)):
        tokens = m.to_tokens(TEXTS, padding_side=padding_side)
        cache = kv.init_cache(m.cfg, m.cfg.device, 2)
        got = [m(tokens[:, :4], past_kv_cache=cache), m.get_pos_offset(cache, 2)]
        logits, acts = m.run_with_cache(tokens[:, 4:], past_kv_cache=cache)
        got += [logits, cache.previous_attention_mask]
        greedy = []
        for _ in range(3):
            greedy.append(logits[:, -1].argmax(-1, keepdim=True))
            logits = m(greedy[-1], past_kv_cache=cache)
        got += [torch.cat(greedy, 1), {k: v[:, -4:] if "rot_k" in k else v
                                       for k, v in acts.items()}]
        out[side] = got
    a, b = out["ours"], out["tl"]
    assert a[1] == b[1] == 4 and torch.equal(a[3].long(), b[3].long())
    assert torch.equal(a[4], b[4])
    for x, y in [(a[0], b[0]), (a[2], b[2])] + [(a[5][k], b[5][k]) for k in b[5]]:
        assert x.shape == y.shape
        masked = torch.isinf(y)  # attention scores of masked keys: -inf on both sides
        assert torch.equal(masked, torch.isinf(x))
        x, y = x[~masked], y[~masked]
        assert (x - y).abs().max() < 1e-4 * max(1.0, y.abs().max().item())
    assert list(a[5]) == list(b[5])
    with pytest.raises(AssertionError):
        HookedTransformerKeyValueCache.init_cache(ours.cfg, "cpu", 1).freeze()

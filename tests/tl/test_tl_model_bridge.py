"""TransformerLens 3's loading (``TransformerBridge.boot_transformers`` then
``enable_compatibility_mode``) under ``mi_core.tl.model_bridge``, against TransformerLens 3.9's
own bridge on the same files: the logits, the bridge's ``tl_named_parameters``, its block
names ``hook_in`` / ``hook_out``, its filters that skip switched-off points; and the bridge's
methods on ``HookedTransformer`` (a v3 demo whose loading line becomes
``HookedTransformer.from_pretrained`` keeps its other lines)."""

from __future__ import annotations

import warnings

import pytest
import torch

from mi_core import CapabilityError
from mi_core.tl import HookedTransformer
from mi_core.tl.model_bridge import TLBridgeHookError, TransformerBridge

pytest.importorskip("transformer_lens")

TEXT = "When John and Mary went to the shops, John gave the bag to"


def _theirs(path):
    from transformer_lens.model_bridge import TransformerBridge as TLBridge

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TLBridge.boot_transformers(str(path), device="cpu")
        model.enable_compatibility_mode(disable_warnings=True)
    return model


@pytest.fixture(scope="module", params=["gpt2", "smollm2_2l"])
def pair(request, tl_checkpoints):
    path = tl_checkpoints[request.param]
    ours = TransformerBridge.boot_transformers(str(path), device="cpu")
    ours.enable_compatibility_mode(disable_warnings=True)
    return ours, _theirs(path), path


def test_boot_then_compatibility_mode_gives_transformerlens_bridge_logits(pair):
    ours, theirs, _ = pair
    tokens = theirs.to_tokens(TEXT)
    assert torch.equal(ours.to_tokens(TEXT), tokens)  # BOS prepended on both
    with torch.no_grad():
        diff = (ours(tokens) - theirs(tokens)).abs().max().item()
    assert diff < 1e-4, diff


def test_tl_named_parameters_are_the_bridges_names_shapes_and_order(pair):
    ours, theirs, path = pair
    expected = [(n, tuple(p.shape)) for n, p in theirs.tl_named_parameters()]
    assert [(n, tuple(p.shape)) for n, p in ours.tl_named_parameters()] == expected
    plain = HookedTransformer.from_pretrained(str(path))  # the same on HookedTransformer
    assert [(n, tuple(p.shape)) for n, p in plain.tl_named_parameters()] == expected
    for name in ("embed.W_E", "blocks.1.attn.W_K", "unembed.W_U"):
        assert torch.allclose(ours.tl_parameters()[name], theirs.tl_parameters()[name],
                              atol=1e-5), name


def test_block_hook_in_and_hook_out_are_the_residual_stream_around_the_block(pair):
    ours, theirs, _ = pair
    tokens = theirs.to_tokens(TEXT)
    for name in ("blocks.1.hook_in", "blocks.0.hook_out"):
        got = {}

        def keep(x, hook, side):
            got[side] = x.detach().clone()

        with torch.no_grad():
            ours.run_with_hooks(tokens, fwd_hooks=[(name, lambda x, hook: keep(x, hook, "mi"))])
            theirs.run_with_hooks(tokens,
                                  fwd_hooks=[(name, lambda x, hook: keep(x, hook, "tl"))])
        assert (got["mi"] - got["tl"]).abs().max().item() < 1e-4, name


def test_a_filter_skips_switched_off_points_and_a_name_raises_valueerror(pair):
    ours, _, _ = pair
    seen = []
    with pytest.warns(UserWarning, match="gated-off"):
        ours.add_hook(lambda n: n.endswith(("hook_attn_in", "hook_resid_pre")),
                      lambda x, hook: seen.append(hook.name), "fwd")
    with torch.no_grad():
        ours(ours.to_tokens(TEXT))
    ours.reset_hooks()
    assert seen and all(n.endswith("hook_resid_pre") for n in seen)
    with pytest.raises(ValueError, match="use_attn_in"):
        ours.add_hook("blocks.0.hook_attn_in", lambda x, hook: x)
    with pytest.raises(TLBridgeHookError):
        ours.add_hook("blocks.0.attn.hook_result", lambda x, hook: x)


def test_compatibility_mode_on_a_processed_model_leaves_its_weights(tl_checkpoints):
    model = HookedTransformer.from_pretrained(str(tl_checkpoints["gpt2"]))
    before = model.blocks[0].attn.W_Q.clone()
    model.enable_compatibility_mode(disable_warnings=True)
    assert torch.equal(model.blocks[0].attn.W_Q, before)


def test_boot_options_that_cannot_apply_are_refused_by_name(tl_checkpoints):
    with pytest.raises(CapabilityError, match="hf_config_overrides"):
        TransformerBridge.boot_transformers(str(tl_checkpoints["gpt2"]),
                                            hf_config_overrides={"n_layer": 1})

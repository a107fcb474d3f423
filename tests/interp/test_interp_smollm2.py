"""Real-behaviour checks of the analysis layer on SmolLM2-135M-Instruct (shared fixture)."""

from __future__ import annotations

import torch

import mi_core as mi
from mi_core.interp import (
    KnockoutSpec, LogitLensAnalysis, decompose_resid, detect_heads, knockout_hooks,
    repeated_random_tokens, run_for_decomposition, stack_head_results,
)

PROMPT = "The capital of France is"


def test_logit_lens_last_layer_top1_is_the_model_output(smollm2):
    ids = smollm2.to_tokens(PROMPT)
    lens = LogitLensAnalysis(k=5, include_mid=True).run(smollm2, ids)
    out = smollm2.forward(ids).output[0, -1]
    assert lens.points[-1].top[0].token_id == int(out.argmax())
    assert lens.points[-1].top[0].token == " Paris"
    assert [t.token_id for t in lens.points[-1].top] == out.topk(5).indices.tolist()


def test_knockout_of_all_keys_gives_no_nan(smollm2):
    ids = smollm2.to_tokens(PROMPT)
    hooks = knockout_hooks(smollm2, KnockoutSpec(from_positions=[-1]), ids.shape[1])
    out = smollm2.forward(ids, hooks).output
    assert torch.isfinite(out).all()


def test_decomposition_sums_to_the_final_residual(smollm2):
    ids = smollm2.to_tokens(PROMPT)
    cache = run_for_decomposition(smollm2, ids, heads=True)
    stack, _ = decompose_resid(cache, smollm2.num_layers)
    final = cache[mi.HookPoint.resid_post(smollm2.num_layers - 1)]
    # SmolLM2's residual reaches |x| ~ 2500 (first token): F32 sums in a different order
    # differ by ~1e-3 absolute there, so the tolerance is 1e-4 relative to max |x|.
    scale = float(final.abs().max())
    torch.testing.assert_close(stack.sum(0), final, atol=1e-4 * scale, rtol=0)
    torch.testing.assert_close(stack.sum(0)[:, 1:], final[:, 1:], atol=1e-4 * max(1.0, float(final[:, 1:].abs().max())), rtol=0)
    for layer in (0, 15, 29):
        heads, _ = stack_head_results(smollm2, cache, layers=[layer])
        torch.testing.assert_close(heads.sum(0), cache[mi.HookPoint.attn_out(layer)], atol=1e-4, rtol=0)


def test_induction_heads_are_found(smollm2):
    ids = repeated_random_tokens(smollm2, length=12, batch=2, seed=1)
    r = detect_heads(smollm2, ids, kinds=["induction", "previous_token"])
    (layer, head, score), *_ = r.top("induction", 3)
    # measured with length 20 x 4: L18H6 0.85, L17H4 0.72, L17H3 0.66
    assert score > 0.5 and 15 <= layer <= 24
    assert r.top("previous_token", 1)[0][2] > 0.5

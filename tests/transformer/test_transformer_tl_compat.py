"""TransformerLens compatibility, against TransformerLens itself on the same weights.

Reference: a ``HookedTransformer`` built from the tiny LLaMA checkpoint (grouped-query attention,
4 heads / 2 KV heads) by tests.support.tl_hooked (TransformerLens' own weight conversion and
processing). Every comparison is F32 with max abs diff < 1e-4 unless stated (measured: <= 2e-6).

Covers: every shared hook name and the opt-in points (TransformerLens with use_attn_result /
use_split_qkv_input / use_attn_in / use_hook_mlp_in), ActivationCache's shorthand keys and
methods, weight properties, QK/OV, weight processing (weights, logits, DLA, composition
scores), gradients and backward hooks.
"""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.errors import HookError

from tests.support.tiny_families import FAMILIES
from tests.support.tl_hooked import hooked_llama

pytest.importorskip("transformer_lens")

TOL = 1e-4
SEQ = 10
FLAGS = dict(fold_ln=True, center_writing_weights=True, center_unembed=True,
             fold_value_biases=True)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, 128, (2, SEQ), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def ht(tiny_llama):
    return hooked_llama(tiny_llama.path)


@pytest.fixture(scope="module")
def ours(tiny_llama, ids):
    model = tiny_llama.load()
    return model, *model.run_with_cache(ids)


@pytest.fixture(scope="module")
def theirs(ht, ids):
    with torch.no_grad():
        return ht.run_with_cache(ids)


@pytest.fixture(scope="module")
def processed(tiny_llama):
    """(our model processed in place, HookedTransformer with TransformerLens' processing)."""
    model = tiny_llama.load().process_weights(**FLAGS)
    return model, hooked_llama(tiny_llama.path, **FLAGS)


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = TOL) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    a, b = a.detach(), b.detach()
    masked = torch.isneginf(a)  # masked attention scores: -inf on both sides
    if masked.any():
        assert torch.equal(masked, torch.isneginf(b))
        a, b = a[~masked], b[~masked]
    err = (a.float() - b.float()).abs().max().item() if a.numel() else 0.0
    assert err < tol, err
    return err


# -- hook values ---------------------------------------------------------------------------------
def test_every_hook_name_transformerlens_has_holds_its_value(ours, theirs):
    _, logits, cache = ours
    tl_logits, tc = theirs
    _close(logits, tl_logits)
    assert isinstance(cache, mi.ActivationCache) and isinstance(cache, mi.HookCache)
    shared = [k for k in tc.keys() if not k.startswith("unembed.")]  # bridge-style extras only
    assert len(shared) > 60
    for k in shared:
        assert k in cache, k
        _close(cache[k], tc[k])


def test_opt_in_points_match_transformerlens_with_its_flags(tiny_llama, ids):
    """hook_result (use_attn_result), hook_q/k/v_input (use_split_qkv_input), hook_mlp_in."""
    model = tiny_llama.load()
    ht = hooked_llama(tiny_llama.path, use_attn_result=True, use_split_qkv_input=True,
                      use_hook_mlp_in=True)
    names = [f"blocks.1.{p}" for p in ("attn.hook_result", "hook_q_input", "hook_k_input",
                                       "hook_v_input", "hook_mlp_in", "ln1.hook_scale")]
    with torch.no_grad():
        _, tc = ht.run_with_cache(ids, names_filter=names[:5])
    _, cache = model.run_with_cache(ids, names_filter=names)
    for n in names[:5]:
        _close(cache[n], tc[n])

    def patch(t, hook):  # head 1 (and KV head 0) read another prompt's residual
        t[:, :, 1] = t[:, :, 1].flip(1)
        return t

    hooks = [(n, patch) for n in names[1:4]] + [(names[4], lambda t, hook: t * -1.0)]
    with torch.no_grad():
        want = ht.run_with_hooks(ids, fwd_hooks=hooks)
    got = model.run_with_hooks(ids, fwd_hooks=hooks)
    _close(got, want)
    assert (got - model.forward(ids).output).abs().max().item() > 1e-3


def test_attn_in_intervention_matches_transformerlens_use_attn_in(tmp_path, ids):
    """On a multi-head (not grouped) LLaMA: TransformerLens' use_attn_in does not support GQA."""
    from tests.transformer.conftest import make_tiny

    tiny = make_tiny(tmp_path, "llama_mha", "llama", {"num_key_value_heads": 4})
    model = tiny.load()
    ht = hooked_llama(tiny.path, use_attn_in=True)

    def patch(t, hook):
        t[:, :, 3] = 0.5 * t[:, :, 3]
        t[:, 2:, 0] = t[:, :-2, 0].clone()
        return t

    with torch.no_grad():
        want = ht.run_with_hooks(ids, fwd_hooks=[("blocks.0.hook_attn_in", patch)])
    _close(model.run_with_hooks(ids, fwd_hooks=[("blocks.0.hook_attn_in", patch)]), want)


# -- ActivationCache -----------------------------------------------------------------------------
@pytest.mark.parametrize("key", [("resid_pre", 1), ("pattern", 2), ("q", 0), ("resid_post", -1),
                                 ("scale", 1, "ln2"), ("normalized",), ("embed",), ("k2",),
                                 ("post", 1), ("pre_linear", 0), ("attn_scores", 1),
                                 ("blocks.1.hook_mlp_out",)])
def test_shorthand_keys_are_transformerlens_get_act_name(ours, theirs, key):
    from transformer_lens.utils import get_act_name

    _, _, cache = ours
    _, tc = theirs
    k = key if len(key) > 1 else key[0]
    _close(cache[k], tc[k])
    if isinstance(k, tuple) and k[1] >= 0:
        assert mi.get_act_name(*k) == get_act_name(*k)


CASES = [
    ("accumulated_resid", dict()),
    ("accumulated_resid", dict(layer=2, incl_mid=True, apply_ln=True, pos_slice=-1)),
    ("accumulated_resid", dict(apply_ln=True)),  # final layer: the full norm, recomputed
    ("accumulated_resid", dict(layer=1, mlp_input=True, apply_ln=True, pos_slice=(2, 7))),
    ("decompose_resid", dict()),
    ("decompose_resid", dict(layer=2, mlp_input=True, apply_ln=True, pos_slice=[1, 4])),
    ("decompose_resid", dict(mode="attn", incl_embeds=False, apply_ln=True)),
    ("decompose_resid", dict(mode="mlp", pos_slice=-1)),
    ("stack_head_results", dict()),
    ("stack_head_results", dict(layer=2, incl_remainder=True, apply_ln=True, pos_slice=-1)),
    ("stack_neuron_results", dict(layer=2, apply_ln=True, pos_slice=-1)),
    ("stack_neuron_results", dict(layer=3, neuron_slice=(0, 10), incl_remainder=True)),
    ("get_full_resid_decomposition", dict(apply_ln=True, pos_slice=-1)),
    ("get_full_resid_decomposition", dict(layer=1, mlp_input=True, expand_neurons=False)),
]


@pytest.mark.parametrize("method,kwargs", CASES, ids=[f"{m}-{i}" for i, (m, _) in
                                                      enumerate(CASES)])
def test_cache_method_equals_transformerlens(ours, theirs, method, kwargs):
    _, _, cache = ours
    _, tc = theirs
    a, la = getattr(cache, method)(return_labels=True, **kwargs)
    with torch.no_grad():
        b, lb = getattr(tc, method)(return_labels=True, **kwargs)
    assert la == lb
    _close(a, b)


def test_projected_neuron_results_equal_transformerlens(ours, theirs):
    _, _, cache = ours
    _, tc = theirs
    p = torch.randn(64, 3, generator=torch.Generator().manual_seed(1))
    for kw in (dict(apply_ln=True), dict(apply_ln=False)):
        a = cache.stack_neuron_results(2, pos_slice=-1, project_output_onto=p, **kw)
        with torch.no_grad():
            b = tc.stack_neuron_results(2, pos_slice=-1, project_output_onto=p, **kw)
        _close(a, b)


def test_logit_attrs_and_apply_ln_to_stack_equal_transformerlens(ours, theirs, ht, ids):
    model, _, cache = ours
    _, tc = theirs
    stack = cache.decompose_resid(pos_slice=-1)
    with torch.no_grad():
        tstack = tc.decompose_resid(pos_slice=-1)
    _close(cache.apply_ln_to_stack(stack, pos_slice=-1), tc.apply_ln_to_stack(tstack, pos_slice=-1))
    good, bad = torch.tensor([5, 7]), torch.tensor([9, 11])
    for args in ((good,), (good, bad), (5, 9)):
        with torch.no_grad():
            want = tc.logit_attrs(tstack, *args, pos_slice=-1)
        _close(cache.logit_attrs(stack, *args, pos_slice=-1), want)
    _close(model.tokens_to_residual_directions(good), ht.tokens_to_residual_directions(good))
    with pytest.raises(mi.MIError, match="same shape"):
        cache.logit_attrs(stack, good, torch.tensor([1, 2, 3]), pos_slice=-1)


def test_compute_head_results_and_remove_batch_dim(tiny_llama, ids):
    model = tiny_llama.load()
    _, cache = model.run_with_cache(ids[:1], names_filter=lambda n: n.endswith(("hook_z",
                                                                               "attn_out")))
    cache.compute_head_results()
    res = cache["result", 1]
    # heads sum to the attention output (LLaMA has no b_O)
    _close(res.sum(-2), cache["attn_out", 1], 1e-5)
    cache.remove_batch_dim()
    assert cache["z", 0].shape == (SEQ, 4, 16)


def test_cache_errors_name_the_missing_point(tiny_llama, ids):
    model = tiny_llama.load()
    _, cache = model.run_with_cache(ids, names_filter="blocks.0.hook_resid_pre")
    with pytest.raises(HookError, match="blocks.1.hook_resid_pre"):
        cache["resid_pre", 1]
    with pytest.raises(HookError, match="ln_final.hook_scale"):
        cache.apply_ln_to_stack(cache["resid_pre", 0][None])


# -- weights -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["W_E", "W_U", "b_U", "W_Q", "W_K", "W_V", "_W_K", "_W_V",
                                  "W_O", "W_in", "W_gate", "W_out", "b_Q", "b_K", "b_V", "_b_K",
                                  "b_O", "b_in", "b_out"])
def test_weight_properties_have_transformerlens_values_and_shapes(ours, ht, name):
    model = ours[0]
    if name.startswith("_"):
        want = torch.stack([getattr(b.attn, name) for b in ht.blocks])
    else:
        want = getattr(ht, name)
    _close(getattr(model, name), want, 1e-6)


def test_qk_and_ov_are_factored_per_head(ours, ht):
    model = ours[0]
    assert isinstance(model.QK, mi.FactoredMatrix)
    assert tuple(model.OV.shape) == (3, 4, 64, 64)
    _close(model.QK.AB, ht.QK.AB, 1e-5)
    _close(model.OV.AB, ht.OV.AB, 1e-5)


# -- weight processing ---------------------------------------------------------------------------
def test_processed_weights_equal_transformerlens_and_logits_are_unchanged(processed, ours, ids):
    model, ht_p = processed
    base = ours[1]
    logits = model.forward(ids).output
    # centre_unembed shifts every logit of a position equally: compare after removing the mean
    centred = base - base.mean(-1, keepdim=True)
    _close(logits - logits.mean(-1, keepdim=True), centred, 1e-4)
    _close(torch.log_softmax(logits, -1), torch.log_softmax(base, -1), 1e-4)
    with torch.no_grad():
        _close(logits, ht_p(ids), 1e-4)
    for name in ("W_U", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_gate", "W_out", "b_O", "W_E"):
        _close(getattr(model, name), getattr(ht_p, name), 1e-5)
    for block in ht_p.blocks:  # RMSNorm: TransformerLens folds the gain only, leaving RMSNormPre
        assert type(block.ln1).__name__ == "RMSNormPre"


def test_dla_and_composition_scores_equal_transformerlens_defaults(processed, ids):
    model, ht_p = processed
    _, cache = model.run_with_cache(ids)
    with torch.no_grad():
        _, tc = ht_p.run_with_cache(ids)
    heads = cache.stack_head_results(pos_slice=-1, apply_ln=True)
    with torch.no_grad():
        t_heads = tc.stack_head_results(pos_slice=-1, apply_ln=True)
    _close(heads, t_heads)
    tok, wrong = torch.tensor([5, 6]), torch.tensor([7, 8])
    with torch.no_grad():
        want = tc.logit_attrs(t_heads, tok, wrong, pos_slice=-1)
    _close(cache.logit_attrs(heads, tok, wrong, pos_slice=-1), want)
    from mi_core.interp import composition_scores

    for kind in ("q", "k", "v"):
        with torch.no_grad():
            want = ht_p.all_composition_scores(kind.upper())
        _close(composition_scores(model, kind).scores, want, 1e-5)


def test_from_pretrained_flags_process_the_weights(tiny_llama, processed):
    model = mi.MIModel.from_pretrained(tiny_llama.path, backend="transformer", **FLAGS)
    _close(model.W_U, processed[0].W_U, 0.0 + 1e-7)


# -- gradients -----------------------------------------------------------------------------------
def _metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 5].sum() - logits[:, -1, 7].sum()


def test_capture_grad_equals_autograd_of_an_explicit_computation(ours, ids):
    model = ours[0]
    points = ["blocks.1.hook_resid_pre", "blocks.1.attn.hook_z", "blocks.2.mlp.hook_post"]
    spec = mi.HookSpec().capture_all(points)
    for p in points:
        spec.capture_grad(p)
    cache = model.forward(ids, spec)
    _metric(cache.output).backward()
    # explicit: the same forward with each point replaced by a leaf we differentiate
    for p in points:
        leaf = cache[p].detach().clone().requires_grad_(True)
        out = model.forward(ids, mi.HookSpec().intervene(p, lambda t, hook: leaf))
        (g,) = torch.autograd.grad(_metric(out.output), leaf)
        _close(cache.grad(p), g, 1e-5)
    with pytest.raises(HookError, match="capture_grad"):
        model.forward(ids).grad(points[0])
    with torch.inference_mode(), pytest.raises(mi.MIError, match="inference_mode"):
        model.forward(ids, mi.HookSpec().capture_grad(points[0]))


def test_backward_hooks_equal_transformerlens_backward_hooks(ours, ht, ids):
    model = ours[0]
    names = lambda n: n.endswith(("hook_resid_mid", "attn.hook_pattern"))  # noqa: E731
    got: dict[str, torch.Tensor] = {}
    want: dict[str, torch.Tensor] = {}

    def keep(store):
        def hook(grad, hook):
            store[hook.name] = grad.detach().clone()
        return hook

    _metric(model.run_with_hooks(ids, bwd_hooks=[(names, keep(got))])).backward()
    ht.reset_hooks()
    ht.add_hook(names, keep(want), dir="bwd")
    _metric(ht(ids)).backward()
    ht.reset_hooks()
    assert set(got) == set(want) and len(got) == 6
    for k in want:
        _close(got[k], want[k], 1e-5)


def test_backward_hook_return_replaces_the_gradient(ours, ids):
    model = ours[0]
    spec = mi.HookSpec().capture_grad("blocks.0.hook_resid_pre")
    spec.add_backward_hook("blocks.1.hook_resid_pre", lambda g, hook: torch.zeros_like(g))
    cache = model.forward(ids, spec)
    _metric(cache.output).backward()
    # everything flows through resid_pre 1: zeroing its gradient zeroes the earlier one
    assert cache.grad("blocks.0.hook_resid_pre").abs().max().item() == 0.0


def test_layernorm_processing_equals_transformerlens_on_gpt2(tiny, ids):
    """LayerNorm with biases, learned positions and value biases: every step of the processing
    (bias folding, centring of reading and writing weights, value-bias folding) as TL's."""
    from tests.support.tl_hooked import hooked_gpt2

    t = tiny("gpt2")
    base = t.load().forward(ids).output
    model = t.load().process_weights(**FLAGS)
    ht_p = hooked_gpt2(t.path, **FLAGS)
    logits = model.forward(ids).output
    with torch.no_grad():
        _close(logits, ht_p(ids))
    _close(torch.log_softmax(logits, -1), torch.log_softmax(base, -1))
    for name in ("W_E", "W_pos", "W_U", "b_U", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_out",
                 "b_Q", "b_K", "b_V", "b_O", "b_in", "b_out"):
        _close(getattr(model, name), getattr(ht_p, name), 1e-5)
    _, cache = model.run_with_cache(ids)
    with torch.no_grad():
        _, tc = ht_p.run_with_cache(ids)
    for k in tc.keys():
        if not k.startswith("unembed."):  # TransformerLens 3's unembed module hooks
            _close(cache[k], tc[k])
    a = cache.get_full_resid_decomposition(apply_ln=True, pos_slice=-1, expand_neurons=False)
    with torch.no_grad():
        b = tc.get_full_resid_decomposition(apply_ln=True, pos_slice=-1, expand_neurons=False)
    _close(a, b)


_MOE = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "glm4_moe", "ernie4_5_moe"}


@pytest.mark.parametrize("name", [n for n in FAMILIES if n not in _MOE])
def test_process_weights_keeps_every_familys_predictions(tiny, name):
    """Every non-MoE family: after fold_ln, centring and value-bias folding the log-probs are
    the unprocessed model's (< 1e-4); the unembedding's centring shifts logits only by a
    per-position constant, so it is left out where a final soft-cap follows it."""
    t = tiny(name)
    ids = torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(5))
    base = t.load().forward(ids).output
    model = t.load()
    capped = getattr(model.config, "final_softcap", None) is not None
    model.process_weights(**dict(FLAGS, center_unembed=not capped))
    out = model.forward(ids).output
    _close(torch.log_softmax(out, -1), torch.log_softmax(base, -1))


@pytest.mark.parametrize("name", sorted(_MOE))
def test_process_weights_refuses_to_fold_moe_models(tiny, name):
    model = tiny(name).load()
    with pytest.raises(mi.MIError, match="mixture-of-experts"):
        model.process_weights()
    model.process_weights(fold_ln=False, center_writing_weights=False)  # the rest is fine

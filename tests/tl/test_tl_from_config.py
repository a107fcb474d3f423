"""``HookedTransformer(cfg)`` under ``mi_core.tl``: a ``HookedTransformerConfig`` of a shape
a family holds (GPT-2, LLaMA, Helium, StarCoder2; see SHAPES) gives TransformerLens' randomly
initialised model (the same seed or random state, the same weights, and the random state
after it the same), and ``load_state_dict`` takes a TransformerLens model's state dict (its
buffers left out): the two ways a test builds a tiny model on both sides with only the
imports changed (issue 25)."""

from __future__ import annotations

import re

import pytest
import torch

import mi_core.tl as mtl
from mi_core import CapabilityError

tl = pytest.importorskip("transformer_lens")

FIELDS = dict(n_layers=2, d_model=64, n_ctx=32, d_head=16, n_heads=4, d_vocab=300,
              act_fn="gelu_new", normalization_type="LN")
TOKENS = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("seed", [0, None])
def test_config_gives_transformerlens_random_model(seed):
    torch.manual_seed(5)
    theirs = tl.HookedTransformer(tl.HookedTransformerConfig(**FIELDS, seed=seed))
    after_theirs = torch.rand(3)
    torch.manual_seed(5)
    ours = mtl.HookedTransformer(mtl.HookedTransformerConfig(**FIELDS, seed=seed))
    assert torch.equal(torch.rand(3), after_theirs)  # later draws in a script agree too
    mine = dict(ours.named_parameters())
    assert [n for n, _ in theirs.named_parameters()] == list(mine)
    for name, p in theirs.named_parameters():
        assert torch.equal(p, mine[name]), name
    for field in ("d_mlp", "n_params", "initializer_range", "n_heads", "d_vocab_out"):
        assert getattr(ours.cfg, field) == getattr(theirs.cfg, field), field
    with torch.no_grad():
        # measured 1.1e-6 of logits ~3 (LayerNorm models: F32 rounding, docs)
        assert (ours(TOKENS) - theirs(TOKENS)).abs().max().item() < 1e-4


def _assert_same_cache(ours, theirs) -> None:
    """The same cache keys, every activation and the logits within 1e-5 of TransformerLens'."""
    tokens = TOKENS % 100
    with torch.no_grad():
        want_logits, want = theirs.run_with_cache(tokens)
        logits, got = ours.run_with_cache(tokens)
    assert sorted(got.keys()) == sorted(want.keys())
    assert max((want[k] - got[k]).abs().max().item() for k in want.keys()) < 1e-5
    assert (logits - want_logits).abs().max().item() < 1e-5


def test_load_state_dict_of_transformerlens_model():
    theirs = tl.HookedTransformer(tl.HookedTransformerConfig(**FIELDS, seed=3))
    ours = mtl.HookedTransformer(mtl.HookedTransformerConfig(**FIELDS))
    ours.load_state_dict(theirs.state_dict())  # strict: every parameter, buffers left out
    _, want = theirs.run_with_cache(TOKENS)
    logits, got = ours.run_with_cache(TOKENS)
    assert max((want[k] - got[k]).abs().max().item() for k in want.keys()) < 1e-5
    assert torch.allclose(ours(TOKENS, return_type="loss"), theirs(TOKENS, return_type="loss"),
                          atol=1e-5)


#: TransformerLens shapes beyond GPT-2's default: mi-transformer writes each as its
#: plugin-internal checkpoint (mi_transformer/tl_config.py, config/families_tl.py), with
#: learned or rotary positions, LayerNorm or RMS norms, plain or gated MLPs or none
#: (attn_only), multi-head or grouped-query attention and the unembedding's bias
ROTARY = dict(positional_embedding_type="rotary")
SHAPES = {
    "gpt2_relu_scaled_by_layer": dict(act_fn="relu", scale_attn_by_inverse_layer_idx=True),
    "gpt2_lnpre_silu": dict(act_fn="silu", normalization_type="LNPre"),
    "gpt2_gelu_unscaled": dict(act_fn="gelu", use_attn_scale=False),
    "llama_gqa": dict(ROTARY, act_fn="silu", normalization_type="RMS", gated_mlp=True,
                      n_key_value_heads=2, d_mlp=96, rotary_base=500000),
    "llama_rmspre_partial": dict(ROTARY, act_fn="gelu", normalization_type="RMSPre",
                                 gated_mlp=True, rotary_dim=8, d_head=8),
    "helium_adjacent_pairs": dict(ROTARY, act_fn="silu", normalization_type="RMS",
                                  gated_mlp=True, rotary_adjacent_pairs=True, rotary_dim=8),
    "starcoder2_gqa_wide_heads": dict(ROTARY, n_key_value_heads=1, d_head=32),
    "starcoder2_lnpre_relu": dict(ROTARY, act_fn="relu", normalization_type="LNPre"),
    # ARENA's induction models: attention only, learned positions, LayerNorm
    "attn_only_learned": dict(attn_only=True, d_mlp=None),
    "attn_only_rotary_rms_gqa": dict(ROTARY, attn_only=True, normalization_type="RMS",
                                     n_key_value_heads=2),
    "learned_rms_gated_gqa_narrow_heads": dict(normalization_type="RMS", gated_mlp=True,
                                               act_fn="silu", n_key_value_heads=2, d_head=8),
    "rotary_ln_gated_adjacent_partial": dict(ROTARY, gated_mlp=True, rotary_dim=8,
                                             rotary_adjacent_pairs=True),
    "rotary_rms_plain_unscaled_by_layer": dict(ROTARY, normalization_type="RMS",
                                               use_attn_scale=False,
                                               scale_attn_by_inverse_layer_idx=True),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_config_shape_gives_transformerlens_model(shape):
    """Each shape a family holds: the same seed gives TransformerLens' weights (names in its
    order), and after ``load_state_dict`` of a TransformerLens model whose every parameter
    (norm gains and biases too) is perturbed, every cached activation and the logits agree
    (b_U included; measured: at most 5e-6; a gated MLP's b_in / b_out stay 0: see
    test_config_bias_no_family_holds_is_refused_at_the_forward)."""
    fields = {**FIELDS, "d_vocab": 100, **SHAPES[shape]}
    theirs = tl.HookedTransformer(tl.HookedTransformerConfig(**fields, seed=3))
    ours = mtl.HookedTransformer(mtl.HookedTransformerConfig(**fields, seed=3))
    mine = dict(ours.named_parameters())
    assert [n for n, _ in theirs.named_parameters()] == list(mine)
    for name, p in theirs.named_parameters():
        assert torch.equal(p, mine[name]), name
    g = torch.Generator().manual_seed(7)
    kept = ("mlp.b_in", "mlp.b_out") if fields.get("gated_mlp") else ("no such name",)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if not name.endswith(kept):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    ours.load_state_dict(theirs.state_dict())
    _assert_same_cache(ours, theirs)


@pytest.mark.parametrize("shape", ["attn_only_learned", "attn_only_rotary_rms_gqa"])
def test_config_attn_only_process_weights_as_transformerlens(shape):
    """An attention-only model with a nonzero b_U: process_weights_ (fold_ln, centring,
    b_U centred with W_U) gives TransformerLens' processed parameters and activations
    (measured: parameters 9e-8, activations and logits 2e-6)."""
    fields = {**FIELDS, "d_vocab": 100, "d_mlp": None, **SHAPES[shape]}
    theirs = tl.HookedTransformer(tl.HookedTransformerConfig(**fields, seed=3))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    ours = mtl.HookedTransformer(mtl.HookedTransformerConfig(**fields))
    ours.load_state_dict(theirs.state_dict())
    for model in (theirs, ours):
        model.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
    mine = dict(ours.named_parameters())
    assert [n for n, _ in theirs.named_parameters()] == list(mine)
    assert max((p - mine[n]).abs().max().item() for n, p in theirs.named_parameters()) < 1e-6
    _assert_same_cache(ours, theirs)


def test_config_bias_no_family_holds_is_refused_at_the_forward():
    """A gated MLP's b_in (added after the gate's product) and b_out have no place in the
    checkpoint: loaded nonzero, the forward refuses by name."""
    fields = {**FIELDS, **SHAPES["llama_gqa"]}
    theirs = tl.HookedTransformer(tl.HookedTransformerConfig(**fields, seed=3))
    ours = mtl.HookedTransformer(mtl.HookedTransformerConfig(**fields))
    for name in ("blocks.0.mlp.b_in", "blocks.1.mlp.b_out"):
        state = theirs.state_dict()
        state[name] = state[name] + 1.0
        ours.load_state_dict(state)
        with pytest.raises(CapabilityError, match=re.escape(name)):
            ours(TOKENS)


@pytest.mark.parametrize("fields, field", [
    (dict(normalization_type=None), "normalization_type=None"),
    (dict(positional_embedding_type="shortformer"), "positional_embedding_type='shortformer'"),
    (dict(d_vocab_out=100), "d_vocab_out=100"),
    (dict(ROTARY, parallel_attn_mlp=True), "parallel_attn_mlp=True"),
    (dict(n_key_value_heads=4), "n_key_value_heads=4"),
    (dict(ROTARY, rotary_dim=7), "rotary_dim=7"),
    (dict(act_fn="solu_ln"), "act_fn='solu_ln'"),
    (dict(final_rms=True), "final_rms=True"),
    (dict(init_mode="kaiming_normal"), "init_mode='kaiming_normal'"),  # the ring's own
])
def test_config_no_family_can_hold_is_refused_by_field(fields, field):
    with pytest.raises(CapabilityError, match=re.escape(field)):
        mtl.HookedTransformer(mtl.HookedTransformerConfig(**{**FIELDS, **fields}))


def test_config_no_plugin_can_express_is_refused(monkeypatch):
    """The checkpoint comes from a plugin (``mi_checkpoint_from_config``): with none that
    answers, a CapabilityError says so, and the temporary directory is removed."""
    import os
    import types

    import mi_core.plugin
    from mi_core.tl import from_config

    made = []
    real_mkdtemp = from_config.tempfile.mkdtemp

    def mkdtemp(**kwargs):
        made.append(real_mkdtemp(**kwargs))
        return made[-1]

    hook = types.SimpleNamespace(mi_checkpoint_from_config=lambda **kwargs: None)
    monkeypatch.setattr(mi_core.plugin, "get_plugin_manager",
                        lambda: types.SimpleNamespace(hook=hook))
    monkeypatch.setattr(from_config.tempfile, "mkdtemp", mkdtemp)
    with pytest.raises(CapabilityError, match="no installed plugin can build a model"):
        mtl.HookedTransformer(mtl.HookedTransformerConfig(**FIELDS))
    assert made and not any(os.path.exists(d) for d in made)


def test_config_with_a_tokenizer_as_transformerlens(tl_checkpoints):
    """``HookedTransformer(cfg, tokenizer)``: d_vocab -1 read from the tokenizer, BOS
    prepended, the same tokens and logits as TransformerLens'."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tl_checkpoints["smollm2_2l"]))
    fields = {**FIELDS, "d_vocab": -1, "seed": 1}
    theirs = tl.HookedTransformer(tl.HookedTransformerConfig(**fields), tokenizer=tok)
    ours = mtl.HookedTransformer(mtl.HookedTransformerConfig(**fields), tok)
    assert ours.cfg.d_vocab == theirs.cfg.d_vocab
    texts = ["When John and Mary went to the shops,", "Hi"]
    tokens = theirs.to_tokens(texts)
    assert torch.equal(ours.to_tokens(texts), tokens)
    with torch.no_grad():
        assert (ours(texts) - theirs(texts)).abs().max().item() < 1e-4

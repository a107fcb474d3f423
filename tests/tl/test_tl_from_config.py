"""``HookedTransformer(cfg)`` under ``mi_core.tl``: a GPT-2-shaped ``HookedTransformerConfig``
gives TransformerLens' randomly initialised model (the same seed or random state, the same
weights, and the random state after it the same), and ``load_state_dict`` takes a
TransformerLens model's state dict (its buffers left out): the two ways a test builds a tiny
GPT-2 on both sides with only the imports changed (issue 25)."""

from __future__ import annotations

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


def test_load_state_dict_of_transformerlens_model():
    theirs = tl.HookedTransformer(tl.HookedTransformerConfig(**FIELDS, seed=3))
    ours = mtl.HookedTransformer(mtl.HookedTransformerConfig(**FIELDS))
    ours.load_state_dict(theirs.state_dict())  # strict: every parameter, buffers left out
    _, want = theirs.run_with_cache(TOKENS)
    logits, got = ours.run_with_cache(TOKENS)
    assert max((want[k] - got[k]).abs().max().item() for k in want.keys()) < 1e-5
    assert torch.allclose(ours(TOKENS, return_type="loss"), theirs(TOKENS, return_type="loss"),
                          atol=1e-5)


def test_config_gpt2_cannot_hold_is_refused_by_field():
    with pytest.raises(CapabilityError, match="gated_mlp"):
        mtl.HookedTransformer(mtl.HookedTransformerConfig(**FIELDS, gated_mlp=True))
    with pytest.raises(CapabilityError, match="d_head"):
        mtl.HookedTransformer(mtl.HookedTransformerConfig(**{**FIELDS, "d_head": 8}))
    with pytest.raises(CapabilityError, match="init_mode='kaiming_normal'"):  # the ring's own
        mtl.HookedTransformer(mtl.HookedTransformerConfig(**FIELDS, init_mode="kaiming_normal"))


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

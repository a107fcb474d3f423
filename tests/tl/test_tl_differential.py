"""Differential checks of ``mi_core.tl`` against TransformerLens on the same weights, beyond
the main tests (test_tl_hooked_transformer.py): the tree's modules called on their own (a
logit lens ``model.unembed(model.ln_final(resid))``, ``blocks[i].mlp(x)``, ``blocks[i](x)``),
forward and cache options with non-default arguments, TransformerLens' utilities and cache
methods, the patching and head-detector functions, and the exception kinds TransformerLens
raises for what cannot apply.

Models as in test_tl_hooked_transformer.py (SmolLM2's first two layers, a GPT-2-shaped tiny
model), each side loaded with TransformerLens' defaults (processed weights, BOS prepended) and,
where named, without processing. F32, 1e-4 absolute unless noted (measured ~1e-5).
"""

from __future__ import annotations

import pytest
import torch

from mi_core.tl import FactoredMatrix, HookedTransformer, utils

TOL = 1e-4
TEXTS = ["The cat sat on the mat.", "The cat sat on the mat really hard."]


def _close(a, b, tol: float = TOL) -> None:
    if isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _close(x, y, tol)
        return
    if not isinstance(a, torch.Tensor):
        assert a == b
        return
    assert a.shape == b.shape, (a.shape, b.shape)
    assert (a.detach().float() - b.detach().float()).abs().max().item() < tol


@pytest.mark.parametrize("name", ["smollm2_2l", "gpt2"])
def test_modules_called_on_their_own_compute_as_transformerlens(pair, name):
    """Embed / PosEmbed / Unembed / the norms / the MLP compute TransformerLens' formulas
    through their hook points; a block runs the model from it to the next; attention alone
    is refused by name (the kernel computes it inside the forward)."""
    import mi_core as mi

    ours, tl = pair(name)
    tokens = tl.to_tokens(TEXTS)
    x = 3 * torch.randn(2, tokens.shape[1], ours.cfg.d_model,
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _close(ours.embed(tokens), tl.embed(tokens))
        _close(ours.unembed(x), tl.unembed(x))
        for mod in ("ln_final", "blocks.1.ln1", "blocks.0.ln2", "blocks.1.mlp"):
            a, b = ours.get_submodule(mod), tl.get_submodule(mod)
            _close(a(x), b(x))
        _, cache = ours.run_with_cache(TEXTS, padding_side="left")
        _, tc = tl.run_with_cache(TEXTS, padding_side="left")
        mask = (ours.to_tokens(TEXTS, padding_side="left") != ours.tokenizer.pad_token_id)
        # a logit lens written with the modules (real positions: pads differ in TL itself)
        _close(ours.unembed(ours.ln_final(cache["resid_post", 0]))[mask],
               tl.unembed(tl.ln_final(tc["resid_post", 0]))[mask])
        out = ours.blocks[1](cache["resid_pre", 1], attention_mask=mask.long())
        _close(out[mask], tc["resid_post", 1][mask])
        if name == "gpt2":
            _close(ours.pos_embed(tokens, 2), tl.pos_embed(tokens, 2))
            _close(ours.pos_embed(tokens, 0, mask.long()), tl.pos_embed(tokens, 0, mask.long()))
        for m in (ours, tl):  # a hook on a point inside a module called alone fires
            m.ln_final.hook_scale.add_hook(lambda s, hook: 2 * s)
        _close(ours.ln_final(x), tl.ln_final(x))
        ours.reset_hooks()
        tl.reset_hooks()
    with pytest.raises(mi.CapabilityError, match="attention module"):
        ours.blocks[0].attn(x, x, x)


def test_unprocessed_norms_and_mlp_use_their_weights(tl_checkpoints):
    from transformers import AutoTokenizer

    from tests.support.tl_hooked import hooked_gpt2

    ours = HookedTransformer.from_pretrained_no_processing(tl_checkpoints["gpt2"])
    tok = AutoTokenizer.from_pretrained(str(tl_checkpoints["gpt2"]))
    tl = hooked_gpt2(tl_checkpoints["gpt2"], tokenizer=tok, default_prepend_bos=True)
    x = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for mod in ("ln_final", "blocks.0.ln1", "blocks.1.mlp", "blocks.0"):
            _close(ours.get_submodule(mod)(x), tl.get_submodule(mod)(x))


@pytest.mark.parametrize("name", ["smollm2_2l", "gpt2"])
def test_forward_and_cache_options_as_transformerlens(pair, name):
    ours, tl = pair(name)
    tokens = tl.to_tokens(TEXTS[1])
    with torch.no_grad():
        both, tboth = ours(tokens, return_type="both"), tl(tokens, return_type="both")
        assert both._fields == tboth._fields
        _close(tuple(both), tuple(tboth))
        for stop in (-2, -1, 1):
            _close(ours(tokens, stop_at_layer=stop), tl(tokens, stop_at_layer=stop))
        resid = tl(tokens, stop_at_layer=1)
        _close(ours(resid, start_at_layer=-1), tl(resid, start_at_layer=-1))
        _close(ours(TEXTS[1], tokens=tokens), tl(TEXTS[1], tokens=tokens))
        mask = torch.ones_like(tokens)
        mask[0, :2] = 0
        _close(ours(tokens, attention_mask=mask)[0, 2:], tl(tokens, attention_mask=mask)[0, 2:])
        _close(ours.loss_fn(ours(tokens), tokens, attention_mask=mask),
               tl.loss_fn(tl(tokens), tokens, attention_mask=mask))
        _close(ours.run_with_hooks(TEXTS, return_type="loss", loss_per_token=True),
               tl.run_with_hooks(TEXTS, return_type="loss", loss_per_token=True))
        for kwargs in (dict(return_type=None), dict(return_type="loss"),
                       dict(stop_at_layer=-1), dict(prepend_bos=False)):
            a, b = ours.run_with_cache(TEXTS[0], **kwargs), tl.run_with_cache(TEXTS[0], **kwargs)
            assert (a[0] is None) == (b[0] is None), kwargs
            if a[0] is not None:
                _close(a[0], b[0])
            assert list(a[1].keys()) == list(b[1].keys()), kwargs
        for names in ("blocks.0.hook_resid_post", ["hook_embed", "blocks.1.attn.hook_z"]):
            a = ours.run_with_cache(tokens, names_filter=names, device="cpu")[1]
            b = tl.run_with_cache(tokens, names_filter=names, device="cpu")[1]
            assert list(a.keys()) == list(b.keys())
        for layer in (-1, 0, 1):
            _close(ours.accumulated_bias(layer, mlp_input=True),
                   tl.accumulated_bias(layer, mlp_input=True))
    for m in (ours, tl):
        with pytest.raises(AssertionError):
            m.accumulated_bias(m.cfg.n_layers, mlp_input=True)
        with pytest.raises(AssertionError, match="tokens must be passed in"):
            m(resid, start_at_layer=1, return_type="loss")


@pytest.mark.parametrize("name", ["smollm2_2l", "gpt2"])
def test_cache_methods_as_transformerlens(pair, name):
    ours, tl = pair(name)
    tokens = tl.to_tokens(TEXTS)
    with torch.no_grad():
        _, c = ours.run_with_cache(tokens)
        _, t = tl.run_with_cache(tokens)
    calls = [("accumulated_resid", dict(layer=1, incl_mid=True, return_labels=True)),
             ("accumulated_resid", dict(apply_ln=True, pos_slice=-1)),
             ("accumulated_resid", dict(layer=1, mlp_input=True)),
             ("decompose_resid", dict(layer=1, mode="attn", return_labels=True)),
             ("decompose_resid", dict(apply_ln=True, pos_slice=-1, incl_embeds=False)),
             ("stack_head_results", dict(layer=1, apply_ln=True, pos_slice=-1)),
             ("stack_head_results", dict(incl_remainder=True, return_labels=True)),
             ("stack_neuron_results", dict(layer=1, neuron_slice=(0, 5), return_labels=True)),
             ("stack_activation", dict(activation_name="scale", sublayer_type="ln1")),
             ("get_full_resid_decomposition", dict(expand_neurons=False, return_labels=True)),
             ("get_full_resid_decomposition", dict(layer=1, apply_ln=True, pos_slice=-1)),
             ("get_neuron_results", dict(layer=0, neuron_slice=[1, 2]))]
    for method, kwargs in calls:
        _close(getattr(c, method)(**kwargs), getattr(t, method)(**kwargs))
    resid = t.accumulated_resid(pos_slice=-1)
    for kwargs in (dict(pos_slice=-1), dict(layer=1, pos_slice=-1),
                   dict(pos_slice=-1, recompute_ln=True)):
        _close(c.apply_ln_to_stack(resid, **kwargs), t.apply_ln_to_stack(resid, **kwargs))
    mat, cat = tl.to_single_token(" mat"), tl.to_single_token(" cat")
    _close(c.logit_attrs(resid, tokens=" mat", incorrect_tokens=" cat", pos_slice=-1),
           t.logit_attrs(resid, tokens=" mat", incorrect_tokens=" cat", pos_slice=-1))
    _close(c.logit_attrs(resid, tokens=torch.tensor([mat, cat]), pos_slice=-1),
           t.logit_attrs(resid, tokens=torch.tensor([mat, cat]), pos_slice=-1))
    _close(c["scale", 0, "ln1"], t["scale", 0, "ln1"])
    _close(c["ln_final.hook_scale"], t["ln_final.hook_scale"])
    _close(c.apply_slice_to_batch_dim(0)["q", -1], t.apply_slice_to_batch_dim(0)["q", -1])
    for cache in (c, t):
        with pytest.raises(KeyError):
            cache.stack_head_results(5)
        with pytest.raises(AssertionError):
            cache.remove_batch_dim()  # a batch of 2


def test_utilities_and_act_names_as_transformerlens():
    from transformer_lens import FactoredMatrix as TLFactoredMatrix
    from transformer_lens import utils as tu

    for args in [("embed",), ("pos_embed",), ("attn_scores", 0), ("rot_k", 1), ("scale",),
                 ("scale", 0, "ln1"), ("normalized", None, "ln_final"), ("k", 0, "a"),
                 ("pre", 0, "mlp"), ("scale4ln1",), ("resid_post11",), ("pattern2",),
                 ("blocks.0.attn.hook_z",), ("pre_linear", 0), ("q_input", 0)]:
        assert utils.get_act_name(*args) == tu.get_act_name(*args), args
    x = torch.randn(5, 6, 7, generator=torch.Generator().manual_seed(0))
    for sl in (None, 3, -1, (1, 3), (1, 5, 2), [0, 2], torch.tensor([0, 2])):
        _close(utils.Slice(sl).apply(x, dim=1), tu.Slice(sl).apply(x, dim=1))
        assert (utils.Slice(sl).indices(6) == tu.Slice(sl).indices(6)).all()
    assert utils.Slice.unwrap(3).mode == tu.Slice.unwrap(3).mode == "array"
    for mod in (utils, tu):
        with pytest.raises(ValueError):
            mod.Slice("x")
        with pytest.raises(ValueError):
            mod.Slice((1, 3)).indices()
    logits = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(1))
    toks = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[0, 3:] = 0
    for per_token in (False, True):
        _close(utils.lm_cross_entropy_loss(logits, toks, attention_mask=mask, per_token=per_token),
               tu.lm_cross_entropy_loss(logits, toks, attention_mask=mask, per_token=per_token))
        _close(utils.lm_accuracy(logits, toks, per_token=per_token),
               tu.lm_accuracy(logits, toks, per_token=per_token))
    _close(utils.get_corner(x, 2), tu.get_corner(x, 2))
    assert (utils.to_numpy(x) == tu.to_numpy(x)).all()
    _close(utils.remove_batch_dim(x[:1]), tu.remove_batch_dim(x[:1]))
    m = FactoredMatrix(torch.randn(6, 4), torch.randn(4, 6))
    t = TLFactoredMatrix(m.A, m.B)
    _close(m[..., 2].AB, t[..., 2].AB)
    _close(m[0, 1].AB, t[0, 1].AB)
    for f in (m, t):
        with pytest.raises(ValueError, match="too long an index"):
            f[0, 1, 2]


def test_token_and_generation_errors_are_transformerlens_kinds(pair):
    ours, tl = pair("smollm2_2l")
    for m in (ours, tl):
        with pytest.raises(ValueError, match="mode must be 'first' or 'last'"):
            m.get_token_position(" cat", TEXTS[0], mode="middle")
        with pytest.raises(AssertionError):
            m.generate(5, max_new_tokens=1, verbose=False)
        with pytest.raises(AssertionError, match="return_type"):
            m.generate(TEXTS[0], max_new_tokens=1, return_type="x", verbose=False)
    cat = tl.to_single_token(" cat")
    tokens = tl.to_tokens(TEXTS[0])
    for mode in ("first", "last"):
        assert ours.get_token_position(cat, tokens[0], mode=mode) == \
            tl.get_token_position(cat, tokens[0], mode=mode)
    for pb in (None, True, False):
        assert torch.equal(ours.to_tokens(TEXTS, prepend_bos=pb),
                           tl.to_tokens(TEXTS, prepend_bos=pb))
    assert ours.to_string(tokens[0, 1]) == tl.to_string(tokens[0, 1])
    assert ours.to_str_tokens(tokens[0, 1]) == tl.to_str_tokens(tokens[0, 1])
    _close(ours.tokens_to_residual_directions(" cat"), tl.tokens_to_residual_directions(" cat"))
    _close(ours.generate(TEXTS[0], max_new_tokens=2, return_type="embeds", verbose=False,
                         do_sample=False),
           tl.generate(TEXTS[0], max_new_tokens=2, return_type="embeds", verbose=False,
                       do_sample=False))
    for kwargs in (dict(temperature=0.0), dict(do_sample=False, stop_at_eos=False),
                   dict(do_sample=False, padding_side="left")):
        torch.manual_seed(0)
        a = ours.generate([TEXTS[0], "The dog"], max_new_tokens=3, verbose=False, **kwargs)
        torch.manual_seed(0)
        assert a == tl.generate([TEXTS[0], "The dog"], max_new_tokens=3, verbose=False,
                                **kwargs), kwargs


def test_patching_and_head_detector_functions_as_transformerlens(pair):
    import transformer_lens.head_detector as tl_hd
    import transformer_lens.patching as tl_patching

    from mi_core.tl import head_detector, patching

    ours, tl = pair("smollm2_2l")
    clean = tl.to_tokens("John and Mary: John gave it to")  # short: the functions loop
    corrupt = tl.to_tokens("John and Mary: Mary gave it to")  # over positions and heads
    mary, john = tl.to_single_token(" Mary"), tl.to_single_token(" John")

    def metric(logits):
        return logits[0, -1, mary] - logits[0, -1, john]

    with torch.no_grad():
        _, c = ours.run_with_cache(clean)
        _, t = tl.run_with_cache(clean)
        # a few indices only: TransformerLens' side takes ~0.8 s a run on one core (the
        # get_act_patch_* functions: tests/transformer/test_transformer_tl_patching.py)
        index_df = tl_patching.make_df_from_ranges([2, 3], ["layer", "pos"])
        assert patching.make_df_from_ranges([2, 3], ["layer", "pos"]).equals(index_df)
        index_df = index_df.iloc[[0, 4]]
        _close(patching.generic_activation_patch(ours, corrupt, c, metric,
                                                 patching.layer_pos_patch_setter, "resid_pre",
                                                 index_df=index_df),
               tl_patching.generic_activation_patch(tl, corrupt, t, metric,
                                                    tl_patching.layer_pos_patch_setter,
                                                    "resid_pre", index_df=index_df), 1e-3)
        seq = "The cat sat on the mat. The cat sat on the mat."
        n = tl.to_tokens(seq).shape[1]
        for kwargs in (dict(detection_pattern="induction_head", error_measure="abs",
                            exclude_bos=True, exclude_current_token=True),
                       dict(detection_pattern=torch.tril(torch.ones(n, n)),
                            heads=[(0, 1), (1, 2)]),
                       dict(detection_pattern="previous_token_head", heads={1: [0, 2]})):
            _close(head_detector.detect_head(ours, seq, **kwargs),
                   tl_hd.detect_head(tl, seq, **kwargs))
    for mod, m in ((head_detector, ours), (tl_hd, tl)):
        with pytest.raises(AssertionError):
            mod.detect_head(m, seq, "not_a_head")


def test_cache_pos_slice_and_hook_argument_errors_as_transformerlens(pair):
    """``run_with_cache(pos_slice=i)`` keeps the position axis (TransformerLens'
    ``Slice.unwrap``); a hook that is not callable is a ``TypeError``, a bad direction or
    names filter a ``ValueError``."""
    ours, tl = pair("gpt2")
    tokens = tl.to_tokens(TEXTS[0])
    with torch.no_grad():
        for pos_slice in (-1, (1, 3)):
            a = ours.run_with_cache(tokens, pos_slice=pos_slice)[1]
            b = tl.run_with_cache(tokens, pos_slice=pos_slice)[1]
            for key in (("resid_post", 0), ("z", 1), ("pattern", 0)):
                _close(a[key], b[key])
    for m in (ours, tl):
        with pytest.raises(TypeError):
            m.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_pre", 3)])
        with pytest.raises(TypeError):
            m.run_with_hooks(tokens, fwd_hooks=[(3, lambda x, hook: x)])
        with pytest.raises(ValueError):
            m.add_hook("hook_embed", lambda x, hook: x, dir="sideways")
        with pytest.raises(ValueError):
            m.run_with_cache(tokens, names_filter=3)
        m.reset_hooks()


@pytest.mark.parametrize("kwargs", [dict(max_length=16), dict(max_length=8, add_bos_token=False),
                                    dict(max_length=512)])
def test_tokenize_and_concatenate_as_transformerlens_3(pair, kwargs):
    """TransformerLens 3's algorithm (documents tokenized alone, joined by EOS, cut into rows;
    a corpus shorter than one row padded) on SmolLM2's tokenizer, extra columns dropped."""
    datasets = pytest.importorskip("datasets")
    from transformer_lens import utils as tu

    ours, tl = pair("smollm2_2l")
    texts = ["The cat sat on the mat. " * 5, "Hello world, a test of tokenization.", "Short",
             "Another document with some more words in it " * 3]
    data = datasets.Dataset.from_dict({"text": texts, "meta": list(range(4))})
    a = utils.tokenize_and_concatenate(data, ours.tokenizer, num_proc=None, **kwargs)
    b = tu.tokenize_and_concatenate(data, tl.tokenizer, num_proc=None, **kwargs)
    assert a.column_names == b.column_names == ["tokens"]
    assert torch.equal(torch.stack(list(a["tokens"])), torch.stack(list(b["tokens"])))


@pytest.mark.parametrize("name", ["smollm2_2l", "gpt2"])
def test_padded_positions_equal_transformerlens_left_and_right(pair, name):
    """Every cached activation at every position, pads included, as TransformerLens: a pad's
    positional embedding is zero, no query attends to a pad, a left pad's pattern row is
    zeros (TransformerLens' NaN -> 0); the logits at every position follow."""
    ours, tl = pair(name)
    texts = ["The cat sat on the mat.", "A dog"]
    with torch.no_grad():
        for side in ("left", "right"):
            _, c = ours.run_with_cache(texts, padding_side=side)
            _, t = tl.run_with_cache(texts, padding_side=side)
            for key in t.keys():
                finite = torch.isfinite(t[key])
                assert torch.equal(torch.isfinite(c[key]), finite), (side, key)
                _close(c[key][finite], t[key][finite])
            _close(ours(texts, padding_side=side), tl(texts, padding_side=side))


def test_a_norm_whose_gain_is_derived_at_load_refuses_to_run_alone(tmp_path):
    """Gemma's norms multiply by 1 + w, made at load: the tree's stored ``w`` is not that gain,
    so ``model.ln_final(x)`` refuses by name instead of scaling by the wrong weight, and
    ``model.embed`` refuses as the forward scales ``W_E[tokens]``; the MLP (no such weight)
    runs and equals the model's own MLP output."""
    from transformers import GemmaConfig, GemmaForCausalLM

    import mi_core as mi

    torch.manual_seed(0)
    hf = GemmaForCausalLM(GemmaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)).eval()
    hf.save_pretrained(tmp_path)
    model = HookedTransformer.from_pretrained(tmp_path)
    ids = torch.tensor([[1, 5, 9, 20, 7]])
    with torch.no_grad():
        _, cache = model.run_with_cache(ids)
        with pytest.raises(mi.CapabilityError, match="ln_final: the stored weight"):
            model.ln_final(cache["resid_post", 1])
        with pytest.raises(mi.CapabilityError, match="scales W_E"):  # by sqrt(d_model)
            model.embed(ids)
        inner = model.mi_model.forward(ids, mi.HookSpec().capture("blocks.1.mlp.hook_in"))
        _close(model.blocks[1].mlp(inner["blocks.1.mlp.hook_in"]), cache["mlp_out", 1])
        # an MLP computing otherwise than the formula (here: told the wrong activation, as a
        # clamp or activation sparsity would differ) is found by the probe and refused
        mlp = model.blocks[0].mlp
        mlp.act_fn_name, mlp._plain = "relu", None
        with pytest.raises(mi.CapabilityError, match="not TransformerLens' formula"):
            mlp(inner["blocks.1.mlp.hook_in"])


def test_opt_positions_start_at_row_two_as_transformerlens(tmp_path):
    """OPT stores two rows before position 0 (HF offsets positions by 2); TransformerLens'
    ``W_pos`` leaves them out ([n_ctx, d_model]), and so does the tree: ``pos_embed(tokens)``
    is the model's ``hook_pos_embed``."""
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    hf = OPTForCausalLM(OPTConfig(hidden_size=64, ffn_dim=96, num_hidden_layers=2,
                                  num_attention_heads=4, vocab_size=128,
                                  max_position_embeddings=64, word_embed_proj_dim=64,
                                  pad_token_id=1, bos_token_id=2, eos_token_id=2)).eval()
    hf.save_pretrained(tmp_path)
    model = HookedTransformer.from_pretrained_no_processing(tmp_path)
    assert tuple(model.W_pos.shape) == (model.cfg.n_ctx, 64)
    _close(model.W_pos, hf.model.decoder.embed_positions.weight[2:], 0.0 + 1e-12)
    ids = torch.tensor([[2, 5, 9, 20, 7]])
    with torch.no_grad():
        _, cache = model.run_with_cache(ids)
        _close(model.pos_embed(ids), cache["hook_pos_embed"])

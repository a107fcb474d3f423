"""``mi_core.tl.HookedTransformer`` behaves as TransformerLens' ``HookedTransformer`` on the same
weights: its defaults, its forward options, its module tree, its hooks, its tokens, generation.

Models: SmolLM2's first two layers (trained weights, RMSNorm, rotary, grouped-query attention,
gated MLP, its tokenizer, which adds no BOS) and a GPT-2-shaped tiny model (LayerNorm with
biases, learned positions, value biases; random weights, SmolLM2's tokenizer), each loaded by
``HookedTransformer.from_pretrained`` (TransformerLens' defaults) and, as the reference, by
TransformerLens from the same files with its own conversion, processing and defaults
(tests.support.tl_demo_models). F32; logits and activations to 1e-4 absolute (measured
differences ~1e-5: SmolLM2's residual stream reaches ~1e3 in its first layers).
"""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.tl import HookedTransformer, utils

TOL = 1e-4
TEXTS = ["The cat sat on the mat.", "The cat sat on the mat really hard."]


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = TOL) -> None:
    assert a.shape == b.shape
    assert (a.detach().float() - b.detach().float()).abs().max().item() < tol


@pytest.mark.parametrize("name", ["smollm2_2l", "gpt2"])
def test_defaults_prepend_bos_and_calling_the_model_returns_logits(pair, name):
    ours, tl = pair(name)
    assert ours.cfg.default_prepend_bos and tl.cfg.default_prepend_bos
    assert torch.equal(ours.to_tokens(TEXTS[0]), tl.to_tokens(TEXTS[0]))
    assert ours.to_tokens(TEXTS[0])[0, 0].item() == ours.tokenizer.bos_token_id
    # MIModel keeps its own default: the tokenizer's (SmolLM2's adds no BOS)
    assert ours.mi_model.to_tokens(TEXTS[0]).shape[1] == ours.to_tokens(TEXTS[0]).shape[1] - 1
    with torch.no_grad():
        _close(ours(TEXTS[0]), tl(TEXTS[0]))
        _close(ours(TEXTS[0], prepend_bos=False), tl(TEXTS[0], prepend_bos=False))
        for kind in ("loss", "both"):
            a, b = ours(TEXTS, return_type=kind), tl(TEXTS, return_type=kind)
            for x, y in zip(a if kind == "both" else [a], b if kind == "both" else [b]):
                _close(x, y)
        _close(ours(TEXTS, return_type="loss", loss_per_token=True),
               tl(TEXTS, return_type="loss", loss_per_token=True))
        assert ours(TEXTS, return_type=None) is None
        tokens = tl.to_tokens(TEXTS[1])
        _close(ours.loss_fn(ours(tokens), tokens, per_token=True),
               tl.loss_fn(tl(tokens), tokens, per_token=True))


@pytest.mark.parametrize("side", ["right", "left"])
def test_lists_of_texts_are_padded_with_masks_as_transformerlens(pair, side):
    ours, tl = pair("smollm2_2l")
    a = ours.to_tokens(TEXTS, padding_side=side)
    assert torch.equal(a, tl.to_tokens(TEXTS, padding_side=side))
    assert a.shape[0] == 2 and (a == ours.tokenizer.pad_token_id).any()
    with torch.no_grad():
        la, lb = ours(TEXTS, padding_side=side), tl(TEXTS, padding_side=side)
    real = utils.get_attention_mask(ours.tokenizer, a, True, side).bool()
    _close(la[real], lb[real])


def test_stop_and_start_at_layer_return_the_residual_stream(pair):
    ours, tl = pair("gpt2")
    tokens = tl.to_tokens(TEXTS[1])
    with torch.no_grad():
        for stop in (0, 1, -1, 2):
            _close(ours(tokens, stop_at_layer=stop), tl(tokens, stop_at_layer=stop))
        resid = tl(tokens, stop_at_layer=1)
        _close(ours(resid, start_at_layer=1), tl(resid, start_at_layer=1))
        _, cache = ours.run_with_cache(tokens, stop_at_layer=1)
        _, tc = tl.run_with_cache(tokens, stop_at_layer=1)
    assert list(cache.keys()) == list(tc.keys())  # only what ran: embedding and block 0


@pytest.mark.parametrize("name", ["smollm2_2l", "gpt2"])
def test_module_tree_parameters_and_hook_points_are_transformerlens(pair, name):
    ours, tl = pair(name)
    assert [(n, tuple(p.shape)) for n, p in ours.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in tl.named_parameters()]
    theirs = dict(tl.named_parameters())
    for n, p in ours.named_parameters():
        _close(p, theirs[n], 1e-5)
    assert set(ours.hook_dict) == set(tl.hook_dict)
    _close(ours.blocks[1].attn.W_K, tl.blocks[1].attn.W_K, 1e-5)  # GQA: repeated per head
    _close(ours.embed.W_E, tl.embed.W_E, 1e-5)
    _close(ours.unembed.W_U, tl.unembed.W_U, 1e-5)
    assert ours.cfg.n_params == tl.cfg.n_params
    assert ours.cfg.normalization_type == tl.cfg.normalization_type
    assert ours.cfg.positional_embedding_type == tl.cfg.positional_embedding_type


def test_editing_a_weight_in_place_changes_the_model_as_in_transformerlens(tl_checkpoints,
                                                                          tl_ref):
    ours = HookedTransformer.from_pretrained(tl_checkpoints["gpt2"])
    tl = tl_ref("gpt2")
    tokens = tl.to_tokens(TEXTS[0])
    saved = tl.blocks[0].attn.W_O.detach().clone()
    try:
        with torch.no_grad():
            for m in (ours, tl):
                m.blocks[0].attn.W_O[1] = 0.0
            _close(ours(tokens), tl(tokens))
    finally:
        with torch.no_grad():
            tl.blocks[0].attn.W_O.copy_(saved)
    # a bias the model does not have is kept as zeros; editing it is refused, not ignored
    small = HookedTransformer.from_pretrained(tl_checkpoints["smollm2_2l"])
    with torch.no_grad():
        small.blocks[0].attn.b_Q[0, 0] = 1.0
    with pytest.raises(mi.CapabilityError, match="b_Q was edited"):
        small(tokens)


def test_hooks_fire_in_transformerlens_order_with_transformerlens_names(pair):
    ours, tl = pair("smollm2_2l")
    seen: dict = {"ours": [], "tl": []}
    keep = (lambda n: n.startswith("blocks.0.") or not n.startswith("blocks"))
    for side, m in (("ours", ours), ("tl", tl)):
        with torch.no_grad():
            m.run_with_hooks(TEXTS[0], return_type="logits", fwd_hooks=[
                (keep, lambda a, hook, side=side: seen[side].append((hook.name, a.shape)))])
    # ln1's points run three times (query, key and value inputs), as TransformerLens' blocks
    assert seen["ours"] == seen["tl"]


def test_persistent_hooks_context_manager_and_reset(pair):
    ours, tl = pair("gpt2")
    tokens = tl.to_tokens(TEXTS[0])

    def ablate(z, hook):
        z[:, :, 1] = 0.0
        return z

    with torch.no_grad():
        base = ours(tokens)
        out = {}
        for side, m in (("ours", ours), ("tl", tl)):
            m.blocks[1].attn.hook_z.add_hook(ablate)
            out[side] = m(tokens)
            assert m.blocks[1].attn.hook_z.has_hooks()
            _, cache = m.run_with_cache(tokens)  # keeps the hook (not added in its context)
            out[side + "_cache"] = cache["blocks.1.attn.hook_z"]
            m.reset_hooks()
            with m.hooks(fwd_hooks=[("blocks.1.attn.hook_z", ablate)]):
                out[side + "_ctx"] = m(tokens)
            assert not m.blocks[1].attn.hook_z.has_hooks()
        _close(out["ours"], out["tl"])
        _close(out["ours_ctx"], out["tl"])
        _close(out["ours_cache"], out["tl_cache"])
        assert (out["ours"] - base).abs().max() > 1e-3
        _close(ours(tokens), base)


def test_refused_hooks_and_unknown_names_raise_transformerlens_kinds(pair):
    ours, tl = pair("gpt2")
    for m in (ours, tl):
        with pytest.raises(AssertionError, match="use_attn_result"):
            m.add_hook("blocks.0.attn.hook_result", lambda x, hook: x)
        with pytest.raises(KeyError):
            m.add_hook("blocks.0.attn.hook_nope", lambda x, hook: x)
    with pytest.raises(mi.HookError, match="nearest: blocks.0.attn.hook_z"):
        ours.add_hook("blocks.0.attn.hook_zz", lambda x, hook: x)


def test_run_with_cache_keys_values_and_gradients_match(pair):
    ours, tl = pair("smollm2_2l")
    tokens = tl.to_tokens(TEXTS[1])
    out, cache = ours.run_with_cache(tokens, return_type="loss", incl_bwd=True)
    tout, tc = tl.run_with_cache(tokens, return_type="loss", incl_bwd=True)
    _close(out, tout)
    assert sorted(cache.keys()) == sorted(tc.keys())
    assert [k for k in cache.keys() if not k.endswith("_grad")] == \
        [k for k in tc.keys() if not k.endswith("_grad")]
    for k in tc.keys():
        if ".ln1." in k and k.endswith("_grad"):
            continue  # TransformerLens' three ln1 calls each see one path's gradient (docs)
        masked = torch.isinf(tc[k])
        _close(cache[k][~masked], tc[k][~masked], 1e-3 if k.endswith("_grad") else TOL)
    _, small = ours.run_with_cache(TEXTS[0], names_filter=lambda n: n.endswith("pattern"),
                                   remove_batch_dim=True)
    _, tsmall = tl.run_with_cache(TEXTS[0], names_filter=lambda n: n.endswith("pattern"),
                                  remove_batch_dim=True)
    assert list(small.keys()) == list(tsmall.keys()) and small["pattern", 1].dim() == 3


def test_backward_hooks_kept_by_reset_hooks_end_false(pair):
    ours, tl = pair("gpt2")
    tokens = tl.to_tokens(TEXTS[0])
    grads: dict = {}
    for side, m in (("ours", ours), ("tl", tl)):
        def keep(g, hook, side=side):
            grads[side] = g.detach().clone()
        loss = m.run_with_hooks(tokens, return_type="loss", reset_hooks_end=False,
                                bwd_hooks=[("blocks.0.hook_resid_mid", keep)])
        loss.backward()
        m.reset_hooks()
    _close(grads["ours"], grads["tl"], 1e-3)


def test_tokens_utilities_as_transformerlens(pair):
    ours, tl = pair("smollm2_2l")
    text = "The cat sat on the mat. The mat sat on the cat."
    for mode in ("first", "last"):
        assert ours.get_token_position(" cat", text, mode=mode) == \
            tl.get_token_position(" cat", text, mode=mode)
    assert ours.get_token_position(" cat", text, prepend_bos=False) == \
        tl.get_token_position(" cat", text, prepend_bos=False)
    assert ours.to_string(256) == tl.to_string(256)
    tokens = tl.to_tokens(TEXTS)
    assert ours.to_string(tokens) == tl.to_string(tokens)
    assert ours.to_str_tokens(TEXTS) == tl.to_str_tokens(TEXTS)
    assert ours.to_str_tokens(tokens[:1]) == tl.to_str_tokens(tokens[:1])
    assert ours.to_single_token(" cat") == tl.to_single_token(" cat")
    for m in (ours, tl):
        with pytest.raises(AssertionError):
            m.to_single_token(" categorically unusual")
        with pytest.raises(AssertionError):
            m.get_token_position(" dog", text)
        with pytest.raises(ValueError, match="Invalid input type"):
            m.to_str_tokens(504)
    assert ours.to_str_tokens(tokens[0].numpy()) == tl.to_str_tokens(tokens[0].numpy())
    assert ours.to_str_tokens(tokens[0]) == tl.to_str_tokens(tokens[0])
    assert ours.to_str_tokens(text, prepend_bos=False) == \
        tl.to_str_tokens(text, prepend_bos=False)
    assert ours.to_single_str_token(504) == tl.to_single_str_token(504)
    assert ours.to_string([504, 2644]) == tl.to_string([504, 2644])
    assert torch.equal(ours.to_tokens("a " * 10, truncate=True, move_to_device=False),
                       tl.to_tokens("a " * 10, truncate=True, move_to_device=False))


def test_generate_returns_text_and_samples_as_transformerlens(pair):
    ours, tl = pair("smollm2_2l")
    prompt = "The capital of France is"
    greedy = ours.generate(prompt, max_new_tokens=6, do_sample=False, verbose=False)
    assert isinstance(greedy, str)
    assert greedy == tl.generate(prompt, max_new_tokens=6, do_sample=False, verbose=False)
    torch.manual_seed(3)
    a = ours.generate(prompt, max_new_tokens=6, temperature=0.7, verbose=False)
    torch.manual_seed(3)
    b = tl.generate(prompt, max_new_tokens=6, temperature=0.7, verbose=False)
    assert a == b
    tokens = tl.to_tokens(prompt)
    out = ours.generate(tokens, max_new_tokens=3, do_sample=False, verbose=False)
    assert torch.equal(out, tl.generate(tokens, max_new_tokens=3, do_sample=False,
                                        verbose=False))
    for kwargs in (dict(top_k=5), dict(top_p=0.9), dict(freq_penalty=1.0),
                   dict(do_sample=False, use_past_kv_cache=False),
                   dict(do_sample=False, eos_token_id=504), dict(do_sample=False,
                                                                  prepend_bos=False),
                   dict(do_sample=False, return_type="tokens")):
        torch.manual_seed(0)
        a = ours.generate(prompt, max_new_tokens=4, verbose=False, **kwargs)
        torch.manual_seed(0)
        b = tl.generate(prompt, max_new_tokens=4, verbose=False, **kwargs)
        assert (torch.equal(a, b) if isinstance(b, torch.Tensor) else a == b), kwargs
    texts = [prompt, "The cat sat on"]  # a batch: left padded, as TransformerLens
    assert ours.generate(texts, max_new_tokens=4, do_sample=False, verbose=False) == \
        tl.generate(texts, max_new_tokens=4, do_sample=False, verbose=False)


def test_test_prompt_prints_transformerlens_lines(pair, capsys):
    from transformer_lens.utils import test_prompt as tl_test_prompt

    ours, tl = pair("smollm2_2l")
    capsys.readouterr()  # the loading lines, when this test loads the pair first
    utils.test_prompt("The capital of France is", "Paris", ours)
    mine = capsys.readouterr().out
    tl_test_prompt("The capital of France is", "Paris", tl)
    theirs = capsys.readouterr().out
    from tests.support.tl_demos import same_text
    assert same_text(mine, theirs) is None, (mine, theirs)


def test_refactor_factored_attn_matrices_as_transformerlens(tl_checkpoints, tl_ref):
    """The refactored factors are defined up to the signs of singular vectors, so the test
    compares what they define (QK and OV circuits, b_O, the logits) and the properties the
    refactoring gives (orthonormal W_O rows, equal query / key column norms)."""
    from tests.support.tl_hooked import hooked_gpt2

    ours = HookedTransformer.from_pretrained(tl_checkpoints["gpt2"],
                                             refactor_factored_attn_matrices=True)
    tl = hooked_gpt2(tl_checkpoints["gpt2"], fold_ln=True, center_writing_weights=True,
                     center_unembed=True, fold_value_biases=True)
    tl.load_and_process_state_dict(tl.state_dict(), fold_ln=False, center_writing_weights=False,
                                   center_unembed=False, fold_value_biases=False,
                                   refactor_factored_attn_matrices=True)
    for a, b in ((ours.QK.AB, tl.QK.AB), (ours.OV.AB, tl.OV.AB), (ours.b_O, tl.b_O),
                 (ours.b_V, tl.b_V)):
        _close(a, b, 1e-4)
    w_o = ours.blocks[1].attn.W_O
    _close(w_o @ w_o.transpose(-1, -2), torch.eye(w_o.shape[1]).expand_as(w_o @ w_o.mT), 1e-5)
    attn = ours.blocks[1].attn  # [W; b] of queries and keys: columns of equal norms
    _close(torch.cat([attn.W_Q, attn.b_Q[:, None]], 1).norm(dim=-2),
           torch.cat([attn.W_K, attn.b_K[:, None]], 1).norm(dim=-2), 1e-4)
    tokens = torch.tensor([[1, 400, 500, 600, 700]])
    with torch.no_grad():
        _close(ours(tokens), tl(tokens))
    # a rotary model: refused by both, an AssertionError (ours also a CapabilityError)
    rotary = tl_ref("smollm2_2l")
    with pytest.raises(AssertionError, match="rotary"):
        rotary.refactor_factored_attn_matrices(rotary.state_dict())
    with pytest.raises(mi.CapabilityError, match="rotary") as err:
        HookedTransformer.from_pretrained(tl_checkpoints["smollm2_2l"],
                                          refactor_factored_attn_matrices=True)
    assert isinstance(err.value, AssertionError)


def test_what_cannot_apply_is_refused_by_name(tl_checkpoints):
    with pytest.raises(mi.CapabilityError, match="checkpoint_index"):
        HookedTransformer.from_pretrained(tl_checkpoints["gpt2"], checkpoint_index=1)
    with pytest.raises(mi.CapabilityError, match="positional_embedding_type='shortformer'"):
        HookedTransformer(mi.tl.HookedTransformerConfig(  # a random model: no family holds it
            n_layers=1, d_model=4, n_ctx=4, d_head=2, n_heads=2, d_vocab=8, act_fn="silu",
            positional_embedding_type="shortformer"))
    model = HookedTransformer.from_pretrained(tl_checkpoints["gpt2"])
    assert model.to("cpu") is model
    with pytest.raises(mi.CapabilityError, match="cast"):
        model.to(torch.float16)
    with pytest.raises(AssertionError, match="GroupedQueryAttention"):
        HookedTransformer.from_pretrained(tl_checkpoints["smollm2_2l"]).set_use_attn_in(True)


def test_activations_and_logits_equal_transformerlens_bit_for_bit(pair):
    """SmolLM2 (RMSNorm, rotary, grouped-query attention): with TransformerLens' arithmetic
    (mi_core.tl.arithmetic: norms divide by the scale, explicit attention, TransformerLens'
    rotary tables, its per-head results) every activation and the logits are TransformerLens'
    exactly, padded either side, with ``use_attn_result``, with grad mode on or off."""
    ours, tl = pair("smollm2_2l")
    texts = ["When John and Mary went to the shops, John gave the bag to",
             "When Tom and James went to the park, James gave the ball to a"]
    with torch.no_grad():
        _, cache = ours.run_with_cache(texts)
        logits, tc = tl.run_with_cache(texts)
    assert list(cache.keys()) == list(tc.keys())
    for k in tc.keys():
        assert torch.equal(cache[k], tc[k]), k
    real = ours.to_tokens(texts, padding_side="left") != ours.tokenizer.pad_token_id
    with torch.no_grad():
        assert torch.equal(ours(texts, padding_side="left")[real],
                           tl(texts, padding_side="left")[real])
        for m in (ours, tl):
            m.set_use_attn_result(True)
        _, cache = ours.run_with_cache(texts)
        _, tc = tl.run_with_cache(texts)
        assert torch.equal(cache["result", 1], tc["result", 1])
        assert torch.equal(cache["resid_post", 1], tc["resid_post", 1])
        for m in (ours, tl):
            m.set_use_attn_result(False)
    assert torch.equal(ours(texts).detach(), logits)  # grad mode on: the same numbers


def test_parameters_require_gradients_and_get_them_as_in_transformerlens(pair):
    """As TransformerLens' parameters, the tree's require gradients: outputs carry a grad_fn
    (the same kind) when grad mode is on, and backward() fills each parameter's .grad; the
    MIModel beneath (the same weights) stays gradient-free, and absent biases (zeros that
    take no part in the forward) do not require gradients."""
    ours, tl = pair("gpt2")
    tokens = tl.to_tokens(TEXTS[1])
    assert all(p.requires_grad for p in ours.parameters())
    logits = ours(tokens)
    assert type(logits.grad_fn).__name__ == type(tl(tokens).grad_fn).__name__
    with torch.no_grad():
        assert ours(tokens).grad_fn is None
    assert ours.mi_model.run_with_hooks(tokens).grad_fn is None
    for m in (ours, tl):
        m.zero_grad(set_to_none=True)
        m(tokens, return_type="loss").backward()
    theirs = dict(tl.named_parameters())
    for name, p in ours.named_parameters():
        ref = theirs[name].grad
        if p.requires_grad:
            assert p.grad is not None, name
            _close(p.grad, ref, 1e-4 * max(1.0, ref.abs().max().item()))
    small, _ = pair("smollm2_2l")
    assert not small.blocks[0].attn.b_Q.requires_grad  # SmolLM2 has no query bias
    assert small.blocks[0].attn.W_Q.requires_grad
    flags = [p.requires_grad for p in ours.parameters()]
    ours.requires_grad_(False)
    try:
        assert ours(tokens).grad_fn is None
    finally:
        for p, flag in zip(ours.parameters(), flags):
            p.requires_grad_(flag)


def test_gradients_to_weights_survive_processing_and_in_place_edits(tl_checkpoints):
    """The gradient path follows the weights the model computes with: after an in-place edit
    (under no_grad, as TransformerLens requires) and after weight processing rebuilt the
    tree, backward() still fills the parameters' gradients."""
    model = HookedTransformer.from_pretrained_no_processing(tl_checkpoints["gpt2"])
    tokens = model.to_tokens(TEXTS[0])
    with torch.no_grad():
        model.blocks[0].attn.W_O[1] = 0.0
    model(tokens, return_type="loss").backward()
    assert model.blocks[0].attn.W_O.grad is not None
    model.process_weights_()
    model(tokens, return_type="loss").backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads)


def test_missing_cache_entries_raise_the_keyerror_transformerlens_raises(pair):
    ours, tl = pair("smollm2_2l")
    with torch.no_grad():
        _, cache = ours.run_with_cache(TEXTS[0])
        _, tc = tl.run_with_cache(TEXTS[0])
    for c in (cache, tc):
        with pytest.raises(KeyError):
            c["pattern", 5]
    with pytest.raises(mi.HookError, match="blocks.5.attn.hook_pattern"):
        cache["pattern", 5]


@pytest.mark.parametrize("name", ["smollm2_2l", "gpt2"])
def test_config_fields_and_values_are_transformerlens(pair, name):
    """Every field of TransformerLens' config exists; those a loaded model decides have
    TransformerLens' values (the reference's config is TransformerLens' own for the same
    checkpoint; the model's name and the architecture string are not read from the files)."""
    import dataclasses

    ours, tl = pair(name)
    skip = {"model_name", "original_architecture", "device", "n_ctx", "tokenizer_name",
            "initializer_range", "NTK_original_ctx_len"}
    assert {f.name for f in dataclasses.fields(tl.cfg)} <= {f.name for f in
                                                          dataclasses.fields(ours.cfg)}
    for f in dataclasses.fields(tl.cfg):
        if f.name not in skip:
            assert str(getattr(ours.cfg, f.name)) == str(getattr(tl.cfg, f.name)), f.name


def test_tokenizer_attributes_and_methods_are_huggingfaces(pair):
    ours, tl = pair("smollm2_2l")
    a, b = ours.tokenizer, tl.tokenizer
    for attr in ("bos_token", "bos_token_id", "eos_token", "eos_token_id", "pad_token",
                 "pad_token_id", "unk_token", "unk_token_id", "padding_side",
                 "model_max_length", "add_bos_token", "vocab_size"):
        assert getattr(a, attr) == getattr(b, attr), attr
    ids = [1, 2, 4568, 7, 504]
    assert a.convert_ids_to_tokens(ids) == b.convert_ids_to_tokens(ids)
    assert a.convert_ids_to_tokens(4568) == b.convert_ids_to_tokens(4568)
    assert a.tokenize(TEXTS[0]) == b.tokenize(TEXTS[0])
    assert a.convert_tokens_to_ids(["ĠThe", "not-a-token"]) == \
        b.convert_tokens_to_ids(["ĠThe", "not-a-token"])
    assert a.encode(TEXTS[0]) == b.encode(TEXTS[0])
    assert a.decode(a.encode(TEXTS[0])) == b.decode(b.encode(TEXTS[0]))
    assert torch.equal(a(TEXTS, padding=True, return_tensors="pt")["input_ids"],
                       b(TEXTS, padding=True, return_tensors="pt")["input_ids"])


def test_hook_listing_caching_hooks_embedding_and_evals_as_transformerlens(pair):
    from transformer_lens import evals as tl_evals

    from mi_core.tl import evals

    ours, tl = pair("gpt2")
    tokens = tl.to_tokens(TEXTS[0])
    with torch.no_grad():
        for m in (ours, tl):
            m.add_hook("blocks.0.hook_resid_post", lambda x, hook: x)
            m.add_perma_hook("blocks.1.attn.hook_z", lambda x, hook: x)
        assert {k: len(v) for k, v in ours.list_hooks().items()} == \
            {k: len(v) for k, v in tl.list_hooks().items()}
        assert list(ours.list_hooks(including_permanent=False)) == \
            list(tl.list_hooks(including_permanent=False))
        for m in (ours, tl):
            m.reset_hooks(including_permanent=True)
        caches: dict = {"ours": {}, "tl": {}}
        for side, m in (("ours", ours), ("tl", tl)):
            m.cache_some(caches[side], lambda n: n.endswith("hook_resid_pre"))
            m(tokens)
            m.reset_hooks()
        assert list(caches["ours"]) == list(caches["tl"])
        for k in caches["tl"]:
            _close(caches["ours"][k], caches["tl"][k])
        a, b = ours.input_to_embed(TEXTS[0]), tl.input_to_embed(TEXTS[0])
        _close(a[0], b[0])
        assert torch.equal(a[1], b[1]) and a[2] is None and b[2] is None
        _close(evals.sanity_check(ours), tl_evals.sanity_check(tl))
        torch.manual_seed(0)
        mine = evals.induction_loss(ours, batch_size=2, subseq_len=20, device="cpu")
        torch.manual_seed(0)
        _close(mine, tl_evals.induction_loss(tl, batch_size=2, subseq_len=20, device="cpu"))
    with pytest.raises(mi.CapabilityError, match="downloads"):
        evals.make_owt_data_loader(ours.tokenizer)
    _, cache = ours.run_with_cache(tokens)
    grad = torch.is_grad_enabled()
    try:
        cache.toggle_autodiff(False)
        assert not torch.is_grad_enabled()
    finally:
        torch.set_grad_enabled(grad)


def test_weights_and_full_ov_circuit_as_transformerlens(pair):
    """The Main Demo's full OV circuit (W_E @ OV @ W_U, a FactoredMatrix over the vocabulary)
    and its eigenvalues; the stacked weight properties are the tree's parameters."""
    ours, tl = pair("gpt2")
    for name in ("W_E", "W_U", "b_U", "W_pos", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_out",
                 "b_Q", "b_K", "b_V", "b_O", "b_in", "b_out", "W_E_pos"):
        assert torch.equal(getattr(ours, name), getattr(tl, name)) or \
            (getattr(ours, name) - getattr(tl, name)).abs().max() < 1e-6, name
    assert ours.W_gate is None and tl.W_gate is None
    assert ours.W_E is ours.embed.W_E
    with torch.no_grad():
        full = ours.embed.W_E @ ours.OV @ ours.unembed.W_U
        theirs = tl.embed.W_E @ tl.OV @ tl.unembed.W_U
        assert repr(full) == repr(theirs)
        ev, tev = full.eigenvalues, theirs.eigenvalues
        assert ev.shape == tev.shape and ev.dtype == tev.dtype
        score = ev.sum(-1).real / ev.abs().sum(-1)
        _close(score, tev.sum(-1).real / tev.abs().sum(-1), 1e-3)
    small, tsmall = pair("smollm2_2l")
    assert small.W_gate.shape == tsmall.W_gate.shape
    assert not hasattr(small, "W_pos") and not hasattr(tsmall, "W_pos")  # rotary: none
    with pytest.raises(mi.WeightLoadError, match="W_pos"):
        small.W_pos
    assert small.W_K.shape == tsmall.W_K.shape  # grouped-query K repeated per query head

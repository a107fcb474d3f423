"""Zamba2 (Mamba-2 layers, some running a shared attention + MLP block on [residual |
embeddings] first, with per-use LoRA adapters) against transformers on the same tiny weights
(its CPU torch path, tests/support/zamba2_minimax_tiny.py): logits and every layer's residual
stream < 1e-4 (F32, and against transformers in float64), a left-padded batch (compared with
transformers where it is padding-invariant: without projection biases, as released; with
``add_bias_linear`` its in_proj bias reaches the convolution from the pads, so there each row
is compared with itself alone), cached greedy generation, token by token == the sequence,
the shared block's points at each layer that runs it (shapes; interventions equal to
transformers with a forward hook on the same module), ``A @ x == y`` and state specs on every
Mamba-2 layer, the weight sets shared by reference, repeated copies in a checkpoint checked,
bf16."""

from __future__ import annotations

import copy
import shutil

import pytest
import torch

import mi_core as mi

from tests.support.hf_reference import assert_matches_hf_with_hook
from tests.support.zamba2_minimax_tiny import ZM_LAYER_TYPES, tiny_zm, zm_ids, zm_model

TOL = 1e-4
NAMES = ["zamba2", "zamba2_gqa"]


@pytest.fixture(params=NAMES)
def name(request: pytest.FixtureRequest) -> str:
    return request.param


def test_logits_and_every_layers_residual_stream_match_transformers(name: str) -> None:
    """40 tokens (five of transformers' 8-token Mamba-2 chunks). Tied embeddings N(0, 1): the
    logits are ~6 wide, both sides' F32 error against float64 ~6e-5."""
    t, model = tiny_zm(name), zm_model(name)
    ids = zm_ids(2, 40, seed=1)
    with torch.no_grad():
        ref = t.hf(ids, output_hidden_states=True)
        logits64 = copy.deepcopy(t.hf).double()(ids).logits
    L = model.num_layers
    cache = model.forward(ids, mi.HookSpec().capture_all(mi.HookPoint.resid_pre(i)
                                                         for i in range(L)))
    assert (cache.output - ref.logits).abs().max().item() < TOL
    assert (cache.output.double() - logits64).abs().max().item() < TOL
    for i in range(L):  # hidden_states[i] = layer i's input
        diff = (cache[mi.HookPoint.resid_pre(i)] - ref.hidden_states[i]).abs().max().item()
        assert diff < TOL, (i, diff)
    assert cache.output.std().item() > 0.5
    assert model.layer_types == ZM_LAYER_TYPES[name]


def test_left_padded_batch_matches_each_row_alone_and_transformers_without_biases(
        name: str) -> None:
    t, model = tiny_zm(name), zm_model(name)
    ids = zm_ids(2, 14, seed=2)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    ids[1, :5] = 0
    out = model.forward(ids, attention_mask=mask).output
    alone = model.forward(ids[1:, 5:]).output
    assert (out[1, 5:] - alone[0]).abs().max().item() < TOL
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as transformers' generate passes them
    with torch.no_grad():
        ref = t.hf(ids, attention_mask=mask, position_ids=positions).logits
    assert (out[0] - ref[0]).abs().max().item() < TOL
    theirs = (out[1, 5:] - ref[1, 5:]).abs().max().item()
    if t.hf.config.add_bias_linear:  # transformers' own padded row is not its row alone
        assert theirs > 1e-2
    else:
        assert theirs < TOL


def test_cached_greedy_generation_equals_transformers_tokens(name: str) -> None:
    t, model = tiny_zm(name), zm_model(name)
    ids = zm_ids(2, 9, seed=3)
    with torch.no_grad():  # transformers' own cache (KV for the shared attention, states)
        ref = t.hf.generate(ids, max_new_tokens=10, do_sample=False)
    out = model.generate(ids, max_new_tokens=10).tokens
    eos = t.hf.config.eos_token_id
    for row in range(2):
        gen, theirs = out[row, 9:].tolist(), ref[row, 9:].tolist()
        n = gen.index(eos) + 1 if eos in gen else len(gen)
        assert gen[:n] == theirs[:n], (row, gen, theirs)


def test_token_by_token_with_the_cache_equals_the_sequence(name: str) -> None:
    model = zm_model(name)
    ids = zm_ids(2, 11, seed=4)
    full = model.forward(ids).output
    past = model.backend.new_past(2)
    steps = [model.forward(ids[:, :4], past=past).output]
    steps += [model.forward(ids[:, j:j + 1], past=past).output for j in range(4, 11)]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() < TOL


def test_each_layer_has_the_shared_blocks_points_then_its_mixers_with_their_shapes(
        name: str) -> None:
    model = zm_model(name)
    names = [p.name for p in model.hook_points()]
    rope = tiny_zm(name).hf.config.use_mem_rope
    for i, kind in enumerate(ZM_LAYER_TYPES[name]):
        p = f"blocks.{i}."
        mine = [n for n in names if n.startswith(p)]
        shared = kind.startswith("shared_attention")
        assert (p + "attn.hook_pattern" in mine) == shared
        assert (p + "attn.hook_rot_q" in mine) == (shared and rope)
        assert p + "ssm.hook_y" in mine and p + "hook_mixer_out" in mine
        # the block adds nothing to the residual stream itself: no hook_attn_out / mlp_out
        assert p + "hook_attn_out" not in mine and p + "hook_mlp_out" not in mine
        if shared:
            order = [p + s for s in ("hook_resid_pre", "shared.hook_in", "attn.hook_in",
                                     "attn.hook_pattern", "shared.hook_attn_out",
                                     "mlp.hook_post", "shared.hook_out", "ln1.hook_normalized",
                                     "ssm.hook_in", "hook_mixer_out", "hook_resid_post")]
            assert [mine.index(n) for n in order] == sorted(mine.index(n) for n in order)
    ids = zm_ids(2, 11, seed=5)
    cache = model.forward(ids, mi.HookSpec().capture_all(names))
    for n in names:  # (-1: a key axis, any length)
        want = model.backend.hook_shape(n, 2, 11)
        assert want is not None and len(want) == cache[n].dim(), n
        assert all(w in (-1, g) for w, g in zip(want, cache[n].shape)), (n, want)
    d = model.hidden_size
    i = ZM_LAYER_TYPES[name].index("shared_attention+mamba2")
    assert cache[f"blocks.{i}.shared.hook_in"].shape[-1] == 2 * d
    assert cache[f"blocks.{i}.attn.hook_in"].shape[-1] == 2 * d
    # the concatenation is [resid_pre | embeddings]
    both = torch.cat([cache[f"blocks.{i}.hook_resid_pre"], cache["hook_embed"]], dim=-1)
    assert torch.equal(cache[f"blocks.{i}.shared.hook_in"], both)


#: family -> (our point, transformers' module whose output it is)
_MODULES = {
    "zamba2": [("blocks.3.shared.hook_out", "model.layers.3.linear"),
               ("blocks.4.shared.hook_mlp_out", "model.layers.4.shared_transformer"
                                                ".feed_forward"),
               ("blocks.4.shared.hook_attn_out", "model.layers.4.shared_transformer.self_attn"),
               ("blocks.1.hook_mixer_out", "model.layers.1.mamba_decoder.mamba"),
               ("blocks.0.ssm.hook_in_proj", "model.layers.0.mamba.in_proj")],
    "zamba2_gqa": [("blocks.2.shared.hook_out", "model.layers.2.linear")],
}
_CASES = [(n, p, m) for n, pm in _MODULES.items() for p, m in pm]


@pytest.mark.parametrize("name, point, module", _CASES, ids=[c[1] for c in _CASES])
def test_an_intervention_equals_transformers_with_a_hook_on_the_same_module(
        name: str, point: str, module: str) -> None:
    """Layer 4 runs the first weight set again (transformers' module there is its own, with
    the weights tied to layer 1's): a point of the block at layer 4 is that use only."""
    t, model = tiny_zm(name), zm_model(name)
    ids = zm_ids(1, 10, seed=6)

    def scale(x: torch.Tensor, hook=None) -> torch.Tensor:
        # the first 8 channels (all of them: the norm after o_proj would undo the scale)
        return torch.cat([x[..., :8] * 1.7, x[..., 8:]], dim=-1)

    ours = model.forward(ids, mi.HookSpec().intervene(point, scale)).output
    assert_matches_hf_with_hook(ours, t.hf, ids, t.hf.get_submodule(module),
                                lambda m, i, o: (scale(o[0]),) + tuple(o[1:])
                                if isinstance(o, tuple) else scale(o))


def test_effective_attention_times_x_is_hook_y_on_every_mamba_layer(name: str) -> None:
    model = zm_model(name)
    ids = zm_ids(2, 13, seed=7)
    for i in range(model.num_layers):
        n = f"blocks.{i}.ssm."
        cache = model.forward(ids, mi.HookSpec().capture_all(
            [n + "hook_effective_attn", n + "hook_y", n + "hook_conv"]))
        a, y = cache[n + "hook_effective_attn"], cache[n + "hook_y"]
        h, p = y.shape[2], y.shape[3]
        x = cache[n + "hook_conv"][..., :h * p].unflatten(-1, (h, p)).float()
        ax = torch.einsum("bhts,bshp->bthp", a, x)
        assert (ax - y).abs().max().item() < 1e-5 * max(1.0, y.abs().max().item())


def test_state_specs_reach_every_mamba_layer_hybrid_or_not() -> None:
    model = zm_model("zamba2")
    ids = zm_ids(1, 9, seed=8)
    plain = model.forward(ids).output
    for layer in (0, 1):  # a plain Mamba-2 layer and one that runs the shared block
        ko = model.forward(ids, mi.HookSpec().set_state_knockout(
            mi.StateKnockoutSpec([2]).layer(layer))).output
        assert (ko - plain)[:, :2].abs().max().item() < 1e-5  # causal
        assert (ko - plain)[:, 2:].abs().max().item() > 1e-3
    with pytest.raises(mi.InterventionError, match=r"heads \[8\] out of range"):
        model.forward(ids, mi.HookSpec().set_state_knockout(
            mi.StateKnockoutSpec([2]).heads([8])))


def test_the_weight_sets_are_shared_by_reference_and_the_adapters_are_per_use() -> None:
    be = zm_model("zamba2").backend
    first, again, other = (be.w.layers[i].shared for i in (1, 4, 3))
    same = lambda a, b: a.data_ptr() == b.data_ptr()  # noqa: E731  (one storage)
    assert same(first.attn.w_q, again.attn.w_q) and same(first.mlp.w_in, again.mlp.w_in)
    assert not same(first.attn.w_q, other.attn.w_q)
    assert not same(first.attn.adapters[0][0], again.attn.adapters[0][0])
    assert not same(first.w_out, again.w_out) and be.w.layers[0].shared is None
    with pytest.raises(mi.WeightLoadError, match="layer 1 runs a shared attention block"):
        be.get_weight("W_Q", 1)


def test_repeated_copies_of_a_weight_set_load_when_equal_and_are_refused_when_not(
        tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    src = tiny_zm("zamba2").path
    tensors = load_file(src / "model.safetensors")
    first = "model.layers.1.shared_transformer."
    copies = {"model.layers.4.shared_transformer." + k[len(first):]: v.clone()
              for k, v in tensors.items() if k.startswith(first)}
    for what, extra in (("same", copies), ("different", {
            k: v + (0.5 if k.endswith("q_proj.weight") else 0.0) for k, v in copies.items()})):
        d = tmp_path / what
        shutil.copytree(src, d)
        save_file({**tensors, **extra}, d / "model.safetensors", metadata={"format": "pt"})
        if what == "same":
            ids = zm_ids(1, 6)
            out = mi.MIModel.from_pretrained(d).forward(ids).output
            assert torch.equal(out, zm_model("zamba2").forward(ids).output)
        else:
            with pytest.raises(mi.WeightLoadError, match="differs from 'model.layers.1"):
                mi.MIModel.from_pretrained(d)


def test_bfloat16_is_no_worse_than_transformers_in_bfloat16() -> None:
    from transformers import AutoModelForCausalLM

    t = tiny_zm("zamba2")
    ids = zm_ids(2, 24, seed=9)
    exact = zm_model("zamba2").forward(ids).output
    hf = AutoModelForCausalLM.from_pretrained(t.path, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        theirs = (hf(ids).logits.float() - exact).abs()
    ours = (mi.MIModel.from_pretrained(t.path, dtype=torch.bfloat16).forward(ids).output.float()
            - exact).abs()
    assert ours.mean().item() <= 1.1 * theirs.mean().item() + 1e-4, (ours.mean(), theirs.mean())
    assert ours.max().item() <= 2 * theirs.max().item() + 1e-3

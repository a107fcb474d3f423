"""GPT-style families (GPT-2, GPT-NeoX/Pythia, GPT-J, Phi-1/2, OPT, Falcon, StableLM, Helium):
left padding, generation against transformers, the hook points each family has, and the
checkpoint spellings found on the hub.

Logits / residual / pattern parity with transformers for every family is in
test_transformer_parity.py (it runs over all of tests.support.tiny_families.FAMILIES).
Tolerance: F32, max abs diff < 1e-4.
"""

from __future__ import annotations

import copy
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import mi_core as mi
from mi_core.registry import ModelSource
from mi_transformer.loader import load_backend

from tests.support.family_checks import assert_left_padding_rows_alone
from tests.support.tiny_families import GPT_FAMILIES

TOL = 1e-4
NAMES = list(GPT_FAMILIES) + ["helium"]


@pytest.mark.parametrize("name", NAMES)
def test_left_padded_rows_equal_each_row_alone(tiny, make_ids, name):
    model = tiny(name).load()
    assert_left_padding_rows_alone(model, [make_ids(1, 14, seed=5)[0], make_ids(1, 8, seed=6)[0]])


@pytest.mark.parametrize("name", ["gpt2", "gpt_neox", "gptj", "phi", "opt", "falcon_new_decoder",
                                  "stablelm_parallel"])
def test_greedy_generation_equals_transformers(tiny, make_ids, name):
    """Prompt 8 + 10 new tokens, KV-cached on our side."""
    t = tiny(name)
    ids = make_ids(2, 8, seed=7)
    ours = t.load().generate(ids, max_new_tokens=10, stop_at_eos=False)
    with torch.no_grad():
        ref = copy.deepcopy(t.hf).generate(ids, attention_mask=torch.ones_like(ids),
                                           max_new_tokens=10, do_sample=False,
                                           eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours.tokens, ref)


def _points(model: mi.MIModel) -> set[str]:
    return {p.name for p in model.backend.hook_points()}


@pytest.mark.parametrize("name", NAMES)
def test_every_hook_point_is_captured_with_its_documented_shape(tiny, make_ids, name):
    model = tiny(name).load()
    points = model.backend.hook_points()
    cache = model.forward(make_ids(2, 9), mi.HookSpec().capture_all(points))
    for hp in points:
        want = tuple(9 if s == -1 else s for s in model.backend.hook_shape(hp, 2, 9))
        assert tuple(cache[hp].shape) == want, hp.name


@pytest.mark.parametrize("name, resid_mid, ln2, rotary, pos_embed", [
    ("gpt2", True, True, False, True),
    ("opt", True, True, False, True),
    ("gpt_neox", False, True, True, False),  # parallel, two norms
    ("gpt_neox_sequential", True, True, True, False),
    ("gptj", False, False, True, False),  # parallel, one shared norm
    ("phi", False, False, True, False),
    ("falcon_7b", False, False, True, False),
    ("falcon_new_decoder", False, True, True, False),
    ("falcon_sequential", True, True, True, False),
    ("stablelm", True, True, True, False),
    ("stablelm_parallel", False, False, True, False),
])
def test_hook_points_exist_exactly_where_the_family_has_the_value(tiny, name, resid_mid, ln2,
                                                                  rotary, pos_embed):
    pts = _points(tiny(name).load())
    assert ("blocks.1.hook_resid_mid" in pts) == resid_mid
    assert ("blocks.1.ln2.hook_normalized" in pts) == ln2
    assert ("blocks.1.attn.hook_rot_q" in pts) == rotary
    assert ("hook_pos_embed" in pts) == pos_embed
    for always in ("blocks.1.hook_resid_pre", "blocks.1.attn.hook_pattern", "blocks.1.mlp.hook_in",
                   "blocks.1.mlp.hook_post", "blocks.1.hook_mlp_out", "blocks.1.hook_resid_post"):
        assert always in pts


def test_parallel_block_residual_is_the_sum_of_both_branches(tiny, make_ids):
    model = tiny("gpt_neox").load()
    names = ["blocks.1.hook_resid_pre", "blocks.1.hook_attn_out", "blocks.1.hook_mlp_out",
             "blocks.1.hook_resid_post"]
    c = model.forward(make_ids(2, 9), mi.HookSpec().capture_all(names))
    total = c[names[0]] + c[names[1]] + c[names[2]]
    assert (total - c[names[3]]).abs().max().item() < TOL


def test_shared_norm_mlp_reads_hook_mlp_in_when_it_is_changed(tiny, make_ids):
    """GPT-J's MLP reads ln_1 of the block input; replacing hook_mlp_in must reach the MLP."""
    model = tiny("gptj").load()
    ids = make_ids(2, 9)
    plain = model.forward(ids, mi.HookSpec().capture("blocks.1.mlp.hook_pre"))
    spec = mi.HookSpec().intervene("blocks.1.hook_mlp_in", mi.Add(torch.linspace(-2, 2, 64)))  # LayerNorm removes a constant
    spec.capture("blocks.1.mlp.hook_pre")
    changed = model.forward(ids, spec)
    assert (changed["blocks.1.mlp.hook_pre"] - plain["blocks.1.mlp.hook_pre"]).abs().max() > 1e-3


def test_gpt2_checkpoint_without_the_transformer_prefix_loads_the_same(tiny, make_ids, tmp_path):
    """openai-community/gpt2 stores ``h.0.attn.c_attn.weight`` (no ``transformer.``) and the
    causal-mask buffers ``attn.bias`` / ``attn.masked_bias``; both load, the buffers ignored."""
    t = tiny("gpt2")
    d = tmp_path / "gpt2_hub"
    shutil.copytree(t.path, d)
    ts = load_file(d / "model.safetensors")
    ts = {k.removeprefix("transformer."): v for k, v in ts.items()}
    ts["h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 64, 64, dtype=torch.bool))
    ts["h.0.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(ts, d / "model.safetensors")
    be = load_backend(ModelSource(path=d), torch.device("cpu"), torch.float32)
    ids = make_ids(2, 9)
    with torch.no_grad():
        ref = t.hf(ids).logits
    assert (mi.MIModel(be).forward(ids).output - ref).abs().max().item() < TOL


def test_learned_positions_do_not_extrapolate(tiny, make_ids):
    model = tiny("gpt2").load()  # n_positions 64
    with pytest.raises(mi.InputError, match="context of 64"):
        model.forward(make_ids(1, 65))
    with pytest.raises(mi.MIError, match="position 65"):  # allowed past it: cannot, still
        model.forward(make_ids(1, 65), allow_beyond_context=True)


def test_tl_weight_names_for_learned_positions_and_unembed_bias(tiny):
    gpt2, gptj = tiny("gpt2").load().backend, tiny("gptj").load().backend
    assert tuple(gpt2.get_weight("W_pos").shape) == (64, 64)
    assert tuple(gptj.get_weight("b_U").shape) == (128,)
    with pytest.raises(mi.WeightLoadError, match="b_U"):
        gpt2.get_weight("b_U")
    with pytest.raises(mi.WeightLoadError, match="ln2.w"):
        gptj.get_weight("ln2.w", 0)  # one shared norm
    # GPT-2's Conv1D weights come out in TransformerLens' layout
    hf = tiny("gpt2").hf.transformer.h[0].attn.c_attn.weight  # [d_model, 3 * d_model]
    assert torch.equal(gpt2.get_weight("W_Q", 0), hf[:, :64].view(64, 4, 16).transpose(0, 1))

"""Nemotron-H's mixture-of-experts layers (Nemotron 3's "moe" / "E") against transformers 5.24
on the same tiny weights (F32, unit scale: tests/support/ssm_tiny.py's recipe, hidden 64,
vocab 128, 4 layers).

Two checkpoints: transformers' own default schedule (Mamba-2, MoE, attention, MLP) and one in
the legacy pattern spelling with two MoE layers behind a latent projection
(``moe_latent_size``). Both route as Nemotron 3 does but with the awkward settings switched
on: 8 experts in n_group 4 groups of which topk_group 2 are kept (so the group limit
decides), top-3, routed_scaling_factor 2.5, a non-zero ``e_score_correction_bias`` (choice
only), renormalised top-k (and, in the latent one, not renormalised).

Checked: logits and every layer's residual stream < 1e-4, a left-padded batch of 2 (the MoE is
per token, so transformers' model is padding-invariant), cached greedy generation equal to
transformers' tokens, token by token == the sequence, the router points equal to
transformers' router outputs, expert contributions summing to the MLP output, an
intervention on hook_router_logits equal to transformers with the router negated, the
stacked (in-memory) layout loading to the same numbers, and config handling.
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

import mi_core as mi
from mi_core.interp import LogitLensAnalysis, decompose_resid, run_for_decomposition

from tests.support.checkpoint_variants import variant
from tests.support.ssm_tiny import TinySsm, _randomise

TOL = 1e-4
VOCAB = 128

_BASE: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=48, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, mamba_num_heads=8, mamba_head_dim=8, n_groups=2,
    ssm_state_size=8, chunk_size=8, n_routed_experts=8, moe_intermediate_size=32,
    moe_shared_expert_intermediate_size=40, num_experts_per_tok=3, n_group=4, topk_group=2,
    routed_scaling_factor=2.5, norm_topk_prob=True, pad_token_id=0, bos_token_id=1,
    eos_token_id=2)

#: name -> (config overrides, each layer's type as model.layer_types says it)
CASES: dict[str, tuple[dict[str, Any], list[str]]] = {
    # transformers' NemotronHConfig() default schedule
    "default": (dict(layers_block_type=["linear_attention", "moe", "full_attention", "mlp"]),
                ["mamba2", "moe", "full_attention", "mlp"]),
    # legacy pattern spelling, two MoE layers, latent experts (24 < hidden 64), no
    # renormalisation, 2 groups of 4 with one kept
    "latent": (dict(hybrid_override_pattern="ME*E", moe_latent_size=24, n_group=2,
                    topk_group=1, norm_topk_prob=False),
               ["mamba2", "moe", "full_attention", "moe"]),
}

_CACHE: dict[str, TinySsm] = {}
_MODELS: dict[str, mi.MIModel] = {}


def _ids(batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    """Token ids in [3, VOCAB) (no pad / bos / eos)."""
    return torch.randint(3, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _tiny(name: str) -> TinySsm:
    if name not in _CACHE:
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.for_model("nemotron_h", **{**_BASE, **CASES[name][0]})
        torch.manual_seed(0)
        hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        _randomise(hf, 0)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():  # a buffer, not a parameter: the recipe does not reach it
            for n, b in hf.named_buffers():
                if n.endswith("e_score_correction_bias"):
                    b.copy_(0.3 * torch.randn(b.shape, generator=g))
        root = Path(tempfile.mkdtemp(prefix="tiny_nemoe_"))
        import atexit
        import shutil
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        hf.save_pretrained(root / name)
        _CACHE[name] = TinySsm(name, root / name, hf)
    return _CACHE[name]


def _model(name: str) -> mi.MIModel:
    if name not in _MODELS:
        _MODELS[name] = mi.MIModel.from_pretrained(_tiny(name).path)
    return _MODELS[name]


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> str:
    return request.param


def _moe_layers(name: str) -> list[int]:
    return [i for i, t in enumerate(CASES[name][1]) if t == "moe"]


def test_logits_and_every_layers_residual_stream_match_transformers(case) -> None:
    t, model = _tiny(case), _model(case)
    ids = _ids(2, 21, seed=1)
    with torch.no_grad():
        ref = t.hf(ids, output_hidden_states=True)
    L = model.num_layers
    cache = model.forward(ids, mi.HookSpec().capture_all(
        [mi.HookPoint.resid_pre(i) for i in range(L)] + [mi.HookPoint.resid_post(L - 1)]))
    assert (cache.output - ref.logits).abs().max().item() < TOL
    for i in range(L):  # hidden_states[i] = resid_pre(i)
        diff = (cache[mi.HookPoint.resid_pre(i)] - ref.hidden_states[i]).abs().max().item()
        assert diff < TOL, (i, diff)
    assert cache.output.std().item() > 0.3  # unit scale: not a comparison of zeros
    assert model.layer_types == CASES[case][1]
    # the MoE layers add something of unit scale (they are not near-identities)
    for i in _moe_layers(case):
        step = cache[mi.HookPoint.resid_pre(i + 1) if i + 1 < L else
                     mi.HookPoint.resid_post(i)] - cache[mi.HookPoint.resid_pre(i)]
        assert step.std().item() > 0.3, i


def test_left_padded_batch_matches_transformers_and_each_row_alone(case) -> None:
    t, model = _tiny(case), _model(case)
    ids = _ids(2, 14, seed=2)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    ids[1, :5] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = t.hf(ids, attention_mask=mask, position_ids=positions).logits
    out = model.forward(ids, attention_mask=mask).output
    assert (out[0] - ref[0]).abs().max().item() < TOL
    assert (out[1, 5:] - ref[1, 5:]).abs().max().item() < TOL
    alone = model.forward(ids[1:, 5:]).output
    assert (out[1, 5:] - alone[0]).abs().max().item() < TOL


def test_cached_greedy_generation_equals_transformers_tokens(case) -> None:
    t, model = _tiny(case), _model(case)
    ids = _ids(2, 9, seed=3)
    with torch.no_grad():
        ref = t.hf.generate(ids, max_new_tokens=10, do_sample=False)
    out = model.generate(ids, max_new_tokens=10).tokens
    eos = t.hf.config.eos_token_id
    for row in range(2):
        gen, theirs = out[row, 9:].tolist(), ref[row, 9:].tolist()
        n = gen.index(eos) + 1 if eos in gen else len(gen)
        assert gen[:n] == theirs[:n], (row, gen, theirs)


def test_token_by_token_with_the_cache_equals_the_sequence(case) -> None:
    model = _model(case)
    ids = _ids(2, 11, seed=4)
    full = model.forward(ids).output
    past = model.backend.new_past(2)
    steps = [model.forward(ids[:, :4], past=past).output]
    steps += [model.forward(ids[:, j:j + 1], past=past).output for j in range(4, 11)]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() < TOL


def test_router_points_equal_transformers_router_with_group_limit_and_bias(case) -> None:
    """hook_router_logits / hook_expert_indices / hook_expert_weights equal what transformers'
    NemotronHTopkRouter returns (its top-k unsorted: compared as sets, weights by expert);
    the chosen experts lie in topk_group groups, and the selection bias changed the choice
    of some tokens (so both are exercised)."""
    t, model = _tiny(case), _model(case)
    c = model.config.moe
    ids = _ids(2, 12, seed=5)
    layers = _moe_layers(case)
    seen: dict[int, tuple[torch.Tensor, ...]] = {}
    handles = [t.hf.model.layers[i].mixer.gate.register_forward_hook(
        lambda mod, args, out, i=i: seen.__setitem__(i, out)) for i in layers]
    try:
        with torch.no_grad():
            t.hf(ids)
    finally:
        for h in handles:
            h.remove()
    pts = [f"blocks.{i}.mlp.hook_{k}" for i in layers
           for k in ("router_logits", "expert_weights", "expert_indices")]
    cache = model.forward(ids, mi.HookSpec().capture_all(pts))
    per = c.num_experts // c.n_group
    bias_mattered = False
    for i in layers:
        logits, w_ref, i_ref = seen[i]
        ours = cache[f"blocks.{i}.mlp.hook_router_logits"]
        assert ours.shape == (2, 12, c.num_experts) and ours.dtype == torch.float32
        assert (ours.reshape(-1, c.num_experts) - logits).abs().max().item() < 1e-5
        idx = cache[f"blocks.{i}.mlp.hook_expert_indices"].reshape(-1, c.top_k)
        w = cache[f"blocks.{i}.mlp.hook_expert_weights"].reshape(-1, c.top_k)
        o_ours, o_ref = idx.argsort(-1), i_ref.argsort(-1)
        assert torch.equal(idx.gather(1, o_ours), i_ref.gather(1, o_ref))
        assert (w.gather(1, o_ours) - w_ref.gather(1, o_ref)).abs().max().item() < 1e-6
        assert ((idx // per).unique(dim=None).numel() > c.topk_group)  # groups vary by token
        assert all(len(set((row // per).tolist())) <= c.topk_group for row in idx)
        unbiased = torch.topk(logits.sigmoid(), c.top_k, dim=-1)[1].sort(-1)[0]
        bias_mattered |= not torch.equal(unbiased, idx.sort(-1)[0])
        if c.norm_topk_prob:  # renormalised, then scaled
            assert torch.allclose(w.sum(-1), torch.full((24,), c.routed_scaling), atol=1e-5)
    assert bias_mattered


def test_expert_contributions_and_the_shared_expert_sum_to_the_mlp_output(case) -> None:
    """experts.{e}.hook_out (behind a latent projection: the expert's latent output through
    fc2_latent_proj) is zero where e is not routed; with shared_expert.hook_out they sum to
    hook_mlp_out. Capturing them changes nothing."""
    model = _model(case)
    c, i = model.config.moe, _moe_layers(case)[0]
    p = f"blocks.{i}.mlp."
    pts = [p + f"experts.{e}.hook_out" for e in range(c.num_experts)]
    pts += [f"blocks.{i}.hook_mlp_out", p + "hook_expert_indices", p + "shared_expert.hook_out"]
    ids = _ids(2, 10, seed=6)
    plain = model.forward(ids).output
    cache = model.forward(ids, mi.HookSpec().capture_all(pts))
    assert (cache.output - plain).abs().max().item() < 1e-5
    idx = cache[p + "hook_expert_indices"]
    total = cache[p + "shared_expert.hook_out"].clone()
    for e in range(c.num_experts):
        out = cache[p + f"experts.{e}.hook_out"]
        assert out.shape == (2, 10, model.hidden_size)
        assert torch.all(out[~(idx == e).any(-1)] == 0), e
        total = total + out
    assert (total - cache[f"blocks.{i}.hook_mlp_out"]).abs().max().item() < 1e-5


def test_intervening_on_router_logits_equals_transformers_with_the_router_negated(case) -> None:
    t, model = _tiny(case), _model(case)
    ids = _ids(2, 12, seed=7)
    layers = _moe_layers(case)
    spec = mi.HookSpec()
    for i in layers:
        spec.intervene(f"blocks.{i}.mlp.hook_router_logits", lambda x, hook: -x)
        spec.capture(f"blocks.{i}.mlp.hook_expert_indices")
    ours = model.forward(ids, spec)
    key = f"blocks.{layers[0]}.mlp.hook_expert_indices"
    before = model.forward(ids, mi.HookSpec().capture(key))
    ref_model = copy.deepcopy(t.hf)
    with torch.no_grad():
        for i in layers:
            ref_model.model.layers[i].mixer.gate.weight.neg_()
        ref = ref_model(ids).logits
    assert (ours.output - ref).abs().max().item() < TOL
    assert not torch.equal(ours[key].sort(-1)[0], before[key].sort(-1)[0])
    assert (ours.output - before.output).abs().max().item() > 1e-2


def test_the_stacked_layout_transformers_holds_in_memory_loads_to_the_same_numbers(
        tmp_path: Path) -> None:
    """transformers saves per-expert tensors (experts.{e}.up_proj.weight) and loads them into
    experts.up_proj [E, d_expert, d_in] / experts.down_proj [E, d_in, d_expert]; a file with
    the stacked tensors (what its state_dict holds) loads here too, to the same logits."""
    name = "latent"
    src = _tiny(name).path

    def stack(tensors: dict) -> None:
        for i in _moe_layers(name):
            m = f"backbone.layers.{i}.mixer.experts."
            for proj in ("up_proj", "down_proj"):
                tensors[m + proj] = torch.stack([tensors.pop(f"{m}{e}.{proj}.weight")
                                                 for e in range(8)])

    path = variant(src, tmp_path / "stacked", tensor_edit=stack)
    ids = _ids(2, 9, seed=8)
    stacked = mi.MIModel.from_pretrained(path)
    assert stacked.config.moe.fused_linear and not _model(name).config.moe.fused_linear
    assert (stacked.forward(ids).output - _model(name).forward(ids).output).abs().max() < 1e-5


def test_logit_lens_and_decomposition_see_the_moe_layers_as_mlps() -> None:
    model = _model("default")
    ids = _ids(1, 7, seed=9)
    lens = LogitLensAnalysis().run(model, ids, position=-1)
    assert lens.points[-1].top[0].token_id == int(model.forward(ids).output[0, -1].argmax())
    cache = run_for_decomposition(model, ids)
    stack, labels = decompose_resid(cache, model.num_layers)
    assert labels == ["embed", "0_mixer", "1_mlp", "2_attn", "3_mlp"]
    final = cache[mi.HookPoint.resid_post(model.num_layers - 1)]
    assert (stack.sum(0) - final).abs().max().item() < 1e-4


def _parse(cfg: dict) -> Any:
    from mi_transformer.config import parse_config

    return parse_config(cfg, "config.json")


def test_transformers_default_config_parses_with_its_moe_layer() -> None:
    """NemotronHConfig()'s defaults (the schedule with a MoE layer, 8 experts, top-2,
    moe_intermediate_size 7688) parse as transformers builds them."""
    from transformers import NemotronHConfig

    c = _parse(NemotronHConfig().to_dict())
    assert c.layer_moe == (False, True, False, False)
    m = c.moe
    assert (m.num_experts, m.top_k, m.expert_size, m.shared_expert_size) == (8, 2, 7688, 7688)
    assert not m.gated and m.scoring == "sigmoid" and m.latent_size == 0


def test_mtp_keys_are_accepted_and_mlp_bias_with_moe_layers_is_refused() -> None:
    """The multi-token-prediction layers are outside the causal-LM forward (transformers
    neither builds them nor loads mtp.*); mlp_bias would give the shared expert biases,
    which are not implemented: refused by name."""
    cfg = json.loads((_tiny("default").path / "config.json").read_text())
    _parse({**cfg, "num_nextn_predict_layers": 1, "mtp_layers_block_type": ["full_attention",
                                                                           "moe"]})
    with pytest.raises(mi.ConfigError, match="mlp_bias = True"):
        _parse({**cfg, "mlp_bias": True})
    dense = {**cfg, "layers_block_type": ["linear_attention", "mlp", "full_attention", "mlp"],
             "mlp_bias": True}
    assert _parse(dense).moe is None  # a schedule without MoE layers keeps mlp_bias
    with pytest.raises(mi.ConfigError, match="'X'"):
        _parse({**cfg, "layers_block_type": None, "hybrid_override_pattern": "MX*-"})


def test_mtp_tensors_in_a_checkpoint_are_ignored(tmp_path: Path) -> None:
    def add_mtp(tensors: dict) -> None:
        tensors["mtp.layers.0.norm.weight"] = torch.ones(64)

    path = variant(_tiny("default").path, tmp_path / "mtp", tensor_edit=add_mtp)
    ids = _ids(1, 6, seed=10)
    out = mi.MIModel.from_pretrained(path).forward(ids).output
    assert (out - _model("default").forward(ids).output).abs().max().item() < 1e-6

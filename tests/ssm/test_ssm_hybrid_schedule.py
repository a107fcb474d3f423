"""A hybrid is a schedule of mixers in one generic block: a hand-built config with a Mamba-2
layer and a (rotary) attention layer, both followed by an MLP, runs through mi-transformer's
block with mi-ssm's mixer. No family name is involved: what a hybrid family adds is its
config parser and tables. Checked for self-consistency (there is no reference model of this
exact schedule): cached == uncached, padding, hook order, state specs on the right layers,
analyses reading each layer's own mixer."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.plugin import ConfigFields, mixer

D, VOCAB = 32, 64


def _hybrid() -> mi.MIModel:
    from mi_transformer.config import ATTENTION, MixerConfig, TransformerConfig
    from mi_transformer.model import TransformerBackend
    from mi_transformer.weights import DictSource, expected_shapes, load_weights

    spec = mixer("mamba2")
    raw = {"num_heads": 4, "head_dim": 16, "state_size": 8, "n_groups": 2}
    settings = spec.settings(ConfigFields(raw, "<hybrid>"), {k: k for k in raw} | {
        "n_heads": "num_heads", "d_state": "state_size"}, D)
    cfg = TransformerConfig(model_type="test_hybrid", vocab_size=VOCAB, hidden_size=D,
                            num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                            intermediate_size=48, layer_rope=(0, 0), layer_windows=(None, None),
                            layer_mixers=("mamba2", ATTENTION),
                            mixers=(MixerConfig("mamba2", spec, settings),))
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for name, shape in expected_shapes(cfg).items():
        t = torch.randn(shape, generator=g) / (shape[-1] ** 0.5 if len(shape) > 1 else 10)
        if name.endswith(("norm.weight", "layernorm.weight")):
            t = 1 + t
        tensors[name] = t
    tensors["model.layers.0.mixer.A_log"] = torch.log(torch.arange(1.0, 5.0))
    w = load_weights(cfg, DictSource(tensors), torch.device("cpu"), torch.float32, False)
    return mi.MIModel(TransformerBackend(cfg, w, torch.device("cpu"), torch.float32))


@pytest.fixture(scope="module")
def hybrid() -> mi.MIModel:
    return _hybrid()


def _ids(batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def test_each_layer_has_its_mixers_points_and_an_mlp(hybrid) -> None:
    assert hybrid.layer_types == ["mamba2", "full_attention"]
    names = [p.name for p in hybrid.hook_points()]
    assert names.index("blocks.0.ssm.hook_y") < names.index("blocks.0.hook_mixer_out") < \
        names.index("blocks.0.hook_resid_mid") < names.index("blocks.0.mlp.hook_post") < \
        names.index("blocks.1.attn.hook_pattern")
    assert "blocks.0.attn.hook_pattern" not in names and "blocks.1.hook_mixer_out" not in names


def test_cached_token_by_token_and_left_padding_equal_the_full_sequence(hybrid) -> None:
    ids = _ids(2, 12, seed=1)
    full = hybrid.forward(ids).output
    past = hybrid.backend.new_past(2)
    steps = [hybrid.forward(ids[:, :5], past=past).output]
    steps += [hybrid.forward(ids[:, j:j + 1], past=past).output for j in range(5, 12)]
    assert (torch.cat(steps, 1) - full).abs().max().item() < 1e-4
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    padded = hybrid.forward(ids, attention_mask=mask).output
    alone = hybrid.forward(ids[1:, 4:]).output
    assert (padded[1, 4:] - alone[0]).abs().max().item() < 1e-4


def test_state_specs_reach_the_recurrent_layer_and_refuse_the_attention_one(hybrid) -> None:
    ids = _ids(1, 8, seed=2)
    ko = hybrid.forward(ids, mi.HookSpec().set_state_knockout(mi.StateKnockoutSpec([2])))
    assert (ko.output - hybrid.forward(ids).output)[:, 3:].abs().max().item() > 1e-4
    with pytest.raises(mi.InterventionError, match="layer 1 is a 'full_attention' layer"):
        hybrid.forward(ids, mi.HookSpec().set_state_knockout(mi.StateKnockoutSpec([2]).layer(1)))


def test_attention_analyses_read_the_attention_layer_and_refuse_the_mixer(hybrid) -> None:
    from mi_core.interp import KnockoutSpec, decompose_resid, knockout_hooks, layer_attention
    from mi_core.interp import run_for_decomposition

    knockout_hooks(hybrid, KnockoutSpec(layers=[1], from_positions=[-1], to_positions=[0]), 6)
    with pytest.raises(mi.HookError, match="layer 0 is a 'mamba2' layer"):
        knockout_hooks(hybrid, KnockoutSpec(layers=[0], from_positions=[-1], to_positions=[0]), 6)
    assert layer_attention(hybrid, _ids(1, 6), 0)[1].name == "blocks.0.ssm.hook_effective_attn"
    assert layer_attention(hybrid, _ids(1, 6), 1)[1].name == "blocks.1.attn.hook_pattern"
    cache = run_for_decomposition(hybrid, _ids(1, 6))
    stack, labels = decompose_resid(cache, 2)
    assert labels == ["embed", "0_mixer", "0_mlp", "1_attn", "1_mlp"]
    assert (stack.sum(0) - cache["blocks.1.hook_resid_post"]).abs().max().item() < 1e-4

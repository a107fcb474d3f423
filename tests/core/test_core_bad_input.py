"""Every bad input gets a typed MIError whose message names the culprit, before any compute.

Each case asserts the error class and a fragment of the message naming the argument,
file, tensor, hook point or shape. Models: the fake backend (tests.support.fake_backend,
with a forward-call counter to prove "before compute") and the example plugin's toy model.
"""

from __future__ import annotations

import inspect
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

import mi_core as mi
from mi_core.hooks import declare_layer_points
from mi_core.loading import SafetensorsCheckpoint, safetensors_header
from tests.support.bad_files import (
    write_pickle_payload, write_raw_safetensors, write_word_tokenizer,
)
from tests.support.fake_backend import fake_model
from tests.support.toy_checkpoint import write_toy_checkpoint

NAN, INF = float("nan"), float("inf")
SEQ = 5


@pytest.fixture(scope="module")
def fake():
    """A fake-backend model whose backend counts forward calls."""
    model = fake_model()
    be = model.backend
    inner = be.forward
    be.calls = 0

    def counting(*args: Any, **kwargs: Any):
        be.calls += 1
        return inner(*args, **kwargs)

    be.forward = counting
    return model


@pytest.fixture(scope="module")
def toy_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("toy") / "toy"
    write_toy_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def toy(toy_path: Path) -> mi.MIModel:
    return mi.MIModel.from_pretrained(toy_path)


@pytest.fixture()
def ids() -> torch.Tensor:
    return torch.tensor([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]])


def _raises(cls: type[Exception], *fragments: str):
    """pytest.raises(cls) that also checks every fragment appears in the message."""
    class _Ctx:
        def __enter__(self):
            self.ctx = pytest.raises(cls)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc: Any) -> bool:
            handled = self.ctx.__exit__(*exc)
            if not handled:  # another exception type: let it propagate
                return False
            msg = str(self.info.value)
            for f in fragments:
                assert f in msg, f"{f!r} not in {msg!r}"
            return handled
    return _Ctx()


def _no_compute(model: mi.MIModel, fn) -> Exception:
    before = model.backend.calls
    with pytest.raises(mi.MIError) as info:
        fn()
    assert model.backend.calls == before, "the backend ran before the error"
    return info.value


# -- Knockout: bool = remove, float = 0 / -inf only, only at pre-softmax scores ----------------
def test_bool_knockout_mask_means_true_removes(fake, ids) -> None:
    edge = torch.zeros(SEQ, SEQ, dtype=torch.bool)
    edge[-1, 0] = True
    explicit = torch.zeros(SEQ, SEQ).masked_fill(edge, -INF)
    pat = "blocks.1.attn.hook_pattern"
    a = fake.forward(ids, mi.HookSpec().intervene("blocks.1.attn.hook_attn_scores",
                                                  mi.Knockout(edge)).capture(pat))
    b = fake.forward(ids, mi.HookSpec().intervene("blocks.1.attn.hook_scores",
                                                  mi.Knockout(explicit)).capture(pat))
    assert torch.equal(a.output, b.output)
    assert a[pat][:, :, -1, 0].abs().max() == 0  # the edge is removed, not boosted


@pytest.mark.parametrize("mask, fragment", [
    (torch.tensor([0.0, 1.0]), "[1.0]"),
    (torch.tensor([0.0, NAN]), "nan"),
    (torch.tensor([0.0, INF]), "inf"),
    (torch.tensor([0, 1]), "dtype torch.int64"),
    ([0.0, -INF], "must be a tensor"),
], ids=["one", "nan", "plus_inf", "int", "list"])
def test_knockout_mask_other_than_bool_or_zero_minus_inf_is_refused(mask, fragment) -> None:
    with _raises(mi.InterventionError, "Knockout mask", fragment):
        mi.Knockout(mask)


@pytest.mark.parametrize("point", ["blocks.0.attn.hook_pattern", "blocks.1.hook_resid_post",
                                   "blocks.0.attn.hook_q", "hook_embed"])
def test_knockout_anywhere_but_the_pre_softmax_scores_is_refused_at_registration(point) -> None:
    with _raises(mi.InterventionError, f"Knockout at {point}", "attn.hook_attn_scores"):
        mi.HookSpec().intervene(point, mi.Knockout(torch.zeros(SEQ, SEQ)))


# -- non-finite operands: refused at construction or registration ------------------------------
@pytest.mark.parametrize("make, fragment", [
    (lambda: mi.Replace(torch.tensor([1.0, NAN])), "Replace value holds 1 NaN"),
    (lambda: mi.Replace(torch.tensor([INF])), "Replace value holds 1 inf"),
    (lambda: mi.Replace(NAN), "Replace value"),
    (lambda: mi.Replace("x"), "Replace value must be a tensor or a number, got str"),
    (lambda: mi.Add(torch.full((3,), NAN)), "Add value holds 3 NaN"),
    (lambda: mi.Add(INF), "Add value"),
    (lambda: mi.Add(torch.ones(2, dtype=torch.bool)), "Add value must be numeric"),
    (lambda: mi.Scale(NAN), "Scale factor is nan"),
    (lambda: mi.Scale(INF), "Scale factor is inf"),
    (lambda: mi.Scale(torch.tensor([1.0, -INF])), "Scale factor holds 1 inf"),
    (lambda: mi.Scale(True), "Scale factor must be a number, got bool"),
    (lambda: mi.Steer(torch.ones(2, dtype=torch.bool), scale=NAN), "Steer scale is nan"),
    (lambda: mi.Steer(torch.ones(2, dtype=torch.bool), value=INF), "Steer value is inf"),
    (lambda: mi.Steer(torch.tensor([0.5, 1.0])), "Steer mask must be bool"),
    (lambda: mi.Steer(torch.ones(2, dtype=torch.bool), renormalize="yes"), "renormalize"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_non_finite_or_wrongly_typed_operands_are_refused_at_construction(make, fragment) -> None:
    with _raises(mi.InterventionError, fragment):
        make()


def test_minus_inf_replace_is_refused_except_at_the_pre_softmax_scores() -> None:
    masked = torch.zeros(SEQ, SEQ).masked_fill(torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1), -INF)
    mi.HookSpec().intervene("blocks.0.attn.hook_attn_scores", mi.Replace(masked))  # masking: fine
    with _raises(mi.InterventionError, "Replace at blocks.0.hook_resid_post", "-inf"):
        mi.HookSpec().intervene("blocks.0.hook_resid_post", mi.Replace(masked))


def test_operand_shape_that_cannot_broadcast_is_refused_before_compute(fake, ids) -> None:
    spec = mi.HookSpec().intervene("blocks.1.hook_resid_post", mi.Add(torch.ones(7)))
    err = _no_compute(fake, lambda: fake.forward(ids, spec))
    assert isinstance(err, mi.InterventionError)
    assert "blocks.1.hook_resid_post" in str(err) and "[7]" in str(err) and "[2, 5, 32]" in str(err)


# -- callables ----------------------------------------------------------------------------------
def test_a_raising_callable_names_the_point_and_chains_the_users_exception(fake, ids) -> None:
    def boom(t, hook):
        raise ValueError("user bug")

    spec = mi.HookSpec().intervene("blocks.2.hook_mlp_out", boom)
    with _raises(mi.InterventionError, "blocks.2.hook_mlp_out", "ValueError", "user bug") as info:
        fake.forward(ids, spec)
    assert isinstance(info.value.__cause__, ValueError)


def test_a_callable_returning_the_wrong_shape_names_the_point_and_both_shapes(fake, ids) -> None:
    spec = mi.HookSpec().intervene("blocks.0.hook_resid_pre", lambda t: t[:, :2])
    with _raises(mi.InterventionError, "blocks.0.hook_resid_pre", "[2, 5, 32]", "[2, 2, 32]"):
        fake.forward(ids, spec)


def test_a_callable_returning_a_non_tensor_names_the_point_and_the_type(fake, ids) -> None:
    spec = mi.HookSpec().intervene("hook_embed", lambda t, hook: t.tolist())
    with _raises(mi.InterventionError, "hook_embed", "returned list", "[2, 5, 32]"):
        fake.forward(ids, spec)


@pytest.mark.parametrize("fn, fragment", [
    (lambda a, b, c: a, "(a, b, c)"),
    (lambda: None, "()"),
    (lambda t, *, scale: t, "scale"),
], ids=["three_args", "no_args", "required_keyword"])
def test_a_callable_of_the_wrong_arity_is_refused_at_registration(fn, fragment) -> None:
    with _raises(mi.InterventionError, "blocks.0.hook_resid_post", fragment, "(tensor, hook)"):
        mi.HookSpec().intervene("blocks.0.hook_resid_post", fn)


def test_a_non_callable_intervention_is_refused_naming_the_point() -> None:
    with _raises(mi.InterventionError, "blocks.0.hook_resid_post", "got int"):
        mi.HookSpec().intervene("blocks.0.hook_resid_post", 3)


def test_callable_arity_is_decided_once_at_registration(fake, ids, monkeypatch) -> None:
    seen: list[int] = []
    one = lambda t: seen.append(1) or t * 2  # noqa: E731
    two = lambda t, hook: seen.append(2) or t * 0.5  # noqa: E731
    spec = (mi.HookSpec().intervene("blocks.0.hook_resid_post", one)
            .intervene("blocks.0.hook_resid_post", two))

    def no_more(*a: Any, **k: Any):
        raise AssertionError("inspect.signature called during the forward")

    monkeypatch.setattr(inspect, "signature", no_more)
    out = fake.forward(ids, spec).output
    ref = fake.forward(ids, mi.HookSpec().intervene("blocks.0.hook_resid_post", mi.Scale(1.0)))
    assert seen == [1, 2] and torch.allclose(out, ref.output, atol=1e-6)


# -- hook points and specs ----------------------------------------------------------------------
@pytest.mark.parametrize("point, cls, fragment", [
    ("blocks.0.attn.hook_nope", mi.HookError, "blocks.0.attn.hook_nope"),
    ("blocks.9.hook_resid_post", mi.HookError, "layer 9 out of range"),
    ("my.custom.point", mi.HookError, "my.custom.point"),
])
def test_a_point_the_model_lacks_is_refused_before_compute(fake, ids, point, cls, fragment) -> None:
    err = _no_compute(fake, lambda: fake.forward(ids, mi.HookSpec().capture(point)))
    assert isinstance(err, cls) and fragment in str(err)


def test_a_hook_point_of_the_wrong_type_is_refused() -> None:
    with _raises(mi.HookError, "got int"):
        mi.HookPoint.parse(3)


def test_hooks_that_are_not_a_hookspec_are_refused(fake, ids) -> None:
    with _raises(mi.HookError, "hooks must be a HookSpec", "dict"):
        fake.forward(ids, {"blocks.0.hook_resid_post": None})


@pytest.mark.parametrize("setter, spec", [
    ("set_state_knockout", mi.StateSteeringSpec(0.5)),
    ("set_state_steering", mi.StateKnockoutSpec()),
])
def test_a_state_spec_of_the_wrong_type_is_refused(setter, spec) -> None:
    with _raises(mi.InterventionError, setter, type(spec).__name__):
        getattr(mi.HookSpec(), setter)(spec)


def test_declaring_a_clashing_hook_point_factory_is_a_plugin_error() -> None:
    with _raises(mi.PluginError, "HookPoint.resid_post", "plugin 'x'"):
        declare_layer_points({"resid_post": "mixer.hook_other"}, owner="plugin 'x'")
    with _raises(mi.PluginError, "'not a suffix'"):
        declare_layer_points({"ok_name": "not a suffix"})


# -- capabilities: refused before compute -------------------------------------------------------
@pytest.mark.parametrize("spec", [mi.StateKnockoutSpec().position(1),
                                  mi.StateSteeringSpec(0.5, positions=[1])],
                         ids=["knockout", "steering"])
def test_a_state_spec_on_a_backend_without_state_interventions_is_refused(fake, ids, spec) -> None:
    hooks = mi.HookSpec()
    hooks.state_knockout = spec if isinstance(spec, mi.StateKnockoutSpec) else None
    hooks.state_steering = spec if isinstance(spec, mi.StateSteeringSpec) else None
    err = _no_compute(fake, lambda: fake.forward(ids, hooks))
    assert isinstance(err, mi.CapabilityError)
    assert "state interventions" in str(err) and "fake backend" in str(err)


def test_state_runners_refuse_a_backend_without_state_interventions(fake, ids) -> None:
    from mi_core.interp.state import run_state_knockout

    err = _no_compute(fake, lambda: run_state_knockout(fake, ids, mi.StateKnockoutSpec()))
    assert isinstance(err, mi.CapabilityError) and "run_state_knockout" in str(err)


def test_a_kv_cache_on_a_backend_without_one_is_refused(fake, ids) -> None:
    err = _no_compute(fake, lambda: fake.forward(ids, past=object()))
    assert isinstance(err, mi.CapabilityError) and "KV-cached generation" in str(err)


def test_a_layer_schedule_on_a_backend_without_one_is_refused(toy, ids) -> None:
    with _raises(mi.CapabilityError, "layer schedule", "toy backend"):
        toy.forward(ids, layer_schedule=[0, 1, 1, 2])
    from mi_core.interp import RecurrentPassSpec, generate_recurrent

    with _raises(mi.CapabilityError, "generate_recurrent", "layer schedule"):
        generate_recurrent(toy, ids, RecurrentPassSpec(0, 1), 2)


def test_a_layer_schedule_outside_the_layers_is_refused_before_compute(fake, ids) -> None:
    err = _no_compute(fake, lambda: fake.forward(ids, layer_schedule=[0, 9]))
    assert isinstance(err, mi.InputError) and "layer_schedule" in str(err) and "[9]" in str(err)


def test_weight_analyses_refuse_a_backend_without_weight_access(toy) -> None:
    from mi_core.interp.circuits import ov_circuit

    with _raises(mi.CapabilityError, "weight access", "W_V", "toy backend"):
        ov_circuit(toy, 0)


def test_attribution_patching_refuses_a_backend_that_is_not_differentiable(ids) -> None:
    from mi_core.interp.patching import attribution_patching

    model = fake_model()
    model.backend.differentiable = False
    with _raises(mi.CapabilityError, "attribution_patching", "gradients"):
        attribution_patching(model, ids[:1], ids[1:], lambda logits: logits[0, -1, 0])


# -- token ids, attention masks -----------------------------------------------------------------
@pytest.mark.parametrize("bad, cls, fragment", [
    (torch.tensor([[1.0, 2.0]]), mi.InputError, "ids must hold integer token ids"),
    (torch.tensor([[True, False]]), mi.InputError, "dtype torch.bool"),
    (torch.ones(1, 2, 3, dtype=torch.long), mi.InputError, "shape [1, 2, 3]"),
    (torch.zeros(1, 0, dtype=torch.long), mi.InputError, "ids is empty"),
    ([[1, 2, 3], [1, 2]], mi.InputError, "unequal length"),
    ([[1, 2, 999]], mi.TokenizerError, "[999]"),
    ([[-1, 2]], mi.TokenizerError, "[-1]"),
], ids=["float", "bool", "3d", "empty", "ragged", "too_big", "negative"])
def test_bad_token_ids_are_refused_before_compute(fake, bad, cls, fragment) -> None:
    err = _no_compute(fake, lambda: fake.forward(bad))
    assert isinstance(err, cls) and "ids" in str(err) and fragment in str(err)


@pytest.mark.parametrize("mask, fragment", [
    (torch.ones(2, 4), "attention_mask has shape [2, 4]"),
    (torch.ones(5), "attention_mask has shape [5]"),
    (torch.tensor([[1, 1, 2, 1, 1]] * 2), "[2]"),
    (torch.tensor([[1, 1, 0.5, 1, 1]] * 2), "[0.5]"),
    (torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 0, 0]]), "attention_mask rows [1] are all zero"),
], ids=["short", "1d", "two", "half", "all_zero_row"])
def test_bad_attention_masks_are_refused_before_compute(fake, ids, mask, fragment) -> None:
    err = _no_compute(fake, lambda: fake.forward(ids, attention_mask=mask))
    assert isinstance(err, mi.InputError) and fragment in str(err)


def test_right_padding_is_fine_in_forward_but_refused_in_generate(fake, ids) -> None:
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    fake.forward(ids, attention_mask=mask)  # correct for forward: padding is at the end
    err = _no_compute(fake, lambda: fake.generate(ids, 2, attention_mask=mask))
    assert isinstance(err, mi.InputError) and "rows [1]" in str(err) and "left padding" in str(err)


# -- generation settings ------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, fragment", [
    ({"max_new_tokens": -1}, "max_new_tokens"), ({"max_new_tokens": 2.5}, "max_new_tokens"),
    ({"max_new_tokens": True}, "max_new_tokens"), ({"max_new_tokens": "3"}, "max_new_tokens"),
    ({"temperature": NAN}, "temperature"), ({"temperature": -0.5}, "temperature"),
    ({"temperature": INF}, "temperature"), ({"temperature": "0.7"}, "temperature"),
    ({"forward_options": {"past": None}}, "'past'"),
], ids=lambda v: str(v))
def test_bad_generation_settings_are_refused_before_compute(fake, ids, kwargs, fragment) -> None:
    err = _no_compute(fake, lambda: fake.generate(ids, **{"max_new_tokens": 2, **kwargs}))
    assert isinstance(err, mi.InputError) and fragment in str(err)


def test_sample_token_refuses_a_nan_temperature() -> None:
    with _raises(mi.InputError, "temperature", "nan"):
        mi.sample_token(torch.zeros(1, 4), NAN)


# -- devices and dtypes at load -----------------------------------------------------------------
@pytest.mark.parametrize("device, fragment", [
    ("foo", "'foo'"), (3, "got int"), ("cuda:99", "cuda"), ("mps", "mps"),
])
def test_a_device_that_does_not_exist_or_is_unavailable_is_refused(toy_path, device, fragment) -> None:
    if isinstance(device, str) and device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if device == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    with _raises(mi.InputError, "device", fragment):
        mi.MIModel.from_pretrained(toy_path, device=device)


def test_cuda_without_cuda_is_refused(toy_path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with _raises(mi.InputError, "device 'cuda'", "not available"):
        mi.MIModel.from_pretrained(toy_path, device="cuda")


@pytest.mark.parametrize("dtype", [torch.int64, "float32"])
def test_a_non_floating_dtype_is_refused(toy_path, dtype) -> None:
    with _raises(mi.InputError, "dtype"):
        mi.MIModel.from_pretrained(toy_path, dtype=dtype)


# -- config.json ----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, fragment", [
    ("{not json", "not valid JSON"), ("[1, 2]", "must hold a JSON object, got list"),
    ('{"d_model": NaN}', "not valid JSON"), ('"toy"', "got str"),
], ids=["syntax", "list", "nan", "string"])
def test_a_bad_config_json_is_a_config_error_naming_the_file(toy_path, tmp_path, text, fragment) -> None:
    d = tmp_path / "m"
    write_toy_checkpoint(d)
    (d / "config.json").write_text(text)
    with _raises(mi.ConfigError, str(d / "config.json"), fragment):
        mi.check_compatibility(d)


def test_a_config_json_that_is_not_utf8_is_a_config_error(tmp_path) -> None:
    d = tmp_path / "m"
    write_toy_checkpoint(d)
    (d / "config.json").write_bytes(b'{"model_type": "\xff\xfe"}')
    with _raises(mi.ConfigError, "config.json"):
        mi.MIModel.from_pretrained(d)


# -- safetensors headers --------------------------------------------------------------------------
def _entry(dtype: Any = "F32", shape: Any = (2,), offsets: Any = (0, 8)) -> dict[str, Any]:
    return {"dtype": dtype, "shape": list(shape) if isinstance(shape, tuple) else shape,
            "data_offsets": list(offsets) if isinstance(offsets, tuple) else offsets}


@pytest.mark.parametrize("header, data, fragment", [
    ([1, 2], b"", "must be a JSON object, got list"),
    ({"w": "F32"}, b"", "tensor 'w': header entry must be an object"),
    ({"w": {"dtype": "F32"}}, b"", "tensor 'w'"),
    ({"w": _entry(dtype="F33")}, bytes(8), "unknown dtype 'F33'"),
    ({"w": _entry(dtype=5)}, bytes(8), "unknown dtype 5"),
    ({"w": _entry(shape=["a"])}, bytes(8), "shape must be a list of non-negative ints"),
    ({"w": _entry(shape=[-2])}, bytes(8), "[-2]"),
    ({"w": _entry(shape=[True, 2])}, bytes(8), "[True, 2]"),
    ({"w": _entry(shape="2")}, bytes(8), "'2'"),
    ({"w": _entry(offsets=[0])}, bytes(8), "data_offsets must be [begin, end]"),
    ({"w": _entry(offsets=[8, 0])}, bytes(8), "[8, 0]"),
    ({"w": _entry(offsets=[0, 4])}, bytes(8), "needs 8"),
    ({"a": _entry(), "b": _entry()}, bytes(8), "overlaps"),
    ({"w": _entry(offsets=[8, 16])}, bytes(8), "truncated"),
    ({"__metadata__": {"x": 1}, "w": _entry()}, bytes(8), "__metadata__"),
], ids=["list", "entry_str", "entry_keys", "dtype", "dtype_int", "shape_str", "shape_neg",
        "shape_bool", "shape_not_list", "offsets_len", "offsets_order", "offsets_size",
        "overlap", "past_end", "metadata"])
def test_a_malformed_safetensors_header_is_a_weight_load_error_naming_the_file(
        tmp_path, header, data, fragment) -> None:
    path = write_raw_safetensors(tmp_path / "model.safetensors", header, data)
    with _raises(mi.WeightLoadError, str(path), fragment):
        SafetensorsCheckpoint([path])


@pytest.mark.parametrize("kwargs, fragment", [
    ({"header_bytes": b"\xff\xfe{}"}, "unreadable safetensors header"),
    ({"header_bytes": b"{}", "declared_len": 10**6}, "truncated"),
    ({"header_bytes": b"{NaN}"}, "unreadable"),
], ids=["not_utf8", "length_beyond_file", "bad_json"])
def test_an_unreadable_safetensors_header_is_a_weight_load_error(tmp_path, kwargs, fragment) -> None:
    path = write_raw_safetensors(tmp_path / "x.safetensors", None, **kwargs)
    with _raises(mi.WeightLoadError, str(path), fragment):
        safetensors_header(path)


def test_a_file_too_short_for_a_header_is_a_weight_load_error(tmp_path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"\x01\x02")
    with _raises(mi.WeightLoadError, str(path), "no header"):
        safetensors_header(path)


def test_a_truncated_checkpoint_is_refused_at_load(tmp_path) -> None:
    d = tmp_path / "m"
    write_toy_checkpoint(d)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-16])
    with _raises(mi.WeightLoadError, str(f), "truncated"):
        mi.MIModel.from_pretrained(d)


@pytest.mark.parametrize("weight_map, fragment", [
    ({"w": "../outside.safetensors"}, "weight_map"), (["x"], "weight_map"), ({"w": 3}, "weight_map"),
], ids=["escapes_dir", "list", "not_str"])
def test_a_bad_shard_index_is_a_weight_load_error(tmp_path, weight_map, fragment) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with _raises(mi.WeightLoadError, "model.safetensors.index.json", fragment):
        SafetensorsCheckpoint.from_directory(tmp_path)


def test_a_tensor_in_two_shards_is_a_weight_load_error(tmp_path) -> None:
    a = write_raw_safetensors(tmp_path / "a.safetensors", {"w": _entry()}, bytes(8))
    b = write_raw_safetensors(tmp_path / "b.safetensors", {"w": _entry()}, bytes(8))
    with _raises(mi.WeightLoadError, "'w'", str(a), str(b)):
        SafetensorsCheckpoint([a, b])


# -- pickle checkpoints: refused, never opened ----------------------------------------------------
def test_the_pickle_payload_is_live(tmp_path) -> None:
    """The payload used below really would create its marker (so its absence proves something)."""
    live = tmp_path / "live_marker"
    pickle.loads(write_pickle_payload(tmp_path / "probe.bin", live).read_bytes())
    assert live.exists()


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "weights.pth", "last.ckpt"])
def test_a_pickle_checkpoint_is_refused_without_ever_being_unpickled(tmp_path, name) -> None:
    d = tmp_path / "model"
    marker = tmp_path / "UNPICKLED"
    write_pickle_payload(d / name, marker)
    (d / "config.json").write_text(json.dumps({"model_type": "toy-mlp", "vocab_size": 11,
                                               "d_model": 8, "n_layers": 3}))
    with _raises(mi.WeightLoadError, name, "pickle", "safetensors"):
        mi.MIModel.from_pretrained(d)
    with _raises(mi.WeightLoadError, name):
        mi.check_compatibility(d)
    with _raises(mi.WeightLoadError, str(d / name), "pickle"):
        mi.MIModel.from_pretrained(d / name)
    with _raises(mi.WeightLoadError, name):
        SafetensorsCheckpoint.from_directory(d)
    assert not marker.exists()


# -- tokenizers ----------------------------------------------------------------------------------
@pytest.mark.parametrize("config, text, fragment", [
    (None, "{oops", "invalid JSON"),
    (["bos"], None, "must hold a JSON object, got list"),
    ({"bos_token": "<bos>"}, None, "bos_token '<bos>' is not in the vocabulary"),
    ({"eos_token": 7}, None, "eos_token must be a string"),
], ids=["syntax", "list", "unknown_bos", "eos_number"])
def test_a_bad_tokenizer_config_is_a_tokenizer_error_naming_the_file(tmp_path, config, text,
                                                                     fragment) -> None:
    path = write_word_tokenizer(tmp_path, config, text)
    with _raises(mi.TokenizerError, fragment) as info:
        mi.HFTokenizer.from_file(path)
    assert "tokenizer" in str(info.value)


def test_a_corrupt_tokenizer_json_is_a_tokenizer_error_naming_it(tmp_path) -> None:
    (tmp_path / "tokenizer.json").write_text("{]")
    with _raises(mi.TokenizerError, str(tmp_path / "tokenizer.json")):
        mi.HFTokenizer.from_file(tmp_path / "tokenizer.json")


@pytest.mark.parametrize("call, fragment", [
    (lambda t: t.encode(123), "encode needs a str, got int"),
    (lambda t: t.encode_with_offsets(None), "encode needs a str"),
    (lambda t: t.decode(["a"]), "integer token ids"),
    (lambda t: t.decode([1.5]), "integer token ids"),
    (lambda t: t.decode([99]), "[99] out of range"),
], ids=["encode_int", "offsets_none", "decode_str", "decode_float", "decode_range"])
def test_bad_tokenizer_calls_are_tokenizer_errors(tmp_path, call, fragment) -> None:
    tok = mi.HFTokenizer.from_file(write_word_tokenizer(tmp_path, {"bos_token": "<s>"}))
    with _raises(mi.TokenizerError, fragment):
        call(tok)


# -- state specs, recurrent feedback, padded tokenisation ---------------------------------------
@pytest.mark.parametrize("make, fragment", [
    (lambda: mi.StateSteeringSpec(NAN), "scale must be a finite number, got nan"),
    (lambda: mi.StateSteeringSpec("0.5"), "got '0.5'"),
    (lambda: mi.StateKnockoutSpec().position("a"), "position must be an int, got 'a'"),
    (lambda: mi.StateKnockoutSpec().position(True), "got True"),
    (lambda: mi.StateKnockoutSpec().layer(1.5), "layer must be an int, got 1.5"),
    (lambda: mi.StateSteeringSpec(0.5, positions=[None]), "position must be an int"),
    (lambda: mi.StateKnockoutSpec().layer_range(3, 1), "end must be >= start"),
], ids=["nan_scale", "str_scale", "str_position", "bool_position", "float_layer",
        "none_position", "reversed_range"])
def test_bad_state_specs_are_refused_at_construction(make, fragment) -> None:
    with _raises(mi.InterventionError, fragment):
        make()


@pytest.mark.parametrize("entry, fragment", [
    (lambda d: dict(vector=torch.full((d,), NAN)), "NaN or inf"),
    (lambda d: dict(vector=torch.ones(d), scale=INF), "feedback scale"),
    (lambda d: dict(vector=torch.ones(d), position=1.0), "feedback position"),
    (lambda d: dict(vector=torch.ones(d, dtype=torch.long)), "float tensor"),
    (lambda d: dict(vector=torch.ones(d + 1)), "d_model"),
], ids=["nan_vector", "inf_scale", "float_position", "int_vector", "wrong_size"])
def test_bad_recurrent_feedback_is_refused_before_compute(fake, ids, entry, fragment) -> None:
    from mi_core.interp import RecurrentFeedbackEntry, RecurrentPassSpec, forward_recurrent

    spec = RecurrentPassSpec(0, 1, feedback=[RecurrentFeedbackEntry(**entry(fake.hidden_size))])
    err = _no_compute(fake, lambda: forward_recurrent(fake, ids, spec))
    assert isinstance(err, mi.InterventionError) and fragment in str(err)


def test_a_feedback_position_outside_the_prompt_is_refused(fake, ids) -> None:
    from mi_core.interp import RecurrentFeedbackEntry, RecurrentPassSpec, forward_recurrent

    spec = RecurrentPassSpec(0, 1, feedback=[RecurrentFeedbackEntry(torch.ones(32), 1.0, 9)])
    err = _no_compute(fake, lambda: forward_recurrent(fake, ids, spec))
    assert isinstance(err, mi.InterventionError) and "feedback position 9" in str(err)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"side": "middle"}, "side must be 'left' or 'right'"),
    ({"pad_id": 999}, "pad_id"), ({"pad_id": -1}, "pad_id"),
    ({"texts": []}, "non-empty"), ({"texts": "ab"}, "non-empty list"),
], ids=["side", "pad_big", "pad_negative", "empty", "a_string"])
def test_bad_padding_arguments_are_refused(fake, kwargs, fragment) -> None:
    with _raises(mi.InputError, fragment):
        fake.to_tokens_padded(**{"texts": ["a", "bc"], **kwargs})


def test_analyses_refuse_float_prompts_instead_of_truncating_them(fake) -> None:
    from mi_core.interp import LogitLensAnalysis

    err = _no_compute(fake, lambda: LogitLensAnalysis().run(fake, [[1.7, 2.2, 3.9]]))
    assert isinstance(err, mi.InputError) and "prompt must hold integer token ids" in str(err)


@pytest.mark.parametrize("fn, takes_hook", [
    (lambda t: t, False), (lambda t, hook: t, True), (lambda t, hook=None: t, True),
    (lambda t, scale=2.0: t * scale, False), (lambda *args: args[0], True), (torch.relu, False),
], ids=["t", "t_hook", "t_hook_default", "t_scale_default", "varargs", "builtin"])
def test_callable_arity_follows_the_signature(fn, takes_hook) -> None:
    from mi_core.interventions import CallableIntervention

    assert CallableIntervention(fn, "hook_embed").takes_hook is takes_hook


def test_a_typed_mi_error_inside_a_callable_keeps_its_class(fake, ids) -> None:
    def refuse(t):
        raise mi.DictionaryError("sae.safetensors: width 16 != d_in 24")

    with _raises(mi.DictionaryError, "sae.safetensors"):
        fake.forward(ids, mi.HookSpec().intervene("blocks.0.hook_resid_post", refuse))


# -- plugins that fail: typed errors naming the plugin and the source ---------------------------
class _CrashingPlugin:
    """Detection raises a raw ValueError; its backend's load raises a raw KeyError."""

    @mi.plugin_impl
    def mi_detect_backend(self, source):
        raise ValueError("boom in detection")

    @mi.plugin_impl
    def mi_register_backends(self):
        def load(source, device, dtype):
            raise KeyError("hidden_size")
        return [mi.BackendSpec("crashy", load)]


@pytest.fixture()
def crashing_plugin():
    from mi_core import plugins

    plugins.register_plugin(_CrashingPlugin(), name="crashy")
    yield
    plugins.unregister_plugin("crashy")


def test_a_plugin_crashing_in_detection_is_reported_not_raised(crashing_plugin, toy_path,
                                                               tmp_path) -> None:
    assert mi.check_compatibility(toy_path).backend == "toy"  # the other plugins still answer
    d = tmp_path / "m"
    write_toy_checkpoint(d)
    (d / "config.json").write_text(json.dumps({"model_type": "unknown-thing"}))
    with _raises(mi.UnsupportedModelError, "crashy", "detection failed", "ValueError",
                 "boom in detection"):
        mi.MIModel.from_pretrained(d)


def test_a_backend_load_raising_a_raw_error_becomes_a_plugin_error(crashing_plugin, toy_path) -> None:
    with _raises(mi.PluginError, "backend 'crashy'", str(toy_path), "KeyError") as info:
        mi.MIModel.from_pretrained(toy_path, backend="crashy")
    assert isinstance(info.value.__cause__, KeyError)

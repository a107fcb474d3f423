"""SAELens folders: every architecture, saved by sae-lens' own classes, equals sae-lens.

Reference: sae_lens 6.54 (PyPI) loading the same files; tolerance 1e-5 abs (F32).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import mi_core as mi
from mi_sae import SparseAutoencoder

sae_lens = pytest.importorskip("sae_lens")
from sae_lens.saes import (  # noqa: E402
    SAE, AbsTopKSAE, AbsTopKSAEConfig, GatedSAE, GatedSAEConfig, JumpReLUSAE, JumpReLUSAEConfig,
    JumpReLUSkipTranscoder, JumpReLUSkipTranscoderConfig, JumpReLUTranscoder,
    JumpReLUTranscoderConfig, SkipTranscoder, SkipTranscoderConfig, StandardSAE,
    StandardSAEConfig, TopKSAE, TopKSAEConfig, Transcoder, TranscoderConfig,
)
from sae_lens.saes.sae import SAEMetadata  # noqa: E402

TOL = 1e-5
D_IN, D_SAE, D_OUT = 16, 64, 12


def _randomise(sae: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            v = torch.randn(p.shape, generator=g) * 0.3
            if name == "threshold":
                v = v.abs()  # thresholds are positive in trained JumpReLU SAEs
            p.copy_(v)


def _meta(hook: str, hook_out: str | None = None) -> SAEMetadata:
    m = SAEMetadata(hook_name=hook, model_name="tiny")
    if hook_out:
        m.hook_name_out = hook_out
    return m


CASES = {
    "standard": lambda: StandardSAE(StandardSAEConfig(d_in=D_IN, d_sae=D_SAE, metadata=_meta("blocks.1.hook_resid_post"))),
    "standard_no_bdec": lambda: StandardSAE(StandardSAEConfig(d_in=D_IN, d_sae=D_SAE, apply_b_dec_to_input=False, metadata=_meta("blocks.1.hook_resid_post"))),
    "jumprelu": lambda: JumpReLUSAE(JumpReLUSAEConfig(d_in=D_IN, d_sae=D_SAE, metadata=_meta("blocks.0.hook_mlp_out"))),
    "topk": lambda: TopKSAE(TopKSAEConfig(d_in=D_IN, d_sae=D_SAE, k=5, metadata=_meta("blocks.1.hook_resid_pre"))),
    "topk_rescale": lambda: TopKSAE(TopKSAEConfig(d_in=D_IN, d_sae=D_SAE, k=5, rescale_acts_by_decoder_norm=True, metadata=_meta("blocks.1.hook_resid_pre"))),
    "abstopk": lambda: AbsTopKSAE(AbsTopKSAEConfig(d_in=D_IN, d_sae=D_SAE, k=5, metadata=_meta("blocks.1.hook_resid_pre"))),
    "gated": lambda: GatedSAE(GatedSAEConfig(d_in=D_IN, d_sae=D_SAE, metadata=_meta("blocks.0.hook_resid_post"))),
    "constant_norm_rescale": lambda: StandardSAE(StandardSAEConfig(d_in=D_IN, d_sae=D_SAE, normalize_activations="constant_norm_rescale", metadata=_meta("blocks.1.hook_resid_post"))),
    "layer_norm": lambda: JumpReLUSAE(JumpReLUSAEConfig(d_in=D_IN, d_sae=D_SAE, normalize_activations="layer_norm", metadata=_meta("blocks.1.hook_resid_post"))),
    "transcoder": lambda: Transcoder(TranscoderConfig(d_in=D_IN, d_sae=D_SAE, d_out=D_OUT, apply_b_dec_to_input=False, metadata=_meta("blocks.0.hook_mlp_in", "blocks.0.hook_mlp_out"))),
    "skip_transcoder": lambda: SkipTranscoder(SkipTranscoderConfig(d_in=D_IN, d_sae=D_SAE, d_out=D_OUT, apply_b_dec_to_input=False, metadata=_meta("blocks.0.hook_mlp_in", "blocks.0.hook_mlp_out"))),
    "jumprelu_transcoder": lambda: JumpReLUTranscoder(JumpReLUTranscoderConfig(d_in=D_IN, d_sae=D_SAE, d_out=D_OUT, apply_b_dec_to_input=False, metadata=_meta("blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out"))),
    "jumprelu_skip_transcoder": lambda: JumpReLUSkipTranscoder(JumpReLUSkipTranscoderConfig(d_in=D_IN, d_sae=D_SAE, d_out=D_OUT, apply_b_dec_to_input=False, metadata=_meta("blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out"))),
}


def _ref_forward(ref: SAE, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(features, full output) from sae-lens: encode then decode (stateful norm) + skip."""
    with torch.no_grad():
        f = ref.encode(x)
        out = ref.decode(f)
        if hasattr(ref, "W_skip"):
            out = out + x @ ref.W_skip.T
    return f, out


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_saelens_architecture_matches_sae_lens(case: str, tmp_path: Path) -> None:
    ref = CASES[case]()
    _randomise(ref)
    ref.save_model(tmp_path)
    ours = mi.load_dictionary(tmp_path)
    assert isinstance(ours, SparseAutoencoder) and isinstance(ours, mi.SparseDictionary)
    assert ours.format == "saelens" and ours.architecture == ref.cfg.architecture()
    x = torch.randn(3, 7, D_IN, generator=torch.Generator().manual_seed(1))
    f_ref, out_ref = _ref_forward(ref, x)
    f = ours.encode(x)
    assert (f != 0).any() and (f == 0).any()  # the activation is doing something
    torch.testing.assert_close(f, f_ref, atol=TOL, rtol=0)
    torch.testing.assert_close(ours.reconstruct(x), out_ref, atol=TOL, rtol=0)
    with torch.no_grad():
        dec_ref = ref.decode(ref.encode(x))  # decode alone: no skip term, as sae-lens
    torch.testing.assert_close(ours.decode(f, x=x), dec_ref, atol=TOL, rtol=0)
    # sparse decode (top-k via SparseActivations) equals dense decode of the same features
    sa = ours.encode_sparse(x)
    torch.testing.assert_close(ours.decode(sa, x=x), dec_ref, atol=TOL, rtol=0)
    assert str(ours.hook_point) == ref.cfg.metadata.hook_name  # TransformerLens names verbatim


def test_hook_z_sae_reshapes_heads_like_sae_lens(tmp_path: Path) -> None:
    ref = StandardSAE(StandardSAEConfig(d_in=D_IN, d_sae=D_SAE, reshape_activations="hook_z",
                                        metadata=_meta("blocks.1.attn.hook_z")))
    _randomise(ref)
    ref.save_model(tmp_path)
    ours = mi.load_dictionary(tmp_path)
    x = torch.randn(2, 5, 4, D_IN // 4)  # [batch, seq, heads, d_head]
    with torch.no_grad():
        f_ref = ref.encode(x)
        out_ref = ref.decode(f_ref)
    assert out_ref.shape == x.shape
    torch.testing.assert_close(ours.encode(x), f_ref, atol=TOL, rtol=0)
    torch.testing.assert_close(ours.reconstruct(x), out_ref, atol=TOL, rtol=0)


def _write_pre6(folder: Path, cfg: dict, weights: dict[str, torch.Tensor]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    save_file(weights, str(folder / "sae_weights.safetensors"))


def _pre6_weights(seed: int = 3, jumprelu: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = {"W_enc": torch.randn(D_IN, D_SAE, generator=g) * 0.3,
         "W_dec": torch.randn(D_SAE, D_IN, generator=g) * 0.3,
         "b_enc": torch.randn(D_SAE, generator=g) * 0.3, "b_dec": torch.randn(D_IN, generator=g) * 0.3}
    if jumprelu:
        w["threshold"] = torch.rand(D_SAE, generator=g) * 0.3
    return w


# Pre-6.0 flat configs, following SAELens' old LanguageModelSAERunnerConfig fields as
# `handle_pre_6_0_config` (sae_lens/loading/pretrained_sae_loaders.py) reads them.
PRE6 = {
    "relu_bool_norm": {"hook_point": "blocks.1.hook_resid_pre", "activation_fn_str": "relu",
                       "normalize_activations": True, "sae_lens_training_version": "3.13.0"},
    "topk_activation_fn": {"hook_point": "blocks.0.hook_resid_post", "activation_fn": "topk",
                           "activation_fn_kwargs": {"k": 6}, "normalize_activations": False},
    "jumprelu_5x": {"hook_name": "blocks.0.hook_mlp_out", "architecture": "jumprelu",
                    "normalize_activations": "none", "sae_lens_version": "5.9.0",
                    "apply_b_dec_to_input": False},
}


@pytest.mark.parametrize("case", sorted(PRE6))
def test_pre_6_flat_configs_match_sae_lens_own_loading(case: str, tmp_path: Path) -> None:
    cfg = {"d_in": D_IN, "d_sae": D_SAE, "dtype": "float32", "device": "cpu",
           "model_name": "tiny", **PRE6[case]}
    _write_pre6(tmp_path, cfg, _pre6_weights(jumprelu=case.startswith("jumprelu")))
    ref = SAE.load_from_disk(tmp_path)
    ours = mi.load_dictionary(tmp_path)
    x = torch.randn(4, D_IN, generator=torch.Generator().manual_seed(2)) * 2
    with torch.no_grad():
        f_ref = ref.encode(x)
        out_ref = ref.decode(f_ref)
    torch.testing.assert_close(ours.encode(x), f_ref, atol=TOL, rtol=0)
    torch.testing.assert_close(ours.decode(ours.encode(x)), out_ref, atol=TOL, rtol=0)
    assert ours.architecture == ref.cfg.architecture()
    assert str(ours.hook_point) == cfg.get("hook_point", cfg.get("hook_name"))


def test_pre_6_finetuning_scaling_factor_scales_features_before_decoding(tmp_path: Path) -> None:
    w = _pre6_weights()
    w["scaling_factor"] = torch.linspace(0.5, 1.5, D_SAE)
    _write_pre6(tmp_path, {"d_in": D_IN, "d_sae": D_SAE, "hook_point": "blocks.0.hook_resid_pre",
                           "finetuning_scaling_factor": True}, w)
    ours = mi.load_dictionary(tmp_path)
    x = torch.randn(5, D_IN)
    f = torch.relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"])
    expected = (f * w["scaling_factor"]) @ w["W_dec"] + w["b_dec"]  # pre-6.0 SAELens decode
    torch.testing.assert_close(ours.reconstruct(x), expected, atol=TOL, rtol=0)
    torch.testing.assert_close(ours.decode(ours.encode_sparse(x)), expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("case", ["standard", "topk_rescale", "gated", "jumprelu_skip_transcoder"])
def test_our_saelens_writer_is_read_back_by_sae_lens(case: str, tmp_path: Path) -> None:
    from mi_sae.formats.saelens import save

    ref = CASES[case]()
    _randomise(ref, seed=5)
    ref.save_model(tmp_path / "a")
    ours = mi.load_dictionary(tmp_path / "a")
    save(ours, tmp_path / "b")
    back = SAE.load_from_disk(tmp_path / "b")  # sae-lens reads what we wrote
    assert back.cfg.architecture() == ref.cfg.architecture()
    x = torch.randn(6, D_IN, generator=torch.Generator().manual_seed(4))
    f_ref, out_ref = _ref_forward(ref, x)
    f_back, out_back = _ref_forward(back, x)
    torch.testing.assert_close(f_back, f_ref, atol=0, rtol=0)
    torch.testing.assert_close(out_back, out_ref, atol=0, rtol=0)
    assert back.cfg.metadata.hook_name == str(ours.hook_point)


def test_dtype_argument_and_to_cast_weights_and_inputs(tmp_path: Path) -> None:
    ref = CASES["topk_rescale"]()
    _randomise(ref, seed=7)
    ref.save_model(tmp_path)
    x = torch.randn(5, D_IN, generator=torch.Generator().manual_seed(3))
    f_ref, out_ref = _ref_forward(ref, x)
    f64 = mi.load_dictionary(tmp_path, dtype=torch.float64)
    assert f64.W_enc.dtype == torch.float64 and f64.encode(x).dtype == torch.float64
    torch.testing.assert_close(f64.reconstruct(x), out_ref.double(), atol=TOL, rtol=0)
    back = f64.to(dtype=torch.float32)
    torch.testing.assert_close(back.encode(x), f_ref, atol=TOL, rtol=0)
    torch.testing.assert_close(back.reconstruct(x), out_ref, atol=TOL, rtol=0)

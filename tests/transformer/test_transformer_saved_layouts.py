"""Layouts transformers writes or reads through its conversion mapping (transformers 5.24's
``conversion_mapping.py``), for the families where the save-time reverse of a load-time
conversion writes tensors other than the published ones:

- OLMo hybrid: ``q_conv1d`` / ``k_conv1d`` / ``v_conv1d`` are concatenated into one conv on
  load and split in equal thirds on save (``Chunk``, the reverse of ``Concatenate``), whatever
  the key and value widths: with transformers' default ``linear_value_head_dim = 2 x
  linear_key_head_dim`` the saved convs are [96, 96, 96] rows for [48, 48, 192]. They are read
  as one concatenation (``MixerSpec.concatenated``), so both that file and the published
  layout (each conv at its own width) load; a group whose total is wrong is refused.
- Spellings transformers renames on load (``NameTable.renamed``): Nemotron-H's ``model.`` for
  ``backbone.``; OLMo hybrid's module names ``input_layernorm`` / ``post_attention_layernorm``
  for the saved ``attention_layer_norm`` / ``feedforward_layer_norm``; Qwen3.5's text model
  read from the multimodal checkpoint, which transformers saves under ``model.language_model.``
  (its prefix change, reverted on save) with ``model_type: qwen3_5_text``.

Every other converter of a family we read (the MoE families' per-expert merge and gate / up
concatenation, whose reverse splits evenly and writes the per-expert layout) round-trips in
tests/transformer/test_transformer_writes_every_family.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import mi_core as mi
from mi_core.errors import WeightLoadError
from tests.support import hybrid_tiny, linear_tiny

#: the gated-DeltaNet families' bound (test_transformer_writes_every_family.py's _LOOSER)
TOL = 2e-4
_OLMO = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, linear_num_key_heads=2,
             linear_num_value_heads=4, pad_token_id=0, bos_token_id=1, eos_token_id=2)
#: key / value head dims -> (q, k, v conv rows as transformers saves them, as expected):
#: 16 / 16 saves 128 rows as torch.chunk's 43 / 43 / 42 for 32 / 32 / 64; transformers'
#: defaults (None: 24 / 48 at hidden 64) 288 rows as 96 x 3 for 48 / 48 / 192
_DIMS = {"16_16": ((16, 16), ([43, 43, 42], [32, 32, 64])),
         "defaults": ((None, None), ([96, 96, 96], [48, 48, 192]))}
_CONVS = [f"model.layers.0.linear_attn.{p}_conv1d.weight" for p in "qkv"]


def _olmo(root: Path, dims: tuple[int | None, int | None]) -> Any:
    from transformers import OlmoHybridConfig, OlmoHybridForCausalLM

    kd, vd = dims
    extra = {} if kd is None else dict(linear_key_head_dim=kd, linear_value_head_dim=vd)
    torch.manual_seed(0)
    hf = OlmoHybridForCausalLM(OlmoHybridConfig(**_OLMO, **extra)).eval()
    linear_tiny._randomise(hf, 0, zero_centred=False)
    hf.save_pretrained(root)
    return hf


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(3, vocab - 4, (2, 9), generator=torch.Generator().manual_seed(23))


def _logits_err(path: Path, hf: Any, vocab: int) -> float:
    ids = _ids(vocab)
    with torch.no_grad():
        want = hf(ids).logits
    assert want.std().item() > 0.1
    got = mi.MIModel.from_pretrained(path).forward(ids).output
    return (got - want).abs().max().item()


def _rewrite(src: Path, dst: Path, edit: Any) -> Path:
    """A copy of checkpoint `src` whose tensors are `edit(dict of tensors)`."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    save_file(edit(load_file(str(src / "model.safetensors"))), str(dst / "model.safetensors"))
    shutil.copy(src / "config.json", dst / "config.json")
    return dst


def _rows(path: Path) -> list[int]:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return [f.get_slice(n).get_shape()[0] for n in _CONVS]


@pytest.mark.parametrize("dims", sorted(_DIMS))
def test_olmo_hybrid_convs_as_transformers_saves_them_load(tmp_path, dims):
    """transformers' own file (q/k/v convs in equal thirds) and the published layout (each
    conv at its width, re-split from the same concatenation) give transformers' logits."""
    (kd_vd, (saved, expected)) = _DIMS[dims]
    hf = _olmo(tmp_path / "saved", kd_vd)
    assert _rows(tmp_path / "saved") == saved  # the layout this test is about
    assert _logits_err(tmp_path / "saved", hf, 128) < TOL

    def published(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for i in range(4):
            names = [f"model.layers.{i}.linear_attn.{p}_conv1d.weight" for p in "qkv"]
            if names[0] in sd:
                whole = torch.cat([sd[n] for n in names])
                sd.update(zip(names, (t.clone() for t in whole.split(expected))))
        return sd

    pub = _rewrite(tmp_path / "saved", tmp_path / "published", published)
    assert _rows(pub) == expected
    assert _logits_err(pub, hf, 128) < TOL


def test_olmo_hybrid_conv_group_with_a_wrong_total_is_refused(tmp_path):
    """One row short in v_conv1d: the group cannot be the concatenation the mixer needs; the
    error names each conv with its stored shape and the expected ones."""
    _olmo(tmp_path / "saved", (16, 16))
    bad = _rewrite(tmp_path / "saved", tmp_path / "bad",
                   lambda sd: {**sd, _CONVS[2]: sd[_CONVS[2]][1:].clone()})
    with pytest.raises(WeightLoadError) as e:
        mi.MIModel.from_pretrained(bad)
    msg = str(e.value)
    assert f"{_CONVS[0]}: [43, 1, 4], {_CONVS[1]}: [43, 1, 4], {_CONVS[2]}: [41, 1, 4]" in msg
    assert "expected [32, 1, 4], [32, 1, 4], [64, 1, 4], 128 rows in all" in msg
    assert "layers.1." not in msg  # the other layers' groups are fine


def test_olmo_hybrid_conv_group_with_another_kernel_width_is_refused(tmp_path):
    _olmo(tmp_path / "saved", (16, 16))
    bad = _rewrite(tmp_path / "saved", tmp_path / "bad",
                   lambda sd: {**sd, _CONVS[0]: sd[_CONVS[0]][..., 1:].clone()})
    with pytest.raises(WeightLoadError, match=r"q_conv1d.weight: \[43, 1, 3\]"):
        mi.MIModel.from_pretrained(bad)


def _renamed(t: Any, dst: Path, old: str, new: str) -> Path:
    return _rewrite(t.path, dst, lambda sd: {k.replace(old, new): v for k, v in sd.items()})


def test_nemotron_h_with_the_model_prefix_loads(tmp_path):
    """transformers reads ``backbone.`` as ``model.`` (and saves ``backbone.``): a checkpoint
    spelled ``model.`` loads; both spellings at once are refused as unexpected tensors."""
    t = hybrid_tiny.make_tiny_hybrid(tmp_path, "nemotron_h")
    path = _renamed(t, tmp_path / "model_prefix", "backbone.", "model.")
    assert _logits_err(path, t.hf, hybrid_tiny.VOCAB) < 1e-4
    both = tmp_path / "both"
    _rewrite(t.path, both,
             lambda sd: {**sd, "model.norm_f.weight": sd["backbone.norm_f.weight"].clone()})
    with pytest.raises(WeightLoadError, match=r"unexpected tensors.*model\.norm_f\.weight"):
        mi.MIModel.from_pretrained(both)


def test_olmo_hybrid_with_the_module_norm_names_loads(tmp_path):
    """The norms under transformers' module names (input_layernorm, post_attention_layernorm),
    which it reads as well as the saved attention_layer_norm / feedforward_layer_norm."""
    t = linear_tiny.make_tiny_linear(tmp_path, "olmo_hybrid")
    ren = {"attention_layer_norm": "input_layernorm",
           "feedforward_layer_norm": "post_attention_layernorm"}

    def edit(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for k, v in sd.items():
            for a, b in ren.items():
                k = k.replace(a, b)
            out[k] = v
        return out

    path = _rewrite(t.path, tmp_path / "module_names", edit)
    assert _logits_err(path, t.hf, linear_tiny.VOCAB) < TOL


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_5_moe"])
def test_qwen3_5_text_model_resaved_from_the_multimodal_checkpoint_loads(tmp_path, name):
    """AutoModelForCausalLM on a Qwen3.5 (multimodal) checkpoint is the text model; saved, it
    keeps the model.language_model. prefix under a text model_type."""
    from transformers import AutoModelForCausalLM

    t = linear_tiny.make_tiny_linear(tmp_path, name)
    hf = AutoModelForCausalLM.from_pretrained(str(t.path), dtype=torch.float32).eval()
    out = tmp_path / "resaved"
    hf.save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["model_type"].endswith("_text")
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert "model.language_model.embed_tokens.weight" in set(f.keys())
    assert _logits_err(out, hf, linear_tiny.VOCAB) < TOL

"""What transformers writes loads, and gives transformers' numbers.

For every supported family (one tiny checkpoint per model_type, tests/support/tiny_families.py,
plus a Gemma 3 multimodal one): the config as ``save_pretrained`` writes it (the tiny
checkpoint itself) and as ``config.to_dict()`` gives it (every attribute, defaults included),
beside the same safetensors. For the GGUF architectures transformers reads
(``from_pretrained(dir, gguf_file=...)``): the config its conversion produces
(``_model_name_or_path``, ``unk_token_id``, ``quantization_config: {quant_method: gguf}``),
saved with the model's tensors. Reference: the transformers model itself (eager attention,
F32); logits max abs diff < 1e-4.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import mi_core as mi
from mi_transformer.config import FAMILIES as SUPPORTED
from tests.support.hybrid2_tiny import HYBRID2_FAMILIES
from tests.support.hybrid_tiny import HYBRID_FAMILIES
from tests.support.linear_tiny import LINEAR_FAMILIES
from tests.support.ssm_tiny import SSM_FAMILIES
from tests.support.tiny_families import FAMILIES, VOCAB
from tests.support.tiny_families_gemma import GEMMA_FAMILIES
from tests.support.tiny_families_moe2 import MOE2_FAMILIES
from tests.support.zamba2_minimax_tiny import ZM_FAMILIES
from tests.transformer.conftest import Tiny, _randomise, make_tiny

TOL = 1e-4

#: one tiny checkpoint per supported model_type (the first variant tiny_families lists)
ONE_PER_FAMILY: dict[str, str] = {}
for _name, (_mt, _) in FAMILIES.items():
    ONE_PER_FAMILY.setdefault(_mt, _name)


def test_every_supported_family_is_covered():
    """gemma3 multimodal: below; gpt-oss, DeepSeek-V2/V3, Llama 4 (text and multimodal):
    tests/transformer/test_transformer_moe2_configs.py and test_transformer_families_moe2.py
    (their tiny checkpoints are built there); the state-space families:
    tests/ssm/test_ssm_config.py (save_pretrained and to_dict); the hybrid and linear-attention
    families: tests/ssm/test_ssm_hybrid_to_dict.py and their parity tests (Zamba2, MiniMax:
    tests/ssm/test_ssm_zamba2_minimax_config.py; Falcon-H1, LFM2:
    tests/ssm/test_ssm_hybrid2_config.py); Gemma-4 and Gemma-3n (text and multimodal):
    tests/transformer/test_transformer_families_gemma.py."""
    moe2 = {mt for mt, _ in MOE2_FAMILIES.values()} | {"llama4"}
    moe2 |= {mt for mt, _ in GEMMA_FAMILIES.values()} | {"gemma4", "gemma3n"}
    mixed = {mt for mt, _ in (*HYBRID_FAMILIES.values(), *LINEAR_FAMILIES.values(),
                              *ZM_FAMILIES.values(), *HYBRID2_FAMILIES.values())}
    # the plugin-internal HookedTransformer(cfg) checkpoint has no transformers class: its
    # parity is TransformerLens' (tests/tl/test_tl_from_config.py)
    from mi_transformer.config.families_tl import MODEL_TYPE as TL_INTERNAL

    assert set(ONE_PER_FAMILY) | {"gemma3"} | moe2 | set(SSM_FAMILIES) | mixed == set(
        SUPPORTED) - {TL_INTERNAL}


def _with_config(t: Tiny, cfg: dict[str, Any], out: Path) -> Path:
    """A directory holding `cfg` as config.json and the tiny checkpoint's tensors."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "model.safetensors").symlink_to(t.path / "model.safetensors")
    return out


def _assert_same_logits(model: mi.MIModel, hf: Any, ids: torch.Tensor) -> None:
    with torch.no_grad():
        want = hf(ids).logits
    got = model.forward(ids).output
    assert (got - want).abs().max().item() < TOL
    assert got.std().item() > 0.1


@pytest.mark.parametrize("model_type", sorted(ONE_PER_FAMILY))
def test_save_pretrained_and_to_dict_configs_load_with_transformers_numbers(tiny, make_ids,
                                                                           tmp_path, model_type):
    t = tiny(ONE_PER_FAMILY[model_type])
    ids = make_ids(1, 10, seed=51)
    full = json.loads(json.dumps(t.hf.config.to_dict()))  # what to_dict() gives, as JSON
    assert set(full) > set(t.config)  # really more than save_pretrained's diff
    for path in (t.path, _with_config(t, full, tmp_path / "to_dict")):
        _assert_same_logits(mi.MIModel.from_pretrained(path), t.hf, ids)


def test_gemma3_multimodal_configs_load_with_transformers_numbers(tmp_path, make_ids):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=VOCAB,
                sliding_window=5, query_pre_attn_scalar=8, max_position_embeddings=64)
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                       image_token_index=VOCAB - 1, boi_token_index=VOCAB - 3,
                       eoi_token_index=VOCAB - 2)
    torch.manual_seed(0)
    hf = Gemma3ForConditionalGeneration(cfg).eval()
    hf.config._attn_implementation = "eager"
    _randomise(hf, 0)
    hf.save_pretrained(tmp_path / "saved")
    t = Tiny("gemma3_mm", tmp_path / "saved", hf)
    full = json.loads(json.dumps(hf.config.to_dict()))
    ids = make_ids(1, 10, seed=52)
    for path in (t.path, _with_config(t, full, tmp_path / "to_dict")):
        _assert_same_logits(mi.MIModel.from_pretrained(path), hf, ids)


# ------------------------------------------------------------- transformers' GGUF conversion

def _gguf_cases() -> dict[str, tuple[Any, str, str, dict[str, Any]]]:
    """name -> (writer module, GGUF arch, tiny family, overrides): the architectures
    transformers 5 reads from GGUF that we also write in the GGUF tests."""
    from tests.transformer import test_transformer_gguf_arches as a
    from tests.transformer import test_transformer_gguf_more_arches as b

    out = {name: (a, arch, mt, over) for name, (arch, mt, over) in a.CASES.items()
           if name in ("llama", "qwen2", "gemma2", "starcoder2", "mixtral")}
    for name in ("falcon_7b", "stablelm", "gemma3"):
        arch, tiny_name, over = b.CASES[name]
        mt, base = FAMILIES[tiny_name]
        out[name] = (b, arch, mt, {**base, **over})
    # transformers takes Falcon's MLP width from feed_forward_length, which llama.cpp's
    # converter writes as 4 x d_model (true of every published Falcon)
    out["falcon_7b"][3]["ffn_hidden_size"] = 4 * 64
    return out


GGUF_CASES = _gguf_cases()
#: metadata llama.cpp writes that transformers turns into config keys of its own
_META = {"general.name": ("Tiny Test Model", "STRING"),
         "tokenizer.ggml.unknown_token_id": (0, "UINT32")}


@pytest.mark.parametrize("name", sorted(GGUF_CASES))
def test_config_transformers_writes_from_a_gguf_loads_with_its_numbers(tmp_path, make_ids,
                                                                      name):
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    writer, arch, model_type, over = GGUF_CASES[name]
    (tmp_path / "src").mkdir()
    t = make_tiny(tmp_path / "src", name, model_type, over)
    writer.write_gguf(t, arch, tmp_path / f"{name}.gguf", meta=dict(_META))
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=f"{name}.gguf",
                                              dtype=torch.float32).eval()
    hf.config._attn_implementation = "eager"
    written = json.loads(json.dumps(hf.config.to_dict()))
    assert written["_model_name_or_path"] == "Tiny Test Model"
    assert written["unk_token_id"] == 0 and written["quantization_config"]["quant_method"] == "gguf"
    out = tmp_path / "converted"
    hf.config.save_pretrained(out)  # transformers refuses save_pretrained of a GGUF model
    tensors = {k: v.detach().clone().contiguous() for k, v in hf.state_dict().items()}
    if hf.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(out / "model.safetensors"))
    ids = make_ids(1, 10, seed=53)
    _assert_same_logits(mi.MIModel.from_pretrained(out), hf, ids)
    (out / "config.json").write_text(json.dumps(written))  # the to_dict() form too
    _assert_same_logits(mi.MIModel.from_pretrained(out), hf, ids)

"""What transformers writes loads, for every supported model_type, in one parametrized test.

For each ``model_type`` an installed plugin implements (mi_transformer's ``FAMILIES``, which
holds the state-space, hybrid and multimodal-wrapper types too): a tiny checkpoint built and
saved by transformers (``save_pretrained``: its own config.json and safetensors), and the same
tensors beside the config as ``to_dict()`` gives it (every attribute with its default:
``transformers_version``, ``architectures``, ``output_attentions``, ``return_dict``,
``dtype``, ``chunk_size_feed_forward``, ``id2label``, ``problem_type``,
``tokenizer_class``, ...) through transformers' own JSON writer. Both load through
``MIModel.from_pretrained`` (the plugins' detection, as a user would) and give
transformers' F32 logits. The checkpoints come from the session caches the support modules
keep, so a whole-suite run builds each once.

RWKV-6 / RWKV-7 (mi_rwkv) are not transformers families (transformers has RWKV-4 only): their
checkpoints come from flash-linear-attention and are covered by tests/rwkv. The GGUF form of
what transformers writes: tests/transformer/test_transformer_transformers_writes.py and
test_transformer_transformers_writes_gguf.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import attrs
import pytest
import torch

import mi_core as mi
from mi_transformer.config import FAMILIES as SUPPORTED
from tests.support import hybrid2_tiny, hybrid_tiny, linear_tiny, ssm_tiny, zamba2_minimax_tiny
from tests.support.tiny_families import _COMMON, FAMILIES
from tests.support.tiny_families_gemma import GEMMA_FAMILIES, cached_gemma
from tests.support.tiny_families_moe2 import MOE2_FAMILIES, cached_moe2

#: F32 logits against transformers' own; the gated-DeltaNet families' bound is transformers'
#: own F32 error against float64 (docs/DEVIATIONS.md: up to 1.1e-4), doubled
TOL = 1e-4
_LOOSER = {"qwen3_next": 2e-4, "qwen3_5": 2e-4, "qwen3_5_text": 2e-4, "qwen3_5_moe": 2e-4,
           "qwen3_5_moe_text": 2e-4, "olmo_hybrid": 2e-4}


@attrs.define
class Written:
    """A checkpoint as transformers saved it, and transformers' logits of `ids` on it."""

    path: Path  # save_pretrained's directory (config.json + safetensors)
    to_dict: dict[str, Any]  # the config object's to_dict(), as transformers' JSON writes it
    logits: Callable[[torch.Tensor], torch.Tensor]
    vocab: int


def _json(cfg: Any) -> dict[str, Any]:
    return json.loads(cfg.to_json_string(use_diff=False))


def _plain(t: Any) -> Written:
    """A Tiny / TinySsm (`.path`, `.hf`)."""
    return Written(t.path, _json(t.hf.config), lambda ids: t.hf(ids).logits,
                   t.hf.config.get_text_config().vocab_size)


_BUILT: dict[str, Written] = {}


def _first(families: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, str]:
    """model_type -> the first tiny checkpoint of it that `families` lists."""
    out: dict[str, str] = {}
    for name, (mt, _) in families.items():
        out.setdefault(mt, name)
    return out


def _gemma3_wrapper(root: Path) -> Written:
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from tests.transformer.conftest import _randomise

    text = dict(_COMMON, head_dim=16, sliding_window=5, query_pre_attn_scalar=8,
                max_position_embeddings=64)
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)
    v = _COMMON["vocab_size"]
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                       image_token_index=v - 1, boi_token_index=v - 3, eoi_token_index=v - 2)
    torch.manual_seed(0)
    hf = Gemma3ForConditionalGeneration(cfg).eval()
    hf.config.text_config._attn_implementation = "eager"
    _randomise(hf, 0)
    hf.save_pretrained(root / "gemma3")
    return Written(root / "gemma3", _json(hf.config), lambda ids: hf(input_ids=ids).logits, v)


def _gemma4_wrapper(root: Path) -> Written:
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    from tests.transformer.conftest import _randomise

    text = {**_COMMON, **GEMMA_FAMILIES["gemma4_text"][1], "max_position_embeddings": 64}
    torch.manual_seed(0)
    hf = Gemma4ForConditionalGeneration(Gemma4Config(text_config=text, vision_config=None,
                                                     audio_config=None)).eval()
    hf.config.text_config._attn_implementation = "eager"
    _randomise(hf, 0)
    hf.save_pretrained(root / "gemma4")
    return Written(root / "gemma4", _json(hf.config), lambda ids: hf(input_ids=ids).logits,
                   _COMMON["vocab_size"])


def _gemma3n_wrapper(root: Path, text_model: Any) -> Written:
    """Gemma3nForConditionalGeneration needs timm to be built (not installed here): its config
    as transformers writes it (Gemma3nConfig: text, vision and audio sub-configs), and the
    text model's tensors named as the wrapper saves them (model.language_model.*)."""
    from safetensors.torch import load_file, save_file
    from transformers import Gemma3nConfig

    cfg = Gemma3nConfig(text_config=text_model.hf.config.to_dict())
    out = root / "gemma3n"
    out.mkdir()
    tensors = {k.replace("model.", "model.language_model.", 1): v
               for k, v in load_file(str(text_model.path / "model.safetensors")).items()}
    save_file(tensors, str(out / "model.safetensors"))
    cfg.save_pretrained(out)
    return Written(out, _json(cfg), lambda ids: text_model.hf(ids).logits,
                   _COMMON["vocab_size"])


def _llama4_wrapper(root: Path) -> Written:
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    from tests.transformer.conftest import _randomise

    text = dict(_COMMON, **MOE2_FAMILIES["llama4_text"][1], max_position_embeddings=64)
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14, vision_output_dim=32,
                  projector_input_dim=32, projector_output_dim=32)
    torch.manual_seed(0)
    hf = Llama4ForConditionalGeneration(Llama4Config(text_config=text, vision_config=vision))
    hf.config.text_config._attn_implementation = "eager"
    _randomise(hf.eval(), 0)
    hf.save_pretrained(root / "llama4")
    # the wrapper's own text-only call fails in transformers 5.24 (it reads `image_outputs`
    # off its language model's output): its language model is the same text forward
    return Written(root / "llama4", _json(hf.config),
                   lambda ids: hf.language_model(input_ids=ids).logits, _COMMON["vocab_size"])


def _builders(tiny: Callable[[str], Any], root_factory: Any
              ) -> dict[str, Callable[[], Written]]:
    """model_type -> how its tiny checkpoint is built (each from its support module's cache)."""
    out: dict[str, Callable[[], Written]] = {}
    for mt, name in _first(FAMILIES).items():
        out[mt] = lambda name=name: _plain(tiny(name))
    moe2, gemma = cached_moe2(root_factory), cached_gemma(root_factory)
    for mt, name in _first(MOE2_FAMILIES).items():
        out[mt] = lambda name=name: _plain(moe2(name))
    for mt, name in _first(GEMMA_FAMILIES).items():
        out[mt] = lambda name=name: _plain(gemma(name))
    for mt, name in _first(ssm_tiny.SSM_FAMILIES).items():
        out[mt] = lambda name=name: _plain(_ssm(root_factory, name))
    for mt, name in _first(hybrid_tiny.HYBRID_FAMILIES).items():
        out[mt] = lambda name=name: _plain(hybrid_tiny.tiny_hybrid(name))
    for mt, name in _first(hybrid2_tiny.HYBRID2_FAMILIES).items():
        out[mt] = lambda name=name: _plain(hybrid2_tiny.tiny_hybrid2(name))
    for mt, name in _first(zamba2_minimax_tiny.ZM_FAMILIES).items():
        out[mt] = lambda name=name: _plain(zamba2_minimax_tiny.tiny_zm(name))
    for mt, name in _first(linear_tiny.LINEAR_FAMILIES).items():
        out[mt] = lambda name=name: _plain(_linear(root_factory, name))
    out["gemma3"] = lambda: _gemma3_wrapper(root_factory.mktemp("writes_mm"))
    out["gemma4"] = lambda: _gemma4_wrapper(root_factory.mktemp("writes_mm"))
    out["gemma3n"] = lambda: _gemma3n_wrapper(root_factory.mktemp("writes_mm"),
                                              gemma("gemma3n_text"))
    out["llama4"] = lambda: _llama4_wrapper(root_factory.mktemp("writes_mm"))
    return out


def _ssm(root_factory: Any, name: str) -> Any:
    from tests.ssm import conftest as ssm_conftest  # its session cache, when loaded

    cache = ssm_conftest._CACHE
    if name not in cache:
        cache[name] = ssm_tiny.make_tiny_ssm(root_factory.mktemp("tiny_ssm"), name)
    return cache[name]


def _linear(root_factory: Any, name: str) -> Any:
    cache = linear_tiny._CACHE
    if name not in cache:
        cache[name] = linear_tiny.make_tiny_linear(root_factory.mktemp("tiny_linear"), name)
    return cache[name]


#: every model_type the test knows how to build with transformers (checked against SUPPORTED)
_KNOWN = sorted({*(mt for mt, _ in FAMILIES.values()),
                 *(mt for mt, _ in MOE2_FAMILIES.values()),
                 *(mt for mt, _ in GEMMA_FAMILIES.values()),
                 *(mt for mt, _ in ssm_tiny.SSM_FAMILIES.values()),
                 *(mt for mt, _ in hybrid_tiny.HYBRID_FAMILIES.values()),
                 *(mt for mt, _ in hybrid2_tiny.HYBRID2_FAMILIES.values()),
                 *(mt for mt, _ in zamba2_minimax_tiny.ZM_FAMILIES.values()),
                 *(mt for mt, _ in linear_tiny.LINEAR_FAMILIES.values()),
                 "gemma3", "gemma4", "gemma3n", "llama4"})


def test_every_supported_model_type_is_built_here():
    assert set(_KNOWN) == set(SUPPORTED)


@pytest.fixture(scope="module")
def written(tiny, tmp_path_factory):
    builders = _builders(tiny, tmp_path_factory)

    def get(model_type: str) -> Written:
        if model_type not in _BUILT:
            _BUILT[model_type] = builders[model_type]()
        return _BUILT[model_type]

    return get


@pytest.mark.parametrize("model_type", _KNOWN)
def test_what_transformers_writes_loads_with_its_numbers(written, tmp_path, model_type):
    """save_pretrained's directory, and the to_dict() config beside the same tensors."""
    w = written(model_type)
    assert set(w.to_dict) > set(json.loads((w.path / "config.json").read_text()))
    d = tmp_path / "to_dict"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(w.to_dict))
    for f in w.path.glob("*.safetensors*"):
        (d / f.name).symlink_to(f)
    # ids clear of the special tokens transformers' configs place at both ends of the vocab
    ids = torch.randint(3, w.vocab - 4, (1, 9), generator=torch.Generator().manual_seed(21))
    with torch.no_grad():
        want = w.logits(ids)
    for path in (w.path, d):
        got = mi.MIModel.from_pretrained(path).forward(ids).output
        err = (got - want).abs().max().item()
        assert err < _LOOSER.get(model_type, TOL), (path.name, err)
    assert want.std().item() > 0.1

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
checkpoints come from flash-linear-attention and are covered by tests/rwkv.

Then, for every GGUF architecture both transformers 5.24 and we read: a tiny GGUF, read by
transformers (``from_pretrained(dir, gguf_file=...)``), saved, and the config it writes
(``_model_name_or_path``, ``unk_token_id``, ``quantization_config: gguf``, its defaults for
what GGUF does not carry) loaded by us with transformers' numbers.
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
from tests.support.family_checks import TOL, logits_tol  # F32 logits against transformers'
from tests.support.tiny_families import _COMMON, FAMILIES
from tests.support.tiny_families_gemma import GEMMA_FAMILIES, cached_gemma
from tests.support.tiny_families_moe2 import MOE2_FAMILIES, cached_moe2


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
    from mi_transformer.config.families_tl import MODEL_TYPE as TL_INTERNAL

    # the plugin-internal HookedTransformer(cfg) checkpoint: no transformers class writes it
    assert set(_KNOWN) == set(SUPPORTED) - {TL_INTERNAL}


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
        assert err < logits_tol(model_type), (path.name, err)
    assert want.std().item() > 0.1


# ------------------------------------------------------------- transformers' GGUF conversion

def _gguf_writers() -> dict[str, tuple[str, Callable[[Path], tuple[Any, Path]]]]:
    """name -> (GGUF architecture, build(root) -> (tiny checkpoint, its GGUF)): for every GGUF
    architecture transformers 5.24 reads (``GGUF_SUPPORTED_ARCHITECTURES``) that we read too,
    written by the converters the GGUF tests use (llama.cpp's layout); ``mixtral``: a llama
    GGUF with experts."""
    from safetensors.torch import load_file

    from tests.support import gguf_convert as conv
    from tests.support import gguf_convert_hybrid2 as c2
    from tests.transformer import test_transformer_gguf_arches as a
    from tests.transformer import test_transformer_gguf_more_arches as b
    from tests.transformer.conftest import make_tiny

    def plain(module: Any, name: str, **fit: Any) -> tuple[str, Any]:
        """`module`'s case `name`, with `fit`: what transformers' GGUF reader assumes where it
        does not read the metadata that says it (its defaults, or a fixed ratio)."""
        arch, family, over = module.CASES[name]
        if module is a:  # (arch, model_type, overrides)
            mt, base = family, {}
        else:  # (arch, tiny_families name, overrides)
            mt, base = FAMILIES[family]

        def build(root: Path) -> tuple[Any, Path]:
            t = make_tiny(root, name, mt, {**base, **over, **fit})
            return t, module.write_gguf(t, arch, root / f"{name}.gguf")
        return arch, build

    def mamba(root: Path) -> tuple[Any, Path]:
        t = ssm_tiny.make_tiny_ssm(root, "mamba")
        sd = load_file(str(t.path / "model.safetensors"))
        return t, conv.write(root / "mamba.gguf", "mamba", t.hf.config, sd,
                             params=conv.mamba_params, modify=conv.mamba_modify, generic=False)

    def lfm2(root: Path) -> tuple[Any, Path]:
        t = hybrid2_tiny.make_tiny_hybrid2(root, "lfm2")
        sd = load_file(str(t.path / "model.safetensors"))
        hp = c2.lfm2_hparams(t.hf.config.to_dict())
        return t, conv.write(root / "lfm2.gguf", "lfm2", t.hf.config, sd, hp=hp,
                             params=c2.lfm2_params, modify=c2.lfm2_modify)

    out = {name: plain(a, name) for name in ("llama", "qwen2", "gemma2", "phi3", "starcoder2",
                                             "mixtral")}
    # transformers 5.24's GGUF reader does not read these sizes: its config's defaults
    # (Qwen3's head_dim 128; Qwen2-MoE's expert widths 1408 / 5632; Qwen3-MoE's 768) or its
    # ratio (GPT-2's MLP 4 x n_embd; Falcon's, which llama.cpp writes as 4 x d_model, true of
    # every published Falcon) are what it builds; GPT-2's position table is n_positions 1024
    out["qwen3"] = plain(a, "qwen3", head_dim=128)
    out["qwen2moe"] = plain(a, "qwen2moe", moe_intermediate_size=1408,
                            shared_expert_intermediate_size=5632)
    out["qwen3moe"] = plain(a, "qwen3moe", moe_intermediate_size=768)
    out["gpt2"] = plain(a, "gpt2", n_inner=None, n_positions=1024)
    out["falcon"] = plain(b, "falcon_7b", ffn_hidden_size=4 * _COMMON["hidden_size"])
    out["stablelm"] = plain(b, "stablelm")
    out["gemma3"] = plain(b, "gemma3")
    out["mamba"] = ("mamba", mamba)
    out["lfm2"] = ("lfm2", lfm2)
    return out


GGUF_CASES = _gguf_writers()
#: transformers' GGUF architectures we read that transformers 5.24 cannot read from a tiny
#: GGUF, with why. (Its "mistral" is a llama GGUF whose general.name is "mistral": it then
#: asks gguf-py 0.19 for a "mistral" tensor map, which gguf-py does not have.)
_GGUF_NOT_IN_TRANSFORMERS = {
    # llama.cpp's rope metadata and expert names (test_transformer_gguf_new_arches.py pins it)
    "gpt-oss": "transformers' reader fails on llama.cpp's gpt-oss layout",
    # head_dim, the per-layer input width and table, the shared-KV layers are not read: its
    # defaults (head_dim 256, a 262144 x 1024 per-layer table) are the released sizes only
    "gemma4": "transformers' reader builds the released Gemma-4 sizes only",
}


def test_every_gguf_architecture_both_read_is_a_case():
    from mi_transformer import plugin
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    ours = set(plugin._GGUF.split(", "))
    # transformers' names for llama.cpp's (its loader renames qwen2moe, qwen3moe, gpt-oss)
    spelled = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gpt_oss": "gpt-oss"}
    both = {spelled.get(x, x) for x in GGUF_SUPPORTED_ARCHITECTURES} & ours
    assert both == {arch for arch, _ in GGUF_CASES.values()} | set(_GGUF_NOT_IN_TRANSFORMERS)


#: metadata llama.cpp writes that transformers turns into config keys of its own
def _meta(name: str) -> dict[str, tuple[Any, str]]:
    return {"general.name": ("Tiny Test Model", "STRING"),
            "tokenizer.ggml.unknown_token_id": (0, "UINT32"),
            "tokenizer.ggml.padding_token_id": (0, "UINT32"),
            "tokenizer.ggml.bos_token_id": (1, "UINT32"),
            "tokenizer.ggml.eos_token_id": (2, "UINT32")}


@pytest.mark.parametrize("name", sorted(GGUF_CASES))
def test_what_transformers_writes_from_a_gguf_loads_with_its_numbers(tmp_path, name):
    """A tiny GGUF (llama.cpp's layout, with the metadata its converter writes), read by
    transformers (``from_pretrained(dir, gguf_file=...)``) and saved (its config.save_pretrained: the model's own refuses a GGUF model) with
    the tensors it holds: the config it writes (``_model_name_or_path``, ``unk_token_id``, ``quantization_config: gguf``, its
    defaults for what GGUF does not carry), as saved and as ``to_dict()``, loads and gives the
    numbers of transformers' model of the GGUF."""
    from transformers import AutoModelForCausalLM

    from tests.transformer.test_transformer_gguf_new_arches import _rewrite

    _, build = GGUF_CASES[name]
    (tmp_path / "src").mkdir()
    (tmp_path / "gguf").mkdir()
    t, raw = build(tmp_path / "src")
    _rewrite(raw, tmp_path / "gguf" / "m.gguf", meta=_meta(name))
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "gguf"), gguf_file="m.gguf",
                                              dtype=torch.float32).eval()
    hf.config._attn_implementation = "eager"
    written = json.loads(hf.config.to_json_string(use_diff=False))
    if name != "lfm2":  # (Lfm2Config keeps only the attributes it declares)
        assert written["quantization_config"]["quant_method"] == "gguf"
        assert written["_model_name_or_path"] == "Tiny Test Model"
        assert written["unk_token_id"] == 0
    out = tmp_path / "saved"
    # transformers refuses save_pretrained of a model it read from GGUF (its quantizer says
    # not serializable), though its tensors are F32 already: without the quantizer it saves
    # as it saves any model (experts in the checkpoint layout, tied heads dropped)
    hf.hf_quantizer = None
    hf.save_pretrained(out)
    saved = json.loads((out / "config.json").read_text())  # with gguf_file, dequantize: false
    assert saved.get("quantization_config", {"quant_method": "gguf"})["quant_method"] == "gguf"
    vocab = hf.config.get_text_config().vocab_size
    ids = torch.randint(3, vocab - 4, (1, 10), generator=torch.Generator().manual_seed(53))
    with torch.no_grad():
        want = hf(ids).logits
    got = mi.MIModel.from_pretrained(out).forward(ids).output
    assert (got - want).abs().max().item() < TOL
    (out / "config.json").write_text(json.dumps(written))  # the to_dict() form too
    got = mi.MIModel.from_pretrained(out).forward(ids).output
    assert (got - want).abs().max().item() < TOL
    assert want.std().item() > 0.1

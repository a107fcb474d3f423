"""GGUF architectures ``gemma3n`` and ``gemma4`` (llama.cpp's ``Gemma3NModel`` /
``Gemma4Model`` in convert_hf_to_gguf.py): metadata -> the HF config of ``gemma3n_text`` /
``gemma4_text``, llama.cpp's tensors -> the family's weight table.

What the converter changed, undone here:

- both: norm gains as stored (no 1 + w: these families' norms multiply by w); AltUp's stream
  projections stacked as ``altup_proj`` / ``altup_unembd_proj`` [n - 1, d, d] (split again);
  the per-layer inputs' table padded with zero rows to the vocabulary (Gemma-3n: kept, so an
  id past the original table reads a zero row, as llama.cpp computes it); the activation
  sparsity written as its Gaussian quantile Phi^-1(p) (``activation_sparsity_scale``: p is
  Phi of it; -inf for a dense layer); the layer types as ``sliding_window_pattern``;
- Gemma-4: the full layers' head size as ``key_length`` (the sliding ones' as
  ``key_length_swa``), the KV heads per layer as an array when they differ, the MLP widths
  per layer as an array when ``use_double_wide_mlp`` doubles them, proportional RoPE as the
  ``rope_freqs`` tensor (1 for each rotated frequency, 1e30 for the others: the rotated
  fraction is read back off it), the router's input scale as ``ffn_gate_inp.scale``, its
  per-expert scale as ``ffn_down_exps.scale``, the layer scalar as ``layer_output_scale``;
  keys as values where a full layer has no ``attn_v``.

Layers that share keys keep their k / v tensors in a GGUF made from a published checkpoint;
they are ignored, as transformers ignores them. Architecture-specific, read by
:func:`read_gemma_gguf` (``checkpoint.read_gguf`` hands these two architectures to it).
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np
import torch

from mi_core.plugin import ConfigError, UnsupportedModelError, WeightLoadError, progress

from mi_transformer.gguf.arches import _Meta, check_gguf_size
from mi_transformer.gguf.header import GgufHeader, _quant_type, iter_dequantized

#: llama.cpp architecture -> the HF model_type and class it maps to
GEMMA_GGUF: dict[str, tuple[str, str]] = {"gemma3n": ("gemma3n_text", "Gemma3nForCausalLM"),
                                          "gemma4": ("gemma4_text", "Gemma4ForCausalLM")}

#: llama.cpp per-layer tensor (after ``blk.N.``) -> the family's weight-table slot
_LAYER = {
    "attn_norm.weight": "ln1.weight", "attn_q.weight": "q.weight", "attn_k.weight": "k.weight",
    "attn_v.weight": "v.weight", "attn_output.weight": "o.weight",
    "attn_q_norm.weight": "q_norm.weight", "attn_k_norm.weight": "k_norm.weight",
    "post_attention_norm.weight": "ln1_post.weight", "ffn_norm.weight": "ln2.weight",
    "post_ffw_norm.weight": "ln2_post.weight", "ffn_gate.weight": "mlp_in.weight",
    "ffn_up.weight": "mlp_up.weight", "ffn_down.weight": "mlp_out.weight",
    # per-layer inputs
    "inp_gate.weight": "ple:gate", "proj.weight": "ple:proj", "post_norm.weight": "ple:norm",
    # Gemma-3n: AltUp, Laurel
    "altup_correct_scale.weight": "altup:correct_output_scale",
    "altup_correct_coef.weight": "altup:correction_coefs",
    "altup_predict_coef.weight": "altup:prediction_coefs",
    "altup_router.weight": "altup:modality_router", "altup_router_norm.weight": "altup:router_norm",
    "laurel_l.weight": "laurel:left", "laurel_r.weight": "laurel:right",
    "laurel_post_norm.weight": "laurel:norm",
    # Gemma-4: the layer scalar, the MoE beside the MLP
    "layer_output_scale.weight": "layer_scalar", "ffn_gate_inp.weight": "moe:router.proj.weight",
    "ffn_gate_inp.scale": "moe:router.scale", "ffn_down_exps.scale": "moe:router.per_expert_scale",
    "ffn_gate_up_exps.weight": "moe:experts.gate_up_proj",
    "ffn_down_exps.weight": "moe:experts.down_proj",
    "pre_ffw_norm_2.weight": "ln2_moe.weight", "post_ffw_norm_1.weight": "ln2_post_dense.weight",
    "post_ffw_norm_2.weight": "ln2_post_moe.weight",
}
#: global tensors -> slots; AltUp's stacked projections -> one slot per stream (j = 0..n-2)
_GLOBAL = {"token_embd.weight": "embed", "output_norm.weight": "final_norm.weight",
           "output.weight": "lm_head.weight", "per_layer_token_embd.weight": "ple:embed",
           "per_layer_model_proj.weight": "ple:proj", "per_layer_proj_norm.weight": "ple:norm"}
_STACKED = {"altup_proj.weight": "altup:in.{j}", "altup_unembd_proj.weight": "altup:out.{j}"}
_ROPE_FREQS = "rope_freqs.weight"
#: a layer's tensors that are unused where it shares an earlier layer's keys and values
_SHARED_UNUSED = {"attn_k.weight", "attn_v.weight", "attn_k_norm.weight"}


def _slot(name: str) -> tuple[int | None, str] | None:
    if name in _GLOBAL:
        return None, _GLOBAL[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER:
        return int(parts[1]), _LAYER[parts[2]]
    return None


def _floats(m: _Meta, key: str, n: int) -> list[float]:
    k = f"{m.arch}.{key}"
    v = m.raw(k)
    if not (isinstance(v, list) and len(v) == n and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)
            for x in v)):
        raise m._bad(k, v, f"{n} numbers, one per layer")
    return [float(x) for x in v]


def _per_layer_ints(m: _Meta, key: str, n: int, default: Any = None) -> list[int]:
    """An integer or one per layer (llama.cpp writes arrays where the layers differ)."""
    k = f"{m.arch}.{key}"
    v = m.raw(k)
    if isinstance(v, list):
        if len(v) != n or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1
                                  for x in v):
            raise m._bad(k, v, f"an integer >= 1 or {n} of them")
        return list(v)
    return [m.int(key, default)] * n


def _layer_types(m: _Meta, n: int) -> list[str]:
    key = f"{m.arch}.attention.sliding_window_pattern"
    p = m.raw(key)
    if not (isinstance(p, list) and len(p) == n and all(isinstance(x, bool) for x in p)):
        raise m._bad(key, p, f"{n} booleans (true: sliding)")
    return ["sliding_attention" if x else "full_attention" for x in p]


def _rows(m: _Meta, name: str) -> int | None:
    shape = m.shapes.get(name)
    return shape[0] if shape else None


def _common(m: _Meta, header: GgufHeader) -> dict[str, Any]:
    """The keys both architectures write the same way (convert_hf_to_gguf's TextModel and
    Gemma3Model parameters)."""
    n = m.int("block_count")
    hidden, heads = m.int("embedding_length"), m.int("attention.head_count")
    vocab = _rows(m, "token_embd.weight")
    if vocab is None:
        raise ConfigError(f"{header.path}: no token_embd.weight")
    model_type, hf_class = GEMMA_GGUF[m.arch]
    cfg: dict[str, Any] = {
        "architectures": [hf_class], "model_type": model_type, "vocab_size": vocab,
        "hidden_size": hidden, "num_hidden_layers": n, "num_attention_heads": heads}
    # the fixed bounds, before any per-layer table is built (block_count = 10**9)
    check_gguf_size(header, _sizes(cfg, m))
    cfg.update({
        "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon", 1e-6),
        "max_position_embeddings": m.int("context_length", 131072),
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": "output.weight" not in m.shapes, "torch_dtype": "float32",
        "sliding_window": m.int("attention.sliding_window"),
        "layer_types": _layer_types(m, n),
        "final_logit_softcapping": m.float("final_logit_softcapping", None),
        "num_kv_shared_layers": m.int("attention.shared_kv_layers", 0, min=0)})
    ple = m.int("embedding_length_per_layer_input", 0, min=0)
    cfg["hidden_size_per_layer_input"] = ple
    if ple:
        rows = _rows(m, "per_layer_token_embd.weight")
        if rows is None:
            raise ConfigError(f"{header.path}: embedding_length_per_layer_input {ple} without "
                              f"per_layer_token_embd.weight")
        cfg["vocab_size_per_layer_input"] = rows
    return cfg


def _sizes(cfg: dict[str, Any], m: _Meta) -> dict[str, Any]:
    """`cfg` as :func:`check_gguf_size` reads it: one MLP width, the widest (no per-layer
    list is built: the layer count is not checked yet)."""
    v = m.raw(f"{m.arch}.feed_forward_length")
    widest = max((x for x in v if isinstance(x, int)), default=0) if isinstance(v, list) \
        else m.int("feed_forward_length")
    return {**cfg, "intermediate_size": widest}


def _gemma3n_config(m: _Meta, header: GgufHeader) -> dict[str, Any]:
    cfg = _common(m, header)
    n, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    hd = m.int("attention.key_length", cfg["hidden_size"] // heads)
    if m.int("attention.value_length", hd) != hd:
        raise UnsupportedModelError(f"{header.path}: gemma3n value_length differs from "
                                    f"key_length")
    laurel = _rows(m, "blk.0.laurel_l.weight")
    scales = _floats(m, "activation_sparsity_scale", n)
    cfg.update(
        head_dim=hd, num_key_value_heads=m.int("attention.head_count_kv", heads),
        intermediate_size=_per_layer_ints(m, "feed_forward_length", n),
        rope_theta=m.float("rope.freq_base", 1_000_000.0),
        rope_local_base_freq=m.float("rope.freq_base_swa", 10_000.0), rope_scaling=None,
        altup_active_idx=m.int("altup_active_idx", 0, min=0),
        altup_num_inputs=m.int("altup_num_inputs", 4), altup_correct_scale=True,
        laurel_rank=laurel if laurel is not None else 0,
        # Phi(s): the sparsity whose Gaussian quantile llama.cpp stored (-inf: dense)
        activation_sparsity_pattern=[0.5 * (1.0 + math.erf(s / math.sqrt(2.0))) for s in scales])
    if cfg["final_logit_softcapping"] is None:  # llama.cpp would not cap; HF's class would
        raise UnsupportedModelError(f"{header.path}: a gemma3n GGUF without "
                                    f"final_logit_softcapping (every Gemma-3n soft-caps)")
    return cfg


def _gemma4_config(m: _Meta, header: GgufHeader) -> dict[str, Any]:
    cfg = _common(m, header)
    n, heads, types = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["layer_types"]
    hd_full = m.int("attention.key_length")
    hd_swa = m.int("attention.key_length_swa", hd_full)
    for key, want in (("attention.value_length", hd_full), ("attention.value_length_swa", hd_swa),
                      ("rope.dimension_count", hd_full), ("rope.dimension_count_swa", hd_swa)):
        if m.int(key, want) != want:
            raise UnsupportedModelError(f"{header.path}: gemma4.{key} = {m.int(key)} (expected "
                                        f"{want}: a head size per layer type, every dim of the "
                                        f"sliding heads rotated)")
    kv = _per_layer_ints(m, "attention.head_count_kv", n, heads)
    kv_swa = {kv[i] for i, t in enumerate(types) if t == "sliding_attention"}
    kv_full = {kv[i] for i, t in enumerate(types) if t == "full_attention"}
    ffn = _per_layer_ints(m, "feed_forward_length", n)
    first_shared = n - cfg["num_kv_shared_layers"]
    wide = ffn != [ffn[0]] * n
    if wide and ffn != [ffn[0] if i < first_shared else 2 * ffn[0] for i in range(n)]:
        raise UnsupportedModelError(f"{header.path}: gemma4.feed_forward_length {ffn} is not "
                                    f"use_double_wide_mlp's doubling on the shared layers")
    if len(kv_swa) > 1 or len(kv_full) > 1:
        raise UnsupportedModelError(f"{header.path}: gemma4 KV heads {kv} differ within a "
                                    f"layer type")
    full = [i for i, t in enumerate(types) if t == "full_attention" and i < first_shared]
    k_eq_v = bool(full) and f"blk.{full[0]}.attn_v.weight" not in m.shapes
    cfg.update(head_dim=hd_swa, global_head_dim=hd_full,
               num_key_value_heads=next(iter(kv_swa or kv_full)), attention_k_eq_v=k_eq_v,
               intermediate_size=ffn[0], use_double_wide_mlp=wide,
               rope_parameters={"sliding_attention": {
                   "rope_type": "default", "rope_theta": m.float("rope.freq_base_swa", 10_000.0)},
                   "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 1.0,
                                      "rope_theta": m.float("rope.freq_base", 1_000_000.0)}})
    if kv_full and kv_swa and kv_full != kv_swa:
        if not k_eq_v:  # transformers applies num_global_key_value_heads with k = v only
            raise UnsupportedModelError(f"{header.path}: gemma4 full layers with their own KV "
                                        f"heads {kv_full} but values of their own")
        cfg["num_global_key_value_heads"] = next(iter(kv_full))
    experts = m.int("expert_count", None)
    cfg["enable_moe_block"] = experts is not None
    if experts is not None:
        cfg.update(num_experts=experts, top_k_experts=m.int("expert_used_count"),
                   moe_intermediate_size=m.int("expert_feed_forward_length"))
    return cfg


def _proportional(header: GgufHeader, cfg: dict[str, Any]) -> None:
    """Gemma-4's ``rope_freqs``: [global_head_dim / 2] factors, 1 for the rotated frequencies,
    1e30 for the others -> the full layers' ``partial_rotary_factor``."""
    t = next((t for t in header.tensors if t.name == _ROPE_FREQS), None)
    if t is None:
        return
    (_, a), = iter_dequantized(attrs.evolve(header, tensors=[t]))
    f = a.reshape(-1)
    half = cfg["global_head_dim"] // 2
    rotated = int((f == 1.0).sum())
    if f.shape[0] != half or not (np.all(f[:rotated] == 1.0) and np.all(f[rotated:] >= 1e29)):
        raise UnsupportedModelError(f"{header.path}: rope_freqs.weight is not proportional "
                                    f"RoPE's factors (1 for the rotated frequencies, then "
                                    f"1e30): {f[:8].tolist()} ...")
    cfg["rope_parameters"]["full_attention"]["partial_rotary_factor"] = rotated / half


def read_gemma_gguf(header: GgufHeader, dtype: torch.dtype,
                    device: torch.device | str | None = None
                    ) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, str]]:
    """(HF config, HF-named tensors of `dtype`, their quantisation types) of a gemma3n /
    gemma4 GGUF; every tensor checked against the parsed family's weight table, the memory
    the weights need checked first (in `dtype`, on the CPU where they are dequantised and on
    `device`)."""
    from mi_transformer.config import parse_config
    from mi_transformer.weights import expected_shapes, slot_names

    arch = header.metadata["general.architecture"]
    m, path = _Meta(header, arch), header.path
    cfg = _gemma3n_config(m, header) if arch == "gemma3n" else _gemma4_config(m, header)
    if arch == "gemma4":
        _proportional(header, cfg)
    sizes = _sizes(cfg, m)
    for dev in {torch.device("cpu"), torch.device(device or "cpu")}:
        check_gguf_size(header, sizes, dtype, dev)
    family = parse_config(cfg, f"{path} (config from GGUF metadata)")
    names, shapes = slot_names(family), expected_shapes(family)
    tensors: dict[str, torch.Tensor] = {}
    quant: dict[str, str] = {}
    body = [t for t in header.tensors if t.name != _ROPE_FREQS]
    unknown = [t.name for t in body if _slot(t.name) is None and t.name not in _STACKED]
    if unknown:
        raise UnsupportedModelError(f"{path}: tensors with no {family.model_type} equivalent: "
                                    f"{', '.join(unknown[:10])}")
    it = iter_dequantized(attrs.evolve(header, tensors=body))
    for t, arr in progress(it, f"dequantising {path.name}", total=len(body), unit="tensor"):
        for key, a in _split(t.name, arr, family, path):
            name = names.get(key)
            if name is None:
                if key == (None, "lm_head.weight") and family.tie_word_embeddings:
                    continue  # the tied head, stored once more
                raise WeightLoadError(f"{path}: tensor {t.name!r} is not used by this "
                                      f"{family.model_type} configuration")
            w = torch.from_numpy(np.ascontiguousarray(a))
            if tuple(w.shape) != tuple(shapes[name]):
                raise WeightLoadError(f"{path}: tensor {t.name!r} ({name}) has shape "
                                      f"{list(w.shape)}, expected {list(shapes[name])} from "
                                      f"the GGUF metadata")
            tensors[name], quant[name] = w.to(dtype), _quant_type(t, path).name
    missing = [n for n in shapes if n not in tensors]
    if missing:
        raise WeightLoadError(f"{path}: missing tensors: {', '.join(missing[:10])}")
    return cfg, tensors, quant


def _split(name: str, arr: np.ndarray, family: Any, path: Any
           ) -> list[tuple[tuple[int | None, str], np.ndarray]]:
    """(slot, array) pairs of one llama.cpp tensor: AltUp's stacks split per stream, the
    k / v of a layer that shares keys dropped (unused), the rest as it is."""
    if name in _STACKED:
        n = family.altup.num_inputs - 1 if family.altup is not None else 0
        if arr.ndim != 3 or arr.shape[0] != n:
            raise WeightLoadError(f"{path}: tensor {name!r} of shape {list(arr.shape)} is not "
                                  f"{n} stacked stream projections")
        return [((None, _STACKED[name].format(j=j)), arr[j]) for j in range(n)]
    layer, slot = _slot(name)  # type: ignore[misc]
    if layer is not None and name.split(".", 2)[2] in _SHARED_UNUSED and family.shares_kv(layer):
        return []
    return [((layer, slot), arr)]

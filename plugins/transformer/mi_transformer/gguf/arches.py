"""Architectures: GGUF metadata -> an HF config dict, llama.cpp tensor names -> the slots of
the family's weight table. One :class:`GgufArch` per llama.cpp architecture
(:data:`GGUF_ARCHES`), with what llama.cpp's converter changed (LLaMA's / Granite's q/k row
permutation, Gemma's norm gains stored as 1 + w, GPT-2's Conv1D weights stored transposed,
rope factors stored as tensors, NeoX's and Falcon's fused q/k/v rows regrouped as
[q | k | v], StableLM's per-head q/k norms stacked). An architecture whose converter splits,
joins or transposes tensors says so as data: :class:`Join` (several llama.cpp tensors -> one
of the family's), ``GgufArch.convert`` (one tensor re-laid out) and
``GgufArch.meta_tensors`` (weights the converter stored as metadata)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Mapping

import attrs
import torch

from mi_core.plugin import ConfigError, UnsupportedModelError

from mi_transformer.config.size import check_size, dense_params
from mi_transformer.gguf.header import GgufHeader


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's ``permute``: per head, rows (pair, half) -> (half, pair).

    llama.cpp's converter does ``w.reshape(n_head, 2, d/2, ...).swapaxes(1, 2)`` so that
    rotary pairs are adjacent rows (GPT-J layout); HF rotates the two halves of each head.
    w: [n_heads * head_dim, ...] (weight or bias) -> same shape, HF row order.
    """
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


_REQUIRED: Any = object()


class _Meta:
    """Typed reads of GGUF metadata: a value of the wrong type (a string where a count is
    expected, a list, a negative or non-finite number) is a ConfigError naming the key."""

    def __init__(self, header: GgufHeader, arch: str) -> None:
        self.md, self.path, self.arch = header.metadata, header.path, arch
        self.shapes = {t.name: t.shape for t in header.tensors}

    def rows(self, tensor: str) -> int | None:
        """The row count (torch dim 0) of a 2-D tensor of the file, None when absent."""
        shape = self.shapes.get(tensor)
        return shape[0] if shape is not None and len(shape) == 2 else None

    def bool(self, key: str, default: bool) -> bool:
        k = f"{self.arch}.{key}"
        v = self.md.get(k)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self._bad(k, v, "true or false")
        return v

    def raw(self, key: str) -> Any:
        return self.md.get(key)

    def _bad(self, key: str, v: Any, what: str) -> ConfigError:
        return ConfigError(f"{self.path}: GGUF metadata {key!r} = {v!r} ({type(v).__name__}): "
                           f"expected {what}")

    def int(self, key: str, default: Any = _REQUIRED, *, arch: bool = True, min: int = 1,
            allow_list: bool = False) -> Any:
        k = f"{self.arch}.{key}" if arch else key
        v = self.md.get(k)
        if v is None:
            if default is _REQUIRED:
                raise ConfigError(f"{self.path}: GGUF metadata lacks required key {k!r}")
            return default
        if allow_list and isinstance(v, list):  # per-layer values: only uniform ones map to HF
            if not v or len(set(map(repr, v))) != 1:
                raise UnsupportedModelError(f"{self.path}: GGUF metadata {k!r} has per-layer "
                                            f"values {v[:8]}; only uniform ones are supported")
            v = v[0]
        if isinstance(v, bool) or not isinstance(v, int) or v < min:
            raise self._bad(k, v, f"an integer >= {min}")
        return v

    def float(self, key: str, default: Any = _REQUIRED, *, positive: bool = True) -> Any:
        k = f"{self.arch}.{key}"
        v = self.md.get(k)
        if v is None:
            if default is _REQUIRED:
                raise ConfigError(f"{self.path}: GGUF metadata lacks required key {k!r}")
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or (positive and v <= 0):
            raise self._bad(k, v, "a finite number" + (" > 0" if positive else ""))
        return float(v)

    def str(self, key: str, default: Any = None) -> Any:
        v = self.md.get(key, default)
        if v is not None and not isinstance(v, str):
            raise self._bad(key, v, "a string")
        return v


@attrs.frozen
class Join:
    """One tensor of the family built from several llama.cpp tensors of the same layer (what
    the converter split): `parts` are ``module.suffix`` names in the order `fn` takes them;
    `fn(family, tensors)` returns the family's tensor and raises ValueError (naming the
    expected shape) on tensors of the wrong shape."""

    parts: tuple[str, ...]
    fn: Callable[[Any, list[torch.Tensor]], torch.Tensor]


@attrs.frozen
class GgufArch:
    """How one llama.cpp ``general.architecture`` maps onto an HF family.

    `layer_slots`: llama.cpp per-layer module -> the slot of the family's weight table
    (:func:`mi_transformer.weights.slot_names`; ``.weight`` / ``.bias`` kept), so the HF
    tensor names come from the one table loading also uses. `permute_qk`: llama.cpp permuted
    the q/k rows to GPT-J order (LLaMA only; the others use its NeoX rope). `norm_offset`:
    llama.cpp stores Gemma's norm gains as 1 + w; subtracted. `transpose_linear`: GPT-2's
    Conv1D weights are stored as [out, in]. `configure(meta, cfg, names)`: the family's
    extra config keys. `partial_rotary`: ``rope.dimension_count`` may be less than the head
    dim (written as ``partial_rotary_factor``). `slots(cfg)`: the layer slots when they depend
    on the config (Falcon's two norms), else `layer_slots`. A fused ``attn_qkv`` is always
    [q | k | v] rows (llama.cpp regroups NeoX's and Falcon's); it is laid out as the family
    stores it when loaded.

    A `layer_slots` key may also be a whole ``module.suffix`` name mapped to an exact slot
    (``"attn_sinks.weight": "sinks"``), or to ``"join:<slot>"`` for a part of a
    :data:`joins` entry. Slots may name ``{block}``, ``{router}``, ``{shared}`` and
    ``{selection}`` (the family's MoE module names). `convert`: ``module.suffix`` ->
    ``fn(family, tensor)``, a tensor re-laid out (Llama 4's experts stored transposed).
    `meta_tensors(meta, family)`: ``{(layer, slot): tensor}`` of weights the converter wrote as
    metadata (Apertus' xIELU parameters). `latent`: the attention is MLA, whose head sizes
    `configure` reads (llama.cpp writes MLA as one shared KV head of the latent's width).
    `own_config(meta, tensor names)`: the whole HF config, for architectures without
    attention whose metadata shares little with the others (Mamba's ``ssm.*``). A
    three-part name (``blk.0.ssm_a``, no ``.weight``) is looked up whole in `layer_slots`.
    `unoffset`: llama.cpp modules `norm_offset` does not apply to (Qwen3-Next's gated norm
    ``ssm_norm``, stored as is). `relabel(family, layer, slot)`: the slot of one layer's
    tensor where it differs from the others' (Nemotron-H's MLP-only layers: ``attn_norm`` is
    their ``ln2``). `global_slots`: llama.cpp global tensors whose slot differs from the
    shared table (LFM2's final norm, stored as ``token_embd_norm``). A layer module may hold
    dots (``blk.N.shortconv.in_proj.weight``: module ``shortconv.in_proj``).
    """

    model_type: str
    hf_class: str
    layer_slots: Mapping[str, str]
    permute_qk: bool = False
    norm_offset: float = 0.0
    configure: Callable[["_Meta", dict[str, Any], set[str]], None] | None = None
    transpose_linear: bool = False
    partial_rotary: bool = False
    slots: Callable[[Mapping[str, Any]], Mapping[str, str]] | None = None
    joins: Mapping[str, Join] = attrs.field(factory=dict)
    convert: Mapping[str, Callable[[Any, torch.Tensor], torch.Tensor]] = attrs.field(
        factory=dict)
    meta_tensors: Callable[["_Meta", Any], dict[tuple[int | None, str], torch.Tensor]] | None \
        = None
    latent: bool = False
    own_config: Callable[["_Meta", set[str]], dict[str, Any]] | None = None
    unoffset: tuple[str, ...] = ()
    relabel: Callable[[Any, "int | None", str], str] | None = None
    global_slots: Mapping[str, str] = attrs.field(factory=dict)

    def slots_for(self, cfg: Mapping[str, Any]) -> Mapping[str, str]:
        return self.slots(cfg) if self.slots is not None else self.layer_slots


_LLAMA_LAYER = {
    "attn_norm": "ln1", "ffn_norm": "ln2", "attn_q": "q", "attn_k": "k", "attn_v": "v",
    "attn_output": "o", "ffn_gate": "mlp_in", "ffn_up": "mlp_up", "ffn_down": "mlp_out",
}
#: llama.cpp global tensors -> weight-table slots (the same in every architecture).
_GLOBAL_SLOTS = {"token_embd.weight": "embed", "position_embd.weight": "pos_embed",
                 "output_norm.weight": "final_norm.weight", "output_norm.bias": "final_norm.bias",
                 "output.weight": "lm_head.weight", "output.bias": "lm_head.bias"}
_ROPE_FREQS = "rope_freqs.weight"  # llama3 rope factors, folded into config.rope_scaling
_LONGROPE = {"rope_factors_long.weight": "long_factor",  # Phi-3 128k, folded into rope_scaling
             "rope_factors_short.weight": "short_factor"}


def _llama_extra(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    if m.raw("llama.expert_count") is not None:  # llama.cpp writes Mixtral as llama + experts
        cfg.update(model_type="mixtral", architectures=["MixtralForCausalLM"],
                   num_local_experts=m.int("expert_count"),
                   num_experts_per_tok=m.int("expert_used_count"))
        return
    cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    cfg["mlp_bias"] = "blk.0.ffn_up.bias" in names


def _qwen3_extra(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    cfg["attention_bias"] = "blk.0.attn_q.bias" in names


def _gemma_extra(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    cfg.pop("hidden_act")
    cfg["hidden_activation"] = "gelu_pytorch_tanh"


def _gemma2_extra(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    _gemma_extra(m, cfg, names)
    cfg["attn_logit_softcapping"] = m.float("attn_logit_softcapping", None)
    cfg["final_logit_softcapping"] = m.float("final_logit_softcapping", None)
    cfg["sliding_window"] = m.int("attention.sliding_window", None)
    # llama.cpp scales scores by key_length**-0.5, except for the 27B model (recognised by its
    # 46 layers), where it uses (d_model / heads)**-0.5 as Gemma 2 27B's
    # query_pre_attn_scalar = 144 does; we do exactly the same.
    cfg["query_pre_attn_scalar"] = (cfg["hidden_size"] // cfg["num_attention_heads"]
                                    if cfg["num_hidden_layers"] == 46 else cfg["head_dim"])


def _phi3_extra(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    cfg["sliding_window"] = m.int("attention.sliding_window", None)
    orig = m.int("rope.scaling.original_context_length", None)
    if orig is not None:
        cfg["original_max_position_embeddings"] = orig


def _gpt2_config(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """GPT-2 spells its config its own way; llama.cpp's converter also writes the (tied)
    embedding a second time as output.weight, which is then loaded untied (same numbers)."""
    cfg.update({
        "n_embd": cfg.pop("hidden_size"), "n_head": cfg.pop("num_attention_heads"),
        "n_layer": cfg.pop("num_hidden_layers"), "n_inner": cfg.pop("intermediate_size"),
        "n_positions": cfg.pop("max_position_embeddings"),
        "layer_norm_epsilon": m.float("attention.layer_norm_epsilon", 1e-5),
        "activation_function": "gelu_new"})
    for k in ("num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "rope_theta"):
        cfg.pop(k, None)


def _moe_extra(norm_default: bool, shared: bool) -> Callable[[_Meta, dict[str, Any], set[str]],
                                                             None]:
    """Qwen2-MoE / Qwen3-MoE: expert counts and sizes; llama.cpp renormalises the top-k
    weights for qwen3moe and not for qwen2moe unless ``expert_weights_norm`` says so."""
    def configure(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
        cfg["num_experts"] = m.int("expert_count")
        cfg["num_experts_per_tok"] = m.int("expert_used_count")
        cfg["moe_intermediate_size"] = m.int("expert_feed_forward_length")
        if cfg.get("intermediate_size") is None:  # every layer is sparse
            cfg["intermediate_size"] = cfg["moe_intermediate_size"]
        norm = m.raw(f"{m.arch}.expert_weights_norm")
        if norm is not None and not isinstance(norm, bool):
            raise m._bad(f"{m.arch}.expert_weights_norm", norm, "true or false")
        cfg["norm_topk_prob"] = norm_default if norm is None else norm
        if shared:
            cfg["shared_expert_intermediate_size"] = m.int("expert_shared_feed_forward_length")
        if cfg["model_type"] == "qwen3_moe":
            cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    return configure


#: MoE tensors; {block} is the family's MoE module (mlp, Mixtral's block_sparse_moe),
#: {router} its router, {shared} its shared expert(s), {selection} its selection bias
_MOE_SLOTS = {"ffn_gate_inp": "moe:{block}.{router}", "ffn_gate_exps": "exps:0",
              "ffn_up_exps": "exps:1", "ffn_down_exps": "exps:2",
              "ffn_gate_shexp": "moe:{block}.{shared}.gate_proj",
              "ffn_up_shexp": "moe:{block}.{shared}.up_proj",
              "ffn_down_shexp": "moe:{block}.{shared}.down_proj",
              "ffn_gate_inp_shexp": "moe:{block}.shared_expert_gate",
              "exp_probs_b.bias": "moe:{block}.{selection}"}
_ATTN_SLOTS = {k: v for k, v in _LLAMA_LAYER.items() if not k.startswith("ffn_")} | {
    "ffn_norm": "ln2"}


def _starcoder2_extra(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    cfg.pop("rms_norm_eps")
    cfg["norm_epsilon"] = m.float("attention.layer_norm_epsilon", 1e-5)
    cfg["hidden_act"] = "gelu_pytorch_tanh"
    cfg["use_bias"] = "blk.0.attn_q.bias" in names


def sliding_layer_types(m: _Meta, cfg: dict[str, Any]) -> int | None:
    """``{arch}.attention.sliding_window`` and ``sliding_window_pattern`` (one bool per layer,
    True = sliding) -> ``cfg["layer_types"]`` and ``cfg["sliding_window"]``; returns the
    window (None: no sliding metadata, every layer full)."""
    window = m.int("attention.sliding_window", None)
    n = cfg["num_hidden_layers"]
    if window is None:
        cfg["layer_types"] = ["full_attention"] * n
        return None
    key = f"{m.arch}.attention.sliding_window_pattern"
    pattern = m.raw(key)
    if not (isinstance(pattern, list) and len(pattern) == n
            and all(isinstance(p, bool) for p in pattern)):
        raise ConfigError(f"{m.path}: GGUF metadata {key!r} = {pattern!r}: expected {n} "
                          f"booleans (one per layer) beside attention.sliding_window")
    cfg["sliding_window"] = window
    cfg["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
    return window



def _olmo2_extra(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """OLMo2; with sliding-window metadata, OLMo-3 (llama.cpp writes both as ``olmo2``)."""
    cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    if m.raw("olmo2.attention.sliding_window") is None:
        return
    sliding_layer_types(m, cfg)
    if "rope_scaling" in cfg:  # HF scales the full layers only; llama.cpp's olmo2 is unmapped
        raise UnsupportedModelError(f"{m.path}: an OLMo-3 GGUF (olmo2 with sliding layers) "
                                    f"with RoPE scaling is not supported")
    cfg.update(model_type="olmo3", architectures=["Olmo3ForCausalLM"])


def _drop(cfg: dict[str, Any], *keys: str) -> None:
    for k in keys:
        cfg.pop(k, None)


def _ffn_rows(m: _Meta, cfg: dict[str, Any]) -> int | None:
    """The MLP width from ``blk.0.ffn_up``: Falcon's and Phi-2's converters write 4 x d_model
    as feed_forward_length whatever the model has; the tensor is what the weights are."""
    return m.rows("blk.0.ffn_up.weight") or cfg.get("intermediate_size")


def _layer_norm(m: _Meta, cfg: dict[str, Any], key: str = "layer_norm_eps") -> None:
    """LayerNorm families: llama.cpp's layer_norm_epsilon instead of the RMS one."""
    _drop(cfg, "rms_norm_eps")
    cfg[key] = m.float("attention.layer_norm_epsilon", 1e-5)


def _gptneox_config(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """GPT-NeoX / Pythia: partial rotary, parallel or sequential residual. llama.cpp's
    converter writes no rope base (its default is 10000, Pythia's) and no activation (HF's
    "gelu"; llama.cpp itself runs its tanh approximation)."""
    _layer_norm(m, cfg)
    _drop(cfg, "num_key_value_heads", "head_dim")
    cfg.update(hidden_act="gelu", use_parallel_residual=m.bool("use_parallel_residual", True),
               attention_bias="blk.0.attn_qkv.bias" in names)


def _falcon_config(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """Falcon as llama.cpp runs it: parallel attention and MLP; one shared norm and multi-query
    (7B), or the new decoder architecture (``attn_norm_2`` = ``ln_attn``: grouped KV heads)."""
    new = "blk.0.attn_norm_2.weight" in names
    kv = cfg.pop("num_key_value_heads")
    if not new and kv != 1:
        raise UnsupportedModelError(f"{m.path}: falcon with {kv} KV heads and one norm per "
                                    f"layer is no Falcon layout (7B: 1 KV head; 40B/180B: "
                                    f"attn_norm_2)")
    _layer_norm(m, cfg, "layer_norm_epsilon")
    cfg.update(new_decoder_architecture=new, multi_query=not new, parallel_attn=True,
               num_kv_heads=kv, alibi=False, bias="blk.0.attn_qkv.bias" in names,
               ffn_hidden_size=_ffn_rows(m, cfg), activation="gelu")
    _drop(cfg, "intermediate_size", "hidden_act", "head_dim")


def _falcon_slots(cfg: Mapping[str, Any]) -> Mapping[str, str]:
    norms = {"attn_norm_2": "ln1", "attn_norm": "ln2"} if cfg["new_decoder_architecture"] \
        else {"attn_norm": "ln1"}
    return {**norms, "attn_qkv": "qkv", "attn_output": "o", "ffn_up": "mlp_in",
            "ffn_down": "mlp_out"}


def _phi2_config(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """Phi-1/2: parallel block with one norm, partial rotary, biases everywhere."""
    _layer_norm(m, cfg)
    _drop(cfg, "head_dim")  # d_model / heads: Phi has no head_dim key
    cfg.update(hidden_act="gelu_new", intermediate_size=_ffn_rows(m, cfg))


def _stablelm_config(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """StableLM: partial rotary, q/k/v biases, per-head q/k LayerNorms (stacked by llama.cpp
    as [heads, head_dim]), sequential or parallel with one shared norm."""
    _layer_norm(m, cfg)
    _drop(cfg, "head_dim")  # d_model / heads: StableLM has no head_dim key
    cfg.update(use_parallel_residual=m.bool("use_parallel_residual", False),
               use_qkv_bias="blk.0.attn_q.bias" in names,
               qk_layernorm="blk.0.attn_q_norm.weight" in names)


def _command_r_config(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """Cohere / Command R: LayerNorm without bias, logit scale, optional per-head q/k norms;
    llama.cpp runs its interleaved rotary on unpermuted weights, as transformers does."""
    _layer_norm(m, cfg)
    cfg.update(logit_scale=m.float("logit_scale", 0.0625),
               use_qk_norm="blk.0.attn_q_norm.weight" in names,
               attention_bias="blk.0.attn_q.bias" in names)


def _granite_config(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """Granite: LLaMA plus its four multipliers (llama.cpp divides the logits by
    ``logit_scale``, transformers by ``logits_scaling``: the same number)."""
    _llama_extra(m, cfg, names)
    for key, hf in (("attention.scale", "attention_multiplier"),
                    ("embedding_scale", "embedding_multiplier"),
                    ("residual_scale", "residual_multiplier"), ("logit_scale", "logits_scaling")):
        cfg[hf] = m.float(key, None)


def _olmoe_config(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """OLMoE: experts of feed_forward_length, full-width q/k norms, no top-k renormalisation
    (llama.cpp's olmoe), optional clamp of q, k, v."""
    cfg.update(num_experts=m.int("expert_count"), num_experts_per_tok=m.int("expert_used_count"),
               norm_topk_prob=False, clip_qkv=m.float("attention.clamp_kqv", None),
               attention_bias="blk.0.attn_q.bias" in names)


def _gemma3_config(m: _Meta, cfg: dict[str, Any], names: set[str]) -> None:
    """Gemma 3 (text): llama.cpp runs the sliding layers with a rope base of 10000, every
    sixth layer global unless ``attention.sliding_window_pattern`` lists them, and scales
    scores by key_length**-0.5 except for the 27B model (62 layers: d_model / heads)."""
    _gemma_extra(m, cfg, names)
    layers, pattern = cfg["num_hidden_layers"], m.raw(f"{m.arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        if len(pattern) != layers or not all(isinstance(x, bool) for x in pattern):
            raise m._bad(f"{m.arch}.attention.sliding_window_pattern", pattern,
                         f"{layers} booleans (true: sliding)")
        cfg["layer_types"] = ["sliding_attention" if x else "full_attention" for x in pattern]
    elif pattern is not None:
        raise m._bad(f"{m.arch}.attention.sliding_window_pattern", pattern, "a list of booleans")
    cfg.update(sliding_window=m.int("attention.sliding_window", None),
               final_logit_softcapping=m.float("final_logit_softcapping", None),
               rope_local_base_freq=10000.0,
               query_pre_attn_scalar=(cfg["hidden_size"] // cfg["num_attention_heads"]
                                      if layers == 62 else cfg["head_dim"]))


_NORMS_QK = {"attn_q_norm": "q_norm", "attn_k_norm": "k_norm"}


GGUF_ARCHES: dict[str, GgufArch] = {
    "llama": GgufArch("llama", "LlamaForCausalLM", {**_LLAMA_LAYER, **_MOE_SLOTS},
                      permute_qk=True, configure=_llama_extra),
    "qwen2": GgufArch("qwen2", "Qwen2ForCausalLM", _LLAMA_LAYER),
    "qwen3": GgufArch("qwen3", "Qwen3ForCausalLM", {
        **_LLAMA_LAYER, "attn_q_norm": "q_norm", "attn_k_norm": "k_norm"},
        configure=_qwen3_extra),
    "gemma": GgufArch("gemma", "GemmaForCausalLM", _LLAMA_LAYER, norm_offset=1.0,
                      configure=_gemma_extra),
    "gemma2": GgufArch("gemma2", "Gemma2ForCausalLM", {
        **_LLAMA_LAYER, "post_attention_norm": "ln1_post", "ffn_norm": "ln2",
        "post_ffw_norm": "ln2_post"}, norm_offset=1.0, configure=_gemma2_extra),
    "phi3": GgufArch("phi3", "Phi3ForCausalLM", {
        "attn_norm": "ln1", "ffn_norm": "ln2", "attn_qkv": "qkv", "attn_output": "o",
        "ffn_up": "gate_up", "ffn_down": "mlp_out"}, configure=_phi3_extra),
    "qwen2moe": GgufArch("qwen2_moe", "Qwen2MoeForCausalLM", {**_ATTN_SLOTS, **_MOE_SLOTS},
                         configure=_moe_extra(False, shared=True)),
    "qwen3moe": GgufArch("qwen3_moe", "Qwen3MoeForCausalLM", {
        **_ATTN_SLOTS, **_MOE_SLOTS, "attn_q_norm": "q_norm", "attn_k_norm": "k_norm"},
        configure=_moe_extra(True, shared=False)),
    "starcoder2": GgufArch("starcoder2", "Starcoder2ForCausalLM", {
        **_ATTN_SLOTS, "ffn_up": "mlp_in", "ffn_down": "mlp_out"}, configure=_starcoder2_extra),
    "olmo2": GgufArch("olmo2", "Olmo2ForCausalLM", {
        **{k: v for k, v in _LLAMA_LAYER.items() if not k.endswith("_norm")},
        "attn_q_norm": "q_norm", "attn_k_norm": "k_norm", "post_attention_norm": "ln1_post",
        "post_ffw_norm": "ln2_post"}, configure=_olmo2_extra),
    "gpt2": GgufArch("gpt2", "GPT2LMHeadModel", {
        "attn_norm": "ln1", "attn_qkv": "qkv", "attn_output": "o", "ffn_norm": "ln2",
        "ffn_up": "mlp_in", "ffn_down": "mlp_out"}, configure=_gpt2_config,
        transpose_linear=True),
    "gptneox": GgufArch("gpt_neox", "GPTNeoXForCausalLM", {
        "attn_norm": "ln1", "ffn_norm": "ln2", "attn_qkv": "qkv", "attn_output": "o",
        "ffn_up": "mlp_in", "ffn_down": "mlp_out"}, configure=_gptneox_config,
        partial_rotary=True),
    "falcon": GgufArch("falcon", "FalconForCausalLM", {}, configure=_falcon_config,
                       slots=_falcon_slots),
    "phi2": GgufArch("phi", "PhiForCausalLM", {
        "attn_norm": "ln1", "attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_qkv": "qkv",
        "attn_output": "o", "ffn_up": "mlp_in", "ffn_down": "mlp_out"},
        configure=_phi2_config, partial_rotary=True),
    "stablelm": GgufArch("stablelm", "StableLmForCausalLM", {**_LLAMA_LAYER, **_NORMS_QK},
                         configure=_stablelm_config, partial_rotary=True),
    "command-r": GgufArch("cohere", "CohereForCausalLM", {
        **{k: v for k, v in _LLAMA_LAYER.items() if k != "ffn_norm"}, **_NORMS_QK},
        configure=_command_r_config),
    "granite": GgufArch("granite", "GraniteForCausalLM", _LLAMA_LAYER, permute_qk=True,
                        configure=_granite_config),
    "olmoe": GgufArch("olmoe", "OlmoeForCausalLM", {**_ATTN_SLOTS, **_MOE_SLOTS, **_NORMS_QK},
                      configure=_olmoe_config),
    "gemma3": GgufArch("gemma3_text", "Gemma3ForCausalLM", {
        **_LLAMA_LAYER, **_NORMS_QK, "post_attention_norm": "ln1_post", "ffn_norm": "ln2",
        "post_ffw_norm": "ln2_post"}, norm_offset=1.0, configure=_gemma3_config),
}


#: llama.cpp architectures whose transformers families load from safetensors but whose GGUF
#: files are not mapped: named in the refusal (none at present)
SAFETENSORS_ONLY: dict[str, str] = {}


def gguf_arch(header: GgufHeader) -> GgufArch:
    arch = header.metadata.get("general.architecture")
    if not isinstance(arch, str) or arch not in GGUF_ARCHES:  # (a list is not hashable)
        hint = (f"; model_type {SAFETENSORS_ONLY[arch]} loads from its safetensors checkpoint"
                if isinstance(arch, str) and arch in SAFETENSORS_ONLY else "")
        raise UnsupportedModelError(f"no installed plugin implements GGUF architecture {arch!r} "
                                    f"({header.path}; mi-transformer reads "
                                    f"{', '.join(GGUF_ARCHES)}{hint})")
    return GGUF_ARCHES[arch]


def slot_of(gguf_name: str, arch: GgufArch, slots: Mapping[str, str] | None = None
            ) -> tuple[int | None, str] | None:
    """(layer or None, weight-table slot) of a llama.cpp tensor, or None when it has none.
    `slots`: the architecture's layer slots for this config (:meth:`GgufArch.slots_for`)."""
    if gguf_name in arch.global_slots:
        return None, arch.global_slots[gguf_name]
    if gguf_name in _GLOBAL_SLOTS:
        return None, _GLOBAL_SLOTS[gguf_name]
    layer_slots = arch.layer_slots if slots is None else slots
    parts = gguf_name.split(".")
    if len(parts) >= 4 and parts[0] == "blk" and parts[1].isdigit() and \
            parts[-1] in ("weight", "bias"):
        module = ".".join(parts[2:-1])
        whole = f"{module}.{parts[-1]}"
        if whole in layer_slots:  # an exact slot, or a part of a Join
            return int(parts[1]), layer_slots[whole]
        if module in layer_slots:
            return int(parts[1]), f"{layer_slots[module]}.{parts[-1]}"
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layer_slots:
        return int(parts[1]), layer_slots[parts[2]]  # llama.cpp's suffix-less tensors (ssm_a)
    return None


def mtp_layers(header: GgufHeader) -> int:
    """The multi-token-prediction layers llama.cpp stores after the others
    (``nextn_predict_layers``: GLM-4.5): counted in ``block_count``, not run by a causal LM
    (transformers ignores them), so not loaded."""
    arch = header.metadata.get("general.architecture")
    return _Meta(header, str(arch)).int("nextn_predict_layers", 0, min=0)


def hf_config(header: GgufHeader) -> dict[str, Any]:
    """An HF config.json dict from the GGUF metadata (and tensor table)."""
    arch = gguf_arch(header)
    name = header.metadata["general.architecture"]
    m = _Meta(header, name)
    path = header.path
    if arch.own_config is not None:  # no attention: the family's own keys (state-space)
        cfg = arch.own_config(m, {t.name for t in header.tensors})
        check_gguf_size(header, cfg)
        return cfg
    hidden = m.int("embedding_length")
    heads = m.int("attention.head_count")
    kv_heads = m.int("attention.head_count_kv", heads, allow_list=True)
    head_dim = m.int("attention.key_length", hidden // heads)
    rot = m.int("rope.dimension_count", head_dim)
    value_len = m.int("attention.value_length", head_dim)
    if not arch.latent and (value_len != head_dim or (rot != head_dim and not arch.partial_rotary)
                            or rot > head_dim):
        raise UnsupportedModelError(f"{path}: {name}.rope.dimension_count {rot} / "
                                    f"value_length {value_len} differ from head dim {head_dim} "
                                    f"(partial rotary is not supported for GGUF {name})")
    names = {t.name for t in header.tensors}
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    if tokens is not None and not isinstance(tokens, list):
        raise m._bad("tokenizer.ggml.tokens", tokens, "a list of strings")
    vocab = m.int("vocab_size", len(tokens) if tokens else None)
    if vocab is None:
        emb = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
        if emb is None or len(emb.shape) != 2:
            raise ConfigError(f"{path}: no vocab_size, tokenizer.ggml.tokens or token_embd.weight")
        vocab = emb.shape[0]
    ctx = m.int("context_length", 2048)
    cfg: dict[str, Any] = {
        "architectures": [arch.hf_class],
        "model_type": arch.model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": m.int("feed_forward_length", None, allow_list=True),
        "num_hidden_layers": m.int("block_count") - mtp_layers(header),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": m.float("rope.freq_base", 10000.0),
        "max_position_embeddings": ctx,
        "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": "float32",
    }
    if cfg["num_hidden_layers"] < 1:
        raise ConfigError(f"{path}: GGUF metadata {name}.nextn_predict_layers leaves no layer "
                          f"of the {m.int('block_count')} (block_count)")
    if rot != head_dim and not arch.latent:  # checked against the parsed family by read_gguf
        cfg["partial_rotary_factor"] = rot / head_dim
    scaling = _rope_scaling(header, m, ctx)
    if scaling is not None:
        cfg["rope_scaling"] = scaling
    check_gguf_size(header, cfg)  # before configure's per-layer tables (block_count = 10**9)
    if arch.configure is not None:
        arch.configure(m, cfg, names)
    if all(cfg.get(k) is None for k in ("intermediate_size", "n_inner", "ffn_hidden_size")):
        key = f"{name}.feed_forward_length"
        raise ConfigError(f"{path}: GGUF metadata lacks required key {key!r}")
    for key, hf in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                    ("padding_token_id", "pad_token_id")):
        v = m.int(f"tokenizer.ggml.{key}", None, arch=False, min=0)
        if v is not None:
            cfg[hf] = v
    # a null sliding_window is kept: for EXAONE-4 / OLMo-3 it means "no sliding layers",
    # while an absent one means the class default window; a null q_lora_rank: DeepSeek's
    # queries from one projection (absent: the class default latent)
    return {k: v for k, v in cfg.items() if v is not None or k in _NULL_MEANS}


#: config keys whose null value means something other than their absence
_NULL_MEANS = ("sliding_window", "q_lora_rank")


def check_gguf_size(header: GgufHeader, cfg: dict[str, Any], dtype: torch.dtype | None = None,
                    device: torch.device | None = None) -> None:
    """The parameters the metadata implies (dense and experts), in `dtype` on `device` (None:
    only the fixed bounds of :func:`check_bounds`), before a per-layer table is built (an
    architecture's ``configure``, the config parser) or a tensor dequantised: ConfigTooLarge
    naming the keys."""
    def get(*keys: str) -> int:
        return next((int(cfg[k]) for k in keys if cfg.get(k) is not None), 0)

    hidden, heads = get("hidden_size", "n_embd"), get("num_attention_heads", "n_head")
    layers, experts = get("num_hidden_layers", "n_layer"), get("num_experts", "num_local_experts")
    params = dense_params(get("vocab_size"), hidden, layers, heads,
                          get("num_key_value_heads") or heads,
                          get("head_dim") or hidden // max(heads, 1),
                          get("intermediate_size", "n_inner")) + layers * hidden * experts * 3 * (
        get("moe_intermediate_size", "intermediate_size"))
    arch = header.metadata["general.architecture"]
    keys = ("block_count", "embedding_length", "attention.head_count", "feed_forward_length",
            "expert_count", "expert_feed_forward_length", "vocab_size")
    sizes = {f"{arch}.{k}": header.metadata[f"{arch}.{k}"] for k in keys
             if f"{arch}.{k}" in header.metadata}
    check_size(f"{header.path}: GGUF metadata", sizes, params, dtype, device)


def llama_config(header: GgufHeader) -> dict[str, Any]:
    """Kept for callers of the LLaMA-only reader: :func:`hf_config` for any architecture."""
    return hf_config(header)


def _rope_scaling(header: GgufHeader, m: _Meta, ctx: int) -> dict[str, Any] | None:
    names = {t.name for t in header.tensors}
    if _ROPE_FREQS in names or set(_LONGROPE) & names:
        return None  # filled in from the factor tensors by read_gguf
    kind = m.str(f"{m.arch}.rope.scaling.type", "none")
    factor = m.float("rope.scaling.factor", None)
    if kind in ("none", None) or (kind == "linear" and not factor):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        out: dict[str, Any] = {"rope_type": "yarn", "factor": factor or 1.0,
                               "original_max_position_embeddings":
                                   m.int("rope.scaling.original_context_length", ctx)}
        for k in ("beta_fast", "beta_slow"):
            v = m.float(f"rope.scaling.yarn_{k}", None)
            if v is not None:
                out[k] = v
        for k in ("rope.scaling.yarn_attn_factor", "rope.scaling.attn_factor"):
            v = m.float(k, None)
            if v is not None and v != 1.0:  # llama.cpp's multiplier on its own mscale
                raise UnsupportedModelError(f"{header.path}: {m.arch}.{k} = {v} has no HF "
                                            f"yarn equivalent")
        return out
    raise UnsupportedModelError(f"{header.path}: rope scaling type {kind!r} is not supported")


def llama3_rope_from_factors(factors: torch.Tensor, theta: float, head_dim: int,
                             original_ctx: int | None, path: Path) -> dict[str, Any]:
    """Recover HF's ``rope_scaling`` (llama3) from llama.cpp's ``rope_freqs.weight``.

    llama.cpp stores one divisor per frequency; HF stores the four parameters that generate
    them. We take factor = max divisor and try the parameters Llama 3.x ships with, and accept
    only an exact reproduction (a wrong guess would silently change every rotation).
    """
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    wavelen = 2 * math.pi / inv
    factor = float(factors.max())
    for old in [original_ctx] if original_ctx else [8192, 4096, 2048, 16384, 32768]:
        # Llama 3.x: (1, 4); Llama 4 Scout: (1, 1), no smooth band (llama.cpp's converter
        # never reaches its division by zero, nor does transformers' where it picks)
        for low, high in ((1.0, 4.0), (1.0, 2.0), (2.0, 4.0), (1.0, 1.0)):
            smooth = (old / wavelen - low) / (high - low) if high != low \
                else torch.zeros_like(wavelen)
            mid = 1.0 / ((1 - smooth) / factor + smooth)
            low_freq = torch.where(wavelen > old / low, torch.full_like(wavelen, factor), mid)
            want = torch.where(wavelen < old / high, torch.ones_like(wavelen), low_freq)
            if torch.allclose(want.float(), factors.float().flatten(), rtol=1e-4, atol=1e-6):
                return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                        "high_freq_factor": high, "original_max_position_embeddings": old}
    raise UnsupportedModelError(f"{path}: rope_freqs.weight does not match llama3 rope scaling "
                                f"with any known parameters; cannot express it as an HF config")

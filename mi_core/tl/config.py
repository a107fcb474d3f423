"""``HookedTransformerConfig``: TransformerLens' ``model.cfg``, read from a loaded model.

The field names and meanings are TransformerLens'; the values are derived from the model
through the kernel's public API (shapes of weights, the hook points a model has, the readout's
norm), never from a family name. The ``use_*`` switches are read at every forward, so
``model.cfg.use_attn_result = True`` works as ``model.set_use_attn_result(True)`` does.
"""

from __future__ import annotations

import dataclasses
import pprint
from typing import Any, Optional

import torch

from mi_core import CapabilityError, InputError, MIModel

#: The attributes TransformerLens' activation functions are called by in ``cfg.act_fn``.
_ACT_NAMES = {"gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu": "gelu",
              "gelu_tanh": "gelu_new",
              "silu": "silu", "swish": "silu", "relu": "relu", "gelu_fast": "gelu_fast"}


@dataclasses.dataclass
class HookedTransformerConfig:
    """The fields of TransformerLens' config that analysis code reads (same names)."""

    n_layers: int
    d_model: int
    n_ctx: int
    d_head: int
    n_heads: int
    d_vocab: int
    d_mlp: Optional[int] = None
    model_name: str = "custom"
    act_fn: Optional[str] = None
    eps: float = 1e-5
    use_attn_result: bool = False
    use_attn_scale: bool = True
    use_split_qkv_input: bool = False
    use_hook_mlp_in: bool = False
    use_attn_in: bool = False
    use_local_attn: bool = False
    ungroup_grouped_query_attention: bool = False
    original_architecture: Optional[str] = None
    from_checkpoint: bool = False
    checkpoint_index: Optional[int] = None
    checkpoint_label_type: Optional[str] = None
    checkpoint_value: Optional[int] = None
    tokenizer_name: Optional[str] = None
    normalization_type: Optional[str] = "LN"
    device: Optional[str] = None
    n_devices: int = 1
    attention_dir: str = "causal"
    attn_only: bool = False
    positional_embedding_type: str = "standard"
    final_rms: bool = False
    d_vocab_out: int = -1
    parallel_attn_mlp: bool = False
    rotary_dim: Optional[int] = None
    n_params: Optional[int] = None
    use_hook_tokens: bool = False
    gated_mlp: bool = False
    default_prepend_bos: bool = True
    dtype: torch.dtype = torch.float32
    tokenizer_prepends_bos: Optional[bool] = None
    n_key_value_heads: Optional[int] = None
    post_embedding_ln: bool = False
    num_experts: Optional[int] = None
    experts_per_token: Optional[int] = None
    # TransformerLens' other fields, with its defaults (those a loaded model decides are set
    # by config_of; the initialisation ones describe no loaded model)
    uses_rms_norm: bool = False
    layer_norm_folding: bool = False
    attn_scale: float = -1.0
    use_qk_norm: bool = False
    clip_qkv: Optional[float] = None
    use_logn_attn: bool = False
    train_seq_length: Optional[int] = None
    use_dynamic_ntk_rope: bool = False
    window_size: Optional[int] = None
    attn_types: Optional[list[str]] = None
    init_mode: str = "gpt2"
    seed: Optional[int] = None
    initializer_range: float = -1.0
    init_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    rotary_base: float = 10000
    rotary_base_local: Optional[float] = None
    rotary_scaling_factor: float = 1.0
    trust_remote_code: bool = False
    rotary_adjacent_pairs: bool = False
    load_in_4bit: bool = False
    quantization_method: Optional[str] = None
    relative_attention_max_distance: Optional[int] = None
    relative_attention_num_buckets: Optional[int] = None
    decoder_start_token_id: Optional[int] = None
    tie_word_embeddings: bool = False
    use_normalization_before_and_after: bool = False
    attn_scores_soft_cap: float = -1.0
    output_logits_soft_cap: float = -1.0
    use_NTK_by_parts_rope: bool = False
    NTK_by_parts_low_freq_factor: float = 1.0
    NTK_by_parts_high_freq_factor: float = 4.0
    NTK_by_parts_factor: float = 8.0
    NTK_original_ctx_len: int = 8192
    use_yarn_rope: bool = False
    yarn_factor: float = 1.0
    yarn_attention_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_original_max_position_embeddings: int = 4096
    yarn_truncate: bool = True
    yarn_global_attn_only: bool = False
    use_attention_sinks: bool = False
    norm_topk_prob: bool = False

    def __post_init__(self) -> None:
        """TransformerLens' derived defaults (and its seeding: a config with a seed seeds
        torch, random and numpy when it is made)."""
        if self.seed is not None:
            self.set_seed_everywhere(self.seed)
        if self.d_vocab_out == -1:
            self.d_vocab_out = self.d_vocab
        if self.initializer_range < 0:
            self.initializer_range = 0.8 / self.d_model ** 0.5 if self.init_mode == "gpt2" \
                else 1.0
        if self.positional_embedding_type == "rotary" and self.rotary_dim is None:
            self.rotary_dim = self.d_head
        if self.use_attn_scale and self.attn_scale == -1.0:
            self.attn_scale = float(self.d_head) ** 0.5

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> "HookedTransformerConfig":
        return cls(**config_dict)

    def is_layer_norm_activation(self) -> bool:
        return self.act_fn is not None and self.act_fn.endswith("_ln")

    def set_seed_everywhere(self, seed: int) -> None:
        import random

        torch.manual_seed(seed)
        random.seed(seed)
        try:
            import numpy as np
            np.random.seed(seed)
        except ImportError:
            pass

    @classmethod
    def unwrap(cls, config: "HookedTransformerConfig | dict[str, Any]"
               ) -> "HookedTransformerConfig":
        return cls(**config) if isinstance(config, dict) else config

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __repr__(self) -> str:
        return "HookedTransformerConfig:\n" + pprint.pformat(self.to_dict())


def config_of(model: MIModel, *, name: str, default_prepend_bos: bool
              ) -> HookedTransformerConfig:
    """The TransformerLens config describing `model` (see the module doc)."""
    from mi_core.tl.model import _d_mlp, _has_weight

    try:
        base = model.cfg  # the TransformerLens layer's summary (weights through WeightAccess)
    except CapabilityError as exc:
        raise CapabilityError(f"mi_core.tl.HookedTransformer needs the backend's weights "
                              f"(TransformerLens' module tree and cfg): {exc}") from exc
    has = model.has_hook_point
    rotary = has("blocks.0.attn.hook_rot_q")
    positions = "standard" if _has_weight(model, "W_pos") else (
        "rotary" if rotary else "none")
    backend_cfg = model.config
    act = getattr(backend_cfg, "activation", None) or getattr(backend_cfg, "hidden_act", None)
    act = getattr(act, "value", act)  # the backend's enum: its published name
    experts = getattr(getattr(backend_cfg, "moe", None), "num_experts", None)
    cfg = HookedTransformerConfig(
        n_layers=base.n_layers, d_model=base.d_model, n_ctx=int(base.n_ctx or 2048),
        d_head=base.d_head, n_heads=base.n_heads, d_vocab=base.d_vocab,
        d_mlp=None if experts else _d_mlp(model), model_name=name,
        act_fn=_ACT_NAMES.get(str(act), act) if act is not None else None,
        eps=float(getattr(backend_cfg, "norm_eps", None) or getattr(backend_cfg, "eps", 1e-5)),
        normalization_type=base.normalization_type, device=str(model.device),
        positional_embedding_type=positions, final_rms=base.normalization_type.startswith("RMS"),
        parallel_attn_mlp=not has("blocks.0.hook_resid_mid"),
        rotary_dim=base.d_head if rotary else None, gated_mlp=bool(base.gated_mlp),
        default_prepend_bos=default_prepend_bos, dtype=model.dtype,
        n_key_value_heads=base.n_key_value_heads,
        attn_only=not has("blocks.0.hook_mlp_out"), num_experts=experts)
    cfg.n_params = _n_params(cfg)
    cfg.use_qk_norm = bool(getattr(backend_cfg, "qk_norm", False))
    soft = getattr(backend_cfg, "final_softcap", None)
    cfg.output_logits_soft_cap = float(soft) if soft else -1.0
    soft = getattr(backend_cfg, "attn_softcap", None)
    cfg.attn_scores_soft_cap = float(soft) if soft else -1.0
    scale = getattr((getattr(model.backend, "settings", None) or [None])[0], "scale", None)
    if scale:  # the backend multiplies q.k by it; TransformerLens divides by attn_scale
        cfg.attn_scale = 1.0 / float(scale)
    from mi_core.tl.arithmetic import rotary_of

    rotary = rotary_of(model)
    if rotary:
        first = rotary[min(rotary)]
        cfg.rotary_base, cfg.rotary_dim = first.base, first.dim
        cfg.rotary_adjacent_pairs = first.adjacent_pairs
    elif positions == "rotary" and getattr(backend_cfg, "ropes", None):  # a rotation TL would scale
        cfg.rotary_base = float(getattr(backend_cfg.ropes[0], "theta", cfg.rotary_base))
    return cfg


def _n_params(cfg: HookedTransformerConfig) -> int:
    """TransformerLens' count: four attention matrices per head (grouped-query K/V counted
    per query head, as TransformerLens does) and the MLP matrices; no embeddings or biases."""
    attn = cfg.d_model * cfg.d_head * cfg.n_heads * 4
    mlp = 0 if cfg.attn_only or cfg.d_mlp is None else (
        cfg.d_model * cfg.d_mlp * (3 if cfg.gated_mlp else 2))
    return cfg.n_layers * (attn + mlp)


_DTYPES = {"float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def load_device(device: Any) -> str | torch.device:
    """`device` of ``from_pretrained``; None: CUDA when available, as TransformerLens."""
    return device if device is not None else "cuda" if torch.cuda.is_available() else "cpu"


def load_dtype(dtype: Any) -> torch.dtype:
    """`dtype` of ``from_pretrained``: a torch dtype or TransformerLens' names for one."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise InputError(f"dtype must be a torch dtype or one of {sorted(_DTYPES)}, got {dtype!r}")

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

from mi_core import CapabilityError, MIModel

#: The attributes TransformerLens' activation functions are called by in ``cfg.act_fn``.
_ACT_NAMES = {"gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu": "gelu",
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

    def __post_init__(self) -> None:
        if self.d_vocab_out == -1:
            self.d_vocab_out = self.d_vocab

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
    return cfg


def _n_params(cfg: HookedTransformerConfig) -> int:
    """TransformerLens' count: four attention matrices per head (grouped-query K/V counted
    per query head, as TransformerLens does) and the MLP matrices; no embeddings or biases."""
    attn = cfg.d_model * cfg.d_head * cfg.n_heads * 4
    mlp = 0 if cfg.attn_only or cfg.d_mlp is None else (
        cfg.d_model * cfg.d_mlp * (3 if cfg.gated_mlp else 2))
    return cfg.n_layers * (attn + mlp)

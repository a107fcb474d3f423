"""The weight map: HF tensor names -> our per-layer weights, with every shape checked first.

Names follow from the config's axes (layouts, biases, norms), never from the family name, so
a new LLaMA-like family usually needs no change here. Tensors come from a
:class:`mi_core.loading.SafetensorsCheckpoint` (memory-mapped) or an in-memory dict (GGUF).
"""

from __future__ import annotations

from typing import Mapping, Protocol

import attrs
import torch

from mi_core.errors import WeightLoadError

from mi_transformer.attention import AttnWeights
from mi_transformer.config import MlpLayout, QkvLayout, TransformerConfig
from mi_transformer.mlp import MlpWeights
from mi_transformer.norm import Norm

#: Tensors a checkpoint may hold that the forward does not read.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class TensorSource(Protocol):
    shapes: Mapping[str, tuple[int, ...]]

    def names(self) -> list[str]: ...

    def get(self, name: str, dtype: torch.dtype | None = None,
            device: torch.device | str | None = None,
            shape: tuple[int, ...] | None = None) -> torch.Tensor: ...


class DictSource:
    """A TensorSource over an in-memory ``{hf_name: tensor}`` dict (e.g. from GGUF)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], origin: str = "<memory>") -> None:
        self.tensors = tensors
        self.origin = origin
        self.shapes = {k: tuple(v.shape) for k, v in tensors.items()}

    def names(self) -> list[str]:
        return list(self.tensors)

    def get(self, name: str, dtype: torch.dtype | None = None,
            device: torch.device | str | None = None,
            shape: tuple[int, ...] | None = None) -> torch.Tensor:
        if name not in self.tensors:
            raise WeightLoadError(f"{self.origin}: tensor {name!r} not found")
        t = self.tensors[name]
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise WeightLoadError(f"{self.origin}: tensor {name!r} has shape {list(t.shape)}, "
                                  f"expected {list(shape)}")
        return t.to(dtype=dtype or t.dtype, device=device or t.device)


def _norm_names(cfg: TransformerConfig) -> dict[str, str]:
    """Our norm slot -> HF module name inside a layer (Gemma 2/3 reuse names differently)."""
    if cfg.post_norms:
        return {"ln1": "input_layernorm", "ln1_post": "post_attention_layernorm",
                "ln2": "pre_feedforward_layernorm", "ln2_post": "post_feedforward_layernorm"}
    return {"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}


def expected_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the config implies, HF name -> shape (lm_head only when untied)."""
    d, hd, h, kv, m = (cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads,
                       cfg.intermediate_size)
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, d),
                                       "model.norm.weight": (d,)}
    if cfg.norm_bias:
        out["model.norm.bias"] = (d,)
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, d)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        if cfg.qkv_layout is QkvLayout.FUSED:
            out[a + "qkv_proj.weight"] = ((h + 2 * kv) * hd, d)
            if cfg.qkv_bias:
                out[a + "qkv_proj.bias"] = ((h + 2 * kv) * hd,)
        else:
            for name, rows in (("q", h * hd), ("k", kv * hd), ("v", kv * hd)):
                out[a + f"{name}_proj.weight"] = (rows, d)
                if cfg.qkv_bias:
                    out[a + f"{name}_proj.bias"] = (rows,)
        out[a + "o_proj.weight"] = (d, h * hd)
        if cfg.o_bias:
            out[a + "o_proj.bias"] = (d,)
        if cfg.qk_norm:
            out[a + "q_norm.weight"] = (hd,)
            out[a + "k_norm.weight"] = (hd,)
        for hf in _norm_names(cfg).values():
            out[p + hf + ".weight"] = (d,)
            if cfg.norm_bias:
                out[p + hf + ".bias"] = (d,)
        mp = p + "mlp."
        if cfg.mlp_layout is MlpLayout.PLAIN:
            mats = {"c_fc": (m, d), "c_proj": (d, m)}
        elif cfg.mlp_layout is MlpLayout.GATED_FUSED:
            mats = {"gate_up_proj": (2 * m, d), "down_proj": (d, m)}
        else:
            mats = {"gate_proj": (m, d), "up_proj": (m, d), "down_proj": (d, m)}
        for name, shape in mats.items():
            out[mp + name + ".weight"] = shape
            if cfg.mlp_bias:
                out[mp + name + ".bias"] = (shape[0],)
    return out


@attrs.define
class WeightCheck:
    """The outcome of comparing a checkpoint's tensor names/shapes with a config."""

    missing: list[str]
    unexpected: list[str]
    misshaped: list[str]

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.misshaped)


def check_tensors(cfg: TransformerConfig, shapes: Mapping[str, tuple[int, ...]]) -> WeightCheck:
    exp = expected_shapes(cfg)
    tied_extra = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    missing = [n for n in exp if n not in shapes]
    unexpected = [n for n in shapes if n not in exp and n not in tied_extra
                  and not n.endswith(IGNORED_SUFFIXES)]
    misshaped = [f"{n}: {list(shapes[n])} != expected {list(s)}"
                 for n, s in exp.items() if n in shapes and tuple(shapes[n]) != tuple(s)]
    return WeightCheck(missing, unexpected, misshaped)


@attrs.define(eq=False)
class LayerWeights:
    ln1: Norm
    ln2: Norm
    attn: AttnWeights
    mlp: MlpWeights
    ln1_post: Norm | None = None
    ln2_post: Norm | None = None


@attrs.define(eq=False)
class Weights:
    embed: torch.Tensor  # [vocab, d_model]
    lm_head: torch.Tensor  # [vocab, d_model] (the embedding itself when tied)
    final_norm: Norm
    layers: list[LayerWeights]


def _origin(src: TensorSource) -> str:
    files = getattr(src, "files", None)
    return ", ".join(map(str, files)) if files else getattr(src, "origin", "<memory>")


def load_weights(cfg: TransformerConfig, src: TensorSource, device: torch.device,
                 dtype: torch.dtype, show_progress: bool = True) -> Weights:
    """Check every name and shape (one error listing all problems), then load.

    Fused QKV / gate-up tensors are split into row views of the one loaded tensor, so no
    second copy is made.
    """
    chk = check_tensors(cfg, src.shapes)
    if chk.missing or chk.misshaped:
        parts = []
        if chk.missing:
            parts.append("missing tensors: " + ", ".join(chk.missing[:20])
                         + (" ..." if len(chk.missing) > 20 else ""))
        if chk.misshaped:
            parts.append("mis-shaped tensors: " + "; ".join(chk.misshaped[:20]))
        raise WeightLoadError(f"{_origin(src)} ({cfg.model_type}): " + " | ".join(parts))

    def get(name: str) -> torch.Tensor:
        return src.get(name, dtype=dtype, device=device)

    def opt(name: str) -> torch.Tensor | None:
        return get(name) if name in src.shapes else None

    def norm(prefix: str) -> Norm:
        return Norm(cfg.norm_type, cfg.norm_eps, get(prefix + ".weight"),
                    get(prefix + ".bias") if cfg.norm_bias else None)

    hd, h, kv, m = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size
    layers: list[LayerWeights] = []
    from tqdm.auto import tqdm

    for i in tqdm(range(cfg.num_layers), desc="loading layers", leave=False,
                  disable=not show_progress or None):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        if cfg.qkv_layout is QkvLayout.FUSED:
            qkv = get(a + "qkv_proj.weight")
            wq, wk, wv = qkv.split([h * hd, kv * hd, kv * hd], dim=0)
            b = opt(a + "qkv_proj.bias")
            bq, bk, bv = b.split([h * hd, kv * hd, kv * hd]) if b is not None else (None,) * 3
        else:
            wq, wk, wv = (get(a + f"{x}_proj.weight") for x in "qkv")
            bq, bk, bv = (opt(a + f"{x}_proj.bias") for x in "qkv")
        qn = Norm(cfg.norm_type, cfg.norm_eps, get(a + "q_norm.weight")) if cfg.qk_norm else None
        kn = Norm(cfg.norm_type, cfg.norm_eps, get(a + "k_norm.weight")) if cfg.qk_norm else None
        attn = AttnWeights(wq, wk, wv, get(a + "o_proj.weight"), bq, bk, bv,
                           opt(a + "o_proj.bias"), qn, kn)
        mp = p + "mlp."
        if cfg.mlp_layout is MlpLayout.PLAIN:
            mw = MlpWeights(cfg.mlp_layout, get(mp + "c_fc.weight"), get(mp + "c_proj.weight"),
                            None, opt(mp + "c_fc.bias"), None, opt(mp + "c_proj.bias"))
        elif cfg.mlp_layout is MlpLayout.GATED_FUSED:
            gate, up = get(mp + "gate_up_proj.weight").split([m, m], dim=0)
            bgu = opt(mp + "gate_up_proj.bias")
            bg, bu = bgu.split([m, m]) if bgu is not None else (None, None)
            mw = MlpWeights(cfg.mlp_layout, gate, get(mp + "down_proj.weight"), up, bg, bu,
                            opt(mp + "down_proj.bias"))
        else:
            mw = MlpWeights(cfg.mlp_layout, get(mp + "gate_proj.weight"),
                            get(mp + "down_proj.weight"), get(mp + "up_proj.weight"),
                            opt(mp + "gate_proj.bias"), opt(mp + "up_proj.bias"),
                            opt(mp + "down_proj.bias"))
        names = _norm_names(cfg)
        layers.append(LayerWeights(
            ln1=norm(p + names["ln1"]), ln2=norm(p + names["ln2"]), attn=attn, mlp=mw,
            ln1_post=norm(p + names["ln1_post"]) if cfg.post_norms else None,
            ln2_post=norm(p + names["ln2_post"]) if cfg.post_norms else None))
    embed = get("model.embed_tokens.weight")
    lm_head = embed if cfg.tie_word_embeddings else get("lm_head.weight")
    return Weights(embed=embed, lm_head=lm_head, final_norm=norm("model.norm"), layers=layers)

"""A shared attention block reused across layers (Zamba2): its weights, forward and points.

A layer whose ``TransformerConfig.layer_shared`` entry is a use index j runs, before its own
mixer, one of the model's ``num_blocks`` shared blocks (weight set ``j % num_blocks``) on the
concatenation of the residual stream x and the token embeddings e (``hook_embed``'s output):

    c = [x | e]                          (2 d_model)
    a = attn(ln_attn(c))                 q / k / v read 2 d_model, each plus this use's
                                         low-rank adapter B (A c); o_proj back to d_model
    m = mlp(ln_mlp(a))                   gated, gate | up plus this use's adapter
    t = out_j(m)                         this layer's own linear [d_model, d_model]

and the layer's mixer reads ``norm(x + t)``; the residual stream itself gets only the mixer's
output (``x + mixer(norm(x + t))``). Neither the attention nor the MLP of the block has a
residual connection of its own. Every attention point keeps its name at the layer that runs
the block (``blocks.{i}.attn.*``: q, k, v, rotary, scores, pattern, z, result; knockout and
attention steering apply there); the block's other points are ``blocks.{i}.shared.*``
(:class:`SharedNames`), so that ``hook_attn_out`` / ``hook_mlp_out`` keep meaning what a
layer adds to the residual stream (the block adds nothing there directly).

The block's tensors are loaded once, at the first layer that uses each weight set (where
transformers saves them), and shared by reference with the later uses; each use's adapters
and output projection are its own.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs
import torch
import torch.nn.functional as F

from mi_core.plugin import HookRun

from mi_transformer.attention import AttnNames, AttnWeights, LayerSettings, Masks, attention
from mi_transformer.config import TransformerConfig
from mi_transformer.mlp import MlpWeights
from mi_transformer.norm import Norm

#: The block's tensors inside its checkpoint module (transformers' Zamba2 names); `{j}` is
#: the use index of an adapter.
ATTN_NORM, MLP_NORM = "input_layernorm", "pre_ff_layernorm"
Q, K, V, O = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
GATE_UP, DOWN = "feed_forward.gate_up_proj", "feed_forward.down_proj"
QKV_ADAPTERS = ("self_attn.linear_q_adapter_list.{j}", "self_attn.linear_k_adapter_list.{j}",
                "self_attn.linear_v_adapter_list.{j}")
MLP_ADAPTER = "feed_forward.gate_up_proj_adapter_list.{j}"
#: The layer's own output projection (beside the block's module).
OUT = "shared_out.weight"


def shared_tensors(cfg: TransformerConfig, owner: int) -> dict[str, tuple[int, ...]]:
    """The tensors of the weight set first used at layer `owner`, {name inside the block's
    module: shape}: norms, q / k / v / o, the MLP, and every use's adapters of this set."""
    sb = cfg.shared_block
    assert sb is not None
    d, d2, m = cfg.hidden_size, 2 * cfg.hidden_size, cfg.intermediate_size
    h, kv, hd, r = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, sb.adapter_rank
    out: dict[str, tuple[int, ...]] = {
        ATTN_NORM + ".weight": (d2,), MLP_NORM + ".weight": (d,),
        Q + ".weight": (h * hd, d2), K + ".weight": (kv * hd, d2), V + ".weight": (kv * hd, d2),
        O + ".weight": (d, h * hd), GATE_UP + ".weight": (2 * m, d), DOWN + ".weight": (d, m)}
    if sb.mlp_bias:
        out.update({GATE_UP + ".bias": (2 * m,), DOWN + ".bias": (d,)})
    block = cfg.shared_set(owner)
    for j in sb.uses_of(block):
        if sb.attn_adapters:  # transformers' adapters are [2 d_model] wide (q = k = v widths)
            for name in QKV_ADAPTERS:
                out[name.format(j=j) + ".0.weight"] = (r, d2)
                out[name.format(j=j) + ".1.weight"] = (d2, r)
        out[MLP_ADAPTER.format(j=j) + ".0.weight"] = (r, d)
        out[MLP_ADAPTER.format(j=j) + ".1.weight"] = (2 * m, r)
    return out


@attrs.define(eq=False)
class SharedBlockWeights:
    """One layer's use of a shared block: the block's norms, attention (its q / k / v with
    this use's adapters) and MLP, shared by reference between uses, and this use's MLP
    adapter (A [rank, d_model], B [2 d_mlp, rank]) and output projection [d_model, d_model]."""

    ln_attn: Norm  # over 2 d_model
    attn: AttnWeights
    ln_mlp: Norm
    mlp: MlpWeights  # gated, gate / up row views of gate_up_proj
    mlp_adapter: tuple[torch.Tensor, torch.Tensor]
    w_out: torch.Tensor


def load_shared(cfg: TransformerConfig, i: int, get: Callable[[str], torch.Tensor],
                opt: Callable[[str], torch.Tensor | None], own_out: torch.Tensor
                ) -> SharedBlockWeights:
    """Layer `i`'s use of its shared block from the block's tensors (`get(name inside the
    block's module)`, `opt` for optional ones) and the layer's own output projection."""
    sb, j = cfg.shared_block, cfg.layer_shared[i]
    assert sb is not None and j is not None
    m = cfg.intermediate_size
    low = lambda name: (get(name.format(j=j) + ".0.weight"),  # noqa: E731
                        get(name.format(j=j) + ".1.weight"))
    attn = AttnWeights(get(Q + ".weight"), get(K + ".weight"), get(V + ".weight"),
                       get(O + ".weight"),
                       adapters=tuple(low(n) for n in QKV_ADAPTERS) if sb.attn_adapters
                       else None)
    gate, up = get(GATE_UP + ".weight").split([m, m], dim=0)
    b = opt(GATE_UP + ".bias")
    bg, bu = b.split([m, m]) if b is not None else (None, None)
    mlp = MlpWeights(cfg.mlp_layout, gate, get(DOWN + ".weight"), up, bg, bu,
                     opt(DOWN + ".bias"))
    norm = lambda name: Norm(cfg.norm_type, cfg.norm_eps, get(name + ".weight"))  # noqa: E731
    return SharedBlockWeights(norm(ATTN_NORM), attn, norm(MLP_NORM), mlp, low(MLP_ADAPTER),
                              own_out)


@attrs.define(eq=False)
class SharedNames:
    """Hook names of the block's own points at layer `i` (the attention keeps ``attn.*``,
    the MLP ``mlp.hook_in`` / ``hook_pre`` / ``hook_pre_linear`` / ``hook_post``)."""

    inp: str  # shared.hook_in: [resid_pre | embeddings] [b, s, 2 d_model]
    ln1_scale: str
    ln1_normalized: str
    attn_out: str  # shared.hook_attn_out: o_proj's output [b, s, d_model]
    ln2_scale: str
    ln2_normalized: str
    mlp_out: str  # shared.hook_mlp_out: the MLP's output [b, s, d_model]
    out: str  # shared.hook_out: after the layer's own linear, added to the mixer's input

    @classmethod
    def of(cls, i: int) -> "SharedNames":
        p = f"blocks.{i}.shared."
        return cls(inp=p + "hook_in", ln1_scale=p + "ln1.hook_scale",
                   ln1_normalized=p + "ln1.hook_normalized", attn_out=p + "hook_attn_out",
                   ln2_scale=p + "ln2.hook_scale", ln2_normalized=p + "ln2.hook_normalized",
                   mlp_out=p + "hook_mlp_out", out=p + "hook_out")


def shared_points(sn: SharedNames, attn: AttnNames, layer_names: Any, rotary: bool
                  ) -> list[str]:
    """The block's points in execution order (`layer_names`: the layer's LayerNames)."""
    n = layer_names
    return ([sn.inp, sn.ln1_scale, sn.ln1_normalized, n.attn_in, attn.q, attn.k, attn.v]
            + ([attn.rot_q, attn.rot_k] if rotary else [])
            + [attn.scores, attn.pattern, attn.z, attn.result, sn.attn_out, sn.ln2_scale,
               sn.ln2_normalized, n.mlp_in, n.mlp_pre, n.mlp_pre_linear, n.mlp_post,
               sn.mlp_out, sn.out])


def shared_shape(cfg: TransformerConfig, suffix: str, batch: int, seq: int
                 ) -> tuple[int, ...] | None:
    """Shapes of the block's points whose width is not the standard table's."""
    d = cfg.hidden_size
    if suffix in ("shared.hook_in", "shared.ln1.hook_normalized", "attn.hook_in"):
        return (batch, seq, 2 * d)
    if suffix in ("shared.ln1.hook_scale", "shared.ln2.hook_scale"):
        return (batch, seq, 1)
    if suffix.startswith("shared."):
        return (batch, seq, d)
    return None


def shared_block(w: SharedBlockWeights, x: torch.Tensor, emb: torch.Tensor, run: HookRun,
                 names: SharedNames, *, layer_names: Any, ls: LayerSettings,
                 rope: tuple[torch.Tensor, torch.Tensor] | None, masks: Masks,
                 act: Callable[[torch.Tensor], torch.Tensor], explicit: bool | None,
                 cache_update: Callable[..., Any] | None) -> torch.Tensor:
    """x [b, s, d_model] (the layer's resid_pre), emb [b, s, d_model] -> what the block adds
    to the mixer's norm input [b, s, d_model] (``shared.hook_out``)."""
    n = layer_names
    c = run.apply(names.inp, torch.cat([x, emb.to(x.dtype)], dim=-1))
    h = w.ln_attn(c, run, names.ln1_scale, names.ln1_normalized, out_name=n.attn_in)
    a = attention(w.attn, h, rope, masks, run, n.attn, ls, explicit=explicit,
                  cache_update=cache_update)
    a = run.apply(names.attn_out, a)
    h2 = w.ln_mlp(a, run, names.ln2_scale, names.ln2_normalized, out_name=n.mlp_in)
    lg, lu = F.linear(F.linear(h2, w.mlp_adapter[0]), w.mlp_adapter[1]).chunk(2, dim=-1)
    mw = w.mlp
    pre = run.apply(n.mlp_pre, F.linear(h2, mw.w_in, mw.b_in) + lg)
    up = run.apply(n.mlp_pre_linear, F.linear(h2, mw.w_up, mw.b_up) + lu)
    post = run.apply(n.mlp_post, act(pre) * up)
    m = run.apply(names.mlp_out, F.linear(post, mw.w_out, mw.b_out))
    return run.apply(names.out, F.linear(m, w.w_out))

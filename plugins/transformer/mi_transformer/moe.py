"""Mixture-of-experts MLPs: a router picks the top-k experts per token.

One code path serves Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, gpt-oss, DeepSeek-V2/V3 and
Llama 4; they differ only in the axes of :class:`MoeConfig` (whether the top-k weights are
renormalised, whether a shared expert with or without a sigmoid gate runs beside the routed
ones, softmax or sigmoid scores, group-limited choice with a selection bias and routed scaling
(:mod:`mi_transformer.routing`), a router bias, whether the routing weight scales the expert's
output or, as in Llama 4, its input). Every expert is a gated MLP ``down(act(gate(x)) *
up(x))``, or a stacked checkpoint's slice with gpt-oss's clamped SwiGLU
(:mod:`mi_transformer.experts`), or (``MoeConfig.gated`` False, Nemotron-H) a plain MLP
``down(act(up(x)))``. With ``MoeConfig.latent_size`` (Nemotron-H) the routed experts read
``fc1_latent_proj(x)`` and their weighted sum goes through ``fc2_latent_proj``; the router and
the shared expert read x.

No expert runs on tokens not routed to it: the (token, slot) pairs are sorted by expert, each
expert's slice of rows is computed once, weighted, and each token's output is the sum of its
top-k rows. With the experts stacked (:attr:`MoeWeights.stacked`: Granite's checkpoint
tensors as stored, per-expert checkpoints stacked once at load) and ``torch.nn.functional.
grouped_mm`` usable (float32 / bf16 / fp16, 16-byte strides, no autograd), the rows come from
two grouped matmuls over every expert at once, without a host sync: the path transformers 5
takes (``grouped_mm`` experts). Otherwise (gpt-oss's and Llama 4's experts, offloaded
blocks, float64, autograd) each expert runs on its own slice in a loop. The per-token sum is
the same either way, so hooks change no number.

Hook points of an MoE layer ``i`` (``p = blocks.{i}.mlp.``):

* ``p + hook_router_logits`` [batch, seq, n_experts], before the softmax; an intervention here
  changes which experts run and with what weights.
* ``p + hook_expert_weights`` [batch, seq, top_k] (after the optional renormalisation) and
  ``p + hook_expert_indices`` [batch, seq, top_k] (int64), the routing actually used.
* ``p + experts.{e}.hook_out`` [batch, seq, d_model]: expert e's weighted contribution
  (routing weight times its output; Llama 4: its output on the weighted input; with a latent
  projection, that latent output times ``fc2_latent_proj``'s matrix), zero at tokens not
  routed to it. Built (one scatter) only for the experts hooked; an intervention's change is
  added to the layer's output.
* ``p + shared_expert.hook_out`` [batch, seq, d_model]: the shared expert's contribution,
  its sigmoid gate applied (Qwen2-MoE), or DeepSeek's shared experts / Llama 4's.

The layer's output (``hook_mlp_out``) is the sum of the expert contributions and the shared one.
"""

from __future__ import annotations

from typing import Callable

import attrs
import torch
import torch.nn.functional as F

from mi_core.plugin import HookRun, InterventionError

from mi_transformer.config import MoeConfig
from mi_transformer.experts import FusedExpert, fused_shapes, load_fused
from mi_transformer.routing import scores_and_choice


@attrs.define(eq=False)
class ExpertWeights:
    """One expert, torch.nn.Linear layout: gated, or plain without `w_gate` (Nemotron-H)."""

    w_gate: torch.Tensor | None  # [d_expert, d_model]; None: down(act(up(x)))
    w_up: torch.Tensor  # [d_expert, d_model]
    w_down: torch.Tensor  # [d_model, d_expert]
    #: (gate [d_expert] | None, up [d_expert], down [d_model]): a shared expert's biases
    #: (ERNIE-4.5 MoE with ``use_bias``); None: no biases
    biases: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None = None

    def __call__(self, x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]
                 ) -> torch.Tensor:
        """x [n, d_model] -> [n, d_model] (d_model: the latent width behind a latent
        projection)."""
        bg, bu, bd = self.biases if self.biases is not None else (None, None, None)
        if self.w_gate is None:
            return F.linear(act(F.linear(x, self.w_up, bu)), self.w_down, bd)
        return F.linear(act(F.linear(x, self.w_gate, bg)) * F.linear(x, self.w_up, bu),
                        self.w_down, bd)


@attrs.frozen(eq=False)
class StackedExpert:
    """Expert e of a layer whose experts are stacked (:attr:`MoeWeights.stacked`); called as
    :class:`ExpertWeights`. Its tensors are views of the stack, so an in-place edit reaches
    the grouped forward too; they cannot be rebound (frozen), which would leave the stack
    stale."""

    gate_up: torch.Tensor  # [2 d_expert, d_model]: rows [gate | up], a view of the stack
    w_down: torch.Tensor  # [d_model, d_expert]
    gated: bool = True  # False: gate_up is up alone [d_expert, d_model] (Nemotron-H)

    @property
    def w_gate(self) -> torch.Tensor | None:
        return self.gate_up[: self.gate_up.shape[0] // 2] if self.gated else None

    @property
    def w_up(self) -> torch.Tensor:
        return self.gate_up[self.gate_up.shape[0] // 2:] if self.gated else self.gate_up

    def __call__(self, x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]
                 ) -> torch.Tensor:
        """x [n, d_model] -> [n, d_model]."""
        if not self.gated:
            return F.linear(act(F.linear(x, self.gate_up)), self.w_down)
        gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
        return F.linear(act(gate) * up, self.w_down)


@attrs.define(eq=False)
class MoeNames:
    """Hook names of one MoE layer, built once at load."""

    router_logits: str
    expert_weights: str
    expert_indices: str
    expert_out: list[str]
    shared_out: str

    @classmethod
    def of(cls, layer: int, num_experts: int) -> "MoeNames":
        p = f"blocks.{layer}.mlp."
        return cls(router_logits=p + "hook_router_logits", expert_weights=p + "hook_expert_weights",
                   expert_indices=p + "hook_expert_indices",
                   expert_out=[p + f"experts.{e}.hook_out" for e in range(num_experts)],
                   shared_out=p + "shared_expert.hook_out")

    def in_order(self, shared: bool) -> list[str]:
        out = [self.router_logits, self.expert_weights, self.expert_indices, *self.expert_out]
        return out + [self.shared_out] if shared else out


@attrs.define(eq=False)
class MoeWeights:
    """A mixture-of-experts MLP: router, experts, optional shared expert and its gate."""

    config: MoeConfig
    router: torch.Tensor  # [n_experts, d_model]
    experts: list[ExpertWeights] | list[FusedExpert] | list[StackedExpert]
    shared: ExpertWeights | None = None
    shared_gate: torch.Tensor | None = None  # [1, d_model]
    selection_bias: torch.Tensor | None = None  # [n_experts]: choice only (GLM-4.5, V3)
    router_bias: torch.Tensor | None = None  # [n_experts] (gpt-oss)
    eps: float = 1e-6  # the router input norm's epsilon (Gemma-4: rms_norm_eps)
    router_scale: torch.Tensor | None = None  # [d_model]: the router's input scale (Gemma-4)
    per_expert_scale: torch.Tensor | None = None  # [n_experts]: times the top-k weights
    #: (gate_up [n_experts, 2 d_expert, d_model] rows [gate | up], down [n_experts, d_model,
    #: d_expert]) when the experts are StackedExpert views of them: the grouped forward
    #: (plain experts: up [n_experts, d_expert, d_model] in gate_up's place)
    stacked: tuple[torch.Tensor, torch.Tensor] | None = None
    #: (weight [latent, d_model], bias [latent] | None): fc1_latent_proj (Nemotron-H)
    latent_in: tuple[torch.Tensor, torch.Tensor | None] | None = None
    #: (weight [d_model, latent], bias [d_model] | None): fc2_latent_proj
    latent_out: tuple[torch.Tensor, torch.Tensor | None] | None = None


def route(w: MoeWeights, x: torch.Tensor, run: HookRun, names: MoeNames
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [batch, seq, d_model] -> (weights, indices) [batch, seq, top_k], through the hooks.

    Softmax in float32 over all experts, top-k, optional renormalisation, as transformers;
    the other routers in :func:`mi_transformer.routing.scores_and_choice`.
    """
    c = w.config
    if w.router_scale is not None:  # Gemma-4: rms(x) (no gain) * scale * d_model^-0.5
        xf = x.float()
        x_in = (xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + w.eps, -0.5)).type_as(x)
        x_in = x_in * w.router_scale * x.shape[-1] ** -0.5
    else:
        x_in = x
    # float32 routers (the biased / sigmoid ones, loaded so) compute in float32, as transformers
    logits = run.apply(names.router_logits,
                       F.linear(x_in.to(w.router.dtype), w.router, w.router_bias))
    if not c.plain_routing:  # sigmoid / biased / grouped / scaled (mi_transformer.routing)
        top_w, top_i = scores_and_choice(c, logits, w.selection_bias)
    else:
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        top_w, top_i = torch.topk(probs, c.top_k, dim=-1)
        if c.norm_topk_prob:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    if w.per_expert_scale is not None:  # Gemma-4: each chosen expert's weight scaled
        top_w = top_w * w.per_expert_scale[top_i]
    top_w = run.apply(names.expert_weights, top_w.to(weights_dtype(c, x.dtype)))
    top_i = run.apply(names.expert_indices, top_i)
    if run.spec.has_intervention_at(names.expert_indices):
        _check_indices(top_i, c, names.expert_indices, tuple(x.shape[:-1]))
    return top_w, top_i


def weights_dtype(c: MoeConfig, dtype: torch.dtype) -> torch.dtype:
    """The routing weights' dtype in a model of `dtype`: float32 in a half model where
    transformers keeps them so (:attr:`MoeConfig.accumulate_float32`), else the model's."""
    return torch.promote_types(dtype, torch.float32) if c.accumulate_float32 else dtype


def _check_indices(idx: torch.Tensor, c: MoeConfig, name: str, lead: tuple[int, ...]) -> None:
    if tuple(idx.shape) != (*lead, c.top_k) or idx.dtype not in (torch.int64, torch.int32):
        raise InterventionError(f"{name}: an intervention returned {idx.dtype} {list(idx.shape)}; "
                                f"expected integer indices {[*lead, c.top_k]}")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= c.num_experts):
        raise InterventionError(f"{name}: an intervention returned expert indices outside "
                                f"0..{c.num_experts - 1}")


def moe(w: MoeWeights, x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor],
        run: HookRun, names: MoeNames, router_in: torch.Tensor | None = None) -> torch.Tensor:
    """x [batch, seq, d_model] (normalised) -> the MLP output [batch, seq, d_model].
    `router_in`: what the router reads when it is not x (Gemma-4: the residual stream)."""
    c = w.config
    b, s, d_model = x.shape
    top_w, top_i = route(w, x if router_in is None else router_in, run, names)
    flat = x.reshape(-1, d_model)
    if w.latent_in is not None:  # the routed experts read the latent (Nemotron-H)
        flat = F.linear(flat, *w.latent_in)
    d = flat.shape[-1]
    flat_w = top_w.reshape(-1)  # [tokens * top_k]
    flat_i = top_i.reshape(-1).long()
    # Sort the (token, slot) pairs by expert: each expert's rows form one contiguous slice.
    order = torch.argsort(flat_i, stable=True)
    tok = order // c.top_k
    hooked = [] if run.spec.is_empty() else \
        [e for e in range(c.num_experts) if run.wants(names.expert_out[e])]
    counts: list[int] | None = None
    if _grouped_ok(w, flat):
        rows = _grouped_rows(w.stacked, flat[tok], flat_w[order], flat_i[order], act,
                             c.gated)
    else:
        counts = torch.bincount(flat_i, minlength=c.num_experts).tolist()  # one host sync
        rows = _looped_rows(w, flat, flat_w, order, tok, counts, act)
    per_slot = torch.empty_like(rows)
    per_slot[order] = rows
    # [tokens, d]; rows in float32 with float32 weights (accumulate_float32): one rounding
    out = per_slot.view(-1, c.top_k, d).sum(dim=1).to(x.dtype)
    if w.latent_out is not None:  # back to d_model
        out = F.linear(out, *w.latent_out)
    if hooked:
        if counts is None:
            counts = torch.bincount(flat_i, minlength=c.num_experts).tolist()
        starts = [0]
        for n in counts:
            starts.append(starts[-1] + n)
        for e in hooked:  # the dense [batch, seq, d_model] view, zero where not routed
            sl = slice(starts[e], starts[e + 1])
            dense = torch.zeros_like(flat).index_copy_(0, tok[sl], rows[sl].to(flat.dtype))
            if w.latent_out is not None:  # its share of fc2_latent_proj's output (no bias)
                dense = F.linear(dense, w.latent_out[0])
            dense = dense.view(b, s, d_model)
            name = names.expert_out[e]
            if run.spec.has_intervention_at(name):
                before = dense.clone()
                out = out + (run.apply(name, dense) - before).reshape(-1, d_model)
            else:
                run.apply(name, dense)
    out = out.view(b, s, d_model)
    if w.shared is not None:
        sh = w.shared(x, act)
        if w.shared_gate is not None:
            sh = torch.sigmoid(F.linear(x, w.shared_gate)) * sh
        out = out + run.apply(names.shared_out, sh)
    return out


def _looped_rows(w: MoeWeights, flat: torch.Tensor, flat_w: torch.Tensor, order: torch.Tensor,
                 tok: torch.Tensor, counts: list[int],
                 act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """[tokens * top_k, d_model] in expert order: each expert on its own slice of rows."""
    # the weights' dtype when wider (float32 weights in a half model: accumulate_float32)
    rows = flat.new_empty(order.shape[0], flat.shape[-1],
                          dtype=torch.promote_types(flat.dtype, flat_w.dtype))
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        sel, xe = order[start:start + n], flat[tok[start:start + n]]
        if w.config.weights_scale_input:  # Llama 4: the expert reads its weighted input
            rows[start:start + n] = w.experts[e](xe * flat_w[sel, None].to(xe.dtype), act)
        else:
            rows[start:start + n] = w.experts[e](xe, act) * flat_w[sel, None]
        start += n
    return rows


def _grouped_rows(stacked: tuple[torch.Tensor, torch.Tensor] | None, xs: torch.Tensor,
                  ws: torch.Tensor, ids: torch.Tensor,
                  act: Callable[[torch.Tensor], torch.Tensor], gated: bool = True
                  ) -> torch.Tensor:
    """The same rows from two grouped matmuls: xs [S, d_model] sorted by expert (`ids`),
    ws [S] their routing weights. `gated` False: the stack's first tensor is up alone."""
    assert stacked is not None
    gate_up, down = stacked
    offs = torch.bincount(ids, minlength=gate_up.shape[0]).cumsum(0).to(torch.int32)
    h = F.grouped_mm(xs, gate_up.transpose(1, 2), offs=offs)
    if gated:
        gate, up = h.chunk(2, dim=-1)
        h = act(gate) * up
    else:
        h = act(h)
    return F.grouped_mm(h, down.transpose(1, 2), offs=offs) * ws[:, None]


_GROUPED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _aligned(t: torch.Tensor) -> bool:
    """grouped_mm's operand rule: 16-byte aligned data and strides (besides unit ones)."""
    size = t.element_size()
    return t.data_ptr() % 16 == 0 and all(
        st == 1 or n == 1 or (st * size) % 16 == 0 for st, n in zip(t.stride(), t.shape))


def _grouped_ok(w: MoeWeights, flat: torch.Tensor) -> bool:
    """Whether the grouped forward applies: stacked plain experts with the weight on the
    output, a dtype and device torch's grouped_mm serves, and no autograd (its CPU backward
    fails on empty groups)."""
    st = w.stacked
    if st is None or w.config.weights_scale_input or not hasattr(F, "grouped_mm"):
        return False
    gate_up, down = st
    if flat.dtype not in _GROUPED_DTYPES or gate_up.dtype != flat.dtype or not flat.shape[0]:
        return False
    if torch.is_grad_enabled() and (flat.requires_grad or gate_up.requires_grad
                                    or down.requires_grad):
        return False
    if flat.device.type == "cuda":
        if torch.cuda.get_device_capability(flat.device) < (8, 0):
            return False
    elif flat.device.type != "cpu":
        return False
    f = down.shape[-1]
    return (_aligned(gate_up) and _aligned(down) and (flat.shape[-1] * flat.element_size()) % 16
            == 0 and (f * flat.element_size()) % 16 == 0)


def _router_module(m: str, c: MoeConfig) -> str:
    """The module holding the router under the MoE module prefix `m` ("...router." for a
    ``router.proj`` router, Gemma-4's), where its input scales live."""
    parent = c.router_name.rpartition(".")[0]
    return f"{m}{parent}." if parent else m


def expected_moe_shapes(prefix: str, c: MoeConfig, d_model: int) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name -> shape for one MoE layer under `prefix` (``model.layers.{i}.``)."""
    m = prefix + c.block + "." if c.block else prefix
    r = f"{m}{c.router_name}."
    out: dict[str, tuple[int, ...]] = {r + "weight": (c.num_experts, d_model)}
    if c.router_bias:
        out[r + "bias"] = (c.num_experts,)
    if c.router_input_scale:  # Gemma-4: router.scale beside router.proj
        rm = _router_module(m, c)
        out[rm + "scale"] = (d_model,)
        out[rm + "per_expert_scale"] = (c.num_experts,)
    g, u, dn = c.expert_names
    d_in = c.latent_size or d_model  # what the routed experts read and write
    if c.latent_size:  # Nemotron-H: fc1 (d_model -> latent) before, fc2 after the experts
        for name, shape in (("fc1_latent_proj", (c.latent_size, d_model)),
                            ("fc2_latent_proj", (d_model, c.latent_size))):
            out[f"{m}{name}.weight"] = shape
    if c.fused_linear and not c.gated:  # Nemotron-H as transformers holds it: [E, f, d_in]
        out[m + "experts." + u] = (c.num_experts, c.expert_size, d_in)
        out[m + "experts." + dn] = (c.num_experts, d_in, c.expert_size)
    elif c.fused_linear:  # Gemma-4: [E, 2 d_expert, d_model] rows [gate | up], no ".weight"
        out[m + "experts.gate_up_proj"] = (c.num_experts, 2 * c.expert_size, d_model)
        out[m + "experts.down_proj"] = (c.num_experts, d_model, c.expert_size)
    elif c.fused:
        out.update(fused_shapes(m, c, d_model))
    elif c.fused_experts:  # Granite 4: [n, 2 * d_expert, d_model] rows [gate | up]
        out[m + g + ".weight"] = (c.num_experts, 2 * c.expert_size, d_model)
        out[m + dn + ".weight"] = (c.num_experts, d_model, c.expert_size)
    for e in range(0 if c.fused or c.fused_experts or c.fused_linear else c.num_experts):
        ep = f"{m}experts.{e}."
        if c.gated:
            out[ep + g + ".weight"] = (c.expert_size, d_in)
        out[ep + u + ".weight"] = (c.expert_size, d_in)
        out[ep + dn + ".weight"] = (d_in, c.expert_size)
    if c.selection_bias:
        out[m + c.selection_bias] = (1, c.num_experts) if c.selection_bias_rows \
            else (c.num_experts,)
    s = c.shared_expert_size
    if s and c.shared_module:
        out[prefix + c.shared_module + "." + g + ".weight"] = (2 * s, d_model)
        out[prefix + c.shared_module + "." + dn + ".weight"] = (d_model, s)
    elif s:
        for name, shape in (("gate_proj", (s, d_model)), ("up_proj", (s, d_model)),
                            ("down_proj", (d_model, s)))[0 if c.gated else 1:]:
            out[f"{m}{c.shared_name}.{name}.weight"] = shape
            if c.shared_expert_bias:
                out[f"{m}{c.shared_name}.{name}.bias"] = shape[:1]
        if c.shared_expert_gate:
            out[m + "shared_expert_gate.weight"] = (1, d_model)
    return out


def float32_names(c: MoeConfig) -> set[str]:
    """Names inside a layer of the tensors loaded in float32 whatever the model's dtype: the
    router and selection bias of non-softmax-top-k routers (transformers keeps or computes
    them in float32, and a rounded bias can change which experts run)."""
    if c.plain_routing and not c.router_float32:
        return set()
    r = f"{c.router_module}."
    return {r + "weight"} | ({f"{c.block}.{c.selection_bias}"} if c.selection_bias else set())


def load_moe(prefix: str, c: MoeConfig, get: Callable[[str], torch.Tensor], eps: float = 1e-6,
             stack: bool = True) -> MoeWeights:
    """One layer's MoeWeights; `get(name)` returns a loaded tensor (shapes already checked
    against :func:`expected_moe_shapes`). Fused tensors are split into views. `stack`: copy
    per-expert tensors into two stacked ones (once, at load: the grouped forward; the
    experts are then views of them); an offloaded block, assembled per forward, does not."""
    m = prefix + c.block + "." if c.block else prefix
    r = f"{m}{c.router_name}."
    g, u, dn = c.expert_names
    experts: list[ExpertWeights] | list[FusedExpert] | list[StackedExpert]
    stacked = None
    rm = _router_module(m, c)  # the router module (Gemma-4)
    if c.fused_linear and not c.gated:  # Nemotron-H stacked: up [E, f, d_in], down [E, d_in,
        # f], as the grouped forward reads them (copied only when misaligned for grouped_mm)
        stacked = tuple(t.clone() if t.data_ptr() % 16 else t  # type: ignore[assignment]
                        for t in (get(m + "experts." + u), get(m + "experts." + dn)))
    elif c.fused_linear:  # views [d_model, 2 d_expert] / [d_expert, d_model] of the stacks
        gate_up, down = get(m + "experts.gate_up_proj"), get(m + "experts.down_proj")
        experts = [FusedExpert(gate_up[e].T, down[e].T, False) for e in range(c.num_experts)]
    elif c.fused:
        experts = load_fused(m, c, get)
    elif c.fused_experts:  # the checkpoint's two stacked tensors, as stored (copied only
        # when the file's layout leaves them off grouped_mm's 16-byte alignment)
        gate_up, down = (get(m + n + ".weight") for n in (g, dn))
        gate_up, down = (t.clone() if t.data_ptr() % 16 else t for t in (gate_up, down))
        stacked = gate_up, down
    elif stack:
        first = get(f"{m}experts.0.{g if c.gated else u}.weight")
        f, d = first.shape
        gate_up = first.new_empty(c.num_experts, (2 if c.gated else 1) * f, d)
        down = first.new_empty(c.num_experts, d, f)
        for e in range(c.num_experts):
            ep = f"{m}experts.{e}."
            if c.gated:
                gate_up[e, :f] = first if e == 0 else get(ep + g + ".weight")
                gate_up[e, f:] = get(ep + u + ".weight")
            else:  # plain experts: up alone
                gate_up[e] = first if e == 0 else get(ep + u + ".weight")
            down[e] = get(ep + dn + ".weight")
        stacked = gate_up, down
    else:
        experts = [ExpertWeights(get(f"{m}experts.{e}.{g}.weight") if c.gated else None,
                                 get(f"{m}experts.{e}.{u}.weight"),
                                 get(f"{m}experts.{e}.{dn}.weight"))
                   for e in range(c.num_experts)]
    if stacked is not None:
        experts = [StackedExpert(stacked[0][e], stacked[1][e], c.gated)
                   for e in range(c.num_experts)]
    shared = None
    if c.shared_expert_size and c.shared_module:
        sp = prefix + c.shared_module + "."
        shared = ExpertWeights(*get(sp + g + ".weight").chunk(2, dim=0), get(sp + dn + ".weight"))
    elif c.shared_expert_size:
        sp = f"{m}{c.shared_name}."
        shared = ExpertWeights(get(sp + "gate_proj.weight") if c.gated else None,
                               get(sp + "up_proj.weight"), get(sp + "down_proj.weight"),
                               (get(sp + "gate_proj.bias") if c.gated else None,
                                get(sp + "up_proj.bias"), get(sp + "down_proj.bias"))
                               if c.shared_expert_bias else None)
    latent = [(get(f"{m}{p}.weight"), None) for p in ("fc1_latent_proj", "fc2_latent_proj")] \
        if c.latent_size else None
    return MoeWeights(config=c, router=get(r + "weight"), experts=experts, shared=shared,
                      shared_gate=get(m + "shared_expert_gate.weight")
                      if c.shared_expert_gate else None,
                      selection_bias=get(m + c.selection_bias).reshape(-1)
                      if c.selection_bias else None,
                      router_bias=get(r + "bias") if c.router_bias else None, eps=eps,
                      router_scale=get(rm + "scale") if c.router_input_scale else None,
                      per_expert_scale=get(rm + "per_expert_scale")
                      if c.router_input_scale else None, stacked=stacked,
                      latent_in=latent[0] if latent else None,
                      latent_out=latent[1] if latent else None)

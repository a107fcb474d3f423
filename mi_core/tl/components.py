"""TransformerLens' module tree over a loaded model: ``model.embed.W_E``,
``model.blocks[i].attn.W_Q``, ``model.blocks[i].attn.hook_z``, ``model.unembed.b_U``, ...

The modules hold no computation (the kernel's backend runs the forward): they hold the weights,
as parameters that are *views* of the backend's tensors where the backend hands out views (an
in-place edit of ``model.blocks[0].attn.W_O`` changes the model, as in TransformerLens), and
the :class:`~mi_core.tl.hook_points.HookPoint` modules that hooks are added to. Names and
registration order are TransformerLens' (``named_parameters()`` lists what TransformerLens
lists). The tree is generic: which weights and points exist is read from the model (its
weights through the weight-access capability, its hook points), never from a family name.

Weights that are not views (a bias the model does not have, kept as zeros as TransformerLens
keeps it, or a weight the backend computes on request) are *detached*: editing one cannot reach
the forward, so :meth:`WeightTree.check_unedited` refuses to run after such an edit instead of
silently ignoring it.

Gradients: the view parameters require gradients, as TransformerLens' parameters do, and a
forward run with grad mode on computes with them (:meth:`WeightTree.autograd`): every tensor
the backend reads that lies inside a parameter's memory is replaced, for that forward only, by
the same memory seen through the parameter, so the outputs carry a ``grad_fn`` and
``backward()`` fills ``param.grad`` as in TransformerLens. The backend's own tensors never
require gradients, so :class:`mi_core.MIModel`'s API (the same backend) is unchanged. The
detached parameters take no part in the forward: they do not require gradients.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map_only

from mi_core import CapabilityError, HookSpec, MIError, MIModel
from mi_core.tl.hook_points import HookPoint

#: A block's hook points, in TransformerLens' registration order (after ln1, ln2, attn, mlp).
BLOCK_POINTS = ("hook_attn_in", "hook_q_input", "hook_k_input", "hook_v_input", "hook_mlp_in",
                "hook_attn_out", "hook_mlp_out", "hook_resid_pre", "hook_resid_mid",
                "hook_resid_post")
ATTN_POINTS = ("hook_k", "hook_q", "hook_v", "hook_z", "hook_attn_scores", "hook_pattern",
               "hook_result", "hook_rot_k", "hook_rot_q")
MLP_POINTS = ("hook_pre", "hook_pre_linear", "hook_post")
NORM_POINTS = ("hook_scale", "hook_normalized")
#: Kernel points TransformerLens does not have (the sublayers' post-norm inputs): hidden from
#: the tree, still reachable through ``model.mi_model``.
HIDDEN_SUFFIXES = ("attn.hook_in", "mlp.hook_in")


class WeightTree:
    """Where the tree's weights come from, and the guard over the detached ones."""

    def __init__(self, model: MIModel) -> None:
        self.model = model
        self.detached: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        #: the parameters that are views of the backend's tensors, in registration order
        self.views: list[nn.Parameter] = []
        self.view_labels: list[str] = []
        #: the views a forward read (see census)
        self.read: set[int] = set()
        self._owners: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # see owner()
        self._storages: dict[int, list[int]] | None = None

    def param(self, name: str, layer: int | None, label: str, *, zeros: tuple[int, ...] | None
              = None) -> nn.Parameter | None:
        """The weight `name` (the TransformerLens layer's naming) as a parameter; zeros of
        shape `zeros` where the model lacks it (None: leave it out)."""
        try:
            w = self.model.tl_weight(name, layer)
        except MIError:
            if zeros is None:
                return None
            w = None
        if w is None:
            p = nn.Parameter(torch.zeros(zeros, dtype=self.model.dtype,
                                         device=self.model.device), requires_grad=False)
            self.detached.append((label, p, p.detach().clone()))
            return p
        again = self.model.tl_weight(name, layer)
        if again.data_ptr() != w.data_ptr():  # computed on request: edits would not reach it
            p = nn.Parameter(w.detach(), requires_grad=False)
            self.detached.append((label, p, w.detach().clone()))
            return p
        p = nn.Parameter(w.detach(), requires_grad=True)  # TransformerLens' default
        self.views.append(p)
        self.view_labels.append(label)
        return p

    def census(self, forward: Callable[[], Any]) -> None:
        """Run `forward` (a full forward with no hooks, at load) noting the memory the backend
        reads: a view parameter it never reads is not what the backend computes with (a value
        derived at load, e.g. a norm's gain 1 + w), so it becomes detached (no
        gradient; an edit to it refused by :meth:`check_unedited`)."""
        with torch.no_grad(), _ThroughParameters(self, swap=False):
            forward()
        for i, (label, p) in enumerate(zip(self.view_labels, self.views)):
            if i not in self.read:
                p.requires_grad_(False)
                self.detached.append((label, p, p.detach().clone()))

    @contextlib.contextmanager
    def autograd(self) -> Iterator[None]:
        """For one forward: when grad mode is on and some view parameters require gradients,
        the backend computes with those parameters (see the module doc); otherwise nothing
        changes."""
        if not torch.is_grad_enabled() or not any(p.requires_grad for p in self.views):
            yield
            return
        with _ThroughParameters(self, swap=True):
            yield

    def owner(self, t: torch.Tensor) -> tuple[nn.Parameter | None, str | None]:
        """(the view parameter whose memory holds every element `t` reads, or None; why
        `t`'s gradient cannot go to parameters whole, or None). The owner is the first such
        parameter (``embed.W_E`` before a tied ``unembed.W_U``); every parameter `t` reads
        counts as read by the forward (:meth:`census`). Cached by geometry."""
        if self._storages is None:
            self._storages = {}
            for i, p in enumerate(self.views):
                if p.numel():
                    self._storages.setdefault(p.untyped_storage().data_ptr(), []).append(i)
        storage = t.untyped_storage().data_ptr()
        if storage not in self._storages:  # not the weights' memory (activations, inputs)
            return None, None
        key = (storage, t.dtype, tuple(t.shape), t.stride(), t.storage_offset())
        if key not in self._owners:
            self._owners[key] = self._find_owner(t, self._storages[storage])
        found, touched, partial = self._owners[key]
        self.read |= touched
        return (None if found is None else self.views[found]), partial

    def _find_owner(self, t: torch.Tensor, candidates: list[int]
                    ) -> tuple[int | None, frozenset[int], str | None]:
        first, end = _extent(t)
        found, touched, partial = None, set(), None
        for i in candidates:
            p = self.views[i]
            lo, hi = _extent(p)
            if p.dtype != t.dtype or end <= lo or hi <= first:
                continue  # another dtype, or disjoint memory
            if lo <= first and end <= hi and p.numel() == hi - lo:
                inside = True  # p is dense: it holds every element there
            else:
                base = min(lo, first)
                mask = torch.zeros(max(hi, end) - base, dtype=torch.bool, device=t.device)
                mask.as_strided(p.shape, p.stride(), lo - base).fill_(True)
                reads = mask.as_strided(t.shape, t.stride(), first - base)
                inside = bool(reads.all())
                if not inside and bool(reads.any()):
                    partial = (f"the backend computes with a tensor {list(t.shape)} that "
                               f"holds part of {self.view_labels[i]} and memory outside it")
                elif not inside:
                    continue
            touched.add(i)
            if inside and found is None:
                found = i
        return found, frozenset(touched), partial

    def check_unedited(self) -> None:
        """CapabilityError if a detached weight was edited (it cannot change the forward)."""
        for label, p, snapshot in self.detached:
            if not torch.equal(p.detach(), snapshot):
                raise CapabilityError(
                    f"{label} was edited, but this model's backend does not use that tensor "
                    f"(the model has no such weight, or computes it on request): the edit "
                    f"would not change the forward. Rewrite the weights the model has, or use "
                    f"a hook")


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) elements of `t`'s storage that `t` reads."""
    first = t.storage_offset()
    return first, first + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) + 1


class _ThroughParameters(TorchFunctionMode):
    """A torch function mode that notes which view parameters the backend reads (the census)
    and, with `swap`, hands every torch call, instead of a backend weight (a tensor inside a
    view parameter's memory, :meth:`WeightTree.owner`), that memory seen through the
    parameter (``param.as_strided`` with the tensor's own geometry: the same values,
    differentiable with respect to the parameter). Tensors that already require gradients
    (activations) and parameters that do not pass unchanged."""

    def __init__(self, tree: WeightTree, swap: bool) -> None:
        super().__init__()
        self.tree, self.swap = tree, swap
        #: id -> (tensor, what the calls get): each tensor is looked at once per forward
        self.seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _swap(self, t: torch.Tensor) -> torch.Tensor:
        if t.requires_grad or not t.is_floating_point() or not t.numel():
            return t
        known = self.seen.get(id(t))
        if known is not None and known[0] is t:
            return known[1]
        try:
            p, partial = self.tree.owner(t)
        except (RuntimeError, NotImplementedError):  # no storage (e.g. a functional tensor)
            p, partial = None, None
        if self.swap and partial is not None:
            raise CapabilityError(
                f"gradients to the weights: {partial}, so that parameter's gradient cannot be "
                f"given to it whole. Run with torch.no_grad(), or model.requires_grad_(False) "
                f"(gradients still reach activations and hooks)")
        out = t if p is None or not p.requires_grad or not self.swap else \
            p.as_strided(t.shape, t.stride(), t.storage_offset())
        self.seen[id(t)] = (t, out)
        return out

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        args, kwargs = tree_map_only(torch.Tensor, self._swap, (args, kwargs or {}))
        return func(*args, **kwargs)


def _add(module: nn.Module, name: str, value: nn.Module | nn.Parameter | None) -> None:
    if value is None:
        return
    if isinstance(value, nn.Parameter):
        module.register_parameter(name, value)
    else:
        module.add_module(name, value)


class Embed(nn.Module):
    """``W_E`` [d_vocab, d_model]."""

    def __init__(self, tree: WeightTree) -> None:
        super().__init__()
        _add(self, "W_E", tree.param("W_E", None, "embed.W_E"))
        #: the HookedTransformer (a weak reference), and whether its ``hook_embed`` is
        #: ``W_E[tokens]`` (checked once, on a 2-token probe)
        self._root: Callable[[], Any] = lambda: None
        self._plain: bool | None = None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [batch, pos] -> [batch, pos, d_model] (TransformerLens' ``Embed``); refused
        where the model scales its embedding in the forward (a sqrt(d_model) scale)."""
        if self._plain is None:
            self._plain = _embeds_plainly(self._root(), self.W_E)
        if not self._plain:
            raise CapabilityError("embed: this model scales W_E[tokens] in its forward, so "
                                  "the embedding module cannot run alone; read "
                                  "cache['hook_embed'] (run_with_cache) instead")
        return self.W_E[tokens, :]


def _embeds_plainly(root: Any, w_e: torch.Tensor) -> bool:
    """Whether the model's ``hook_embed`` is ``W_E[tokens]`` (a 2-token probe; True where
    there is no model or no such point to compare with)."""
    if root is None:
        return True
    probe = torch.tensor([[0, 1]], device=w_e.device)
    try:
        with torch.no_grad():
            seen = root.mi_model.forward(probe, HookSpec().capture("hook_embed"))["hook_embed"]
    except MIError:
        return True
    want = w_e.detach()[probe]
    return bool(torch.allclose(seen.to(want.dtype), want, rtol=1e-5, atol=1e-6))


class PosEmbed(nn.Module):
    """``W_pos`` [n_ctx, d_model] (learned absolute positions)."""

    def __init__(self, tree: WeightTree) -> None:
        super().__init__()
        _add(self, "W_pos", tree.param("W_pos", None, "pos_embed.W_pos"))

    def forward(self, tokens: torch.Tensor, past_kv_pos_offset: int = 0,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [batch, pos] -> [batch, pos, d_model]; with a mask, positions count real
        tokens and pads get zeros (TransformerLens' ``PosEmbed``)."""
        n = tokens.size(-1)
        if attention_mask is None:
            rows = self.W_pos[past_kv_pos_offset:past_kv_pos_offset + n, :]
            return rows.expand(tokens.size(0), -1, -1).clone()
        from mi_core.tl.utils import get_offset_position_ids
        rows = self.W_pos[get_offset_position_ids(past_kv_pos_offset, attention_mask)]
        pad = ~attention_mask.bool()[:, past_kv_pos_offset:past_kv_pos_offset + n, None]
        return torch.where(pad, 0, rows).clone()


class Unembed(nn.Module):
    """``W_U`` [d_model, d_vocab], ``b_U`` [d_vocab]; ``hook_in`` (the final norm's output)
    and ``hook_out`` (the logits), as TransformerLens 3."""

    def __init__(self, tree: WeightTree, d_vocab: int, point: Callable[[str], HookPoint]
                 ) -> None:
        super().__init__()
        _add(self, "W_U", tree.param("W_U", None, "unembed.W_U"))
        _add(self, "b_U", tree.param("b_U", None, "unembed.b_U", zeros=(d_vocab,)))
        self.hook_in = point("unembed.hook_in")
        self.hook_out = point("unembed.hook_out")

    def forward(self, residual: torch.Tensor) -> torch.Tensor:
        """[batch, pos, d_model] -> logits [batch, pos, d_vocab], through ``hook_in`` and
        ``hook_out`` (TransformerLens' ``Unembed``)."""
        residual = self.hook_in(residual)
        return self.hook_out(torch.nn.functional.linear(residual, self.W_U.T, self.b_U))


class Norm(nn.Module):
    """A norm's gain ``w`` and bias ``b`` (none once folded) and its two hook points."""

    def __init__(self, tree: WeightTree, prefix: str, layer: int | None, points: set[str],
                 folded: bool, label: str, point: Callable[[str], HookPoint]) -> None:
        super().__init__()
        if not folded:
            for part in ("w", "b"):
                _add(self, part, tree.param(f"{prefix}.{part}", layer, f"{label}.{part}"))
        for suffix in NORM_POINTS:
            if f"{label}.{suffix}" in points:
                self.add_module(suffix, point(f"{label}.{suffix}"))
        #: set by :func:`build` from the config: whether the norm centres (LayerNorm), its eps
        self.centres, self.eps = True, 1e-5
        self._tree, self._label = tree, label

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., d_model] -> normalized (then scaled and shifted unless folded), through
        ``hook_scale`` and ``hook_normalized``: TransformerLens' ``LayerNorm`` /
        ``LayerNormPre`` / ``RMSNorm`` / ``RMSNormPre``, chosen by the config."""
        mine = [p for p in self._parameters.values() if p is not None]
        if any(p is q for _, q, _ in self._tree.detached for p in mine):
            raise CapabilityError(f"{self._label}: the stored weight is not the gain the model "
                                  f"multiplies by (derived at load, e.g. 1 + w), so the norm "
                                  f"cannot run alone; run the model")
        dtype = x.dtype
        if dtype not in (torch.float32, torch.float64):
            x = x.float()
        if self.centres:
            x = x - x.mean(-1, keepdim=True)
        scale = (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()
        scale = self.hook_scale(scale) if hasattr(self, "hook_scale") else scale
        x = x / scale
        x = (self.hook_normalized(x) if hasattr(self, "hook_normalized") else x).to(dtype)
        if "w" in self._parameters:
            x = x * self.w
        return x + self.b if "b" in self._parameters and self.centres else x


class Attention(nn.Module):
    """``W_Q`` [n_heads, d_model, d_head], ``W_O``, ``b_Q``, ``b_O``, ``W_K``, ``W_V``, ``b_K``,
    ``b_V``, then the hook points (TransformerLens' ``Attention``)."""

    kv_prefix = ""

    def __init__(self, tree: WeightTree, layer: int, points: set[str], dims: dict[str, int],
                 point: Callable[[str], HookPoint]) -> None:
        super().__init__()
        p = f"blocks.{layer}.attn"
        h, kv, dh, d = dims["n_heads"], dims["n_kv"], dims["d_head"], dims["d_model"]
        for name, zeros in (("W_Q", None), ("W_O", None), ("b_Q", (h, dh)), ("b_O", (d,)),
                            ("W_K", None), ("W_V", None), ("b_K", (kv, dh)), ("b_V", (kv, dh))):
            if name[2] in "KV":  # per KV head on grouped-query models
                name = self.kv_prefix + name
            _add(self, name, tree.param(name, layer, f"{p}.{name}", zeros=zeros))
        for suffix in ATTN_POINTS:
            if f"{p}.{suffix}" in points:
                self.add_module(suffix, point(f"{p}.{suffix}"))
        #: TransformerLens' attributes (``attn_scale`` is set by :func:`build` from the config)
        self.layer_id, self.attn_type, self.attn_scale = layer, "global", 1.0

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise CapabilityError("calling an attention module on its own is not supported (the "
                              "kernel computes attention inside the model's forward): run the "
                              "block (model.blocks[i](resid_pre)) or the model with hooks")

    @property
    def OV(self) -> Any:
        """W_V W_O per head: [n_heads, d_model, d_model], factored."""
        from mi_core.tl.factored_matrix import FactoredMatrix
        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def QK(self) -> Any:
        """W_Q W_K^T per head: [n_heads, d_model, d_model], factored."""
        from mi_core.tl.factored_matrix import FactoredMatrix
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))


class GroupedQueryAttention(Attention):
    """Grouped-query attention: ``_W_K`` / ``_W_V`` / ``_b_K`` / ``_b_V`` per KV head are the
    parameters; ``W_K`` ... repeat them per query head (TransformerLens'
    ``GroupedQueryAttention``)."""

    kv_prefix = "_"

    def __init__(self, tree: WeightTree, layer: int, points: set[str], dims: dict[str, int],
                 point: Callable[[str], HookPoint]) -> None:
        super().__init__(tree, layer, points, dims, point)
        self.repeat_kv_heads = dims["n_heads"] // dims["n_kv"]

    def _repeated(self, name: str) -> torch.Tensor:
        return torch.repeat_interleave(self._parameters["_" + name], self.repeat_kv_heads, dim=0)

    W_K = property(lambda self: self._repeated("W_K"), doc="[n_heads, d_model, d_head]")
    W_V = property(lambda self: self._repeated("W_V"), doc="[n_heads, d_model, d_head]")
    b_K = property(lambda self: self._repeated("b_K"), doc="[n_heads, d_head]")
    b_V = property(lambda self: self._repeated("b_V"), doc="[n_heads, d_head]")


class MLP(nn.Module):
    """``W_in`` [d_model, d_mlp] (a gated MLP's up projection), ``W_gate``, ``b_in``,
    ``W_out`` [d_mlp, d_model], ``b_out``, in TransformerLens' order, and the hook points."""

    def __init__(self, tree: WeightTree, layer: int, points: set[str], gated: bool,
                 d_mlp: int | None, d_model: int, point: Callable[[str], HookPoint]) -> None:
        super().__init__()
        p = f"blocks.{layer}.mlp"
        if d_mlp is not None:
            order = (["W_in", "W_out", "W_gate", "b_in", "b_out"] if gated
                     else ["W_in", "b_in", "W_out", "b_out"])
            zeros = {"b_in": (d_mlp,), "b_out": (d_model,)}
            for name in order:
                _add(self, name, tree.param(name, layer, f"{p}.{name}", zeros=zeros.get(name)))
        for suffix in MLP_POINTS:
            if f"{p}.{suffix}" in points:
                self.add_module(suffix, point(f"{p}.{suffix}"))
        #: set by :func:`build` from the config (``cfg.act_fn``) and the HookedTransformer (a
        #: weak reference); whether the model's ``mlp.hook_post`` is this formula's (checked
        #: once, on a 2-token probe)
        self.act_fn_name: str | None = None
        self.layer, self._root, self._plain = layer, (lambda: None), None

    @property
    def act_fn(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The activation function (TransformerLens' ``mlp.act_fn``)."""
        return _activation(self.act_fn_name)

    @property
    def d_mlp(self) -> int:
        return int(self.W_out.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, pos, d_model] -> [batch, pos, d_model] through ``hook_pre`` (and
        ``hook_pre_linear``) and ``hook_post``: TransformerLens' ``MLP`` / ``GatedMLP``;
        refused where the model's MLP computes otherwise (a clamp, activation sparsity)."""
        if self._plain is None:
            self._plain = self._agrees_with_model()
        if not self._plain:
            raise CapabilityError(f"blocks.{self.layer}.mlp: this model's MLP is not "
                                  f"TransformerLens' formula, so it cannot run alone; read "
                                  f"cache['mlp_out', {self.layer}] (run_with_cache) instead")
        return self._compute(x, lambda name, v: getattr(self, name)(v)
                             if hasattr(self, name) else v)

    def _compute(self, x: torch.Tensor, hook: Callable[[str, torch.Tensor], torch.Tensor]
                 ) -> torch.Tensor:
        act = _activation(self.act_fn_name)
        if "W_gate" in self._parameters:
            pre = hook("hook_pre", x @ self.W_gate)
            post = hook("hook_post", act(pre) * hook("hook_pre_linear", x @ self.W_in)
                        + self.b_in)
        else:
            post = hook("hook_post", act(hook("hook_pre", x @ self.W_in + self.b_in)))
        return post @ self.W_out + self.b_out

    def _agrees_with_model(self) -> bool:
        """The formula's ``hook_post`` from the model's MLP input equals the model's, on a
        2-token probe (True where there is no model or no such point to compare with)."""
        root, p = self._root(), f"blocks.{self.layer}.mlp."
        if root is None:
            return True
        probe = torch.tensor([[0, 1]], device=self.W_out.device)
        try:
            with torch.no_grad():
                seen = root.mi_model.forward(probe, HookSpec().capture(p + "hook_in").capture(
                    p + "hook_post"))
                mine: dict[str, torch.Tensor] = {}
                self._compute(seen[p + "hook_in"],
                              lambda name, v: mine.setdefault(name, v))
        except MIError:
            return True
        want = seen[p + "hook_post"]
        return bool(torch.allclose(mine["hook_post"].to(want.dtype), want, rtol=1e-4,
                                   atol=1e-5 * float(want.abs().max()) + 1e-6))


def _activation(name: str | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """TransformerLens' activation function of that name; others refused by name."""
    import torch.nn.functional as F

    from mi_core.tl import utils
    table = {"gelu_new": utils.gelu_new, "gelu_fast": utils.gelu_fast, "silu": F.silu,
             "relu": F.relu, "gelu": F.gelu,
             "gelu_pytorch_tanh": lambda t: F.gelu(t, approximate="tanh")}
    if name not in table:
        raise CapabilityError(f"calling an MLP module with act_fn={name!r} is not supported "
                              f"(supported: {sorted(table)}); run the model instead")
    return table[name]


class TransformerBlock(nn.Module):
    """ln1, ln2, attn, mlp, then the block's hook points (TransformerLens' order)."""

    def __init__(self, tree: WeightTree, layer: int, points: set[str], dims: dict[str, int],
                 point: Callable[[str], HookPoint], *, folded: bool, gated: bool,
                 d_mlp: int | None) -> None:
        super().__init__()
        b = f"blocks.{layer}"
        for ln in ("ln1", "ln2"):
            if any(f"{b}.{ln}.{s}" in points for s in NORM_POINTS):
                self.add_module(ln, Norm(tree, ln, layer, points, folded, f"{b}.{ln}", point))
        kind = GroupedQueryAttention if dims["n_kv"] != dims["n_heads"] else Attention
        self.attn = kind(tree, layer, points, dims, point)
        if any(n.startswith(f"{b}.mlp.") for n in points) or d_mlp is not None:
            self.mlp = MLP(tree, layer, points, gated, d_mlp, dims["d_model"], point)
        for suffix in BLOCK_POINTS:
            if f"{b}.{suffix}" in points:
                self.add_module(suffix, point(f"{b}.{suffix}"))
        self.layer = layer
        #: the HookedTransformer that runs this block (a weak reference: no module cycle)
        self._root: Callable[[], Any] = lambda: None

    def forward(self, resid_pre: torch.Tensor, shortformer_pos_embed: Any = None,
                past_kv_cache_entry: Any = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """resid_pre [batch, pos, d_model] -> resid_post: the model run from this block to the
        next (``start_at_layer`` / ``stop_at_layer``), with its hooks, positions from 0."""
        root = self._root()
        if root is None or shortformer_pos_embed is not None or past_kv_cache_entry is not None:
            raise CapabilityError("a block runs only inside its HookedTransformer, without "
                                  "shortformer_pos_embed / past_kv_cache_entry")
        return root(resid_pre, start_at_layer=self.layer, stop_at_layer=self.layer + 1,
                    attention_mask=attention_mask)


class Container(nn.Module):
    """A plain node of the tree for points TransformerLens has no component for (q/k norms,
    post-norms, mixture-of-experts routers and experts)."""


def add_point(root: nn.Module, name: str, point: Callable[[str], HookPoint]) -> None:
    """Create ``root.<name>`` as a HookPoint, with plain containers for missing parents."""
    *parents, leaf = name.split(".")
    node = root
    for part in parents:
        child = node._modules.get(part)
        if child is None:
            child = Container()
            node.add_module(part, child)
        node = child
    if leaf not in node._modules:
        node.add_module(leaf, point(name))


def tl_point_names(model: MIModel) -> list[str]:
    """The kernel's points TransformerLens has (hidden ones dropped), plus ``unembed.hook_in``
    / ``unembed.hook_out``, in the kernel's execution order."""
    names = [p.name for p in model.hook_points()
             if not (p.layer is not None and p.suffix in HIDDEN_SUFFIXES)]
    return names + ["unembed.hook_in", "unembed.hook_out"]


def build(root: nn.Module, model: MIModel, cfg: Any, tree: WeightTree,
          reuse: dict[str, HookPoint] | None = None) -> None:
    """Give `root` TransformerLens' modules for `model` (weights, hook points); hook points
    in `reuse` (a rebuild after weight processing) are kept, with their hooks."""
    reuse = reuse or {}
    point: Callable[[str], HookPoint] = lambda name: reuse.get(name) or HookPoint()  # noqa: E731
    names = tl_point_names(model)
    points = set(names)
    folded = str(cfg.normalization_type).endswith("Pre")
    dims = {"n_heads": cfg.n_heads, "n_kv": cfg.n_key_value_heads or cfg.n_heads,
            "d_head": cfg.d_head, "d_model": cfg.d_model}
    root.embed = Embed(tree)
    root.hook_embed = point("hook_embed")
    if cfg.positional_embedding_type == "standard":
        root.pos_embed = PosEmbed(tree)
        if "hook_pos_embed" in points:
            root.hook_pos_embed = point("hook_pos_embed")
    root.blocks = nn.ModuleList(
        TransformerBlock(tree, i, points, dims, point, folded=folded, gated=cfg.gated_mlp,
                         d_mlp=cfg.d_mlp) for i in range(cfg.n_layers))
    if any(n.startswith("ln_final.") for n in points):
        root.ln_final = Norm(tree, "ln_final", None, points, folded, "ln_final", point)
    root.unembed = Unembed(tree, cfg.d_vocab, point)
    for block in root.blocks:
        block._root = weakref.ref(root)
    root.embed._root = weakref.ref(root)
    for block in root.blocks:
        if isinstance(getattr(block, "mlp", None), MLP):
            block.mlp._root = weakref.ref(root)
    for module in root.modules():  # what the modules' forwards read from the config
        if isinstance(module, (Embed, PosEmbed, Unembed, Norm, Attention, MLP,
                               TransformerBlock)):
            module.cfg = cfg  # each TransformerLens component holds the config
        if isinstance(module, Attention):  # TransformerLens' attn_scale: sqrt(d_head), ...
            scale = float(cfg.attn_scale) if cfg.use_attn_scale else 1.0
            inverse = getattr(cfg, "scale_attn_by_inverse_layer_idx", False)
            module.attn_scale = scale * (module.layer_id + 1) if inverse else scale
        if isinstance(module, Norm):
            module.centres = str(cfg.normalization_type).startswith("LN")
            module.eps = cfg.eps
        elif isinstance(module, MLP):
            module.act_fn_name = cfg.act_fn
    present = {n for n, m in root.named_modules() if isinstance(m, HookPoint)}
    for name in names:
        if name not in present:
            add_point(root, name, point)

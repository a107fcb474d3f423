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
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn

from mi_core import CapabilityError, MIError, MIModel
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
        p = nn.Parameter(w.detach(), requires_grad=False)
        again = self.model.tl_weight(name, layer)
        if again.data_ptr() != w.data_ptr():  # computed on request: edits would not reach it
            self.detached.append((label, p, w.detach().clone()))
        return p

    def check_unedited(self) -> None:
        """CapabilityError if a detached weight was edited (it cannot change the forward)."""
        for label, p, snapshot in self.detached:
            if not torch.equal(p.detach(), snapshot):
                raise CapabilityError(
                    f"{label} was edited, but this model's backend does not use that tensor "
                    f"(the model has no such weight, or computes it on request): the edit "
                    f"would not change the forward. Rewrite the weights the model has, or use "
                    f"a hook")


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


class PosEmbed(nn.Module):
    """``W_pos`` [n_ctx, d_model] (learned absolute positions)."""

    def __init__(self, tree: WeightTree) -> None:
        super().__init__()
        _add(self, "W_pos", tree.param("W_pos", None, "pos_embed.W_pos"))


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
    present = {n for n, m in root.named_modules() if isinstance(m, HookPoint)}
    for name in names:
        if name not in present:
            add_point(root, name, point)

"""`ActivationCache`: a :class:`HookCache` with TransformerLens' shorthand keys and methods.

``model.run_with_cache`` returns one. The methods keep TransformerLens' signatures and
semantics (``transformer_lens.ActivationCache``), so a TL notebook's analysis code runs
unchanged: ``cache["resid_pre", 3]``, ``cache.decompose_resid(apply_ln=True,
return_labels=True)``, ``cache.logit_attrs(stack, tokens, incorrect_tokens)``, ...

As in TransformerLens, ``apply_ln_to_stack`` divides by the *cached* norm scale (and centres
for LayerNorm) but does not multiply by the norm's gain: on a model whose norms are folded
(``model.process_weights(fold_ln=True)``, TransformerLens' default) that is the whole norm; on
an unfolded model the gain lives in the next layer's weights. The free functions of
:mod:`mi_core.interp.decomposition` apply the full affine norm instead (a different, documented
convention); both gather components through the same helpers here.

The cache holds a reference to the model (for W_O, W_out, W_U and the final norm), as
TransformerLens' does.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Union

import torch

from mi_core import HookCache, HookError, HookPoint, MIError, MIModel
from mi_core.plugin import hook_name, require_residual_sum
from mi_core.tl.errors import TLHookError, TLHookTypeError, TLInputError, TLValueError

SliceInput = Union[None, int, tuple, slice, list, torch.Tensor, "Slice"]

_LAYER_TYPE_ALIAS = {"a": "attn", "m": "mlp", "b": "", "block": "", "blocks": "",
                     "attention": "attn"}
_ACT_NAME_ALIAS = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q",
                   "value": "v", "mlp_pre": "pre", "mlp_mid": "mid", "mlp_post": "post"}
_ATTN_NAMES = {"k", "v", "q", "z", "rot_k", "rot_q", "result", "pattern", "attn_scores"}
_MLP_NAMES = {"pre", "post", "mid", "pre_linear"}


def get_act_name(name: str, layer: int | str | None = None, layer_type: str | None = None) -> str:
    """TransformerLens' ``utils.get_act_name``: shorthand -> full hook name.

    ``get_act_name("resid_pre", 3) == "blocks.3.hook_resid_pre"``, ``("pattern", 5)`` ->
    ``blocks.5.attn.hook_pattern``, ``("scale", 4, "ln1")`` -> ``blocks.4.ln1.hook_scale``,
    ``"k6"`` -> ``blocks.6.attn.hook_k``, ``"embed"`` -> ``hook_embed``; full names pass through.
    """
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    m = re.match(r"([a-z]+)(\d+)([a-z]?.*)", name)
    if m is not None:
        name, layer, layer_type = m.group(1), m.group(2), m.group(3)
    name = _ACT_NAME_ALIAS.get(name, name)
    full = f"blocks.{layer}." if layer is not None else ""
    if name in _ATTN_NAMES:
        layer_type = "attn"
    elif name in _MLP_NAMES:
        layer_type = "mlp"
    elif layer_type in _LAYER_TYPE_ALIAS:
        layer_type = _LAYER_TYPE_ALIAS[layer_type]
    if layer_type:
        full += f"{layer_type}."
    full += f"hook_{name}"
    if name in ("scale", "normalized") and layer is None:
        full = f"ln_final.{full}"
    return full


class Slice:
    """TransformerLens' ``utils.Slice``: None (identity), an int (drops the axis), a tuple
    (``slice(*t)``), a slice, or a list / array / tensor of indices."""

    def __init__(self, input_slice: SliceInput = None) -> None:
        if isinstance(input_slice, Slice):
            self.slice, self.mode = input_slice.slice, input_slice.mode
        elif isinstance(input_slice, tuple):
            self.slice, self.mode = slice(*input_slice), "slice"
        elif isinstance(input_slice, int) and not isinstance(input_slice, bool):
            self.slice, self.mode = int(input_slice), "int"
        elif isinstance(input_slice, slice):
            self.slice, self.mode = input_slice, "slice"
        elif isinstance(input_slice, (list, torch.Tensor)) or hasattr(input_slice, "__array__"):
            # a list / tensor / numpy array of indices (numpy is not a dependency of the core)
            self.slice = torch.as_tensor(input_slice, dtype=torch.long).cpu()
            self.mode = "array"
        elif input_slice is None:
            self.slice, self.mode = slice(None), "identity"
        elif hasattr(input_slice, "slice") and hasattr(input_slice, "mode"):  # TL's own Slice
            self.slice, self.mode = input_slice.slice, input_slice.mode
        else:  # a ValueError, as TransformerLens'
            raise TLValueError(f"pos_slice / batch_slice: cannot slice with {input_slice!r} (use "
                               f"None, an int, a tuple, a slice or a list of indices)")

    def apply(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        idx: list[Any] = [slice(None)] * tensor.ndim
        idx[dim] = self.slice
        return tensor[tuple(idx)]

    def indices(self, max_ctx: int | None = None) -> Any:
        """The indices this slice selects on an axis of `max_ctx` (a numpy int64 array; an
        int slice gives ``[i]`` without `max_ctx`), as TransformerLens'."""
        import numpy as np
        if self.mode == "int":
            return np.array([self.slice], dtype=np.int64)
        if max_ctx is None:
            raise TLValueError("max_ctx must be specified if slice is not an integer")
        sl = self.slice.numpy() if isinstance(self.slice, torch.Tensor) else self.slice
        return np.arange(max_ctx, dtype=np.int64)[sl]

    @classmethod
    def unwrap(cls, slice_input: Any) -> "Slice":
        """`slice_input` as a Slice; an int becomes ``[i]`` (keeps its axis), as
        TransformerLens'."""
        if isinstance(slice_input, Slice):
            return slice_input
        return cls([slice_input] if isinstance(slice_input, int) else slice_input)

    def __repr__(self) -> str:  # TransformerLens' words, which a printed Slice shows
        sl = self.slice.numpy() if isinstance(self.slice, torch.Tensor) else self.slice
        return f"Slice: {sl} Mode: {self.mode} "


def _slice(s: SliceInput) -> Slice:
    return s if isinstance(s, Slice) else Slice(s)


#: a batch size no point's other axes have: a declared shape starting with it has a batch axis
_PROBE_BATCH = 100_003


class ActivationCache(HookCache):
    """HookCache + TransformerLens' ActivationCache interface (see the module docstring)."""

    def __init__(self, output: Any, captures: Any = None, model: Any = None,
                 has_batch_dim: bool = True, **extra: Any) -> None:
        """``ActivationCache(cache_dict, model, has_batch_dim=True)`` as in TransformerLens
        (a dict of activations by hook name, no output), or ``(output, captures, model)``."""
        if isinstance(output, dict):  # TransformerLens' signature: (cache_dict, model, ...)
            if model is not None:
                raise HookError("ActivationCache(cache_dict, model): model given twice")
            output, captures, model = None, output, captures
        super().__init__(output, captures, **extra)
        self.model = model
        self.has_batch_dim = has_batch_dim

    @property
    def has_embed(self) -> bool:
        """Whether ``hook_embed`` is cached (TransformerLens' attribute)."""
        return "hook_embed" in self._captures

    @property
    def has_pos_embed(self) -> bool:
        """Whether ``hook_pos_embed`` is cached (TransformerLens' attribute)."""
        return "hook_pos_embed" in self._captures

    @classmethod
    def of(cls, cache: HookCache, model: MIModel) -> "ActivationCache":
        """Wrap `cache` without copying (same captures dict, extras and gradients)."""
        if isinstance(cache, ActivationCache) and cache.model is model:
            return cache
        out = cls.__new__(cls)
        out.__dict__.update(cache.__dict__)
        out.model, out.has_batch_dim = model, True
        return out

    # -- keys ---------------------------------------------------------------------------
    @property
    def cache_dict(self) -> dict[str, torch.Tensor]:
        """The captures by full name (TransformerLens' attribute)."""
        return self._captures

    def _name(self, key: Any) -> str:
        if isinstance(key, HookPoint):
            return key.name
        if isinstance(key, str):
            return hook_name(key if key in self._captures else get_act_name(key))
        if isinstance(key, tuple) and key and isinstance(key[0], str):
            parts = list(key)
            if len(parts) > 1 and isinstance(parts[1], int) and parts[1] < 0:
                parts[1] = self._n_layers() + parts[1]
            return hook_name(get_act_name(*parts))
        raise TLHookTypeError(f"cache key must be a hook name, a HookPoint or a (name, "
                              f"layer[, type]) tuple, got {key!r}")  # TransformerLens: TypeError

    def __getitem__(self, key: Any) -> torch.Tensor:
        """The activation at `key`; a missing one raises an :class:`mi_core.HookError` that is
        also the ``KeyError`` TransformerLens' cache (a dict lookup) raises."""
        name = self._name(key)
        try:
            return self._captures[name]
        except KeyError:
            pass
        return self.require(name)

    def require(self, point: Any) -> torch.Tensor:
        """HookCache's lookup (its message names what was captured), raising the
        ``KeyError`` kind TransformerLens' methods raise for a missing activation too."""
        try:
            return super().require(point)
        except HookError as err:
            raise TLHookError(str(err)) from None

    def __contains__(self, key: object) -> bool:
        try:
            return self._name(key) in self._captures
        except HookError:
            return False

    def toggle_autodiff(self, mode: bool = False) -> None:
        """TransformerLens' switch of torch's global grad mode (``torch.set_grad_enabled``)."""
        torch.set_grad_enabled(mode)

    def values(self) -> list[torch.Tensor]:
        return list(self._captures.values())

    def to(self, device: str | torch.device) -> "ActivationCache":
        self._captures = {k: v.to(device) for k, v in self._captures.items()}
        return self

    def _batched(self, name: str, v: torch.Tensor) -> bool:
        """Whether capture `name` has a batch axis: every point but those the backend
        declares without one (e.g. gpt-oss's ``attn.hook_sinks`` [heads])."""
        if not v.ndim:
            return False
        shape_of = getattr(getattr(self.model, "backend", None), "hook_shape", None)
        if shape_of is None:
            return True
        try:
            shape = shape_of(name, _PROBE_BATCH, 1)
        except MIError:
            return True
        return shape is None or (len(shape) > 0 and shape[0] == _PROBE_BATCH)

    def remove_batch_dim(self) -> "ActivationCache":
        """Drop the batch axis of a batch-1 cache (TransformerLens semantics)."""
        if self.has_batch_dim:
            batched = {k for k, v in self._captures.items() if self._batched(k, v)}
            sizes = {self._captures[k].shape[0] for k in batched}
            if sizes - {1}:
                raise TLInputError(f"cannot remove the batch dimension of a batch of "
                                   f"{sorted(sizes)}")
            self._captures = {k: (v[0] if k in batched else v) for k, v in self._captures.items()}
            self.has_batch_dim = False
        return self

    def apply_slice_to_batch_dim(self, batch_slice: SliceInput) -> "ActivationCache":
        s = _slice(batch_slice)
        caps = {k: s.apply(v, 0) if self._batched(k, v) else v
                for k, v in self._captures.items()}
        output = None if self.output is None else s.apply(self.output, 0)
        out = ActivationCache(output, caps, self.model,
                              self.has_batch_dim and s.mode != "int", **self.extra)
        return out

    def __repr__(self) -> str:
        return f"ActivationCache with keys {self.keys()}"

    # -- model facts ----------------------------------------------------------------------
    def _need_model(self) -> MIModel:
        """The MIModel behind `model` (a HookedTransformer wraps one: ``mi_model``)."""
        if self.model is None:
            raise MIError("this ActivationCache has no model (build it with "
                          "ActivationCache.of(cache, model) or model.run_with_cache)")
        return getattr(self.model, "mi_model", self.model)

    def _n_layers(self) -> int:
        return self._need_model().num_layers

    def _layer(self, layer: int | None) -> int:
        n = self._n_layers()
        if layer is None or layer == -1:
            return n
        if not 0 <= layer <= n:
            # a KeyError, as TransformerLens' lookup of the missing point
            raise TLHookError(f"layer {layer} out of range; valid: 0..{n} (n_layers means the "
                              f"unembedding), or -1 / None")
        return int(layer)

    def _attn_only(self) -> bool:
        """No layer has an MLP (a hybrid's first layer may lack one that later layers have:
        mixer-only and MLP-only layers)."""
        model = self._need_model()
        return not any(model.has_hook_point(HookPoint.mlp_out(i))
                       for i in range(model.num_layers))

    # -- layer norm ------------------------------------------------------------------------
    def _cached_ln_scale(self, layer: int, mlp_input: bool, pos_slice: Slice,
                         batch_slice: Slice | None = None) -> torch.Tensor:
        key = "ln_final.hook_scale" if layer == self._n_layers() else \
            f"blocks.{layer}.ln{2 if mlp_input else 1}.hook_scale"
        if key not in self._captures:
            raise HookError(f"apply_ln needs the cached norm scale {key!r}; capture it "
                            f"(run_with_cache captures it by default)")
        scale = pos_slice.apply(self._captures[key], dim=-2)
        if batch_slice is not None and self.has_batch_dim:
            scale = batch_slice.apply(scale)
        return scale

    def apply_ln_to_stack(self, residual_stack: torch.Tensor, layer: int | None = None,
                          mlp_input: bool = False, pos_slice: SliceInput = None,
                          batch_slice: SliceInput = None, has_batch_dim: bool = True,
                          recompute_ln: bool = False) -> torch.Tensor:
        """Each component as that layer's norm treats it: centred (LayerNorm) and divided by
        the cached scale of `layer` (n_layers / None / -1: the final norm; `mlp_input`: ln2).
        [n, *batch_and_pos, d_model] -> same. `recompute_ln` (final layer only): the full final
        norm, with statistics recomputed per component (the logit lens)."""
        model = self._need_model()
        ps, bs = _slice(pos_slice), _slice(batch_slice)
        layer = self._layer(layer)
        if has_batch_dim:
            residual_stack = bs.apply(residual_stack, dim=1)
        if recompute_ln and layer == self._n_layers():
            return model.backend.final_norm(residual_stack)
        if norm_centres(model):
            residual_stack = residual_stack - residual_stack.mean(dim=-1, keepdim=True)
        return residual_stack / self._cached_ln_scale(layer, mlp_input, ps, bs)

    # -- residual stream ---------------------------------------------------------------------
    def accumulated_resid(self, layer: int | None = None, incl_mid: bool = False,
                          apply_ln: bool = False, pos_slice: SliceInput = None,
                          mlp_input: bool = False, return_labels: bool = False
                          ) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
        """The residual stream entering each layer up to `layer` (labels ``"{l}_pre"``,
        ``"{l}_mid"`` with `incl_mid`, ``"final_post"``): [n, *batch_and_pos, d_model]."""
        ps = _slice(pos_slice)
        layer = self._layer(layer)
        n = self._n_layers()
        items: list[tuple[HookPoint, str]] = []
        for i in range(layer + 1):
            if i == n:
                items.append((HookPoint.resid_post(n - 1), "final_post"))
                continue
            items.append((HookPoint.resid_pre(i), f"{i}_pre"))
            if (incl_mid and i < layer) or (mlp_input and i == layer):
                items.append((HookPoint.resid_mid(i), f"{i}_mid"))
        stack, labels = stack_points(self, items, ps)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=ps, mlp_input=mlp_input,
                                           has_batch_dim=self.has_batch_dim,
                                           recompute_ln=layer == n)
        return (stack, labels) if return_labels else stack

    def decompose_resid(self, layer: int | None = None, mlp_input: bool = False,
                        mode: str = "all", apply_ln: bool = False, pos_slice: SliceInput = None,
                        incl_embeds: bool = True, return_labels: bool = False
                        ) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
        """The residual entering `layer` split into "embed" (and "pos_embed"),
        ``"{l}_attn_out"`` and ``"{l}_mlp_out"`` (`mode` "all" / "attn" / "mlp")."""
        if mode not in ("all", "attn", "mlp"):
            raise MIError(f"decompose_resid: mode must be 'all', 'attn' or 'mlp', got {mode!r}")
        if self.model is not None:
            require_residual_sum(getattr(self.model, "backend", None), "decompose_resid")
        ps = _slice(pos_slice)
        layer = self._layer(layer)
        incl_attn, incl_mlp = mode != "mlp", mode != "attn" and not self._attn_only()
        items: list[tuple[HookPoint, str]] = []
        if incl_embeds:
            # "embed" is what enters layer 0 (resid_pre 0): the embedding, unless the backend
            # transforms it before layer 0 (a norm there); split from pos_embed where the
            # model has one (as TransformerLens)
            embeds = ("hook_embed", "hook_pos_embed")
            if "hook_pos_embed" not in self._captures and "blocks.0.hook_resid_pre" in \
                    self._captures:
                embeds = ("blocks.0.hook_resid_pre",)
            items += [(HookPoint.parse(key), label) for key, label in zip(
                embeds, ("embed", "pos_embed")) if key in self._captures]
        items += layer_outputs(layer, incl_attn, incl_mlp, "_attn_out", "_mlp_out",
                               self.model.has_hook_point if self.model is not None else None)
        if mlp_input and incl_attn:  # this layer's attention and / or mixer output
            items += [(p, f"{layer}{lab}_out") for p, lab in (
                (HookPoint.attn_out(layer), "_attn"), (HookPoint.mixer_out(layer), "_mixer"))
                if (self.model.has_hook_point(p) if self.model is not None else lab == "_attn")]
        stack, labels = stack_points(self, items, ps)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=ps, mlp_input=mlp_input)
        return (stack, labels) if return_labels else stack

    # -- heads -------------------------------------------------------------------------------
    def compute_head_results(self) -> None:
        """Add ``blocks.{l}.attn.hook_result`` (z · W_O per head, [*batch, pos, heads, d_model])
        for every layer that lacks it."""
        model = self._need_model()
        for i in range(self._n_layers()):
            key = f"blocks.{i}.attn.hook_result"
            if key not in self._captures:
                self._captures[key] = head_results(model, self, i)

    def stack_head_results(self, layer: int = -1, return_labels: bool = False,
                           incl_remainder: bool = False, pos_slice: SliceInput = None,
                           apply_ln: bool = False
                           ) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
        """Every head's result in the layers before `layer`: [layer * heads (+1),
        *batch_and_pos, d_model], labels ``"L{l}H{h}"`` (and "remainder")."""
        ps = _slice(pos_slice)
        layer = self._layer(layer)
        self.compute_head_results()
        parts, labels = [], []
        for i in range(layer):
            res = ps.apply(self["result", i], dim=-3)  # [..., heads, d_model]
            parts.append(res)
            labels += [f"L{i}H{h}" for h in range(res.shape[-2])]
        if parts:
            comps = torch.cat(parts, dim=-2).movedim(-2, 0)
            if incl_remainder:
                rem = ps.apply(self["resid_post", layer - 1], dim=-2) - comps.sum(0)
                comps = torch.cat([comps, rem[None]])
                labels.append("remainder")
        elif incl_remainder:
            comps = ps.apply(self["resid_post", layer - 1], dim=-2)[None]
            labels.append("remainder")
        else:
            like = ps.apply(self["hook_embed"], dim=-2)
            comps = torch.zeros(0, *like.shape, dtype=like.dtype, device=like.device)
        if apply_ln:
            comps = self.apply_ln_to_stack(comps, layer, pos_slice=ps)
        return (comps, labels) if return_labels else comps

    def stack_activation(self, activation_name: str, layer: int = -1,
                         sublayer_type: str | None = None) -> torch.Tensor:
        """``torch.stack`` of `activation_name` over the layers before `layer`."""
        layer = self._layer(layer)
        return torch.stack([self[(activation_name, i, sublayer_type)] for i in range(layer)])

    # -- neurons -------------------------------------------------------------------------------
    def get_neuron_results(self, layer: int, neuron_slice: SliceInput = None,
                           pos_slice: SliceInput = None,
                           project_output_onto: torch.Tensor | None = None) -> torch.Tensor:
        """Each neuron's contribution ``post[..., n] * W_out[n]``: [*batch_and_pos, neurons,
        d_model] (or projected onto `project_output_onto` [d_model] / [d_model, k])."""
        ns, ps = _slice(neuron_slice), _slice(pos_slice)
        acts = ns.apply(ps.apply(self["post", layer], dim=-2), dim=-1)
        w_out = ns.apply(model_weight(self._need_model(), "W_out", layer), dim=0)
        if project_output_onto is None:
            return acts[..., None] * w_out
        proj = w_out @ project_output_onto.to(w_out.dtype)
        return acts * proj if proj.ndim == 1 else acts[..., None] * proj

    def stack_neuron_results(self, layer: int, pos_slice: SliceInput = None,
                             neuron_slice: SliceInput = None, return_labels: bool = False,
                             incl_remainder: bool = False, apply_ln: bool = False,
                             project_output_onto: torch.Tensor | None = None
                             ) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
        """Every neuron's result in the layers before `layer`: [layer * neurons (+1),
        *batch_and_pos, d_model (or projected)], labels ``"L{l}N{n}"``."""
        model = self._need_model()
        layer = self._layer(layer)
        ns, ps = _slice(neuron_slice), _slice(pos_slice)
        proj, squeeze = _projection_2d(project_output_onto)
        d_mlp = model.backend.d_mlp if hasattr(model.backend, "d_mlp") else \
            model_weight(model, "W_out", 0).shape[0]
        idx = ns.apply(torch.arange(d_mlp), 0)
        idx_list = [int(idx)] if idx.ndim == 0 else idx.tolist()
        labels = [f"L{i}N{h}" for i in range(layer) for h in idx_list]
        folded = apply_ln and proj is not None
        if folded:
            assert proj is not None
            scale = self._cached_ln_scale(layer, False, ps)
            sum_p = proj.sum(0) if norm_centres(model) else None
            parts = []
            for i in range(layer):
                w = ns.apply(model_weight(model, "W_out", i), dim=0)
                lin = w @ proj.to(w.dtype)
                if sum_p is not None:
                    lin = lin - w.mean(-1)[:, None] * sum_p[None, :]
                a = ns.apply(ps.apply(self["post", i], dim=-2), dim=-1)
                parts.append((a / scale)[..., None] * lin)
            if parts:
                comps = torch.cat(parts, dim=-2).movedim(-2, 0)
            else:
                src = ps.apply(self["hook_embed"], dim=-2)
                comps = torch.zeros(0, *src.shape[:-1], proj.shape[-1], dtype=src.dtype)
            if incl_remainder:
                resid = ps.apply(self["resid_post", layer - 1], dim=-2)
                rem = self.apply_ln_to_stack(resid[None], layer, pos_slice=ps)[0] @ proj
                if comps.shape[0]:
                    rem = rem - comps.sum(0)
                comps = torch.cat([comps, rem[None]])
                labels.append("remainder")
        else:
            per = [self.get_neuron_results(i, neuron_slice=ns, pos_slice=ps,
                                           project_output_onto=proj) for i in range(layer)]
            if per:
                comps = torch.cat(per, dim=-2).movedim(-2, 0)
                if incl_remainder:
                    full = ps.apply(self["resid_post", layer - 1], dim=-2)
                    if proj is not None:
                        full = full @ proj
                    comps = torch.cat([comps, (full - comps.sum(0))[None]])
                    labels.append("remainder")
            elif incl_remainder:
                full = ps.apply(self["resid_post", layer - 1], dim=-2)
                comps = (full @ proj if proj is not None else full)[None]
                labels.append("remainder")
            else:
                src = ps.apply(self["hook_embed"], dim=-2)
                if proj is not None:
                    src = src @ proj
                comps = torch.zeros(0, *src.shape, dtype=src.dtype)
            if apply_ln:
                comps = self.apply_ln_to_stack(comps, layer, pos_slice=ps)
        if squeeze:
            comps = comps.squeeze(-1)
        return (comps, labels) if return_labels else comps

    # -- logits ------------------------------------------------------------------------------
    def logit_attrs(self, residual_stack: torch.Tensor, tokens: Any,
                    incorrect_tokens: Any = None, pos_slice: SliceInput = None,
                    batch_slice: SliceInput = None, has_batch_dim: bool = True) -> torch.Tensor:
        """How much each component pushes `tokens`' logits (minus `incorrect_tokens`'):
        ``apply_ln_to_stack(stack) · W_U[:, tokens]`` -> [n, *batch_and_pos]."""
        model = self._need_model()
        dirs = model.tokens_to_residual_directions(tokens)
        if incorrect_tokens is not None:
            shape = _token_shape(model, tokens)
            other = _token_shape(model, incorrect_tokens)
            if shape != other:
                raise MIError(f"tokens and incorrect_tokens must have the same shape "
                              f"(tokens {list(shape)}, incorrect_tokens {list(other)})")
            dirs = dirs - model.tokens_to_residual_directions(incorrect_tokens)
        scaled = self.apply_ln_to_stack(residual_stack, layer=-1, pos_slice=pos_slice,
                                        batch_slice=batch_slice, has_batch_dim=has_batch_dim)
        return (scaled * dirs.to(scaled.dtype)).sum(dim=-1)

    def get_full_resid_decomposition(self, layer: int | None = None, mlp_input: bool = False,
                                     expand_neurons: bool = True, apply_ln: bool = False,
                                     pos_slice: SliceInput = None, return_labels: bool = False,
                                     project_output_onto: torch.Tensor | None = None
                                     ) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
        """Every head, every neuron (or MLP layer), embed (pos_embed) and the accumulated
        biases ("bias") feeding `layer`, in TransformerLens' order."""
        model = self._need_model()
        require_residual_sum(getattr(model, "backend", None), "get_full_resid_decomposition")
        layer = self._layer(layer)
        ps = _slice(pos_slice)
        proj, squeeze = _projection_2d(project_output_onto)
        folded = apply_ln and proj is not None

        def ln_proj(stack: torch.Tensor) -> torch.Tensor:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=ps, mlp_input=mlp_input)
            return stack @ proj if proj is not None else stack

        def finish(stack: torch.Tensor) -> torch.Tensor:
            if folded:
                return ln_proj(stack)
            return stack @ proj if proj is not None else stack

        heads, labels = self.stack_head_results(layer + (1 if mlp_input else 0), pos_slice=ps,
                                                return_labels=True)
        comps = [finish(heads)]
        if not self._attn_only() and layer > 0:
            if expand_neurons:
                neurons, nl = self.stack_neuron_results(layer, pos_slice=ps, return_labels=True,
                                                        apply_ln=folded, project_output_onto=proj)
                comps.append(neurons)
            else:
                neurons, nl = self.decompose_resid(layer, mlp_input=mlp_input, pos_slice=ps,
                                                   incl_embeds=False, mode="mlp",
                                                   return_labels=True)
                comps.append(finish(neurons))
            labels = labels + nl
        for key, label in (("hook_embed", "embed"), ("hook_pos_embed", "pos_embed")):
            if key in self._captures:
                comps.append(finish(ps.apply(self._captures[key], -2)[None]))
                labels.append(label)
        bias = accumulated_bias(model, layer, mlp_input, include_mlp_biases=expand_neurons)
        if folded:
            bias = ln_proj(bias.expand((1,) + tuple(heads.shape[1:-1]) + (bias.shape[-1],)))
        else:
            if proj is not None:
                bias = bias @ proj
            bias = bias.expand((1,) + tuple(heads.shape[1:-1]) + (bias.shape[-1],))
        comps.append(bias.to(comps[0].dtype))
        labels.append("bias")
        stack = torch.cat(comps)
        if apply_ln and not folded:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=ps, mlp_input=mlp_input)
        if squeeze:
            stack = stack.squeeze(-1)
        return (stack, labels) if return_labels else stack


# -- helpers shared with mi_core.interp.decomposition ------------------------------------------
def stack_points(cache: HookCache, items: list[tuple[HookPoint, str]], pos_slice: SliceInput = None
                 ) -> tuple[torch.Tensor, list[str]]:
    """The captured tensors at `items`' points, pos-sliced and stacked: ([n, ...], labels)."""
    ps = _slice(pos_slice)
    return (torch.stack([ps.apply(cache.require(hp), dim=-2) for hp, _ in items]),
            [label for _, label in items])


def layer_outputs(layers: int, attn: bool = True, mlp: bool = True, attn_label: str = "_attn",
                  mlp_label: str = "_mlp", has: Callable[[HookPoint], bool] | None = None
                  ) -> list[tuple[HookPoint, str]]:
    """(point, label) of each layer's attention / MLP output before `layers`, in order.

    `has(point)`: whether the model has a point. Given, a layer without ``hook_attn_out``
    but with ``hook_mixer_out`` (a recurrent mixer) contributes that ("{i}_mixer..."), a
    layer with both (a mixer beside attention) both terms, attention's first, a layer with
    neither (an MLP alone) no such term, and a layer without ``hook_mlp_out`` no MLP term."""
    out: list[tuple[HookPoint, str]] = []
    for i in range(layers):
        if attn:
            a, label = HookPoint.attn_out(i), f"{i}{attn_label}"
            mixer = (HookPoint.mixer_out(i), f"{i}{attn_label.replace('attn', 'mixer')}")
            if has is None or has(a):
                out.append((a, label))
            if has is not None and has(mixer[0]):
                out.append(mixer)
        if mlp and (has is None or has(HookPoint.mlp_out(i))):
            out.append((HookPoint.mlp_out(i), f"{i}{mlp_label}"))
    return out


def model_weight(model: MIModel, name: str, layer: int | None = None) -> torch.Tensor:
    """One weight in TransformerLens layout through the backend's ``get_weight``."""
    return model.tl_weight(name, layer)


def head_results(model: MIModel, cache: HookCache, layer: int) -> torch.Tensor:
    """Per-head outputs of `layer` without b_O: the captured ``attn.hook_result``, else
    ``hook_z`` [*batch, pos, heads, d_head] times W_O [heads, d_head, d_model] (times the
    output gate ``attn.hook_gate`` first where the attention has one: W_O reads z * gate)."""
    res = cache.get(HookPoint.attn_result(layer))
    if res is not None:
        return res
    z = cache.require(HookPoint.attn_z(layer))
    gate = attention_output_gate(model, layer)
    if gate is not None:
        z = z * cache.require(gate).to(z.dtype)
    w_o = model_weight(model, "W_O", layer).to(z.dtype)
    return torch.einsum("...hk,hkd->...hd", z, w_o)


def attention_output_gate(model: MIModel, layer: int) -> HookPoint | None:
    """``blocks.{layer}.attn.hook_gate`` where `layer` has softmax attention with an output
    gate (W_O reads ``hook_z * hook_gate``), else None."""
    gate = HookPoint.parse(f"blocks.{layer}.attn.hook_gate")
    if model.has_hook_point(HookPoint.attn_pattern(layer)) and model.has_hook_point(gate):
        return gate
    return None


def accumulated_bias(model: MIModel, layer: int, mlp_input: bool = False,
                     include_mlp_biases: bool = True) -> torch.Tensor:
    """Sum of b_O (and b_out) of the layers before `layer` (+ b_O of `layer` for the MLP
    input): [d_model]; absent biases count as zero."""
    out = torch.zeros(model.hidden_size, dtype=model.dtype, device=model.device)
    for i in range(layer):
        out = out + model.tl_weight("b_O", i)
        if include_mlp_biases:
            out = out + model.tl_weight("b_out", i)
    if mlp_input:
        if layer >= model.num_layers:
            raise TLInputError("accumulated_bias: no MLP input beyond the final layer")
        # a negative layer indexes from the end, as TransformerLens' blocks[layer]
        out = out + model.tl_weight("b_O", layer % model.num_layers)
    return out


def norm_centres(model: MIModel) -> bool:
    """Whether the model's norms centre their input (LayerNorm) rather than only rescale
    (RMSNorm); see :attr:`MIModel.norm_centres`."""
    return model.norm_centres


def _projection_2d(p: torch.Tensor | None) -> tuple[torch.Tensor | None, bool]:
    if p is None:
        return None, False
    if p.ndim == 1:
        return p[:, None], True
    if p.ndim != 2:
        raise MIError(f"project_output_onto must be [d_model] or [d_model, k], got "
                      f"{list(p.shape)}")
    return p, False


def _token_shape(model: MIModel, tokens: Any) -> tuple[int, ...]:
    if isinstance(tokens, (str, int)):
        return ()
    return tuple(torch.as_tensor(tokens).shape)


__all__ = ("ActivationCache", "Slice", "get_act_name", "accumulated_bias",
                          "head_results", "norm_centres")

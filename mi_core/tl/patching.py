"""TransformerLens' ``transformer_lens.patching``, same functions, same signatures, same numbers.

``from mi_core.tl import patching`` (also ``mi_core.interp.act_patching``) then
``patching.get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric)`` runs the
corrupted prompt once per index (layer, position[, head] ...) with that slice of the activation
replaced by its clean value, and returns the metric of each run: a tensor with one axis per
index axis (e.g. [n_layers, pos]). The metric is TransformerLens' ``patching_metric``: logits
[batch, pos, d_vocab] -> a scalar; the values are raw (what the metric returns). Pass
``normalize=(clean_value, corrupted_value)`` to get ``(value - corrupted) / (clean -
corrupted)`` instead (0 = corrupted behaviour, 1 = clean).

Kinds: resid_pre / resid_mid / resid_post, attn_out / mlp_out (by layer x position), and per
head: z ("attn_head_out"), q, k, v (by KV head on grouped-query models, as TransformerLens),
pattern, each by position or over all positions; the ``*_every`` helpers stack them.
``index_df``: a pandas DataFrame (or a sequence of index tuples) selects the indices, giving a
flat result, as TransformerLens.
"""

from __future__ import annotations

import itertools
from functools import partial
from typing import Any, Callable, Sequence

import torch

from mi_core import HookCache, HookError, HookPoint, HookSpec
from mi_core.plugin import MetricError, progress
from mi_core.tl.activation_cache import get_act_name

PatchSetter = Callable[[torch.Tensor, Sequence[int], torch.Tensor], torch.Tensor]


def _ranges(model: Any, activation_name: str, seq: int, axes: Sequence[str]) -> list[int]:
    heads = model.num_heads
    if activation_name in ("k", "v"):
        heads = model.num_kv_heads
    size = {"layer": model.num_layers, "pos": seq, "src_pos": seq, "dest_pos": seq,
            "head_index": heads, "head": heads}
    unknown = [a for a in axes if a not in size]
    if unknown:
        raise HookError(f"unknown index axis names {unknown}; known: {sorted(size)}")
    return [size[a] for a in axes]


def _index_rows(index_df: Any) -> list[list[int]]:
    if hasattr(index_df, "itertuples"):  # pandas DataFrame
        return [[int(v) for v in row[1:]] for row in index_df.itertuples()]
    return [[int(v) for v in row] for row in index_df]


def _patched_logits(model: Any, tokens: torch.Tensor, name: str,
                    hook: Callable[..., torch.Tensor]) -> torch.Tensor:
    """Logits of `tokens` with `hook` at `name`: through a HookedTransformer's own
    ``run_with_hooks`` (its hooks on the tree apply too, as in TransformerLens) or an
    MIModel's ``forward``."""
    if hasattr(model, "mi_model") and hasattr(model, "run_with_hooks"):
        return model.run_with_hooks(tokens, fwd_hooks=[(name, hook)])
    return model.forward(tokens, HookSpec().intervene(name, hook)).output


def generic_activation_patch(model: Any, corrupted_tokens: torch.Tensor, clean_cache: HookCache,
                             patching_metric: Callable[[torch.Tensor], Any],
                             patch_setter: PatchSetter, activation_name: str,
                             index_axis_names: Sequence[str] | None = None,
                             index_df: Any = None, *, return_index_df: bool = False,
                             normalize: tuple[float, float] | None = None,
                             show_progress: bool | None = None) -> Any:
    """TransformerLens' ``generic_activation_patch`` (see the module docstring)."""
    tokens = corrupted_tokens if isinstance(corrupted_tokens, torch.Tensor) else \
        model.to_tokens(corrupted_tokens)
    if index_df is None:
        if index_axis_names is None:
            raise HookError("generic_activation_patch needs index_axis_names or index_df")
        dims = _ranges(model, activation_name, tokens.shape[-1], index_axis_names)
        rows = [list(r) for r in itertools.product(*(range(n) for n in dims))]
        out = torch.zeros(dims)
        flat = False
    else:
        if index_axis_names is not None:
            raise HookError("give index_axis_names or index_df, not both")
        rows = _index_rows(index_df)
        out = torch.zeros(len(rows))
        flat = True
    if normalize is not None:
        clean_v, corr_v = (float(v) for v in normalize)
        if abs(clean_v - corr_v) < 1e-8:
            raise MetricError(f"normalize=({clean_v:.6g}, {corr_v:.6g}): the clean and corrupted "
                              f"metric values are equal, nothing to normalise by")
    for c, index in enumerate(progress(rows, f"patch {activation_name}", enabled=show_progress)):
        name = get_act_name(activation_name, index[0])
        clean = clean_cache[name]

        def hook(act: torch.Tensor, hook: HookPoint, index: list[int] = index,
                 clean: torch.Tensor = clean) -> torch.Tensor:
            return patch_setter(act.clone(), index, clean)

        logits = _patched_logits(model, tokens, name, hook)
        value = float(torch.as_tensor(patching_metric(logits)).float().item())
        if normalize is not None:
            value = (value - corr_v) / (clean_v - corr_v)
        if flat:
            out[c] = value
        else:
            out[tuple(index)] = value
    if return_index_df:
        if index_df is None:
            index_df = make_df_from_ranges(dims, index_axis_names)  # type: ignore[arg-type]
        return out, index_df
    return out


def make_df_from_ranges(column_max_ranges: Sequence[int], column_names: Sequence[str]) -> Any:
    """Every index tuple of the ranges, as TransformerLens' (a pandas DataFrame with those
    columns; without pandas, the list of rows)."""
    rows = [list(r) for r in itertools.product(*(range(n) for n in column_max_ranges))]
    try:
        import pandas as pd
    except ImportError:  # pandas is not a dependency of mi-core; TransformerLens requires it
        return rows
    return pd.DataFrame(rows, columns=list(column_names))


# -- patch setters (TransformerLens' own) ---------------------------------------------------------
def layer_pos_patch_setter(corrupted_activation, index, clean_activation):
    """index = [layer, pos]; activation [batch, pos, ...]."""
    _, pos = index
    corrupted_activation[:, pos, ...] = clean_activation[:, pos, ...]
    return corrupted_activation


def layer_pos_head_vector_patch_setter(corrupted_activation, index, clean_activation):
    """index = [layer, pos, head]; activation [batch, pos, head, ...]."""
    _, pos, head = index
    corrupted_activation[:, pos, head] = clean_activation[:, pos, head]
    return corrupted_activation


def layer_head_vector_patch_setter(corrupted_activation, index, clean_activation):
    """index = [layer, head]; activation [batch, pos, head, ...], every position."""
    _, head = index
    corrupted_activation[:, :, head] = clean_activation[:, :, head]
    return corrupted_activation


def layer_head_pattern_patch_setter(corrupted_activation, index, clean_activation):
    """index = [layer, head]; pattern [batch, head, dest, src]."""
    _, head = index
    corrupted_activation[:, head, :, :] = clean_activation[:, head, :, :]
    return corrupted_activation


def layer_head_pos_pattern_patch_setter(corrupted_activation, index, clean_activation):
    """index = [layer, head, dest_pos]."""
    _, head, dest = index
    corrupted_activation[:, head, dest, :] = clean_activation[:, head, dest, :]
    return corrupted_activation


def layer_head_dest_src_pos_pattern_patch_setter(corrupted_activation, index, clean_activation):
    """index = [layer, head, dest_pos, src_pos]."""
    _, head, dest, src = index
    corrupted_activation[:, head, dest, src] = clean_activation[:, head, dest, src]
    return corrupted_activation


def _make(setter: PatchSetter, name: str, axes: tuple[str, ...], doc: str) -> Callable[..., Any]:
    fn = partial(generic_activation_patch, patch_setter=setter, activation_name=name,
                 index_axis_names=axes)
    fn.__doc__ = f"{doc} Returns [{', '.join(axes)}] (see generic_activation_patch)."
    return fn


get_act_patch_resid_pre = _make(layer_pos_patch_setter, "resid_pre", ("layer", "pos"),
                                "Patch the residual stream entering each layer, per position.")
get_act_patch_resid_mid = _make(layer_pos_patch_setter, "resid_mid", ("layer", "pos"),
                                "Patch the residual stream between attention and MLP.")
get_act_patch_resid_post = _make(layer_pos_patch_setter, "resid_post", ("layer", "pos"),
                                 "Patch the residual stream leaving each layer.")
get_act_patch_attn_out = _make(layer_pos_patch_setter, "attn_out", ("layer", "pos"),
                               "Patch each attention layer's output.")
get_act_patch_mlp_out = _make(layer_pos_patch_setter, "mlp_out", ("layer", "pos"),
                              "Patch each MLP layer's output.")
get_act_patch_attn_head_out_by_pos = _make(
    layer_pos_head_vector_patch_setter, "z", ("layer", "pos", "head"),
    "Patch each head's output (z), per position.")
get_act_patch_attn_head_q_by_pos = _make(layer_pos_head_vector_patch_setter, "q",
                                         ("layer", "pos", "head"), "Patch each head's queries.")
get_act_patch_attn_head_k_by_pos = _make(layer_pos_head_vector_patch_setter, "k",
                                         ("layer", "pos", "head"),
                                         "Patch each (KV) head's keys.")
get_act_patch_attn_head_v_by_pos = _make(layer_pos_head_vector_patch_setter, "v",
                                         ("layer", "pos", "head"),
                                         "Patch each (KV) head's values.")
get_act_patch_attn_head_pattern_by_pos = _make(
    layer_head_pos_pattern_patch_setter, "pattern", ("layer", "head_index", "dest_pos"),
    "Patch each head's attention pattern row, per destination position.")
get_act_patch_attn_head_pattern_dest_src_pos = _make(
    layer_head_dest_src_pos_pattern_patch_setter, "pattern",
    ("layer", "head_index", "dest_pos", "src_pos"), "Patch single attention pattern entries.")
get_act_patch_attn_head_out_all_pos = _make(layer_head_vector_patch_setter, "z",
                                            ("layer", "head"),
                                            "Patch each head's output at every position.")
get_act_patch_attn_head_q_all_pos = _make(layer_head_vector_patch_setter, "q", ("layer", "head"),
                                          "Patch each head's queries at every position.")
get_act_patch_attn_head_k_all_pos = _make(layer_head_vector_patch_setter, "k", ("layer", "head"),
                                          "Patch each (KV) head's keys at every position.")
get_act_patch_attn_head_v_all_pos = _make(layer_head_vector_patch_setter, "v", ("layer", "head"),
                                          "Patch each (KV) head's values at every position.")
get_act_patch_attn_head_pattern_all_pos = _make(
    layer_head_pattern_patch_setter, "pattern", ("layer", "head_index"),
    "Patch each head's whole attention pattern.")
get_act_patch_attn_head_result_by_pos = _make(
    layer_pos_head_vector_patch_setter, "result", ("layer", "pos", "head"),
    "Patch each head's result (z W_O; computed only when hooked), per position.")
get_act_patch_attn_head_result_all_pos = _make(
    layer_head_vector_patch_setter, "result", ("layer", "head"),
    "Patch each head's result at every position.")


def _pad_heads(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, like.size(-1) - t.size(-1)))


def _heads_every(fns: tuple[Any, ...], pattern_axes_swapped: bool, model: Any,
                 corrupted_tokens: Any, clean_cache: Any, metric: Any, **kw: Any) -> torch.Tensor:
    """Stack the z, q, k, v, pattern patching scores (`fns` in that order); k and v (KV heads)
    zero-padded to the query heads; the pattern's last two axes swapped when it is by
    position (it comes as [.., head, pos])."""
    z, q, k, v, pattern = (fn(model, corrupted_tokens, clean_cache, metric, **kw) for fn in fns)
    return torch.stack([z, q, _pad_heads(k, z), _pad_heads(v, z),
                        pattern.transpose(-1, -2) if pattern_axes_swapped else pattern])


def get_act_patch_attn_head_all_pos_every(model, corrupted_tokens, clean_cache, metric,
                                          **kw: Any) -> torch.Tensor:
    """Patching scores [5, n_layers, n_heads] of z, q, k, v (KV heads zero-padded) and
    pattern; all positions."""
    return _heads_every((get_act_patch_attn_head_out_all_pos, get_act_patch_attn_head_q_all_pos,
                         get_act_patch_attn_head_k_all_pos, get_act_patch_attn_head_v_all_pos,
                         get_act_patch_attn_head_pattern_all_pos), False,
                        model, corrupted_tokens, clean_cache, metric, **kw)


def get_act_patch_attn_head_by_pos_every(model, corrupted_tokens, clean_cache, metric,
                                         **kw: Any) -> torch.Tensor:
    """Patching scores [5, n_layers, pos, n_heads] of z, q, k, v (KV heads zero-padded) and
    pattern; by position."""
    return _heads_every((get_act_patch_attn_head_out_by_pos, get_act_patch_attn_head_q_by_pos,
                         get_act_patch_attn_head_k_by_pos, get_act_patch_attn_head_v_by_pos,
                         get_act_patch_attn_head_pattern_by_pos), True,
                        model, corrupted_tokens, clean_cache, metric, **kw)


def get_act_patch_block_every(model, corrupted_tokens, clean_cache, metric,
                              **kw: Any) -> torch.Tensor:
    """Patching scores [3, n_layers, pos] of resid_pre, attn_out, mlp_out."""
    return torch.stack([fn(model, corrupted_tokens, clean_cache, metric, **kw) for fn in (
        get_act_patch_resid_pre, get_act_patch_attn_out, get_act_patch_mlp_out)])


__all__ = [n for n in dir() if n.startswith(("get_act_patch", "layer_")) ] + [
    "generic_activation_patch"]

"""The weight map: checkpoint tensor names -> our per-layer weights, as data.

Each family's tensor names are one :class:`NameTable` (:data:`NAME_TABLES`, chosen by
``TransformerConfig.weight_names``). :func:`tensor_table` turns a config and its table into
every tensor the checkpoint must hold, with its stored shape and the slot it fills; shape
checking, accounting (no leftovers, nothing missing), loading and GGUF all read that one
table. Fused layouts (GPT-2 Conv1D, NeoX per-head QKV, Falcon grouped QKV, Phi-3 qkv and
gate_up) are unpacked by :func:`_unpack_qkv` into plain q/k/v row blocks.

Every tensor is checked as it is loaded (:func:`mi_core.loading.checked_tensor`: no integer
weights, no NaN/inf), from a memory map.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Sequence

import attrs
import torch

from mi_core.plugin import WeightLoadError, checked_tensor, progress

from mi_transformer import altup, per_layer
from mi_transformer.attention import AttnWeights
from mi_transformer.config import (Activation, BlockLayout, MlpLayout, NormType, Positions,
                                   QkvLayout, TransformerConfig)
from mi_transformer.mla import load_mla, mla_shapes
from mi_transformer.mlp import MlpWeights, XIeLU
from mi_transformer.moe import MoeWeights, expected_moe_shapes, float32_names, load_moe
from mi_transformer.norm import Norm
from mi_transformer.placement import Layout
from mi_transformer import shared_block
from mi_transformer.name_tables import _CAUSAL_BUFFERS, NAME_TABLES, NameTable  # noqa: F401
from mi_transformer.sources import DictSource, TensorSource  # noqa: F401 (re-exported)


@attrs.frozen
class Entry:
    """One checkpoint tensor: the slot it fills (layer None: a global one), stored shape."""

    slot: str  # e.g. "q.weight", "qkv.bias", "ln1.weight", "embed", "lm_head.bias"
    layer: int | None
    shape: tuple[int, ...]


def _linear(names: NameTable, out: int, inp: int) -> tuple[int, ...]:
    return (inp, out) if names.conv1d else (out, inp)


def tensor_table(cfg: TransformerConfig) -> dict[str, Entry]:
    """Every tensor the config implies: checkpoint name -> Entry (lm_head only when untied).

    The one description of a family's weights: shapes are checked, tensors loaded and
    leftovers found from it; GGUF maps its names onto the same slots (:func:`slot_names`).
    """
    t = NAME_TABLES[cfg.weight_names]
    d = cfg.hidden_size
    out: dict[str, Entry] = {t.embed + ".weight": Entry("embed", None, (cfg.vocab_size, d))}
    if cfg.positions is Positions.LEARNED:
        rows = (cfg.max_positions or 0) + cfg.position_offset
        out[t.pos_embed + ".weight"] = Entry("pos_embed", None, (rows, d))
    if cfg.norm_affine:  # OLMo's non-parametric LayerNorm has no tensors
        out[t.final_norm + ".weight"] = Entry("final_norm.weight", None, (d,))
    if cfg.norm_bias:
        out[t.final_norm + ".bias"] = Entry("final_norm.bias", None, (d,))
    if not cfg.tie_word_embeddings:
        out[t.lm_head + ".weight"] = Entry("lm_head.weight", None, (cfg.vocab_size, d))
    if cfg.lm_head_bias:
        out[t.lm_head + ".bias"] = Entry("lm_head.bias", None, (cfg.vocab_size,))

    def add(i: int, slot: str, name: str, shape: tuple[int, ...], bias: bool) -> None:
        p = t.layer.format(i=i) + name
        out[p + ".weight"] = Entry(slot + ".weight", i, shape)
        if bias:
            rows = shape[1] if t.conv1d and len(shape) == 2 else shape[0]
            out[p + ".bias"] = Entry(slot + ".bias", i, (rows,))

    norms = {"ln1": t.ln1}
    if cfg.block is not BlockLayout.PARALLEL_SHARED_NORM:
        norms["ln2"] = t.ln2
    if not cfg.pre_norms:
        norms = {}
    if cfg.post_norms:
        norms.update(ln1_post=t.ln1_post, ln2_post=t.ln2_post)
    if not cfg.norm_affine:
        norms = {}
    out.update({name: Entry(slot, None, shape) for name, (slot, shape) in {
        **per_layer.global_shapes(cfg, t.text_model),
        **altup.global_shapes(cfg, t.text_model)}.items()})
    for i in range(cfg.num_layers):
        out.update(_layer_extras(cfg, t, i))
        mixer = cfg.mixer_of(i)
        own = t.shared_prefix if cfg.shared_set(i) is not None else ""  # (Zamba2)
        if own:
            _shared_entries(cfg, t, out, i)
        if mixer is not None:  # a plugin's mixer: its own tensors, slots "mixer:<name>"
            prefix = _mixer_prefix(cfg, t, i)
            for name, shape in mixer.spec.tensors(mixer.settings).items():
                out[prefix + name] = Entry("mixer:" + name, i, tuple(shape))
        if cfg.has_attention(i):  # beside a mixer too (layer_parallel); not in MLP_ONLY
            _attention_extras(t, cfg, add, out, i)
        layer_norms = {"ln1": t.ln1, "ln2": t.ln2} if mixer is not None and \
            cfg.mixer_pre_norms else norms  # OLMo hybrid: pre-norm mixer layers
        for slot, name in layer_norms.items():
            if not cfg.has_attention(i) and mixer is None and slot in ("ln1", "ln1_post"):
                continue  # MLP_ONLY: the layer's one norm is ln2
            if cfg.has_mlp(i) or slot in ("ln1", "ln1_post"):
                add(i, slot, own + name, (d,), cfg.norm_bias)
        if not cfg.has_mlp(i):
            continue
        if cfg.moe is not None and cfg.layer_moe and cfg.layer_moe[i]:
            prefix = t.layer.format(i=i)  # slot "moe:<name inside the layer>"
            for name, shape in expected_moe_shapes(prefix, cfg.moe, d).items():
                out[name] = Entry("moe:" + name[len(prefix):], i, shape)
            if not cfg.moe.beside_mlp:
                continue
            for slot, name in _BESIDE_NORMS.items():  # the dense MLP's and the MoE's norms
                add(i, slot, name, (d,), False)
        _mlp_entries(cfg, t, add, out, i)
    return out


def _mixer_prefix(cfg: TransformerConfig, t: NameTable, i: int) -> str:
    """Layer i's mixer module prefix (``model.layers.{i}.linear_attn.``; Zamba2's layers with
    the shared block keep theirs under ``mamba_decoder.``)."""
    own = t.shared_prefix if cfg.shared_set(i) is not None else ""
    return t.layer.format(i=i) + own + t.mixer + "."


def concat_groups(cfg: TransformerConfig) -> list[tuple[str, ...]]:
    """The groups of expected tensor names a reader takes as one concatenation along dim 0
    (a mixer's :attr:`~mi_core.registry.MixerSpec.concatenated`, at each layer that runs it):
    a checkpoint may split such a group's rows anywhere, as long as the total is right."""
    t = NAME_TABLES[cfg.weight_names]
    out: list[tuple[str, ...]] = []
    for i in range(cfg.num_layers):
        mixer = cfg.mixer_of(i)
        if mixer is None or not mixer.spec.concatenated:
            continue
        names, prefix = mixer.spec.tensors(mixer.settings), _mixer_prefix(cfg, t, i)
        out += [tuple(prefix + n for n in g) for g in mixer.spec.concatenated
                if all(n in names for n in g)]
    return out


def _mlp_entries(cfg: TransformerConfig, t: NameTable, add: Callable[..., None],
                 out: dict[str, Entry], i: int) -> None:
    """Layer i's dense MLP tensors (gate / up / down as the layout stores them, xIELU's
    learned parameters)."""
    d, m = cfg.hidden_size, cfg.mlp_size_of(i)
    if cfg.mlp_layout is MlpLayout.GATED_FUSED:
        add(i, "gate_up", t.mlp_gate_up, _linear(t, 2 * m, d), cfg.mlp_bias)
    else:
        add(i, "mlp_in", t.mlp_in, _linear(t, m, d), cfg.mlp_bias)
        if cfg.mlp_layout is MlpLayout.GATED:
            add(i, "mlp_up", t.mlp_up, _linear(t, m, d), cfg.mlp_bias)
    add(i, "mlp_out", t.mlp_out, _linear(t, d, m), cfg.mlp_bias)
    if cfg.activation is Activation.XIELU:  # its learned parameters, per layer
        for p, shape in _XIELU:
            out[f"{t.layer.format(i=i)}{t.mlp_act}.{p}"] = Entry("act." + p, i, shape)


def _layer_extras(cfg: TransformerConfig, t: NameTable, i: int) -> dict[str, Entry]:
    """Layer i's tensors of the Gemma-3n / Gemma-4 axes: the per-layer-input branch, AltUp,
    Laurel and the layer's scalar (where the config has them)."""
    prefix = t.layer.format(i=i)
    out = {name: Entry(slot, i, shape) for name, (slot, shape) in {
        **per_layer.layer_shapes(cfg, prefix), **altup.layer_shapes(cfg, prefix)}.items()}
    if cfg.layer_scalar:
        out[prefix + "layer_scalar"] = Entry("layer_scalar", i, (1,))
    return out


#: Gemma-4's norms of an MoE beside the MLP: the dense output's, the experts' input's and
#: their output's (the sum's is ln2_post)
_BESIDE_NORMS = {"ln2_post_dense": "post_feedforward_layernorm_1",
                 "ln2_moe": "pre_feedforward_layernorm_2",
                 "ln2_post_moe": "post_feedforward_layernorm_2"}


def _attention_extras(t: NameTable, cfg: TransformerConfig, add: Callable[..., None],
                      out: dict[str, Entry], i: int) -> None:
    """An attention layer's tensors: q/k/v (with the output gate's rows where q_proj has
    them; no k / v where the layer shares an earlier layer's keys, no v where the values are
    the keys), latent projections (MLA) and sinks, the output projection and q/k norms (one
    tensor per head where the table says ``{h}``, StableLM's, stacked on load)."""
    d, hd, h, kv = cfg.hidden_size, cfg.head_dim_of(i), cfg.num_heads, cfg.kv_heads_of(i)
    # q/k norms per head [d_head], or over the whole projection (OLMo2, OLMoE)
    qn, kn = ((h * hd,), (kv * hd,)) if cfg.qk_norm_full else ((hd,), (hd,))
    if cfg.qk_norm_heads:  # a gain per head (Cohere)
        qn, kn = (h, hd), (kv, hd)
    out.update(_attn_extras(cfg, t, i))  # latent projections (MLA), sinks
    if cfg.mla is None and cfg.qkv_layout is QkvLayout.SEPARATE:
        q_rows = h * hd * (2 if cfg.attn_output_gate else 1)  # [q | gate] per head
        slots = [("q", q_rows)]
        if not cfg.shares_kv(i):
            slots += [("k", kv * hd)] + ([] if cfg.k_eq_v_of(i) else [("v", kv * hd)])
        for slot, rows in slots:
            add(i, slot, getattr(t, slot), _linear(t, rows, d), cfg.qkv_bias)
    elif cfg.mla is None:
        add(i, "qkv", t.qkv, _linear(t, (h + 2 * kv) * hd, d), cfg.qkv_bias)
    v_width = cfg.v_head_dim if cfg.mla is not None else hd
    add(i, "o", t.o, _linear(t, d, h * v_width), cfg.o_bias)
    qk_norm = cfg.qk_norm and cfg.qk_norm_affine and (
        not cfg.layer_qk_norm or cfg.layer_qk_norm[i])  # weightless norms: no tensors
    if qk_norm and "{h}" in t.q_norm:  # one tensor per head (StableLM), stacked on load
        for which, n, name in (("q_norm", h, t.q_norm), ("k_norm", kv, t.k_norm)):
            for j in range(n):
                add(i, f"{which}.{j}", name.format(h=j), (hd,), False)
    elif qk_norm:
        add(i, "q_norm", t.q_norm, qn, False)
        if not cfg.shares_kv(i):  # a layer that shares keys has no key norm
            add(i, "k_norm", t.k_norm, kn, False)


def _shared_entries(cfg: TransformerConfig, t: NameTable, out: dict[str, "Entry"],
                    i: int) -> None:
    """Layer i's shared-block tensors: its own output projection, and at the first layer
    of each weight set the set's tensors (slots ``shared:<name inside the module>``)."""
    p = t.layer.format(i=i)
    out[p + t.shared_out + ".weight"] = Entry(shared_block.OUT, i,
                                              (cfg.hidden_size, cfg.hidden_size))
    if cfg.shared_owner(i) == i:
        for name, shape in shared_block.shared_tensors(cfg, i).items():
            out[p + t.shared + "." + name] = Entry("shared:" + name, i, shape)


def shared_duplicates(cfg: TransformerConfig, names: Sequence[str]) -> dict[str, str]:
    """Copies of a shared block's tensors at a later layer that uses the same weight set
    (a checkpoint may repeat them; transformers saves the first only) -> the first's name."""
    t = NAME_TABLES[cfg.weight_names]
    if cfg.shared_block is None:
        return {}
    table, out = tensor_table(cfg), {}
    for i in range(cfg.num_layers):
        owner = cfg.shared_owner(i)
        if owner is None or owner == i:
            continue
        mine, first = (t.layer.format(i=k) + t.shared + "." for k in (i, owner))
        for n in names:
            if n.startswith(mine) and first + n[len(mine):] in table:
                out[n] = first + n[len(mine):]
    return out


_XIELU: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("alpha_p", (1,)), ("alpha_n", (1,)), ("beta", ()), ("eps", ()))


def _attn_extras(cfg: TransformerConfig, t: NameTable, i: int) -> dict[str, Entry]:
    """Layer i's attention tensors of the newer axes: MLA's latent projections (slots
    ``mla:<name inside the attention module>``) and gpt-oss's sinks [heads]."""
    prefix = f"{t.layer.format(i=i)}{t.attn}."
    out = {}
    if cfg.mla is not None:
        for name, shape in mla_shapes(cfg.mla, cfg.num_heads, cfg.hidden_size,
                                      cfg.qkv_bias).items():
            out[prefix + name] = Entry("mla:" + name, i, shape)
    if cfg.attn_sinks:
        out[prefix + "sinks"] = Entry("sinks", i, (cfg.num_heads,))
    return out


def slot_names(cfg: TransformerConfig) -> dict[tuple[int | None, str], str]:
    """(layer or None, slot) -> checkpoint name, for formats that name tensors their own way
    (GGUF maps ``blk.{i}.attn_q.weight`` to (i, "q.weight") and looks the name up here)."""
    return {(e.layer, e.slot): name for name, e in tensor_table(cfg).items()}


def expected_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the config implies, checkpoint name -> stored shape."""
    return {name: e.shape for name, e in tensor_table(cfg).items()}


def is_ignorable(cfg: TransformerConfig, name: str) -> bool:
    t = NAME_TABLES[cfg.weight_names]
    if cfg.ignored_layers and any(name.startswith(t.layer.format(i=i))
                                  for i in cfg.ignored_layers):
        return True  # multi-token-prediction modules stored as extra layers (GLM-4.5, V3)
    if cfg.layer_kv_source and any(  # k / v of a layer that shares an earlier layer's (the
            name.startswith(t.layer.format(i=i) + m + ".")  # published Gemma-3n / Gemma-4
            for i in range(cfg.num_layers) if cfg.shares_kv(i)  # keep them; unused)
            for m in (t.k, t.v, t.k_norm, t.attn + ".v_norm")):
        return True
    return any(re.search(p, name) for p in t.ignore)


@attrs.define
class WeightCheck:
    """The outcome of comparing a checkpoint's tensor names/shapes with a config."""

    missing: list[str]
    unexpected: list[str]
    misshaped: list[str]
    config_layers: int = 0
    extra_layers: list[int] = attrs.field(factory=list)  # checkpoint layers past the config's

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.misshaped)

    def message(self, origin: str, model_type: str) -> str:
        parts = []
        if self.extra_layers:
            parts.append(f"the checkpoint has layers up to index {max(self.extra_layers)} but "
                         f"the config has {self.config_layers} layers (num_hidden_layers)")
        for what, names in (("missing tensors", self.missing),
                            ("unexpected tensors (not used by the forward)", self.unexpected)):
            if names:
                parts.append(f"{what}: " + ", ".join(names[:20])
                             + (f" ... ({len(names)} in all)" if len(names) > 20 else ""))
        if self.misshaped:
            parts.append("mis-shaped tensors: " + "; ".join(self.misshaped[:20]))
        return f"{origin} ({model_type}): " + " | ".join(parts)


def resolve_names(cfg: TransformerConfig, names: Mapping[str, object] | list[str]
                  ) -> dict[str, str]:
    """Expected name -> the checkpoint's spelling of it (the base prefix may be absent)."""
    t = NAME_TABLES[cfg.weight_names]
    have = set(names)
    out = {}
    for name in tensor_table(cfg):
        out[name] = name
        if name in have:
            continue
        if t.base_prefix and name.startswith(t.base_prefix) \
                and name[len(t.base_prefix):] in have:
            out[name] = name[len(t.base_prefix):]
        for ours, theirs in t.renamed:  # another spelling the reference reads too
            if ours in name and name.replace(ours, theirs, 1) in have:
                out[name] = name.replace(ours, theirs, 1)
                break
    return out


def check_tensors(cfg: TransformerConfig, shapes: Mapping[str, tuple[int, ...]]) -> WeightCheck:
    """Every expected tensor present with its shape; every other tensor ignorable."""
    table, alias = tensor_table(cfg), resolve_names(cfg, list(shapes))
    t = NAME_TABLES[cfg.weight_names]
    dups = shared_duplicates(cfg, list(shapes))  # repeated shared-block tensors (Zamba2)
    used = set(alias.values()) | set(dups)
    missing = [n for n in table if alias[n] not in shapes]
    tied_head = t.lm_head + ".weight"
    unexpected = [n for n in shapes if n not in used and not is_ignorable(cfg, n)
                  and not (cfg.tie_word_embeddings and n == tied_head)]
    regrouped, bad_groups = _regroup(cfg, shapes, table, alias)
    in_groups = {n for g in bad_groups for n in g} | set(regrouped)
    misshaped = [f"{alias[n]}: {list(shapes[alias[n]])} != expected {list(e.shape)}"
                 for n, e in table.items() if alias[n] in shapes and n not in in_groups
                 and tuple(shapes[alias[n]]) != e.shape]
    misshaped += [_group_message(g, shapes, table, alias) for g in bad_groups]
    misshaped += [f"{n}: {list(shapes[n])} != expected {list(table[first].shape)}"
                  for n, first in dups.items() if tuple(shapes[n]) != table[first].shape]
    pat = re.compile(re.escape(t.layer).replace(re.escape("{i}"), r"(\d+)"))
    extra = sorted({int(mt.group(1)) for n in unexpected
                    if (mt := pat.match(n) or pat.match(t.base_prefix + n))
                    and int(mt.group(1)) >= cfg.num_layers})
    return WeightCheck(missing, unexpected, misshaped, cfg.num_layers, extra)


def _regroup(cfg: TransformerConfig, shapes: Mapping[str, tuple[int, ...]],
             table: Mapping[str, Entry], alias: Mapping[str, str]
             ) -> tuple[dict[str, tuple[tuple[str, ...], int]], list[tuple[str, ...]]]:
    """The concatenated groups (:func:`concat_groups`) stored split otherwise than expected:
    those read as one concatenation (expected name -> (the group, its first row in the
    concatenation)) and those that cannot be (a total or another dim differs). A group
    stored as expected, or with a tensor missing, is in neither."""
    ok: dict[str, tuple[tuple[str, ...], int]] = {}
    bad: list[tuple[str, ...]] = []
    for g in concat_groups(cfg):
        if any(alias[n] not in shapes for n in g):
            continue  # reported missing
        stored = [tuple(shapes[alias[n]]) for n in g]
        want = [table[n].shape for n in g]
        if stored == want:
            continue
        if all(len(s) == len(w) >= 1 and s[1:] == w[1:] for s, w in zip(stored, want)) \
                and sum(s[0] for s in stored) == sum(w[0] for w in want):
            start = 0
            for n, w in zip(g, want):
                ok[n] = (g, start)
                start += w[0]
        else:
            bad.append(g)
    return ok, bad


def _group_message(g: tuple[str, ...], shapes: Mapping[str, tuple[int, ...]],
                   table: Mapping[str, Entry], alias: Mapping[str, str]) -> str:
    stored = ", ".join(f"{alias[n]}: {list(shapes[alias[n]])}" for n in g)
    want = ", ".join(str(list(table[n].shape)) for n in g)
    total = sum(table[n].shape[0] for n in g)
    return (f"{stored} (read as one concatenation along dim 0, as the reference does: "
            f"expected {want}, {total} rows in all with equal other dims)")


class RegroupedSource:
    """A TensorSource whose concatenated groups (:func:`concat_groups`) stored split
    otherwise than expected (transformers' save splits OLMo hybrid's q/k/v convs in equal
    thirds) give each tensor at its expected shape: the group's stored tensors concatenated
    along dim 0, then split at the expected sizes (numbers as the reference, which reads the
    concatenation). Every other tensor is `src`'s own."""

    def __init__(self, src: "TensorSource", plan: Mapping[str, tuple[tuple[str, ...], int]],
                 expected: Mapping[str, tuple[int, ...]]) -> None:
        self.src, self.plan = src, dict(plan)  # stored name -> (stored group, first row)
        self.files = getattr(src, "files", None)
        self.origin = getattr(src, "origin", "<memory>")
        self.shapes = {**src.shapes, **{n: tuple(expected[n]) for n in self.plan}}
        self._last: tuple[tuple[Any, ...], torch.Tensor] | None = None

    def names(self) -> list[str]:
        return self.src.names()

    def get(self, name: str, dtype: torch.dtype | None = None,
            device: torch.device | str | None = None,
            shape: tuple[int, ...] | None = None) -> torch.Tensor:
        if name not in self.plan:
            return self.src.get(name, dtype=dtype, device=device, shape=shape)
        if shape is not None and tuple(shape) != self.shapes[name]:
            raise WeightLoadError(f"{_origin(self)}: tensor {name!r} has shape "
                                  f"{list(self.shapes[name])}, expected {list(shape)}")
        group, start = self.plan[name]
        key = (group, dtype, str(device))
        if self._last is None or self._last[0] != key:  # one concatenation per group
            self._last = (key, torch.cat([self.src.get(n, dtype=dtype, device=device)
                                          for n in group]))
        return self._last[1][start:start + self.shapes[name][0]].clone()


def regrouped(cfg: TransformerConfig, src: "TensorSource") -> "TensorSource":
    """`src` itself, or a :class:`RegroupedSource` over it where a concatenated group is
    stored split otherwise than expected (and its total is right: :func:`check_tensors`)."""
    table, alias = tensor_table(cfg), resolve_names(cfg, src.names())
    ok, _ = _regroup(cfg, src.shapes, table, alias)
    if not ok:
        return src
    plan = {alias[n]: (tuple(alias[m] for m in g), start) for n, (g, start) in ok.items()}
    return RegroupedSource(src, plan, {alias[n]: table[n].shape for n in ok})


@attrs.define(eq=False)
class LayerWeights:
    ln1: Norm | None  # None: no pre-norms (OLMo2)
    ln2: Norm | None  # None: parallel block with one shared norm, no pre-norms, or no MLP
    attn: AttnWeights | None  # None: the layer runs a plugin's mixer instead
    mlp: MlpWeights | MoeWeights | None  # None: no MLP sublayer (Mamba)
    ln1_post: Norm | None = None
    ln2_post: Norm | None = None
    mixer: Any = None  # a non-attention mixer (mi_core.recurrence.Mixer), built by its plugin
    #: the shared attention block run before the mixer (Zamba2), with this layer's adapters
    shared: "shared_block.SharedBlockWeights | None" = None
    # -- Gemma-4 / Gemma-3n --
    scalar: torch.Tensor | None = None  # [1]: the layer's output multiplied by it
    ple: per_layer.PerLayerBranch | None = None  # the per-layer-input branch
    altup: altup.AltUpWeights | None = None
    laurel: altup.LaurelWeights | None = None
    moe: MoeWeights | None = None  # a mixture of experts beside the dense MLP (Gemma-4)
    ln2_post_dense: Norm | None = None  # its norms: the dense output's,
    ln2_moe: Norm | None = None  # the experts' input's,
    ln2_post_moe: Norm | None = None  # and their output's


@attrs.define(eq=False)
class Weights:
    embed: torch.Tensor  # [vocab, d_model]
    lm_head: torch.Tensor  # [vocab, d_model] (the embedding itself when tied)
    final_norm: Norm
    layers: "list[LayerWeights] | OffloadedLayers"
    pos_embed: torch.Tensor | None = None  # [positions (+ offset), d_model]
    lm_head_bias: torch.Tensor | None = None  # [vocab]
    per_layer: per_layer.PerLayerInputWeights | None = None  # per-layer input embeddings
    altup_in: list[torch.Tensor] = attrs.field(factory=list)  # AltUp's stream projections
    altup_out: list[torch.Tensor] = attrs.field(factory=list)  # [d_model, d_model] each


def _split_gate(cfg: TransformerConfig, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A gated q_proj [heads * 2 * d_head, ...] -> (q, gate) [heads * d_head, ...] each."""
    per = t.view(cfg.num_heads, 2 * cfg.head_dim, *t.shape[1:])
    q, gate = per.split(cfg.head_dim, dim=1)
    return q.reshape(-1, *t.shape[1:]), gate.reshape(-1, *t.shape[1:])


def _origin(src: TensorSource) -> str:
    files = getattr(src, "files", None)
    return ", ".join(map(str, files)) if files else getattr(src, "origin", "<memory>")


def _unpack_qkv(cfg: TransformerConfig, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A fused q/k/v weight [rows, d_model] (or bias [rows]) -> (q, k, v) row blocks.

    FUSED / CONV1D: [q | k | v] (row views, no copy). HEAD_INTERLEAVED (NeoX, Falcon
    without multi-query): [h, 3, d_head]. GROUPED (Falcon new decoder): [kv, h/kv + 2, d_head]
    with the group's queries then its key and value.
    """
    h, kv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    tail = t.shape[1:]
    if cfg.qkv_layout in (QkvLayout.FUSED, QkvLayout.CONV1D):
        return t.split([h * hd, kv * hd, kv * hd], dim=0)
    if cfg.qkv_layout is QkvLayout.HEAD_INTERLEAVED:
        g = t.view(h, 3, hd, *tail)
        return tuple(g[:, j].reshape(h * hd, *tail) for j in range(3))
    groups = h // kv
    g = t.view(kv, groups + 2, hd, *tail)
    return (g[:, :groups].reshape(h * hd, *tail), g[:, groups].reshape(kv * hd, *tail),
            g[:, groups + 1].reshape(kv * hd, *tail))


def load_weights(cfg: TransformerConfig, src: TensorSource, device: torch.device,
                 dtype: torch.dtype, show_progress: bool = True, *,
                 layout: Layout | None = None) -> Weights:
    """Account for every tensor (one WeightLoadError listing all problems), then load.

    Missing, mis-shaped and unexpected tensors (including layers beyond the config's count)
    are refused before anything is read; each tensor is then checked as it is loaded (no
    integer dtype, no NaN/inf). Fused tensors are split into row views where the layout
    allows (no second copy). `layout` (default: everything on `device`) puts each part on
    its device; with ``offload`` the blocks' tensors rest in CPU memory ("cpu", in `dtype`)
    or memory-mapped as stored ("disk") and :class:`OffloadedLayers` assembles each block on
    its device when it runs.
    """
    chk = check_tensors(cfg, src.shapes)
    if not chk.ok:
        raise WeightLoadError(chk.message(_origin(src), cfg.model_type))
    src = regrouped(cfg, src)  # concatenated groups stored split otherwise: re-split
    lay = layout if layout is not None else Layout.single(device, cfg.num_layers)
    table, alias = tensor_table(cfg), resolve_names(cfg, src.names())
    t = NAME_TABLES[cfg.weight_names]
    tensors: dict[tuple[int | None, str], torch.Tensor] = {}
    targets: dict[tuple[int | None, str], torch.dtype] = {}
    fp32 = {"moe:" + n for n in float32_names(cfg.moe)} if cfg.moe is not None else set()
    if cfg.norm_weights_float32 and dtype == torch.float16:  # _keep_in_fp32_modules (gpt-oss)
        fp32 |= {f"{n}.weight" for n in ("ln1", "ln2", "ln1_post", "ln2_post", "final_norm")}
    for name, e in progress(table.items(), "loading weights", unit="tensor",
                            enabled=None if show_progress else False):
        target = torch.float32 if e.slot in fp32 else dtype
        key = (e.layer, e.slot)
        if e.layer is not None and lay.offload is not None:
            tensors[key], targets[key] = _resting(src, alias[name], target, lay.offload), target
            continue
        dev = lay.layers[e.layer] if e.layer is not None else \
            lay.embed if e.slot in ("embed", "pos_embed") or e.slot.startswith(
                ("ple:", "altup:in.")) else lay.unembed
        w = src.get(alias[name], dtype=target, device=dev)
        if t.conv1d and w.dim() == 2 and e.layer is not None:
            w = w.t().contiguous()  # Conv1D [in, out] -> Linear [out, in]
        tensors[key] = w
    if lay.offload is not None:
        layers: list[LayerWeights] | OffloadedLayers = OffloadedLayers(cfg, tensors, targets, lay, dtype)
    else:
        layers = [_Slots(cfg, tensors, dtype, lay.layers[i]).layer(i)
                  for i in range(cfg.num_layers)]
    embed = tensors[(None, "embed")]
    lm_head = tensors[(None, "lm_head.weight")] if not cfg.tie_word_embeddings else \
        embed if lay.unembed == lay.embed else embed.to(lay.unembed)
    head = alias.get(t.lm_head + ".weight", t.lm_head + ".weight")
    if cfg.tie_word_embeddings and head in src.shapes:
        stored = src.get(head, dtype=dtype, device=lay.embed)
        if not torch.equal(stored, embed):
            raise WeightLoadError(f"{_origin(src)}: tie_word_embeddings is true but tensor "
                                  f"{head!r} differs from the embedding; set "
                                  f"tie_word_embeddings to false to use it")
    for dup, first in shared_duplicates(cfg, src.names()).items():
        e = table[first]  # a repeated shared-block tensor must be the first use's
        mine = tensors[(e.layer, e.slot)]
        if not torch.equal(src.get(dup, dtype=mine.dtype, device=mine.device), mine):
            raise WeightLoadError(f"{_origin(src)}: {dup!r} differs from {first!r}: a shared "
                                  f"block's weights must be the same at every layer using them")
    globals_ = _Slots(cfg, tensors, dtype, lay.unembed)
    ple = None
    if cfg.per_layer_input is not None:
        ple = per_layer.PerLayerInputWeights(
            cfg.per_layer_input, tensors[(None, "ple:embed")], tensors[(None, "ple:proj")],
            Norm(NormType.RMS, cfg.norm_eps, tensors[(None, "ple:norm")],
                 gain_float32=cfg.norm_gain_float32))
    streams = range(cfg.altup.num_inputs - 1) if cfg.altup is not None else range(0)
    return Weights(embed=embed, lm_head=lm_head, final_norm=globals_.norm(None, "final_norm"),
                   layers=layers, pos_embed=globals_.opt(None, "pos_embed"),
                   lm_head_bias=globals_.opt(None, "lm_head.bias"), per_layer=ple,
                   altup_in=[tensors[(None, f"altup:in.{j}")] for j in streams],
                   altup_out=[tensors[(None, f"altup:out.{j}")] for j in streams])


def _resting(src: TensorSource, name: str, target: torch.dtype, offload: str) -> torch.Tensor:
    """An offloaded block's tensor as it rests: in CPU memory in its `target` dtype ("cpu"),
    or as stored, memory-mapped ("disk"; checked in `target` too when that narrows it, so a
    value that overflows float16 is still refused at load, not met in a forward)."""
    if offload == "cpu":
        return src.get(name, dtype=target, device="cpu")
    raw = src.get(name, device="cpu")
    if raw.dtype != target and raw.element_size() >= torch.empty((), dtype=target).element_size():
        src.get(name, dtype=target, device="cpu")  # the check after the cast, then dropped
    return raw


class OffloadedLayers(Sequence[LayerWeights]):
    """``Weights.layers`` of an offloaded model: ``layers[i]`` assembles block i on its
    compute device in its dtype from the resting tensors (a copy: in-place edits do not
    persist; weight processing is refused on an offloaded model). The last block assembled
    is kept, so a forward holds at most two blocks' weights besides activations."""

    def __init__(self, cfg: TransformerConfig, tensors: dict[tuple[int | None, str], torch.Tensor],
                 targets: dict[tuple[int | None, str], torch.dtype], layout: Layout,
                 dtype: torch.dtype) -> None:
        self.cfg, self.layout, self.targets, self.dtype = cfg, layout, targets, dtype
        self.resting = {k: v for k, v in tensors.items() if k[0] is not None}
        self._last: tuple[int, LayerWeights] | None = None
        self._conv1d = NAME_TABLES[cfg.weight_names].conv1d

    def __len__(self) -> int:
        return self.cfg.num_layers

    def __getitem__(self, i: int) -> LayerWeights:  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]  # type: ignore[return-value]
        if self._last is not None and self._last[0] == i:
            return self._last[1]
        self._last = None  # drop the previous block before assembling the next
        dev = self.layout.layers[i]
        mine: dict[tuple[int | None, str], torch.Tensor] = {}
        owner = self.cfg.shared_owner(i) if self.cfg.shared_block is not None else None
        for key, t in self.resting.items():
            if key[0] == i or key[0] == owner and key[1].startswith("shared:"):
                w = t.to(device=dev, dtype=self.targets[key], non_blocking=True)
                mine[key] = w.t().contiguous() if self._conv1d and w.dim() == 2 else w
        # no stacking: it would copy the block's experts on every forward
        lw = _Slots(self.cfg, mine, self.dtype, dev, stack_experts=False).layer(i)
        self._last = (i, lw)
        return lw


@attrs.define(eq=False)
class _Slots:
    """The loaded tensors by (layer or None, slot), assembled into one layer's weights at a
    time (fused q/k/v and gate/up split into row views, per-head q/k norms stacked)."""

    cfg: TransformerConfig
    tensors: dict[tuple[int | None, str], torch.Tensor]
    dtype: torch.dtype  # of the unit gains of norms without weights
    device: torch.device
    stack_experts: bool = True  # per-expert tensors stacked for the grouped MoE forward

    def opt(self, layer: int | None, slot: str) -> torch.Tensor | None:
        return self.tensors.get((layer, slot))

    def norm(self, layer: int | None, slot: str) -> Norm:
        cfg = self.cfg
        if not cfg.norm_affine:  # no gain in the checkpoint: 1 (same numbers as none)
            return Norm(cfg.norm_type, cfg.norm_eps,
                        torch.ones(cfg.hidden_size, dtype=self.dtype, device=self.device),
                        gain_float32=cfg.norm_gain_float32)
        return Norm(cfg.norm_type, cfg.norm_eps, self.tensors[(layer, slot + ".weight")],
                    self.opt(layer, slot + ".bias"), gain_float32=cfg.norm_gain_float32)

    def layer(self, i: int) -> LayerWeights:
        cfg, tensors = self.cfg, self.tensors
        spec = cfg.mixer_of(i)
        attn = self.attn(i) if cfg.has_attention(i) else None
        mlp = self.mlp(i) if cfg.has_mlp(i) else None
        mixer = None
        if spec is not None:  # the plugin builds its mixer from its own tensors
            own = {slot[6:]: w for (layer, slot), w in tensors.items()
                   if layer == i and slot.startswith("mixer:")}
            mixer = spec.spec.build(spec.settings, own, i)
        own_pre = spec is not None and cfg.mixer_pre_norms  # pre-norm mixer layers
        pre, post = cfg.pre_norms or own_pre, cfg.post_norms and not own_pre
        # ln2 is there when the checkpoint has its gain; norms without weights leave nothing
        # to look for, so then every block but the one-shared-norm kind has it
        has_ln2 = (i, "ln2.weight") in tensors or (
            not cfg.norm_affine and cfg.block is not BlockLayout.PARALLEL_SHARED_NORM)
        shared = None
        owner = cfg.shared_owner(i) if cfg.shared_block is not None else None
        if owner is not None:  # the first use's tensors, on this layer's device
            sget = lambda n: tensors[(owner, "shared:" + n)].to(self.device)  # noqa: E731
            sopt = lambda n: None if (owner, "shared:" + n) not in tensors else sget(n)  # noqa
            shared = shared_block.load_shared(cfg, i, sget, sopt,
                                              tensors[(i, shared_block.OUT)])
        lw = LayerWeights(
            ln1=self.norm(i, "ln1") if pre and (spec is not None or attn is not None) else None,
            ln2=self.norm(i, "ln2") if pre and has_ln2 else None,
            attn=attn, mlp=mlp,
            ln1_post=self.norm(i, "ln1_post") if post else None,
            ln2_post=self.norm(i, "ln2_post") if post and mlp is not None else None,
            mixer=mixer, shared=shared)
        self._gemma_extras(i, lw)
        return lw

    def _gemma_extras(self, i: int, lw: LayerWeights) -> None:
        """The layer's scalar, per-layer-input branch, AltUp, Laurel and an MoE beside its
        MLP (Gemma-4, Gemma-3n), where the config has them."""
        cfg, tensors = self.cfg, self.tensors
        rms = lambda w: Norm(NormType.RMS, cfg.norm_eps, w,  # noqa: E731
                             gain_float32=cfg.norm_gain_float32)
        if cfg.layer_scalar:
            lw.scalar = tensors[(i, "layer_scalar")]
        if cfg.per_layer_input is not None:
            lw.ple = per_layer.PerLayerBranch(tensors[(i, "ple:gate")], tensors[(i, "ple:proj")],
                                              rms(tensors[(i, "ple:norm")]))
        if cfg.altup is not None:
            get = lambda k: tensors[(i, "altup:" + k)]  # noqa: E731
            lw.altup = altup.AltUpWeights(
                cfg.altup, rms(get("router_norm")), get("modality_router"),
                get("prediction_coefs"), get("correction_coefs"), get("correct_output_scale"))
        if cfg.laurel_rank:
            lw.laurel = altup.LaurelWeights(tensors[(i, "laurel:left")],
                                            tensors[(i, "laurel:right")],
                                            rms(tensors[(i, "laurel:norm")]))
        if cfg.moe is not None and cfg.moe.beside_mlp and cfg.layer_moe and cfg.layer_moe[i]:
            lw.moe = load_moe("", cfg.moe, lambda name: tensors[(i, "moe:" + name)],
                              cfg.norm_eps)
            lw.ln2_post_dense, lw.ln2_moe, lw.ln2_post_moe = (
                self.norm(i, slot) for slot in _BESIDE_NORMS)

    def attn(self, i: int) -> AttnWeights:
        """q/k/v [rows, d_model] as stored or as row views of the fused tensor; per-head q/k
        norm tensors stacked into one [n, d_head]."""
        cfg, tensors, opt = self.cfg, self.tensors, self.opt
        mla = None
        if cfg.mla is not None:  # latent attention: no q/k/v weights of the usual kind
            mla = load_mla(cfg.mla, lambda n: tensors[(i, "mla:" + n)],
                           lambda n: opt(i, "mla:" + n))
            wq = wk = wv = bq = bk = bv = None
        elif cfg.qkv_layout is QkvLayout.SEPARATE:  # (k / v absent: shared or values = keys)
            wq, wk, wv = (tensors.get((i, f"{x}.weight")) for x in "qkv")
            bq, bk, bv = (opt(i, f"{x}.bias") for x in "qkv")
        else:
            wq, wk, wv = _unpack_qkv(cfg, tensors[(i, "qkv.weight")])
            b = opt(i, "qkv.bias")
            bq, bk, bv = _unpack_qkv(cfg, b) if b is not None else (None,) * 3
        wg = bg = None
        if cfg.attn_output_gate:  # q_proj rows per head: [q (d_head) | gate (d_head)]
            wq, wg = _split_gate(cfg, wq)
            bq, bg = _split_gate(cfg, bq) if bq is not None else (None, None)
        if cfg.qk_norm and (i, "q_norm.0.weight") in tensors:  # per-head tensors -> [n, d_head]
            for which, n in (("q_norm", cfg.num_heads), ("k_norm", cfg.num_kv_heads)):
                tensors[(i, which + ".weight")] = torch.stack(
                    [tensors.pop((i, f"{which}.{j}.weight")) for j in range(n)])
        qn = kn = None
        one = torch.ones(cfg.head_dim_of(i), dtype=self.dtype, device=self.device)
        f32 = cfg.norm_gain_float32
        if cfg.qk_norm and not cfg.qk_norm_affine and (
                not cfg.layer_qk_norm or cfg.layer_qk_norm[i]):  # no weights (Llama 4): gain 1
            qn = kn = Norm(NormType.RMS, cfg.norm_eps, one)
        elif cfg.qk_norm and (i, "q_norm.weight") in tensors:
            qn = Norm(cfg.norm_type, cfg.norm_eps, tensors[(i, "q_norm.weight")],
                      gain_float32=f32)
            kw = tensors.get((i, "k_norm.weight"))  # none where the keys are shared
            kn = Norm(cfg.norm_type, cfg.norm_eps, kw, gain_float32=f32) if kw is not None \
                else None
        vn = Norm(NormType.RMS, cfg.norm_eps, one, gain_float32=f32) \
            if cfg.v_norm and wk is not None else None
        return AttnWeights(wq, wk, wv, tensors[(i, "o.weight")], bq, bk, bv, opt(i, "o.bias"),
                           qn, kn, qk_norm_full=cfg.qk_norm_full, clip=cfg.clip_qkv,
                           sinks=opt(i, "sinks"), mla=mla, w_gate=wg, b_gate=bg, v_norm=vn)

    def mlp(self, i: int) -> MlpWeights | MoeWeights:
        """The layer's MLP: mixture of experts, gated with gate/up fused ([gate | up] rows,
        split into views), or gated / plain as stored."""
        cfg, tensors, opt = self.cfg, self.tensors, self.opt
        m = cfg.mlp_size_of(i)
        if cfg.moe is not None and cfg.layer_moe and cfg.layer_moe[i] and not cfg.moe.beside_mlp:
            # popped: a per-expert tensor stacked at load is not held twice meanwhile
            return load_moe("", cfg.moe, lambda name: tensors.pop((i, "moe:" + name)),
                            stack=self.stack_experts)
        if cfg.mlp_layout is MlpLayout.GATED_FUSED:
            gate, up = tensors[(i, "gate_up.weight")].split([m, m], dim=0)
            bgu = opt(i, "gate_up.bias")
            bg, bu = bgu.split([m, m]) if bgu is not None else (None, None)
            return MlpWeights(cfg.mlp_layout, gate, tensors[(i, "mlp_out.weight")], up, bg, bu,
                              opt(i, "mlp_out.bias"))
        act = XIeLU(*(tensors[(i, "act." + p)] for p, _ in _XIELU)) \
            if cfg.activation is Activation.XIELU else None
        return MlpWeights(cfg.mlp_layout, tensors[(i, "mlp_in.weight")],
                          tensors[(i, "mlp_out.weight")], opt(i, "mlp_up.weight"),
                          opt(i, "mlp_in.bias"), opt(i, "mlp_up.bias"), opt(i, "mlp_out.bias"),
                          act=act)

"""Sizes checked before memory is spent: the parameters a config implies, against the memory
available (:func:`mi_core.plugin.check_memory`).

Two checks. While parsing, right after the size keys are read and before any per-layer table
is built (:func:`check_parsed`): only sizes no real checkpoint has are refused, whatever this
machine's memory (detection must still claim a good checkpoint too large for it): more than
:data:`MAX_LAYERS` layers (the per-layer tables the parse builds), any other size key past
:data:`MAX_SIZE`, or more than :data:`MAX_PARAMS` parameters. So ``num_hidden_layers = 10**9`` is
a :class:`ConfigTooLarge` naming the key, not a MemoryError. When loading (:func:`check_loaded`),
with the dtype and the device known, before any tensor is read: every parameter
(mixture-of-experts and learned positions included) in that dtype must fit in the memory
available on that device. ``MI_SKIP_MEMORY_CHECK=1`` or ``from_pretrained(...,
check_memory=False)`` skip that memory check, not the fixed bounds.
"""

from __future__ import annotations

import math

from typing import Any, Mapping

import torch

from mi_core.plugin import ConfigError, check_memory

from mi_transformer.config.axes import MlpLayout, Positions, TransformerConfig


class ConfigTooLarge(ConfigError):
    """A config whose parameters cannot fit in the memory available (checked before any
    allocation); detection still claims the checkpoint, so loading names the keys."""


def dense_params(vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int,
                 inter: int, *, tied: bool = True, gated: bool = False, positions: int = 0) -> int:
    """Parameters of a dense decoder (embeddings, attention, MLP, norms), biases left out: a
    lower bound of what loading allocates."""
    attn = 2 * hidden * head_dim * (heads + kv_heads)  # q and o per head; k and v per KV head
    mlp = hidden * inter * (3 if gated else 2)
    return vocab * hidden * (1 if tied else 2) + positions * hidden + layers * (
        attn + mlp + 4 * hidden)


#: Bounds no real checkpoint comes near (the largest published have ~2 trillion parameters,
#: a few hundred layers, vocabularies of ~10**6, widths of ~10**5): past them a config is refused
#: while parsing, whatever the memory here.
MAX_PARAMS = 10 * 10**12
MAX_LAYERS = 100_000
MAX_SIZE = 2**26
#: Keys (any family's spelling, GGUF's ``<arch>.block_count`` included) that count layers.
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "block_count")


def check_bounds(where: str, sizes: Mapping[str, Any], params: int) -> None:
    """ConfigTooLarge naming `where` and the offending key of `sizes` (key -> value) when a
    value or `params` is past what any real checkpoint has (the bounds above)."""
    for key, value in sizes.items():
        bound = MAX_LAYERS if key.rsplit(".", 1)[-1] in LAYER_KEYS else MAX_SIZE
        if isinstance(value, int) and value > bound:
            raise ConfigTooLarge(
                f"{where}: {key} = {value} is more than {bound:,} (no real checkpoint comes "
                f"near; refused before allocating, about {params:.3g} parameters, "
                f"{params / 2**30:,.3g} GiB at one byte each)")
    if params > MAX_PARAMS:
        keys = ", ".join(f"{k} = {v}" for k, v in sizes.items())
        raise ConfigTooLarge(f"{where}: {keys} imply about {params:.3g} parameters "
                             f"({params / 2**30:,.3g} GiB at one byte each), more than the "
                             f"{MAX_PARAMS:.3g} any real checkpoint comes near")


def check_size(where: str, sizes: Mapping[str, Any], params: int,
               dtype: torch.dtype | None = None, device: torch.device | str | None = None
               ) -> None:
    """ConfigTooLarge naming `where` and `sizes` (key -> value) when they are past the fixed
    bounds (:func:`check_bounds`, always) or, given `dtype` (load time), unless `params`
    parameters in `dtype` fit on `device`."""
    check_bounds(where, sizes, params)
    if dtype is None:  # parse time: the memory here says nothing about the checkpoint
        return
    keys = ", ".join(f"{k} = {v}" for k, v in sizes.items())
    check_memory(f"{where}: {keys} imply about {params:.3g} parameters",
                 params * dtype.itemsize, device, error=ConfigTooLarge)


#: TransformerConfig size fields in the order of :func:`dense_params`.
_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
           "intermediate_size")


def check_parsed(r: Any, base: Mapping[str, Any], keys: tuple[str, ...]) -> None:
    """Parse time: `base` holds the sizes read under the family's `keys` (in :data:`_FIELDS`
    order; "" for one the family does not spell); the keys the config has are named."""
    values = [base[f] for f in _FIELDS]
    named = {k: v for k, v in zip(keys, values) if k and r.has(k)}
    check_size(r.src, named, dense_params(*values))


def param_count(c: TransformerConfig) -> int:
    """Every parameter of `c` (biases and norm gains approximated): dense layers, MoE layers
    (router, experts, shared expert), embeddings, learned positions."""
    gated = c.mlp_layout is not MlpLayout.PLAIN
    positions = (c.max_positions or 0) if c.positions is Positions.LEARNED else 0
    total = dense_params(c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads,
                         c.head_dim, c.intermediate_size, tied=c.tie_word_embeddings,
                         gated=gated, positions=positions)
    total += _per_layer_extra(c)
    m = c.moe
    if m is not None:
        sparse = sum(c.layer_moe) if c.layer_moe else c.num_layers
        mats = 3 if m.gated else 2  # plain experts (Nemotron-H): up and down only
        d_in = m.latent_size or c.hidden_size  # the routed experts' width (latent or d_model)
        per_layer = (m.num_experts * (mats * m.expert_size * d_in + c.hidden_size)
                     + c.hidden_size * mats * m.shared_expert_size
                     + 2 * c.hidden_size * m.latent_size)
        total += sparse * (per_layer - c.hidden_size * c.intermediate_size * (3 if gated else 2))
    if c.shared_block is not None:  # (Zamba2) attention and MLP only in the shared weight sets
        total = _shared_block_params(c, total - c.num_layers * (
            2 * c.hidden_size * c.head_dim * (c.num_heads + c.num_kv_heads)
            + c.hidden_size * c.intermediate_size * 3 + 4 * c.hidden_size))
    return total


def _shared_block_params(c: TransformerConfig, rest: int) -> int:
    """`rest` (the embeddings) plus every mixer layer, the shared block's weight sets and each
    use's adapters and output projection (transformers' Zamba2 shapes)."""
    sb = c.shared_block
    assert sb is not None
    d, d2, m, r = c.hidden_size, 2 * c.hidden_size, c.intermediate_size, sb.adapter_rank
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    mixers = sum(math.prod(shape) for i in range(c.num_layers)
                 if (mc := c.mixer_of(i)) is not None
                 for shape in mc.spec.tensors(mc.settings).values())
    block = d2 * (q + 2 * kv) + q * d + 3 * d * m + d2 + d  # q, k, v, o, MLP, two norms
    use = d * d + r * (d + 2 * m) + (6 * r * d2 if sb.attn_adapters else 0)
    return rest + mixers + c.num_layers * d + sb.num_blocks * block + sb.uses * use
def _per_layer_extra(c: TransformerConfig) -> int:
    """What the Gemma-3n / Gemma-4 axes add to the dense estimate: head sizes, KV heads and
    MLP widths per layer (shared-KV layers without k / v), per-layer input embeddings (a
    vocabulary-sized table per layer), AltUp's projections and Laurel."""
    if not (c.layer_head_dim or c.layer_kv_heads or c.layer_mlp_size or c.layer_kv_source
            or c.per_layer_input or c.altup or c.laurel_rank):
        return 0
    d, gated = c.hidden_size, c.mlp_layout is not MlpLayout.PLAIN
    extra = 0
    for i in range(c.num_layers):
        hd, kv = c.head_dim_of(i), c.kv_heads_of(i) * (0 if c.shares_kv(i) else 1)
        extra += 2 * d * hd * (c.num_heads + kv) - 2 * d * c.head_dim * (
            c.num_heads + c.num_kv_heads)
        extra += d * (c.mlp_size_of(i) - c.intermediate_size) * (3 if gated else 2)
    p = c.per_layer_input
    if p is not None:
        extra += c.num_layers * p.dim * (p.vocab + 3 * d)
    if c.altup is not None:
        extra += 2 * (c.altup.num_inputs - 1) * d * d
    return extra + c.num_layers * 2 * d * c.laurel_rank


def sizes_of(c: TransformerConfig) -> dict[str, Any]:
    """The sizes that drive :func:`param_count`, for messages."""
    out: dict[str, Any] = {f: getattr(c, f) for f in _FIELDS}
    if c.moe is not None:
        out.update(num_experts=c.moe.num_experts, expert_size=c.moe.expert_size)
    if c.positions is Positions.LEARNED:
        out["max_positions"] = c.max_positions
    return out


def check_loaded(c: TransformerConfig, where: str, dtype: torch.dtype,
                 device: torch.device | str) -> None:
    """Load time: every parameter of `c` in `dtype` must fit on `device`."""
    check_size(where, sizes_of(c), param_count(c), dtype, device)

"""Per-layer input embeddings (Gemma-3n, Gemma-4; ``TransformerConfig.per_layer_input``).

A second embedding table gives each token a vector of width p = ``hidden_size_per_layer_input``
for every layer; with a projection of the (scaled) token embedding it forms layer i's input
[batch, seq, p], as transformers' ``get_per_layer_inputs`` / ``project_per_layer_inputs``:

    tok  = embed_tokens_per_layer[ids] * sqrt(p)                 [b, s, L, p]
    proj = rms_norm(per_layer_model_projection(embed) * d^-1/2)  [b, s, L, p]
    in_i = (proj + tok)[:, :, i] * 2^-1/2

After its MLP, layer i adds ``post_per_layer_input_norm(per_layer_projection(act(
per_layer_input_gate(x)) * in_i))`` (Gemma-4: to its residual stream; Gemma-3n: to every AltUp
stream but the first, from the corrected active stream).

Hook points: ``blocks.{i}.hook_per_layer_input`` [batch, seq, p] (in_i; an intervention
changes what the branch multiplies) and ``blocks.{i}.hook_per_layer_out`` [batch, seq,
d_model] (what the branch adds).
"""

from __future__ import annotations

import math
from typing import Callable

import attrs
import torch
import torch.nn.functional as F

from mi_core.plugin import HookRun, TokenizerError

from mi_transformer.config import PerLayerInputConfig, TransformerConfig
from mi_transformer.norm import Norm

#: checkpoint names: the global tensors (under the text model) and each layer's
GLOBAL = {"embed": "embed_tokens_per_layer", "proj": "per_layer_model_projection",
          "norm": "per_layer_projection_norm"}
LAYER = {"gate": "per_layer_input_gate", "proj": "per_layer_projection",
         "norm": "post_per_layer_input_norm"}


@attrs.define(eq=False)
class PerLayerInputWeights:
    """The global tensors: the table, the projection and its norm."""

    config: PerLayerInputConfig
    embed: torch.Tensor  # [vocab_per_layer, L * p]
    proj: torch.Tensor  # [L * p, d_model]
    norm: Norm  # over p


@attrs.define(eq=False)
class PerLayerBranch:
    """One layer's branch: gate [p, d_model], projection [d_model, p], its norm [d_model]."""

    gate: torch.Tensor
    proj: torch.Tensor
    norm: Norm

    def __call__(self, x: torch.Tensor, per_layer_input: torch.Tensor,
                 act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """x [b, s, d_model], per_layer_input [b, s, p] -> [b, s, d_model]."""
        return self.norm(F.linear(act(F.linear(x, self.gate)) * per_layer_input, self.proj))


def global_shapes(cfg: TransformerConfig, text_model: str
                  ) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Checkpoint name -> (slot, shape) of the global tensors (none without the axis)."""
    p = cfg.per_layer_input
    if p is None:
        return {}
    width = cfg.num_layers * p.dim
    return {text_model + GLOBAL["embed"] + ".weight": ("ple:embed", (p.vocab, width)),
            text_model + GLOBAL["proj"] + ".weight": ("ple:proj", (width, cfg.hidden_size)),
            text_model + GLOBAL["norm"] + ".weight": ("ple:norm", (p.dim,))}


def layer_shapes(cfg: TransformerConfig, prefix: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Checkpoint name -> (slot, shape) of one layer's branch under `prefix`."""
    p = cfg.per_layer_input
    if p is None:
        return {}
    d = cfg.hidden_size
    return {prefix + LAYER["gate"] + ".weight": ("ple:gate", (p.dim, d)),
            prefix + LAYER["proj"] + ".weight": ("ple:proj", (d, p.dim)),
            prefix + LAYER["norm"] + ".weight": ("ple:norm", (d,))}


def per_layer_inputs(w: PerLayerInputWeights, c: TransformerConfig, ids: torch.Tensor,
                     embeds: torch.Tensor) -> torch.Tensor:
    """ids [b, s], the scaled token embedding [b, s, d_model] -> every layer's input
    [b, s, L, p]. Ids outside the table read row 0 (Gemma-3n, ``clip_ids``) or are refused
    (Gemma-4, whose transformers code would index past it)."""
    p = w.config
    inside = (ids >= 0) & (ids < p.vocab)
    if p.clip_ids:
        ids = torch.where(inside, ids, torch.zeros_like(ids))
    elif not bool(inside.all()):
        bad = sorted(set(ids[~inside].tolist()))[:5]
        raise TokenizerError(f"token ids {bad} are outside the per-layer embedding table "
                             f"(vocab_size_per_layer_input {p.vocab})")
    b, s = ids.shape
    tok = F.embedding(ids, w.embed) * torch.tensor(math.sqrt(p.dim), dtype=w.embed.dtype)
    proj = F.linear(embeds, w.proj) * c.hidden_size ** -0.5
    proj = w.norm(proj.reshape(b, s, c.num_layers, p.dim))
    return (proj + tok.reshape(b, s, c.num_layers, p.dim)) * 2.0 ** -0.5


def branch(lw: PerLayerBranch, x: torch.Tensor, inputs: torch.Tensor, layer: int,
           act: Callable[[torch.Tensor], torch.Tensor], run: HookRun, in_name: str,
           out_name: str) -> torch.Tensor:
    """Layer `layer`'s branch on x [b, s, d_model], through its two hook points."""
    pli = run.apply(in_name, inputs[:, :, layer])
    return run.apply(out_name, lw(x, pli, act))


def hook_shape(c: TransformerConfig, suffix: str, batch: int, seq: int
               ) -> tuple[int, ...] | None:
    """``hook_per_layer_input``'s shape [b, s, p] (``hook_per_layer_out`` is [b, s, d_model],
    the backend's default)."""
    if c.per_layer_input is not None and suffix == "hook_per_layer_input":
        return (batch, seq, c.per_layer_input.dim)
    return None

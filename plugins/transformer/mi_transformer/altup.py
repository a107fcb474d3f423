"""AltUp's residual streams and Laurel's low-rank block (Gemma-3n; ``TransformerConfig.altup``,
``laurel_rank``), as transformers' ``Gemma3nTextAltUp`` / ``Gemma3nTextLaurelBlock`` compute
them.

The residual stream of an AltUp model is a stack of n streams S [n, batch, seq, d_model]
(n = ``altup_num_inputs``, a = ``altup_active_idx``):

- embedding: S_0 = the scaled token embedding, S_j = ``altup_projections[j-1]``(S_0) rescaled to
  S_0's RMS (per token), j >= 1;
- each layer: a router reads rms_norm(S_a) / d_model, m = tanh(router); the predictions are
  P_p = S_p + sum_q C_pq S_q with C = ``prediction_coefs``(m) [n, n] per token; the usual
  block (attention, Laurel, MLP) runs on P_a and gives ``activated``; the correction adds
  (activated - P_a) * (1 + ``correction_coefs``(m')) to every prediction (m' from
  ``activated``); the per-layer-input branch reads the corrected S_a (times
  ``correct_output_scale``) and is added to streams 1..n-1;
- readout: S_j (j >= 1) through ``altup_unembed_projections[j-1]`` rescaled to S_0's RMS, the
  n streams averaged, then the final norm.

``altup_coef_clip`` bounds the coefficient weights while training only; transformers does
not clip at inference, nor does this forward.

Laurel (learned augmented residual layer): laurel(h) = h + rms_norm(right(left(h))) on the
normalised block input h; the block's residual after attention is then (x + attn_out +
laurel(h)) / sqrt(2).
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch
import torch.nn.functional as F

from mi_core.plugin import HookRun

from mi_transformer import per_layer
from mi_transformer.config import AltUpConfig, TransformerConfig
from mi_transformer.norm import Norm

#: The backend (mi_transformer.model.TransformerBackend, which imports this module: typed
#: loosely so that no import goes back) and its per-layer call context (model._LayerCall).
Backend = Any

#: checkpoint names inside a layer (``altup.`` and ``laurel.``) and under the text model
ALTUP = {"correct_output_scale": "altup.correct_output_scale",
         "correction_coefs": "altup.correction_coefs.weight",
         "prediction_coefs": "altup.prediction_coefs.weight",
         "modality_router": "altup.modality_router.weight",
         "router_norm": "altup.router_norm.weight"}
LAUREL = {"left": "laurel.linear_left.weight", "right": "laurel.linear_right.weight",
          "norm": "laurel.post_laurel_norm.weight"}
STREAMS_IN, STREAMS_OUT = "altup_projections", "altup_unembed_projections"


@attrs.define(eq=False)
class AltUpWeights:
    """One layer's AltUp: the router (norm, [n, d_model]), coefficient maps, output scale."""

    config: AltUpConfig
    router_norm: Norm
    router: torch.Tensor  # [n, d_model]
    prediction_coefs: torch.Tensor  # [n * n, n]
    correction_coefs: torch.Tensor  # [n, n]
    correct_output_scale: torch.Tensor  # [d_model]

    def modalities(self, x: torch.Tensor) -> torch.Tensor:
        """x [b, s, d_model] -> tanh(router(rms_norm(x) / d_model)) [b, s, n]."""
        routed = F.linear(self.router_norm(x) * x.shape[-1] ** -1.0, self.router)
        return torch.tanh(routed.float()).type_as(x)

    def predict(self, streams: torch.Tensor) -> torch.Tensor:
        """S [n, b, s, d] -> the predictions P [n, b, s, d]."""
        n = self.config.num_inputs
        m = self.modalities(streams[self.config.active])
        coefs = F.linear(m, self.prediction_coefs).reshape(*m.shape[:-1], n, n).permute(
            0, 1, 3, 2)
        pred = torch.matmul(streams.permute(1, 2, 3, 0), coefs).permute(3, 0, 1, 2)
        return (pred + streams).contiguous().type_as(streams)

    def correct(self, predictions: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
        """P [n, b, s, d], the block's output on P_a [b, s, d] -> the corrected streams."""
        m = self.modalities(activated)
        innovation = activated - predictions[self.config.active]
        coefs = (F.linear(m, self.correction_coefs) + 1.0).permute(2, 0, 1).unsqueeze(-1)
        return (innovation[None] * coefs + predictions).contiguous().type_as(activated)

    def scale_output(self, x: torch.Tensor) -> torch.Tensor:
        """The corrected active stream as the per-layer-input branch reads it."""
        if not self.config.correct_scale:
            return x
        s = self.correct_output_scale
        return (x.type_as(s) * s).type_as(x)


@attrs.define(eq=False)
class LaurelWeights:
    """Laurel: left [rank, d_model], right [d_model, rank], the norm of its output."""

    left: torch.Tensor
    right: torch.Tensor
    norm: Norm

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """The normalised block input h [b, s, d] -> h + norm(right(left(h)))."""
        return h + self.norm(F.linear(F.linear(h, self.left), self.right))


def _rescaled(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """x scaled per token to the RMS `target` [.., 1] (its own RMS floored at sqrt(1e-5))."""
    new = torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True).clamp(min=1e-5))
    return x * target / new


def streams_in(embed: torch.Tensor, projections: list[torch.Tensor]) -> torch.Tensor:
    """The scaled token embedding [b, s, d] -> the streams [n, b, s, d]."""
    target = torch.mean(embed ** 2, dim=-1, keepdim=True) ** 0.5
    out = [embed] + [_rescaled(F.linear(embed, w).to(embed.dtype), target)
                     for w in projections]
    return torch.stack(out, dim=0)


def streams_out(streams: torch.Tensor, projections: list[torch.Tensor]) -> torch.Tensor:
    """The last layer's streams [n, b, s, d] -> their average [b, s, d] (before the final
    norm), streams 1.. through the unembedding projections rescaled to stream 0's RMS."""
    target = torch.mean(streams[0] ** 2, dim=-1, keepdim=True) ** 0.5
    out = [streams[0]] + [_rescaled(F.linear(streams[j + 1], w).to(streams.dtype), target)
                          for j, w in enumerate(projections)]
    return torch.mean(torch.stack(out), dim=0)


def laurel_residual(x: torch.Tensor, attn_out: torch.Tensor, laurel_out: torch.Tensor
                    ) -> torch.Tensor:
    """The block's residual after attention with Laurel: (x + attn_out + laurel) / sqrt 2."""
    return (x + attn_out + laurel_out) / math.sqrt(2)


def global_shapes(cfg: TransformerConfig, text_model: str
                  ) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Checkpoint name -> (slot, shape) of the stream projections (none without AltUp)."""
    if cfg.altup is None:
        return {}
    d = cfg.hidden_size
    out = {}
    for j in range(cfg.altup.num_inputs - 1):
        out[f"{text_model}{STREAMS_IN}.{j}.weight"] = (f"altup:in.{j}", (d, d))
        out[f"{text_model}{STREAMS_OUT}.{j}.weight"] = (f"altup:out.{j}", (d, d))
    return out


def layer_shapes(cfg: TransformerConfig, prefix: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Checkpoint name -> (slot, shape) of one layer's AltUp and Laurel tensors."""
    d, out = cfg.hidden_size, {}
    if cfg.altup is not None:
        n = cfg.altup.num_inputs
        shapes = {"correct_output_scale": (d,), "correction_coefs": (n, n),
                  "prediction_coefs": (n * n, n), "modality_router": (n, d),
                  "router_norm": (d,)}
        out.update({prefix + ALTUP[k]: ("altup:" + k, v) for k, v in shapes.items()})
    if cfg.laurel_rank:
        r = cfg.laurel_rank
        shapes = {"left": (r, d), "right": (d, r), "norm": (d,)}
        out.update({prefix + LAUREL[k]: ("laurel:" + k, v) for k, v in shapes.items()})
    return out


# -- the block of an AltUp model and its hook points -----------------------------------------

def altup_block(be: Backend, i: int, streams: torch.Tensor, run: HookRun, ctx: Any
                ) -> torch.Tensor:
    """Layer `i` of an AltUp model: the streams [n, batch, seq, d_model] -> the same.

    The backend's sublayers (attention, Laurel, MLP) run on the active stream's prediction;
    the per-layer-input branch reads the corrected active stream and is added to streams
    1..n-1 (as transformers, whichever stream is active). ``hook_resid_pre`` /
    ``hook_resid_post`` carry the active stream of the layer's input / output (an edit there
    is written back into the stack); the whole stack is ``altup.hook_streams_pre`` /
    ``altup.hook_streams_post``."""
    lw, n, a = be.w.layers[i], be.names[i], be.config.altup.active
    streams = streams_hook(run, n.streams_pre, streams)
    streams = stream_hook(run, n.resid_pre, streams, a)
    pred = streams_hook(run, n.predictions, lw.altup.predict(streams))
    activated = run.apply(n.activated, be._sublayers(i, pred[a], run, ctx))
    out = streams_hook(run, n.corrected, lw.altup.correct(pred, activated))
    if lw.ple is not None:
        first = lw.altup.scale_output(out[a])
        add = per_layer.branch(lw.ple, first, ctx.ple, i, be.act, run, n.ple_in, n.ple_out)
        out = torch.cat([out[:1], out[1:] + add], dim=0)  # streams 1.., as transformers
    out = streams_hook(run, n.streams_post, out)
    return stream_hook(run, n.resid_post, out, a)


def streams_hook(run: HookRun, name: str, streams: torch.Tensor) -> torch.Tensor:
    """The streams [n, b, s, d] through the point `name`, which sees them batch first
    [b, s, n, d] (a view: nothing is copied unless hooked)."""
    if not run.wants(name):
        return streams
    return run.apply(name, streams.permute(1, 2, 0, 3)).permute(2, 0, 1, 3)


def stream_hook(run: HookRun, name: str, streams: torch.Tensor, a: int) -> torch.Tensor:
    """Stream `a` of [n, b, s, d] through the point `name`; what the point returns, when it
    is not the stream itself (an intervention's result, or the tensor a gradient capture
    hooks), is written back into the stack (out of place: captures keep what they saw), so
    the rest of the forward reads it."""
    if not run.wants(name):
        return streams
    x = streams[a]
    y = run.apply(name, x)
    return streams if y is x else with_stream(streams, a, y)


def with_stream(streams: torch.Tensor, a: int, x: torch.Tensor) -> torch.Tensor:
    """[n, b, s, d] with stream `a` replaced by x [b, s, d] (a new tensor)."""
    return torch.cat([streams[:a], x[None], streams[a + 1:]], dim=0)


def hook_shape(c: TransformerConfig, suffix: str, batch: int, seq: int
               ) -> tuple[int, ...] | None:
    """The stream stacks' points [b, s, n, d_model] (AltUp's [b, s, d_model] points fall
    through to the backend's default)."""
    if c.altup is not None and suffix in ("altup.hook_streams_pre", "altup.hook_predictions",
                                          "altup.hook_corrected", "altup.hook_streams_post"):
        return (batch, seq, c.altup.num_inputs, c.hidden_size)
    return None

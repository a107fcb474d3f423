"""Reconstruction metrics: MSE, explained variance, L0, and the CE loss cost of splicing."""

from __future__ import annotations

from typing import Any

import attrs
import torch
import torch.nn.functional as F

from mi_core.plugin import HookSpec, Zero
from mi_sae.sae import SparseAutoencoder


@attrs.define
class ReconstructionMetrics:
    """How well an SAE reconstructs a hook's activations (and what splicing it costs).

    explained_variance = 1 - sum((y - y_hat)^2) / sum((y - mean_tokens(y))^2) over all
    tokens; mse is the mean over tokens and dimensions; l0 the mean number of active
    features per token. CE losses are mean next-token cross-entropies (nats);
    ce_loss_recovered = (zero - spliced) / (zero - clean), with the hook zero-ablated.
    """

    hook_point: str
    n_tokens: int
    mse: float
    explained_variance: float
    l0: float
    ce_loss_clean: float | None = None
    ce_loss_spliced: float | None = None
    ce_loss_zero_ablation: float | None = None
    ce_loss_increase: float | None = None
    ce_loss_recovered: float | None = None


def activation_metrics(sae: SparseAutoencoder, x: torch.Tensor, target: torch.Tensor | None = None,
                       mask: torch.Tensor | None = None) -> ReconstructionMetrics:
    """Metrics on activations x [..., d_in]; `target` (transcoders: the output hook's
    activation) defaults to x; `mask` [leading dims] selects the tokens to count."""
    out, f = sae.reconstruct_with_features(x)
    y = x if target is None else target
    ntok = f.shape[:-1].numel()
    y2 = y.reshape(ntok, -1).to(out.dtype)
    o2 = out.reshape(ntok, -1)
    l0 = (f.reshape(ntok, -1) != 0).sum(-1).to(out.dtype)
    if mask is not None:
        sel = mask.reshape(-1).bool().to(y2.device)
        y2, o2, l0 = y2[sel], o2[sel], l0[sel]
    err = (y2 - o2).pow(2)
    sst = (y2 - y2.mean(0)).pow(2).sum()
    ev = 1.0 - float(err.sum() / sst) if float(sst) > 0 else float("nan")
    return ReconstructionMetrics(hook_point=str(sae.hook_point), n_tokens=int(y2.shape[0]),
                                 mse=float(err.mean()), explained_variance=ev,
                                 l0=float(l0.mean()))


def next_token_ce(logits: torch.Tensor, ids: torch.Tensor,
                  attention_mask: torch.Tensor | None = None) -> float:
    """Mean cross-entropy of predicting ids[:, 1:] from logits[:, :-1] (padding excluded)."""
    lg = logits[:, :-1].float().reshape(-1, logits.shape[-1])
    tgt = ids[:, 1:].reshape(-1)
    loss = F.cross_entropy(lg, tgt, reduction="none")
    if attention_mask is None:
        return float(loss.mean())
    m = (attention_mask[:, 1:] * attention_mask[:, :-1]).reshape(-1).to(loss.dtype)
    return float((loss * m).sum() / m.sum())


def evaluate(model: Any, sae: SparseAutoencoder, ids: torch.Tensor,
             attention_mask: torch.Tensor | None = None) -> ReconstructionMetrics:
    """Run `model` clean, spliced and zero-ablated on ids [batch, seq]; all metrics."""
    sae.check_model(model)
    hp = sae.require_hook()
    out_hp = sae.hook_point_out or hp
    clean = model.forward(ids, HookSpec().capture(hp).capture(out_hp), attention_mask=attention_mask)
    m = activation_metrics(sae, clean[hp], clean[out_hp] if sae.cfg.transcoder else None,
                           attention_mask)
    spliced = model.forward(ids, sae.splice(HookSpec()), attention_mask=attention_mask)
    zero = model.forward(ids, HookSpec().intervene(out_hp, Zero()), attention_mask=attention_mask)
    ids = ids.to(clean.output.device)
    ce_c = next_token_ce(clean.output, ids, attention_mask)
    ce_s = next_token_ce(spliced.output, ids, attention_mask)
    ce_z = next_token_ce(zero.output, ids, attention_mask)
    return attrs.evolve(m, ce_loss_clean=ce_c, ce_loss_spliced=ce_s, ce_loss_zero_ablation=ce_z,
                        ce_loss_increase=ce_s - ce_c,
                        ce_loss_recovered=(ce_z - ce_s) / (ce_z - ce_c) if ce_z != ce_c else None)

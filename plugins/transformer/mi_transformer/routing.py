"""Routers beyond softmax-top-k: sigmoid scores, a selection bias, group-limited choice,
a clamped renormalisation and routed scaling (GLM-4.5, ERNIE-4.5, DeepSeek-V2 / V3, Llama 4),
as transformers computes them (``Glm4MoeTopkRouter``, ``Ernie4_5_MoeTopKRouter``,
``DeepseekV2Moe``, ``DeepseekV3TopkRouter``, ``Llama4Router``).

The selection bias (``e_score_correction_bias``) only decides *which* experts run: the
weights are the unbiased scores of the chosen experts. The hooks are the same as the plain
router's (:mod:`mi_transformer.moe`): ``hook_router_logits`` before the softmax / sigmoid,
``hook_expert_weights`` after renormalisation and scaling, ``hook_expert_indices``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mi_transformer.config import MoeConfig


def scores_and_choice(c: MoeConfig, logits: torch.Tensor, bias: torch.Tensor | None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., n_experts] -> (weights, indices) [..., top_k], float32 weights.

    Softmax or sigmoid scores in float32; top-k of (scores + bias), within the `topk_group`
    groups that score highest when experts are grouped (a group's score: its best expert's
    with `group_by_max`, DeepSeek-V2; else the sum of its two best biased scores, GLM /
    DeepSeek-V3); weights are the chosen experts' unbiased scores, renormalised (sum + 1e-20
    for sigmoid scores, as GLM / DeepSeek-V3, or + ``sigmoid_norm_eps``, LFM2-MoE's 1e-6;
    max(sum, norm_min) for softmax, as ERNIE) and
    multiplied by `routed_scaling`. Llama 4's router (top-k of the logits, sigmoid of the
    chosen) is sigmoid scoring without renormalisation: the sigmoid keeps the logits' order.
    """
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, c.num_experts).float()
    if c.scoring == "sigmoid":
        scores = flat.sigmoid()
    else:
        scores = F.softmax(flat, dim=-1, dtype=torch.float32)
    choice = scores if bias is None else scores + bias.reshape(-1).float()
    if c.n_group > 1:
        per = c.num_experts // c.n_group
        grouped = choice.view(-1, c.n_group, per)
        if c.group_by_max:
            group_scores = grouped.max(dim=-1).values
        else:
            group_scores = grouped.topk(min(2, per), dim=-1)[0].sum(dim=-1)
        keep = torch.topk(group_scores, k=c.topk_group, dim=-1, sorted=False)[1]
        mask = torch.zeros_like(group_scores).scatter_(1, keep, 1.0).bool()
        choice = choice.masked_fill(~mask.repeat_interleave(per, dim=1), float("-inf"))
    idx = torch.topk(choice, c.top_k, dim=-1)[1]
    weights = scores.gather(1, idx)
    if c.norm_topk_prob:
        total = weights.sum(dim=-1, keepdim=True)
        if c.scoring == "sigmoid":
            weights = weights / (total + c.sigmoid_norm_eps)
        else:
            weights = weights / total.clamp(min=c.norm_min)
    if c.routed_scaling != 1.0:
        weights = weights * c.routed_scaling
    return weights.view(*lead, c.top_k), idx.view(*lead, c.top_k)

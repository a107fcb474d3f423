"""The gated delta rule (one scalar decay per head) on the shared rank-1 scan, against a
float64 token-by-token loop written out here as transformers' torch_recurrent_gated_delta_rule
does it: ``S = exp(g) S; S += k (beta (v - S^T k))^T; y = S^T q``. Decays as fast as
Qwen3-Next's (up to 16 nats per token) must neither overflow nor lose precision."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mi_core.recurrence import (
    delta_scan, rank1_effective_attention, rank1_scan, rank1_states, read_states,
)

B, T, H, K, V = 2, 45, 3, 8, 6


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def naive_gated_delta(q, k, v, g, beta, s):
    q, k, v, g, beta, s = (x.double() for x in (q, k, v, g, beta, s))
    ys = []
    for t in range(q.shape[1]):
        s = s * g[:, t].exp()[..., None, None]
        mem = (s * k[:, t, :, :, None]).sum(-2)                       # S^T k  [B, H, V]
        delta = (v[:, t] - mem) * beta[:, t, :, None]
        s = s + k[:, t, :, :, None] * delta[:, :, None, :]
        ys.append(torch.einsum("bhk,bhkv->bhv", q[:, t], s))
    return torch.stack(ys, 1), s


def _inputs(span: float):
    q = F.normalize(_rand(B, T, H, K, seed=1), dim=-1) * K ** -0.5
    k = F.normalize(_rand(B, T, H, K, seed=2), dim=-1)
    v = _rand(B, T, H, V, seed=3)
    g = -span * torch.rand(B, T, H, generator=torch.Generator().manual_seed(4))
    beta = torch.rand(B, T, H, generator=torch.Generator().manual_seed(5))
    return q, k, v, g, beta, _rand(B, H, K, V, seed=6)


def _rank1(k, g, beta):
    """The delta rule in the rank-1 layout: a = k, b = -exp(g) beta k, written key beta k."""
    w = g.exp()[..., None]
    return g[..., None], k, -(w * beta[..., None]) * k, beta[..., None] * k


@pytest.mark.parametrize("span, chunk", [(0.5, 16), (16.0, 16), (16.0, 64), (3.0, 1)],
                         ids=["slow", "fast16", "fast64", "chunk1"])
def test_the_chunked_gated_delta_rule_is_the_recurrence(span, chunk) -> None:
    q, k, v, g, beta, s0 = _inputs(span)
    lg, a, b, kw = _rank1(k, g, beta)
    y, s = rank1_scan(q, lg, kw, v, a, b, s0, chunk=chunk)
    y_ref, s_ref = naive_gated_delta(q, k, v, g, beta, s0)
    assert torch.isfinite(y).all()
    assert (y - y_ref).abs().max().item() < 1e-4 and (s - s_ref).abs().max().item() < 1e-4
    y1, s1 = rank1_scan(q[:, :1], lg[:, :1], kw[:, :1], v[:, :1], a[:, :1], b[:, :1], s0)
    y1_ref, s1_ref = naive_gated_delta(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], s0)
    assert (y1 - y1_ref).abs().max().item() < 1e-5 and (s1 - s1_ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("span, chunk", [(0.5, 16), (16.0, 16), (16.0, 64), (3.0, 1),
                                         (16.0, 7)],
                         ids=["slow", "fast16", "fast64", "chunk1", "chunk7_padded"])
def test_the_delta_rule_s_own_chunked_form_is_the_recurrence(span, chunk) -> None:
    """delta_scan (the WY form the gated DeltaNet forward uses): the same recurrence, chunks
    that do not divide the call included (end padding), and one step."""
    q, k, v, g, beta, s0 = _inputs(span)
    _, _, _, kw = _rank1(k, g, beta)
    y, s = delta_scan(q, g, kw, v, k, s0, chunk=chunk)
    y_ref, s_ref = naive_gated_delta(q, k, v, g, beta, s0)
    assert torch.isfinite(y).all() and y.is_contiguous()
    assert (y - y_ref).abs().max().item() < 1e-5 and (s - s_ref).abs().max().item() < 1e-5
    y1, s1 = delta_scan(q[:, :1], g[:, :1, :, None], kw[:, :1], v[:, :1], k[:, :1], s0)
    y1_ref, s1_ref = naive_gated_delta(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], s0)
    assert (y1 - y1_ref).abs().max().item() < 1e-5 and (s1 - s1_ref).abs().max().item() < 1e-5


def test_gated_delta_states_and_effective_attention_reproduce_the_scan() -> None:
    q, k, v, g, beta, _ = _inputs(8.0)
    lg, a, b, kw = _rank1(k, g, beta)
    zero = torch.zeros(B, H, K, V)
    y, s = rank1_scan(q, lg, kw, v, a, b, zero, chunk=64)
    states = rank1_states(lg, kw, v, a, b, zero)
    assert (read_states(q, states) - y).abs().max().item() < 1e-5
    assert (states[:, -1] - s).abs().max().item() < 1e-5
    eff = rank1_effective_attention(q, kw, lg, a, b)                  # [B, H, T, T]
    assert (torch.einsum("bhts,bshv->bthv", eff, v) - y).abs().max().item() < 1e-5
    assert eff.triu(1).abs().max().item() == 0.0

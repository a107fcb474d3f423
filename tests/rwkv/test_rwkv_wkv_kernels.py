"""The chunked WKV kernels against a plain per-token recurrence (float64 reference)."""

from __future__ import annotations

import pytest
import torch

from mi_rwkv.v6 import wkv6
from mi_rwkv.v7 import wkv7


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def naive_wkv6(r, k, v, logw, u, s):
    r, k, v, w, u, s = (x.double() for x in (r, k, v, logw.exp(), u, s))
    ys = []
    for t in range(r.shape[1]):
        kv = k[:, t, :, :, None] * v[:, t, :, None, :]
        ys.append(torch.einsum("bhk,bhkv->bhv", r[:, t], s + u[None, :, :, None] * kv))
        s = w[:, t, :, :, None] * s + kv
    return torch.stack(ys, 1), s


def naive_wkv7(r, logw, k, v, a, b, s):
    r, w, k, v, a, b, s = (x.double() for x in (r, logw.exp(), k, v, a, b, s))
    ys = []
    for t in range(r.shape[1]):
        sa = torch.einsum("bhk,bhkv->bhv", a[:, t], s)
        s = w[:, t, :, :, None] * s + b[:, t, :, :, None] * sa[:, :, None, :] + k[:, t, :, :, None] * v[:, t, :, None, :]
        ys.append(torch.einsum("bhk,bhkv->bhv", r[:, t], s))
    return torch.stack(ys, 1), s


@pytest.mark.parametrize("decay_span", [(-6.0, 1.0), (1.0, 3.0)])  # the second forces the pairwise path
def test_chunked_wkv6_matches_the_recurrence(decay_span: tuple[float, float]) -> None:
    B, T, H, K = 2, 37, 2, 16
    r, k, v = (_rand(B, T, H, K, seed=i) for i in range(3))
    lo, hi = decay_span
    logw = -torch.exp(lo + (hi - lo) * torch.rand(B, T, H, K, generator=torch.Generator().manual_seed(3)))
    u, s0 = _rand(H, K, seed=4), _rand(B, H, K, K, seed=5)
    y_ref, s_ref = naive_wkv6(r, k, v, logw, u, s0)
    y, s = wkv6(r, k, v, logw, u, s0, chunk=16)
    assert (y - y_ref).abs().max().item() < 1e-4 and (s - s_ref).abs().max().item() < 1e-4
    y1, s1 = wkv6(r[:, :1], k[:, :1], v[:, :1], logw[:, :1], u, s0)  # the single-step path
    y1_ref, s1_ref = naive_wkv6(r[:, :1], k[:, :1], v[:, :1], logw[:, :1], u, s0)
    assert (y1 - y1_ref).abs().max().item() < 1e-5 and (s1 - s1_ref).abs().max().item() < 1e-5


def test_chunked_wkv7_matches_the_recurrence() -> None:
    B, T, H, K = 2, 37, 2, 16
    r, k, v = (_rand(B, T, H, K, seed=i) for i in range(3))
    logw = -0.6065 * torch.rand(B, T, H, K, generator=torch.Generator().manual_seed(3))
    kk = torch.nn.functional.normalize(_rand(B, T, H, K, seed=4), dim=-1)
    iclr = torch.rand(B, T, H, K, generator=torch.Generator().manual_seed(5))
    s0 = _rand(B, H, K, K, seed=6)
    y_ref, s_ref = naive_wkv7(r, logw, k, v, -kk, kk * iclr, s0)
    for chunk in (1, 16, 64):
        y, s = wkv7(r, logw, k, v, -kk, kk * iclr, s0, chunk=chunk)
        assert (y - y_ref).abs().max().item() < 1e-4 and (s - s_ref).abs().max().item() < 1e-4
    y1, s1 = wkv7(r[:, :1], logw[:, :1], k[:, :1], v[:, :1], -kk[:, :1], (kk * iclr)[:, :1], s0)
    y1_ref, s1_ref = naive_wkv7(r[:, :1], logw[:, :1], k[:, :1], v[:, :1], -kk[:, :1], (kk * iclr)[:, :1], s0)
    assert (y1 - y1_ref).abs().max().item() < 1e-5 and (s1 - s1_ref).abs().max().item() < 1e-5

"""The shared recurrence layer (mi_core.recurrence) against plain float64 token-by-token
recurrences written out here: the chunked scans, the exact per-step states, the effective
attention (A @ v == y) and the one reading of the state specs (write scales)."""

from __future__ import annotations

import pytest
import torch

import mi_core as mi
from mi_core.recurrence import (
    diagonal_effective_attention, diagonal_scan, diagonal_states, rank1_effective_attention,
    rank1_scan, rank1_states, read_states, write_scales, written_keys,
)

B, T, H, K, V = 2, 37, 3, 8, 5


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def naive_diagonal(q, k, v, g, s, inclusive, bonus=None):
    q, k, v, w, s = (x.double() for x in (q, k, v, g.exp(), s))
    ys = []
    for t in range(q.shape[1]):
        kv = k[:, t, :, :, None] * v[:, t, :, None, :]
        new = w[:, t, :, :, None] * s + kv
        read = new if inclusive else s + (0 if bonus is None else bonus.double()[None, :, :, None] * kv)
        ys.append(torch.einsum("bhk,bhkv->bhv", q[:, t], read))
        s = new
    return torch.stack(ys, 1), s


def _inputs(scalar: bool, span: tuple[float, float] = (-4.0, 1.0), vd: int = V):
    q, k = _rand(B, T, H, K, seed=1), _rand(B, T, H, K, seed=2)
    v = _rand(B, T, H, vd, seed=3)
    lo, hi = span
    u = torch.rand(B, T, H, 1 if scalar else K, generator=torch.Generator().manual_seed(4))
    g = -torch.exp(lo + (hi - lo) * u)
    return q, k, v, g, _rand(B, H, K, vd, seed=5)


@pytest.mark.parametrize("scalar", [False, True], ids=["per_channel", "per_head"])
@pytest.mark.parametrize("inclusive", [True, False], ids=["inclusive", "exclusive"])
@pytest.mark.parametrize("chunk, vd", [(1, V), (16, V), (64, V), (16, 1)],
                         ids=["chunk1", "chunk16", "chunk64", "value1"])
def test_the_chunked_diagonal_scan_is_the_recurrence(scalar, inclusive, chunk, vd) -> None:
    """(value1 with a per-channel decay takes the vectorised token-by-token path.)"""
    q, k, v, g, s0 = _inputs(scalar, vd=vd)
    bonus = None if inclusive else _rand(H, K, seed=6)
    y, s = diagonal_scan(q, k, v, g, s0, inclusive=inclusive, bonus=bonus, chunk=chunk)
    y_ref, s_ref = naive_diagonal(q, k, v, g, s0, inclusive, bonus)
    assert (y - y_ref).abs().max().item() < 1e-4 and (s - s_ref).abs().max().item() < 1e-4
    y1, s1 = diagonal_scan(q[:, :1], k[:, :1], v[:, :1], g[:, :1], s0, inclusive=inclusive,
                           bonus=bonus)  # the one-step path
    y1_ref, s1_ref = naive_diagonal(q[:, :1], k[:, :1], v[:, :1], g[:, :1], s0, inclusive, bonus)
    assert (y1 - y1_ref).abs().max().item() < 1e-5 and (s1 - s1_ref).abs().max().item() < 1e-5


def test_very_fast_decays_neither_overflow_nor_lose_the_recent_tokens() -> None:
    q, k, v, g, s0 = _inputs(False, span=(1.0, 3.5))  # up to e^3.5 = 33 nats per token
    y, _ = diagonal_scan(q, k, v, g, s0, chunk=16)
    y_ref, _ = naive_diagonal(q, k, v, g, s0, True)
    assert torch.isfinite(y).all() and (y - y_ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("scalar", [False, True], ids=["per_channel", "per_head"])
def test_per_step_states_and_effective_attention_reproduce_the_scan(scalar) -> None:
    q, k, v, g, s0 = _inputs(scalar)
    zero = torch.zeros_like(s0)
    states = diagonal_states(k, v, g, zero)                          # [B, T, H, K, V]
    y, s = diagonal_scan(q, k, v, g, zero)
    assert (read_states(q, states) - y).abs().max().item() < 1e-4
    assert (states[:, -1] - s).abs().max().item() < 1e-4
    a = diagonal_effective_attention(q, k, g)                       # [B, H, T, T]
    assert (torch.einsum("bhts,bshv->bthv", a, v) - y).abs().max().item() < 1e-4
    assert a.triu(1).abs().max().item() == 0.0


def test_exclusive_effective_attention_has_the_bonus_on_the_diagonal() -> None:
    q, k, v, g, _ = _inputs(False)
    u = _rand(H, K, seed=7)
    y, _ = diagonal_scan(q, k, v, g, torch.zeros(B, H, K, V), inclusive=False, bonus=u)
    a = diagonal_effective_attention(q, k, g, inclusive=False, bonus=u)
    assert (torch.einsum("bhts,bshv->bthv", a, v) - y).abs().max().item() < 1e-4


def test_the_rank1_states_and_effective_attention_reproduce_its_scan() -> None:
    q, k, v = (_rand(B, T, H, K, seed=i) for i in (1, 2, 3))
    g = -0.6 * torch.rand(B, T, H, K, generator=torch.Generator().manual_seed(4))
    kappa = torch.nn.functional.normalize(_rand(B, T, H, K, seed=5), dim=-1)
    lr = torch.rand(B, T, H, K, generator=torch.Generator().manual_seed(6))
    zero = torch.zeros(B, H, K, K)
    y, s = rank1_scan(q, g, k, v, -kappa, kappa * lr, zero)
    states = rank1_states(g, k, v, -kappa, kappa * lr, zero)
    assert (read_states(q, states) - y).abs().max().item() < 1e-4
    assert (states[:, -1] - s).abs().max().item() < 1e-4
    a = rank1_effective_attention(q, k, g, -kappa, kappa * lr)
    assert (torch.einsum("bhts,bshv->bthv", a, v) - y).abs().max().item() < 1e-4


def test_write_scales_read_positions_layers_heads_and_let_knockout_win() -> None:
    ko = mi.StateKnockoutSpec(positions=[2, -1]).layer(1)
    st = mi.StateSteeringSpec(3.0, positions=[2, 5]).heads([0, 2])
    assert write_scales(ko, st, 0, 8, 0, 3, torch.device("cpu")).tolist() == [
        [1, 1, 1], [1, 1, 1], [3, 1, 3], [1, 1, 1], [1, 1, 1], [3, 1, 3], [1, 1, 1], [1, 1, 1]]
    s = write_scales(ko, st, 1, 8, 0, 3, torch.device("cpu"))
    assert s[2].tolist() == [0, 0, 0] and s[7].tolist() == [0, 0, 0] and s[5].tolist() == [3, 1, 3]
    # with an offset (a carried state), positions are absolute: 5 is this call's 1
    assert write_scales(None, st, 0, 4, 4, 3, torch.device("cpu"))[1].tolist() == [3, 1, 3]
    assert write_scales(None, None, 0, 4, 0, 3, torch.device("cpu")) is None
    k = torch.ones(1, 4, 3, 2)
    active = torch.tensor([[False, True, True, True]])
    kw = written_keys(k, write_scales(ko, None, 1, 4, 0, 3, torch.device("cpu")), active)
    assert kw[0, :, :, 0].tolist() == [[0, 0, 0], [1, 1, 1], [0, 0, 0], [0, 0, 0]]


def test_rwkv_state_knockout_of_one_head_leaves_the_other_heads(tmp_path) -> None:
    """The per-head state specs apply to RWKV's heads too (the same write scales)."""
    from tests.support import rwkv_ckpt

    d = rwkv_ckpt.write_checkpoint(tmp_path, rwkv_ckpt.v7_tensors(1, 128, 64, 300),
                                   rwkv_ckpt.v7_config(1, 128, 64, 300))
    model = mi.MIModel.from_pretrained(d)
    ids = rwkv_ckpt.random_ids(1, 8, seed=3)
    n = "blocks.0.rwkv.hook_effective_attn"
    spec = mi.StateKnockoutSpec(positions=[2]).heads([1])
    a = model.forward(ids, mi.HookSpec().set_state_knockout(spec).capture(n))[n][0]
    base = model.forward(ids, mi.HookSpec().capture(n))[n][0]
    assert a[1, 2:, 2].abs().max().item() == 0.0
    assert torch.equal(a[0], base[0]) and base[1, 3:, 2].abs().max().item() > 0
    with pytest.raises(mi.InterventionError, match=r"heads \[2\] out of range"):
        model.forward(ids, mi.HookSpec().set_state_knockout(mi.StateKnockoutSpec([1]).heads([2])))

"""A tiny LLaMA-like backend for testing the analysis stack without any plugin.

It implements the MIBackend protocol with TransformerLens hook names and shapes, calls
``run.apply`` at every point, and offers what `mi_core.interp` uses beyond hooks:
``get_weight``, ``final_norm``, ``unembed``, ``project_to_vocab`` and the recurrent forward
kwargs ``layer_schedule`` / ``between_layers``. RMSNorm, RoPE, gated SiLU MLP, GQA.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import torch

from mi_core.errors import HookError
from mi_core.hooks import HookCache, HookPoint, HookSpec
from mi_core.shapes import standard_shape
from mi_core.tokenizer import EncodingWithOffsets

_LAYER_SUFFIXES = (
    "hook_resid_pre", "ln1.hook_scale", "ln1.hook_normalized",
    "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_rot_q", "attn.hook_rot_k",
    "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z", "attn.hook_result",
    "hook_attn_out", "hook_resid_mid", "ln2.hook_scale", "ln2.hook_normalized",
    "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out", "hook_resid_post",
)


class CharTokenizer:
    """Byte-level tokenizer: id = byte value + 1; id 0 is BOS. Implements MITokenizer."""

    def __init__(self, vocab_size: int = 258) -> None:
        self._n = vocab_size

    vocab_size = property(lambda self: self._n)
    bos_token_id = property(lambda self: 0)
    eos_token_id = property(lambda self: None)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([0] if add_special_tokens else []) + [b + 1 for b in text.encode("latin-1")]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join("<s>" if i == 0 else chr(i - 1) if i <= 256 else f"<{i}>" for i in ids)

    def encode_with_offsets(self, text: str, add_special_tokens: bool = True) -> EncodingWithOffsets:
        ids = self.encode(text, add_special_tokens)
        offs = ([(0, 0)] if add_special_tokens else []) + [(i, i + 1) for i in range(len(text))]
        return EncodingWithOffsets(ids, [self.decode([i]) for i in ids], offs)

    def to_str_tokens(self, text_or_ids: str | Sequence[int]) -> list[str]:
        ids = self.encode(text_or_ids) if isinstance(text_or_ids, str) else list(text_or_ids)
        return [self.decode([i]) for i in ids]


@attrs.define
class FakeConfig:
    n_layers: int = 3
    d_model: int = 32
    n_heads: int = 4
    n_kv_heads: int = 2
    d_head: int = 8
    d_mlp: int = 48
    vocab: int = 258
    eps: float = 1e-6
    rope_theta: float = 10000.0


class FakeBackend:
    """A random-weight decoder-only transformer with every TransformerLens hook point."""

    name = "fake"
    #: Capabilities: hook shapes, layer schedule, weight access, readout, gradients (no KV
    #: cache: generation recomputes the prefix; no recurrent state).
    differentiable = True

    def __init__(self, cfg: FakeConfig | None = None, seed: int = 0,
                 rwkv_like: bool = False) -> None:
        self.config = cfg = cfg or FakeConfig()
        g = torch.Generator().manual_seed(seed)

        def rnd(*shape: int, s: float = 0.3) -> torch.Tensor:
            return torch.randn(*shape, generator=g) * s

        self.num_layers, self.num_heads, self.num_kv_heads = cfg.n_layers, cfg.n_heads, cfg.n_kv_heads
        self.hidden_size, self.vocab_size = cfg.d_model, cfg.vocab
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.tokenizer = CharTokenizer(cfg.vocab)
        self.rwkv_like = rwkv_like  # only resid points: stands in for a backend without attention
        D, H, K, dh, M = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_mlp
        self.W_E = rnd(cfg.vocab, D, s=1.0)
        self.W_U = rnd(D, cfg.vocab)
        self.ln_final_w = 1 + rnd(D, s=0.1)
        self.layers = []
        for _ in range(cfg.n_layers):
            self.layers.append({
                "ln1.w": 1 + rnd(D, s=0.1), "ln2.w": 1 + rnd(D, s=0.1),
                "W_Q": rnd(H, D, dh), "W_K": rnd(K, D, dh), "W_V": rnd(K, D, dh),
                "W_O": rnd(H, dh, D), "b_O": rnd(D, s=0.05),
                "W_gate": rnd(D, M), "W_in": rnd(D, M), "W_out": rnd(M, D),
            })
        self._names = [[f"blocks.{i}.{s}" for s in _LAYER_SUFFIXES] for i in range(cfg.n_layers)]

    # -- protocol -------------------------------------------------------------------------
    def hook_points(self) -> list[HookPoint]:
        pts = [HookPoint.parse("hook_embed")]
        for i in range(self.num_layers):
            for s in _LAYER_SUFFIXES:
                if self.rwkv_like and s not in ("hook_resid_pre", "hook_resid_post"):
                    continue
                pts.append(HookPoint.parse(f"blocks.{i}.{s}"))
        pts += [HookPoint.parse("ln_final.hook_scale"), HookPoint.parse("ln_final.hook_normalized")]
        return pts

    def get_weight(self, name: str, layer: int | None = None) -> torch.Tensor:
        if layer is None:
            table = {"W_E": self.W_E, "W_U": self.W_U, "ln_final.w": self.ln_final_w}
        else:
            table = self.layers[layer]
        if name not in table:
            raise HookError(f"fake backend has no weight {name!r} (layer {layer})")
        return table[name]

    def _rms(self, x: torch.Tensor) -> torch.Tensor:
        return (x.pow(2).mean(-1, keepdim=True) + self.config.eps).sqrt()

    def final_norm(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        scale = self._rms(x) if scale is None else scale
        return x / scale * self.ln_final_w

    def unembed(self, normalized: torch.Tensor) -> torch.Tensor:
        return normalized @ self.W_U

    def project_to_vocab(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.unembed(self.final_norm(hidden))

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        dh = x.shape[-1]
        inv = 1.0 / self.config.rope_theta ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh)
        ang = pos[:, None].float() * inv[None, :]  # [seq, dh/2]
        cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
        sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]
        x1, x2 = x[..., : dh // 2], x[..., dh // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def _layer(self, i: int, x: torch.Tensor, run: Any) -> torch.Tensor:
        w, n, cfg = self.layers[i], self._names[i], self.config
        b, s, _ = x.shape
        x = run.apply(n[0], x)
        sc = run.apply(n[1], self._rms(x))
        h = run.apply(n[2], x / sc * w["ln1.w"])  # normalized: the attention's input
        q = run.apply(n[3], torch.einsum("bsd,hde->bshe", h, w["W_Q"]))
        k = run.apply(n[4], torch.einsum("bsd,hde->bshe", h, w["W_K"]))
        v = run.apply(n[5], torch.einsum("bsd,hde->bshe", h, w["W_V"]))
        pos = torch.arange(s)
        q = run.apply(n[6], self._rope(q, pos))
        k = run.apply(n[7], self._rope(k, pos))
        rep = cfg.n_heads // cfg.n_kv_heads
        kk, vv = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        scores = torch.einsum("bqhe,bkhe->bhqk", q, kk) / cfg.d_head ** 0.5
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        scores = run.apply(n[8], scores.masked_fill(~causal, float("-inf")))
        pattern = run.apply(n[9], torch.softmax(scores, dim=-1))
        z = run.apply(n[10], torch.einsum("bhqk,bkhe->bqhe", pattern, vv))
        if run.wants(n[11]):
            res = run.apply(n[11], torch.einsum("bqhe,hed->bqhd", z, w["W_O"]))
            attn = res.sum(2) + w["b_O"]
        else:
            attn = torch.einsum("bqhe,hed->bqd", z, w["W_O"]) + w["b_O"]
        attn = run.apply(n[12], attn)
        x = run.apply(n[13], x + attn)
        sc2 = run.apply(n[14], self._rms(x))
        h2 = run.apply(n[15], x / sc2 * w["ln2.w"])  # the MLP's input (the API contract)
        pre = run.apply(n[16], h2 @ w["W_gate"])
        post = run.apply(n[17], torch.nn.functional.silu(pre) * (h2 @ w["W_in"]))
        mlp = run.apply(n[18], post @ w["W_out"])
        return run.apply(n[19], x + mlp)

    def forward(self, ids: torch.Tensor, hooks: HookSpec, attention_mask: torch.Tensor | None = None,
                layer_schedule: Sequence[int] | None = None, between_layers: Any = None,
                **kwargs: Any) -> HookCache:
        run = hooks.start()
        x = run.apply("hook_embed", self.W_E[ids])
        schedule = list(range(self.num_layers)) if layer_schedule is None else list(layer_schedule)
        for step, i in enumerate(schedule):
            x = self._layer(i, x, run)
            if between_layers is not None:
                x = between_layers(step, i, x)
        sc = run.apply("ln_final.hook_scale", self._rms(x))
        h = run.apply("ln_final.hook_normalized", x / sc * self.ln_final_w)
        return run.finish(self.unembed(h))

    def hook_shape(self, point: HookPoint, batch: int, seq: int) -> tuple[int, ...] | None:
        c = self.config
        return standard_shape(point, batch, seq, d_model=c.d_model, n_heads=c.n_heads,
                              n_kv_heads=c.n_kv_heads, d_head=c.d_head, d_mlp=c.d_mlp,
                              key_len=seq)

    def check_layer_schedule(self, schedule: Sequence[int]) -> None:
        """Any order of existing layers runs (the core checked the indices)."""


def fake_model(seed: int = 0, rwkv_like: bool = False, **cfg: Any):
    """An MIModel over a FakeBackend."""
    from mi_core.backend import MIModel

    return MIModel(FakeBackend(FakeConfig(**cfg), seed=seed, rwkv_like=rwkv_like), source="fake")

"""A toy residual-MLP language model implementing the MIBackend protocol.

    x = W_E[ids]                                   hook_embed
    for i in layers:                               blocks.{i}.hook_resid_pre
        x = x + tanh(x @ W_i)                      blocks.{i}.hook_mlp_out, hook_resid_post
    n = x / rms(x)                                 ln_final.hook_scale, ln_final.hook_normalized
    logits = n @ W_U

Checkpoint: config.json {"model_type": "toy-mlp", "vocab_size", "d_model", "n_layers"} and
model.safetensors with `embed` [vocab, d_model], `layers.{i}.w` [d_model, d_model],
`unembed` [d_model, vocab].
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from mi_core.plugin import (
    HookCache, HookPoint, HookSpec, ModelSource, SafetensorsCheckpoint, check_memory,
    require_field, standard_shape,
)


@attrs.frozen
class ToyConfig:
    vocab_size: int
    d_model: int
    n_layers: int

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> "ToyConfig":
        return cls(*(int(require_field(cfg, k)) for k in ("vocab_size", "d_model", "n_layers")))


class ToyBackend:
    """Capabilities (mi_core.capabilities) it declares: hook shapes, readout (final_norm,
    unembed) and gradients; no KV cache, layer schedule, weight access or state."""

    name = "toy"
    differentiable = True

    def __init__(self, config: ToyConfig, weights: dict[str, torch.Tensor],
                 device: torch.device, dtype: torch.dtype) -> None:
        self.config = config
        self.num_layers = config.n_layers
        self.num_heads = self.num_kv_heads = 1
        self.hidden_size = config.d_model
        self.vocab_size = config.vocab_size
        self.device, self.dtype = device, dtype
        self.tokenizer = None
        self.w = weights
        self._names = [(f"blocks.{i}.hook_resid_pre", f"blocks.{i}.hook_mlp_out",
                        f"blocks.{i}.hook_resid_post") for i in range(config.n_layers)]

    @classmethod
    def load(cls, source: ModelSource, device: torch.device, dtype: torch.dtype) -> "ToyBackend":
        cfg = ToyConfig.from_dict(source.config or {})
        d, v = cfg.d_model, cfg.vocab_size
        params = 2 * v * d + cfg.n_layers * d * d  # before any table of n_layers is built
        check_memory(f"{source.path}/config.json: n_layers = {cfg.n_layers}, d_model = {d}",
                     params * dtype.itemsize, device)
        ckpt = SafetensorsCheckpoint.from_directory(source.path)
        expected = {"embed": (v, d), "unembed": (d, v)}
        expected.update({f"layers.{i}.w": (d, d) for i in range(cfg.n_layers)})
        ckpt.check(expected)
        weights = {n: ckpt.get(n, dtype=dtype, device=device) for n in expected}
        return cls(cfg, weights, device, dtype)

    def hook_points(self) -> list[HookPoint]:
        pts = ["hook_embed"]
        for names in self._names:
            pts += list(names)
        pts += ["ln_final.hook_scale", "ln_final.hook_normalized"]
        return [HookPoint.parse(p) for p in pts]

    def hook_shape(self, point: HookPoint, batch: int, seq: int) -> tuple[int, ...] | None:
        return standard_shape(point, batch, seq, d_model=self.hidden_size)

    def forward(self, ids: torch.Tensor, hooks: HookSpec,
                attention_mask: torch.Tensor | None = None, **kw: Any) -> HookCache:
        """ids [batch, seq] -> logits [batch, seq, vocab]."""
        run = hooks.start()
        x = run.apply("hook_embed", self.w["embed"][ids])
        for i, (pre, mlp, post) in enumerate(self._names):
            x = run.apply(pre, x)
            x = x + run.apply(mlp, torch.tanh(x @ self.w[f"layers.{i}.w"]))
            x = run.apply(post, x)
        return run.finish(self.unembed(self.final_norm(x, run=run)))

    def final_norm(self, x: torch.Tensor, scale: torch.Tensor | None = None,
                   run: Any = None) -> torch.Tensor:
        if scale is None:
            scale = x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        if run is not None:
            scale = run.apply("ln_final.hook_scale", scale)
        n = x / scale
        return run.apply("ln_final.hook_normalized", n) if run is not None else n

    def unembed(self, normalized: torch.Tensor) -> torch.Tensor:
        return normalized @ self.w["unembed"]

    def project_to_vocab(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.unembed(self.final_norm(hidden))

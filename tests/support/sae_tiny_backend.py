"""A tiny hand-made MIBackend for SAE splice tests (no transformers needed).

Embedding -> per layer: causal mean-mixing "attention" with hook_z [b, s, heads, d_head],
a GELU MLP, residual stream hooks in TransformerLens spelling (hook_mlp_in: the copy of
resid_mid the MLP reads) -> final LayerNorm + unembed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from mi_core.hooks import HookCache, HookPoint, HookSpec
from mi_core.backend import MIModel


class TinyBackend:
    name = "tiny-sae-test"
    config: Any = None

    def __init__(self, d_model: int = 16, n_layers: int = 2, n_heads: int = 2, vocab: int = 32,
                 seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.num_layers, self.num_heads, self.num_kv_heads = n_layers, n_heads, n_heads
        self.hidden_size, self.vocab_size = d_model, vocab
        self.device, self.dtype, self.tokenizer = torch.device("cpu"), torch.float32, None
        self.d_head = d_model // n_heads
        r = lambda *s: torch.randn(*s, generator=g) / s[0] ** 0.5  # noqa: E731
        self.emb = torch.randn(vocab, d_model, generator=g)
        self.layers = [dict(Wv=r(d_model, d_model), Wo=r(d_model, d_model), W1=r(d_model, 4 * d_model),
                            W2=r(4 * d_model, d_model)) for _ in range(n_layers)]
        self.unembed = r(d_model, vocab)
        self._names = [[f"blocks.{i}.{s}" for s in (
            "hook_resid_pre", "attn.hook_z", "hook_attn_out", "hook_resid_mid", "hook_mlp_in",
            "ln2.hook_normalized", "hook_mlp_out", "hook_resid_post")] for i in range(n_layers)]

    def hook_points(self) -> list[HookPoint]:
        names = ["hook_embed"] + [n for layer in self._names for n in layer] + ["ln_final.hook_normalized"]
        return [HookPoint.parse(n) for n in names]

    def hook_shape(self, point: HookPoint, batch: int, seq: int) -> tuple[int, ...]:
        if point.suffix == "attn.hook_z":
            return (batch, seq, self.num_heads, self.d_head)
        return (batch, seq, self.hidden_size)

    def forward(self, ids: torch.Tensor, hooks: HookSpec, attention_mask: torch.Tensor | None = None,
                **kw: Any) -> HookCache:
        run = hooks.start()
        b, s = ids.shape
        x = run.apply("hook_embed", self.emb[ids])
        steps = torch.arange(1, s + 1, dtype=x.dtype)[None, :, None, None]
        for L, (resid_pre, hz, attn_out, mid, mlp_in, ln2, mlp_out, post) in zip(self.layers, self._names):
            x = run.apply(resid_pre, x)
            v = (x @ L["Wv"]).view(b, s, self.num_heads, self.d_head)
            z = run.apply(hz, v.cumsum(1) / steps)
            x = run.apply(mid, x + run.apply(attn_out, z.reshape(b, s, -1) @ L["Wo"]))
            # hook_mlp_in (TransformerLens): a copy of resid_mid that only the MLP reads
            n = run.apply(ln2, F.layer_norm(run.apply(mlp_in, x), (self.hidden_size,)))
            x = run.apply(post, x + run.apply(mlp_out, F.gelu(n @ L["W1"]) @ L["W2"]))
        x = run.apply("ln_final.hook_normalized", F.layer_norm(x, (self.hidden_size,)))
        return run.finish(x @ self.unembed)

    def project_to_vocab(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(hidden, (self.hidden_size,)) @ self.unembed


def tiny_model(**kw: Any) -> MIModel:
    return MIModel(TinyBackend(**kw), source="tiny")


def write_saelens_sae(folder: "Path", hook: str, d_in: int, d_sae: int, *, arch: str = "standard",
                      hook_out: str | None = None, d_out: int | None = None, seed: int = 0,
                      extra: dict[str, Any] | None = None, scale: float = 0.3) -> "Path":
    """A random-weight SAELens 6.x folder (cfg.json + sae_weights.safetensors), by hand."""
    import json

    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    d_o = d_out or d_in
    w = {"W_enc": torch.randn(d_in, d_sae, generator=g) * scale,
         "W_dec": torch.randn(d_sae, d_o, generator=g) * scale,
         "b_enc": torch.randn(d_sae, generator=g) * scale, "b_dec": torch.randn(d_o, generator=g) * scale}
    if "jumprelu" in arch:
        w["threshold"] = torch.rand(d_sae, generator=g) * scale
    meta: dict[str, Any] = {"hook_name": hook, "model_name": "tiny", "sae_lens_version": "6.54.0"}
    if hook_out:
        meta["hook_name_out"] = hook_out
    cfg: dict[str, Any] = {"architecture": arch, "d_in": d_in, "d_sae": d_sae, "dtype": "float32",
                           "device": "cpu", "apply_b_dec_to_input": d_out is None,
                           "normalize_activations": "none",
                           "reshape_activations": "hook_z" if hook.endswith("hook_z") else "none",
                           "metadata": meta, **(extra or {})}
    if d_out is not None:
        cfg["d_out"] = d_out
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    save_file(w, str(folder / "sae_weights.safetensors"))
    return folder


from pathlib import Path  # noqa: E402  (used in annotations above)

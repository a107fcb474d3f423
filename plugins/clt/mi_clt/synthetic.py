"""Build a data-initialised CLT for a model (for examples and benchmarks, not a trained CLT).

Encoder rows mix random directions with samples of the model's own activations at the
input hook (by default the MLP input, ``mlp.hook_in``: normalised, so every
position gets a similar number of active features); each layer's JumpReLU threshold is the pre-activation
quantile that leaves about `n_active` features active per position; decoder rows are
random directions scaled to the size of the MLP outputs. Files are written one layer at a
time in circuit-tracer's layout (W_enc_{i} / W_dec_{i} safetensors + config.yaml), so
peak memory stays at one layer's decoder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
import yaml
from safetensors.torch import save_file

from mi_core.plugin import HookPoint, HookSpec

from mi_clt.format import CIRCUIT_TRACER_NAMES


def build_clt(model: Any, prompts: Sequence[torch.Tensor], out_dir: str | Path,
              *, d_features: int = 4096, n_active: int = 8, seed: int = 0,
              input_hook: str = "mlp.hook_in", output_hook: str = "hook_mlp_out",
              decoder_dtype: torch.dtype = torch.float32,
              planted: dict[tuple[int, int], torch.Tensor] | None = None) -> Path:
    """Write a CLT for `model` to `out_dir`; prompts: token-id tensors [1, seq].

    planted: {(layer, index): direction [d_model]} sets that feature's decoder vector at
    every target layer to `direction` (e.g. an unembedding column), for steering examples.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    L, D = model.num_layers, model.hidden_size
    g = torch.Generator().manual_seed(seed)
    spec = HookSpec()
    for i in range(L):
        spec.capture(HookPoint.layer_point(i, input_hook)).capture(HookPoint.layer_point(i, output_hook))
    xs: list[list[torch.Tensor]] = [[] for _ in range(L)]
    ms: list[list[torch.Tensor]] = [[] for _ in range(L)]
    with torch.no_grad():
        for ids in prompts:
            cache = model.forward(ids, spec)
            for i in range(L):  # position 0 (BOS) is atypical: leave it out
                xs[i].append(cache[HookPoint.layer_point(i, input_hook)][0, 1:].float())
                ms[i].append(cache[HookPoint.layer_point(i, output_hook)][0, 1:].float())
    for i in range(L):
        x = torch.cat(xs[i])  # [n, D]
        mean = x.mean(0)
        xc = x - mean
        pick = xc[torch.randint(len(xc), (d_features,), generator=g)]
        w = torch.randn(d_features, D, generator=g)
        w = w / w.norm(dim=-1, keepdim=True) + pick / pick.norm(dim=-1, keepdim=True).clamp_min(1e-6)
        w = w / w.norm(dim=-1, keepdim=True) / xc.norm(dim=-1).mean()
        b_enc = -(w @ mean)  # centre: features read deviations from the mean activation
        pre = x @ w.T + b_enc
        q = 1.0 - n_active / d_features
        thr = torch.quantile(pre.flatten()[torch.randperm(pre.numel(), generator=g)[:1_000_000]], q)
        threshold = torch.full((d_features,), float(thr.clamp_min(1e-3)))
        mlp = torch.cat(ms[i])
        b_dec = mlp.mean(0)
        save_file({f"W_enc_{i}": w.contiguous(), f"b_enc_{i}": b_enc.contiguous(),
                   f"b_dec_{i}": b_dec.contiguous(), f"threshold_{i}": threshold},
                  str(out / f"W_enc_{i}.safetensors"))
        scale = float((mlp - b_dec).norm(dim=-1).mean()) / max(1.0, n_active ** 0.5)
        dec = torch.randn(d_features, L - i, D, generator=g)
        dec *= scale / dec.norm(dim=-1, keepdim=True) / float(pre.clamp_min(0).max().clamp_min(1e-6))
        for (layer, index), direction in (planted or {}).items():
            if layer == i:
                dec[index] = direction.float() / direction.norm() * scale
        save_file({f"W_dec_{i}": dec.to(decoder_dtype).contiguous()},
                  str(out / f"W_dec_{i}.safetensors"))
        del dec
    (out / "config.yaml").write_text(yaml.safe_dump({
        "model_kind": "cross_layer_transcoder",
        "feature_input_hook": CIRCUIT_TRACER_NAMES.get(input_hook, input_hook),
        "feature_output_hook": output_hook, "activation": "jump_relu",
        "note": f"data-initialised random CLT (mi_clt.synthetic, seed {seed}); not trained"}))
    return out

"""EleutherAI sparsify folders: ``cfg.json`` + ``sae.safetensors``.

Tensors as ``SparseCoder.save_to_disk`` writes them: ``encoder.weight`` [d_sae, d_in],
``encoder.bias`` [d_sae], ``W_dec`` [d_sae, d_in] (already row-per-latent: no transpose),
``b_dec`` [d_in], optional ``W_skip`` [d_in, d_in]. Encode: relu(x' @ W_enc.T + b), then
top-k (or groupmax), x' = x - b_dec unless ``transcode``. The folder name is the
hookpoint (``layers.5``, ``layers.5.mlp``, ``embed_tokens``); a transcoder on an MLP module
reads that module's input, ``blocks.5.mlp.hook_in``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mi_core.plugin import Detection, DictionaryFormat, HookPoint
from mi_sae.formats._common import Fields, detection, folder_of, json_config, read_safetensors, take
from mi_sae.hooknames import hf_to_hook_point
from mi_sae.sae import SaeConfig, SparseAutoencoder

CFG, WEIGHTS = "cfg.json", "sae.safetensors"


def detect(path: Path) -> Detection:
    return detection("sparsify", folder_of(path), [CFG, WEIGHTS], 0.9)


def _hooks(folder: Path, transcode: bool) -> tuple[HookPoint | None, HookPoint | None]:
    out = hf_to_hook_point(folder.name)
    if not transcode or out is None:
        return out, None
    if out.suffix == "hook_mlp_out" and out.layer is not None:  # MLP transcoder: MLP in -> out
        # the MLP module's input: the pre-MLP norm's output after its gain
        return HookPoint.layer_point(out.layer, "mlp.hook_in"), out
    return out, out


def load(path: Path, device: torch.device, dtype: torch.dtype) -> SparseAutoencoder:
    folder = folder_of(path)
    f = Fields(json_config(folder / CFG, "sparsify cfg.json"), folder / CFG)
    d_in = f.integer("d_in")
    d_sae = f.integer("num_latents", 0, minimum=0) or d_in * f.integer("expansion_factor", 32)
    activation = f.text("activation", "topk", ("topk", "groupmax"))
    transcode = f.flag("transcode", False)
    k = f.integer("k", 32)
    wpath = folder / WEIGHTS
    w = read_safetensors(wpath, device, dtype)
    enc = take(w, ("encoder.weight",), wpath)
    weights = {
        "W_enc": enc.T.contiguous(),  # type: ignore[union-attr]
        "b_enc": take(w, ("encoder.bias",), wpath),
        "W_dec": take(w, ("W_dec",), wpath),
        "b_dec": take(w, ("b_dec",), wpath),
    }
    skip = take(w, ("W_skip",), wpath, required=False)
    if skip is not None:
        weights["W_skip"] = skip
    pin, pout = _hooks(folder, transcode)
    cfg = SaeConfig(d_in=d_in, d_sae=d_sae, activation=activation, architecture=activation,
                    hook_point=pin, hook_point_out=pout, transcoder=transcode,
                    d_out=d_in if transcode else None, k=k,
                    apply_b_dec_to_input=not transcode)
    return SparseAutoencoder(cfg, weights, format="sparsify", source=str(wpath))  # type: ignore[arg-type]


FORMAT = DictionaryFormat(
    name="sparsify", detect=detect, load=load,
    looks_for=f"{CFG} + {WEIGHTS} (EleutherAI sparsify save_to_disk)",
    hub_patterns=[CFG, WEIGHTS],
)

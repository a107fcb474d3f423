"""Llama Scope (OpenMOSS) folders: ``hyperparams.json`` + ``checkpoints/final.safetensors``.

Tensors: ``encoder.weight`` [d_sae, d_model], ``encoder.bias``, ``decoder.weight``
[d_model, d_sae], ``decoder.bias``. One scalar ``jump_relu_threshold`` for every feature.
``norm_activation: "dataset-wise"`` scales inputs by s = sqrt(d_model) /
``dataset_average_activation_norm.in`` (outputs divided by the ``out`` factor). The
threshold is compared in the same units as SAELens' Llama Scope loader uses
(``jump_relu_threshold * s`` after folding s into the encoder).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from mi_core.plugin import Detection, DictionaryError, DictionaryFormat
from mi_sae.formats._common import Fields, detection, folder_of, json_config, read_safetensors, take
from mi_sae.sae import SaeConfig, SparseAutoencoder

HYPER, WEIGHTS = "hyperparams.json", "checkpoints/final.safetensors"


def detect(path: Path) -> Detection:
    folder = folder_of(path)
    if folder.name == "checkpoints":
        folder = folder.parent
    return detection("llamascope", folder, [HYPER, WEIGHTS], 0.9)


def load(path: Path, device: torch.device, dtype: torch.dtype) -> SparseAutoencoder:
    folder = folder_of(path)
    if folder.name == "checkpoints":
        folder = folder.parent
    f = Fields(json_config(folder / HYPER, "Llama Scope hyperparams.json"), folder / HYPER)
    d_in, d_sae = f.integer("d_model"), f.integer("d_sae")
    threshold = f.number("jump_relu_threshold", positive=False)
    hin = f.text("hook_point_in")
    if hin is None:
        raise DictionaryError(f"{folder / HYPER}: required field 'hook_point_in' is missing")
    hout = f.text("hook_point_out", hin)
    f.text("act_fn", "jumprelu", ("jumprelu",))
    wpath = folder / WEIGHTS
    w = read_safetensors(wpath, device, dtype)
    s_in = s_out = 1.0
    # Only dataset-wise scaling is implemented; token-wise (or any other) normalisation
    # would change the numbers, so it is refused rather than ignored.
    if f.text("norm_activation", "dataset-wise", ("dataset-wise",)) == "dataset-wise":
        norms = Fields(f.mapping("dataset_average_activation_norm"),
                       f"{folder / HYPER} (dataset_average_activation_norm)")
        if norms.get("in") is None:
            raise DictionaryError(f"{folder / HYPER}: dataset-wise normalisation needs "
                                  f"dataset_average_activation_norm.in")
        s_in = math.sqrt(d_in) / norms.number("in")
        s_out = math.sqrt(d_in) / norms.number("out", norms.number("in"))
    dec_w = take(w, ("decoder.weight",), wpath)
    weights = {
        "W_enc": take(w, ("encoder.weight",), wpath).T.contiguous(),  # type: ignore[union-attr]
        "b_enc": take(w, ("encoder.bias",), wpath),
        "W_dec": dec_w.T.contiguous(),  # type: ignore[union-attr]
        "b_dec": take(w, ("decoder.bias",), wpath),
    }
    weights["threshold"] = torch.full((d_sae,), threshold * s_in, dtype=dtype, device=device)
    transcoder = hout != hin
    cfg = SaeConfig(d_in=d_in, d_sae=d_sae, activation="jumprelu",
                    architecture="jumprelu_transcoder" if transcoder else "jumprelu",
                    hook_point=f.hook("hook_point_in"),
                    hook_point_out=f.hook("hook_point_out") if transcoder else None,
                    transcoder=transcoder, d_out=d_in if transcoder else None,
                    apply_b_dec_to_input=False, input_scale=s_in,
                    output_scale=s_out if transcoder else None)
    return SparseAutoencoder(cfg, weights, format="llamascope", source=str(wpath))  # type: ignore[arg-type]


FORMAT = DictionaryFormat(
    name="llamascope", detect=detect, load=load,
    looks_for=f"{HYPER} + {WEIGHTS} (Llama Scope)",
    hub_patterns=[HYPER, WEIGHTS],
)

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

from mi_core.errors import DictionaryError
from mi_core.registry import Detection, DictionaryFormat
from mi_sae.formats._common import detection, folder_of, json_config, read_safetensors, take
from mi_sae.hooknames import tl_to_hook_point
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
    hp = json_config(folder / HYPER, "Llama Scope hyperparams.json")
    for key in ("d_model", "d_sae", "jump_relu_threshold", "hook_point_in"):
        if hp.get(key) is None:
            raise DictionaryError(f"{folder / HYPER}: required field {key!r} is missing")
    act = hp.get("act_fn", "jumprelu")
    if act != "jumprelu":
        raise DictionaryError(f"{folder / HYPER}: unsupported act_fn {act!r} (expected 'jumprelu')")
    wpath = folder / WEIGHTS
    w = read_safetensors(wpath, device, dtype)
    d_in, d_sae = int(hp["d_model"]), int(hp["d_sae"])
    s_in = s_out = 1.0
    if hp.get("norm_activation", "dataset-wise") == "dataset-wise":
        norms = hp.get("dataset_average_activation_norm") or {}
        if "in" not in norms:
            raise DictionaryError(f"{folder / HYPER}: dataset-wise normalisation needs "
                                  f"dataset_average_activation_norm.in")
        s_in = math.sqrt(d_in) / float(norms["in"])
        s_out = math.sqrt(d_in) / float(norms.get("out", norms["in"]))
    dec_w = take(w, ("decoder.weight",), wpath)
    weights = {
        "W_enc": take(w, ("encoder.weight",), wpath).T.contiguous(),  # type: ignore[union-attr]
        "b_enc": take(w, ("encoder.bias",), wpath),
        "W_dec": dec_w.T.contiguous(),  # type: ignore[union-attr]
        "b_dec": take(w, ("decoder.bias",), wpath),
    }
    weights["threshold"] = torch.full((d_sae,), float(hp["jump_relu_threshold"]) * s_in,
                                      dtype=dtype, device=device)
    hin, hout = hp["hook_point_in"], hp.get("hook_point_out", hp["hook_point_in"])
    transcoder = hout != hin
    cfg = SaeConfig(d_in=d_in, d_sae=d_sae, activation="jumprelu",
                    architecture="jumprelu_transcoder" if transcoder else "jumprelu",
                    hook_point=tl_to_hook_point(hin),
                    hook_point_out=tl_to_hook_point(hout) if transcoder else None,
                    transcoder=transcoder, d_out=d_in if transcoder else None,
                    apply_b_dec_to_input=False, input_scale=s_in,
                    output_scale=s_out if transcoder else None)
    return SparseAutoencoder(cfg, weights, format="llamascope", source=str(wpath))  # type: ignore[arg-type]


FORMAT = DictionaryFormat(
    name="llamascope", detect=detect, load=load,
    looks_for=f"{HYPER} + {WEIGHTS} (Llama Scope)",
    hub_patterns=[HYPER, WEIGHTS],
)

"""Gemma Scope JumpReLU SAEs.

Gemma Scope 1: ``params.npz`` with ``W_enc`` [d_in, d_sae], ``W_dec`` [d_sae, d_in],
``b_enc``, ``b_dec``, ``threshold`` (or the lowercase ``w_enc`` / ``w_dec`` spelling).
The hook point is not in the file; it is read from the path as SAELens does from the repo
and folder names (``...-res`` / ``-mlp`` / ``-att`` and ``layer_N``).

Gemma Scope 2: ``params.safetensors`` (``w_enc``, ``w_dec``, ``b_enc``, ``b_dec``,
``threshold``, optional ``affine_skip_connection`` [d_in, d_out]) + ``config.json``
(``architecture: "jump_relu"``, ``hf_hook_point_in`` / ``hf_hook_point_out``).

Both: f = relu(h) * (h > threshold), h = x @ W_enc + b_enc (no b_dec subtraction).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from mi_core.plugin import Detection, DictionaryFormat, HookPoint
from mi_sae.formats._common import (Fields, detection, folder_of, json_config, read_npz,
                                    read_safetensors, take)
from mi_sae.hooknames import hf_to_hook_point
from mi_sae.sae import SaeConfig, SparseAutoencoder

NPZ, SAFETENSORS, CONFIG = "params.npz", "params.safetensors", "config.json"


def detect(path: Path) -> Detection:
    folder = folder_of(path)
    if (folder / SAFETENSORS).exists():
        return detection("gemmascope", folder, [SAFETENSORS, CONFIG], 0.9)
    return detection("gemmascope", folder, [NPZ], 0.9)


def _layer(text: str) -> int | None:
    m = re.search(r"layer_(\d+)", text)
    return int(m.group(1)) if m else None


def _gs1_hook(folder: Path) -> tuple[HookPoint | None, bool]:
    """(hook point, is attention hook_z) from a Gemma Scope 1 path, or (None, False)."""
    text = folder.as_posix()
    layer = _layer(text)
    site = re.search(r"gemma-scope-[^/]*?-(res|mlp|att)\b", text)
    kind = site.group(1) if site else "res"  # residual SAEs are the default release
    if "embedding" in text:
        return HookPoint.embed(), False
    if layer is None:
        return None, False
    suffix = {"res": "hook_resid_post", "mlp": "hook_mlp_out", "att": "attn.hook_z"}[kind]
    return HookPoint.layer_point(layer, suffix), kind == "att"


def _gs2_hooks(folder: Path, f: Fields) -> tuple[HookPoint | None, HookPoint | None]:
    hin, hout = f.text("hf_hook_point_in"), f.text("hf_hook_point_out")
    # Gemma 3 has post-norms: post_attention_layernorm.output is the attention's output.
    pin = hf_to_hook_point(hin, post_norms=True) if hin else None
    pout = hf_to_hook_point(hout, post_norms=True) if hout else None
    if pin is None:  # fall back to the folder name, as SAELens does
        layer, name = _layer(folder.as_posix()), folder.as_posix()
        if layer is not None:
            for key, suffix in (("resid_post", "hook_resid_post"), ("attn_out", "attn.hook_z"),
                                ("mlp_out", "hook_mlp_out")):
                if key in name:
                    pin = HookPoint.layer_point(layer, suffix)
            if "transcoder" in name:  # trained on pre_feedforward_layernorm.output
                pin = HookPoint.layer_point(layer, "mlp.hook_in")
                pout = HookPoint.layer_point(layer, "hook_mlp_out")
    return pin, pout


def load(path: Path, device: torch.device, dtype: torch.dtype) -> SparseAutoencoder:
    folder = folder_of(path)
    if (folder / SAFETENSORS).exists():
        return _load_gs2(folder, device, dtype)
    wpath = folder / NPZ
    w = read_npz(wpath, device, dtype)
    weights = {
        "W_enc": take(w, ("W_enc", "w_enc"), wpath), "W_dec": take(w, ("W_dec", "w_dec"), wpath),
        "b_enc": take(w, ("b_enc",), wpath), "b_dec": take(w, ("b_dec",), wpath),
        "threshold": take(w, ("threshold",), wpath),
    }
    d_in, d_sae = weights["W_enc"].shape  # type: ignore[union-attr]
    hook, is_z = _gs1_hook(folder)
    if hook is not None and hook.name == "hook_embed":
        # Embedding SAEs were trained on embeddings scaled by sqrt(d_model) (as SAELens).
        weights["W_enc"] = weights["W_enc"] / math.sqrt(d_in)  # type: ignore[operator]
        weights["W_dec"] = weights["W_dec"] * math.sqrt(d_in)  # type: ignore[operator]
    cfg = SaeConfig(d_in=d_in, d_sae=d_sae, activation="jumprelu", architecture="jumprelu",
                    hook_point=hook, apply_b_dec_to_input=False, reshape_hook_z=is_z)
    return SparseAutoencoder(cfg, weights, format="gemmascope", source=str(wpath))  # type: ignore[arg-type]


def _load_gs2(folder: Path, device: torch.device, dtype: torch.dtype) -> SparseAutoencoder:
    f = Fields(json_config(folder / CONFIG, "Gemma Scope 2 config.json"), folder / CONFIG)
    f.text("architecture", "jump_relu", ("jump_relu",))
    wpath = folder / SAFETENSORS
    w = read_safetensors(wpath, device, dtype)
    weights = {
        "W_enc": take(w, ("w_enc", "W_enc"), wpath), "W_dec": take(w, ("w_dec", "W_dec"), wpath),
        "b_enc": take(w, ("b_enc",), wpath), "b_dec": take(w, ("b_dec",), wpath),
        "threshold": take(w, ("threshold",), wpath),
    }
    skip = take(w, ("affine_skip_connection",), wpath, required=False)
    if skip is not None:  # stored [d_in, d_out]; W_skip is [d_out, d_in]
        weights["W_skip"] = skip.T.contiguous()
    d_in, d_sae = weights["W_enc"].shape  # type: ignore[union-attr]
    d_out = weights["W_dec"].shape[-1]  # type: ignore[union-attr]
    pin, pout = _gs2_hooks(folder, f)
    transcoder = pout is not None and pout != pin
    cfg = SaeConfig(d_in=d_in, d_sae=d_sae, activation="jumprelu",
                    architecture="jumprelu_skip_transcoder" if transcoder and skip is not None
                    else "jumprelu_transcoder" if transcoder else "jumprelu",
                    hook_point=pin, hook_point_out=pout if transcoder else None,
                    d_out=d_out if transcoder else None, transcoder=transcoder,
                    apply_b_dec_to_input=False,
                    reshape_hook_z=pin is not None and pin.suffix == "attn.hook_z")
    return SparseAutoencoder(cfg, weights, format="gemmascope", source=str(wpath))  # type: ignore[arg-type]


FORMAT = DictionaryFormat(
    name="gemmascope", detect=detect, load=load,
    looks_for=f"{NPZ} (Gemma Scope 1) or {SAFETENSORS} + {CONFIG} (Gemma Scope 2)",
    hub_patterns=[NPZ, SAFETENSORS, CONFIG],
)

"""SAELens folders: ``cfg.json`` + ``sae_weights.safetensors``.

Reads 6.x configs (fields at the top level, LLM facts under ``metadata``) and pre-6.0
flat configs (``hook_point``, boolean ``normalize_activations``, ``activation_fn: "topk"``
with ``activation_fn_kwargs``), the way SAELens' own ``handle_pre_6_0_config`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mi_core.errors import DictionaryError
from mi_core.registry import Detection, DictionaryFormat
from mi_sae.formats._common import detection, folder_of, json_config, read_safetensors, take
from mi_sae.hooknames import tl_to_hook_point
from mi_sae.sae import FOLDED_NORMALIZATIONS, SaeConfig, SparseAutoencoder

CFG, WEIGHTS = "cfg.json", "sae_weights.safetensors"

#: SAELens architecture -> (activation, transcoder, skip connection)
ARCHITECTURES: dict[str, tuple[str, bool, bool]] = {
    "standard": ("relu", False, False),
    "jumprelu": ("jumprelu", False, False),
    "topk": ("topk", False, False),
    "abstopk": ("abstopk", False, False),
    "gated": ("gated", False, False),
    "transcoder": ("relu", True, False),
    "skip_transcoder": ("relu", True, True),
    "jumprelu_transcoder": ("jumprelu", True, False),
    "jumprelu_skip_transcoder": ("jumprelu", True, True),
}


def detect(path: Path) -> Detection:
    return detection("saelens", folder_of(path), [CFG, WEIGHTS], 0.9)


def _normalization(value: Any, where: Path) -> str:
    if isinstance(value, bool):  # pre-6.0: True meant expected_average_only_in (folded)
        return "none"
    value = value or "none"
    if value in FOLDED_NORMALIZATIONS:
        return "none"
    if value in ("constant_norm_rescale", "layer_norm"):
        return str(value)
    raise DictionaryError(f"{where}: unknown normalize_activations {value!r}")


def parse_config(raw: dict[str, Any], where: Path, shapes: dict[str, tuple[int, ...]]
                 ) -> SaeConfig:
    meta = raw.get("metadata") or {}

    def get(key: str, default: Any = None) -> Any:
        v = raw.get(key)
        return meta.get(key, default) if v is None else v

    act_fn = get("activation_fn") or get("activation_fn_str") or "relu"
    kwargs = get("activation_fn_kwargs") or {}
    arch = raw.get("architecture") or "standard"
    if act_fn == "topk" and arch == "standard":  # pre-6.0 top-k SAEs
        arch = "topk"
    elif act_fn not in ("relu", "topk"):
        raise DictionaryError(f"{where}: unsupported activation_fn {act_fn!r}")
    if arch not in ARCHITECTURES:
        raise DictionaryError(f"{where}: unknown or unsupported SAELens architecture {arch!r}; "
                              f"supported: {', '.join(ARCHITECTURES)}")
    activation, transcoder, _ = ARCHITECTURES[arch]
    for key in ("d_in", "d_sae"):
        if get(key) is None:
            raise DictionaryError(f"{where}: required field {key!r} is missing")
    hook = get("hook_name") or get("hook_point")
    if get("hook_head_index") is not None or get("hook_point_head_index") is not None:
        raise DictionaryError(f"{where}: single-head SAEs (hook_head_index) are not supported")
    hook_out = get("hook_name_out")
    reshape = get("reshape_activations")
    if reshape is None:
        reshape = "hook_z" if hook and "hook_z" in hook else "none"
    d_out = get("d_out")
    if transcoder and d_out is None and "W_dec" in shapes:
        d_out = shapes["W_dec"][-1]
    return SaeConfig(
        d_in=int(get("d_in")), d_sae=int(get("d_sae")), activation=activation,  # type: ignore[arg-type]
        architecture=arch,
        hook_point=tl_to_hook_point(hook) if hook else None,
        hook_point_out=tl_to_hook_point(hook_out) if hook_out else None,
        d_out=int(d_out) if transcoder and d_out is not None else None,
        transcoder=transcoder,
        k=int(get("k") or kwargs.get("k")) if (get("k") or kwargs.get("k")) else None,
        rescale_acts_by_decoder_norm=bool(get("rescale_acts_by_decoder_norm", False)),
        apply_b_dec_to_input=bool(get("apply_b_dec_to_input", not transcoder)),
        normalize_activations=_normalization(get("normalize_activations"), where),  # type: ignore[arg-type]
        reshape_hook_z=reshape == "hook_z",
    )


def load(path: Path, device: torch.device, dtype: torch.dtype) -> SparseAutoencoder:
    folder = folder_of(path)
    raw = json_config(folder / CFG, "SAELens cfg.json")
    wpath = folder / WEIGHTS
    w = read_safetensors(wpath, device, dtype)
    cfg = parse_config(raw, folder / CFG, {k: tuple(v.shape) for k, v in w.items()})
    weights = {k: w[k] for k in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold", "b_gate",
                                 "b_mag", "r_mag", "W_skip") if k in w}
    if "threshold" not in w and "log_threshold" in w:  # older JumpReLU checkpoints
        weights["threshold"] = w["log_threshold"].exp()
    for name in ("W_enc", "W_dec", "b_dec"):
        take(w, (name,), wpath)
    scale = w.get("scaling_factor", w.get("finetuning_scaling_factor"))
    if scale is not None and not torch.allclose(scale, torch.ones_like(scale)):
        weights["feature_scale"] = scale  # pre-6.0 finetuning scaling factor
    return SparseAutoencoder(cfg, weights, format="saelens", source=str(wpath))


FORMAT = DictionaryFormat(
    name="saelens", detect=detect, load=load,
    looks_for=f"{CFG} + {WEIGHTS} (SAELens save_model)",
    hub_patterns=[CFG, WEIGHTS],
)


#: (activation, transcoder, skip) -> SAELens architecture name, for writing.
_ARCH_OF = {v: k for k, v in ARCHITECTURES.items()}

#: SAELens format version whose cfg.json layout `save` writes (6.x: fields + `metadata`).
SAELENS_FORMAT_VERSION = "6.54.0"


def save(sae: SparseAutoencoder, folder: str | Path) -> Path:
    """Write `sae` as a SAELens 6.x folder (``cfg.json`` + ``sae_weights.safetensors``).

    Raises DictionaryError for what SAELens cannot express (groupmax, dataset-wise input
    scaling, a pre-6.0 feature scaling factor).
    """
    import json

    from safetensors.torch import save_file

    c = sae.cfg
    arch = _ARCH_OF.get((c.activation, c.transcoder, sae.W_skip is not None))
    if arch is None:
        raise DictionaryError(f"SAELens has no architecture for activation={c.activation!r}, "
                              f"transcoder={c.transcoder}, skip={sae.W_skip is not None}")
    if c.input_scale != 1.0 or c.output_scale not in (None, 1.0):
        raise DictionaryError("SAELens cfg.json cannot express dataset-wise input scaling")
    if sae.feature_scale is not None:
        raise DictionaryError("SAELens 6.x cannot express a per-feature scaling factor")
    meta: dict[str, Any] = {"sae_lens_version": SAELENS_FORMAT_VERSION,
                            "hook_name": str(sae.hook_point) if sae.hook_point else None}
    if sae.hook_point_out is not None:
        meta["hook_name_out"] = str(sae.hook_point_out)
    cfg: dict[str, Any] = {
        "architecture": arch, "d_in": c.d_in, "d_sae": c.d_sae,
        "dtype": str(sae.dtype).removeprefix("torch."), "device": "cpu",
        "apply_b_dec_to_input": c.apply_b_dec_to_input,
        "normalize_activations": c.normalize_activations,
        "reshape_activations": "hook_z" if c.reshape_hook_z else "none", "metadata": meta,
    }
    if c.k is not None:
        cfg["k"] = c.k
    if c.activation in ("topk", "abstopk"):
        cfg["rescale_acts_by_decoder_norm"] = c.rescale_acts_by_decoder_norm
    if c.transcoder:
        cfg["d_out"] = sae.d_out
    names = ("W_enc", "W_dec", "b_enc", "b_dec", "threshold", "b_gate", "b_mag", "r_mag", "W_skip")
    tensors = {n: getattr(sae, n).detach().contiguous().cpu() for n in names
               if getattr(sae, n) is not None}
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / CFG).write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    save_file(tensors, str(out / WEIGHTS))
    return out

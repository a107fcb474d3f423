"""SAELens folders: ``cfg.json`` + ``sae_weights.safetensors``.

Reads 6.x configs (fields at the top level, LLM facts under ``metadata``) and pre-6.0
flat configs (``hook_point``, boolean ``normalize_activations``, ``activation_fn: "topk"``
with ``activation_fn_kwargs``), the way SAELens' own ``handle_pre_6_0_config`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mi_core.plugin import Detection, DictionaryError, DictionaryFormat
from mi_sae.formats._common import Fields, detection, folder_of, json_config, read_safetensors, take
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


def _normalization(f: Fields) -> str:
    value = f.get("normalize_activations")
    if isinstance(value, bool):  # pre-6.0: True meant expected_average_only_in (folded)
        return "none"
    value = f.text("normalize_activations", "none")
    if value in FOLDED_NORMALIZATIONS:
        return "none"
    if value in ("constant_norm_rescale", "layer_norm"):
        return str(value)
    raise f.fail("normalize_activations", "unknown normalisation (known: "
                 f"{', '.join(FOLDED_NORMALIZATIONS + ('constant_norm_rescale', 'layer_norm'))})")


#: Tensors a SAELens file may hold besides the ones SparseAutoencoder takes by name.
_OTHER_TENSORS = ("log_threshold", "scaling_factor", "finetuning_scaling_factor")
_WEIGHTS = ("W_enc", "W_dec", "b_enc", "b_dec", "threshold", "b_gate", "b_mag", "r_mag", "W_skip")


def parse_config(raw: dict[str, Any], where: Path, shapes: dict[str, tuple[int, ...]]
                 ) -> SaeConfig:
    """A SAELens ``cfg.json`` (6.x or pre-6.0) as a SaeConfig; DictionaryError naming the
    file, key and value for anything of the wrong type or unknown."""
    if not isinstance(raw, dict):
        raise DictionaryError(f"{where}: must hold a JSON object")
    f = Fields(raw, where, Fields(raw, where).mapping("metadata"))
    act_fn = f.text("activation_fn") or f.text("activation_fn_str") or "relu"
    kwargs = f.mapping("activation_fn_kwargs")
    arch = f.text("architecture") or "standard"
    if act_fn == "topk" and arch == "standard":  # pre-6.0 top-k SAEs
        arch = "topk"
    elif act_fn not in ("relu", "topk"):
        raise f.fail("activation_fn" if f.get("activation_fn") else "activation_fn_str",
                     "unsupported activation (relu, topk)")
    if arch not in ARCHITECTURES:
        raise DictionaryError(f"{where}: unknown or unsupported SAELens architecture {arch!r}; "
                              f"supported: {', '.join(ARCHITECTURES)}")
    activation, transcoder, _ = ARCHITECTURES[arch]
    d_in, d_sae = f.integer("d_in"), f.integer("d_sae")
    for key in ("hook_head_index", "hook_point_head_index"):
        if f.get(key) is not None:
            raise f.fail(key, "single-head SAEs (hook_head_index) are not supported")
    hook = f.hook("hook_name") if f.get("hook_name") is not None else f.hook("hook_point")
    reshape = f.text("reshape_activations", None, ("none", "hook_z"))
    if reshape is None:
        reshape = "hook_z" if hook is not None and hook.suffix == "attn.hook_z" else "none"
    d_out = f.integer("d_out", None)
    if transcoder and d_out is None and "W_dec" in shapes:
        d_out = shapes["W_dec"][-1]
    k = f.integer("k", None)
    if k is None:
        k = Fields(kwargs, f"{where} (activation_fn_kwargs)").integer("k", None)
    return SaeConfig(
        d_in=d_in, d_sae=d_sae, activation=activation,  # type: ignore[arg-type]
        architecture=arch, hook_point=hook, hook_point_out=f.hook("hook_name_out"),
        d_out=d_out if transcoder else None, transcoder=transcoder, k=k,
        rescale_acts_by_decoder_norm=f.flag("rescale_acts_by_decoder_norm", False),
        apply_b_dec_to_input=f.flag("apply_b_dec_to_input", not transcoder),
        normalize_activations=_normalization(f),  # type: ignore[arg-type]
        reshape_hook_z=reshape == "hook_z",
    )


def load(path: Path, device: torch.device, dtype: torch.dtype) -> SparseAutoencoder:
    folder = folder_of(path)
    raw = json_config(folder / CFG, "SAELens cfg.json")
    wpath = folder / WEIGHTS
    w = read_safetensors(wpath, device, dtype)
    cfg = parse_config(raw, folder / CFG, {k: tuple(v.shape) for k, v in w.items()})
    unknown = sorted(set(w) - set(_WEIGHTS) - set(_OTHER_TENSORS))
    if unknown:
        raise DictionaryError(f"{wpath}: unknown tensor(s) {', '.join(unknown)} (a SAELens file "
                              f"holds {', '.join(_WEIGHTS + _OTHER_TENSORS)})")
    weights = {k: w[k] for k in _WEIGHTS if k in w}
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

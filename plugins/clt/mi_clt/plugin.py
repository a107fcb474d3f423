"""Registration of mi-clt with mi-core (the same hooks a third-party plugin implements)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mi_core import plugin_impl
from mi_core.plugin import Detection, DictionaryFormat

_LOOKS_FOR = ("a directory with W_enc_{i}.safetensors + W_dec_{i}.safetensors (circuit-tracer "
              "CLT), layer_{i}.safetensors (transcoder set), or a config.yaml with model_kind")


def _detect(path: Path) -> Detection:
    from mi_clt.format import detect_layout, pickle_files

    kind = detect_layout(Path(path))
    if kind is None:
        pickles = pickle_files(Path(path))
        refused = (f"; refusing pickle file(s) {', '.join(pickles)} (never unpickled: convert "
                   "to safetensors)") if pickles else ""
        return Detection("clt", 0.0, "no W_enc_0.safetensors, layer_0.safetensors or "
                                     f"config.yaml model_kind{refused}")
    return Detection("clt", 0.9, f"circuit-tracer layout: {kind}")


def _load(path: Path, device: torch.device, dtype: torch.dtype) -> Any:
    from mi_clt.clt import CrossLayerTranscoder

    return CrossLayerTranscoder.load(path, device, dtype)


@plugin_impl
def mi_register_dictionary_formats() -> list[DictionaryFormat]:
    return [DictionaryFormat(name="circuit-tracer-clt", detect=_detect, load=_load,
                             looks_for=_LOOKS_FOR,
                             hub_patterns=["config.yaml", "W_enc_*.safetensors",
                                           "W_dec_*.safetensors", "layer_*.safetensors"])]


@plugin_impl
def mi_plugin_info() -> dict[str, Any]:
    return {"provides": ["attribution graphs"]}

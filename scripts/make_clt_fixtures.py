"""Generate the circuit-tracer reference fixtures under tests/clt/fixtures/.

Runs in a SEPARATE environment that has the `circuit-tracer` PyPI package (it pins
transformers <= 4.57.3 and TransformerLens 3.x, incompatible with the main venv):

    python3 -m venv /work/venvs/ct
    /work/venvs/ct/bin/pip install torch==2.13.0 && /work/venvs/ct/bin/pip install circuit-tracer
    /work/venvs/ct/bin/python scripts/make_clt_fixtures.py

What it writes (all safetensors / YAML / JSON, small):

* ``clt_jumprelu/``, ``clt_relu/``: random CLTs saved with circuit-tracer's own
  ``CrossLayerTranscoder.to_safetensors`` (+ a config.yaml), and ``*_ref.safetensors`` with
  inputs and circuit-tracer's ``encode`` / ``decode`` outputs;
* ``tset/``: a per-layer transcoder set saved with ``SingleLayerTranscoder.to_safetensors``
  as ``layer_{i}.safetensors`` and a config.yaml in the older list-of-dicts form;
* ``gs2_clt/``: a Gemma Scope 2 style CLT (``w_enc``/``w_dec``/``threshold`` per layer, the
  layout ``load_gemma_scope_2_clt`` reads), with references from that loader;
* ``tiny_llama/`` + ``attr_clt/`` + ``attr_ref.safetensors`` / ``attr_ref.json``: a tiny random
  LLaMA (HF safetensors + config + a word-level tokenizer), a random CLT for it, and
  circuit-tracer's ``attribute(...)`` graph on a fixed prompt (TransformerLens backend,
  model weights converted with TransformerLens' own LLaMA converter).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent.parent / "tests" / "clt" / "fixtures"
L, D, F, SEQ = 3, 16, 32, 5


def _random_clt(jump: bool, seed: int):
    from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder

    g = torch.Generator().manual_seed(seed)
    clt = CrossLayerTranscoder(L, F, D, activation_function="jump_relu" if jump else "relu",
                               lazy_decoder=False, device=torch.device("cpu"),
                               dtype=torch.float32)
    with torch.no_grad():
        clt.W_enc.copy_(torch.randn(L, F, D, generator=g) / D ** 0.5)
        clt.b_enc.copy_(torch.randn(L, F, generator=g) * 0.1)
        clt.b_dec.copy_(torch.randn(L, D, generator=g) * 0.1)
        for i in range(L):
            clt.W_dec[i].copy_(torch.randn(F, L - i, D, generator=g) / F ** 0.5)
        if jump:
            clt.activation_function.threshold.copy_(torch.rand(L, 1, F, generator=g) * 0.3)
    return clt


def make_clts() -> None:
    for name, jump, seed in (("clt_jumprelu", True, 1), ("clt_relu", False, 2)):
        clt = _random_clt(jump, seed)
        d = OUT / name
        clt.to_safetensors(str(d))
        (d / "config.yaml").write_text(yaml.safe_dump({
            "model_kind": "cross_layer_transcoder", "feature_input_hook": "hook_resid_mid",
            "feature_output_hook": "hook_mlp_out"}))
        x = torch.randn(L, SEQ, D, generator=torch.Generator().manual_seed(seed + 10))
        with torch.no_grad():
            acts = clt.encode(x)
            recon = clt.decode(acts.to_sparse())
        save_file({"x": x, "acts": acts.contiguous(), "recon": recon.contiguous()},
                  str(OUT / f"{name}_ref.safetensors"))


def make_transcoder_set() -> None:
    from circuit_tracer.transcoder.activation_functions import JumpReLU
    from circuit_tracer.transcoder.single_layer_transcoder import (
        SingleLayerTranscoder, TranscoderSet, load_transcoder_set)

    g = torch.Generator().manual_seed(3)
    d = OUT / "tset"
    d.mkdir(parents=True, exist_ok=True)
    for i in range(L):
        tc = SingleLayerTranscoder(D, F, JumpReLU(torch.rand(F, generator=g) * 0.3, 0.1), i,
                                   device=torch.device("cpu"), dtype=torch.float32)
        with torch.no_grad():
            tc.W_enc.copy_(torch.randn(F, D, generator=g) / D ** 0.5)
            tc.W_dec.copy_(torch.randn(F, D, generator=g) / F ** 0.5)
            tc.b_enc.copy_(torch.randn(F, generator=g) * 0.1)
            tc.b_dec.copy_(torch.randn(D, generator=g) * 0.1)
        tc.to_safetensors(str(d / f"layer_{i}.safetensors"))
    # The older config form: a list of {id, layer, filepath} dicts.
    (d / "config.yaml").write_text(yaml.safe_dump({
        "model_name": "tiny", "model_kind": "transcoder_set",
        "feature_input_hook": "mlp.hook_in", "feature_output_hook": "mlp.hook_out",
        "transcoders": [{"id": f"l{i}", "layer": i, "filepath": f"layer_{i}.safetensors"}
                        for i in range(L)]}))
    tset: TranscoderSet = load_transcoder_set(
        {i: str(d / f"layer_{i}.safetensors") for i in range(L)}, scan="tiny",
        feature_input_hook="mlp.hook_in", feature_output_hook="mlp.hook_out",
        device=torch.device("cpu"), dtype=torch.float32, lazy_encoder=False, lazy_decoder=False)
    x = torch.randn(L, SEQ, D, generator=torch.Generator().manual_seed(13))
    with torch.no_grad():
        acts = tset.encode(x)
        recon = tset.decode(acts, None)
    save_file({"x": x, "acts": acts.contiguous(), "recon": recon.contiguous()},
              str(OUT / "tset_ref.safetensors"))


def make_gemma_scope_2_clt() -> None:
    from circuit_tracer.transcoder.cross_layer_transcoder import load_gemma_scope_2_clt

    g = torch.Generator().manual_seed(4)
    d = OUT / "gs2_clt"
    d.mkdir(parents=True, exist_ok=True)
    paths = {}
    for i in range(L):
        p = d / f"params_layer_{i}.safetensors"
        save_file({"w_enc": torch.randn(D, F, generator=g) / D ** 0.5,
                   "w_dec": torch.randn(F, L, D, generator=g) / F ** 0.5,
                   "b_enc": torch.randn(F, generator=g) * 0.1,
                   "b_dec": torch.randn(D, generator=g) * 0.1,
                   "threshold": torch.rand(F, generator=g) * 0.3}, str(p))
        paths[i] = str(p)
    (d / "config.yaml").write_text(yaml.safe_dump({
        "model_kind": "cross_layer_transcoder", "feature_input_hook": "hook_resid_mid",
        "feature_output_hook": "hook_mlp_out",
        "transcoders": [f"params_layer_{i}.safetensors" for i in range(L)]}))
    # load_gemma_scope_2_clt iterates range(max(paths)), i.e. it skips the last key: pass
    # one extra (unused) key so that all L layers are read.
    clt = load_gemma_scope_2_clt({**paths, L: paths[0]}, device=torch.device("cpu"),
                                 dtype=torch.float32)
    assert clt.n_layers == L
    x = torch.randn(L, SEQ, D, generator=torch.Generator().manual_seed(14))
    with torch.no_grad():
        acts = clt.encode(x)
        recon = clt.decode(acts.to_sparse())
    save_file({"x": x, "acts": acts.contiguous(), "recon": recon.contiguous()},
              str(OUT / "gs2_clt_ref.safetensors"))


def make_attribution(out: Path) -> None:
    raise NotImplementedError


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    make_clts()
    make_transcoder_set()
    make_gemma_scope_2_clt()
    if "--no-attribution" not in sys.argv:
        make_attribution(OUT)
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"fixtures written to {OUT} ({total / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

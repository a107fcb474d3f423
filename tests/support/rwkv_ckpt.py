"""Tiny random RWKV checkpoints for the tests and the benchmark.

`make_v6` writes the HF format (``rwkv.blocks.*``), `make_v7` the fla format
(``model.layers.*``); `to_blinkdl_v6` / `to_blinkdl_v7` rename the same tensors to the
BlinkDL ``.pth`` names that the reference `rwkv` package loads. `load_rwkv_reference`
imports a private copy of ``rwkv.model`` with the environment the version needs.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from safetensors.torch import save_file


#: The test models: 2 layers, hidden 128, head size 64 (2 heads), vocab 300.
LAYERS, HIDDEN, HEAD, VOCAB = 2, 128, 64, 300


def random_ids(batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    """Token ids [batch, seq] below VOCAB, reproducible from `seed`."""
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _ln(g: torch.Generator, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    return 1 + 0.1 * torch.randn(c, generator=g), 0.1 * torch.randn(c, generator=g)


def _lin(g: torch.Generator, out: int, inp: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(out, inp, generator=g) * scale / inp ** 0.5


def v6_tensors(layers: int = 2, hidden: int = 128, head: int = 64, vocab: int = 300,
               inter: int | None = None, tm: int = 32, td: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random HF-format RWKV-6 weights with realistic ranges (decays in (0.07, 1))."""
    g = torch.Generator().manual_seed(seed)
    c, h = hidden, hidden // head
    inter = inter or int((hidden * 3.5) // 32 * 32)
    w: dict[str, torch.Tensor] = {"rwkv.embeddings.weight": torch.randn(vocab, c, generator=g)}
    w["rwkv.blocks.0.pre_ln.weight"], w["rwkv.blocks.0.pre_ln.bias"] = _ln(g, c)
    for i in range(layers):
        p = f"rwkv.blocks.{i}."
        a, f = p + "attention.", p + "feed_forward."
        w[p + "ln1.weight"], w[p + "ln1.bias"] = _ln(g, c)
        w[p + "ln2.weight"], w[p + "ln2.bias"] = _ln(g, c)
        for n in "xwkvrg":
            w[a + f"time_maa_{n}"] = torch.rand(1, 1, c, generator=g)
        w[a + "time_maa_w1"] = 0.1 * torch.randn(c, 5 * tm, generator=g)
        w[a + "time_maa_w2"] = 0.1 * torch.randn(5, tm, c, generator=g)
        w[a + "time_decay"] = torch.rand(1, 1, c, generator=g) * 7 - 6
        w[a + "time_decay_w1"] = 0.1 * torch.randn(c, td, generator=g)
        w[a + "time_decay_w2"] = 0.1 * torch.randn(td, c, generator=g)
        w[a + "time_faaaa"] = 0.5 * torch.randn(h, head, generator=g)
        for n in ("receptance", "key", "value", "gate", "output"):
            w[a + f"{n}.weight"] = _lin(g, c, c)
        w[a + "ln_x.weight"], w[a + "ln_x.bias"] = _ln(g, c)
        w[f + "time_maa_k"] = torch.rand(1, 1, c, generator=g)
        w[f + "time_maa_r"] = torch.rand(1, 1, c, generator=g)
        w[f + "key.weight"] = _lin(g, inter, c)
        w[f + "receptance.weight"] = _lin(g, c, c)
        w[f + "value.weight"] = _lin(g, c, inter)
    w["rwkv.ln_out.weight"], w["rwkv.ln_out.bias"] = _ln(g, c)
    w["head.weight"] = _lin(g, vocab, c)
    return w


def v6_config(layers: int = 2, hidden: int = 128, head: int = 64, vocab: int = 300,
              inter: int | None = None) -> dict[str, Any]:
    return {"model_type": "rwkv6", "architectures": ["Rwkv6ForCausalLM"], "vocab_size": vocab,
            "hidden_size": hidden, "num_hidden_layers": layers, "attention_hidden_size": hidden,
            "head_size": head, "head_size_divisor": 8, "intermediate_size": inter,
            "layer_norm_epsilon": 1e-5, "rescale_every": 6, "tie_word_embeddings": False,
            "bos_token_id": 0, "eos_token_id": 0}


def v7_tensors(layers: int = 2, hidden: int = 128, head: int = 64, vocab: int = 300,
               *, inter: int | None = None, dr: int = 32, ar: int = 32, vr: int = 16,
               gr: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random fla-format RWKV-7 weights (decays in (0.55, 1))."""
    g = torch.Generator().manual_seed(seed)
    c, h = hidden, hidden // head
    inter = inter or 4 * hidden
    w: dict[str, torch.Tensor] = {"model.embeddings.weight": torch.randn(vocab, c, generator=g)}
    w["model.layers.0.pre_norm.weight"], w["model.layers.0.pre_norm.bias"] = _ln(g, c)
    for i in range(layers):
        p = f"model.layers.{i}."
        a = p + "attn."
        w[p + "attn_norm.weight"], w[p + "attn_norm.bias"] = _ln(g, c)
        w[p + "ffn_norm.weight"], w[p + "ffn_norm.bias"] = _ln(g, c)
        for n in "rwkvag":
            w[a + f"x_{n}"] = torch.rand(1, 1, c, generator=g)
        w[a + "k_k"] = 0.5 + 0.5 * torch.rand(c, generator=g)
        w[a + "k_a"] = torch.rand(c, generator=g)
        w[a + "r_k"] = 0.5 * torch.randn(h, head, generator=g)
        for n in "rkvo":
            w[a + f"{n}_proj.weight"] = _lin(g, c, c)
        loras = [("w", dr, True), ("a", ar, True), ("g", gr, False)] + ([("v", vr, True)] if i else [])
        for n, r, bias in loras:
            w[a + f"{n}_lora.lora.0.weight"] = _lin(g, r, c)
            w[a + f"{n}_lora.lora.2.weight"] = _lin(g, c, r)
            if bias:
                w[a + f"{n}_lora.lora.2.bias"] = (torch.rand(c, generator=g) * 5 - 3 if n == "w"
                                                  else torch.randn(c, generator=g))
        w[a + "g_norm.weight"], w[a + "g_norm.bias"] = _ln(g, c)
        w[p + "ffn.x_k"] = torch.rand(c, generator=g)
        w[p + "ffn.key.weight"] = _lin(g, inter, c)
        w[p + "ffn.value.weight"] = _lin(g, c, inter)
    w["model.norm.weight"], w["model.norm.bias"] = _ln(g, c)
    w["lm_head.weight"] = _lin(g, vocab, c)
    return w


def v7_config(layers: int = 2, hidden: int = 128, head: int = 64, vocab: int = 300,
              *, inter: int | None = None, dr: int = 32, ar: int = 32, vr: int = 16,
              gr: int = 64) -> dict[str, Any]:
    return {"model_type": "rwkv7", "architectures": ["RWKV7ForCausalLM"], "vocab_size": vocab,
            "hidden_size": hidden, "num_hidden_layers": layers, "head_dim": head,
            "num_heads": hidden // head, "intermediate_size": inter or 4 * hidden,
            "hidden_ratio": 4.0, "decay_low_rank_dim": dr, "a_low_rank_dim": ar,
            "v_low_rank_dim": vr, "gate_low_rank_dim": gr, "norm_eps": 1e-5, "norm_bias": True,
            "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 0, "pad_token_id": 0}


def write_checkpoint(directory: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def to_blinkdl_v6(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF RWKV-6 names -> BlinkDL names (time_maa_* before time_faaaa, as `rwkv` expects)."""
    out = {"emb.weight": w["rwkv.embeddings.weight"],
           "blocks.0.ln0.weight": w["rwkv.blocks.0.pre_ln.weight"],
           "blocks.0.ln0.bias": w["rwkv.blocks.0.pre_ln.bias"]}
    for name, t in w.items():
        if name.startswith("rwkv.blocks.") and ".pre_ln." not in name:
            out[name.replace("rwkv.blocks.", "blocks.").replace(".attention.", ".att.")
                .replace(".feed_forward.", ".ffn.")] = t
    out["ln_out.weight"], out["ln_out.bias"] = w["rwkv.ln_out.weight"], w["rwkv.ln_out.bias"]
    out["head.weight"] = w["head.weight"]
    return {k: v.clone() for k, v in out.items()}


def to_blinkdl_v7(w: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """fla RWKV-7 names -> BlinkDL names (LoRA matrices transposed to x @ W layout)."""
    out = {"emb.weight": w["model.embeddings.weight"],
           "blocks.0.ln0.weight": w["model.layers.0.pre_norm.weight"],
           "blocks.0.ln0.bias": w["model.layers.0.pre_norm.bias"]}
    for i in range(layers):
        p, b = f"model.layers.{i}.", f"blocks.{i}."
        a, ba = p + "attn.", b + "att."
        out[b + "ln1.weight"], out[b + "ln1.bias"] = w[p + "attn_norm.weight"], w[p + "attn_norm.bias"]
        out[b + "ln2.weight"], out[b + "ln2.bias"] = w[p + "ffn_norm.weight"], w[p + "ffn_norm.bias"]
        for n in "rwkvag":
            out[ba + f"x_{n}"] = w[a + f"x_{n}"]
        for n in "wavg":
            if a + f"{n}_lora.lora.0.weight" not in w:
                continue
            out[ba + f"{n}1"] = w[a + f"{n}_lora.lora.0.weight"].T
            out[ba + f"{n}2"] = w[a + f"{n}_lora.lora.2.weight"].T
            if a + f"{n}_lora.lora.2.bias" in w:
                out[ba + f"{n}0"] = w[a + f"{n}_lora.lora.2.bias"].view(1, 1, -1)
        out[ba + "k_k"] = w[a + "k_k"].view(1, 1, -1)
        out[ba + "k_a"] = w[a + "k_a"].view(1, 1, -1)
        out[ba + "r_k"] = w[a + "r_k"]
        for n, m in (("r", "receptance"), ("k", "key"), ("v", "value"), ("o", "output")):
            out[ba + f"{m}.weight"] = w[a + f"{n}_proj.weight"]
        out[ba + "ln_x.weight"], out[ba + "ln_x.bias"] = w[a + "g_norm.weight"], w[a + "g_norm.bias"]
        out[b + "ffn.x_k"] = w[p + "ffn.x_k"].view(1, 1, -1)
        out[b + "ffn.key.weight"] = w[p + "ffn.key.weight"]
        out[b + "ffn.value.weight"] = w[p + "ffn.value.weight"]
    out["ln_out.weight"], out["ln_out.bias"] = w["model.norm.weight"], w["model.norm.bias"]
    out["head.weight"] = w["lm_head.weight"]
    return {k: v.clone().contiguous() for k, v in out.items()}


_REFERENCE: dict[tuple[bool, bool], ModuleType] = {}


def load_rwkv_reference(v7: bool, jit: bool = True) -> ModuleType:
    """A private copy of ``rwkv.model`` imported with ``RWKV_V7_ON`` set for `v7` (the module
    reads its environment at import time), CUDA off, TorchScript on (the package default)
    unless `jit` is False (RWKV-6 only; the RWKV-7 code is always scripted)."""
    if (v7, jit) in _REFERENCE:
        return _REFERENCE[(v7, jit)]
    spec = importlib.util.find_spec("rwkv.model")
    assert spec is not None and spec.origin
    # RWKV_CUDA_ON / RWKV_JIT_ON are also read when a model is built, so they stay set.
    os.environ["RWKV_CUDA_ON"] = "0"
    os.environ["RWKV_JIT_ON"] = "1" if jit else "0"
    saved = {"RWKV_V7_ON": os.environ.get("RWKV_V7_ON")}
    os.environ["RWKV_V7_ON"] = "1" if v7 else "0"
    try:
        mod_spec = importlib.util.spec_from_file_location(f"_rwkv_ref_v{7 if v7 else 6}", spec.origin)
        assert mod_spec is not None and mod_spec.loader is not None
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    _REFERENCE[(v7, jit)] = mod
    return mod


def reference_model(directory: Path, blink: dict[str, torch.Tensor], v7: bool, jit: bool = True) -> Any:
    """The `rwkv` package's model on `blink` (written as ``ref.pth``; strategy 'cpu fp32')."""
    torch.save(blink, directory / "ref.pth")
    mod = load_rwkv_reference(v7, jit)
    # RWKV_JIT_ON is read again when the model is built.
    os.environ["RWKV_JIT_ON"] = "1" if jit else "0"
    if v7:
        return mod.RWKV_x070(str(directory / "ref"), "cpu fp32")
    return mod.RWKV(str(directory / "ref.pth"), "cpu fp32", verbose=False)

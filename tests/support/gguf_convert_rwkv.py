"""What llama.cpp's converter writes for RWKV-6 (HF format) and RWKV-7 (fla format)
checkpoints, redone with the `gguf` package's GGUFWriter through
:func:`tests.support.gguf_convert.write`, independently of mi_rwkv.gguf (whose inverse mapping
the tests check against it).

Followed: ggml-org/llama.cpp ``conversion/rwkv.py`` @ 32e9e044 (``Rwkv6Model``,
``Rwkv7Model``: ``set_gguf_parameters``, ``modify_tensors``) and ``base.py`` @ 00bd27a6
(``_set_vocab_rwkv_world``: id 0 ``<s>``, each World token's bytes as ``repr(bytes)[2:-1]``,
padded with "[PADi]" to the embedding's rows). Names come from ``gguf.get_tensor_name_map``.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _map(arch: Any, n: int) -> Any:
    import gguf

    return gguf.get_tensor_name_map(arch, n)


def _layer(name: str) -> int | None:
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p in ("blocks", "layers") and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def world_vocab(tokens: dict[int, bytes]) -> Any:
    """``_set_vocab_rwkv_world`` of a World vocabulary {id: bytes} (ids 1..): the writer's
    tokenizer metadata, padded to the hparams' vocab_size."""
    import gguf

    def vocab(w: Any, hp: dict) -> None:
        out: list[bytes] = [b"<s>"]
        types = [gguf.TokenType.CONTROL]
        for i in sorted(tokens):
            out.append(repr(tokens[i])[2:-1].encode("utf-8"))
            types.append(gguf.TokenType.NORMAL)
        for i in range(len(out), hp["vocab_size"]):
            out.append(f"[PAD{i}]".encode("utf-8"))
            types.append(gguf.TokenType.UNUSED)
        w.add_tokenizer_model("rwkv")
        w.add_token_list(out)
        w.add_token_types(types)
    return vocab


def tiny_world_tokens(vocab: int) -> dict[int, bytes]:
    """A World-style vocabulary of ids 1 .. vocab - 1 for the tiny models: the 256 bytes,
    then multi-byte tokens (some with quotes and backslashes, which ``repr`` escapes)."""
    out = {i + 1: bytes([i]) for i in range(256)}
    extra = [b"ab", b"'x", b'"y', b"\\z", b"\xff\xfe", b"the", b" a", b"\n\n"]
    extra += [f"t{j}".encode() for j in range(max(0, vocab - 257 - len(extra)))]
    for j, tok in enumerate(extra[:max(0, vocab - 257)]):
        out[257 + j] = tok
    return out


def rwkv6_params(w: Any, hp: dict, rope: dict) -> None:
    """``Rwkv6Model.set_gguf_parameters``."""
    hidden = hp["hidden_size"]
    inter = hp["intermediate_size"] if hp.get("intermediate_size") is not None else \
        int((hidden * 3.5) // 32 * 32)
    w.add_context_length(1048576)
    w.add_embedding_length(hidden)
    w.add_block_count(hp["num_hidden_layers"])
    w.add_layer_norm_eps(hp["layer_norm_epsilon"])
    w.add_rescale_every_n_layers(hp["rescale_every"])
    w.add_wkv_head_size(hp["head_size"])
    w.add_time_mix_extra_dim(64 if hidden == 4096 else 32)
    w.add_time_decay_extra_dim(128 if hidden == 4096 else 64)
    w.add_feed_forward_length(inter)
    w.add_head_count(0)


def rwkv6_modify(n_layers: int) -> Any:
    """``Rwkv6Model.modify_tensors``: names mapped (``.weight`` added), ``time_maa_w1`` and the
    decay LoRAs transposed, ``time_maa_w2`` permuted (0, 2, 1), ``time_decay`` and the lerps
    squeezed, the output / channel-mix value of layer i divided by 2^(i // rescale_every),
    the five ddlerp lerps fused (order w, k, v, r, g) [5, 1, 1, C]."""
    import gguf

    names = _map(gguf.MODEL_ARCH.RWKV6, n_layers)
    lerps: dict[int, dict[str, np.ndarray]] = {}

    def modify(name: str, a: np.ndarray, hp: dict) -> list[tuple[str, np.ndarray]]:
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new is not None, name
        if not new.endswith((".weight", ".bias")):
            new += ".weight"
        bid = _layer(name)
        if new.endswith(("time_mix_w1.weight", "time_mix_decay_w1.weight",
                         "time_mix_decay_w2.weight")):
            a = a.T
        if new.endswith("time_mix_w2.weight"):
            a = a.transpose(0, 2, 1)
        if new.endswith("time_mix_decay.weight") or "lerp" in new:
            a = a.squeeze()
        every = hp.get("rescale_every") or 0
        if every > 0 and new.endswith(("time_mix_output.weight", "channel_mix_value.weight")):
            a = a / 2 ** int(bid // every)
        if bid is not None and "time_mix_lerp" in new and "time_mix_lerp_x" not in new:
            lerps.setdefault(bid, {})[new] = a
            got = lerps[bid]
            want = [f"blk.{bid}.time_mix_lerp_{i}.weight" for i in "wkvrg"]
            if all(k in got for k in want):
                return [(f"blk.{bid}.time_mix_lerp_fused.weight",
                         np.stack([got[k][None] for k in want])[:, None])]
            return []
        return [(new, a)]
    return modify


def rwkv7_params(w: Any, hp: dict, rope: dict) -> None:
    """``Rwkv7Model.set_gguf_parameters`` (fla config keys)."""
    hidden = hp["hidden_size"]
    w.add_context_length(1048576)
    w.add_embedding_length(hidden)
    w.add_block_count(hp["num_hidden_layers"])
    w.add_layer_norm_eps(hp["norm_eps"])
    w.add_wkv_head_size(hp["head_dim"])
    w.add_decay_lora_rank(hp["decay_low_rank_dim"])
    w.add_iclr_lora_rank(hp["a_low_rank_dim"])
    w.add_value_residual_mix_lora_rank(hp["v_low_rank_dim"])
    w.add_gate_lora_rank(hp["gate_low_rank_dim"])
    w.add_feed_forward_length(hp["intermediate_size"] if hp.get("intermediate_size") is not None
                              else hidden * 4)
    w.add_head_count(0)


def _v7_name(name: str) -> str:
    """``Rwkv7Model.modify_tensors``' name unification (fla's LoRA modules as w0 / w1 / w2)."""
    name = name.replace("blocks", "layers").replace("ffn", "feed_forward")
    name = name.replace("self_attn", "attention").replace("attn", "attention")
    name = name.replace("time_mixer.", "")
    name = name.replace("_lora.lora.0.weight", "1.weight")
    name = name.replace("_lora.lora.2.weight", "2.weight")
    name = name.replace("_lora.lora.2.bias", "0.weight")
    return name.replace("feed_forward_norm", "ln2").replace("g_norm", "ln_x")


def rwkv7_modify(n_layers: int) -> Any:
    """``Rwkv7Model.modify_tensors`` for an fla checkpoint (its LoRAs already [out, in]: no
    transpose): the six lerps stacked (order r, w, k, v, a, g), everything else squeezed,
    ``r_k`` flattened, layer 0's ``a`` LoRA written once more as its (absent) ``v`` LoRA."""
    import gguf

    names = _map(gguf.MODEL_ARCH.RWKV7, n_layers)
    lerps: dict[int, dict[str, np.ndarray]] = {}

    def modify(name: str, a: np.ndarray, hp: dict) -> list[tuple[str, np.ndarray]]:
        name = _v7_name(name)
        bid = _layer(name)
        if bid is not None and "attention.x_" in name:
            lerps.setdefault(bid, {})[name] = a
            want = [f"model.layers.{bid}.attention.x_{i}" for i in "rwkvag"]
            if all(k in lerps[bid] for k in want):
                return [(f"blk.{bid}.time_mix_lerp_fused.weight",
                         np.stack([lerps[bid][k] for k in want]))]
            return []
        a = a.squeeze()
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new is not None, name
        if not new.endswith((".weight", ".bias")):
            new += ".weight"
        if "r_k" in new:
            a = a.flatten()
        out = [(new, a)]
        if bid == 0 and "time_mix_a" in new:
            out.insert(0, (new.replace("time_mix_a", "time_mix_v"), a))
        return out
    return modify

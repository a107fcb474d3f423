"""On-disk CLT / transcoder formats, read through memory maps one layer at a time.

Three layouts are understood (all safetensors, never pickles):

* circuit-tracer CLT directory: ``W_enc_{i}.safetensors`` holding ``W_enc_{i}`` [d_tc, d_model],
  ``b_enc_{i}`` [d_tc], ``b_dec_{i}`` [d_model], optional ``threshold_{i}`` [d_tc] (JumpReLU),
  and ``W_dec_{i}.safetensors`` holding ``W_dec_{i}`` [d_tc, n_layers - i, d_model];
* per-layer transcoder sets: ``layer_{i}.safetensors`` (or the files a ``config.yaml``
  ``transcoders`` list names) holding ``W_enc`` [d_tc, d_model], ``W_dec`` [d_tc, d_model],
  ``b_enc``, ``b_dec``, optional ``activation_function.threshold``;
* Gemma Scope 2: per-layer files with ``w_enc`` [d_model, d_sae], ``threshold``, ``b_enc``,
  ``b_dec`` and ``w_dec`` [d_sae, n_layers, d_out] (a CLT) or [d_sae, d_out] (a transcoder).

An optional ``config.yaml`` gives ``model_kind`` (``cross_layer_transcoder`` /
``transcoder_set``), ``feature_input_hook`` / ``feature_output_hook`` (relative to
``blocks.{l}.``), ``transcoders`` (a list of paths, or the older list of
``{layer, filepath}`` dicts), ``activation`` (relu / jump_relu / topk) and ``k``.

Tensors are exposed as zero-copy views of a private memory map (read when touched), and
decoder rows can be gathered with one ``pread`` per row (:meth:`MappedSafetensors.read_rows`)
so only their bytes enter the process: a decoder larger than RAM can be used row by row.
"""

from __future__ import annotations

import mmap
import os
import re
from pathlib import Path
from typing import Any

import attrs
import torch

from mi_core.plugin import DictionaryError, MIError, safetensors_header

_ST_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}

#: Hook names in CLT / transcoder configs -> the mi-core point holding the values they were
#: trained on. circuit-tracer hooks its replacement MLP (``mlp.hook_in``: the MLP's input
#: after the norm's gain; ``mlp.hook_out``: its output); configs that say
#: ``ln2.hook_normalized`` for transcoders meant that same MLP input. Other names
#: (``hook_resid_mid``, ``hook_mlp_out``, ...) are ours verbatim.
HOOK_NAME_MAP = {"mlp.hook_in": "mlp.hook_in", "ln2.hook_normalized": "mlp.hook_in",
                 "mlp.hook_out": "hook_mlp_out"}

#: Our point -> circuit-tracer's name for it (what :mod:`mi_clt.synthetic` writes).
CIRCUIT_TRACER_NAMES = {"mlp.hook_in": "mlp.hook_in", "hook_mlp_out": "mlp.hook_out"}

#: safetensors dtypes of float tensors; CLT weights must be one of these.
_FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})

#: Suffixes of (usually) pickle files: never opened, named when a directory offers only them.
PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt")


class MappedSafetensors:
    """One safetensors file, memory-mapped; :meth:`view` returns zero-copy tensor views.

    The map is copy-on-write (``ACCESS_COPY``) so torch gets a writable buffer without the
    file ever being modified, and pages are only read when a view's elements are touched.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            header = safetensors_header(path)
        except MIError as exc:
            raise DictionaryError(str(exc)) from exc
        self.meta = {k: v for k, v in header.items() if k != "__metadata__"}
        with open(path, "rb") as f:
            self._data_start = 8 + int.from_bytes(f.read(8), "little")
        self._map: mmap.mmap | None = None

    def names(self) -> list[str]:
        return list(self.meta)

    def __contains__(self, name: str) -> bool:
        return name in self.meta

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._need(name)["shape"])

    def _need(self, name: str) -> dict[str, Any]:
        m = self.meta.get(name)
        if m is None:
            raise DictionaryError(f"{self.path}: tensor {name!r} not found "
                                  f"(has: {', '.join(sorted(self.meta))})")
        return m

    def view(self, name: str) -> torch.Tensor:
        """A tensor backed by the memory map (no data read until its elements are used)."""
        m = self._need(name)
        dtype = _ST_DTYPES.get(m["dtype"])
        if dtype is None:
            raise DictionaryError(f"{self.path}: tensor {name!r} has unsupported dtype {m['dtype']}")
        start, end = m["data_offsets"]
        shape = tuple(m["shape"])
        if end == start:
            return torch.empty(shape, dtype=dtype)
        if self._map is None:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            # Rows are gathered sparsely: without these hints the kernel reads ahead and maps
            # whole 2 MB huge pages around every touched row into this process.
            for advice in ("MADV_RANDOM", "MADV_NOHUGEPAGE"):
                if hasattr(mmap, advice):
                    self._map.madvise(getattr(mmap, advice))
        flat = torch.frombuffer(self._map, dtype=dtype, count=(end - start) // dtype.itemsize,
                                offset=self._data_start + start)
        return flat.view(shape)

    def read_rows(self, name: str, index: torch.Tensor) -> torch.Tensor:
        """Rows `index` of tensor `name` along dim 0, read with one ``pread`` per row: only
        those bytes enter this process (a mapped read would pull in whole huge pages)."""
        m = self._need(name)
        dtype = _ST_DTYPES[m["dtype"]]
        shape = tuple(m["shape"])
        row = dtype.itemsize
        for s in shape[1:]:
            row *= s
        base = self._data_start + m["data_offsets"][0]
        buf = bytearray(row * len(index))
        with open(self.path, "rb", buffering=0) as f:
            fd = f.fileno()
            for k, i in enumerate(index.tolist()):
                got = os.preadv(fd, [memoryview(buf)[k * row:(k + 1) * row]], base + i * row)
                if got != row:
                    raise DictionaryError(f"{self.path}: short read of {name!r} row {i}")
        if not buf:
            return torch.empty((0,) + shape[1:], dtype=dtype)
        return torch.frombuffer(buf, dtype=dtype).view((len(index),) + shape[1:])

    def load(self, name: str, dtype: torch.dtype, device: torch.device,
             shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """A materialised copy in `dtype` on `device` (for the small tensors: biases, ...)."""
        if shape is not None and self.shape(name) != tuple(shape):
            raise DictionaryError(f"{self.path}: tensor {name!r} has shape "
                                  f"{list(self.shape(name))}, expected {list(shape)}")
        return self.view(name).to(device=device, dtype=dtype, copy=True)


@attrs.define
class CltFiles:
    """What :func:`read_clt_layout` found: per-layer files and tensor names, config values."""

    kind: str  # "circuit_tracer_clt" | "transcoder_set" | "gemma_scope_2_clt" | "gemma_scope_2_set"
    root: Path
    n_layers: int
    d_model: int
    d_features: int
    enc_files: list[MappedSafetensors]
    dec_files: list[MappedSafetensors]
    names: dict[str, str]  # role -> tensor name pattern with "{i}"
    activation: str  # "relu" | "jump_relu" | "topk"
    k: int | None
    feature_input_hook: str
    feature_output_hook: str
    config_path: Path | None
    cross_layer: bool


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except Exception as exc:  # yaml.YAMLError, UnicodeDecodeError
        raise DictionaryError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise DictionaryError(f"{path}: must hold a YAML mapping")
    return data


def _text(cfg: dict[str, Any], key: str, default: str, cfg_path: Path,
          choices: tuple[str, ...] | None = None) -> str:
    """A string value of config.yaml (no coercion); DictionaryError naming file, key, value."""
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, str):
        raise DictionaryError(f"{cfg_path}: key {key!r} = {v!r}: expected a string, got "
                              f"{type(v).__name__}")
    if choices is not None and v.lower() not in choices:
        raise DictionaryError(f"{cfg_path}: key {key!r} = {v!r}: expected one of "
                              f"{', '.join(choices)}")
    return v


def _integer(value: Any, what: str, cfg_path: Path, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DictionaryError(f"{cfg_path}: {what} = {value!r}: expected an integer >= {minimum}")
    return value


def pickle_files(root: Path) -> list[str]:
    """Names of pickle-format files directly in `root` (sorted)."""
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.suffix in PICKLE_SUFFIXES)


def _config_paths(root: Path, cfg: dict[str, Any], cfg_path: Path) -> list[Path] | None:
    """The per-layer files a config.yaml ``transcoders`` list names (None: not given)."""
    items = cfg.get("transcoders")
    if items is None:
        return None
    if not isinstance(items, list) or not items:
        raise DictionaryError(f"{cfg_path}: 'transcoders' must be a non-empty list")
    by_layer: dict[int, str] = {}
    for i, item in enumerate(items):
        if isinstance(item, dict):  # older form: {id, layer, filepath}
            if "filepath" not in item or "layer" not in item:
                raise DictionaryError(f"{cfg_path}: transcoders[{i}] needs 'layer' and 'filepath'")
            layer = _integer(item["layer"], f"transcoders[{i}].layer", cfg_path)
            fp = item["filepath"]
        else:
            layer, fp = i, item
        if not isinstance(fp, str) or not fp:
            raise DictionaryError(f"{cfg_path}: transcoders[{i}] = {item!r}: expected a file path")
        if layer in by_layer:
            raise DictionaryError(f"{cfg_path}: two transcoders for layer {layer}")
        by_layer[layer] = fp
    if sorted(by_layer) != list(range(len(by_layer))):
        raise DictionaryError(f"{cfg_path}: transcoders must cover layers 0..{len(by_layer) - 1} "
                              f"without gaps, got layers {sorted(by_layer)}")
    out = []
    for layer in range(len(by_layer)):
        fp = by_layer[layer]
        if fp.startswith("hf://"):
            raise DictionaryError(f"{cfg_path}: transcoder for layer {layer} is a hub URI {fp!r}; "
                                  f"download it and point 'transcoders' at the local file")
        p = Path(fp)
        if p.suffix in PICKLE_SUFFIXES:
            raise DictionaryError(f"{cfg_path}: transcoder for layer {layer} is a pickle file "
                                  f"{fp!r}: refused (never unpickled); convert it to safetensors")
        out.append(p if p.is_absolute() else root / p)
    return out


def _numbered(root: Path, prefix: str) -> list[Path]:
    rx = re.compile(rf"^{re.escape(prefix)}(\d+)\.safetensors$")
    found = {int(m.group(1)): p for p in root.iterdir() if (m := rx.match(p.name))}
    if not found:
        return []
    n = max(found) + 1
    missing = [f"{prefix}{i}.safetensors" for i in range(n) if i not in found]
    if missing:
        raise DictionaryError(f"{root}: missing per-layer files: {', '.join(missing)}")
    return [found[i] for i in range(n)]


def _open_all(paths: list[Path]) -> list[MappedSafetensors]:
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise DictionaryError(f"missing per-layer files: {', '.join(missing)}")
    return [MappedSafetensors(p) for p in paths]


def detect_layout(root: Path) -> str | None:
    """Cheap detection (no tensor data): the layout kind, or None."""
    if not root.is_dir():
        return None
    if (root / "W_enc_0.safetensors").exists():
        return "circuit_tracer_clt"
    if (root / "config.yaml").exists():
        try:
            cfg = _read_yaml(root / "config.yaml")
        except DictionaryError:
            return None
        kind = cfg.get("model_kind")
        if isinstance(kind, str) and kind in ("cross_layer_transcoder", "transcoder_set"):
            return kind
    if (root / "layer_0.safetensors").exists():
        return "transcoder_set"
    return None


def read_clt_layout(root: Path) -> CltFiles:
    """Open every per-layer file of a CLT / transcoder set and check shapes (headers only)."""
    root = Path(root)
    if not root.is_dir():
        raise DictionaryError(f"{root}: a CLT is a directory of per-layer safetensors files")
    cfg_path = root / "config.yaml"
    cfg = _read_yaml(cfg_path) if cfg_path.exists() else {}
    enc, dec, names, layout, cross = _open_layout(root, cfg, cfg_path)
    n, gs2 = len(enc), layout.startswith("gemma_scope_2")
    w0 = enc[0].shape(names["W_enc"].format(i=0))
    if len(w0) != 2:
        raise DictionaryError(f"{enc[0].path}: {names['W_enc'].format(i=0)} must be 2-D, has "
                              f"shape {list(w0)}")
    d_model, d_tc = (w0[0], w0[1]) if gs2 else (w0[1], w0[0])
    has_thr = names["threshold"].format(i=0) in enc[0]
    for i in range(n):
        span = (n if layout == "gemma_scope_2_clt" else n - i) if cross else None
        _check_layer((i, n), enc[i], dec[i], names, (d_model, d_tc), gs2, span, has_thr)
    activation, k = _activation(cfg, cfg_path, has_thr, d_tc, enc[0], names)
    fin = _text(cfg, "feature_input_hook", "hook_resid_mid", cfg_path)
    fout = _text(cfg, "feature_output_hook", "hook_mlp_out", cfg_path)
    fin, fout = HOOK_NAME_MAP.get(fin, fin), HOOK_NAME_MAP.get(fout, fout)
    return CltFiles(kind=layout, root=root, n_layers=n, d_model=d_model, d_features=d_tc,
                    enc_files=enc, dec_files=dec, names=names, activation=activation,
                    k=k, feature_input_hook=fin,
                    feature_output_hook=fout, config_path=cfg_path if cfg else None,
                    cross_layer=cross)


def _open_layout(root: Path, cfg: dict[str, Any], cfg_path: Path
                 ) -> tuple[list[MappedSafetensors], list[MappedSafetensors], dict[str, str],
                            str, bool]:
    """(encoder files, decoder files, role -> tensor name pattern, layout, cross-layer) of the
    files in `root`: circuit-tracer's W_enc_{i} / W_dec_{i}, or one file per layer (SAELens
    transcoder sets, Gemma Scope 2) found by name or listed in config.yaml."""
    kind = _text(cfg, "model_kind", "", cfg_path, ("cross_layer_transcoder", "transcoder_set"))
    listed = _config_paths(root, cfg, cfg_path) if cfg else None
    enc_paths = _numbered(root, "W_enc_")
    if enc_paths and listed is None:
        dec_paths = [root / f"W_dec_{i}.safetensors" for i in range(len(enc_paths))]
        names = {"W_enc": "W_enc_{i}", "b_enc": "b_enc_{i}", "b_dec": "b_dec_{i}",
                 "threshold": "threshold_{i}", "W_dec": "W_dec_{i}"}
        return _open_all(enc_paths), _open_all(dec_paths), names, "circuit_tracer_clt", True
    paths = listed if listed is not None else _numbered(root, "layer_")
    if not paths:
        raise DictionaryError(f"{root}: no W_enc_0.safetensors, layer_0.safetensors or "
                              f"config.yaml 'transcoders' list found")
    enc = _open_all(paths)
    if "w_enc" in enc[0]:  # Gemma Scope 2 naming
        names = {"W_enc": "w_enc", "b_enc": "b_enc", "b_dec": "b_dec",
                 "threshold": "threshold", "W_dec": "w_dec"}
        cross = len(enc[0].shape("w_dec")) == 3
        layout = "gemma_scope_2_clt" if cross else "gemma_scope_2_set"
    else:
        names = {"W_enc": "W_enc", "b_enc": "b_enc", "b_dec": "b_dec",
                 "threshold": "activation_function.threshold", "W_dec": "W_dec"}
        cross, layout = False, "transcoder_set"
    if kind == "cross_layer_transcoder" and not cross:
        raise DictionaryError(f"{cfg_path}: model_kind is cross_layer_transcoder but "
                              f"{paths[0]} holds a single-layer decoder")
    return enc, enc, names, layout, cross


def _check_layer(layer: tuple[int, int], e: MappedSafetensors, d: MappedSafetensors,
                 names: dict[str, str], dims: tuple[int, int], gs2: bool, span: int | None,
                 has_thr: bool) -> None:
    """DictionaryError naming the file and tensor unless layer i's (`layer`: i and the number
    of layers) encoder (and threshold) and decoder have the shapes and float dtypes the first
    layer implies (`dims`: d_model, d_features; `span`: how many layers a cross-layer decoder
    writes to, None for a single-layer one)."""
    (i, n), (d_model, d_tc) = layer, dims
    want_enc = (d_model, d_tc) if gs2 else (d_tc, d_model)
    want = {names["W_enc"].format(i=i): want_enc, names["b_enc"].format(i=i): (d_tc,),
            names["b_dec"].format(i=i): (d_model,)}
    if has_thr:
        want[names["threshold"].format(i=i)] = (d_tc,)
    for t, shape in want.items():
        if t not in e:
            raise DictionaryError(f"{e.path}: missing tensor {t!r}")
        if e.shape(t) != shape:
            raise DictionaryError(f"{e.path}: tensor {t!r} has shape {list(e.shape(t))}, "
                                  f"expected {list(shape)}")
        _check_float(e, t)
    dn = names["W_dec"].format(i=i)
    if dn not in d:
        raise DictionaryError(f"{d.path}: missing tensor {dn!r}")
    want_dec = (d_tc, span, d_model) if span is not None else (d_tc, d_model)
    if d.shape(dn) != want_dec:
        raise DictionaryError(f"{d.path}: tensor {dn!r} has shape {list(d.shape(dn))}, "
                              f"expected {list(want_dec)} (layer {i} of {n})")
    _check_float(d, dn)


def _check_float(f: MappedSafetensors, t: str) -> None:
    dt = f.meta[t].get("dtype")
    if dt not in _FLOAT_DTYPES:
        raise DictionaryError(f"{f.path}: tensor {t!r} has dtype {dt}: CLT weights must be "
                              "floating point")


def _activation(cfg: dict[str, Any], cfg_path: Path, has_thr: bool, d_tc: int,
                f0: MappedSafetensors, names: dict[str, str]) -> tuple[str, int | None]:
    """(activation, k) from config.yaml, checked against the tensors (a jump_relu needs its
    threshold, a topk its k, at most the features per layer)."""
    activation = _text(cfg, "activation", "jump_relu" if has_thr else "relu", cfg_path,
                       ("relu", "jump_relu", "jumprelu", "topk")).lower()
    activation = "jump_relu" if activation == "jumprelu" else activation
    if activation == "jump_relu" and not has_thr:
        raise DictionaryError(f"{f0.path}: activation jump_relu but no "
                              f"{names['threshold'].format(i=0)!r} tensor")
    k = cfg.get("k")
    if k is not None:
        k = _integer(k, "key 'k'", cfg_path, minimum=1)
        if k > d_tc:
            raise DictionaryError(f"{cfg_path}: key 'k' = {k}: more than the {d_tc} features "
                                  "per layer")
    if activation == "topk" and k is None:
        raise DictionaryError(f"{cfg_path}: activation topk needs an integer 'k'")
    return activation, k

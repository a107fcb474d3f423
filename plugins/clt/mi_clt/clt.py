"""The cross-layer transcoder: encode at the input hooks, decode to the output hooks.

A CLT feature reads the residual stream at one layer (``input_hook(l)``) and writes to the
output hook of that layer and of every later layer (``output_hook(t)``, t >= l). A
per-layer transcoder set is the special case where each feature writes to its own layer
only. Decoder rows are read from memory maps on demand, so only the rows of the features
used are ever paged in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from mi_core.plugin import CltFeatureId, DictionaryError, HookPoint, HookSpec

from mi_clt import interventions
from mi_clt.format import CltFiles, read_clt_layout
from mi_clt.interventions import InjectionLike


class CrossLayerTranscoder:
    """A CLT (or per-layer transcoder set) loaded lazily from disk.

    n_layers, d_model, d_features (per layer); ``activation`` is relu / jump_relu / topk.
    """

    format = "circuit-tracer-clt"

    def __init__(self, files: CltFiles, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        self.files = files
        self.device = torch.device(device)
        self.dtype = dtype
        self.n_layers = files.n_layers
        self.d_model = files.d_model
        self.d_features = files.d_features
        self.activation = files.activation
        self.k = files.k
        self.cross_layer = files.cross_layer
        self.architecture = files.activation
        self.source: Path = files.root
        n, f = files.names, files

        def small(role: str) -> torch.Tensor:
            return torch.stack([_finite(e.load(n[role].format(i=i), dtype, self.device),
                                        e.path, n[role].format(i=i))
                                for i, e in enumerate(f.enc_files)])

        self.b_enc = small("b_enc")  # [L, d_tc]
        self.b_dec = small("b_dec")  # [L, d_model]
        self.threshold = small("threshold") if self.activation == "jump_relu" else None  # [L, d_tc]
        self._enc_cache: dict[int, torch.Tensor] = {}
        self._steering: dict[CltFeatureId, torch.Tensor] = {}

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.float32) -> "CrossLayerTranscoder":
        return cls(read_clt_layout(Path(path)), device, dtype)

    # -- hooks --------------------------------------------------------------------------
    def input_hook(self, layer: int) -> HookPoint:
        """Where layer `layer`'s features read: ``blocks.{layer}.<feature_input_hook>``."""
        return HookPoint.layer_point(self._layer(layer), self.files.feature_input_hook)

    def output_hook(self, layer: int) -> HookPoint:
        """Where the decoders targeting `layer` write: ``blocks.{layer}.<feature_output_hook>``."""
        return HookPoint.layer_point(self._layer(layer), self.files.feature_output_hook)

    def target_layers(self, source_layer: int) -> range:
        """The layers a feature of `source_layer` writes to."""
        s = self._layer(source_layer)
        return range(s, self.n_layers) if self.cross_layer else range(s, s + 1)

    def _layer(self, layer: int) -> int:
        if not 0 <= int(layer) < self.n_layers:
            raise DictionaryError(f"{self.source}: layer {layer} out of range 0..{self.n_layers - 1}")
        return int(layer)

    def check_model(self, model: object) -> None:
        """Raise DictionaryError (naming the CLT's files) unless `model` matches this CLT:
        same layer count, same d_model, and every input/output hook exists."""
        where = self.files.config_path or self.source
        n = getattr(model, "num_layers", None)
        if n is not None and n != self.n_layers:
            raise DictionaryError(f"{self.source}: CLT has {self.n_layers} layers but the model has "
                                  f"{n}")
        d = getattr(model, "hidden_size", None)
        if d is not None and d != self.d_model:
            raise DictionaryError(f"{self.files.enc_files[0].path}: CLT d_model is {self.d_model} "
                                  f"but the model's hidden size is {d}")
        has = getattr(model, "has_hook_point", None)
        if has is not None:
            for hp in (self.input_hook(0), self.output_hook(0)):
                if not has(hp):
                    raise DictionaryError(f"{where}: hook {hp.suffix!r} (as {hp.name}) is not "
                                          f"provided by this model")

    # -- weights ------------------------------------------------------------------------
    def encoder(self, layer: int) -> torch.Tensor:
        """W_enc of `layer`: [d_features, d_model] (a memory-mapped view when no cast is needed)."""
        layer = self._layer(layer)
        w = self._enc_cache.get(layer)
        if w is None:
            f = self.files
            w = f.enc_files[layer].view(f.names["W_enc"].format(i=layer))
            if f.kind.startswith("gemma_scope_2"):
                w = w.T
            if w.dtype != self.dtype or self.device.type != "cpu":
                w = w.to(device=self.device, dtype=self.dtype)
            # checked once, when the layer's encoder is first used (it is then cached)
            self._enc_cache[layer] = _finite(w, f.enc_files[layer].path,
                                             f.names["W_enc"].format(i=layer))
        return w

    def decoder_rows(self, layer: int, index: torch.Tensor | Sequence[int] | None = None
                     ) -> torch.Tensor:
        """Decoder rows of source `layer`: [n, n_targets, d_model] for the features `index`
        (all features when None; that reads the whole layer). Only those rows are paged in."""
        layer = self._layer(layer)
        f = self.files
        name = f.names["W_dec"].format(i=layer)
        if index is None:
            w = f.dec_files[layer].view(name)
        else:
            idx = torch.as_tensor(index, dtype=torch.long, device="cpu").reshape(-1)  # rows on disk
            if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.d_features):
                raise DictionaryError(f"{f.dec_files[layer].path}: feature index out of range "
                                      f"0..{self.d_features - 1}")
            w = f.dec_files[layer].read_rows(name, idx)
        if not self.cross_layer:
            w = w.unsqueeze(1)
        elif f.kind == "gemma_scope_2_clt":
            w = w[:, layer:, :]
        # rows are read on demand, so they are checked as read (a cost next to the read)
        return _finite(w.to(device=self.device, dtype=self.dtype), f.dec_files[layer].path, name)

    def decoder_vectors(self, feature: CltFeatureId) -> torch.Tensor:
        """The feature's decoder vector [n_targets, d_model] at each layer it writes to
        (``target_layers(feature.layer)``, in order)."""
        self._layer(feature.layer)
        if not 0 <= feature.index < self.d_features:
            raise DictionaryError(f"{self.source}: feature index {feature.index} out of range "
                                  f"0..{self.d_features - 1}")
        return self.decoder_rows(feature.layer, [feature.index])[0]

    def decoder_vector(self, feature: CltFeatureId, target_layer: int) -> torch.Tensor:
        """The feature's decoder vector [d_model] at `target_layer` (>= its layer)."""
        targets = self.target_layers(feature.layer)
        if target_layer not in targets:
            raise DictionaryError(f"feature {feature} does not write to layer {target_layer} "
                                  f"(it writes to {targets.start}..{targets.stop - 1})")
        return self.decoder_vectors(feature)[target_layer - targets.start]

    # -- encode / decode ----------------------------------------------------------------
    def pre_activations(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """x [..., d_model] at ``input_hook(layer)`` -> pre-activations [..., d_features]."""
        self._check_d(x)
        return x.to(self.dtype) @ self.encoder(layer).T + self.b_enc[layer]

    def activate(self, pre: torch.Tensor, layer: int) -> torch.Tensor:
        """The nonlinearity: ReLU; JumpReLU is ``pre * (pre > threshold)`` (no extra ReLU);
        TopK keeps the k largest pre-activations per position (as circuit-tracer's TopK)."""
        if self.activation == "jump_relu":
            assert self.threshold is not None
            return pre * (pre > self.threshold[layer])
        if self.activation == "topk":
            assert self.k is not None
            idx = pre.topk(self.k, dim=-1).indices
            return torch.zeros_like(pre).scatter(-1, idx, pre.gather(-1, idx))
        return torch.relu(pre)

    def encode_layer(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """x [..., d_model] -> feature activations [..., d_features] of `layer`."""
        return self.activate(self.pre_activations(x, layer), layer)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x [n_layers, ..., d_model] (the input hook of every layer) -> [n_layers, ..., d_features]."""
        if x.shape[0] != self.n_layers:
            raise DictionaryError(f"{self.source}: encode expects [n_layers={self.n_layers}, ..., "
                                  f"d_model], got shape {list(x.shape)}")
        return torch.stack([self.encode_layer(x[i], i) for i in range(self.n_layers)])

    def decode_layer_contributions(self, acts: torch.Tensor, source_layer: int) -> torch.Tensor:
        """acts [..., d_features] of one source layer -> [n_targets, ..., d_model] (no bias)."""
        flat = acts.reshape(-1, self.d_features).to(self.dtype)
        active = flat.ne(0).any(0).nonzero().squeeze(-1)
        n_t = len(self.target_layers(source_layer))
        if active.numel() == 0:
            return torch.zeros(n_t, *acts.shape[:-1], self.d_model, dtype=self.dtype,
                               device=self.device)
        rows = self.decoder_rows(source_layer, active)  # [m, n_t, d_model]
        out = torch.einsum("pm,mtd->tpd", flat[:, active.to(flat.device)], rows)
        return out.reshape(n_t, *acts.shape[:-1], self.d_model)

    def decode(self, acts: torch.Tensor) -> torch.Tensor:
        """acts [n_layers, ..., d_features] -> reconstruction [n_layers, ..., d_model] at the output
        hooks: out[t] = sum over source layers l <= t of acts[l] @ W_dec[l -> t] + b_dec[t].
        Only the decoder rows of active features are read."""
        if acts.shape[0] != self.n_layers or acts.shape[-1] != self.d_features:
            raise DictionaryError(f"{self.source}: decode expects [n_layers={self.n_layers}, ..., "
                                  f"d_features={self.d_features}], got {list(acts.shape)}")
        bias_shape = (self.n_layers,) + (1,) * (acts.dim() - 2) + (self.d_model,)
        out = self.b_dec.reshape(bias_shape).expand(self.n_layers, *acts.shape[1:-1],
                                                    self.d_model).clone()
        for layer in range(self.n_layers):
            t = self.target_layers(layer)
            out[t.start:t.stop] += self.decode_layer_contributions(acts[layer], layer)
        return out

    def top_k(self, acts: torch.Tensor, k: int) -> list[list[tuple[CltFeatureId, float]]]:
        """The `k` strongest features per position over all layers.

        acts [n_layers, seq, d_features] -> one list per position of (CltFeatureId, value),
        strongest first (only positive activations)."""
        if acts.dim() != 3 or acts.shape[0] != self.n_layers:
            raise DictionaryError(f"top_k expects [n_layers, seq, d_features], got {list(acts.shape)}")
        per_pos = acts.permute(1, 0, 2).reshape(acts.shape[1], -1)
        vals, idx = per_pos.topk(min(k, per_pos.shape[-1]), dim=-1)
        out: list[list[tuple[CltFeatureId, float]]] = []
        for v_row, i_row in zip(vals.tolist(), idx.tolist()):
            out.append([(CltFeatureId(i // self.d_features, i % self.d_features), v)
                        for v, i in zip(v_row, i_row) if v > 0])
        return out

    def _check_d(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.d_model:
            raise DictionaryError(f"{self.source}: input has d_model {x.shape[-1]}, the CLT "
                                  f"expects {self.d_model}")

    # -- activations from a model -------------------------------------------------------
    def encode_model(self, model: object, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Run `model` on ids [1, seq] and encode: (feature acts [n_layers, seq, d_features],
        logits [1, seq, vocab])."""
        self.check_model(model)
        spec = HookSpec().capture_all(self.input_hook(i) for i in range(self.n_layers))
        cache = model.forward(ids, spec)  # type: ignore[attr-defined]
        x = torch.stack([cache[self.input_hook(i)][0] for i in range(self.n_layers)])
        return self.encode(x), cache.output

    # -- interventions (see mi_clt.interventions) -----------------------------------------
    def cache_steering_vectors_all_downstream(self, features: Sequence[CltFeatureId]
                                              ) -> dict[CltFeatureId, torch.Tensor]:
        """{feature: decoder vectors [n_targets, d_model]} at every layer it writes to, read
        once and kept for later ``prepare_hook_injection`` calls."""
        for f in features:
            if f not in self._steering:
                self._steering[f] = self.decoder_vectors(f)
        return {f: self._steering[f] for f in features}

    def prepare_hook_injection(self, injections: Sequence[InjectionLike], seq_len: int,
                               hooks: HookSpec | None = None) -> HookSpec:
        """HookSpec of ``Add`` at the output hooks for (feature, position, strength) triples."""
        return interventions.prepare_hook_injection(self, injections, seq_len, hooks)

    def __repr__(self) -> str:
        return (f"CrossLayerTranscoder({self.files.kind}, n_layers={self.n_layers}, "
                f"d_model={self.d_model}, d_features={self.d_features}, {self.activation}, "
                f"{self.files.feature_input_hook} -> {self.files.feature_output_hook})")


def _finite(t: torch.Tensor, path: Path, name: str) -> torch.Tensor:
    """`t`, or a DictionaryError naming the file and tensor if it holds NaN / inf."""
    if not bool(torch.isfinite(t).all()):
        raise DictionaryError(f"{path}: tensor {name!r} contains NaN or inf "
                              f"({int((~torch.isfinite(t)).sum())} of {t.numel()} values)")
    return t


__all__ = ["CrossLayerTranscoder", "CltFeatureId"]

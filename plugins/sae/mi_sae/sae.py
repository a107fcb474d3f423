"""The sparse autoencoder (and single-layer transcoder) every format loads into.

One class, one forward: the architecture differences are typed config axes
(:class:`SaeConfig`), not names checked in the computation. Encoding follows SAELens'
inference semantics (validated against ``sae-lens`` in tests/sae):

    x      = reshape(x) (hook_z: [..., heads, d_head] -> [..., d_in]), cast to the SAE dtype
    x      = x * input_scale                          (dataset-wise norm, e.g. Llama Scope)
    x, st  = normalize(x)                             (constant_norm_rescale / layer_norm)
    x      = x - b_dec        if apply_b_dec_to_input
    h      = x @ W_enc + b_enc
    f      = activation(h)    (relu | jumprelu | topk | abstopk | groupmax | gated)
    x_hat  = (f * feature_scale) @ W_dec + b_dec, then normalize^-1, / output scale,
             + x_raw @ W_skip.T (skip transcoders), reshaped back for hook_z
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Literal

import attrs
import torch
import torch.nn.functional as F

from mi_core.plugin import Add, DictionaryError, HookError, HookPoint, HookSpec, SparseActivations

Activation = Literal["relu", "jumprelu", "topk", "abstopk", "groupmax", "gated"]
Normalize = Literal["none", "constant_norm_rescale", "layer_norm"]

#: normalize_activations values whose effect is folded into the saved weights (or applied
#: only during training), so inference does nothing for them.
FOLDED_NORMALIZATIONS = ("none", "expected_average_only_in", "covariance_whitening")

FeatureEdit = Callable[[torch.Tensor], torch.Tensor]


@attrs.frozen
class SaeConfig:
    """What an SAE computes, independent of the file it came from.

    `architecture` is the producer's name (reported, never branched on); the computation
    reads only the typed axes below.
    """

    d_in: int
    d_sae: int
    activation: Activation
    architecture: str
    hook_point: HookPoint | None
    d_out: int | None = None  # transcoders; None: d_in
    hook_point_out: HookPoint | None = None  # transcoders: where the output is written
    k: int | None = None  # topk / abstopk / groupmax
    rescale_acts_by_decoder_norm: bool = False  # topk: rank h * ||W_dec_i||, decode f / ||W_dec_i||
    apply_b_dec_to_input: bool = True
    normalize_activations: Normalize = "none"
    input_scale: float = 1.0  # multiply the input by this (dataset-wise norm)
    output_scale: float | None = None  # divide the output by this; None: input_scale
    transcoder: bool = False  # reads hook_point, writes hook_point_out
    reshape_hook_z: bool = False  # input is [..., heads, d_head]
    layer_norm_eps: float = 1e-5

    @property
    def out_scale(self) -> float:
        return self.input_scale if self.output_scale is None else self.output_scale

    @property
    def out_dim(self) -> int:
        return self.d_out if self.d_out is not None else self.d_in


@attrs.define
class _NormState:
    """Per-call statistics that decode needs to undo input normalisation."""

    scale: torch.Tensor | None = None  # constant_norm_rescale: x * scale in, / scale out
    std: torch.Tensor | None = None  # layer_norm: (x - mean) / (std + eps) in, * std + mean out
    mean: torch.Tensor | None = None


class SparseAutoencoder:
    """An SAE or single-layer transcoder (implements ``mi_core.SparseDictionary``).

    Weights: W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_out], b_dec [d_out];
    optionally threshold [d_sae] (jumprelu), b_gate / b_mag / r_mag [d_sae] (gated),
    W_skip [d_out, d_in] (skip connection), feature_scale [d_sae] (pre-6.0 SAELens
    finetuning scaling factor).
    """

    def __init__(self, cfg: SaeConfig, weights: dict[str, torch.Tensor], *, format: str,
                 source: str = "") -> None:
        self.cfg = cfg
        self.format = format
        self.source = source
        self.architecture = cfg.architecture
        self.d_in = cfg.d_in
        self.d_sae = cfg.d_sae
        self.d_out = cfg.out_dim
        self.hook_point: HookPoint | None = cfg.hook_point
        self.hook_point_out: HookPoint | None = cfg.hook_point_out
        self._check_shapes(weights)
        w = weights
        self.W_enc = w["W_enc"].contiguous()
        self.W_dec = w["W_dec"].contiguous()
        self.b_dec = w["b_dec"]
        self.b_enc = w.get("b_enc")
        self.threshold = w.get("threshold")
        self.W_skip = w.get("W_skip")
        self.b_gate = w.get("b_gate")
        self.b_mag = w.get("b_mag")
        self.r_mag = w.get("r_mag")
        self.dtype = self.W_enc.dtype
        self.device = self.W_enc.device
        # Precomputed once so encode is one matmul plus the activation.
        self._W_mag = self.W_enc * self.r_mag.exp() if self.r_mag is not None else None
        self._threshold_eff = self.threshold.clamp_min(0) if self.threshold is not None else None
        self._dec_norm = (self.W_dec.norm(dim=-1) if cfg.rescale_acts_by_decoder_norm else None)
        self.feature_scale = w.get("feature_scale")  # as stored in the file (pre-6.0 SAELens)
        scale = self.feature_scale
        if cfg.rescale_acts_by_decoder_norm:
            inv = 1 / self._dec_norm  # type: ignore[operator]
            scale = inv if scale is None else scale * inv
        self._feature_scale = scale
        self._b_dec_in = self.b_dec if cfg.apply_b_dec_to_input else None

    # -- construction checks -------------------------------------------------------------
    def _check_shapes(self, w: dict[str, torch.Tensor]) -> None:
        c = self.cfg
        expected: dict[str, tuple[int, ...]] = {
            "W_enc": (c.d_in, c.d_sae), "W_dec": (c.d_sae, c.out_dim), "b_dec": (c.out_dim,),
        }
        if c.activation == "gated":
            expected.update(b_gate=(c.d_sae,), b_mag=(c.d_sae,), r_mag=(c.d_sae,))
        else:
            expected["b_enc"] = (c.d_sae,)
        if c.activation == "jumprelu":
            expected["threshold"] = (c.d_sae,)
        optional = {"W_skip": (c.out_dim, c.d_in), "feature_scale": (c.d_sae,)}
        where = self.source or "<weights>"
        for name, shape in {**expected, **optional}.items():
            t = w.get(name)
            if t is None:
                if name in expected:
                    raise DictionaryError(f"{where}: missing tensor {name!r} (needed by the "
                                          f"{c.architecture} architecture)")
                continue
            if tuple(t.shape) != shape:
                raise DictionaryError(f"{where}: tensor {name!r} has shape {list(t.shape)}, "
                                      f"expected {list(shape)}")
            if not bool(torch.isfinite(t).all()):
                raise DictionaryError(f"{where}: tensor {name!r} contains NaN or inf")
        if c.activation in ("topk", "abstopk", "groupmax"):
            if c.k is None or not 0 < c.k <= c.d_sae:
                raise DictionaryError(f"{where}: {c.activation} needs 0 < k <= d_sae={c.d_sae}, "
                                      f"got k={c.k}")
            if c.activation == "groupmax" and c.d_sae % c.k:
                raise DictionaryError(f"{where}: groupmax needs d_sae={c.d_sae} divisible by k={c.k}")
        if c.rescale_acts_by_decoder_norm:
            dead = (w["W_dec"].norm(dim=-1) == 0).nonzero().flatten().tolist()
            if dead:
                raise DictionaryError(f"{where}: rescale_acts_by_decoder_norm divides by the norms "
                                      f"of W_dec's rows, and rows {dead[:8]} are zero")
        if c.normalize_activations == "layer_norm" and c.d_in < 2:
            raise DictionaryError(f"{where}: normalize_activations 'layer_norm' needs d_in >= 2 "
                                  f"(the unbiased std of one value is NaN), got d_in={c.d_in}")
        if c.apply_b_dec_to_input and c.out_dim != c.d_in:
            raise DictionaryError(f"{where}: apply_b_dec_to_input needs d_out == d_in "
                                  f"(got {c.out_dim} vs {c.d_in})")

    def __repr__(self) -> str:
        out = f", out={self.hook_point_out}" if self.hook_point_out else ""
        return (f"SparseAutoencoder(format={self.format!r}, architecture={self.architecture!r}, "
                f"d_in={self.d_in}, d_sae={self.d_sae}, hook={self.hook_point}{out})")

    def to(self, device: str | torch.device | None = None,
           dtype: torch.dtype | None = None) -> "SparseAutoencoder":
        """A copy with every weight moved / cast."""
        names = ("W_enc", "W_dec", "b_dec", "b_enc", "threshold", "W_skip", "b_gate", "b_mag",
                 "r_mag")
        w = {n: getattr(self, n).to(device=device, dtype=dtype) for n in names
             if getattr(self, n) is not None}
        if self.feature_scale is not None:
            w["feature_scale"] = self.feature_scale.to(device=device, dtype=dtype)
        return SparseAutoencoder(self.cfg, w, format=self.format, source=self.source)

    # -- input processing ----------------------------------------------------------------
    def _flatten_in(self, x: torch.Tensor) -> torch.Tensor:
        """[..., d_in] (or [..., heads, d_head] for hook_z SAEs) -> [..., d_in] in our dtype."""
        if (self.cfg.reshape_hook_z and x.dim() >= 2 and x.shape[-1] != self.d_in
                and x.shape[-2] * x.shape[-1] == self.d_in):
            x = x.flatten(-2)
        if x.shape[-1] != self.d_in:
            raise DictionaryError(f"{self.source or self.format}: input width {x.shape[-1]} "
                                  f"(shape {list(x.shape)}) does not match the SAE's d_in="
                                  f"{self.d_in} (W_enc {list(self.W_enc.shape)})")
        return x.to(self.dtype) if x.dtype != self.dtype else x

    def _normalize_in(self, x: torch.Tensor) -> tuple[torch.Tensor, _NormState]:
        c, st = self.cfg, _NormState()
        if c.input_scale != 1.0:
            x = x * c.input_scale
        if c.normalize_activations == "constant_norm_rescale":
            st.scale = (c.d_in ** 0.5) / x.norm(dim=-1, keepdim=True)
            x = x * st.scale
        elif c.normalize_activations == "layer_norm":
            st.mean = x.mean(dim=-1, keepdim=True)
            x = x - st.mean
            st.std = x.std(dim=-1, keepdim=True)  # unbiased; eps only on the way in (SAELens)
            x = x / (st.std + c.layer_norm_eps)
        if self._b_dec_in is not None:
            x = x - self._b_dec_in
        return x, st

    def _denormalize_out(self, y: torch.Tensor, st: _NormState) -> torch.Tensor:
        c = self.cfg
        if c.normalize_activations == "constant_norm_rescale":
            y = y / st.scale  # type: ignore[operator]
        elif c.normalize_activations == "layer_norm":
            y = y * st.std + st.mean  # type: ignore[operator]
        if c.out_scale != 1.0:
            y = y / c.out_scale
        return y

    def _stats_of(self, x: torch.Tensor | None) -> _NormState:
        if self.cfg.normalize_activations == "none":
            return _NormState()
        if x is None:
            raise DictionaryError(
                f"{self.source or self.format}: this SAE normalises its input at inference "
                f"({self.cfg.normalize_activations}); decode needs the original input: "
                f"decode(f, x=x) or reconstruct(x)")
        return self._normalize_in(self._flatten_in(x))[1]

    # -- encode ---------------------------------------------------------------------------
    def _pre(self, x2: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return torch.addmm(b, x2, W) if b is not None else x2 @ W

    def _encode_2d(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 [n, d_in] (already processed) -> dense features [n, d_sae]."""
        c = self.cfg
        act = c.activation
        if act == "gated":
            gate = self._pre(x2, self.W_enc, self.b_gate) > 0
            mag = self._pre(x2, self._W_mag, self.b_mag).relu_()  # type: ignore[arg-type]
            return mag.mul_(gate)
        h = self._pre(x2, self.W_enc, self.b_enc)
        if act == "relu":
            return h.relu_()
        if act == "jumprelu":
            # relu(h) * (h > t) == h where h > max(t, 0), else 0
            return h.masked_fill_(h <= self._threshold_eff, 0.0)
        values, idx = self._top(h)
        return torch.zeros_like(h).scatter_(-1, idx, values)

    def _top(self, h: torch.Tensor, sort: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(values, indices) [n, k] of the top-k activations from pre-activations h [n, d_sae]."""
        c, k = self.cfg, int(self.cfg.k)  # type: ignore[arg-type]
        if self._dec_norm is not None:
            h = h * self._dec_norm
        if c.activation == "topk":
            values, idx = torch.topk(h, k, dim=-1, sorted=sort)
            return values.relu_(), idx
        if c.activation == "abstopk":
            idx = torch.topk(h.abs(), k, dim=-1, sorted=sort).indices
            return h.gather(-1, idx), idx
        # groupmax (sparsify): relu, then the max of each of k equal groups
        values, idx = h.relu().unflatten(-1, (k, -1)).max(dim=-1)
        offsets = torch.arange(0, c.d_sae, c.d_sae // k, device=h.device)
        return values, idx + offsets

    def _processed_2d(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], _NormState]:
        xf = self._flatten_in(x)
        lead = tuple(xf.shape[:-1])
        xp, st = self._normalize_in(xf)
        return xp.reshape(-1, self.d_in), lead, st

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., d_in] (hook_z SAEs also [..., heads, d_head]) -> features [..., d_sae]."""
        x2, lead, _ = self._processed_2d(x)
        return self._encode_2d(x2).reshape(*lead, self.d_sae)

    def encode_sparse(self, x: torch.Tensor, k: int | None = None) -> SparseActivations:
        """Top-`k` features per position (values descending) without a dense [.., d_sae] result
        for top-k architectures. k=None: the architecture's k, or every active feature
        (padded with zero-valued entries to the largest count at any position)."""
        x2, lead, _ = self._processed_2d(x)
        c = self.cfg
        if c.activation in ("topk", "abstopk", "groupmax") and (k is None or k == c.k):
            h = self._pre(x2, self.W_enc, self.b_enc)
            values, idx = self._top(h, sort=True)
            if c.activation != "topk":  # sort by value (topk is sorted by torch.topk already)
                order = values.argsort(dim=-1, descending=True)
                values, idx = values.gather(-1, order), idx.gather(-1, order)
        else:
            f = self._encode_2d(x2)
            if k is None:
                k = max(int((f != 0).sum(dim=-1).max()) if f.numel() else 0, 1)
            values, idx = torch.topk(f, min(k, self.d_sae), dim=-1, sorted=True)
        return SparseActivations(indices=idx.reshape(*lead, -1), values=values.reshape(*lead, -1),
                                 d_sae=self.d_sae)

    # -- decode ---------------------------------------------------------------------------
    def decode(self, f: torch.Tensor | SparseActivations, x: torch.Tensor | None = None
               ) -> torch.Tensor:
        """features [..., d_sae] (or SparseActivations) -> [..., d_out].

        Excludes the skip connection (as SAELens' ``decode``); `x`, the original input, is
        needed only for SAEs that normalise at inference (to undo it). See
        :meth:`reconstruct` for the full forward.
        """
        st = self._stats_of(x)
        if isinstance(f, SparseActivations):
            y = self._decode_sparse(f)
        else:
            f = f.to(self.dtype)
            if self._feature_scale is not None:
                f = f * self._feature_scale
            lead = f.shape[:-1]
            y = torch.addmm(self.b_dec, f.reshape(-1, self.d_sae), self.W_dec).reshape(*lead, -1)
        if self.cfg.normalize_activations != "none" or self.cfg.out_scale != 1.0:
            y = self._denormalize_out(y, st)
        return y

    def _decode_sparse(self, sa: SparseActivations) -> torch.Tensor:
        """Gathers only the k decoder rows per position: never a dense [tokens, d_sae]."""
        idx = sa.indices.reshape(-1, sa.indices.shape[-1])
        val = sa.values.to(self.dtype).reshape(idx.shape)
        if self._feature_scale is not None:
            val = val * self._feature_scale[idx]
        y = F.embedding_bag(idx, self.W_dec, per_sample_weights=val, mode="sum") + self.b_dec
        return y.reshape(*sa.indices.shape[:-1], self.d_out)

    def reconstruct(self, x: torch.Tensor, feature_edit: FeatureEdit | None = None
                    ) -> torch.Tensor:
        """The full forward: x -> output (skip connection included), shaped like x for SAEs.

        `feature_edit` ([..., d_sae] -> [..., d_sae]) changes the features before decoding.
        """
        return self.reconstruct_with_features(x, feature_edit)[0]

    def reconstruct_with_features(self, x: torch.Tensor, feature_edit: FeatureEdit | None = None
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """(output as :meth:`reconstruct`, features [..., d_sae] it decoded) for input x."""
        x2, lead, st = self._processed_2d(x)
        f = self._encode_2d(x2)
        if feature_edit is not None:
            f = feature_edit(f.reshape(*lead, self.d_sae)).reshape(-1, self.d_sae).to(self.dtype)
        fs = f * self._feature_scale if self._feature_scale is not None else f
        y = torch.addmm(self.b_dec, fs, self.W_dec).reshape(*lead, self.d_out)
        y = self._denormalize_out(y, st)
        if self.W_skip is not None:
            y = y + self._flatten_in(x) @ self.W_skip.T
        if not self.cfg.transcoder and y.shape != x.shape:
            y = y.reshape(x.shape)  # hook_z: back to [..., heads, d_head]
        return y, f.reshape(*lead, self.d_sae)

    # -- into the model --------------------------------------------------------------------
    def require_hook(self) -> HookPoint:
        """The hook point the SAE reads, or a DictionaryError if the file did not say."""
        if self.hook_point is None:
            raise DictionaryError(f"{self.source or self.format}: the file does not say which "
                                  f"hook point this SAE reads; set sae.hook_point = "
                                  f"HookPoint.parse('blocks.N.hook_resid_post') first")
        return self.hook_point

    def _check_width(self, x: torch.Tensor, hook: Any) -> None:
        w = x.shape[-1]
        if self.cfg.reshape_hook_z and x.dim() >= 2 and w != self.d_in:
            w = x.shape[-2] * x.shape[-1]
        if w != self.d_in:
            raise DictionaryError(f"{self.source or self.format}: hook {hook} has width {w} "
                                  f"(activation shape {list(x.shape)}) but the SAE's W_enc is "
                                  f"{list(self.W_enc.shape)} (d_in={self.d_in})")

    def check_model(self, model: Any) -> None:
        """HookError if `model` lacks the SAE's hook point(s); DictionaryError if the widths
        differ (when the backend reports hook shapes, else for residual-width points)."""
        points = [self.require_hook()] + ([self.hook_point_out] if self.hook_point_out else [])
        for hp, width in zip(points, (self.d_in, self.d_out)):
            if not model.has_hook_point(hp):
                try:
                    HookSpec().capture(hp).validate(model.hook_points(), num_layers=model.num_layers)
                except HookError as exc:
                    raise HookError(f"{self.source or self.format}: SAE hook point: {exc}") from None
            actual = _hook_width(model, hp, self.cfg.reshape_hook_z and hp is self.hook_point)
            if actual is not None and actual != width:
                raise DictionaryError(f"{self.source or self.format}: hook {hp} has width {actual} "
                                      f"but the SAE expects {width} (W_enc {list(self.W_enc.shape)}, "
                                      f"W_dec {list(self.W_dec.shape)})")

    def splice(self, hooks: HookSpec, include_error: bool = False, *,
               feature_edit: FeatureEdit | None = None, model: Any = None) -> HookSpec:
        """Route the hook point through the SAE: the activation becomes the reconstruction.

        With `include_error` the error term (activation - clean reconstruction) is added, so
        without `feature_edit` the model's output is unchanged and with it only the edit's
        effect remains. Transcoders read `hook_point` and replace `hook_point_out`.
        Pass `model` to check hook names and widths before any compute. Returns `hooks`.
        """
        hp = self.require_hook()
        if self.cfg.transcoder and self.hook_point_out is None:
            raise DictionaryError(f"{self.source or self.format}: transcoder without an output "
                                  f"hook point; set sae.hook_point_out first")
        if model is not None:
            self.check_model(model)
        if self.hook_point_out is None:
            def spliced(x: torch.Tensor, hook: Any) -> torch.Tensor:
                self._check_width(x, hook)
                out, f = self.reconstruct_with_features(x, feature_edit)
                if include_error:
                    clean = out if feature_edit is None else self.reconstruct_with_features(x, None)[0]
                    out = out + (x.to(out.dtype) - clean)
                return out

            return hooks.intervene(hp, spliced)

        held: dict[str, torch.Tensor] = {}

        def grab(x: torch.Tensor, hook: Any) -> None:
            self._check_width(x, hook)
            held["x"] = x
            return None

        def put(y: torch.Tensor, hook: Any) -> torch.Tensor:
            x = held.pop("x", None)
            if x is None:
                raise HookError(f"transcoder output hook {hook} ran before its input hook {hp}")
            out = self.reconstruct_with_features(x, feature_edit)[0]
            if include_error:
                clean = out if feature_edit is None else self.reconstruct_with_features(x, None)[0]
                out = out + (y.to(out.dtype) - clean)
            return out

        hooks.intervene(hp, grab)
        return hooks.intervene(self.hook_point_out, put)

    def feature_direction(self, feature: int) -> torch.Tensor:
        """The decoder row W_dec[feature] [d_out] (scaled as decode scales it)."""
        if not 0 <= feature < self.d_sae:
            raise DictionaryError(f"feature {feature} out of range [0, {self.d_sae})")
        d = self.W_dec[feature]
        if self._feature_scale is not None:
            d = d * self._feature_scale[feature]
        return d / self.cfg.out_scale if self.cfg.out_scale != 1.0 else d

    def _out_hook(self) -> HookPoint:
        return self.hook_point_out or self.require_hook()

    def inject(self, hooks: HookSpec, feature: int, strength: float,
               positions: Iterable[int] | None = None, seq_len: int | None = None,
               d_head: int | None = None) -> HookSpec:
        """Add ``strength * W_dec[feature]`` at the SAE's (output) hook as an ``Add``.

        `positions` (with `seq_len`, the prompt length) restricts it to those positions;
        a negative strength pushes against the feature; hook_z SAEs need `d_head` to shape
        the operand [.., heads, d_head]. Returns `hooks`.
        """
        d = self.feature_direction(feature) * strength
        if positions is not None:
            if seq_len is None:
                raise DictionaryError("inject at chosen positions needs seq_len")
            pos = list(positions)
            bad = [p for p in pos if not -seq_len <= p < seq_len]
            if bad:
                raise DictionaryError(f"positions {bad} out of range for seq_len={seq_len}")
            v = torch.zeros(seq_len, self.d_out, dtype=d.dtype, device=d.device)
            v[pos] = d
            d = v
        if self.cfg.reshape_hook_z and self.hook_point_out is None:
            if d_head is None:
                raise DictionaryError(f"{self.require_hook()}: injecting into a hook_z SAE's "
                                      f"[.., heads, d_head] activation needs d_head")
            d = d.reshape(*d.shape[:-1], -1, d_head)
        return hooks.intervene(self._out_hook(), Add(d))

    def suppress(self, hooks: HookSpec, feature: int, positions: Iterable[int] | None = None,
                 scale: float = 0.0) -> HookSpec:
        """Remove (scale=0) or rescale a feature's own contribution ``f_i(x) * W_dec[i]``.

        Implemented as an exact edit: the activation gets ``(scale - 1) * f_i(x) * W_dec[i]``
        added, so the rest of the activation (and the SAE's error) stays. SAEs only.
        """
        if self.hook_point_out is not None:
            raise DictionaryError("suppress on a transcoder: use splice(feature_edit=...)")
        hp = self.require_hook()
        pos = None if positions is None else list(positions)
        direction = self.feature_direction(feature)

        def edit(x: torch.Tensor, hook: Any) -> torch.Tensor:
            self._check_width(x, hook)
            f = self.encode(x)[..., feature]  # [...]
            coef = (scale - 1.0) * f
            if pos is not None:
                keep = torch.zeros_like(coef)
                keep[..., pos] = 1.0
                coef = coef * keep
            delta = coef[..., None] * direction
            return x + delta.reshape(x.shape).to(x.dtype)

        return hooks.intervene(hp, edit)


def _hook_width(model: Any, hp: HookPoint, heads_flat: bool) -> int | None:
    shape_of = getattr(getattr(model, "backend", None), "hook_shape", None)
    if shape_of is not None:
        try:
            shape = shape_of(hp, 1, 1)
        except Exception:
            shape = None
        if shape is not None:
            shape = tuple(shape)
            if heads_flat and len(shape) >= 4:
                return int(shape[-2] * shape[-1])
            return int(shape[-1])
    resid = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_mlp_out",
             "hook_attn_out", "ln2.hook_normalized", "ln1.hook_normalized", "attn.hook_in",
             "mlp.hook_in")
    if hp.suffix in resid or hp.name == "hook_embed":
        return int(model.hidden_size)
    return None

"""The backend protocol and `MIModel`, the object users hold.

`MIModel` owns what is the same for every backend: source resolution, detection through
the plugins, hook validation before compute, TransformerLens-style conveniences and
generation. A backend owns its forward pass and calls ``run.apply(name, x)`` at each point.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import (TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol, Sequence,
                    runtime_checkable)

import attrs
import torch

from mi_core import capabilities as caps
from mi_core import plugins
from mi_core.errors import (
    HookError, InputError, MIError, PluginError, TokenizerError, UnsupportedModelError,
)
from mi_core.hooks import OPT_IN_SUFFIXES, HookCache, HookLike, HookPoint, HookSpec

if TYPE_CHECKING:
    from mi_core.activation_cache import ActivationCache
from mi_core.interventions import Intervention, check_broadcast
from mi_core.loading import (
    DEFAULT_HUB_PATTERNS, read_config, refuse_pickle, resolve_source, tensor_names_of,
)
from mi_core.registry import CompatibilityReport, Detection, ModelSource
from mi_core.tokenizer import HFTokenizer, MITokenizer
from mi_core.tl import TransformerLensMixin


@runtime_checkable
class MIBackend(Protocol):
    """What every backend implements; see docs/PLUGINS.md.

    Attributes: ``name``, ``config`` (attrs), ``num_layers``, ``num_heads``,
    ``num_kv_heads``, ``hidden_size``, ``vocab_size``, ``device``, ``dtype``,
    ``tokenizer`` (MITokenizer or None).
    Anything more is a capability the backend declares by implementing a protocol of
    :mod:`mi_core.capabilities` (hook shapes, KV-cached generation, layer schedules, state
    interventions, weight access, readout, gradients); the core checks them before compute.
    """

    name: str
    config: Any
    num_layers: int
    num_heads: int
    num_kv_heads: int
    hidden_size: int
    vocab_size: int
    device: torch.device
    dtype: torch.dtype
    tokenizer: MITokenizer | None

    def hook_points(self) -> list[HookPoint]:
        """Every hook point this model provides, in execution order."""

    def forward(self, ids: torch.Tensor, hooks: HookSpec,
                attention_mask: torch.Tensor | None = None, **kwargs: Any) -> HookCache:
        """ids [batch, seq] -> HookCache(output=logits [batch, seq, vocab], captures)."""

    def project_to_vocab(self, hidden: torch.Tensor) -> torch.Tensor:
        """Residual-stream vectors [..., d_model] -> logits [..., vocab] (final norm + head)."""


@attrs.define
class GenerationResult:
    """Output of :meth:`MIModel.generate`."""

    tokens: torch.Tensor  # [batch, prompt + new] (prompt included)
    new_tokens: torch.Tensor  # [batch, new]
    text: list[str]  # decoded new tokens, one string per sequence
    step_logits: list[torch.Tensor] | None = None  # per step [batch, vocab] when requested


def _source_of(source: str | os.PathLike[str], revision: str | None = None) -> ModelSource:
    patterns = DEFAULT_HUB_PATTERNS + plugins.hub_file_patterns()
    path = resolve_source(source, patterns, revision=revision)
    refuse_pickle(path)
    if path.is_dir():
        names, shapes = tensor_names_of(path)
        return ModelSource(path=path, config=read_config(path), tensor_names=names,
                           tensor_shapes=shapes)
    return ModelSource(path=path)


def _detections(src: ModelSource) -> list[Detection]:
    out: list[Detection] = []
    for plugin_name, result in plugins.call_per_plugin("mi_detect_backend", catch=True,
                                                       source=src):
        if isinstance(result, Exception):  # a plugin bug: reported, not a raw traceback
            out.append(Detection("?", 0.0, f"detection failed on {src.path}: "
                                 f"{type(result).__name__}: {result}", plugin=plugin_name))
            continue
        items = result if isinstance(result, (list, tuple)) else [result]
        for d in items:
            if d is not None:
                if not d.plugin:
                    d = attrs.evolve(d, plugin=plugin_name)
                out.append(d)
    return out


def _report(source: str, src: ModelSource, dets: list[Detection]) -> CompatibilityReport:
    ok = [d for d in dets if d.ok]
    best = max(ok, key=lambda d: d.score) if ok else None
    mt = (src.config or {}).get("model_type") if src.config else None
    return CompatibilityReport(source=source, model_type=mt, supported=best is not None,
                               backend=best.backend if best else None, detections=dets)


def check_compatibility(source: str | os.PathLike[str]) -> CompatibilityReport:
    """Ask every plugin about `source` without loading weights."""
    src = _source_of(source)
    return _report(os.fspath(source), src, _detections(src))


def resolve_device(device: str | torch.device) -> torch.device:
    """`device` as a torch.device that exists and is available here; InputError otherwise."""
    if not isinstance(device, (str, torch.device)):
        raise InputError(f"device must be a str or torch.device, got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise InputError(f"device {device!r} is not a device torch knows: {exc}") from None
    if dev.type == "cpu" or dev.type == "meta":
        return dev
    module = getattr(torch, dev.type, None)  # torch.cuda, torch.mps, torch.xpu, ...
    available = module is not None and hasattr(module, "is_available") and module.is_available()
    if not available:
        raise InputError(f"device {device!r}: {dev.type} is not available on this machine")
    count = getattr(module, "device_count", None)
    if dev.index is not None and count is not None and dev.index >= count():
        raise InputError(f"device {device!r}: this machine has {count()} {dev.type} device(s)")
    return dev


def _check_dtype(dtype: Any) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InputError(f"dtype must be a floating torch.dtype (e.g. torch.float32), got "
                         f"{dtype!r}")
    return dtype


_BACKEND_MEMBERS = ("name", "num_layers", "num_heads", "num_kv_heads", "hidden_size",
                    "vocab_size", "device", "dtype", "tokenizer", "hook_points", "forward",
                    "project_to_vocab")


def _load_tokenizer(path: Path) -> MITokenizer | None:
    directory = path if path.is_dir() else path.parent
    for spec in plugins.tokenizer_specs():
        try:
            if spec.detect(directory):
                return spec.load(directory)
        except MIError:
            raise
        except Exception as exc:  # a plugin's loader failing on this directory's files
            raise TokenizerError(f"{directory}: tokenizer {spec.name!r} failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
    return HFTokenizer.from_directory(directory) if path.is_dir() else None


class MIModel(TransformerLensMixin):
    """A loaded model with hooks. Create with :meth:`from_pretrained`.

    TransformerLens users also find its conveniences here (mi_core.tl): weight properties,
    ``to_single_token``, ``test_prompt``, ``process_weights``, ``run_with_cache`` returning an
    :class:`~mi_core.activation_cache.ActivationCache`, backward hooks."""

    def __init__(self, backend: MIBackend, source: str = "") -> None:
        self.backend = backend
        self.source = source
        self._points: list[HookPoint] | None = None
        self._names: set[str] | None = None
        self._norm_centres: bool | None = None  # see norm_centres
        self._gated: bool | None = None
        #: opt-in points that name filters select (TransformerLens' set_use_attn_result, ...)
        self._opt_in_on: set[str] = set()

    # -- loading ------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, source: str | os.PathLike[str], device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32, backend: str | None = None,
                        revision: str | None = None, fold_ln: bool = False,
                        center_writing_weights: bool = False, center_unembed: bool = False,
                        fold_value_biases: bool = False) -> "MIModel":
        """Load a hub id, a local directory or a single file a plugin claims (e.g. ``.gguf``).

        `revision`: a hub branch, tag or commit (e.g. a training checkpoint's ``"step1000"``); hub ids only.
        `fold_ln`, `center_writing_weights`, `center_unembed`, `fold_value_biases`: weight
        processing as TransformerLens' (see :meth:`process_weights`); all False by default
        (the checkpoint's own weights), where TransformerLens' ``from_pretrained`` defaults
        them to True.
        """
        dev, dtype = resolve_device(device), _check_dtype(dtype)
        src = _source_of(source, revision)
        available = plugins.backends()
        if backend is None:
            dets = _detections(src)
            report = _report(os.fspath(source), src, dets)
            if not report.supported:
                if not available:
                    raise UnsupportedModelError(
                        f"{source}: no backend plugins are installed (install mi-core with "
                        f"the extra of a backend plugin, e.g. pip install 'mi-core[all]')")
                raise UnsupportedModelError("no plugin can load this checkpoint:\n" + report.summary())
            backend = report.backend
        if backend not in available:
            raise UnsupportedModelError(f"backend {backend!r} is not installed; installed: "
                                        f"{', '.join(sorted(available)) or 'none'}")
        try:
            be = available[backend].load(src, dev, dtype)
        except MIError:
            raise
        except Exception as exc:  # never a raw ValueError / KeyError / TypeError from a load
            raise PluginError(f"backend {backend!r} failed to load {src.path}: "
                              f"{type(exc).__name__}: {exc}") from exc
        missing = [m for m in _BACKEND_MEMBERS if not hasattr(be, m)]
        if missing:
            raise PluginError(f"backend {backend!r} returned a {type(be).__name__} without the "
                              f"MIBackend member(s) {', '.join(missing)}")
        if be.tokenizer is None:
            be.tokenizer = _load_tokenizer(src.path)
        model = cls(be, source=os.fspath(source))
        if fold_ln or center_writing_weights or center_unembed or fold_value_biases:
            model.process_weights(fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                                  center_unembed=center_unembed,
                                  fold_value_biases=fold_value_biases)
        return model

    # -- metadata -----------------------------------------------------------------------
    num_layers = property(lambda self: self.backend.num_layers)
    num_heads = property(lambda self: self.backend.num_heads)
    num_kv_heads = property(lambda self: self.backend.num_kv_heads)
    hidden_size = property(lambda self: self.backend.hidden_size)
    d_model = hidden_size
    vocab_size = property(lambda self: self.backend.vocab_size)
    device = property(lambda self: self.backend.device)
    dtype = property(lambda self: self.backend.dtype)
    backend_name = property(lambda self: self.backend.name)
    config = property(lambda self: self.backend.config)

    @property
    def tokenizer(self) -> MITokenizer:
        tok = self.backend.tokenizer
        if tok is None:
            raise TokenizerError(f"{self.source}: this model has no tokenizer")
        return tok

    @property
    def has_tokenizer(self) -> bool:
        return self.backend.tokenizer is not None

    @property
    def norm_centres(self) -> bool:
        """Whether the norms centre their input (LayerNorm) rather than only rescale it
        (RMSNorm): probed once through the final norm with a fixed divisor (the readout
        capability), so it holds for any backend; reset by :meth:`process_weights`."""
        if self._norm_centres is None:
            self.require(caps.Readout, "telling a LayerNorm from an RMSNorm")
            one = torch.ones(1, self.hidden_size, dtype=self.dtype, device=self.device)
            s = torch.ones(1, 1, dtype=self.dtype, device=self.device)
            with torch.no_grad():
                diff = (self.backend.final_norm(one, scale=s)
                        - self.backend.final_norm(torch.zeros_like(one), scale=s))
            self._norm_centres = bool(diff.abs().max() < 1e-6)
        return self._norm_centres

    def capabilities(self) -> list[str]:
        """The capabilities the backend declares (see :mod:`mi_core.capabilities`)."""
        return caps.capabilities(self.backend)

    def require(self, capability: type, needed_for: str) -> None:
        """CapabilityError before compute unless the backend declares `capability`."""
        caps.require(self.backend, capability, needed_for)

    def hook_points(self) -> list[HookPoint]:
        if self._points is None:
            self._points = list(self.backend.hook_points())
            self._names = {p.name for p in self._points}
        return list(self._points)

    def _hook_names(self) -> set[str]:
        """Names of every hook point, computed once."""
        if self._names is None:
            self.hook_points()
        assert self._names is not None
        return self._names

    def has_hook_point(self, point: HookLike) -> bool:
        return HookPoint.parse(point).name in self._hook_names()

    # -- tokens -------------------------------------------------------------------------
    def to_tokens(self, text: str | Sequence[str], prepend_bos: bool | None = None) -> torch.Tensor:
        """LongTensor [batch, seq]. Special tokens as the tokenizer's post-processor adds them;
        `prepend_bos` forces a BOS on (True) or off (False). Batches must have equal length
        (use :meth:`to_tokens_padded` otherwise)."""
        texts = [text] if isinstance(text, str) else list(text)
        rows = [self._encode(t, prepend_bos) for t in texts]
        if len({len(r) for r in rows}) != 1:
            raise TokenizerError("prompts tokenize to different lengths "
                                 f"{[len(r) for r in rows]}; use to_tokens_padded")
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def to_tokens_padded(self, texts: Sequence[str], side: str = "left",
                         prepend_bos: bool | None = None, pad_id: int = 0
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [batch, max_seq], attention_mask [batch, max_seq]) padded on `side`."""
        if side not in ("left", "right"):
            raise InputError(f"side must be 'left' or 'right', got {side!r}")
        if isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < self.vocab_size:
            raise InputError(f"pad_id must be a token id in [0, {self.vocab_size}), got {pad_id!r}")
        if isinstance(texts, str) or not len(texts):
            raise InputError("texts must be a non-empty list of strings")
        rows = [self._encode(t, prepend_bos) for t in texts]
        n = max(len(r) for r in rows)
        ids = torch.full((len(rows), n), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), n), dtype=torch.long)
        for i, r in enumerate(rows):
            sl = slice(n - len(r), n) if side == "left" else slice(0, len(r))
            ids[i, sl] = torch.tensor(r)
            mask[i, sl] = 1
        return ids.to(self.device), mask.to(self.device)

    def _encode(self, text: str, prepend_bos: bool | None) -> list[int]:
        tok = self.tokenizer
        ids = tok.encode(text, add_special_tokens=True)
        bos = tok.bos_token_id
        if prepend_bos is True and bos is not None and (not ids or ids[0] != bos):
            ids = [bos] + ids
        elif prepend_bos is False and bos is not None and ids and ids[0] == bos:
            ids = ids[1:]
        return ids

    def to_str_tokens(self, text_or_ids: str | Sequence[int] | torch.Tensor,
                      prepend_bos: bool | None = None) -> list[str]:
        """One string per token. Text is tokenized as :meth:`to_tokens` does (`prepend_bos`
        as there); ids ([seq] or [1, seq]) are decoded one by one."""
        if isinstance(text_or_ids, str):
            text_or_ids = self.to_tokens(text_or_ids, prepend_bos=prepend_bos)[0]
        if isinstance(text_or_ids, torch.Tensor):
            text_or_ids = text_or_ids.flatten().tolist()
        return self.tokenizer.to_str_tokens(list(text_or_ids))

    def to_string(self, ids: Sequence[int] | torch.Tensor) -> str | list[str]:
        """Decode [seq] ids to a string, or [batch, seq] to one string per row."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() == 2 and ids.shape[0] > 1:
                return [self.tokenizer.decode(r.tolist()) for r in ids]
            ids = ids.flatten().tolist()
        return self.tokenizer.decode(list(ids))

    # -- forward ------------------------------------------------------------------------
    def validate(self, hooks: HookSpec, ids: torch.Tensor | None = None, *,
                 stateful: bool = False) -> None:
        """Before any compute: every point exists, every operand broadcasts, and the backend
        has what the spec needs (a state knockout/steering spec needs the state-interventions
        capability). `stateful`: the call carries a state (positions are absolute)."""
        if hooks.is_empty():
            return
        hooks.validate(self._hook_names(), num_layers=self.num_layers)
        be = self.backend
        for spec in (hooks.state_knockout, hooks.state_steering):
            if spec is not None:
                caps.require(be, caps.StateInterventions, f"a {type(spec).__name__}")
                be.check_state_spec(spec, None if ids is None or stateful else int(ids.shape[1]))
        if ids is None or not isinstance(be, caps.HookShapes):
            return
        batch, seq = ids.shape
        for hp in hooks.points():
            for iv in hooks.interventions_at(hp):
                if not isinstance(iv, Intervention):
                    continue
                op = iv.operand_shape()
                target = be.hook_shape(hp, batch, seq)
                if op is not None and target is not None:
                    check_broadcast(hp, type(iv).__name__, op, tuple(target))

    def check_ids(self, ids: Any, what: str = "ids") -> torch.Tensor:
        """Token ids as LongTensor [batch, seq] on the model's device; InputError (shape,
        dtype, ragged, empty) or TokenizerError (out of the vocabulary) naming `what`."""
        if not isinstance(ids, torch.Tensor):
            try:
                ids = torch.as_tensor(ids)
            except (ValueError, TypeError, RuntimeError) as exc:
                raise InputError(f"{what} cannot be made a [batch, seq] tensor ({exc}); rows of "
                                 f"unequal length must be padded (with attention_mask)") from None
        if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
            raise InputError(f"{what} must hold integer token ids, got dtype {ids.dtype}")
        if ids.dim() == 1:
            ids = ids.unsqueeze(0)
        if ids.dim() != 2:
            raise InputError(f"{what} must be [batch, seq] (or [seq]), got shape {list(ids.shape)}")
        if ids.numel() == 0:
            raise InputError(f"{what} is empty (shape {list(ids.shape)})")
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            bad = ids[(ids < 0) | (ids >= self.vocab_size)].unique()[:5].tolist()
            raise TokenizerError(f"{what}: token ids {bad} out of vocabulary range "
                                 f"[0, {self.vocab_size})")
        return ids.to(device=self.device, dtype=torch.long)

    def _check_mask(self, mask: Any, ids: torch.Tensor, cached: bool = False
                    ) -> torch.Tensor | None:
        """attention_mask [batch, seq] of 0/1 (bool or numeric), no all-zero row; with a
        cache (`cached`) it may also cover the cached positions, [batch, cached + seq]."""
        if mask is None:
            return None
        if not isinstance(mask, torch.Tensor):
            try:
                mask = torch.as_tensor(mask)
            except (ValueError, TypeError, RuntimeError) as exc:
                raise InputError(f"attention_mask cannot be made a tensor: {exc}") from None
        batch, seq = ids.shape
        if mask.dim() != 2 or mask.shape[0] != batch or (
                mask.shape[1] != seq and not (cached and mask.shape[1] > seq)):
            raise InputError(f"attention_mask has shape {list(mask.shape)}; ids have shape "
                             f"{list(ids.shape)} (expected the same)")
        if mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
            raise InputError("attention_mask must hold only 0 (padding) and 1 (token), got "
                             f"{mask[(mask != 0) & (mask != 1)].unique()[:5].tolist()}")
        if not cached:
            empty = (mask.sum(-1) == 0).nonzero().flatten().tolist()
            if empty:
                raise InputError(f"attention_mask rows {empty[:5]} are all zero: those "
                                 f"sequences have no tokens")
        return mask.to(self.device)

    def _check_options(self, options: Mapping[str, Any]) -> None:
        """Forward options that need a capability are refused before compute without it."""
        for key, (cap, what) in _OPTION_CAPABILITIES.items():
            if options.get(key) is not None:
                caps.require(self.backend, cap, what)
        schedule = options.get("layer_schedule")
        if schedule is not None:
            bad = [x for x in schedule if isinstance(x, bool) or not isinstance(x, int)
                   or not 0 <= x < self.num_layers]
            if bad or not len(schedule):
                raise InputError(f"layer_schedule {list(schedule)}: need layer indices in "
                                 f"0..{self.num_layers - 1}" + (f"; bad: {bad[:5]}" if bad else ""))
            self.backend.check_layer_schedule(schedule)

    def forward(self, ids: torch.Tensor, hooks: HookSpec | None = None,
                attention_mask: torch.Tensor | None = None, **kwargs: Any) -> HookCache:
        """Run the model; `hooks` captures and intervenes. Returns a HookCache (logits always).

        `kwargs` are backend forward options; those needing a capability (``past``,
        ``layer_schedule``, ``between_layers``) are checked against it before compute.
        """
        hooks = hooks if hooks is not None else HookSpec()
        if not isinstance(hooks, HookSpec):
            raise HookError(f"hooks must be a HookSpec, got {type(hooks).__name__}")
        ids = self.check_ids(ids)
        cached = kwargs.get("past") is not None
        if kwargs:
            self._check_options(kwargs)
        self.validate(hooks, ids, stateful=cached)
        mask = self._check_mask(attention_mask, ids, cached=cached)
        return self._run(ids, hooks, mask, kwargs)

    __call__ = forward

    def _run(self, ids: torch.Tensor, hooks: HookSpec, mask: torch.Tensor | None,
             options: Mapping[str, Any]) -> HookCache:
        """The backend's forward on checked inputs (no validation: callers did it)."""
        if hooks.needs_grad():  # gradients asked for: autograd on, whatever the caller's mode
            if torch.is_inference_mode_enabled():
                raise InputError("capture_grad / backward hooks inside torch.inference_mode(): "
                                 "no gradient can be recorded there; call outside it")
            with torch.enable_grad():
                return self.backend.forward(ids, hooks, attention_mask=mask, **options)
        with torch.inference_mode(not torch.is_grad_enabled()):
            return self.backend.forward(ids, hooks, attention_mask=mask, **options)

    def project_to_vocab(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.backend.project_to_vocab(hidden.to(device=self.device, dtype=self.dtype))

    # -- TransformerLens-style conveniences ----------------------------------------------
    def _ids(self, x: torch.Tensor | str) -> torch.Tensor:
        return self.to_tokens(x) if isinstance(x, str) else x

    def _points_for(self, names: Any) -> list[HookPoint]:
        """Hook points named by a filter (callable on the name), a name or a list of names
        (full names or TransformerLens shorthand, e.g. ``("resid_pre", 3)``)."""
        from mi_core.activation_cache import get_act_name

        points = self.hook_points()
        off = set(OPT_IN_SUFFIXES) - self._opt_in_on
        if names is None:
            return [p for p in points if p.suffix not in off]
        if callable(names) and not isinstance(names, (str, HookPoint)):
            return [p for p in points if p.suffix not in off and names(p.name)]
        items = [names] if isinstance(names, (str, HookPoint, tuple)) else list(names)
        out = []
        for n in items:
            if isinstance(n, tuple):
                n = get_act_name(*n)
            elif isinstance(n, str):
                n = get_act_name(n)
            out.append(HookPoint.parse(n))
        return out

    def run_with_cache(self, ids: torch.Tensor | str,
                       names_filter: Callable[[str], bool] | Iterable[HookLike] | str | None = None,
                       attention_mask: torch.Tensor | None = None,
                       remove_batch_dim: bool = False) -> tuple[torch.Tensor, "ActivationCache"]:
        """(logits, ActivationCache) capturing every point (or those `names_filter` accepts:
        a callable on the name, a name, or a list of names). Opt-in points
        (``attn.hook_result``, per-head inputs) are captured when named, or by a filter once
        switched on as in TransformerLens (``set_use_attn_result(True)``, ...)."""
        from mi_core.activation_cache import ActivationCache

        chosen = self._points_for(names_filter)
        cache = self.forward(self._ids(ids), HookSpec().capture_all(chosen),
                             attention_mask=attention_mask)
        out = ActivationCache.of(cache, self)
        if remove_batch_dim:
            out.remove_batch_dim()
        return cache.output, out

    def run_with_hooks(self, ids: torch.Tensor | str,
                       fwd_hooks: Sequence[tuple[Any, Callable[..., Any]]] = (),
                       bwd_hooks: Sequence[tuple[Any, Callable[..., Any]]] = (),
                       attention_mask: torch.Tensor | None = None,
                       reset_hooks_end: bool = True, return_type: str | None = "logits",
                       loss_per_token: bool = False) -> Any:
        """Logits with TransformerLens-style hooks. Each entry is ``(name_or_filter, fn)``: a
        hook name (or shorthand), or a callable filter on names. Forward ``fn(tensor, hook)``
        returns the new activation or None (in-place edits kept); backward ``fn(grad, hook)``
        runs when the returned logits (or a metric of them) are back-propagated, and a tensor
        it returns replaces the gradient upstream. Hooks live on this call's autograd graph, so
        nothing needs resetting (`reset_hooks_end` is accepted for TransformerLens code).
        `return_type` as TransformerLens: "logits", "loss" (mean next-token cross-entropy, per
        token with `loss_per_token`), "both" ((logits, loss)) or None."""
        spec = HookSpec()
        for name, fn in fwd_hooks:
            for hp in self._points_for(name):
                spec.intervene(hp, fn)
        for name, fn in bwd_hooks:
            for hp in self._points_for(name):
                spec.add_backward_hook(hp, fn)
        ids = self._ids(ids)
        logits = self.forward(ids, spec, attention_mask=attention_mask).output
        return _tl_return(logits, ids, return_type, loss_per_token)

    def _opt_in(self, suffixes: Sequence[str], use: bool) -> None:
        (self._opt_in_on.update if use else self._opt_in_on.difference_update)(suffixes)

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Let name filters (run_with_cache, run_with_hooks) select ``attn.hook_result``."""
        self._opt_in(["attn.hook_result"], use_attn_result)

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Let name filters select ``hook_q_input`` / ``hook_k_input`` / ``hook_v_input``."""
        self._opt_in(["hook_q_input", "hook_k_input", "hook_v_input"], use_split_qkv_input)

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Let name filters select ``hook_attn_in``."""
        self._opt_in(["hook_attn_in"], use_attn_in)

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Accepted for TransformerLens code: ``hook_mlp_in`` always exists (it costs nothing)."""

    # -- weight processing (TransformerLens' from_pretrained defaults, opt-in here) -------------
    def process_weights(self, fold_ln: bool = True, center_writing_weights: bool = True,
                        center_unembed: bool = True, fold_value_biases: bool = True) -> "MIModel":
        """Rewrite the weights in place as TransformerLens' ``process_weights_`` does: fold
        each norm's gain (and bias) into the weights that read it, centre the weights writing
        to the residual stream (LayerNorm models only, as TransformerLens), centre the
        unembedding, fold the value biases into b_O. Logits are unchanged (centring the
        unembedding shifts every logit of a position equally). Hook values change where
        TransformerLens' do (e.g. ``attn.hook_in`` no longer includes the gain)."""
        self.require(caps.WeightProcessing, "process_weights")
        self.backend.process_weights(fold_ln=fold_ln,
                                     center_writing_weights=center_writing_weights,
                                     center_unembed=center_unembed,
                                     fold_value_biases=fold_value_biases)
        self._norm_centres = None
        return self

    # -- generation ---------------------------------------------------------------------
    def generate(self, ids: torch.Tensor | str, max_new_tokens: int = 20, temperature: float = 0.0,
                 hooks: HookSpec | None = None, attention_mask: torch.Tensor | None = None,
                 stop_at_eos: bool = True, return_logits: bool = False,
                 generator: torch.Generator | None = None,
                 forward_options: ForwardOptions | None = None,
                 prefill_options: Mapping[str, Any] | None = None) -> GenerationResult:
        """Greedy (temperature 0) or sampled generation; the one generation loop.

        ids [batch, prompt] (left-padded batches with `attention_mask`; right padding is
        refused). Hooks and interventions apply at every forward call. With the KV-cached
        generation capability the prompt is computed once and each step feeds one token;
        without it every step recomputes the whole sequence.
        `forward_options`: backend forward options for every call (e.g. ``layer_schedule``),
        or a function of the number of tokens the cache already holds (0 for the prompt)
        returning them. `prefill_options`: options for the first token only, computed by one
        uncached forward of the prompt; the cached loop then starts from prompt + that token.
        After EOS a finished row is filled with EOS; the loop ends when every row is done.
        """
        ids = self.check_ids(self._ids(ids))
        hooks = hooks if hooks is not None else HookSpec()
        if not isinstance(hooks, HookSpec):
            raise HookError(f"hooks must be a HookSpec, got {type(hooks).__name__}")
        n_new = _check_max_new_tokens(max_new_tokens)
        _check_temperature(temperature)
        mask = self._check_mask(attention_mask, ids)
        if mask is not None:
            _check_left_padded(mask)
        options: Callable[[int], Mapping[str, Any]]
        if callable(forward_options):
            options = forward_options
        else:
            fixed = dict(forward_options or {})
            options = lambda _offset: fixed  # noqa: E731
        for opts in (options(0), prefill_options or {}):
            if "past" in opts:
                raise InputError("generate manages the cache itself; do not pass 'past' in "
                                 "forward_options / prefill_options")
            self._check_options(opts)
        cached = caps.has(self.backend, caps.KVCachedGeneration)
        self.validate(hooks, ids, stateful=cached)
        tok = self.backend.tokenizer
        eos = tok.eos_token_id if stop_at_eos and tok is not None else None
        batch = ids.shape[0]
        done = torch.zeros(batch, dtype=torch.bool, device=self.device)
        new: list[torch.Tensor] = []
        step_logits: list[torch.Tensor] = []
        seq, past, offset = ids, None, 0
        for step in range(n_new):
            if step == 0 and prefill_options is not None:
                out = self._run(ids, hooks, mask, dict(prefill_options))
            elif cached:
                if past is None:  # the prompt (and a prefill token) in one call
                    past, cur = self.backend.new_past(batch), seq
                else:
                    cur = seq[:, -1:]
                opts = options(offset)
                if callable(forward_options) and step > 0:
                    self._check_options(opts)
                out = self._run(cur, hooks, mask, {**opts, "past": past})
                offset += cur.shape[1]
            else:  # no cache: recompute the whole sequence
                out = self._run(seq, hooks, mask, options(0))
            logits = out.output[:, -1, :].float()
            if return_logits:
                step_logits.append(logits)
            nxt = sample_token(logits, temperature, generator)
            if eos is not None:
                nxt = torch.where(done, torch.full_like(nxt, eos), nxt)
                done |= nxt == eos
            new.append(nxt)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            if eos is not None and bool(done.all()):
                break
        new_t = seq[:, ids.shape[1]:]
        text = [tok.decode(r.tolist()) for r in new_t] if tok is not None else []
        return GenerationResult(tokens=seq, new_tokens=new_t, text=text,
                                step_logits=step_logits if return_logits else None)

    def __repr__(self) -> str:
        return (f"MIModel(backend={self.backend_name!r}, layers={self.num_layers}, "
                f"d_model={self.hidden_size}, source={self.source!r})")


def _tl_return(logits: torch.Tensor, ids: torch.Tensor, return_type: str | None,
               per_token: bool) -> Any:
    """TransformerLens' return_type: "logits", "loss", "both" or None."""
    if return_type not in ("logits", "loss", "both", None):
        raise MIError(f"return_type must be 'logits', 'loss', 'both' or None, got {return_type!r}")
    if return_type is None:
        return None
    if return_type == "logits":
        return logits
    logp = logits[:, :-1].float().log_softmax(-1)
    loss = -logp.gather(-1, ids[:, 1:, None].to(logp.device))[..., 0]
    loss = loss if per_token else loss.mean()
    return loss if return_type == "loss" else (logits, loss)


def sample_token(logits: torch.Tensor, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [batch, vocab] -> ids [batch]: argmax at temperature 0, else softmax sampling."""
    if _check_temperature(temperature) == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


#: Forward options that need a capability, and how a refusal describes them.
_OPTION_CAPABILITIES: dict[str, tuple[type, str]] = {
    "past": (caps.KVCachedGeneration, "forward(past=...)"),
    "layer_schedule": (caps.LayerSchedule, "forward(layer_schedule=...)"),
    "between_layers": (caps.LayerSchedule, "forward(between_layers=...)"),
}

ForwardOptions = Mapping[str, Any] | Callable[[int], Mapping[str, Any]]


def _check_max_new_tokens(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InputError(f"max_new_tokens must be a non-negative int, got {n!r}")
    return n


def _check_temperature(t: Any) -> float:
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise InputError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
    return float(t)


def _check_left_padded(mask: torch.Tensor) -> None:
    """generate appends after the last column: every row's padding must come first."""
    gaps = (mask[:, 1:].long() < mask[:, :-1].long()).any(dim=1).nonzero().flatten().tolist()
    if gaps:
        raise InputError(f"attention_mask rows {gaps[:5]} have padding after a token (right "
                         f"padding): generate needs left padding, e.g. "
                         f"model.to_tokens_padded(texts, side='left')")


def require_points(model: MIModel, points: Iterable[HookLike]) -> None:
    """HookError naming the first point `model` lacks (for analyses that need specific points)."""
    for p in points:
        if not model.has_hook_point(p):
            raise HookError(f"this analysis needs hook point {HookPoint.parse(p).name!r}, which "
                            f"the {model.backend_name} backend does not provide")

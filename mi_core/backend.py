"""`MIModel`, the object users hold: load, forward with hooks, generate, tokens.

`MIModel` owns what is the same for every backend: source resolution and detection through
the plugins, input and hook validation before compute, generation. A backend owns its
forward pass and calls ``run.apply(name, x)`` at each point. Conveniences beyond that
(TransformerLens' ``run_with_cache``, ``W_Q``, ...) are registered by plugins through
``mi_model_attributes`` and found by :meth:`MIModel.__getattr__`.
"""

from __future__ import annotations

import inspect
import os
import types
from typing import Any, Iterable, Mapping, Sequence

import torch

from mi_core import capabilities as caps
from mi_core import plugins
from mi_core.detection import check_compatibility, detections, load_tokenizer, report, source_of
from mi_core.errors import CapabilityError, HookError, InputError, MIError, PluginError
from mi_core.errors import TokenizerError
from mi_core.errors import UnsupportedModelError
from mi_core.generation import ForwardOptions, GenerationResult, generate, sample_token
from mi_core.hooks import HookCache, HookSpec
from mi_core.inputs import check_dtype, check_ids, check_mask, resolve_device
from mi_core.interventions import Intervention, check_broadcast
from mi_core.loading import SKIP_MEMORY_CHECK
from mi_core.placement import check_placement
from mi_core.points import HookLike, HookPoint
from mi_core.protocol import MEMBERS, MIBackend
from mi_core.tokenizer import MITokenizer

__all__ = ["GenerationResult", "MIBackend", "MIModel", "check_compatibility", "require_points",
           "resolve_device", "sample_token"]

#: Forward options that need a capability, and how a refusal describes them.
_OPTION_CAPABILITIES: dict[str, tuple[type, str]] = {
    "past": (caps.KVCachedGeneration, "forward(past=...)"),
    "layer_schedule": (caps.LayerSchedule, "forward(layer_schedule=...)"),
    "between_layers": (caps.LayerSchedule, "forward(between_layers=...)"),
}


class _ModelClass(type):
    """Lets ``MIModel.run_with_cache`` (the class, not an instance) name a plugin's convenience
    too, e.g. for ``inspect.signature``; only reached when the class lacks the name."""

    def __getattr__(cls, name: str) -> Any:
        attr = _conveniences().get(name) if not name.startswith("__") else None
        if attr is None:
            raise AttributeError(f"type object {cls.__name__!r} has no attribute {name!r}")
        return attr


class MIModel(metaclass=_ModelClass):
    """A loaded model with hooks. Create with :meth:`from_pretrained`.

    Plugins add conveniences (e.g. mi-core's TransformerLens layer: ``run_with_cache``,
    ``W_Q``, ``to_single_token``, ``process_weights``, ...); ``mi plugins`` lists them."""

    def __init__(self, backend: MIBackend, source: str = "") -> None:
        self.backend = backend
        self.source = source
        self._points: list[HookPoint] | None = None
        self._names: set[str] | None = None

    # -- loading ------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, source: str | os.PathLike[str], device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32, backend: str | None = None,
                        revision: str | None = None, *, fold_ln: bool = False,
                        center_writing_weights: bool = False, center_unembed: bool = False,
                        fold_value_biases: bool = False, device_map: Any = None,
                        max_memory: Mapping[Any, int | str] | None = None,
                        offload: str | None = None, check_memory: bool = True) -> "MIModel":
        """Load a hub id, a local directory or a single file a plugin claims (e.g. ``.gguf``).

        `revision`: a hub branch, tag or commit (e.g. a training checkpoint's ``"step1000"``); hub ids only.
        `fold_ln`, `center_writing_weights`, `center_unembed`, `fold_value_biases`: weight
        processing as TransformerLens' (``model.process_weights``); all False by default (the
        checkpoint's own weights), where TransformerLens' ``from_pretrained`` defaults them
        to True.
        `device_map` ("auto", "sequential" or ``{"embed": "cuda:0", "blocks.0-15": "cuda:0",
        "blocks.16-31": "cuda:1", "unembed": "cuda:1"}``), `max_memory` (``{device: bytes or
        "8GiB"}``) and `offload` (None, "cpu": weights in CPU memory, "disk": memory-mapped
        from the safetensors files; each block moved to its device when it runs) place the
        model across devices (docs/BACKENDS.md, "Placement"); checked before anything is read.
        `check_memory=False`: load a config whose parameters seem not to fit in memory.
        """
        token = SKIP_MEMORY_CHECK.set(not check_memory)
        try:
            dev, dtype = resolve_device(device), check_dtype(dtype)
            placement = check_placement(device_map, max_memory, offload, dev)
            src = source_of(source, revision)
            available = plugins.backends()
            if backend is None:
                rep = report(os.fspath(source), src, detections(src))
                if not rep.supported:
                    if not available:
                        raise UnsupportedModelError(
                            f"{source}: no backend plugins are installed (install mi-core with "
                            f"the extra of a backend plugin, e.g. pip install 'mi-core[all]')")
                    raise UnsupportedModelError(
                        rep.summary() if rep.unimplemented
                        else "no plugin can load this checkpoint:\n" + rep.summary())
                backend = rep.backend
            if backend not in available:
                raise UnsupportedModelError(f"backend {backend!r} is not installed; installed: "
                                            f"{', '.join(sorted(available)) or 'none'}")
            extra = {} if placement is None else {"placement": placement}
            if extra and "placement" not in inspect.signature(available[backend].load).parameters:
                # the backend's loader predates placement: refuse rather than load unplaced
                raise CapabilityError(f"backend {backend!r} cannot place a model across devices "
                                      f"(device_map / offload); load it on one device")
            try:
                be = available[backend].load(src, dev, dtype, **extra)
            except MIError:
                raise
            except Exception as exc:  # never a raw ValueError / KeyError / TypeError from a load
                raise PluginError(f"backend {backend!r} failed to load {src.path}: "
                                  f"{type(exc).__name__}: {exc}") from exc
            missing = [m for m in MEMBERS if not hasattr(be, m)]
            if missing:
                raise PluginError(f"backend {backend!r} returned a {type(be).__name__} without "
                                  f"the MIBackend member(s) {', '.join(missing)}")
            if be.tokenizer is None:
                be.tokenizer = load_tokenizer(src.path)
            processing = dict(fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                              center_unembed=center_unembed, fold_value_biases=fold_value_biases)
            if any(processing.values()):
                caps.require(be, caps.WeightProcessing, "weight processing at load (fold_ln=...)")
                be.process_weights(**processing)
            return cls(be, source=os.fspath(source))
        finally:
            SKIP_MEMORY_CHECK.reset(token)

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
    def layer_types(self) -> list[str]:
        """Each layer's mixer ("full_attention", "sliding_attention", a recurrent one ...); a
        CapabilityError for a backend that does not declare them."""
        self.require(caps.LayerTypes, "layer_types")
        return list(self.backend.layer_types)

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

    # -- checks before compute --------------------------------------------------------------
    def validate(self, hooks: HookSpec, ids: torch.Tensor | None = None, *,
                 stateful: bool = False) -> None:
        """Before any compute: every point exists, every operand broadcasts, and the backend
        has what the spec needs (a state knockout/steering spec needs the state-interventions
        capability). `stateful`: the call carries a state (positions are absolute)."""
        if hooks.is_empty():
            return
        names = self._hook_names()
        try:
            hooks.validate(names, num_layers=self.num_layers)
        except HookError as e:  # say what the layer is (a recurrent layer has no attention)
            hp = next(p for p in hooks.points() if p.name not in names)
            raise HookError(f"{e}{self._layer_kind(hp)}") from None
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

    def require_points(self, points: Iterable[HookLike], needed_for: str = "this analysis"
                       ) -> None:
        """HookError naming the first point this model lacks (for analyses that need them)."""
        for p in points:
            if not self.has_hook_point(p):
                hp = HookPoint.parse(p)
                raise HookError(f"{needed_for} needs hook point {hp.name!r}, which the "
                                f"{self.backend_name} backend does not provide"
                                f"{self._layer_kind(hp)}")

    def _layer_kind(self, hp: HookPoint) -> str:
        if hp.layer is None or hp.layer >= self.num_layers or not caps.has(self.backend,
                                                                           caps.LayerTypes):
            return ""
        return f" (layer {hp.layer} is a {self.backend.layer_types[hp.layer]!r} layer)"

    def check_ids(self, ids: Any, what: str = "ids") -> torch.Tensor:
        """Token ids as LongTensor [batch, seq] on the model's device; InputError (shape,
        dtype, ragged, empty) or TokenizerError (out of the vocabulary) naming `what`."""
        return check_ids(ids, self.vocab_size, self.device, what)

    def _check_mask(self, mask: Any, ids: torch.Tensor, cached: bool = False
                    ) -> torch.Tensor | None:
        return check_mask(mask, ids, self.device, cached)

    def check_context(self, tokens: int, what: str, allow: bool = False) -> None:
        """InputError when `tokens` pass the context declared (ContextLength), unless `allow`."""
        ctx = self.backend.context_length if caps.has(self.backend, caps.ContextLength) else None
        if ctx is not None and tokens > ctx and not allow:
            raise InputError(f"{what}: {tokens} positions, beyond the model's context of {ctx}; "
                             f"allow_beyond_context=True to run anyway (results may degrade)")

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

    # -- forward ------------------------------------------------------------------------
    def forward(self, ids: torch.Tensor, hooks: HookSpec | None = None,
                attention_mask: torch.Tensor | None = None, *,
                allow_beyond_context: bool = False, **kwargs: Any) -> HookCache:
        """Run the model; `hooks` captures and intervenes. Returns a HookCache (logits always).

        `kwargs` are backend forward options; those needing a capability (``past``,
        ``layer_schedule``, ``between_layers``) are checked against it before compute; so is
        the context (more tokens: InputError unless `allow_beyond_context`).
        """
        hooks = hooks if hooks is not None else HookSpec()
        if not isinstance(hooks, HookSpec):
            raise HookError(f"hooks must be a HookSpec, got {type(hooks).__name__}")
        ids = self.check_ids(ids)
        self.check_context(ids.shape[1], "ids", allow_beyond_context)
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

    # -- generation ---------------------------------------------------------------------
    def generate(self, ids: torch.Tensor | str, max_new_tokens: int = 20, temperature: float = 0.0,
                 hooks: HookSpec | None = None, *, attention_mask: torch.Tensor | None = None,
                 stop_at_eos: bool = True, return_logits: bool = False,
                 generator: torch.Generator | None = None,
                 forward_options: ForwardOptions | None = None,
                 prefill_options: Mapping[str, Any] | None = None,
                 allow_beyond_context: bool = False) -> GenerationResult:
        """Greedy (temperature 0) or sampled generation; the one generation loop.

        ids [batch, prompt] (or a text; left-padded batches with `attention_mask`; right
        padding is refused). Hooks and interventions apply at every forward call. With the
        KV-cached generation capability the prompt is computed once and each step feeds one
        token; without it every step recomputes the whole sequence.
        `forward_options`: backend forward options for every call (e.g. ``layer_schedule``),
        or a function of the number of tokens the cache already holds (0 for the prompt)
        returning them. `prefill_options`: options for the first token only, computed by one
        uncached forward of the prompt; the cached loop then starts from prompt + that token.
        After EOS a finished row is filled with EOS; the loop ends when every row is done.
        InputError before compute past the context (unless `allow_beyond_context`) or memory.
        """
        ids = self.check_ids(self.to_tokens(ids) if isinstance(ids, str) else ids)
        return generate(self, ids, max_new_tokens, temperature=temperature, hooks=hooks,
                        attention_mask=attention_mask, stop_at_eos=stop_at_eos,
                        return_logits=return_logits, generator=generator,
                        forward_options=forward_options, prefill_options=prefill_options,
                        allow_beyond_context=allow_beyond_context)

    # -- conveniences plugins register --------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        """A convenience a plugin registers (``mi_model_attributes``): a method or property.
        Only reached when the class and the instance lack `name`."""
        if name.startswith("__") or name in ("backend", "source", "_points", "_names"):
            raise AttributeError(name)
        attr = _conveniences().get(name)
        if attr is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r} "
                                 f"(plugins add model conveniences; `mi plugins` lists them)")
        if isinstance(attr, property):
            return attr.__get__(self, type(self))
        return types.MethodType(attr, self)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(_conveniences()))

    def __repr__(self) -> str:
        return (f"MIModel(backend={self.backend_name!r}, layers={self.num_layers}, "
                f"d_model={self.hidden_size}, source={self.source!r})")


_checked: list[Any] = [None]  # the plugins' attribute dict last checked against MIModel


def _conveniences() -> dict[str, Any]:
    """The plugins' model attributes; one that would be shadowed by MIModel's own is refused."""
    found = plugins.model_attributes()
    if found is not _checked[0]:
        clash = sorted(n for n in found if any(n in vars(k) for k in MIModel.__mro__))
        if clash:
            raise PluginError(f"model attributes {clash} registered by a plugin are already "
                              f"MIModel's own; pick other names")
        _checked[0] = found
    return found


def require_points(model: MIModel, points: Iterable[HookLike]) -> None:
    """HookError naming the first point `model` lacks (for analyses that need specific points)."""
    model.require_points(points)

"""``HookedTransformer``: TransformerLens' model class, on the kernel's :class:`mi_core.MIModel`.

``from mi_core.tl import HookedTransformer`` and ``HookedTransformer.from_pretrained(path)``
give TransformerLens' interface with TransformerLens' defaults: weights processed at load
(fold_ln, centring, value biases), BOS prepended to text, ``model(x)`` returning logits
(``return_type`` "logits" / "loss" / "both" / None, ``loss_per_token``, ``stop_at_layer``,
``start_at_layer``), lists of texts padded (``padding_side``, attention masks), the module tree
(``model.blocks[3].attn.W_Q``, ``model.blocks[3].attn.hook_z``), persistent hooks
(``add_hook`` / ``reset_hooks`` / ``hooks()``), ``run_with_cache`` returning an
:class:`~mi_core.tl.ActivationCache`, and ``generate(text)`` returning text.

It is a wrapper, not a subclass: ``model.mi_model`` is the :class:`~mi_core.MIModel` it runs
(pass that to mi-core's analyses, which expect ``forward(ids, hooks) -> HookCache``), and any
attribute the class lacks is looked up there (``model.num_layers``, ``model.backend``, the
weight properties ``model.W_Q`` ...). Every forward goes through ``mi_model.forward`` with a
:class:`~mi_core.HookSpec` built from the hooks on the tree's hook points; only the points
TransformerLens would fire are hooked (``attn.hook_result`` only with ``use_attn_result``,
the per-head inputs only with their switches, nothing outside ``start_at_layer`` /
``stop_at_layer``), and ``blocks.{i}.ln1``'s hooks are called three times per forward, once
for each of the query, key and value inputs, as TransformerLens' blocks do.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Sequence

import torch

from mi_core import (
    CapabilityError, HookCache, HookError, HookSpec, InputError, MIError, MIModel, TokenizerError,
)
from mi_core.plugin import KVCachedGeneration, LayerSchedule, Readout, has_capability
from mi_core.plugin import OPT_IN_SUFFIXES
from mi_core.plugin import require_capability
from mi_core.tl import arithmetic, cached_keys, components, first_layers, from_config
from mi_core.tl import head_inputs, hf_objects, processing
from mi_core.tl.activation_cache import ActivationCache
from mi_core.tl.bridge_compat import BridgeCompatMixin
from mi_core.tl.config import HookedTransformerConfig, config_of
from mi_core.tl.errors import TLAttributeError, TLInputError, TLValueError
from mi_core.tl.hook_points import HookedRootModule, HookPoint, TLHookError, names_filter_fn
from mi_core.tl.config import load_device, load_dtype
from mi_core.tl.point_calls import _UserHookError, _bwd_caller, _call_point, _caller, _grad_hooks
from mi_core.tl.tl_tokens import TokensMixin
from mi_core.tl.tokenizer import TLTokenizer
from mi_core.tl.utils import USE_DEFAULT_VALUE, TLCapabilityError, lm_cross_entropy_loss

#: The embedding's points a forward from tokens runs.
EMBED_POINTS = frozenset({"hook_embed", "hook_pos_embed"})
#: Opt-in points and the config switch that makes TransformerLens fire them.
_OPT_IN = {"attn.hook_result": "use_attn_result", "hook_attn_in": "use_attn_in",
           "hook_q_input": "use_split_qkv_input", "hook_k_input": "use_split_qkv_input",
           "hook_v_input": "use_split_qkv_input", "hook_mlp_in": "use_hook_mlp_in"}


def _plugin_opt_in(name: str) -> bool:
    """Whether `name` is a plugin's opt-in point (TransformerLens' flag points aside)."""
    suffix = name.split(".", 2)[2] if name.startswith("blocks.") else name
    return suffix in OPT_IN_SUFFIXES and suffix not in _OPT_IN


class Output(NamedTuple):
    """``return_type="both"``: logits and loss (TransformerLens' ``Output``)."""

    logits: torch.Tensor
    loss: torch.Tensor


class _Stop(MIError):
    """Stops the kernel's forward at ``stop_at_layer`` carrying the residual stream."""

    def __init__(self, residual: torch.Tensor) -> None:
        super().__init__("stop_at_layer")
        self.residual = residual


class _Request:
    """What ``run_with_cache`` asks of the next forward: points to capture (gradients too)."""

    def __init__(self, names: Sequence[str], grads: bool) -> None:
        self.wanted, self.grads = set(names), grads
        self.values: dict[str, torch.Tensor] = {}
        self.grad_values: dict[str, torch.Tensor] = {}
        self.cache: HookCache | None = None

    def gradients(self) -> list[tuple[str, torch.Tensor]]:
        """The gradients backward reached, latest point first (the order backward hooks
        fire in a sequential model)."""
        if self.cache is None:  # stored by callables, in the order backward reached them
            return [(n, g) for n, g in self.grad_values.items() if n in self.wanted]
        out = [(n, g) for n, g in self.grad_values.items()
               if n.startswith("unembed.") and n in self.wanted]
        for name in reversed(list(self.values)):
            if name.startswith("unembed."):
                continue
            if name in self.grad_values:  # a point whose hooks the layer attached itself
                out.append((name, self.grad_values[name]))
                continue
            try:
                out.append((name, self.cache.grad(name)))
            except HookError:  # backward never reached it (TransformerLens' hook never fires)
                continue
        return out


class HookedTransformer(BridgeCompatMixin, TokensMixin, from_config.StateDictMixin,
                        HookedRootModule):
    """TransformerLens' ``HookedTransformer`` over a loaded :class:`mi_core.MIModel` (see the
    module doc). Build with :meth:`from_pretrained`, or ``HookedTransformer(mi_model)``."""

    def __init__(self, model: Any, tokenizer: Any = None, move_to_device: bool = True,
                 default_padding_side: str = "right", *, default_prepend_bos: bool = True,
                 model_name: str = "custom") -> None:
        given = None
        if isinstance(model, (HookedTransformerConfig, dict)):  # random, as TransformerLens'
            given = from_config.complete(HookedTransformerConfig.unwrap(model), tokenizer)
            model = MIModel.from_pretrained(from_config.checkpoint_dir(given), dtype=given.dtype)
        if not isinstance(model, MIModel):
            raise InputError(f"HookedTransformer needs an mi_core.MIModel, got "
                             f"{type(model).__name__}")
        if tokenizer is not None:  # a transformers tokenizer replaces the checkpoint's
            model.backend.tokenizer = hf_objects.mi_tokenizer(tokenizer)
        if default_padding_side not in ("left", "right"):
            raise InputError(f"default_padding_side must be 'left' or 'right', got "
                             f"{default_padding_side!r}")
        super().__init__()
        self.mi_model = model
        self.cfg = config_of(model, name=model_name, default_prepend_bos=default_prepend_bos)
        self.tokenizer: TLTokenizer | None = None
        if model.has_tokenizer:
            self.tokenizer = TLTokenizer(model.tokenizer, default_padding_side,
                                         name_or_path=model.source)
            self.cfg.tokenizer_prepends_bos = True  # TransformerLens' tokenizer_with_bos
        self._build_tree()
        if given is not None:
            from_config.adopt(self, given)

    def _build_tree(self, reuse: dict[str, HookPoint] | None = None) -> None:
        self._weights = components.WeightTree(self.mi_model)
        components.build(self, self.mi_model, self.cfg, self._weights, reuse)
        probe = torch.zeros(1, 2, dtype=torch.long, device=self.mi_model.device)
        self._weights.census(lambda: self.mi_model.forward(probe, HookSpec()))
        self.setup()
        self._points = [(n, hp) for n, hp in self.hook_dict.items()]
        self._request: _Request | None = None
        self._rotary = arithmetic.rotary_of(self.mi_model)

    # -- loading ------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, model_name: str | os.PathLike[str], fold_ln: bool = True,
                        center_writing_weights: bool = True, center_unembed: bool = True,
                        refactor_factored_attn_matrices: bool = False,
                        checkpoint_index: Optional[int] = None,
                        checkpoint_value: Optional[int] = None, hf_model: Any = None, *,
                        device: Any = None, n_devices: int = 1, tokenizer: Any = None,
                        move_to_device: bool = True, fold_value_biases: bool = True,
                        default_prepend_bos: Optional[bool] = None,
                        default_padding_side: Optional[str] = None, dtype: Any = "float32",
                        first_n_layers: Optional[int] = None, **from_pretrained_kwargs: Any
                        ) -> "HookedTransformer":
        """Load a checkpoint mi-core can load (a local directory, a ``.gguf`` file, a hub id;
        not TransformerLens' own short aliases: pass the hub id) with TransformerLens'
        defaults: norms folded, writing weights and unembedding centred, value biases folded,
        BOS prepended; `first_n_layers`: the first blocks only. Options TransformerLens has
        that cannot apply here raise a :class:`mi_core.CapabilityError` naming them."""
        unsupported = {"checkpoint_index": checkpoint_index, "checkpoint_value": checkpoint_value}
        named = [k for k, v in unsupported.items() if v is not None] + (
            ["n_devices"] if n_devices != 1 else [])
        revision = from_pretrained_kwargs.pop("revision", None)
        dtype = from_pretrained_kwargs.pop("torch_dtype", dtype)
        for neutral in ("checkpoint_label", "n_ctx"):  # TransformerLens 3's, None by default
            if from_pretrained_kwargs.get(neutral, 0) is None:
                del from_pretrained_kwargs[neutral]
        named += sorted(from_pretrained_kwargs)
        if named:
            raise CapabilityError(
                f"HookedTransformer.from_pretrained: {', '.join(named)} not supported by "
                f"mi-core's TransformerLens layer (training checkpoints: pass revision=; "
                f"other weights: save them as a checkpoint directory or pass hf_model=)")
        # hf_model= (its weights) and first_n_layers= (the first blocks): temporary checkpoints
        source, revision, tokenizer, temporary = first_layers.source(
            model_name, hf_model, tokenizer, first_n_layers, revision)
        model = MIModel.from_pretrained(source, device=load_device(device), dtype=load_dtype(dtype),
                                        revision=revision)
        out = cls(model, tokenizer, move_to_device, default_padding_side or "right",
                  default_prepend_bos=True if default_prepend_bos is None else
                  bool(default_prepend_bos), model_name=str(model_name))
        if temporary:
            hf_objects.remove_with(out, Path(source))
        flags = dict(fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                     center_unembed=center_unembed, fold_value_biases=fold_value_biases,
                     refactor_factored_attn_matrices=refactor_factored_attn_matrices)
        processing.process_at_load(out, flags)
        print(f"Loaded pretrained model {model_name} into HookedTransformer")
        return out

    @classmethod
    def from_pretrained_no_processing(cls, model_name: str | os.PathLike[str],
                                      **kwargs: Any) -> "HookedTransformer":
        """:meth:`from_pretrained` with every weight-processing flag off."""
        flags = dict(fold_ln=False, center_writing_weights=False, center_unembed=False,
                     refactor_factored_attn_matrices=False, fold_value_biases=False)
        return cls.from_pretrained(model_name, **{**flags, **kwargs})

    def process_weights_(self, fold_ln: bool = True, center_writing_weights: bool = True,
                         center_unembed: bool = True,
                         refactor_factored_attn_matrices: bool = False,
                         fold_value_biases: bool = True) -> None:
        """TransformerLens' weight processing, in place (logits unchanged); the module tree
        is rebuilt over the new weights, its hook points and their hooks kept."""
        from mi_core.tl.refactor import refactor_factored_attn_matrices as refactor

        if refactor_factored_attn_matrices and self.cfg.positional_embedding_type == "rotary":
            raise TLCapabilityError(
                "refactor_factored_attn_matrices: you can't refactor the QK circuit when using "
                "rotary embeddings (as the QK matrix depends on the position of the query and "
                "key), as TransformerLens refuses it")
        center_unembed = processing.unembed_centring(self.cfg, center_unembed)
        flags = dict(fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                     center_unembed=center_unembed, fold_value_biases=fold_value_biases)
        if any(flags.values()):
            self.mi_model.process_weights(**flags)
        if refactor_factored_attn_matrices:
            refactor(self.mi_model)
        base = self.mi_model.cfg
        self.cfg.normalization_type = base.normalization_type
        self._build_tree(reuse=dict(self.hook_dict))

    # -- switches (TransformerLens' set_use_*) -------------------------------------------------
    def set_use_attn_result(self, use_attn_result: bool) -> None:
        self.cfg.use_attn_result = use_attn_result

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        self.cfg.use_split_qkv_input = use_split_qkv_input

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        if self.cfg.attn_only:
            raise TLCapabilityError("Can't use hook_mlp_in with attn_only model")
        self.cfg.use_hook_mlp_in = use_hook_mlp_in

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        if self.cfg.n_key_value_heads is not None:
            raise TLCapabilityError("Can't use attn_in with GroupedQueryAttention, please use "
                                    "split_qkv_input instead (as TransformerLens)")
        self.cfg.use_attn_in = use_attn_in

    def set_ungroup_grouped_query_attention(self, ungroup: bool) -> None:
        if ungroup:
            raise TLCapabilityError("ungroup_grouped_query_attention is not supported: "
                                    "hook_k / hook_v stay per KV head")

    def check_hooks_to_add(self, hook_point: HookPoint, hook_point_name: str,
                           hook: Callable[..., Any], dir: str = "fwd",
                           is_permanent: bool = False, prepend: bool = False) -> None:
        """TransformerLens refuses a hook at an opt-in point whose switch is off."""
        for suffix, switch in _OPT_IN.items():
            if hook_point_name.endswith(suffix) and not getattr(self.cfg, switch):
                raise TLHookError(f"Cannot add hook {hook_point_name} if {switch} is False")

    # -- the forward ----------------------------------------------------------------------------
    def forward(self, input: Any, return_type: Optional[str] = "logits",
                loss_per_token: bool = False, prepend_bos: Optional[bool] = USE_DEFAULT_VALUE,
                padding_side: Optional[str] = USE_DEFAULT_VALUE,
                start_at_layer: Optional[int] = None, tokens: Optional[torch.Tensor] = None,
                shortformer_pos_embed: Optional[torch.Tensor] = None, *,
                attention_mask: Optional[torch.Tensor] = None,
                stop_at_layer: Optional[int] = None, past_kv_cache: Any = None) -> Any:
        """Text, a list of texts (padded), tokens [batch, pos] (or the residual stream
        [batch, pos, d_model] with `start_at_layer`) -> logits [batch, pos, d_vocab], the loss
        (``return_type="loss"``; per token [batch, pos - 1] with `loss_per_token`), both, or
        None; with `stop_at_layer` the residual stream after that many blocks."""
        if shortformer_pos_embed is not None or (past_kv_cache is not None
                                                  and start_at_layer is not None):
            raise CapabilityError("shortformer_pos_embed, or past_kv_cache with "
                                  "start_at_layer: not supported")
        if return_type not in ("logits", "loss", "both", None):
            raise InputError(f"return_type must be 'logits', 'loss', 'both' or None, got "
                             f"{return_type!r}")
        residual = None
        if start_at_layer is None:
            tokens, attention_mask = self.input_to_tokens(input, prepend_bos, padding_side,
                                                          attention_mask)
            if past_kv_cache is not None:  # mi_core.tl.past_key_value_caching
                attention_mask, past_kv_cache = past_kv_cache.use(
                    self, tokens, attention_mask, self._bos(prepend_bos))
        else:
            residual = self._residual_input(input)
        blocks = range(self.cfg.n_layers)[slice(start_at_layer, stop_at_layer)]
        if residual is not None and stop_at_layer is not None and not len(blocks):
            return residual  # no block to run, as TransformerLens
        ids = tokens if residual is None else torch.zeros(
            residual.shape[:2], dtype=torch.long, device=self.mi_model.device)
        out = self._run(ids, attention_mask, blocks=blocks, residual=residual,
                        embed=EMBED_POINTS if start_at_layer is None else frozenset(),
                        stop=stop_at_layer is not None, logits=return_type is not None,
                        past=past_kv_cache)
        if stop_at_layer is not None or return_type == "logits":
            return out
        if return_type is None:
            return None
        if tokens is None:
            raise TLInputError("tokens must be passed in if return_type is 'loss' or 'both' "
                               "(with start_at_layer)")  # TransformerLens asserts
        loss = self.loss_fn(out, tokens, attention_mask, per_token=loss_per_token)
        return loss if return_type == "loss" else Output(out, loss)

    def input_to_embed(self, input: Any, prepend_bos: Optional[bool] = USE_DEFAULT_VALUE,
                       padding_side: Optional[str] = USE_DEFAULT_VALUE,
                       attention_mask: Optional[torch.Tensor] = None,
                       past_kv_cache: Any = None
                       ) -> tuple[torch.Tensor, torch.Tensor, None, Optional[torch.Tensor]]:
        """(residual stream entering block 0 [batch, pos, d_model], tokens, None (no
        shortformer positions), attention mask) of a forward's input, ``hook_embed`` /
        ``hook_pos_embed`` hooks applied, as TransformerLens."""
        if past_kv_cache is not None:
            raise CapabilityError("input_to_embed(past_kv_cache=): not supported "
                                  "(generate() keeps its own KV cache)")
        tokens, attention_mask = self.input_to_tokens(input, prepend_bos, padding_side,
                                                      attention_mask)
        residual = self._run(tokens, attention_mask, blocks=range(0), stop=True)
        return residual, tokens, None, attention_mask

    def loss_fn(self, logits: torch.Tensor, tokens: torch.Tensor,
                attention_mask: Optional[torch.Tensor] = None,
                per_token: bool = False) -> torch.Tensor:
        """Next-token cross-entropy (TransformerLens' ``utils.lm_cross_entropy_loss``)."""
        return lm_cross_entropy_loss(logits, tokens.to(logits.device), attention_mask, per_token)

    def _residual_input(self, x: Any) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.cfg.d_model:
            raise InputError(f"with start_at_layer the input must be the residual stream "
                             f"[batch, pos, {self.cfg.d_model}], got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
        return x.to(device=self.mi_model.device, dtype=self.mi_model.dtype)

    def _fires(self, name: str, blocks: range, embed: frozenset[str], stop: bool,
               logits: bool = True) -> bool:
        """Whether TransformerLens runs the point `name` in this forward: blocks in `blocks`
        (opt-in points only with their switch), the embedding's points in `embed` (none when
        the forward starts from a residual), the final norm and unembedding unless it stops
        early; the unembedding only when logits are asked for (``return_type`` not None)."""
        if name.startswith("blocks."):
            layer, _, suffix = name[7:].partition(".")
            if int(layer) not in blocks:
                return False
            switch = _OPT_IN.get(suffix)
            return switch is None or bool(getattr(self.cfg, switch))
        if name in ("hook_embed", "hook_pos_embed"):
            return name in embed
        if name.startswith("unembed."):
            return not stop and logits
        return not stop  # ln_final.*

    def _run(self, ids: torch.Tensor, mask: Optional[torch.Tensor], *,
             blocks: Optional[range] = None, residual: Optional[torch.Tensor] = None,
             embed: frozenset[str] = EMBED_POINTS, stop: bool = False, past: Any = None,
             logits: bool = True) -> torch.Tensor:
        """One kernel forward with the tree's hooks: logits, or with `stop` the residual
        stream after the last block of `blocks` (before the first when `blocks` is empty)."""
        self._weights.check_unedited()
        blocks = range(self.cfg.n_layers) if blocks is None else blocks
        request, self._request = self._request, None
        spec = HookSpec()
        if residual is not None:  # start_at_layer: the first block reads the given residual
            spec.intervene(f"blocks.{blocks[0]}.hook_resid_pre", lambda x: residual)
        if stop and not len(blocks):  # stop_at_layer=0: the embedding, before any block's hook
            spec.intervene("blocks.0.hook_resid_pre", _raise_stop)
        fired = [(n, hp) for n, hp in self._points
                 if self._fires(n, blocks, embed, stop, logits)]
        kernel = [(n, hp) for n, hp in fired if not n.startswith("unembed.")]
        offset = int(getattr(past, "length", 0) or 0)
        grad_store = request.grad_values if request is not None and request.grads else None

        def wire(name: str, x: torch.Tensor) -> torch.Tensor:
            """The backward hooks of a point whose value the plan recomputes from (the
            kernel's own would sit on a value the forward no longer uses)."""
            hp = self.hook_dict[name]
            store = grad_store if request is not None and name in request.wanted else None
            if not hp.bwd_hooks and store is None:
                return x
            x = x.view_as(x) if x.requires_grad else x.detach().requires_grad_(True)
            _grad_hooks(x, hp, store, name)
            return x

        names = {n for n, _ in kernel}
        plan = arithmetic.Plan(
            names, blocks, self._rotary,
            lambda: arithmetic.positions_of(ids, mask, offset), self.cfg.n_ctx,
            (lambda i: self.blocks[i].attn.W_O) if self.cfg.use_attn_result else None, wire)
        plan.before(spec)  # recomputed values, which the user's hooks then see
        keys = cached_keys.FullKeys(past, blocks, {n for n, hp in kernel if hp.fwd_hooks or (
            request is not None and n in request.wanted)})  # hook_rot_k of every position
        arithmetic.pad_as_transformerlens(spec, names, blocks, mask)
        self._hook_points(spec, kernel, request, plan, stop, keys)
        plan.add_after(spec)  # TransformerLens' arithmetic (mi_core.tl.arithmetic)
        head_inputs.force(spec, self.cfg, blocks, names)  # use_split_qkv_input / use_attn_in
        if stop and len(blocks):
            spec.intervene(f"blocks.{blocks[-1]}.hook_resid_post", _raise_stop)
        unembed = self._unembed_needs(fired, request)
        if unembed:
            spec.capture("ln_final.hook_normalized")
            if grad_store is not None or any(hp.bwd_hooks for n, hp in fired
                                             if n.startswith("unembed.")):
                spec.capture_grad("ln_final.hook_normalized")  # the logits' graph reaches it
        options: dict[str, Any] = {"past": past} if past is not None else {}
        if len(blocks) and blocks[0] > 0 and has_capability(self.mi_model.backend,
                                                             LayerSchedule):
            options["layer_schedule"] = list(blocks)
        # the parameters first (they require gradients only under the caller's grad mode)
        with self._weights.autograd(), _grad_mode():
            try:
                cache = self.mi_model.forward(ids, spec, attention_mask=mask, **options)
            except _UserHookError as err:
                raise err.original.with_traceback(err.original.__traceback__) from None
            except _Stop as stopped:
                return stopped.residual
            finally:
                keys.restore()
            extra: dict[str, torch.Tensor] = {}
            out = _as_tl_logits(cache.output)
            out = self._unembed_hooks(cache, out, extra, grad_store) if unembed else out
        if request is not None:  # in the order the points ran, as TransformerLens' cache
            request.cache = cache
            request.values = {n: cache[n] for n in cache.keys() if n in request.wanted}
            request.values.update((n, v) for n, v in extra.items() if n in request.wanted)
            keys.update(request.values)
        return out

    def _hook_points(self, spec: HookSpec, kernel: list[tuple[str, HookPoint]],
                     request: Optional[_Request], plan: arithmetic.Plan, stop: bool,
                     keys: cached_keys.FullKeys) -> None:
        """The user's forward and backward hooks and run_with_cache's captures at the points
        the kernel runs (a point `plan` recomputes keeps its backward hooks itself; `keys`
        runs ``hook_rot_k``'s on every position of a KV-cached forward)."""
        state: dict[Any, Any] = {}
        for name, hp in kernel:
            wanted = request is not None and name in request.wanted
            grads = bool(hp.bwd_hooks) or (wanted and request.grads)  # type: ignore[union-attr]
            call = head_inputs.unused_attn_in(name, self.cfg, _caller(name, hp, state, self)) \
                if hp.fwd_hooks else None
            if name in keys.names:
                spec.intervene(name, keys.around(name, call))
            elif call is not None:
                spec.intervene(name, call)
            elif grads:  # a value the forward uses, so its gradient exists (a norm's scale)
                spec.intervene(name, _identity)
            if hp.bwd_hooks and name not in plan.wired:
                spec.add_backward_hook(name, _bwd_caller(hp))
            if wanted:
                _capture(spec, name, request, stored=stop,  # type: ignore[arg-type]
                         grads=name not in plan.wired)

    # -- TransformerLens 3's unembed.hook_in / hook_out ------------------------------------------
    def _unembed_needs(self, fired: list[tuple[str, HookPoint]],
                       request: Optional[_Request]) -> bool:
        for name, hp in fired:
            if name.startswith("unembed.") and (hp.fwd_hooks or hp.bwd_hooks or (
                    request is not None and name in request.wanted)):
                return True
        return False

    def _unembed_hooks(self, cache: HookCache, logits: torch.Tensor,
                       values: dict[str, torch.Tensor],
                       grads: Optional[dict[str, torch.Tensor]]) -> torch.Tensor:
        """Run ``unembed.hook_in`` (the final norm's output, after its gain) and
        ``unembed.hook_out`` (the logits) outside the kernel: the input is rebuilt from the
        captured ``ln_final.hook_normalized``, and the logits recomputed from it when a hook
        at ``hook_in`` can change it or needs its gradient (`grads`: run_with_cache's store
        for gradients)."""
        require_capability(self.mi_model.backend, Readout, "unembed.hook_in / unembed.hook_out")
        be = self.mi_model.backend
        hp_in, hp_out = self.unembed.hook_in, self.unembed.hook_out
        normalized = cache["ln_final.hook_normalized"]
        h = be.final_norm(normalized, scale=torch.ones_like(normalized[..., :1]))
        if hp_in.fwd_hooks or hp_in.bwd_hooks or grads is not None:
            h = _call_point(hp_in, h) if hp_in.fwd_hooks else h
            _grad_hooks(h, hp_in, grads, "unembed.hook_in")
            logits = _as_tl_logits(be.unembed(h))
        if hp_out.fwd_hooks:
            logits = _call_point(hp_out, logits)
        if hp_out.bwd_hooks or grads is not None:
            logits = logits.view_as(logits) if logits.requires_grad else \
                logits.detach().requires_grad_(True)
            _grad_hooks(logits, hp_out, grads, "unembed.hook_out")
        values["unembed.hook_in"], values["unembed.hook_out"] = h, logits
        return logits

    # -- caching --------------------------------------------------------------------------------
    def run_with_cache(self, *model_args: Any, names_filter: Any = None, device: Any = None,
                       remove_batch_dim: bool = False, incl_bwd: bool = False,
                       reset_hooks_end: bool = True, clear_contexts: bool = False,
                       pos_slice: Any = None, return_cache_object: bool = True,
                       **model_kwargs: Any) -> tuple[Any, Any]:
        """(output, ActivationCache of every point the filter selects that ran) — a dict with
        ``return_cache_object=False``; `incl_bwd` back-propagates the (scalar) output and adds
        ``name_grad`` entries. Captured by the kernel (no Python hook per point)."""
        from mi_core.tl.activation_cache import Slice

        keep = names_filter_fn(names_filter)
        # a plugin's opt-in points (per-step states, effective attention [b, heads, s, s] a
        # layer) only when a name, list or filter asks for them, as MIModel.run_with_cache
        wanted = [n for n in self.hook_dict
                  if keep(n) and not (names_filter is None and _plugin_opt_in(n))]
        request = _Request(wanted, incl_bwd)
        with self.hooks(reset_hooks_end=reset_hooks_end, clear_contexts=clear_contexts):
            self._request = request
            try:
                out = self(*model_args, **model_kwargs)
            finally:
                self._request = None
            if incl_bwd:
                out.backward()
        slicer = Slice.unwrap(pos_slice)  # an int keeps the axis, as TransformerLens
        cache: dict[str, torch.Tensor] = {}
        entries = list(request.values.items())
        if incl_bwd:  # in the order backward reached them, as TransformerLens' hooks fire
            entries += [(n + "_grad", g) for n, g in request.gradients()]
        for name, value in entries:
            value = value.detach()
            value = value.to(device) if device is not None else value
            value = value[0] if remove_batch_dim else value
            base = name[:-5] if name.endswith("_grad") else name
            pos_dim = -3 if base.endswith(("hook_q", "hook_k", "hook_v", "hook_z",
                                           "hook_result")) else -2
            if pos_slice is not None and value.dim() >= -pos_dim:
                value = slicer.apply(value, dim=pos_dim)
            cache[name] = value
        if not return_cache_object:
            return out, cache
        return out, ActivationCache(cache, self, has_batch_dim=not remove_batch_dim)

    # -- weights and properties TransformerLens adds --------------------------------------------
    # The module tree's parameters, as TransformerLens' properties read them (so a computation
    # with them carries gradients as TransformerLens' does); a name the tree lacks for this
    # model (AttributeError) falls back to the MIModel's property through __getattr__.
    W_E = property(lambda self: self.embed.W_E, doc="[d_vocab, d_model]")
    W_U = property(lambda self: self.unembed.W_U, doc="[d_model, d_vocab]")
    b_U = property(lambda self: self.unembed.b_U, doc="[d_vocab]")
    W_pos = property(lambda self: self.pos_embed.W_pos,
                     doc="[n_ctx, d_model] (learned absolute positions only)")
    W_Q = property(lambda self: self._stack("attn", "W_Q"),
                   doc="[n_layers, n_heads, d_model, d_head]")
    W_K = property(lambda self: self._stack("attn", "W_K"),
                   doc="[n_layers, n_heads, d_model, d_head] (grouped-query: repeated per head)")
    W_V = property(lambda self: self._stack("attn", "W_V"), doc="as W_K")
    W_O = property(lambda self: self._stack("attn", "W_O"),
                   doc="[n_layers, n_heads, d_head, d_model]")
    b_Q = property(lambda self: self._stack("attn", "b_Q"), doc="[n_layers, n_heads, d_head]")
    b_K = property(lambda self: self._stack("attn", "b_K"), doc="[n_layers, n_heads, d_head]")
    b_V = property(lambda self: self._stack("attn", "b_V"), doc="[n_layers, n_heads, d_head]")
    b_O = property(lambda self: self._stack("attn", "b_O"), doc="[n_layers, d_model]")
    W_in = property(lambda self: self._stack("mlp", "W_in"), doc="[n_layers, d_model, d_mlp]")
    W_out = property(lambda self: self._stack("mlp", "W_out"), doc="[n_layers, d_mlp, d_model]")
    b_in = property(lambda self: self._stack("mlp", "b_in"), doc="[n_layers, d_mlp]")
    b_out = property(lambda self: self._stack("mlp", "b_out"), doc="[n_layers, d_model]")

    @property
    def W_gate(self) -> Optional[torch.Tensor]:
        """[n_layers, d_model, d_mlp] of a gated MLP; None otherwise (as TransformerLens)."""
        return self._stack("mlp", "W_gate") if self.cfg.gated_mlp else None

    @property
    def QK(self) -> Any:
        """W_Q W_K^T per layer and head: [n_layers, n_heads, d_model, d_model], factored."""
        from mi_core.tl.factored_matrix import FactoredMatrix
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> Any:
        """W_V W_O per layer and head: [n_layers, n_heads, d_model, d_model], factored."""
        from mi_core.tl.factored_matrix import FactoredMatrix
        return FactoredMatrix(self.W_V, self.W_O)

    def _stack(self, part: str, name: str) -> torch.Tensor:
        return torch.stack([getattr(getattr(block, part), name) for block in self.blocks], dim=0)

    def tl_weight(self, name: str, layer: Optional[int] = None) -> torch.Tensor:
        """One weight in TransformerLens' naming and per-layer shape (what the cache's
        methods read): the module tree's parameter, else the MIModel's."""
        try:
            if layer is None:
                part = {"W_E": "embed", "W_pos": "pos_embed", "W_U": "unembed",
                        "b_U": "unembed"}[name]
                return getattr(getattr(self, part), name)
            block = self.blocks[layer]
            return getattr(block.attn if name.lstrip("_")[2] in "QKVO" else block.mlp, name)
        except (AttributeError, KeyError, IndexError):
            return self.mi_model.tl_weight(name, layer)

    @property
    def W_E_pos(self) -> torch.Tensor:
        """[d_vocab + n_ctx, d_model]: W_E then W_pos."""
        return torch.cat([self.W_E, self.W_pos], dim=0)

    def all_head_labels(self) -> list[str]:
        return [f"L{i}H{h}" for i in range(self.cfg.n_layers) for h in range(self.cfg.n_heads)]

    def accumulated_bias(self, layer: int, mlp_input: bool = False,
                         include_mlp_biases: bool = True) -> torch.Tensor:
        """The biases written to the residual stream before `layer` ([d_model])."""
        from mi_core.tl.activation_cache import accumulated_bias
        return accumulated_bias(self.mi_model, layer, mlp_input, include_mlp_biases)

    def all_composition_scores(self, mode: str) -> torch.Tensor:
        """TransformerLens' composition scores between every pair of heads ("Q", "K", "V"):
        [n_layers, n_heads, n_layers, n_heads], zero where the left head is not earlier."""
        from mi_core.tl.utils import composition_scores

        left = self.OV
        right = {"Q": self.QK, "K": self.QK.T, "V": self.OV}.get(mode)
        if right is None:
            raise TLValueError(f"mode must be 'Q', 'K' or 'V', got {mode!r}")
        scores = composition_scores(left, right, broadcast_dims=True)
        n = self.cfg.n_layers
        mask = (torch.arange(n, device=scores.device)[:, None, None, None]
                < torch.arange(n, device=scores.device)[None, None, :, None])
        return torch.where(mask, scores, torch.zeros_like(scores))

    # -- moving the model -----------------------------------------------------------------------
    def to(self, *args: Any, **kwargs: Any) -> "HookedTransformer":  # type: ignore[override]
        """A no-op when already there; moving or casting a loaded model is not supported."""
        kwargs.pop("print_details", None)
        for arg in list(args) + list(kwargs.values()):
            if isinstance(arg, torch.dtype):
                if arg != self.mi_model.dtype:
                    raise CapabilityError(f"cannot cast a loaded model to {arg}: load it with "
                                          f"HookedTransformer.from_pretrained(..., dtype=)")
            elif arg is not None and torch.device(arg) != torch.device(self.cfg.device):
                same = torch.device(arg).type == self.mi_model.device.type and \
                    torch.device(arg).index in (None, self.mi_model.device.index)
                if not same:
                    raise CapabilityError(f"cannot move a loaded model to {arg}: load it with "
                                          f"HookedTransformer.from_pretrained(..., device=)")
        return self

    def cuda(self, device: Any = None) -> "HookedTransformer":  # type: ignore[override]
        return self.to("cuda" if device is None else
                       (f"cuda:{device}" if isinstance(device, int) else device))

    def cpu(self) -> "HookedTransformer":  # type: ignore[override]
        return self.to("cpu")

    def _apply(self, fn: Any, recurse: bool = True) -> "HookedTransformer":
        raise CapabilityError("moving or casting the weights of a loaded model is not supported "
                              "(load it with from_pretrained(device=..., dtype=...))")

    # -- attributes of the underlying MIModel ------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError as err:
            inner = self.__dict__.get("mi_model")
            if inner is None or name.startswith("__"):
                raise
            if name in _TREE_WEIGHTS:  # a property of the tree that this model lacks
                raise TLAttributeError(f"this model has no {name} ({err})") from None
            return getattr(inner, name)

    def __repr__(self) -> str:
        return (f"HookedTransformer(n_layers={self.cfg.n_layers}, d_model={self.cfg.d_model}, "
                f"n_heads={self.cfg.n_heads}, source={self.mi_model.source!r})")


# -- running the tree's hooks inside the kernel's forward --------------------------------------
#: the weight properties read from the module tree (no fallback to the MIModel's)
_TREE_WEIGHTS = frozenset({
    "W_E", "W_U", "b_U", "W_pos", "W_E_pos", "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V",
    "b_O", "W_in", "W_out", "W_gate", "b_in", "b_out", "QK", "OV"})


def _as_tl_logits(logits: torch.Tensor) -> torch.Tensor:
    """The logits as TransformerLens' unembedding leaves them: a view of its product
    (``grad_fn=<ViewBackward0>`` where they carry a gradient, which a printed tensor shows)."""
    return logits.view(logits.shape) if logits.requires_grad else logits


def _raise_stop(x: torch.Tensor) -> torch.Tensor:
    raise _Stop(x)


def _capture(spec: HookSpec, name: str, request: _Request, stored: bool,
             grads: bool = True) -> None:
    """Capture `name` for run_with_cache: the kernel's captures, or (a forward that stops
    early, whose kernel cache is never returned) callables storing into the request;
    gradients too unless `grads` is False (the layer attaches them itself)."""
    if not stored:
        spec.capture(name)
        if request.grads and grads:
            spec.capture_grad(name)
        return

    def keep(x: torch.Tensor) -> torch.Tensor:
        request.values[name] = x
        return x

    def keep_grad(grad: torch.Tensor, hook: Any) -> None:
        request.grad_values[name] = grad

    spec.intervene(name, keep)
    if request.grads and grads:
        spec.add_backward_hook(name, keep_grad)


def _identity(x: torch.Tensor) -> torch.Tensor:
    """Makes a backend route the point's value into the rest of the forward (a norm computes
    with a hooked scale only when intervened on), so a gradient reaches it, as in
    TransformerLens where every hook point is on the computation's path."""
    return x


@contextlib.contextmanager
def _grad_mode() -> Any:
    """Under ``torch.set_grad_enabled(False)`` run the kernel with grad mode on (nothing
    requires a gradient, so no graph is kept): its activations are then ordinary tensors, as
    TransformerLens', not inference tensors that refuse later in-place edits."""
    if torch.is_grad_enabled() or torch.is_inference_mode_enabled():
        yield
        return
    with torch.enable_grad():
        yield


def _need_past(model: HookedTransformer) -> bool:
    return has_capability(model.mi_model.backend, KVCachedGeneration)


__all__ = ["HookedTransformer", "Output", "TokenizerError"]

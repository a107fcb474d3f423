"""TransformerLens-style model conveniences on every :class:`mi_core.MIModel`.

The TransformerLens layer's plugin (:mod:`mi_core.tl.plugin`) registers the public members of
:class:`TransformerLensMixin` through ``mi_model_attributes``, so ``model.run_with_cache``,
``model.W_Q`` or ``model.process_weights`` work on any model without `MIModel` inheriting them.

Hooks (``run_with_cache`` returning an :class:`~mi_core.tl.ActivationCache`,
``run_with_hooks``, ``set_use_attn_result``, ...), weight processing (``process_weights``),
tokens (``to_single_token``, ``test_prompt``, ``tokens_to_residual_directions``) and weights as properties in TransformerLens' names and
shapes (``W_Q`` [n_layers, n_heads, d_model, d_head], ...; grouped-query K/V repeated per query
head as TransformerLens' ``W_K`` / ``W_V`` do, the stored per-KV-head tensors as ``_W_K`` /
``_W_V``), and ``QK`` / ``OV`` as :class:`~mi_core.tl.FactoredMatrix`.

Weights come from the backend's ``get_weight(name, layer)`` (a declared capability);
:meth:`TransformerLensMixin.tl_weight` is the one place that asks for it and maps our names to
TransformerLens' (TransformerLens' ``W_in`` of a gated MLP is the up projection, its
``W_gate`` the gate; absent biases are zeros of the right shape, as TransformerLens keeps them).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import attrs
import torch

from mi_core import HookPoint, HookSpec, MIError, TokenizerError, WeightLoadError
from mi_core.plugin import (
    OPT_IN_SUFFIXES, HookLike, Readout, WeightAccess, WeightProcessing, require_capability,
)
from mi_core.tl.activation_cache import ActivationCache, get_act_name
from mi_core.tl.factored_matrix import FactoredMatrix

#: TransformerLens per-layer weight -> shape of the zeros returned when the model lacks it.
_ZERO_BIASES = {"b_Q": "hd", "b_K": "hd", "b_V": "hd", "b_O": "d", "b_in": "m", "b_out": "d"}


@attrs.frozen
class TLConfig:
    """The ``model.cfg`` fields TransformerLens code reads most (its names)."""

    n_layers: int
    n_heads: int
    n_key_value_heads: int | None
    d_model: int
    d_head: int
    d_mlp: int | None  # None: no layer has a dense MLP
    d_vocab: int
    n_ctx: int | None
    device: torch.device
    dtype: torch.dtype
    normalization_type: str  # "LN" or "RMS" ("LNPre" / "RMSPre" once folded)
    gated_mlp: bool


class TransformerLensMixin:
    """Methods and properties every MIModel gains for TransformerLens users (see the module
    doc); `self` is the model."""

    backend: Any
    num_layers: int
    num_heads: int
    hidden_size: int
    vocab_size: int

    # -- weights ------------------------------------------------------------------------------
    @property
    def gated_mlp(self) -> bool:
        """Whether the MLP is gated (act(x W_gate) * (x W_in))."""
        state = _state(self)
        if "gated" not in state:
            state["gated"] = _has_weight(self, "W_up", 0)
        return state["gated"]

    def tl_weight(self, name: str, layer: int | None = None) -> torch.Tensor:
        """One weight in TransformerLens' naming and per-layer shape (see the module doc)."""
        be = self.backend
        if name in ("W_E", "W_U", "W_pos"):
            return _get_weight(self, name)
        if name == "b_U":
            try:
                return _get_weight(self, "b_U")
            except WeightLoadError:
                return torch.zeros(self.vocab_size, dtype=be.dtype, device=be.device)
        gated = name in ("W_in", "b_in", "W_gate") and self.gated_mlp
        ours = {"W_in": "W_up" if gated else "W_in", "b_in": "b_up" if gated else "b_in",
                "_W_K": "W_K", "_W_V": "W_V", "_b_K": "b_K", "_b_V": "b_V"}.get(name, name)
        if name == "W_gate" and not gated:
            raise WeightLoadError("W_gate: this model's MLP is not gated")
        try:
            w = _get_weight(self, ours, layer)
        except MIError:
            key = name.lstrip("_")
            if key not in _ZERO_BIASES:
                raise
            kv = name.startswith("_")
            kind = _ZERO_BIASES[key]
            d_head = getattr(be, "d_head", None)
            d_mlp = _d_mlp(self) if kind == "m" else None
            if (kind == "hd" and d_head is None) or (kind == "m" and d_mlp is None):
                raise  # no attention heads / dense MLP to have an absent bias (recurrent models)
            dims = {"hd": ((be.num_kv_heads if kv else self.num_heads), d_head),
                    "d": (self.hidden_size,), "m": (d_mlp,)}[kind]
            return torch.zeros(dims, dtype=be.dtype, device=be.device)
        if name in ("W_K", "W_V", "b_K", "b_V"):
            groups = self.num_heads // w.shape[0]
            if groups > 1:
                w = w.repeat_interleave(groups, dim=0)
        return w

    W_E = property(lambda self: self.tl_weight("W_E"), doc="[d_vocab, d_model]")
    W_U = property(lambda self: self.tl_weight("W_U"), doc="[d_model, d_vocab]")
    b_U = property(lambda self: self.tl_weight("b_U"), doc="[d_vocab] (zeros when absent)")
    W_pos = property(lambda self: self.tl_weight("W_pos"),
                     doc="[n_ctx, d_model]; learned absolute positions only")
    W_Q = property(lambda self: _stacked(self, "W_Q"), doc="[n_layers, n_heads, d_model, d_head]")
    W_K = property(lambda self: _stacked(self, "W_K"),
                   doc="[n_layers, n_heads, d_model, d_head] (GQA: repeated per query head)")
    W_V = property(lambda self: _stacked(self, "W_V"), doc="as W_K")
    _W_K = property(lambda self: _stacked(self, "_W_K"), doc="[n_layers, n_kv_heads, d_model, d_head]")
    _W_V = property(lambda self: _stacked(self, "_W_V"), doc="as _W_K")
    W_O = property(lambda self: _stacked(self, "W_O"), doc="[n_layers, n_heads, d_head, d_model]")
    W_in = property(lambda self: _stacked(self, "W_in"),
                    doc="[n_layers, d_model, d_mlp] (gated: the up projection)")
    W_gate = property(lambda self: _stacked(self, "W_gate") if self.gated_mlp else None,
                      doc="[n_layers, d_model, d_mlp], None for plain MLPs")
    W_out = property(lambda self: _stacked(self, "W_out"), doc="[n_layers, d_mlp, d_model]")
    b_Q = property(lambda self: _stacked(self, "b_Q"), doc="[n_layers, n_heads, d_head]")
    b_K = property(lambda self: _stacked(self, "b_K"), doc="[n_layers, n_heads, d_head]")
    b_V = property(lambda self: _stacked(self, "b_V"), doc="[n_layers, n_heads, d_head]")
    _b_K = property(lambda self: _stacked(self, "_b_K"), doc="[n_layers, n_kv_heads, d_head]")
    _b_V = property(lambda self: _stacked(self, "_b_V"), doc="[n_layers, n_kv_heads, d_head]")
    b_O = property(lambda self: _stacked(self, "b_O"), doc="[n_layers, d_model]")
    b_in = property(lambda self: _stacked(self, "b_in"), doc="[n_layers, d_mlp]")
    b_out = property(lambda self: _stacked(self, "b_out"), doc="[n_layers, d_model]")

    @property
    def QK(self) -> FactoredMatrix:
        """Per-head QK circuits W_Q W_K^T: [n_layers, n_heads, d_model, d_model], factored."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """Per-head OV circuits W_V W_O: [n_layers, n_heads, d_model, d_model], factored."""
        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def cfg(self) -> TLConfig:
        """TransformerLens-style config view (n_layers, n_heads, d_model, ...)."""
        be = self.backend
        kv = be.num_kv_heads
        norm = "LN" if self.norm_centres else "RMS"
        if not _has_weight(self, "ln_final.w") or bool(
                (_get_weight(self, "ln_final.w") == 1).all()):
            norm += "Pre"
        return TLConfig(n_layers=self.num_layers, n_heads=self.num_heads,
                        n_key_value_heads=None if kv == self.num_heads else kv,
                        d_model=self.hidden_size, d_head=int(getattr(be, "d_head", 0) or
                                                             self.hidden_size // self.num_heads),
                        d_mlp=_d_mlp(self), d_vocab=self.vocab_size,
                        n_ctx=getattr(be, "max_positions", None), device=be.device,
                        dtype=be.dtype, normalization_type=norm, gated_mlp=self.gated_mlp)

    @property
    def norm_centres(self) -> bool:
        """Whether the norms centre their input (LayerNorm) rather than only rescale it
        (RMSNorm): probed once through the final norm with a fixed divisor (the readout
        capability), so it holds for any backend; reset by :meth:`process_weights`."""
        state = _state(self)
        if "norm_centres" not in state:
            require_capability(self.backend, Readout, "telling a LayerNorm from an RMSNorm")
            one = torch.ones(1, self.hidden_size, dtype=self.dtype, device=self.device)
            s = torch.ones(1, 1, dtype=self.dtype, device=self.device)
            with torch.no_grad():
                diff = (self.backend.final_norm(one, scale=s)
                        - self.backend.final_norm(torch.zeros_like(one), scale=s))
            state["norm_centres"] = bool(diff.abs().max() < 1e-6)
        return state["norm_centres"]

    # -- weight processing (TransformerLens' from_pretrained defaults, opt-in here) ---------
    def process_weights(self, fold_ln: bool = True, center_writing_weights: bool = True,
                        center_unembed: bool = True, fold_value_biases: bool = True) -> Any:
        """Rewrite the weights in place as TransformerLens' ``process_weights_`` does: fold
        each norm's gain (and bias) into the weights that read it, centre the weights writing
        to the residual stream (LayerNorm models only, as TransformerLens), centre the
        unembedding, fold the value biases into b_O. Logits are unchanged (centring the
        unembedding shifts every logit of a position equally). Hook values change where
        TransformerLens' do (e.g. ``attn.hook_in`` no longer includes the gain). Returns the
        model."""
        require_capability(self.backend, WeightProcessing, "process_weights")
        self.backend.process_weights(fold_ln=fold_ln,
                                     center_writing_weights=center_writing_weights,
                                     center_unembed=center_unembed,
                                     fold_value_biases=fold_value_biases)
        _state(self).pop("norm_centres", None)
        return self

    # -- hooks, TransformerLens style -----------------------------------------------------------
    def run_with_cache(self, ids: torch.Tensor | str,
                       names_filter: Callable[[str], bool] | Iterable[HookLike] | str | None = None,
                       attention_mask: torch.Tensor | None = None,
                       remove_batch_dim: bool = False) -> tuple[torch.Tensor, ActivationCache]:
        """(logits, ActivationCache) capturing every point (or those `names_filter` accepts:
        a callable on the name, a name, or a list of names). Opt-in points
        (``attn.hook_result``, per-head inputs) are captured when named, or by a filter once
        switched on as in TransformerLens (``set_use_attn_result(True)``, ...); a plugin's
        opt-in points (``ssm.hook_state``, ``ssm.hook_effective_attn``) when named or
        accepted by a callable filter, never by default."""
        chosen = _points_for(self, names_filter)
        cache = self.forward(_ids(self, ids), HookSpec().capture_all(chosen),
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
            for hp in _points_for(self, name):
                spec.intervene(hp, fn)
        for name, fn in bwd_hooks:
            for hp in _points_for(self, name):
                spec.add_backward_hook(hp, fn)
        ids = _ids(self, ids)
        logits = self.forward(ids, spec, attention_mask=attention_mask).output
        return _tl_return(logits, ids, return_type, loss_per_token)

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Let name filters (run_with_cache, run_with_hooks) select ``attn.hook_result``."""
        _opt_in(self, ["attn.hook_result"], use_attn_result)

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Let name filters select ``hook_q_input`` / ``hook_k_input`` / ``hook_v_input``."""
        _opt_in(self, ["hook_q_input", "hook_k_input", "hook_v_input"], use_split_qkv_input)

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Let name filters select ``hook_attn_in``."""
        _opt_in(self, ["hook_attn_in"], use_attn_in)

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Accepted for TransformerLens code: ``hook_mlp_in`` always exists (it costs nothing)."""

    # -- tokens -------------------------------------------------------------------------------
    def to_single_token(self, string: str) -> int:
        """The id of the one token `string` encodes to (no BOS); TokenizerError otherwise."""
        ids = self.to_tokens(string, prepend_bos=False)[0].tolist()  # type: ignore[attr-defined]
        if len(ids) != 1:
            raise TokenizerError(f"{string!r} is {len(ids)} tokens {ids}, not a single token")
        return int(ids[0])

    def tokens_to_residual_directions(self, tokens: Any) -> torch.Tensor:
        """W_U columns of `tokens` (a str / int / tensor): [d_model] for one token, else
        [*tokens.shape, d_model]."""
        w_u = self.W_U
        if isinstance(tokens, torch.Tensor) and tokens.numel() > 1:
            return w_u[:, tokens.to(w_u.device)].movedim(0, -1)
        if isinstance(tokens, str):
            token = self.to_single_token(tokens)
        elif isinstance(tokens, int):
            token = tokens
        elif isinstance(tokens, torch.Tensor) and tokens.numel() == 1:
            token = int(tokens.item())
        else:
            raise MIError(f"tokens must be a str, an int or a tensor of ids, got {tokens!r}")
        return w_u[:, token]

    def test_prompt(self, prompt: str, answer: str | Sequence[str],
                    prepend_space_to_answer: bool = True, print_details: bool = True,
                    prepend_bos: bool | None = None, top_k: int = 10
                    ) -> list[list[tuple[str, int]]]:
        """TransformerLens' ``utils.test_prompt``: rank, logit and probability of each answer
        token after `prompt` (and the top `top_k` tokens), printed; returns, per answer
        position, ``[(answer_str_token, rank), ...]`` (TransformerLens prints the same list)."""
        answers = [answer] if isinstance(answer, str) else list(answer)
        multi = len(answers) > 1
        if prepend_space_to_answer:
            answers = [a if a.startswith(" ") else " " + a for a in answers]
        prompt_ids = self.to_tokens(prompt, prepend_bos=prepend_bos)  # type: ignore[attr-defined]
        answer_rows = [self.to_tokens(a, prepend_bos=False)[0]  # type: ignore[attr-defined]
                       for a in answers]
        if multi:
            answer_rows = [r[:1] for r in answer_rows]
        if len({len(r) for r in answer_rows}) != 1:
            raise TokenizerError(f"answers tokenize to different lengths "
                                 f"{[len(r) for r in answer_rows]}")
        answer_ids = torch.stack(answer_rows)
        tokens = torch.cat([prompt_ids.repeat(len(answers), 1), answer_ids], dim=1)
        prompt_str = self.to_str_tokens(prompt_ids[0])  # type: ignore[attr-defined]
        answer_strs = [self.to_str_tokens(r) for r in answer_rows]  # type: ignore[attr-defined]
        if print_details:
            print("Tokenized prompt:", prompt_str)
            if multi:
                print("Tokenized answers:", answer_strs)
            else:
                print("Tokenized answer:", answer_strs[0])
        with torch.no_grad():
            logits = self.forward(tokens).output.float()  # type: ignore[attr-defined]
        probs = logits.softmax(-1)
        n_prompt = prompt_ids.shape[1]
        ranks: list[list[tuple[str, int]]] = []
        for index in range(n_prompt, tokens.shape[1]):
            ans = tokens[:, index]
            strs = [a[index - n_prompt] for a in answer_strs]
            tp = probs[:, index - 1]
            _, order = tp.sort(descending=True)
            rk = order.argsort(-1)[torch.arange(len(answers)), ans.cpu()].tolist()
            ranks.append(list(zip(strs, rk)))
            if print_details:
                print(f"Performance on answer token{'s' if multi else ''}:")
                for i in range(len(answers)):
                    print(f"Rank: {rk[i]: <8} Logit: {logits[i, index - 1, ans[i]].item():5.2f} "
                          f"Prob: {tp[i, ans[i]].item():6.2%} Token: |{strs[i]}|")
                top_p, top_i = tp[0].topk(top_k)
                for j in range(top_k):
                    tok = self.to_string(top_i[j:j + 1])  # type: ignore[attr-defined]
                    print(f"Top {j}th token. Logit: {logits[0, index - 1, top_i[j]].item():5.2f} "
                          f"Prob: {top_p[j].item():6.2%} Token: |{tok}|")
        if print_details:
            flat = [r for step in ranks for r in step]
            print(f"Ranks of the answer tokens: {flat}")
        return ranks


def model_attributes() -> dict[str, Any]:
    """The conveniences :class:`TransformerLensMixin` adds to every model (its public members
    and TransformerLens' per-KV-head ``_W_K`` family), for ``mi_model_attributes``."""
    return {name: attr for name, attr in vars(TransformerLensMixin).items()
            if (not name.startswith("_") or name in ("_W_K", "_W_V", "_b_K", "_b_V"))
            and (callable(attr) or isinstance(attr, property))}


# -- helpers (functions of the model, not model attributes) -----------------------------------
def _state(model: Any) -> dict[str, Any]:
    """What the TransformerLens layer remembers per model (gated MLP, norm kind, opt-ins)."""
    return model.__dict__.setdefault("_tl_state", {})


def _get_weight(model: Any, name: str, layer: int | None = None) -> torch.Tensor:
    require_capability(model.backend, WeightAccess, f"the weight {name}")
    return model.backend.get_weight(name, layer)


def _has_weight(model: Any, name: str, layer: int | None = None) -> bool:
    try:
        _get_weight(model, name, layer)
    except MIError:  # WeightLoadError (ours); other backends may raise another MIError
        return False
    return True


def _d_mlp(model: Any) -> int | None:
    """The dense MLP width: the first layer with one (a hybrid's layer 0 may be a mixer
    without an MLP, or a mixture of experts); None where no layer has a dense MLP (recurrent
    or all-MoE models: TransformerLens' d_mlp of attention-only / MoE configs)."""
    for layer in range(model.num_layers):
        try:
            return int(_get_weight(model, "W_out", layer).shape[0])
        except MIError:
            continue
    return None


def _stacked(model: Any, name: str) -> torch.Tensor:
    ws = [model.tl_weight(name, i) for i in range(model.num_layers)]
    shapes = sorted({tuple(w.shape) for w in ws})
    if len(shapes) > 1:  # a head size or MLP width per layer
        raise MIError(f"{name}: the layers' weights have different shapes {shapes}, so they "
                      f"do not stack into one tensor; use model.tl_weight({name!r}, layer)")
    return torch.stack(ws)


def _ids(model: Any, x: torch.Tensor | str) -> torch.Tensor:
    return model.to_tokens(x) if isinstance(x, str) else x


#: The opt-in points TransformerLens itself has only behind a model flag.
_TL_FLAG_POINTS = frozenset({"attn.hook_result", "hook_attn_in", "hook_q_input", "hook_k_input",
                             "hook_v_input"})


def _opt_in(model: Any, suffixes: Sequence[str], use: bool) -> None:
    on = _state(model).setdefault("opt_in", set())
    (on.update if use else on.difference_update)(suffixes)


def _points_for(model: Any, names: Any) -> list[HookPoint]:
    """Hook points named by a filter (callable on the name), a name or a list of names
    (full names or TransformerLens shorthand, e.g. ``("resid_pre", 3)``)."""
    points = model.hook_points()
    off = set(OPT_IN_SUFFIXES) - _state(model).get("opt_in", set())
    if names is None:
        return [p for p in points if p.suffix not in off]
    if callable(names) and not isinstance(names, (str, HookPoint)):
        # TransformerLens' flag points stay behind their flags (`set_use_attn_result`, ...);
        # a plugin's opt-in point (per-step states, effective attention) a filter accepts is
        # captured: a filter asking for it must not come back silently without it
        flagged = off & _TL_FLAG_POINTS
        return [p for p in points if p.suffix not in flagged and names(p.name)]
    items = [names] if isinstance(names, (str, HookPoint, tuple)) else list(names)
    out = []
    for n in items:
        if isinstance(n, tuple):
            n = get_act_name(*n)
        elif isinstance(n, str):
            n = get_act_name(n)
        out.append(HookPoint.parse(n))
    return out


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

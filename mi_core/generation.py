"""The one generation loop (greedy or sampled), on a KV cache when the backend has one."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import attrs
import torch

from mi_core import capabilities as caps
from mi_core.errors import HookError, InputError
from mi_core.hooks import HookSpec
from mi_core.inputs import check_left_padded, check_max_new_tokens, check_temperature
from mi_core.loading import check_memory

#: The model an argument here is a :class:`mi_core.MIModel` (not imported: it imports us).
Model = Any
MAX_NEW_TOKENS = 2**20  #: more in one generate call needs allow_beyond_context=True

#: Backend forward options for every call, or a function of the number of tokens the cache
#: already holds (0 for the prompt) returning them.
ForwardOptions = Mapping[str, Any] | Callable[[int], Mapping[str, Any]]


@attrs.define
class GenerationResult:
    """Output of :meth:`mi_core.MIModel.generate`."""

    tokens: torch.Tensor  # [batch, prompt + new] (prompt included)
    new_tokens: torch.Tensor  # [batch, new]
    text: list[str]  # decoded new tokens, one string per sequence
    step_logits: list[torch.Tensor] | None = None  # per step [batch, vocab] when requested


def sample_token(logits: torch.Tensor, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [batch, vocab] -> ids [batch]: argmax at temperature 0, else softmax sampling."""
    if check_temperature(temperature) == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@attrs.define
class _Loop:
    """The state of one generation: the sequence so far, the mask, the cache."""

    model: Model
    hooks: HookSpec
    options: Callable[[int], Mapping[str, Any]]
    dynamic: bool  # forward_options is a function: check what it returns at each step
    seq: torch.Tensor
    mask: torch.Tensor | None
    cached: bool
    past: Any = None
    offset: int = 0

    def step(self, first: bool, prefill: Mapping[str, Any] | None) -> torch.Tensor:
        """Logits [batch, vocab] of the next token after `seq`."""
        model = self.model
        if first and prefill is not None:  # one uncached forward of the prompt
            out = model._run(self.seq, self.hooks, self.mask, dict(prefill))
        elif self.cached:
            if self.past is None:  # the prompt (and a prefill token) in one call
                self.past, cur = model.backend.new_past(self.seq.shape[0]), self.seq
            else:
                cur = self.seq[:, -1:]
            opts = self.options(self.offset)
            if self.dynamic and not first:
                model._check_options(opts)
            out = model._run(cur, self.hooks, self.mask, {**opts, "past": self.past})
            self.offset += cur.shape[1]
        else:  # no cache: recompute the whole sequence
            out = model._run(self.seq, self.hooks, self.mask, self.options(0))
        return out.output[:, -1, :].float()

    def append(self, nxt: torch.Tensor) -> None:
        self.seq = torch.cat([self.seq, nxt[:, None]], dim=1)
        if self.mask is not None:
            self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)


def _options(model: Model, forward_options: ForwardOptions | None,
             prefill_options: Mapping[str, Any] | None) -> Callable[[int], Mapping[str, Any]]:
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
        model._check_options(opts)
    return options


def generate(model: Model, ids: torch.Tensor, max_new_tokens: int, *, temperature: float,
             hooks: HookSpec | None, attention_mask: torch.Tensor | None, stop_at_eos: bool,
             return_logits: bool, generator: torch.Generator | None,
             forward_options: ForwardOptions | None,
             prefill_options: Mapping[str, Any] | None,
             allow_beyond_context: bool = False) -> GenerationResult:
    """:meth:`mi_core.MIModel.generate` (see there); `ids` already checked."""
    hooks = hooks if hooks is not None else HookSpec()
    if not isinstance(hooks, HookSpec):
        raise HookError(f"hooks must be a HookSpec, got {type(hooks).__name__}")
    n_new = check_max_new_tokens(max_new_tokens)
    check_temperature(temperature)
    mask = model._check_mask(attention_mask, ids)
    if mask is not None:
        check_left_padded(mask)
    options = _options(model, forward_options, prefill_options)
    cached = caps.has(model.backend, caps.KVCachedGeneration)
    (batch, prompt), be = ids.shape, model.backend  # refused before compute: context, memory
    what = f"max_new_tokens = {n_new} after a prompt of {prompt}"
    model.check_context(prompt + n_new, what, allow_beyond_context)
    if n_new > MAX_NEW_TOKENS and not allow_beyond_context:  # with no context declared too
        raise InputError(f"{what}: more than {MAX_NEW_TOKENS} new tokens in one call; pass "
                         f"allow_beyond_context=True to run anyway")
    need = batch * (prompt + n_new) * 16 + batch * n_new * model.vocab_size * 4 * return_logits
    if cached and caps.has(be, caps.ContextLength):
        need += be.cache_bytes(batch, prompt + n_new)
    check_memory(f"generate: {what} (batch {batch}: tokens, logits, cache)", need, model.device,
                 error=InputError)
    model.validate(hooks, ids, stateful=cached)
    loop = _Loop(model, hooks, options, callable(forward_options), ids, mask, cached)
    tok = model.backend.tokenizer
    eos = tok.eos_token_id if stop_at_eos and tok is not None else None
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=model.device)
    step_logits: list[torch.Tensor] = []
    for step in range(n_new):
        logits = loop.step(step == 0, prefill_options)
        if return_logits:
            step_logits.append(logits)
        nxt = sample_token(logits, temperature, generator)
        if eos is not None:
            nxt = torch.where(done, torch.full_like(nxt, eos), nxt)
            done |= nxt == eos
        loop.append(nxt)
        if eos is not None and bool(done.all()):
            break
    new_t = loop.seq[:, ids.shape[1]:]
    text = [tok.decode(r.tolist()) for r in new_t] if tok is not None else []
    return GenerationResult(tokens=loop.seq, new_tokens=new_t, text=text,
                            step_logits=step_logits if return_logits else None)

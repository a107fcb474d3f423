"""TransformerLens-style model conveniences, mixed into :class:`mi_core.MIModel`.

Tokens (``to_single_token``, ``to_str_tokens``, ``to_string``, ``test_prompt``,
``tokens_to_residual_directions``) and weights as properties in TransformerLens' names and
shapes (``W_Q`` [n_layers, n_heads, d_model, d_head], ...; grouped-query K/V repeated per query
head as TransformerLens' ``W_K`` / ``W_V`` do, the stored per-KV-head tensors as ``_W_K`` /
``_W_V``), and ``QK`` / ``OV`` as :class:`~mi_core.interp.FactoredMatrix`.

Weights come from the backend's ``get_weight(name, layer)`` (a declared capability);
:meth:`TransformerLensMixin.tl_weight` is the one place that asks for it and maps our names to
TransformerLens' (TransformerLens' ``W_in`` of a gated MLP is the up projection, its
``W_gate`` the gate; absent biases are zeros of the right shape, as TransformerLens keeps them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import attrs
import torch

from mi_core import capabilities as caps
from mi_core.errors import MIError, TokenizerError, WeightLoadError

if TYPE_CHECKING:
    from mi_core.interp.circuits import FactoredMatrix

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
    d_mlp: int
    d_vocab: int
    n_ctx: int | None
    device: torch.device
    dtype: torch.dtype
    normalization_type: str  # "LN" or "RMS" ("LNPre" / "RMSPre" once folded)
    gated_mlp: bool


class TransformerLensMixin:
    """Methods and properties MIModel gains for TransformerLens users (see module doc)."""

    backend: Any
    num_layers: int
    num_heads: int
    hidden_size: int
    vocab_size: int

    # -- weights ------------------------------------------------------------------------------
    def _get_weight(self, name: str, layer: int | None = None) -> torch.Tensor:
        caps.require(self.backend, caps.WeightAccess, f"the weight {name}")
        return self.backend.get_weight(name, layer)

    def _has_weight(self, name: str, layer: int | None = None) -> bool:
        try:
            self._get_weight(name, layer)
        except MIError:  # WeightLoadError (ours); other backends may raise another MIError
            return False
        return True

    @property
    def gated_mlp(self) -> bool:
        """Whether the MLP is gated (act(x W_gate) * (x W_in))."""
        cached = getattr(self, "_gated", None)
        if cached is None:
            cached = self._has_weight("W_up", 0)
            self._gated = cached
        return cached

    def tl_weight(self, name: str, layer: int | None = None) -> torch.Tensor:
        """One weight in TransformerLens' naming and per-layer shape (see the module doc)."""
        be = self.backend
        if name in ("W_E", "W_U", "W_pos"):
            return self._get_weight(name)
        if name == "b_U":
            try:
                return self._get_weight("b_U")
            except WeightLoadError:
                return torch.zeros(self.vocab_size, dtype=be.dtype, device=be.device)
        gated = name in ("W_in", "b_in", "W_gate") and self.gated_mlp
        ours = {"W_in": "W_up" if gated else "W_in", "b_in": "b_up" if gated else "b_in",
                "_W_K": "W_K", "_W_V": "W_V", "_b_K": "b_K", "_b_V": "b_V"}.get(name, name)
        if name == "W_gate" and not gated:
            raise WeightLoadError("W_gate: this model's MLP is not gated")
        try:
            w = self._get_weight(ours, layer)
        except MIError:
            key = name.lstrip("_")
            if key not in _ZERO_BIASES:
                raise
            kv = name.startswith("_")
            dims = {"hd": ((be.num_kv_heads if kv else self.num_heads), be.d_head),
                    "d": (self.hidden_size,), "m": (self._d_mlp(),)}[_ZERO_BIASES[key]]
            return torch.zeros(dims, dtype=be.dtype, device=be.device)
        if name in ("W_K", "W_V", "b_K", "b_V"):
            groups = self.num_heads // w.shape[0]
            if groups > 1:
                w = w.repeat_interleave(groups, dim=0)
        return w

    def _d_mlp(self) -> int:
        return int(self._get_weight("W_out", 0).shape[0])

    def _stacked(self, name: str) -> torch.Tensor:
        return torch.stack([self.tl_weight(name, i) for i in range(self.num_layers)])

    W_E = property(lambda self: self.tl_weight("W_E"), doc="[d_vocab, d_model]")
    W_U = property(lambda self: self.tl_weight("W_U"), doc="[d_model, d_vocab]")
    b_U = property(lambda self: self.tl_weight("b_U"), doc="[d_vocab] (zeros when absent)")
    W_pos = property(lambda self: self.tl_weight("W_pos"),
                     doc="[n_ctx, d_model]; learned absolute positions only")
    W_Q = property(lambda self: self._stacked("W_Q"), doc="[n_layers, n_heads, d_model, d_head]")
    W_K = property(lambda self: self._stacked("W_K"),
                   doc="[n_layers, n_heads, d_model, d_head] (GQA: repeated per query head)")
    W_V = property(lambda self: self._stacked("W_V"), doc="as W_K")
    _W_K = property(lambda self: self._stacked("_W_K"), doc="[n_layers, n_kv_heads, d_model, d_head]")
    _W_V = property(lambda self: self._stacked("_W_V"), doc="as _W_K")
    W_O = property(lambda self: self._stacked("W_O"), doc="[n_layers, n_heads, d_head, d_model]")
    W_in = property(lambda self: self._stacked("W_in"),
                    doc="[n_layers, d_model, d_mlp] (gated: the up projection)")
    W_gate = property(lambda self: self._stacked("W_gate") if self.gated_mlp else None,
                      doc="[n_layers, d_model, d_mlp], None for plain MLPs")
    W_out = property(lambda self: self._stacked("W_out"), doc="[n_layers, d_mlp, d_model]")
    b_Q = property(lambda self: self._stacked("b_Q"), doc="[n_layers, n_heads, d_head]")
    b_K = property(lambda self: self._stacked("b_K"), doc="[n_layers, n_heads, d_head]")
    b_V = property(lambda self: self._stacked("b_V"), doc="[n_layers, n_heads, d_head]")
    _b_K = property(lambda self: self._stacked("_b_K"), doc="[n_layers, n_kv_heads, d_head]")
    _b_V = property(lambda self: self._stacked("_b_V"), doc="[n_layers, n_kv_heads, d_head]")
    b_O = property(lambda self: self._stacked("b_O"), doc="[n_layers, d_model]")
    b_in = property(lambda self: self._stacked("b_in"), doc="[n_layers, d_mlp]")
    b_out = property(lambda self: self._stacked("b_out"), doc="[n_layers, d_model]")

    @property
    def QK(self) -> "FactoredMatrix":
        """Per-head QK circuits W_Q W_K^T: [n_layers, n_heads, d_model, d_model], factored."""
        from mi_core.interp.circuits import FactoredMatrix

        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> "FactoredMatrix":
        """Per-head OV circuits W_V W_O: [n_layers, n_heads, d_model, d_model], factored."""
        from mi_core.interp.circuits import FactoredMatrix

        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def cfg(self) -> TLConfig:
        """TransformerLens-style config view (n_layers, n_heads, d_model, ...)."""
        from mi_core.activation_cache import norm_centres

        be = self.backend
        kv = be.num_kv_heads
        norm = "LN" if norm_centres(self) else "RMS"  # type: ignore[arg-type]
        if not self._has_weight("ln_final.w") or bool(
                (self._get_weight("ln_final.w") == 1).all()):
            norm += "Pre"
        return TLConfig(n_layers=self.num_layers, n_heads=self.num_heads,
                        n_key_value_heads=None if kv == self.num_heads else kv,
                        d_model=self.hidden_size, d_head=int(getattr(be, "d_head", 0) or
                                                             self.hidden_size // self.num_heads),
                        d_mlp=self._d_mlp(), d_vocab=self.vocab_size,
                        n_ctx=getattr(be, "max_positions", None), device=be.device,
                        dtype=be.dtype, normalization_type=norm, gated_mlp=self.gated_mlp)

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

"""A tiny causal toy backend for fast probing tests (no transformer plugin needed).

Word-level tokenizer; each layer adds ``tanh(causal_prefix_mean(x) @ W)`` to the residual
stream, so a token never sees later tokens (right padding cannot change real tokens).
Registered as an in-process plugin so ``MIModel.from_pretrained(dir)`` and ``mi probe``
load it from a directory whose config.json has ``model_type == "mi_probing_toy"``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from mi_core.hookspecs import hookimpl
from mi_core.hooks import HookCache, HookPoint, HookSpec
from mi_core.registry import BackendSpec, Detection, ModelSource
from mi_core.tokenizer import HFTokenizer

MODEL_TYPE = "mi_probing_toy"
WORDS = ("the a film movie was is really very good great bad awful fine plot acting "
         "one two three four five cat dog tree house red blue").split()

# Prompts ending in "good"/"great" vs "bad"/"awful" after otherwise shared words: at the
# last token the embedding is one of four vectors, so the label is linearly readable there.
OPENERS = ["the film was", "the movie is", "a plot was", "the acting is", "one dog was"]
ENDS = ["really", "very", "one two", "red", "blue tree", "a cat"]
TEXTS: list[str] = []
LABELS: list[str] = []
for i, opener in enumerate(OPENERS):
    for j, end in enumerate(ENDS):
        good = (i + j) % 2 == 0
        word = ("good", "great")[j % 2] if good else ("bad", "awful")[j % 2]
        TEXTS.append(f"{opener} {end} {word}")
        LABELS.append("pos" if good else "neg")


def make_tokenizer() -> HFTokenizer:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {w: i for i, w in enumerate(["<unk>", "<bos>", "<eos>", *WORDS])}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    return HFTokenizer(tok, bos_token="<bos>", eos_token="<eos>")


class ToyBackend:
    name = "mi_probing_toy"

    def __init__(self, num_layers: int = 3, d_model: int = 16, seed: int = 0,
                 device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> None:
        self.tokenizer = make_tokenizer()
        self.config = {"num_layers": num_layers, "d_model": d_model, "seed": seed}
        self.num_layers, self.hidden_size = num_layers, d_model
        self.num_heads = self.num_kv_heads = 1
        self.vocab_size = self.tokenizer.vocab_size
        self.device, self.dtype = device or torch.device("cpu"), dtype
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.randn(self.vocab_size, d_model, generator=g)
        self.w = [torch.randn(d_model, d_model, generator=g) / d_model ** 0.5
                  for _ in range(num_layers)]
        self.forward_calls = 0
        self._names = [(f"blocks.{i}.hook_resid_pre", f"blocks.{i}.hook_resid_post",
                        f"blocks.{i}.attn.hook_pattern") for i in range(num_layers)]

    def hook_points(self) -> list[HookPoint]:
        pts = [HookPoint.embed()]
        for pre, post, pattern in self._names:
            pts += [HookPoint.parse(pre), HookPoint.parse(pattern), HookPoint.parse(post)]
        return pts

    def forward(self, ids: torch.Tensor, hooks: HookSpec,
                attention_mask: torch.Tensor | None = None, **kw: Any) -> HookCache:
        self.forward_calls += 1
        run = hooks.start()
        x = run.apply("hook_embed", self.embed[ids])  # [batch, seq, d]
        seq = ids.shape[1]
        causal = torch.ones(seq, seq).tril()
        avg = causal / causal.sum(dim=1, keepdim=True)  # row q: mean over keys <= q
        for (pre, post, pattern), w in zip(self._names, self.w):
            x = run.apply(pre, x)
            if run.wants(pattern):  # [batch, heads=1, seq, seq]: not a per-token layout
                run.apply(pattern, avg.expand(ids.shape[0], 1, seq, seq))
            x = x + torch.tanh(torch.einsum("qk,bkd->bqd", avg, x) @ w)
            x = run.apply(post, x)
        return run.finish(x @ self.embed.T)

    def project_to_vocab(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.embed.T


def save_toy(directory: Path, num_layers: int = 3, d_model: int = 16, seed: int = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": MODEL_TYPE, "num_layers": num_layers, "d_model": d_model, "seed": seed}
    (directory / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return directory


def _load(source: ModelSource, device: torch.device, dtype: torch.dtype) -> ToyBackend:
    cfg = source.config or {}
    return ToyBackend(cfg["num_layers"], cfg["d_model"], cfg["seed"], device, dtype)


class ToyPlugin:
    @hookimpl
    def mi_register_backends(self) -> list[BackendSpec]:
        return [BackendSpec("mi_probing_toy", _load, "mi-probing test toy")]

    @hookimpl
    def mi_detect_backend(self, source: ModelSource) -> Detection | None:
        ok = (source.config or {}).get("model_type") == MODEL_TYPE
        return Detection("mi_probing_toy", 1.0 if ok else 0.0,
                         "toy config" if ok else "not a toy config")

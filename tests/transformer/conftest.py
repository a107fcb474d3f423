"""Tiny random checkpoints of every supported family, made with `transformers` once per session.

Each checkpoint is ``AutoModelForCausalLM.from_config(cfg).save_pretrained(dir)`` with the
weights re-randomised at a larger scale than HF's init (so that differences between our forward
and transformers' are not hidden by near-zero activations), F32.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

import mi_core as mi

from tests.support.family_checks import loaded_models
from tests.support.tiny_families import _COMMON, FAMILIES, GPT_FAMILIES, VOCAB  # noqa: E402


@attrs.define
class Tiny:
    """A saved tiny checkpoint and the transformers model it came from (eval, eager attention)."""

    name: str
    path: Path
    hf: Any  # transformers PreTrainedModel

    @property
    def config(self) -> dict[str, Any]:
        return json.loads((self.path / "config.json").read_text())

    def load(self) -> mi.MIModel:
        """Our model over the same files, without going through the plugin manager (other
        plugins in this checkout may be mid-edit); detection is tested separately."""
        from mi_core.registry import ModelSource
        from mi_transformer.loader import load_backend

        be = load_backend(ModelSource(path=self.path), torch.device("cpu"), torch.float32)
        return mi.MIModel(be, source=str(self.path))


def _randomise(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() == 1:  # norm gains (around their init) and biases
                p.add_(0.1 * noise)
            elif "embed" in name:
                p.copy_(noise)
            else:
                p.copy_(0.1 * noise)
        for name, buf in model.named_buffers():  # MoE selection biases decide the routing
            if name.endswith("e_score_correction_bias"):
                buf.copy_(0.5 * torch.randn(buf.shape, generator=g))


def make_tiny(root: Path, name: str, model_type: str, overrides: dict[str, Any], seed: int = 0
              ) -> Tiny:
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = overrides if name in GPT_FAMILIES else {**_COMMON, **overrides}
    cfg = AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                             dtype=torch.float32).eval()
    _randomise(model, seed)
    path = root / name
    model.save_pretrained(path)
    return Tiny(name, path, model)


_CACHE: dict[str, Tiny] = {}


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """tiny(name) -> Tiny, built once per session for each name in FAMILIES."""
    root = tmp_path_factory.mktemp("tiny_models")

    def get(name: str) -> Tiny:
        if name not in _CACHE:
            model_type, overrides = FAMILIES[name]
            _CACHE[name] = make_tiny(root, name, model_type, overrides)
        return _CACHE[name]

    return get


@pytest.fixture(scope="session")
def tiny_llama(tiny) -> Tiny:
    return tiny("llama")


@pytest.fixture(scope="session")
def llama_model(tiny_llama: Tiny) -> mi.MIModel:
    return tiny_llama.load()


@pytest.fixture(scope="module")
def loaded(tiny):
    """name -> our model of that tiny checkpoint, loaded once per test module."""
    return loaded_models(tiny)


@pytest.fixture(scope="session")
def make_ids():
    """make_ids(batch, seq, seed=0) -> LongTensor of ids in [3, VOCAB) (no pad/bos/eos)."""

    def make(batch: int, seq: int, seed: int = 0) -> torch.Tensor:
        return torch.randint(3, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))

    return make

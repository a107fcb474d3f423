"""Sizes are checked before memory is spent (the kernel's part, on the example plugin's toy
backend): the SDK's memory check, the override (``check_memory=False``,
``MI_SKIP_MEMORY_CHECK=1``), and the context and memory refusals of ``forward`` /
``generate``. Backend estimates: tests/transformer/test_transformer_sizes.py, RWKV's in
tests/rwkv/test_rwkv_sizes.py."""

from __future__ import annotations

import json
import resource
from pathlib import Path
from typing import Iterator

import pytest
import torch

import mi_core as mi
import mi_core.loading
from mi_core.plugin import ContextLength, available_memory, check_memory

from tests.support.toy_checkpoint import write_toy_checkpoint


@pytest.fixture()
def address_space_cap() -> Iterator[None]:
    """Caps this process's address space 4 GiB above what it uses now, for tests of configs
    whose refusal, if it failed, would allocate until the shared machine runs out."""
    with open("/proc/self/status", encoding="ascii") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm + 4 * 2**30, hard))
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture()
def little_memory(monkeypatch) -> None:
    """Pretend 1,000 bytes are available anywhere: the toy's 1,472 bytes of F32 weights no
    longer fit."""
    monkeypatch.setattr(mi_core.loading, "available_memory", lambda device="cpu": 1000)


def test_check_memory_refuses_what_cannot_fit_naming_it() -> None:
    assert available_memory("cpu") > 0 and available_memory("meta") is None
    with pytest.raises(mi.ConfigError, match=r"cfg: big.*GiB, more than the .* GiB available"):
        check_memory("cfg: big", 2**70)
    with pytest.raises(mi.InputError, match="on cpu"):
        check_memory("gen", 2**70, "cpu", error=mi.InputError)
    check_memory("small", 2**20)
    check_memory("meta", 2**70, "meta")  # nothing to ask there


def test_the_environment_variable_skips_the_check(monkeypatch) -> None:
    monkeypatch.setenv("MI_SKIP_MEMORY_CHECK", "1")
    check_memory("big", 2**70)


def test_a_config_claiming_a_billion_layers_is_refused_naming_the_key(tmp_path,
                                                                      address_space_cap) -> None:
    d = tmp_path / "toy"
    write_toy_checkpoint(d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "n_layers": 10**9}))
    with pytest.raises(mi.ConfigError, match=r"config\.json: n_layers = 1000000000"):
        mi.MIModel.from_pretrained(d)


def test_check_memory_false_loads_what_the_estimate_refuses(toy_dir, little_memory) -> None:
    with pytest.raises(mi.ConfigError, match="n_layers = 3"):
        mi.MIModel.from_pretrained(toy_dir)
    assert mi.MIModel.from_pretrained(toy_dir, check_memory=False).num_layers == 3
    with pytest.raises(mi.ConfigError):  # the override held for that load only
        mi.MIModel.from_pretrained(toy_dir)


def test_the_cli_refuses_a_huge_config_with_mi_error(tmp_path, capsys,
                                                     address_space_cap) -> None:
    from mi_cli.main import main

    d = tmp_path / "toy"
    write_toy_checkpoint(d, tokenizer=True)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "n_layers": 10**9}))
    code = main(["run", "--model", str(d), "--prompt", "the cat"])
    err = capsys.readouterr().err
    assert code == 1 and "mi: error:" in err and "n_layers = 1000000000" in err, err
    assert "Traceback" not in err


# -- context and generation -----------------------------------------------------------------
@pytest.fixture()
def toy_with_context(toy_model) -> mi.MIModel:
    """The toy declaring a context of 4 positions and a cache of 100 bytes a token."""
    be = toy_model.backend
    be.context_length = 4
    be.cache_bytes = lambda batch, tokens: 100 * batch * tokens
    assert isinstance(be, ContextLength) and "context length" in toy_model.capabilities()
    return toy_model


def test_forward_past_the_context_is_refused_unless_allowed(toy_with_context, ids) -> None:
    with pytest.raises(mi.InputError, match=r"ids: 5 positions.*context of 4.*"
                                            r"allow_beyond_context=True"):
        toy_with_context.forward(ids)
    assert toy_with_context.forward(ids, allow_beyond_context=True).output.shape[1] == 5
    assert toy_with_context.forward(ids[:, :4]).output.shape[1] == 4


def test_generate_past_the_context_is_refused_before_compute(toy_with_context) -> None:
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(mi.InputError, match=r"max_new_tokens = 2 after a prompt of 3: 5 "
                                            r"positions.*context of 4"):
        toy_with_context.generate(prompt, 2)
    with pytest.raises(mi.InputError, match="max_new_tokens = 1000000000"):
        toy_with_context.generate(prompt, 10**9)
    assert toy_with_context.generate(prompt, 1).tokens.shape == (1, 4)
    out = toy_with_context.generate(prompt, 2, allow_beyond_context=True)
    assert out.tokens.shape == (1, 5)


def test_generate_that_cannot_fit_in_memory_is_refused(toy_with_context, little_memory) -> None:
    """Without a context limit in the way, 10**9 new tokens (their ids alone: 16 GB) are
    refused before the first step, naming max_new_tokens."""
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(mi.InputError, match=r"generate: max_new_tokens = 1000000000 .*GiB"):
        toy_with_context.generate(prompt, 10**9, allow_beyond_context=True)


def test_generate_of_a_billion_tokens_without_a_context_is_refused_at_once(toy_model) -> None:
    """No declared context and memory to spare: more than MAX_NEW_TOKENS (2**20) new tokens
    in one call still needs the explicit opt-in (it would run until killed)."""
    from mi_core.generation import MAX_NEW_TOKENS

    assert "context length" not in toy_model.capabilities()
    with pytest.raises(mi.InputError, match=r"max_new_tokens = 1000000000 .*more than 1048576 "
                                            r"new tokens.*allow_beyond_context=True"):
        toy_model.generate(torch.tensor([[1, 2, 3]]), 10**9)
    with pytest.raises(mi.InputError, match="more than"):
        toy_model.generate(torch.tensor([[1, 2, 3]]), MAX_NEW_TOKENS + 1)


def test_backends_without_a_context_are_not_limited(toy_model, ids) -> None:
    assert "context length" not in toy_model.capabilities()
    assert toy_model.forward(ids).output.shape[1] == 5


def test_the_cli_refuses_a_prompt_past_the_context(monkeypatch, capsys) -> None:
    from mi_cli import models
    from mi_cli.main import main
    from tests.support.fake_backend import fake_model

    model = fake_model()
    model.backend.context_length = 8
    model.backend.cache_bytes = lambda batch, tokens: 0
    monkeypatch.setattr(models, "load_model", lambda *a, **k: model)
    code = main(["run", "--prompt", "far more than eight characters"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("mi: error: ids:") and "context of 8" in err, err


def test_the_toy_plugin_estimate_is_made_before_its_tables(tmp_path: Path) -> None:
    """The example plugin shows third parties the SDK helper: its check runs on the config
    alone (no tensor is read; the checkpoint here has none)."""
    d = tmp_path / "toy"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "toy-mlp", "vocab_size": 10**7,
                                               "d_model": 10**6, "n_layers": 1}))
    from mi_toy.model import ToyBackend
    from mi_core.registry import ModelSource

    with pytest.raises(mi.ConfigError, match="d_model = 1000000"):
        ToyBackend.load(ModelSource(path=d, config=json.loads((d / "config.json").read_text())),
                        torch.device("cpu"), torch.float32)

"""Sizes are checked before memory is spent on RWKV: a config whose parameters cannot fit
is a ConfigError naming its keys before any per-layer table is built (RWKV-7's per-layer
``value_dim`` list included); RWKV has no trained context limit (its cache is the state)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import mi_core as mi

from tests.core.test_core_sizes import address_space_cap  # noqa: F401  (a fixture)


@pytest.mark.parametrize("version", ["v6", "v7"])
@pytest.mark.parametrize("key", ["num_hidden_layers", "hidden_size", "vocab_size"])
def test_a_config_that_cannot_fit_is_refused_naming_the_key(request, tmp_path, version, key,
                                                            address_space_cap) -> None:
    d = tmp_path / version
    shutil.copytree(request.getfixturevalue(f"{version}_dir"), d)
    cfg = json.loads((d / "config.json").read_text())
    big = 10**9 if key != "hidden_size" else 64 * 10**7  # a multiple of the head size
    cfg[key] = big
    if key == "hidden_size":  # consistently: attention width, heads of 64
        cfg.update(attention_hidden_size=big, intermediate_size=4 * big)
        for k in ("num_heads", "num_attention_heads"):
            cfg.pop(k, None)
    if version == "v7":
        cfg["value_dim"] = [cfg["hidden_size"]] * 2  # a per-layer list: checked after the size
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(mi.ConfigError, match=rf"config\.json: .*{key} = {big}.*GiB"):
        mi.MIModel.from_pretrained(d)


def test_rwkv_declares_no_context_limit_and_a_constant_cache(model) -> None:
    be = model.backend
    assert "context length" in model.capabilities() and be.context_length is None
    assert be.cache_bytes(2, 10) == be.cache_bytes(2, 10**6) > 0
    ids = torch.randint(0, 300, (1, 3))
    assert model.generate(ids, 3, stop_at_eos=False).tokens.shape == (1, 6)
    with pytest.raises(mi.InputError, match=r"max_new_tokens = 1000000000 .*more than 1048576"):
        model.generate(ids, 10**9)  # no context, but no silent run-until-killed either

"""Property-based fuzzing of config.json through the core's detection and loading path (every
installed plugin answers): any config either loads or fails with an MIError, never a raw
ValueError / KeyError / TypeError / ZeroDivisionError."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mi_core as mi
from tests.support.toy_checkpoint import write_toy_checkpoint

_KEYS = ["model_type", "vocab_size", "d_model", "n_layers", "hidden_size", "num_hidden_layers",
         "num_attention_heads", "num_key_value_heads", "intermediate_size", "rms_norm_eps",
         "tie_word_embeddings", "rope_theta", "rope_scaling", "head_dim", "hidden_act",
         "max_position_embeddings", "sliding_window", "architectures"]
_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-4, 70), st.floats(-2, 1e4, allow_nan=False),
              st.sampled_from(["toy-mlp", "llama", "rwkv7", "qwen2", "silu", "false", "", "x"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["rope_type", "factor", "type"]),
                                            inner, max_size=2)),
    max_leaves=6)
_configs = st.dictionaries(st.sampled_from(_KEYS), _values, max_size=8)


@pytest.fixture(scope="module")
def toy_template(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "toy"
    write_toy_checkpoint(path)
    return path


def _load_or_mi_error(template: Path, config: Any) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m"
        shutil.copytree(template, path)
        (path / "config.json").write_text(json.dumps(config))
        try:
            mi.check_compatibility(path)
            mi.MIModel.from_pretrained(path)
        except mi.MIError:
            pass


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(config=_configs)
def test_random_configs_load_or_raise_an_mi_error(toy_template: Path, config: Any) -> None:
    _load_or_mi_error(toy_template, config)


def test_the_toy_config_itself_loads(toy_template: Path) -> None:
    """Guard against a vacuous fuzz: the unmodified config loads."""
    model = mi.MIModel.from_pretrained(toy_template)
    assert model.backend_name == "toy"

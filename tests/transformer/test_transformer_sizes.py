"""Sizes are checked before memory is spent, on the transformer backend: a config or GGUF
whose implied parameters cannot fit is a ConfigError naming the key before anything is
allocated (the estimate runs right after the size keys are read, before any per-layer
table); a prompt (plus max_new_tokens) past max_position_embeddings is refused before
compute unless ``allow_beyond_context=True``, and a KV cache that cannot fit likewise."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_transformer.config import parse_config
from mi_transformer.config.size import ConfigTooLarge, param_count

from tests.core.test_core_sizes import address_space_cap  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("address_space_cap")

BILLION = 10**9


def _edited(tiny, name: str, tmp_path: Path, **keys) -> Path:
    d = tmp_path / name
    shutil.copytree(tiny(name).path, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **keys}))
    return d


@pytest.mark.parametrize("family, key", [
    ("llama", "num_hidden_layers"), ("llama", "hidden_size"), ("llama", "intermediate_size"),
    ("llama", "vocab_size"), ("gpt2", "n_layer"), ("falcon_7b", "num_hidden_layers"),
    ("mixtral", "num_local_experts"), ("qwen2_moe", "moe_intermediate_size"),
    ("gpt2", "n_positions"), ("opt", "max_position_embeddings"),
])
def test_a_config_that_cannot_fit_is_refused_at_load_naming_the_key(tiny, tmp_path, family,
                                                                     key) -> None:
    d = _edited(tiny, family, tmp_path, **{key: BILLION if "positions" not in key else 10**12})
    with pytest.raises(ConfigTooLarge, match=rf"config\.json: .*{key} = 10+\b.*GiB"):
        mi.MIModel.from_pretrained(d)
    report = mi.check_compatibility(d)  # detection claims it, saying why it cannot load here
    assert key in report.summary()


def test_parse_time_checks_come_before_any_per_layer_table(tiny) -> None:
    """parse_config alone (detection does this) refuses a billion layers at once."""
    cfg = {**tiny("llama").config, "num_hidden_layers": BILLION}
    with pytest.raises(ConfigTooLarge, match="num_hidden_layers = 1000000000"):
        parse_config(cfg)


def test_the_estimate_counts_every_parameter_of_the_tiny_models(tiny) -> None:
    """param_count against the transformers model's own count (biases and norm gains are
    approximated, hence the 2% margin; MoE, tied and learned-position families included)."""
    for name in ("llama", "gpt2", "mixtral", "qwen2_moe", "falcon_7b", "gemma"):
        t = tiny(name)
        ours = param_count(parse_config(t.config))
        theirs = sum(p.numel() for p in t.hf.parameters())
        assert abs(ours - theirs) <= 0.02 * theirs, (name, ours, theirs)


def test_the_memory_check_can_be_skipped_for_one_load(tiny, tmp_path, monkeypatch) -> None:
    import mi_core.loading

    monkeypatch.setattr(mi_core.loading, "available_memory", lambda device="cpu": 10_000)
    d = tiny("llama").path
    with pytest.raises(ConfigTooLarge, match="GiB available"):
        mi.MIModel.from_pretrained(d)
    assert mi.MIModel.from_pretrained(d, check_memory=False).num_layers == 3
    monkeypatch.setenv("MI_SKIP_MEMORY_CHECK", "1")
    assert mi.MIModel.from_pretrained(d).num_layers == 3


def test_cpu_offload_checks_that_the_weights_fit_in_cpu_memory(tiny, monkeypatch) -> None:
    """offload="cpu" keeps every weight in CPU memory: the load-time check applies to it
    as to a plain load (disk offload does not hold the model, so it is not refused)."""
    import mi_core.loading

    monkeypatch.setattr(mi_core.loading, "available_memory", lambda device="cpu": 10_000)
    d = tiny("llama").path
    with pytest.raises(ConfigTooLarge, match="GiB available"):
        mi.MIModel.from_pretrained(d, offload="cpu")
    assert mi.MIModel.from_pretrained(d, offload="disk").num_layers == 3


def _tiny_gguf(path: Path, arch: str = "llama", **overrides: int) -> Path:
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), arch)
    sizes = {**dict(block_count=2, embedding_length=64, feed_forward_length=128, head_count=4,
                    head_count_kv=2, vocab_size=256, context_length=2048), **overrides}
    for key, value in sizes.items():
        getattr(w, f"add_{key}")(value)
    w.add_tensor("token_embd.weight", torch.zeros(256, 64).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("key", ["block_count", "embedding_length", "feed_forward_length"])
def test_gguf_metadata_that_cannot_fit_is_refused_naming_the_gguf_key(tmp_path, key) -> None:
    path = _tiny_gguf(tmp_path / "big.gguf", **{key: BILLION})
    with pytest.raises(ConfigTooLarge, match=rf"GGUF metadata: .*llama\.{key} = 1000000000"):
        mi.MIModel.from_pretrained(path)


def test_gguf_block_count_is_refused_before_an_architectures_per_layer_tables(tmp_path,
                                                                            monkeypatch) -> None:
    """EXAONE-4's configure builds one layer type per block (a list of 10**9 entries would
    exhaust memory): the size check comes first."""
    from mi_transformer.gguf import arches_recent

    def per_layer_table(*a: object) -> None:
        raise AssertionError("a per-layer table was built before the size check")

    monkeypatch.setattr(arches_recent, "sliding_layer_types", per_layer_table)
    path = _tiny_gguf(tmp_path / "big.gguf", "exaone4", block_count=BILLION, sliding_window=8)
    with pytest.raises(ConfigTooLarge, match=r"exaone4\.block_count = 1000000000"):
        mi.MIModel.from_pretrained(path)


# -- context -----------------------------------------------------------------------------------
def test_forward_past_max_position_embeddings_is_refused_unless_allowed(loaded, make_ids):
    model = loaded("llama")  # max_position_embeddings 64
    assert model.backend.context_length == 64 and "context length" in model.capabilities()
    ids = make_ids(1, 65)
    with pytest.raises(mi.InputError, match=r"ids: 65 positions, beyond the model's context "
                                            r"of 64.*allow_beyond_context=True"):
        model.forward(ids)
    with pytest.warns(UserWarning, match="max_position_embeddings 64"):
        model.backend._warned_long = False
        assert model.forward(ids, allow_beyond_context=True).output.shape[1] == 65


def test_a_100k_token_prompt_is_refused_before_compute(loaded, make_ids) -> None:
    with pytest.raises(mi.InputError, match="ids: 100000 positions"):
        loaded("llama").forward(make_ids(1, 100_000))


def test_generate_past_the_context_is_refused_unless_allowed(loaded, make_ids) -> None:
    model, ids = loaded("llama"), make_ids(1, 60)
    with pytest.raises(mi.InputError, match=r"max_new_tokens = 10 after a prompt of 60: 70 "
                                            r"positions.*context of 64"):
        model.generate(ids, 10)
    with pytest.raises(mi.InputError, match="max_new_tokens = 1000000000"):
        model.generate(ids, BILLION)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        out = model.generate(ids, 6, allow_beyond_context=True, stop_at_eos=False)
    assert out.tokens.shape == (1, 66)


def test_generate_whose_kv_cache_cannot_fit_is_refused_before_compute(loaded, make_ids):
    """Allowed past the context, a billion new tokens still need a KV cache of 768 GB
    (3 layers x 2 x 2 KV heads x 16 dims x 4 bytes a token): refused, naming the argument."""
    model = loaded("llama")
    assert model.backend.cache_bytes(1, 1) == 3 * 2 * 2 * 16 * 4
    with pytest.raises(mi.InputError, match=r"generate: max_new_tokens = 1000000000 .*GiB"):
        model.generate(make_ids(1, 4), BILLION, allow_beyond_context=True)

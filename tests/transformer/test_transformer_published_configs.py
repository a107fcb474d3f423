"""Published checkpoints load as published (config level: detection + parse), or are refused
with the plain message: the corpus of tests/support/published_configs.py.

Reference: the ``config.json`` files of 44 popular hub checkpoints, two reconstructed Qwen3.5
ones (multimodal, as released) and the config transformers
writes for a GGUF file (tests/transformer/published_configs/, sources in the support module).
A directory holding only the config is enough for detection (no weights are read).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import mi_core as mi
from mi_transformer.config import FAMILIES, parse_config
from tests.support.published_configs import CORPUS, DIR, PENDING, UNSUPPORTED


def _config(stem: str) -> dict:
    return json.loads((DIR / f"{stem}.json").read_text())


def _checkpoint_dir(tmp_path: Path, stem: str) -> Path:
    d = tmp_path / stem
    d.mkdir()
    (d / "config.json").write_text((DIR / f"{stem}.json").read_text())
    return d


def test_the_corpus_lists_every_file_and_has_the_issue_s_checkpoints():
    assert {p.stem for p in DIR.glob("*.json")} == set(CORPUS)
    assert len(CORPUS) >= 43
    for stem in ("HuggingFaceTB__SmolLM2-135M-Instruct", "Qwen__Qwen2.5-0.5B", "microsoft__phi-1",
                 "openai__gpt-oss-20b", "Qwen__Qwen3-32B-FP8", "deepseek-ai__DeepSeek-V2-Lite"):
        assert stem in CORPUS


@pytest.mark.parametrize("stem", sorted(CORPUS))
def test_published_config_is_detected_and_parses_or_is_refused_plainly(tmp_path, stem):
    """A supported family: detected (score 0.9) and parsed as its model_type. A family no
    installed plugin implements: the report, and the error loading it, say so first."""
    want = CORPUS[stem]
    report = mi.check_compatibility(_checkpoint_dir(tmp_path, stem))
    if want in FAMILIES:
        assert parse_config(_config(stem), f"{stem}.json").model_type == want
        assert report.supported and report.backend == "transformer", report.summary()
        return
    assert want in PENDING | UNSUPPORTED
    first = report.summary().splitlines()[0]
    assert first == f"no installed plugin implements model_type {want!r}"
    with pytest.raises(mi.UnsupportedModelError) as exc:
        mi.MIModel.from_pretrained(tmp_path / stem)
    assert str(exc.value).splitlines()[0] == first


@pytest.mark.parametrize("stem", sorted(s for s, mt in CORPUS.items() if mt in PENDING))
def test_published_config_of_each_new_family_parses(stem):
    """Fails (xfail) until the family's parser is registered by the work adding it."""
    want = CORPUS[stem]
    if want not in FAMILIES:
        pytest.xfail(f"model_type {want!r} is added by parallel work on issue 21")
    assert parse_config(_config(stem), f"{stem}.json").model_type == want


def test_the_three_configs_refused_only_for_neutral_keys_now_parse():
    """Issue 21's examples: SmolLM2 (is_llama_config, rope_interleaved: false), Qwen2.5
    (use_mrope: false), phi-1 (attention_bias: false, rotary_dim 32 = 0.5 x head_dim 64)."""
    for stem, keys in (("HuggingFaceTB__SmolLM2-135M-Instruct",
                        {"is_llama_config": True, "rope_interleaved": False}),
                       ("Qwen__Qwen2.5-0.5B", {"use_mrope": False}),
                       ("microsoft__phi-1", {"attention_bias": False, "rotary_dim": 32})):
        cfg = _config(stem)
        assert {k: cfg[k] for k in keys} == keys
        parse_config(cfg, stem)

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
from tests.support.published_configs import CORPUS, DIR, PENDING, PINNED, REFUSED


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
    if stem in REFUSED:  # a supported family, a config whose numbers it cannot give
        with pytest.raises(mi.MIError) as exc:
            parse_config(_config(stem), f"{stem}.json")
        assert all(words in str(exc.value) for words in REFUSED[stem]), str(exc.value)
        assert not report.supported
        return
    if want in FAMILIES:
        assert parse_config(_config(stem), f"{stem}.json").model_type == want
        assert report.supported and report.backend == "transformer", report.summary()
        return
    assert want in PENDING
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


#: transformers' layer-kind names -> ours (the recurrent kinds are all "not attention")
_HF_ATTENTION, _HF_MLP = {"attention", "full_attention"}, {"mlp"}


@pytest.mark.parametrize("stem", sorted(PINNED))
def test_state_space_config_parses_to_its_numbers_and_transformers_layer_schedule(stem):
    """Each published state-space / hybrid config: the numbers read off it by hand
    (:data:`PINNED`), and which layer is attention / recurrent / MLP-only equal to what
    transformers 5.24's config object built from the same dict says."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cfg = _config(stem)
    parsed = parse_config(cfg, f"{stem}.json")
    settings = parsed.mixers[0].settings
    for key, want in PINNED[stem].items():
        first, *rest = key.split(".")
        got = settings if first == "mixer" else getattr(parsed, first)
        for attr in rest:
            got = getattr(got, attr)
        assert got == want, (key, got, want)
    hf = CONFIG_MAPPING[cfg["model_type"]](**{k: v for k, v in cfg.items()
                                               if k != "model_type"})
    kinds = list(getattr(hf, "layer_types", None) or [])
    assert len(kinds) == parsed.num_layers
    if "hybrid" in kinds and parsed.layer_shared:  # Zamba2: shared block before the mixer
        assert [j is not None for j in parsed.layer_shared] == [k == "hybrid" for k in kinds]
        return
    if "hybrid" in kinds:  # Falcon-H1: attention and Mamba-2 side by side in every layer
        return
    ours = ["attention" if m == "attention" else "mlp" if m == "mlp" else "recurrent"
            for m in parsed.layer_mixers]
    theirs = ["attention" if k in _HF_ATTENTION else "mlp" if k in _HF_MLP else "recurrent"
              for k in kinds]
    assert ours == theirs

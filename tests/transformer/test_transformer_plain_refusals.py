"""Plain refusals: a checkpoint of a family no installed plugin implements is refused with a
first line that says so (``no installed plugin implements model_type X``, or ``GGUF
architecture X`` for a GGUF file, which has no model_type), then the plugins' details;
``mi check`` prints the same first line and exits 1, without a traceback.

The model_types are real ones transformers has and no plugin here implements (encoder-only,
encoder-decoder, speech, vision-language wrappers), a made-up one, and custom code named only
through ``auto_map`` (transformers needs ``trust_remote_code`` for it; we never run it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import mi_core as mi
from mi_cli.main import main

CONFIGS: dict[str, dict[str, Any]] = {
    "t5": {"model_type": "t5", "d_model": 64, "num_layers": 2, "vocab_size": 128},
    "bert": {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2},
    "whisper": {"model_type": "whisper", "d_model": 64, "encoder_layers": 2},
    "llava": {"model_type": "llava", "text_config": {"model_type": "llama", "hidden_size": 64}},
    "qwen2_vl": {"model_type": "qwen2_vl", "hidden_size": 64, "num_hidden_layers": 2},
    "mistral3": {"model_type": "mistral3", "text_config": {"model_type": "mistral"}},
    "frobnicator_9000": {"model_type": "frobnicator_9000", "hidden_size": 64},
    # custom modeling code only (auto_map), LLaMA-like keys: not run, not guessed at
    "custom_code": {"model_type": "custom_code", "hidden_size": 64, "auto_map": {
        "AutoConfig": "configuration_x.XConfig",
        "AutoModelForCausalLM": "modeling_x.XForCausalLM"}},
}


def _checkpoint(root: Path, cfg: dict[str, Any]) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps(cfg))
    save_file({"model.embed_tokens.weight": torch.zeros(8, 4)}, str(root / "model.safetensors"))
    return root


def _gguf(path: Path, arch: str) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(2)
    w.add_embedding_length(8)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _first_lines(path: Path, capsys) -> tuple[str, str]:
    """(first line of from_pretrained's error, first line `mi check` prints)."""
    with pytest.raises(mi.UnsupportedModelError) as exc:
        mi.MIModel.from_pretrained(path)
    capsys.readouterr()
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "NOT supported" in out and "Traceback" not in out
    return str(exc.value).splitlines()[0], out.splitlines()[0]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_model_type_no_plugin_implements_is_said_first(tmp_path, capsys, name):
    mt = CONFIGS[name]["model_type"]
    error, checked = _first_lines(_checkpoint(tmp_path / name, CONFIGS[name]), capsys)
    assert error == checked == f"no installed plugin implements model_type {mt!r}"


@pytest.mark.parametrize("arch", ["bert", "t5", "nomic-bert", "bloom"])
def test_a_gguf_architecture_no_plugin_implements_is_said_first(tmp_path, capsys, arch):
    """mi-transformer reads neither (transformers reads bloom and t5 GGUF; we do not)."""
    error, checked = _first_lines(_gguf(tmp_path / f"{arch}.gguf", arch), capsys)
    assert error == checked == f"no installed plugin implements GGUF architecture {arch!r}"


def test_mi_check_of_an_unimplemented_family_exits_1_without_a_traceback(tmp_path):
    path = _checkpoint(tmp_path / "t5", CONFIGS["t5"])
    out = subprocess.run([str(Path(sys.executable).parent / "mi"), "check", str(path)],
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert out.stdout.splitlines()[0] == "no installed plugin implements model_type 't5'"
    assert "Traceback" not in out.stdout + out.stderr


def test_a_family_a_plugin_implements_but_refuses_is_not_called_unimplemented(tmp_path):
    """A known family refused for its values keeps the plugin's reason first."""
    cfg = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
           "num_hidden_layers": 1, "intermediate_size": 96, "vocab_size": 8,
           "hidden_act": "no_such_activation"}
    with pytest.raises(mi.MIError) as exc:
        mi.MIModel.from_pretrained(_checkpoint(tmp_path / "llama", cfg))
    assert "no installed plugin implements" not in str(exc.value)

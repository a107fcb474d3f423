"""Bad probing files: saved activation sets (manifest + shards) and JSONL datasets.

Each case asserts the error class (ProbingError, an MIError) and that the message names
the file and the culprit key / tensor / line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import mi_core as mi
from mi_probing import ActivationSet, ProbingError, load_jsonl
from mi_probing.collect import Position
from tests.support.bad_files import write_pickle_payload

HOOK = "blocks.0.hook_resid_post"


@pytest.fixture()
def saved(tmp_path: Path) -> Path:
    acts = ActivationSet([HOOK], {HOOK: (4,)}, Position.parse("last"), 6,
                         tensors={HOOK: torch.arange(24, dtype=torch.float32).reshape(6, 4)})
    d = acts.save(tmp_path / "acts")
    assert torch.equal(ActivationSet.load(d)[HOOK], acts[HOOK])
    return d


def _manifest(d: Path, **changes: Any) -> Path:
    meta = json.loads((d / "manifest.json").read_text())
    meta.update(changes)
    (d / "manifest.json").write_text(json.dumps(meta))
    return d


@pytest.mark.parametrize("key, value, why", [
    ("n", "6", "integer"), ("n", 7, "the shards hold 6 rows"), ("n", True, "integer"),
    ("hooks", HOOK, "list of hook names"), ("hooks", [], "list of hook names"),
    ("feature_shapes", {HOOK: [4.0]}, "positive integers"),
    ("feature_shapes", {"blocks.9.hook_resid_post": [4]}, "one shape per hook"),
    ("position", [1], "'last', 'mean' or an integer"),
    ("shards", {"file": "shard_00000.safetensors"}, "list of {file, rows}"),
    ("format", "mi-probing-activations/0", "expected 'mi-probing-activations/1'"),
])
def test_manifest_value_of_wrong_type_names_file_key_and_value(saved: Path, key: str, value: Any,
                                                              why: str) -> None:
    _manifest(saved, **{key: value})
    with pytest.raises(ProbingError) as err:
        ActivationSet.load(saved)
    msg = str(err.value)
    assert "manifest.json" in msg and f"key '{key}" in msg and repr(value) in msg and why in msg, msg


@pytest.mark.parametrize("text", ["[1, 2]", "{\"format\": ", "\xff\xfe"])
def test_manifest_of_wrong_json_shape_names_the_file(saved: Path, text: str) -> None:
    (saved / "manifest.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(ProbingError, match=r"manifest\.json: (must hold a JSON object|invalid JSON)"):
        ActivationSet.load(saved)


def test_shard_path_outside_the_directory_is_refused(saved: Path) -> None:
    _manifest(saved, shards=[{"file": "../elsewhere.safetensors", "rows": 6}])
    with pytest.raises(ProbingError, match=r"'shards\[0\]\.file' = '\.\./elsewhere\.safetensors'"):
        ActivationSet.load(saved)


def test_missing_shard_file_is_named(saved: Path) -> None:
    (saved / "shard_00000.safetensors").unlink()
    with pytest.raises(ProbingError, match=r"shard_00000\.safetensors.*missing"):
        ActivationSet.load(saved)


@pytest.mark.parametrize("tensor, why", [
    (torch.zeros(6, 5), r"\[6, 5\], expected float \[6, 4\]"),
    (torch.zeros(6, 4, dtype=torch.int64), r"torch\.int64 \[6, 4\], expected float"),
    (torch.full((6, 4), float("nan")), "NaN or inf"),
])
def test_shard_tensor_of_wrong_shape_dtype_or_value_is_named(saved: Path, tensor: torch.Tensor,
                                                             why: str) -> None:
    save_file({HOOK: tensor}, str(saved / "shard_00000.safetensors"))
    acts = ActivationSet.load(saved)
    with pytest.raises(ProbingError, match=rf"shard_00000\.safetensors: tensor '{HOOK}' .*{why}"):
        acts[HOOK]


def test_shard_without_the_hook_tensor_is_named(saved: Path) -> None:
    w = load_file(str(saved / "shard_00000.safetensors"))
    save_file({"other": w[HOOK]}, str(saved / "shard_00000.safetensors"))
    with pytest.raises(ProbingError, match=rf"shard_00000\.safetensors: cannot read tensor '{HOOK}'"):
        ActivationSet.load(saved)[HOOK]


def test_pickle_shard_is_refused_without_unpickling(saved: Path, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    write_pickle_payload(saved / "shard_00000.pt", marker)
    _manifest(saved, shards=[{"file": "shard_00000.pt", "rows": 6}])
    with pytest.raises(ProbingError, match=r"'shards\[0\]\.file' = 'shard_00000\.pt'.*never opened"):
        ActivationSet.load(saved)
    assert not marker.exists()


# -- JSONL datasets ------------------------------------------------------------------------

@pytest.mark.parametrize("lines, pattern", [
    (['{"text": "a", "label": 1}', '{"text": "b", "label": [1]}'], r": example 1: label must be"),
    (['{"text": "a", "label": 1}', '{"text": 5, "label": 0}'], r": prompt 1 must be a non-empty string"),
    (['{"text": "a", "label": NaN}'], r": example 0: label nan is not finite"),
    (['{"text": "a"}'], r":1: missing key\(s\) \['label'\]"),
    (['["a", 1]'], r":1: expected an object"),
    (['{"text": "a", "label": 1', ''], r":1: invalid JSON"),
])
def test_bad_jsonl_line_names_file_and_line(tmp_path: Path, lines: list[str], pattern: str) -> None:
    p = tmp_path / "data.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProbingError, match=rf"data\.jsonl{pattern}"):
        load_jsonl(p)


@pytest.mark.parametrize("make", ["missing", "directory", "binary"])
def test_unreadable_dataset_file_is_a_probing_error_naming_it(tmp_path: Path, make: str) -> None:
    p = tmp_path / "data.jsonl"
    if make == "directory":
        p.mkdir()
    elif make == "binary":
        p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(mi.MIError, match=r"data\.jsonl: (cannot open|not UTF-8)"):
        load_jsonl(p)

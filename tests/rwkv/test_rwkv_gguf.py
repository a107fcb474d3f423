"""llama.cpp's RWKV-6 / RWKV-7 GGUF files (``rwkv6`` / ``rwkv7``), claimed by mi-rwkv's own
detection and read through the kernel ring mi_core.gguf (mi-transformer scores them 0 and
names the architecture).

The tiny checkpoints of tests/support/rwkv_ckpt.py (the HF-format RWKV-6 and fla-format
RWKV-7 the other RWKV tests compare with the `rwkv` package and `rwkv7-hf`) are written as
llama.cpp's converter writes them by tests/support/gguf_convert_rwkv.py (``Rwkv6Model``,
``Rwkv7Model`` and ``_set_vocab_rwkv_world`` of the commits named there; written without
mi_rwkv.gguf): lerps fused, LoRAs transposed / squeezed, RWKV-6's output and value weights
divided by 2^(layer // rescale_every) (rescale_every 1 here, so the division happens).
Reference: the same model loaded from its safetensors checkpoint: every tensor comes back
bit-identical (the rescaling is by powers of two), so the logits are equal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import torch

import mi_core as mi
from mi_core.errors import ConfigError, UnsupportedModelError, WeightLoadError
from tests.support import gguf_convert as conv
from tests.support import gguf_convert_rwkv as cr
from tests.support import rwkv_ckpt as rc
from tests.support.rwkv_ckpt import random_ids

gguf = pytest.importorskip("gguf")


def _source(version: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    if version == 6:
        return rc.v6_tensors(), dict(rc.v6_config(), rescale_every=1)
    return rc.v7_tensors(), rc.v7_config()


def write_rwkv_gguf(out: Path, version: int, tensors: dict[str, torch.Tensor],
                    cfg: dict[str, Any]) -> Path:
    """The converter's GGUF of an RWKV checkpoint (its config as ``hparams``)."""
    return conv.write(out, f"rwkv{version}", None, tensors, hp=cfg, generic=False,
                      params=cr.rwkv6_params if version == 6 else cr.rwkv7_params,
                      modify=(cr.rwkv6_modify if version == 6 else cr.rwkv7_modify)(
                          cfg["num_hidden_layers"]),
                      vocab=cr.world_vocab(cr.tiny_world_tokens(cfg["vocab_size"])))


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """case(version) -> (safetensors directory, GGUF file) of the same tiny model."""
    made: dict[int, tuple[Path, Path]] = {}
    root = tmp_path_factory.mktemp("rwkv_gguf")

    def get(version: int) -> tuple[Path, Path]:
        if version not in made:
            tensors, cfg = _source(version)
            d = rc.write_checkpoint(root / f"v{version}", tensors, cfg)
            made[version] = (d, write_rwkv_gguf(root / f"v{version}.gguf", version, tensors,
                                                cfg))
        return made[version]

    return get


@pytest.mark.parametrize("version", [6, 7])
def test_gguf_logits_equal_the_safetensors_checkpoint(case, version):
    d, path = case(version)
    ours = mi.MIModel.from_pretrained(path)
    assert ours.backend_name == f"rwkv{version}"
    ids = random_ids(2, 37, seed=version)  # not a multiple of the chunk
    ref = mi.MIModel.from_pretrained(d).forward(ids).output
    got = ours.forward(ids).output
    assert torch.equal(got, ref)
    assert got.std().item() > 0.1


@pytest.mark.parametrize("version", [6, 7])
def test_gguf_tensors_are_the_source_tensors(case, version):
    """Fused lerps split, LoRAs transposed back, RWKV-6's rescaled weights multiplied back,
    RWKV-7's dummy layer-0 value LoRA dropped: every tensor bit-identical."""
    from mi_rwkv.gguf import read_rwkv_gguf

    _, path = case(version)
    tensors, _ = _source(version)
    got = read_rwkv_gguf(path)[2]
    assert set(got.names()) == set(tensors)
    for k, v in tensors.items():
        assert torch.equal(got.get(k).reshape(v.shape), v), k
        assert got.shapes[k] == tuple(v.shape) or got.shapes[k] == tuple(v.squeeze().shape), k


@pytest.mark.parametrize("version", [6, 7])
def test_gguf_metadata_gives_the_source_config(case, version):
    from mi_rwkv.config import parse_v6, parse_v7
    from mi_rwkv.gguf import read_rwkv_gguf

    _, path = case(version)
    tensors, cfg = _source(version)
    _, raw, got, _ = read_rwkv_gguf(path)
    parse = parse_v6 if version == 6 else parse_v7
    ours, src = parse(raw, got.shapes), parse(cfg, {k: tuple(v.shape) for k, v in tensors.items()})
    skip = ("bos_token_id", "eos_token_id")  # the tiny vocabulary names none
    # float metadata is float32 in the file (1e-5 comes back as 9.99999975e-06)
    assert {k: pytest.approx(v, rel=1e-6) if isinstance(v, float) else v
            for k, v in attrs.asdict(ours).items() if k not in skip} == \
        {k: v for k, v in attrs.asdict(src).items() if k not in skip}


@pytest.mark.parametrize("version", [6, 7])
def test_rwkv_gguf_belongs_to_mi_rwkv_at_detection(case, version):
    """mi-rwkv claims it by general.architecture; mi-transformer scores it 0, naming the
    architecture it does not implement."""
    _, path = case(version)
    rep = mi.check_compatibility(path)
    assert rep.supported and rep.backend == f"rwkv{version}"
    tr = next(d for d in rep.detections if d.backend == "transformer")
    assert tr.score == 0 and f"does not implement GGUF architecture 'rwkv{version}'" in tr.reason


def test_mi_check_says_an_rwkv_gguf_is_supported_by_mi_rwkv(case, capsys):
    """mi-transformer's header reader for ``mi check`` leaves other plugins' architectures
    alone (it still refuses a text file named .gguf: tests/cli/test_cli_fast.py)."""
    from mi_cli.main import main

    _, path = case(6)
    assert main(["check", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: model_type=None, supported by rwkv6")


@pytest.mark.parametrize("version", [6, 7])
def test_cached_generation_from_the_gguf_equals_the_safetensors_model(case, version):
    d, path = case(version)
    ids = random_ids(1, 6, seed=11)
    want = mi.MIModel.from_pretrained(d).generate(ids, max_new_tokens=8).tokens
    assert torch.equal(mi.MIModel.from_pretrained(path).generate(ids, max_new_tokens=8).tokens,
                       want)


def test_the_world_vocabulary_of_a_gguf_is_the_world_tokenizer(tmp_path, world_vocab):
    """``_set_vocab_rwkv_world``'s token list (escaped byte strings, padding) of the real
    World vocabulary gives the tokenizer its file gives."""
    from mi_core.gguf import read_gguf_header
    from mi_rwkv.gguf import world_tokenizer
    from mi_rwkv.tokenizer import WorldTokenizer

    ref = WorldTokenizer.from_file(world_vocab)
    w = gguf.GGUFWriter(str(tmp_path / "vocab.gguf"), "rwkv6")
    cr.world_vocab(dict(ref._id2bytes))(w, {"vocab_size": 65536})
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok = world_tokenizer(read_gguf_header(tmp_path / "vocab.gguf"))
    text = "Hello, 世界! It's a \"test\"\n\tof \\escapes\\ and émojis 🦙 \x00\x7f"
    assert tok.encode(text) == ref.encode(text)
    assert tok.decode(tok.encode(text)) == text
    assert tok._id2bytes == ref._id2bytes


#: measured max abs logit error against the F32 model: F16 0.0026, Q8_0 0.074 (logits of
#: std ~1); the bounds leave 4x / 2.5x room
@pytest.mark.parametrize("qtype, tol", [("F16", 1e-2), ("Q8_0", 2e-1)])
def test_a_quantised_rwkv_gguf_loads_dequantised(case, tmp_path, qtype, tol):
    """The matrices stored as F16 / Q8_0 (as llama-quantize writes them): dequantised by the
    gguf package, logits near the F32 model's."""
    d, path = case(7)
    q = gguf.GGMLQuantizationType[qtype]
    r = gguf.GGUFReader(str(path))
    mats = {t.name: np.array(t.data) for t in r.tensors if len(t.shape) == 2
            and t.name.startswith("blk.") and t.shape[0] % 32 == 0}  # (rows of 32 blocks)
    bad = _requantised(path, tmp_path / f"{qtype}.gguf", mats, q)
    ids = random_ids(1, 16, seed=3)
    ref = mi.MIModel.from_pretrained(d).forward(ids).output
    got = mi.MIModel.from_pretrained(bad).forward(ids).output
    assert 0 < (got - ref).abs().max().item() < tol


def _requantised(src: Path, out: Path, mats: dict[str, np.ndarray], q: Any) -> Path:
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(out), "rwkv7")
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        w.add_key_value(key, field.contents(), field.types[0],
                        sub_type=field.types[1] if len(field.types) > 1 else None)
    for t in r.tensors:
        if t.name in mats:
            w.add_tensor(t.name, gguf.quants.quantize(mats[t.name], q), raw_dtype=q)
        else:
            w.add_tensor(t.name, np.array(t.data), raw_shape=list(reversed(t.shape.tolist())),
                         raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


# ------------------------------------------------------------------------- malformed files

@pytest.mark.parametrize("version, key", [(6, "rwkv6.wkv.head_size"),
                                          (7, "rwkv7.embedding_length"),
                                          (7, "rwkv7.feed_forward_length")])
def test_a_missing_metadata_key_is_a_config_error_naming_it(case, tmp_path, version, key):
    from tests.transformer.test_transformer_gguf_new_arches import _rewrite

    _, path = case(version)
    bad = _rewrite(path, tmp_path / "nokey.gguf", meta={key: (None, "")})
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        mi.MIModel.from_pretrained(bad)


def test_a_billion_layers_is_refused_before_a_tensor_is_read(case, tmp_path):
    from tests.transformer.test_transformer_gguf_new_arches import _rewrite

    _, path = case(7)
    bad = _rewrite(path, tmp_path / "big.gguf", meta={"rwkv7.block_count": (10**9, "UINT32")})
    with pytest.raises(ConfigError, match=r"GGUF metadata.*num_hidden_layers = 1000000000"):
        mi.MIModel.from_pretrained(bad)


def test_a_lora_rank_the_tensors_contradict_is_a_config_error(case, tmp_path):
    from tests.transformer.test_transformer_gguf_new_arches import _rewrite

    _, path = case(7)
    bad = _rewrite(path, tmp_path / "rank.gguf",
                   meta={"rwkv7.attention.decay_lora_rank": (48, "UINT32")})
    with pytest.raises(ConfigError, match="decay_low_rank_dim"):
        mi.MIModel.from_pretrained(bad)


def test_a_mis_shaped_fused_lerp_is_named(case, tmp_path):
    from tests.transformer.test_transformer_gguf_new_arches import _rewrite

    _, path = case(6)
    bad = _rewrite(path, tmp_path / "lerp.gguf", tensors={
        "blk.1.time_mix_lerp_fused.weight": np.zeros((4, 1, 1, 128), np.float32)})
    with pytest.raises(WeightLoadError, match=r"blk\.1\.time_mix_lerp_fused\.weight"):
        mi.MIModel.from_pretrained(bad)


def test_missing_and_unknown_tensors_are_named(case, tmp_path):
    from tests.transformer.test_transformer_gguf_new_arches import _rewrite

    _, path = case(7)
    gone = _rewrite(path, tmp_path / "gone.gguf", drop=("blk.1.channel_mix_key.weight",))
    with pytest.raises(WeightLoadError, match=r"missing tensors: model\.layers\.1\.ffn\.key"):
        mi.MIModel.from_pretrained(gone)
    extra = _rewrite(path, tmp_path / "extra.gguf",
                     add={"blk.1.time_mix_mystery.weight": np.zeros(4, np.float32)})
    with pytest.raises(UnsupportedModelError, match=r"blk\.1\.time_mix_mystery\.weight"):
        mi.MIModel.from_pretrained(extra)


@pytest.mark.slow
@pytest.mark.parametrize("version", [6, 7])
def test_fuzzed_metadata_values_fail_only_with_mi_errors(case, tmp_path_factory, version):
    """Any value of any GGUF type at any of the architecture's keys either loads or raises an
    MIError."""
    from mi_core.gguf import read_gguf_header
    from mi_rwkv.gguf import read_rwkv_gguf
    from tests.support.gguf_fuzz import fuzz_metadata
    from tests.transformer.test_transformer_gguf_new_arches import _rewrite

    _, good = case(version)
    keys = [k for k in read_gguf_header(good).metadata if k.startswith(f"rwkv{version}.")]
    fuzz_metadata(keys, lambda path, meta: _rewrite(good, path, meta=meta), read_rwkv_gguf,
                  tmp_path_factory.mktemp("fuzz_rwkv"))

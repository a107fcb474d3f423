"""GGUF loading (mi_transformer.gguf) against independent references.

References: transformers' own GGUF loader on the same file (weights, tokenizer, logits),
gguf.GGUFReader (header), and tiny random HF LLaMA checkpoints we convert to GGUF here the
way llama.cpp's converter does (q/k rows permuted, quantised with gguf.quants.quantize).
Tolerance: F32 logits max abs diff < 1e-4; dequantised weights must be bit-identical,
since both sides run the same dequantisation on the same bytes.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import mi_core as mi
from mi_core.errors import UnsupportedModelError, WeightLoadError
from mi_transformer.gguf import (GgufCheckpoint, default_model_path, read_gguf,
                                 read_gguf_header, unpermute_qk)
from tests.support.byte_tokens import gpt2_byte_tokens
from tests.support.smollm2_hf import smollm2_hf_dir

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

TOL = 1e-4  # F32 logits, max abs diff

# ---------------------------------------------------------------------------------------------
# Tiny checkpoints converted to GGUF the way llama.cpp's convert_hf_to_gguf.py does


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute (convert_hf_to_gguf.py), reimplemented independently."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _tiny_hf_llama(directory: Path, rope_scaling: dict | None = None, tied: bool = False) -> Path:
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16384,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=tied,
        rope_scaling=dict(rope_scaling) if rope_scaling else None,  # transformers edits it
        bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # non-trivial norms so a mapping mistake shows
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(directory)
    return directory


def _write_gguf(hf_dir: Path, out: Path, qtype: str = "F32", arch: str = "llama",
                override: dict[str, str] | None = None, rope_freqs: np.ndarray | None = None,
                ffn_length: int | None = None, drop: tuple[str, ...] = ()) -> Path:
    """Convert a tiny HF LLaMA directory to GGUF (llama.cpp naming and q/k permutation).

    `override` maps a GGUF tensor name to a raw ggml type name written instead of `qtype`
    (used to craft unsupported quantisations).
    """
    from safetensors.torch import load_file

    cfg = transformers.AutoConfig.from_pretrained(hf_dir)
    sd = load_file(str(hf_dir / "model.safetensors"))
    w = gguf.GGUFWriter(str(out), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(ffn_length or cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(gpt2_byte_tokens())
    w.add_token_types([1] * 256)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
           "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
           "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
           "mlp.down_proj": "ffn_down"}
    for i in range(cfg.num_hidden_layers):
        for k, v in per.items():
            names[f"model.layers.{i}.{k}.weight"] = f"blk.{i}.{v}.weight"
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    for hf, t in sd.items():
        name = names[hf]
        if name in drop:
            continue
        a = t.float().numpy()
        if name.endswith("attn_q.weight"):
            a = _llama_cpp_permute(a, cfg.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            a = _llama_cpp_permute(a, cfg.num_key_value_heads)
        kind = (override or {}).get(name, "F32" if a.ndim == 1 else qtype)
        q = gguf.GGMLQuantizationType[kind]
        if kind == "F32":
            w.add_tensor(name, np.ascontiguousarray(a))
        elif kind == "F16":
            w.add_tensor(name, a.astype(np.float16))
        elif kind in ("Q8_1",):  # no quantiser in gguf: raw bytes of the right size
            block, size = gguf.GGML_QUANT_SIZES[q]
            raw = np.zeros((a.shape[0], a.shape[1] // block * size), dtype=np.uint8)
            w.add_tensor(name, raw, raw_dtype=q)
        else:
            w.add_tensor(name, gguf.quants.quantize(a, q), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_hf_llama(tmp_path_factory.mktemp("tiny_hf"))


@pytest.fixture(scope="module")
def tiny_gguf(tiny_hf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_gguf(tiny_hf, tmp_path_factory.mktemp("tiny_gguf") / "tiny-f32.gguf")


def _hf_logits(directory: Path, ids: torch.Tensor) -> torch.Tensor:
    m = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        return m(ids).logits


IDS = torch.tensor([[1, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100],
                    [1, 84, 104, 101, 32, 99, 97, 112, 105, 116, 97, 108]])


def test_f32_gguf_gives_back_the_hf_weights_with_qk_permutation_undone(tiny_hf: Path, tiny_gguf: Path) -> None:
    from safetensors.torch import load_file

    ckpt = read_gguf(tiny_gguf)
    ref = load_file(str(tiny_hf / "model.safetensors"))
    assert set(ckpt.tensors) == set(ref)
    for k, v in ref.items():
        assert torch.equal(ckpt.tensors[k], v.float()), k  # F32 round trip: bit-identical
    assert ckpt.config["num_key_value_heads"] == 2 and ckpt.config["tie_word_embeddings"] is False


def test_unpermute_is_the_inverse_of_llama_cpp_permute_for_weights_and_biases() -> None:
    for shape in [(48, 7), (48,)]:
        w = torch.randn(*shape)
        permuted = torch.from_numpy(_llama_cpp_permute(w.numpy(), 3))
        assert not torch.equal(permuted, w)
        assert torch.equal(unpermute_qk(permuted, 3), w)


def test_tiny_gguf_logits_match_transformers_on_the_source_checkpoint(tiny_hf: Path, tiny_gguf: Path) -> None:
    model = mi.MIModel.from_pretrained(tiny_gguf)
    ours = model.forward(IDS).output
    ref = _hf_logits(tiny_hf, IDS)
    assert (ours - ref).abs().max().item() < TOL


def test_q8_0_gguf_logits_match_transformers_loading_the_same_gguf(tiny_hf: Path, tmp_path: Path) -> None:
    path = _write_gguf(tiny_hf, tmp_path / "tiny-q8_0.gguf", qtype="Q8_0")
    ckpt = read_gguf(path)
    assert ckpt.quant_types["model.layers.0.self_attn.q_proj.weight"] == "Q8_0"
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    ref_sd = ref.state_dict()
    for k, v in ckpt.tensors.items():
        assert torch.equal(v, ref_sd[k]), k  # same bytes, same dequantisation
    with torch.no_grad():
        want = ref(IDS).logits
    got = mi.MIModel.from_pretrained(path).forward(IDS).output
    assert (got - want).abs().max().item() < TOL


def test_llama3_rope_factors_tensor_becomes_llama3_rope_scaling(tmp_path: Path) -> None:
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    hf = _tiny_hf_llama(tmp_path / "hf", rope_scaling=scaling)
    # llama.cpp's converter (LlamaModel.generate_extra_tensors) writes these divisors.
    head_dim, base = 16, 10000.0
    freqs = 1.0 / base ** (np.arange(0, head_dim, 2) / head_dim)
    factors = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < 8192 / 4.0:
            factors.append(1.0)
        elif wavelen > 8192 / 1.0:
            factors.append(8.0)
        else:
            smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
            factors.append(1 / ((1 - smooth) / 8.0 + smooth))
    path = _write_gguf(hf, tmp_path / "llama3.gguf", rope_freqs=np.array(factors))
    ckpt = read_gguf(path)
    assert ckpt.config["rope_scaling"] == scaling
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    got = mi.MIModel.from_pretrained(path).forward(ids).output
    assert (got - _hf_logits(hf, ids)).abs().max().item() < TOL


def test_unsupported_quantisation_is_a_weight_load_error_naming_tensor_and_type(
        tiny_hf: Path, tmp_path: Path) -> None:
    path = _write_gguf(tiny_hf, tmp_path / "q81.gguf", override={"blk.1.ffn_up.weight": "Q8_1"})
    with pytest.raises(WeightLoadError, match=r"blk\.1\.ffn_up\.weight.*Q8_1"):
        read_gguf(path)
    with pytest.raises(WeightLoadError, match="Q8_1"):
        mi.MIModel.from_pretrained(path)


def test_truncated_gguf_is_a_weight_load_error(tiny_gguf: Path, tmp_path: Path) -> None:
    data = tiny_gguf.read_bytes()
    for cut in (len(data) - 100, 4000, 30):  # in the tensor data, in the header, before counts
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(data[:cut])
        with pytest.raises(WeightLoadError, match="truncated"):
            read_gguf(p)


def test_tensor_shape_disagreeing_with_metadata_is_a_weight_load_error(tiny_hf: Path, tmp_path: Path) -> None:
    path = _write_gguf(tiny_hf, tmp_path / "bad.gguf", ffn_length=96)  # tensors are 128 wide
    with pytest.raises(WeightLoadError, match=r"blk\.0\.ffn_\w+\.weight.*shape"):
        read_gguf(path)


def test_missing_tensor_is_a_weight_load_error_naming_it(tiny_hf: Path, tmp_path: Path) -> None:
    path = _write_gguf(tiny_hf, tmp_path / "missing.gguf", drop=("blk.1.attn_v.weight",))
    with pytest.raises(WeightLoadError, match=r"missing tensors: model\.layers\.1\.self_attn\.v_proj"):
        read_gguf(path)


def test_not_a_gguf_file_is_a_weight_load_error(tmp_path: Path) -> None:
    p = tmp_path / "fake.gguf"
    p.write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(WeightLoadError, match="not a GGUF file"):
        read_gguf(p)


def test_unsupported_architecture_is_unsupported_and_named(tiny_hf: Path, tmp_path: Path) -> None:
    path = _write_gguf(tiny_hf, tmp_path / "bloom.gguf", arch="bloom")
    with pytest.raises(UnsupportedModelError, match="'bloom'"):
        read_gguf(path)


def test_tiny_gguf_tokenizer_round_trips_bytes(tiny_gguf: Path) -> None:
    tok = read_gguf(tiny_gguf).tokenizer
    assert tok is not None
    text = "héllo wörld ✓"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))  # one token per byte: no merges in this vocab
    assert tok.decode(ids) == text


def test_sentencepiece_gguf_tokenizer_ids_equal_transformers(tmp_path: Path) -> None:
    """tokenizer.ggml.model "llama" (sentencepiece BPE, scores but no merges, byte fallback)."""
    from mi_transformer.gguf import gguf_tokenizer

    pieces = ["\u2581", "e", "t", "h", "a", "o", "n", "l", "d", "r", "w", "H", "i", "s", ",", ".",
              "!", "\u2581t", "he", "\u2581the", "\u2581a", "an", "\u2581an", "\u2581and", "or",
              "ld", "\u2581w", "\u2581wor", "\u2581world", "el", "lo", "\u2581H", "\u2581Hel",
              "\u2581Hello", "is", "\u2581is", "\u2581i", "th", "\u2581th", "\u2581\u2581"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    scores = [0.0] * 259 + [-100.0 - i if len(p) == 1 else -float(i) for i, p in enumerate(pieces)]
    w = gguf.GGUFWriter(str(tmp_path / "spm.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(pieces))  # unk, control, byte, normal
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours = gguf_tokenizer(read_gguf_header(tmp_path / "spm.gguf"))
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="spm.gguf")
    assert ours is not None
    for text in ["Hello world", "Hello, world!  The end.", "  leading", "\u00fcn\u00efcode \u65e5\u672c \U0001f917",
                 "is this the world", "", "<s> the </s>"]:
        want = ref(text)["input_ids"]
        assert ours.encode(text) == want, text
        assert ours.decode(want) == ref.decode(want), text
    assert ours.encode("Hello")[0] == ours.bos_token_id == 1  # BOS added by default (llama.cpp)


# ---------------------------------------------------------------------------------------------
# The real SmolLM2-135M-Instruct Q4_1 GGUF against transformers loading the same file


@pytest.fixture(scope="module")
def smol_ckpt(smollm2_gguf_path: Path) -> GgufCheckpoint:
    return read_gguf(smollm2_gguf_path)


@pytest.fixture(scope="module")
def hf_smol(smollm2_gguf_path: Path):
    """transformers' own GGUF loader on the same file (slow: loaded once per module).

    Speed only, results unchanged: transformers builds a ``gguf.GGUFReader`` twice (config,
    then weights; seconds each on 100k metadata strings) and a ``TensorNameMap`` once per
    submodule (~400 times); both are read-only, so we memoise them while it loads.
    """
    import functools

    readers: dict[str, object] = {}
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map

    def shared_reader(path, *args, **kwargs):
        key = str(path)
        if key not in readers:
            readers[key] = reader_cls(path, *args, **kwargs)
        return readers[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", shared_reader)
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(name_map))
        return transformers.AutoModelForCausalLM.from_pretrained(
            smollm2_gguf_path.parent, gguf_file=smollm2_gguf_path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def hf_smol_tokenizer(smollm2_gguf_path: Path):
    return transformers.AutoTokenizer.from_pretrained(smollm2_gguf_path.parent,
                                                      gguf_file=smollm2_gguf_path.name)


TEXTS = [
    "The capital of France is",
    "Hello world",
    " leading space and  double  spaces",
    "Numbers: 2024, 3.14159, 1,000,000 and 0x1F",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "naïve café — Straße, 日本語のテキスト, Привет мир, مرحبا",
    "emoji 🤗🚀 and symbols ∑∫√ ©®",
    "def f(x):\n\treturn x ** 2  # comment\n\n\n",
    "don't won't I'm we'll they've it's",
    "URL https://example.com/a?b=c&d=e #tag @user",
    "",
    "   ",
]


def test_default_model_path_finds_the_smollm2_gguf(smollm2_gguf_path: Path) -> None:
    assert default_model_path() == smollm2_gguf_path


def test_header_matches_gguf_reader(tiny_gguf: Path) -> None:
    # The tiny file (GGUFReader takes seconds on SmolLM2's 100k metadata strings); it has the
    # same kinds of fields: string arrays, int arrays, u32/f32 scalars, strings.
    ours = read_gguf_header(tiny_gguf)
    ref = gguf.GGUFReader(tiny_gguf)
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        assert ours.metadata[key] == field.contents(), key
    assert [(t.name, t.dims, t.ggml_type, ours.data_offset + t.offset) for t in ours.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset))
        for t in ref.tensors]


def test_smollm2_tokenizer_ids_equal_transformers(smol_ckpt: GgufCheckpoint, hf_smol_tokenizer) -> None:
    tok = smol_ckpt.tokenizer
    assert tok is not None
    for text in TEXTS:
        want = hf_smol_tokenizer(text)["input_ids"]
        assert tok.encode(text) == want, text
        assert tok.decode(want) == hf_smol_tokenizer.decode(want), text
    assert tok.bos_token_id == hf_smol_tokenizer.bos_token_id == 1
    assert tok.eos_token_id == hf_smol_tokenizer.eos_token_id == 2
    assert tok.vocab_size == len(hf_smol_tokenizer) == 49152


def test_smollm2_weights_and_config_equal_transformers(smol_ckpt: GgufCheckpoint, hf_smol) -> None:
    sd = hf_smol.state_dict()
    assert smol_ckpt.config["tie_word_embeddings"] is True
    assert set(sd) - set(smol_ckpt.tensors) == {"lm_head.weight"}  # tied: HF lists it, we do not
    for k, v in smol_ckpt.tensors.items():
        assert torch.equal(v, sd[k]), k
    hc = hf_smol.config
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                "max_position_embeddings", "bos_token_id", "eos_token_id"):
        assert smol_ckpt.config[key] == getattr(hc, key), key
    assert smol_ckpt.config["rope_theta"] == hc.rope_parameters["rope_theta"]


def _smol_ids(tok, texts: list[str]) -> torch.Tensor:
    rows = [tok.encode(t) for t in texts]
    n = min(len(r) for r in rows)
    return torch.tensor([r[:n] for r in rows])


def test_smollm2_logits_match_transformers_gguf_loader(smollm2, hf_smol) -> None:
    ids = _smol_ids(smollm2.tokenizer, [TEXTS[0] + " Paris, and the capital of Italy is",
                                        TEXTS[3], TEXTS[5], TEXTS[7]])
    got = smollm2.forward(ids).output
    with torch.no_grad():
        want = hf_smol(ids).logits
    assert (got - want).abs().max().item() < TOL


def test_smollm2_says_paris(smollm2) -> None:
    ids = smollm2.to_tokens("The capital of France is")
    probs = smollm2.forward(ids).output[0, -1].softmax(-1)
    top = int(probs.argmax())
    assert smollm2.to_string([top]) == " Paris"
    # transformers on this file gives p(" Paris") = 0.7725; 0.5 leaves room for nothing but
    # a real change in the weights or the forward.
    assert probs[top].item() > 0.5


def test_smollm2_saved_as_hf_directory_loads_with_identical_logits(
        smollm2, smol_ckpt: GgufCheckpoint, smollm2_gguf_path: Path) -> None:
    d = smollm2_hf_dir(smollm2_gguf_path, smol_ckpt)  # save_pretrained, shared with TL parity
    assert {p.name for p in d.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    model = mi.MIModel.from_pretrained(d)
    ids = _smol_ids(smollm2.tokenizer, TEXTS[:3])
    assert model.tokenizer.encode(TEXTS[5]) == smollm2.tokenizer.encode(TEXTS[5])
    assert model.tokenizer.bos_token_id == 1 and model.tokenizer.eos_token_id == 2
    assert torch.equal(model.forward(ids).output, smollm2.forward(ids).output)

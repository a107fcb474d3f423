"""HFTokenizer over tokenizer.json, checked against transformers' PreTrainedTokenizerFast."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import mi_core as mi

CORPUS = ["The capital of France is Paris.", "Bonjour à tous, ça va ?", "数字 123 and 4.5e-3",
          "def f(x):\n    return x ** 2", "emoji 🙂 and tabs\tend"]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    d = tmp_path_factory.mktemp("tok")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 5, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": {"content": "</s>"}}))
    return d


def test_ids_and_decoding_match_transformers(tok_dir: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    ours = mi.HFTokenizer.from_file(tok_dir / "tokenizer.json")
    ref = PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"))
    for text in CORPUS:
        ids = ours.encode(text)
        assert ids == ref(text)["input_ids"], text
        assert ours.decode(ids[1:]) == ref.decode(ids[1:]) == text


def test_special_tokens_follow_the_post_processor_and_config(tok_dir: Path) -> None:
    tok = mi.HFTokenizer.from_file(tok_dir / "tokenizer.json")
    assert tok.bos_token_id == 0 and tok.eos_token_id == 1
    assert tok.encode("Paris")[0] == 0 and tok.encode("Paris", add_special_tokens=False)[0] != 0


def test_offsets_cover_the_characters_of_each_token(tok_dir: Path) -> None:
    tok = mi.HFTokenizer.from_file(tok_dir / "tokenizer.json")
    text = "The capital of France"
    enc = tok.encode_with_offsets(text, add_special_tokens=False)
    assert "".join(text[a:b] for a, b in enc.offsets) == text
    assert len(enc.ids) == len(enc.tokens) == len(enc.offsets)


def test_to_str_tokens_concatenate_to_the_text(tok_dir: Path) -> None:
    # ASCII text: a token that holds part of a multi-byte character decodes alone to U+FFFD,
    # as in TransformerLens' to_str_tokens.
    tok = mi.HFTokenizer.from_file(tok_dir / "tokenizer.json")
    ids = tok.encode("The capital of France is", add_special_tokens=False)
    assert "".join(tok.to_str_tokens(ids)) == "The capital of France is"


def test_out_of_range_ids_and_bad_files_are_tokenizer_errors(tok_dir: Path, tmp_path: Path) -> None:
    tok = mi.HFTokenizer.from_file(tok_dir / "tokenizer.json")
    with pytest.raises(mi.TokenizerError, match=r"token ids \[100000\] out of range"):
        tok.decode([1, 100000])
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(mi.TokenizerError, match="tokenizer.json"):
        mi.HFTokenizer.from_file(bad)


def test_model_directory_tokenizer_is_loaded_and_prepend_bos_overrides(tok_dir: Path, tmp_path: Path) -> None:
    from tests.support.toy_checkpoint import write_toy_checkpoint

    d = tmp_path / "toy"
    write_toy_checkpoint(d)
    for f in tok_dir.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    model = mi.MIModel.from_pretrained(d)
    with_bos = model.to_tokens("Paris")
    assert with_bos[0, 0].item() == 0
    assert model.to_tokens("Paris", prepend_bos=False)[0].tolist() == with_bos[0, 1:].tolist()
    ids, mask = model.to_tokens_padded(["Paris", "The capital of France"], side="left")
    assert mask[0].tolist()[: int((mask[0] == 0).sum())] == [0] * int((mask[0] == 0).sum())
    assert mask.sum(1).tolist() == [len(model.tokenizer.encode(t)) for t in
                                    ["Paris", "The capital of France"]]

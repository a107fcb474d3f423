"""Labelled datasets: the JSONL reader and its errors, and the committed dataset."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from mi_probing import LabelledDataset, ProbingError, load_jsonl


def test_committed_sentiment_set_is_balanced_and_valid(sentiment_path: Path):
    ds = load_jsonl(sentiment_path)
    assert len(ds) == 60 and ds.classes() == ["negative", "positive"]
    assert Counter(ds.labels) == {"positive": 30, "negative": 30}
    assert len(set(ds.texts)) == 60


def test_jsonl_reader_skips_blank_lines_and_keeps_label_types(tmp_path: Path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "a", "label": 1}\n\n{"text": "b", "label": 0.5}\n', encoding="utf-8")
    ds = load_jsonl(p)
    assert ds.texts == ("a", "b") and ds.labels == (1, 0.5) and ds.is_regression_target()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"text": "a", "label": 1}\nnot json\n', r"d.jsonl:2: invalid JSON"),
        ('{"text": "a"}\n', r"d.jsonl:1: missing key\(s\) \['label'\]"),
        ('["a", 1]\n', r"d.jsonl:1: expected an object"),
        ('{"text": "", "label": 1}\n', "prompt 0 must be a non-empty string"),
        ('{"text": "a", "label": [1]}\n', "label must be a string, integer, float or boolean"),
        ('{"text": "a", "label": 1}\n{"text": "b", "label": "x"}\n', "labels mix strings"),
        ("\n", "the dataset is empty"),
    ],
)
def test_malformed_jsonl_is_a_probing_error_naming_file_and_line(tmp_path: Path, content,
                                                                 message):
    p = tmp_path / "d.jsonl"
    p.write_text(content, encoding="utf-8")
    with pytest.raises(ProbingError, match=message):
        load_jsonl(p)


def test_prompts_and_labels_of_different_counts_are_rejected():
    with pytest.raises(ProbingError, match="3 prompts but 2 labels"):
        LabelledDataset.from_lists(["a", "b", "c"], [0, 1])

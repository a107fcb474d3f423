"""Collection on a real transformer backend: a tiny random LLaMA made with transformers.

Reference: the HF model itself, one prompt at a time (no padding), ``output_hidden_states``
(``hidden_states[i + 1]`` is the residual stream after block i, for every block but the
last, whose HF output is already final-normed). F32 throughout: 1e-4 absolute.
"""

from __future__ import annotations

import json

import pytest
import torch

import mi_core as mi
from mi_probing import collect_activations
from tests.support.probing_toy import make_tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = ["the film was really very good", "a cat", "the plot was bad", "one two three four",
         "red dog"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory):
    tok = make_tokenizer()
    cfg = transformers.LlamaConfig(vocab_size=tok.vocab_size, hidden_size=32,
                                   intermediate_size=64, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    path = tmp_path_factory.mktemp("llama")
    hf.save_pretrained(path)
    tok.inner.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}), encoding="utf-8")
    return hf, mi.MIModel.from_pretrained(path)


@pytest.mark.parametrize("position", ["last", "mean", 1])
def test_padded_batches_match_the_hf_model_run_one_prompt_at_a_time(llama, position):
    hf, model = llama
    hooks = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    acts = collect_activations(model, TEXTS, hooks, position=position, batch_size=3,
                               progress=False)
    for i, text in enumerate(TEXTS):
        ids = torch.tensor([model.tokenizer.encode(text)])
        with torch.no_grad():
            states = hf(ids, output_hidden_states=True).hidden_states
        for layer, hook in enumerate(hooks):
            full = states[layer + 1][0]  # [seq, d]
            want = full.mean(0) if position == "mean" else \
                full[-1] if position == "last" else full[position]
            torch.testing.assert_close(acts[hook][i], want, atol=1e-4, rtol=0)

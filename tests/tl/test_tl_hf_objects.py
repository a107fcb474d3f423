"""TransformerLens' ``hf_model=`` / ``tokenizer=`` loading lines under ``mi_core.tl``: a
transformers model and tokenizer object handed to ``HookedTransformer.from_pretrained``,
``from_pretrained_no_processing``, ``TransformerBridge.boot_transformers`` or
``set_tokenizer`` give the model those objects hold (TransformerLens 3.9's own bridge, booted
with the same objects, is the reference), so a test that loads TransformerLens that way keeps
the line when it switches the import (issue 25's acceptance tests load SmolLM2 from its GGUF
through transformers, whose HookedTransformer path refuses GGUF-dequantized models)."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from mi_core import CapabilityError
from mi_core.tl import HookedTransformer
from mi_core.tl.model_bridge import TransformerBridge

pytest.importorskip("transformer_lens")

TEXT = "When John and Mary went to the shops, John gave the bag to"
NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"  # a hub name: only the objects are read


def _fresh(path):
    """A transformers model and tokenizer of checkpoint `path` (a new object each time:
    TransformerLens' bridge changes the one it is given)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return hf, AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module", params=["smollm2_2l", "gpt2"])
def objects(request, tl_checkpoints):
    path = tl_checkpoints[request.param]
    return (*_fresh(path), path)


def _their_bridge(hf, tok):
    from transformer_lens.model_bridge import TransformerBridge as TLBridge

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TLBridge.boot_transformers(NAME, hf_model=hf, tokenizer=tok, device="cpu")
        model.enable_compatibility_mode(disable_warnings=True)
    return model


def _logits(model, tokens):
    with torch.no_grad():
        return model(tokens)


def test_hf_model_loading_lines_give_the_objects_model(objects):
    hf, tok, path = objects
    theirs = _their_bridge(*_fresh(path))
    tokens = theirs.to_tokens(TEXT)
    expected = _logits(theirs, tokens)
    from_path = HookedTransformer.from_pretrained(str(path))
    ours = HookedTransformer.from_pretrained(NAME, hf_model=hf, tokenizer=tok)
    assert torch.equal(ours.to_tokens(TEXT), tokens)  # the tokenizer object's, BOS prepended
    assert torch.equal(_logits(ours, tokens), _logits(from_path, tokens))  # the same weights
    assert (_logits(ours, tokens) - expected).abs().max().item() < 1e-4
    bridge = TransformerBridge.boot_transformers(NAME, hf_model=hf, tokenizer=tok, device="cpu")
    bridge.enable_compatibility_mode(disable_warnings=True)
    assert (_logits(bridge, tokens) - expected).abs().max().item() < 1e-4
    raw = HookedTransformer.from_pretrained_no_processing(NAME, hf_model=hf, tokenizer=tok)
    with torch.no_grad():
        assert torch.allclose(raw(tokens), hf(tokens).logits, atol=1e-4)
    assert ours.cfg.model_name == NAME


def test_the_checkpoint_written_for_hf_model_goes_with_the_model(objects):
    import gc

    hf, tok, _ = objects
    model = HookedTransformer.from_pretrained(NAME, hf_model=hf, tokenizer=tok)
    directory = model.mi_model.source
    assert os.path.isdir(directory)
    del model
    gc.collect()
    assert not os.path.exists(directory)


def test_tokenizer_object_replaces_the_checkpoints(objects, tl_checkpoints):
    hf, tok, path = objects
    theirs = _their_bridge(*_fresh(path))
    ours = HookedTransformer.from_pretrained(str(path), tokenizer=tok)
    assert torch.equal(ours.to_tokens([TEXT, "Hi"]), theirs.to_tokens([TEXT, "Hi"]))
    other = HookedTransformer.from_pretrained(str(path))
    other.set_tokenizer(tok, default_padding_side="left")
    assert other.tokenizer.padding_side == "left"
    assert torch.equal(other.to_tokens([TEXT, "Hi"]),
                       theirs.to_tokens([TEXT, "Hi"], padding_side="left"))


def test_hf_model_after_transformerlens_bridge_booted_it(tl_checkpoints):
    """TransformerLens' bridge wraps and processes the object in place: the same object, handed
    to mi-core next, still gives the model (LLaMA: the processed, untied weights), or a typed
    refusal where the bridge folded a bias the checkpoint format cannot hold (GPT-2)."""
    for name in ("smollm2_2l", "gpt2"):
        hf, tok = _fresh(tl_checkpoints[name])
        theirs = _their_bridge(hf, tok)
        if name == "gpt2":
            with pytest.raises(CapabilityError, match="fresh copy"):
                HookedTransformer.from_pretrained(NAME, hf_model=hf)
            continue
        ours = HookedTransformer.from_pretrained(NAME, hf_model=hf, tokenizer=theirs.tokenizer)
        tokens = theirs.to_tokens(TEXT)
        assert (_logits(ours, tokens) - _logits(theirs, tokens)).abs().max().item() < 1e-4


class _Quantized:
    """A model object whose config says bitsandbytes (packed weights)."""

    class config:  # noqa: N801  (stands for a transformers config)
        @staticmethod
        def to_json_string(use_diff=False):
            return ('{"model_type": "llama", '
                    '"quantization_config": {"quant_method": "bitsandbytes"}}')


def test_packed_quantized_hf_model_is_refused_by_name():
    with pytest.raises(CapabilityError, match="bitsandbytes"):
        HookedTransformer.from_pretrained(NAME, hf_model=_Quantized())


@pytest.mark.slow
def test_smollm2_from_its_gguf_through_transformers(smollm2_gguf_path):
    """The tester's line: SmolLM2 loaded by transformers from the GGUF (dequantized; its
    config keeps a gguf quantization_config), booted by both bridges."""
    if not os.environ.get("MI_TL_DEMOS"):
        pytest.skip("dequantizes the GGUF in transformers (~20 s): run with MI_TL_DEMOS=1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, g = str(smollm2_gguf_path.parent), smollm2_gguf_path.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=g)
    hf = AutoModelForCausalLM.from_pretrained(d, gguf_file=g, dtype=torch.float32).eval()
    theirs = _their_bridge(hf, tok)
    ours = TransformerBridge.boot_transformers(NAME, hf_model=hf, tokenizer=tok)
    ours.enable_compatibility_mode(disable_warnings=True)
    tokens = theirs.to_tokens(TEXT)
    assert torch.equal(ours.to_tokens(TEXT), tokens)
    # measured 4.8e-5 (the bridge computes with HuggingFace's modules, docs/TRANSFORMERLENS.md)
    assert (_logits(ours, tokens) - _logits(theirs, tokens)).abs().max().item() < 1e-4
    plain = HookedTransformer.from_pretrained(str(smollm2_gguf_path))
    assert torch.equal(_logits(plain, tokens), _logits(ours, tokens))

"""Generate the circuit-tracer reference fixtures under tests/clt/fixtures/.

Runs in a SEPARATE environment that has the `circuit-tracer` PyPI package (it pins
transformers <= 4.57.3 and TransformerLens 3.x, incompatible with the main venv):

    python3 -m venv .venv-ct
    .venv-ct/bin/pip install torch==2.13.0 && .venv-ct/bin/pip install circuit-tracer
    .venv-ct/bin/python scripts/make_clt_fixtures.py

What it writes (all safetensors / YAML / JSON, small):

* ``clt_jumprelu/``, ``clt_relu/``: random CLTs saved with circuit-tracer's own
  ``CrossLayerTranscoder.to_safetensors`` (+ a config.yaml), and ``*_ref.safetensors`` with
  inputs and circuit-tracer's ``encode`` / ``decode`` outputs;
* ``tset/``: a per-layer transcoder set saved with ``SingleLayerTranscoder.to_safetensors``
  as ``layer_{i}.safetensors`` and a config.yaml in the older list-of-dicts form;
* ``gs2_clt/``: a Gemma Scope 2 style CLT (``w_enc``/``w_dec``/``threshold`` per layer, the
  layout ``load_gemma_scope_2_clt`` reads), with references from that loader;
* ``tiny_llama/`` + ``attr_clt/`` + ``attr_ref.safetensors`` / ``attr_ref.json``: a tiny random
  LLaMA (HF safetensors + config + a word-level tokenizer), a random CLT for it, and
  circuit-tracer's ``attribute(...)`` graph on a fixed prompt (TransformerLens backend,
  model weights converted with TransformerLens' own LLaMA converter).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent.parent / "tests" / "clt" / "fixtures"
L, D, F, SEQ = 3, 16, 32, 5


def _random_clt(jump: bool, seed: int):
    from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder

    g = torch.Generator().manual_seed(seed)
    clt = CrossLayerTranscoder(L, F, D, activation_function="jump_relu" if jump else "relu",
                               lazy_decoder=False, device=torch.device("cpu"),
                               dtype=torch.float32)
    with torch.no_grad():
        clt.W_enc.copy_(torch.randn(L, F, D, generator=g) / D ** 0.5)
        clt.b_enc.copy_(torch.randn(L, F, generator=g) * 0.1)
        clt.b_dec.copy_(torch.randn(L, D, generator=g) * 0.1)
        for i in range(L):
            clt.W_dec[i].copy_(torch.randn(F, L - i, D, generator=g) / F ** 0.5)
        if jump:
            clt.activation_function.threshold.copy_(torch.rand(L, 1, F, generator=g) * 0.3)
    return clt


def make_clts() -> None:
    for name, jump, seed in (("clt_jumprelu", True, 1), ("clt_relu", False, 2)):
        clt = _random_clt(jump, seed)
        d = OUT / name
        clt.to_safetensors(str(d))
        (d / "config.yaml").write_text(yaml.safe_dump({
            "model_kind": "cross_layer_transcoder", "feature_input_hook": "hook_resid_mid",
            "feature_output_hook": "hook_mlp_out"}))
        x = torch.randn(L, SEQ, D, generator=torch.Generator().manual_seed(seed + 10))
        with torch.no_grad():
            acts = clt.encode(x)
            recon = clt.decode(acts.to_sparse())
        save_file({"x": x, "acts": acts.contiguous(), "recon": recon.contiguous()},
                  str(OUT / f"{name}_ref.safetensors"))


def make_transcoder_set() -> None:
    from circuit_tracer.transcoder.activation_functions import JumpReLU
    from circuit_tracer.transcoder.single_layer_transcoder import (
        SingleLayerTranscoder, TranscoderSet, load_transcoder_set)

    g = torch.Generator().manual_seed(3)
    d = OUT / "tset"
    d.mkdir(parents=True, exist_ok=True)
    for i in range(L):
        tc = SingleLayerTranscoder(D, F, JumpReLU(torch.rand(F, generator=g) * 0.3, 0.1), i,
                                   device=torch.device("cpu"), dtype=torch.float32)
        with torch.no_grad():
            tc.W_enc.copy_(torch.randn(F, D, generator=g) / D ** 0.5)
            tc.W_dec.copy_(torch.randn(F, D, generator=g) / F ** 0.5)
            tc.b_enc.copy_(torch.randn(F, generator=g) * 0.1)
            tc.b_dec.copy_(torch.randn(D, generator=g) * 0.1)
        tc.to_safetensors(str(d / f"layer_{i}.safetensors"))
    # The older config form: a list of {id, layer, filepath} dicts.
    (d / "config.yaml").write_text(yaml.safe_dump({
        "model_name": "tiny", "model_kind": "transcoder_set",
        "feature_input_hook": "mlp.hook_in", "feature_output_hook": "mlp.hook_out",
        "transcoders": [{"id": f"l{i}", "layer": i, "filepath": f"layer_{i}.safetensors"}
                        for i in range(L)]}))
    tset: TranscoderSet = load_transcoder_set(
        {i: str(d / f"layer_{i}.safetensors") for i in range(L)}, scan="tiny",
        feature_input_hook="mlp.hook_in", feature_output_hook="mlp.hook_out",
        device=torch.device("cpu"), dtype=torch.float32, lazy_encoder=False, lazy_decoder=False)
    x = torch.randn(L, SEQ, D, generator=torch.Generator().manual_seed(13))
    with torch.no_grad():
        acts = tset.encode(x)
        recon = tset.decode(acts, None)
    save_file({"x": x, "acts": acts.contiguous(), "recon": recon.contiguous()},
              str(OUT / "tset_ref.safetensors"))


def make_gemma_scope_2_clt() -> None:
    from circuit_tracer.transcoder.cross_layer_transcoder import load_gemma_scope_2_clt

    g = torch.Generator().manual_seed(4)
    d = OUT / "gs2_clt"
    d.mkdir(parents=True, exist_ok=True)
    paths = {}
    for i in range(L):
        p = d / f"params_layer_{i}.safetensors"
        save_file({"w_enc": torch.randn(D, F, generator=g) / D ** 0.5,
                   "w_dec": torch.randn(F, L, D, generator=g) / F ** 0.5,
                   "b_enc": torch.randn(F, generator=g) * 0.1,
                   "b_dec": torch.randn(D, generator=g) * 0.1,
                   "threshold": torch.rand(F, generator=g) * 0.3}, str(p))
        paths[i] = str(p)
    (d / "config.yaml").write_text(yaml.safe_dump({
        "model_kind": "cross_layer_transcoder", "feature_input_hook": "hook_resid_mid",
        "feature_output_hook": "hook_mlp_out",
        "transcoders": [f"params_layer_{i}.safetensors" for i in range(L)]}))
    # load_gemma_scope_2_clt iterates range(max(paths)), i.e. it skips the last key: pass
    # one extra (unused) key so that all L layers are read.
    clt = load_gemma_scope_2_clt({**paths, L: paths[0]}, device=torch.device("cpu"),
                                 dtype=torch.float32)
    assert clt.n_layers == L
    x = torch.randn(L, SEQ, D, generator=torch.Generator().manual_seed(14))
    with torch.no_grad():
        acts = clt.encode(x)
        recon = clt.decode(acts.to_sparse())
    save_file({"x": x, "acts": acts.contiguous(), "recon": recon.contiguous()},
              str(OUT / "gs2_clt_ref.safetensors"))


VOCAB = ["<s>"] + [f"w{i}" for i in range(63)]
PROMPT_IDS = [0, 5, 17, 9, 33, 21, 40, 12]  # BOS first: circuit-tracer keeps it as-is


def _tiny_llama(d: Path):
    """A tiny random LLaMA saved with transformers, and a word-level tokenizer for it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    cfg = LlamaConfig(vocab_size=len(VOCAB), hidden_size=16, intermediate_size=32,
                      num_hidden_layers=L, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                      initializer_range=0.3, tie_word_embeddings=False, bos_token_id=0,
                      eos_token_id=0, pad_token_id=0, hidden_act="silu")
    torch.manual_seed(5)
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norm gains
        for n, p in hf.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    hf.save_pretrained(str(d), safe_serialization=True)
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<s>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="<s>",
                                  pad_token="<s>", unk_token="<s>")
    tok.save_pretrained(str(d))
    from transformers import AutoTokenizer

    return hf, AutoTokenizer.from_pretrained(str(d))  # TransformerLens wants name_or_path


def _tl_replacement_model(hf, tok, clt):
    """circuit-tracer's TransformerLens replacement model with the HF weights, converted by
    TransformerLens' own LLaMA converter (no hub access)."""
    from circuit_tracer.replacement_model.replacement_model_transformerlens import (
        TransformerLensReplacementModel)
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.llama import convert_llama_weights

    c = hf.config
    cfg = HookedTransformerConfig(
        d_model=c.hidden_size, d_head=c.hidden_size // c.num_attention_heads,
        n_heads=c.num_attention_heads, d_mlp=c.intermediate_size, n_layers=c.num_hidden_layers,
        n_ctx=c.max_position_embeddings, eps=c.rms_norm_eps, d_vocab=c.vocab_size,
        act_fn="silu", n_key_value_heads=c.num_key_value_heads, normalization_type="RMS",
        positional_embedding_type="rotary", rotary_adjacent_pairs=False,
        rotary_dim=c.hidden_size // c.num_attention_heads, rotary_base=c.rope_theta,
        final_rms=True, gated_mlp=True, dtype=torch.float32, device="cpu",
        model_name="tiny-llama", original_architecture="LlamaForCausalLM")
    model = TransformerLensReplacementModel(cfg, tokenizer=tok)
    model.load_and_process_state_dict(convert_llama_weights(hf, cfg), fold_ln=False,
                                      center_writing_weights=False, center_unembed=False,
                                      fold_value_biases=False, refactor_factored_attn_matrices=False)
    model._configure_replacement_model(clt)
    return model


def make_attribution(out: Path) -> None:
    from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder

    md = out / "tiny_llama"
    if md.exists():
        shutil.rmtree(md)
    hf, tok = _tiny_llama(md)
    # A random JumpReLU CLT for it, saved with circuit-tracer's saver then re-loaded lazily.
    g = torch.Generator().manual_seed(6)
    clt = CrossLayerTranscoder(L, F, D, activation_function="jump_relu", lazy_decoder=False,
                               device=torch.device("cpu"), dtype=torch.float32)
    with torch.no_grad():
        clt.W_enc.copy_(torch.randn(L, F, D, generator=g) / D ** 0.5)
        clt.b_enc.copy_(torch.randn(L, F, generator=g) * 0.1)
        clt.b_dec.copy_(torch.randn(L, D, generator=g) * 0.05)
        for i in range(L):
            clt.W_dec[i].copy_(torch.randn(F, L - i, D, generator=g) / F ** 0.5)
        clt.activation_function.threshold.copy_(torch.rand(L, 1, F, generator=g) * 0.5)
    cd = out / "attr_clt"
    clt.to_safetensors(str(cd))
    (cd / "config.yaml").write_text(yaml.safe_dump({
        "model_kind": "cross_layer_transcoder", "feature_input_hook": "hook_resid_mid",
        "feature_output_hook": "hook_mlp_out"}))
    _attr_reference(out, hf, tok, "attr", cd, "hook_resid_mid")
    # The same weights read at the MLP input (circuit-tracer's mlp.hook_in, ours too: after
    # the ln2 gain): the feature targets then sit behind the frozen ln2 scale.
    cd2 = out / "attr_clt_mlpin"
    if cd2.exists():
        shutil.rmtree(cd2)
    shutil.copytree(cd, cd2)
    (cd2 / "config.yaml").write_text(yaml.safe_dump({
        "model_kind": "cross_layer_transcoder", "feature_input_hook": "mlp.hook_in",
        "feature_output_hook": "hook_mlp_out"}))
    _attr_reference(out, hf, tok, "attr_mlpin", cd2, "mlp.hook_in")


def _attr_reference(out: Path, hf, tok, name: str, clt_dir: Path, input_hook: str) -> None:
    from circuit_tracer import attribute
    from circuit_tracer.graph import compute_graph_scores, prune_graph
    from circuit_tracer.transcoder.cross_layer_transcoder import load_clt

    clt = load_clt(str(clt_dir), feature_input_hook=input_hook, feature_output_hook="hook_mlp_out",
                   device=torch.device("cpu"), dtype=torch.float32)
    model = _tl_replacement_model(hf, tok, clt)
    ids = torch.tensor(PROMPT_IDS)
    with torch.no_grad():  # the conversion is faithful: TL logits == HF logits
        diff = (model(ids[None]) - hf(ids[None]).logits).abs().max().item()
    assert diff < 1e-4, diff
    graph = attribute(ids, model, max_n_logits=5, desired_logit_prob=0.8, batch_size=16)
    node_mask, edge_mask, cum = prune_graph(graph, node_threshold=0.8, edge_threshold=0.98)
    replacement, completeness = compute_graph_scores(graph)
    save_file({"adjacency": graph.adjacency_matrix.contiguous(),
               "active_features": graph.active_features.contiguous(),
               "activation_values": graph.activation_values.contiguous(),
               "selected_features": graph.selected_features.contiguous(),
               "logit_tokens": graph.logit_token_ids.contiguous(),
               "logit_probabilities": graph.logit_probabilities.contiguous(),
               "input_tokens": ids, "node_mask": node_mask.contiguous(),
               "edge_mask": edge_mask.contiguous(), "cumulative_scores": cum.contiguous()},
              str(out / f"{name}_ref.safetensors"))
    (out / f"{name}_ref.json").write_text(json.dumps({
        "circuit_tracer_version": __import__("circuit_tracer").__version__,
        "clt": clt_dir.name, "feature_input_hook": input_hook,
        "node_threshold": 0.8, "edge_threshold": 0.98, "max_n_logits": 5,
        "desired_logit_prob": 0.8, "replacement_score": replacement,
        "completeness_score": completeness, "tl_vs_hf_logit_max_abs_diff": diff}, indent=2))


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    make_clts()
    make_transcoder_set()
    make_gemma_scope_2_clt()
    if "--no-attribution" not in sys.argv:
        make_attribution(OUT)
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"fixtures written to {OUT} ({total / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

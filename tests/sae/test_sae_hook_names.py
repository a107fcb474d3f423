"""Each format's hook names map to the point holding the values its SAEs were trained on.

SAELens / Llama Scope names are TransformerLens names (ours verbatim); HuggingFace module
paths (Gemma Scope 2, sparsify) of the pre-MLP norm's output, or an MLP module's input,
are the MLP input after the norm's gain: ``mlp.hook_in``. End to end: a sparsify MLP
transcoder spliced into a tiny LLaMA (random norm gains, so before / after the gain
differ) equals the HF model with that MLP module's output replaced by the transcoder of
its input (logits, F32, 1e-4).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import mi_core as mi
from mi_sae.hooknames import hf_to_hook_point, tl_to_hook_point
from tests.support.hf_reference import assert_matches_hf_with_hook, save_tiny_hf_llama

pytest.importorskip("transformers")


@pytest.mark.parametrize("name, post_norms, expected", [
    ("model.layers.3.pre_feedforward_layernorm.output", True, "blocks.3.mlp.hook_in"),
    ("model.layers.3.post_attention_layernorm.output", False, "blocks.3.mlp.hook_in"),  # LLaMA
    ("model.layers.3.post_attention_layernorm.output", True, "blocks.3.hook_attn_out"),  # Gemma
    ("model.layers.3.post_feedforward_layernorm.output", True, "blocks.3.hook_mlp_out"),
    ("layers.3.mlp.input", False, "blocks.3.mlp.hook_in"),
    ("layers.3.mlp", False, "blocks.3.hook_mlp_out"),
    ("model.layers.3.output", False, "blocks.3.hook_resid_post"),
    ("model.layers.3.self_attn.o_proj.input", True, "blocks.3.attn.hook_z"),
])
def test_hf_module_paths_map_to_the_trained_values(name: str, post_norms: bool, expected: str) -> None:
    assert str(hf_to_hook_point(name, post_norms=post_norms)) == expected


@pytest.mark.parametrize("name, expected", [
    ("blocks.2.hook_resid_pre", "blocks.2.hook_resid_pre"),
    ("blocks.2.ln2.hook_normalized", "blocks.2.ln2.hook_normalized"),  # TL's value, ours too
    ("blocks.2.hook_mlp_in", "blocks.2.hook_mlp_in"),  # TL's: only the MLP reads it
    ("blocks.2.hook_attn_in", "blocks.2.hook_attn_in"),
])
def test_transformerlens_names_are_ours(name: str, expected: str) -> None:
    assert str(tl_to_hook_point(name)) == expected


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("llama_gain")
    # gains far from 1: before / after the gain differ
    hf = save_tiny_hf_llama(path, mlp_norm_gain=(0.2, 3.0))
    return hf, mi.MIModel.from_pretrained(path)


def test_sparsify_mlp_transcoder_reads_the_mlp_module_input(llama, tmp_path: Path) -> None:
    hf, model = llama
    d = tmp_path / "layers.1.mlp"  # sparsify names the folder after the hooked module
    d.mkdir()
    g = torch.Generator().manual_seed(0)
    save_file({"encoder.weight": torch.randn(48, 32, generator=g) * 0.3,
               "encoder.bias": torch.randn(48, generator=g) * 0.1,
               "W_dec": torch.randn(48, 32, generator=g) * 0.3,
               "b_dec": torch.randn(32, generator=g) * 0.1}, str(d / "sae.safetensors"))
    (d / "cfg.json").write_text(json.dumps({"d_in": 32, "num_latents": 48, "k": 6,
                                            "activation": "topk", "transcode": True}))
    tc = mi.load_dictionary(d)
    assert (str(tc.hook_point), str(tc.hook_point_out)) == ("blocks.1.mlp.hook_in", "blocks.1.hook_mlp_out")
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    ours = model(ids, tc.splice(mi.HookSpec(), model=model)).output
    assert_matches_hf_with_hook(ours, hf, ids, hf.model.layers[1].mlp,
                                lambda m, inp, out: tc.reconstruct(inp[0]))

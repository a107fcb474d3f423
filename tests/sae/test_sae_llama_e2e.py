"""End to end on a tiny random LLaMA (transformers-made, loaded by the mi-transformer backend).

Reference: the HF model itself with a PyTorch forward hook that replaces layer 1's output
hidden states with the SAE reconstruction; logits compared at 1e-4 (F32).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mi_core as mi
from tests.support.hf_reference import assert_matches_hf_with_hook, save_tiny_hf_llama
from tests.support.sae_tiny_backend import write_saelens_sae

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("llama")
    hf = save_tiny_hf_llama(path)
    try:
        model = mi.MIModel.from_pretrained(path)
    except mi.UnsupportedModelError as exc:  # the transformer backend is not installed
        pytest.skip(str(exc))
    return hf, model


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))


def test_spliced_resid_sae_matches_hf_model_with_replacing_hook(llama, ids, tmp_path: Path) -> None:
    hf, model = llama
    sae = mi.load_dictionary(write_saelens_sae(tmp_path, "blocks.0.hook_resid_post", 32, 96))
    ours = model(ids, sae.splice(mi.HookSpec(), model=model)).output

    def replace(_m: torch.nn.Module, _inp: object, out: object) -> object:
        h = out[0] if isinstance(out, tuple) else out
        r = sae.reconstruct(h)
        return (r,) + tuple(out[1:]) if isinstance(out, tuple) else r

    assert_matches_hf_with_hook(ours, hf, ids, hf.model.layers[0], replace)


@pytest.mark.parametrize("kind", ["resid", "hook_z", "transcoder"])
def test_splice_with_error_term_leaves_llama_logits_unchanged(llama, ids, tmp_path: Path, kind: str) -> None:
    _, model = llama
    spec = {"resid": dict(hook="blocks.1.hook_resid_pre", d_in=32, d_sae=64),
            "hook_z": dict(hook="blocks.1.attn.hook_z", d_in=32, d_sae=64),
            "transcoder": dict(hook="blocks.0.ln2.hook_normalized", d_in=32, d_sae=64,
                               hook_out="blocks.0.hook_mlp_out", d_out=32, arch="transcoder")}[kind]
    sae = mi.load_dictionary(write_saelens_sae(tmp_path, **spec))
    clean = model(ids).output
    spliced = model(ids, sae.splice(mi.HookSpec(), model=model)).output
    with_err = model(ids, sae.splice(mi.HookSpec(), include_error=True, model=model)).output
    assert (spliced - clean).abs().max() > 1e-3
    torch.testing.assert_close(with_err, clean, atol=1e-5, rtol=0)


def test_sae_width_mismatch_with_llama_hook_is_refused(llama, tmp_path: Path) -> None:
    _, model = llama
    sae = mi.load_dictionary(write_saelens_sae(tmp_path, "blocks.1.hook_resid_post", 48, 64))
    with pytest.raises(mi.DictionaryError, match="width 32"):
        sae.check_model(model)

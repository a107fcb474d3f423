"""Encode SmolLM2's residual stream with a cross-layer transcoder and inspect the features.

    python examples/clt_encode.py [--gguf PATH] [--clt DIR] [--d-features 1024] [--k 5]

With no --clt, a data-initialised random CLT (mi_clt.synthetic.build_clt, circuit-tracer
layout) is written to a temporary directory first; any circuit-tracer CLT directory for a
30-layer, d_model-576 model works the same. Prints, per position, the strongest features
(CltFeatureId(layer, index) and activation), the decoder vectors of the strongest one at
every layer it writes to, and how well the CLT reconstructs each layer's MLP output.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

import mi_core as mi
from _load import gguf_parser
from mi_clt.synthetic import build_clt

PROMPT = "The capital of France is Paris, and the capital of Italy is"


def main() -> None:
    ap = gguf_parser(__doc__.splitlines()[0])
    ap.add_argument("--clt", default=None)
    ap.add_argument("--d-features", type=int, default=1024)
    ap.add_argument("--k", type=int, default=5)
    args = ap.parse_args()
    # the CLT built here is ~1 GB: removed when main returns (or at exit)
    scratch = tempfile.TemporaryDirectory(prefix="mi-clt-example-")

    model = mi.MIModel.from_pretrained(args.gguf)
    clt_dir = args.clt or build_clt(model, [model.to_tokens(PROMPT, prepend_bos=True)],
                                    Path(scratch.name) / "clt", d_features=args.d_features,
                                    n_active=8)
    clt = mi.load_dictionary(clt_dir)
    print(clt)

    ids = model.to_tokens(PROMPT, prepend_bos=True)
    acts, _ = clt.encode_model(model, ids)  # [n_layers, seq, d_features]
    toks = model.to_str_tokens(ids)
    print(f"\nactive features per position (all layers): {(acts != 0).sum((0, 2)).tolist()}")
    top = clt.top_k(acts, args.k)
    for pos, feats in enumerate(top):
        shown = ", ".join(f"L{f.layer}#{f.index}={v:.2f}" for f, v in feats)
        print(f"{pos:3d} {toks[pos]!r:>12}: {shown}")

    strongest = max((fv for row in top for fv in row), key=lambda fv: fv[1])[0]
    vecs = clt.decoder_vectors(strongest)  # [n_targets, d_model]
    print(f"\n{strongest}: decoder vectors at layers {list(clt.target_layers(strongest.layer))}, "
          f"norms {[round(float(n), 3) for n in vecs.norm(dim=-1)]}")

    spec = mi.HookSpec().capture_all(clt.output_hook(i) for i in range(clt.n_layers))
    with torch.no_grad():
        cache = model.forward(ids, spec)
    target = torch.stack([cache[clt.output_hook(i)][0] for i in range(clt.n_layers)])
    recon = clt.decode(acts)
    fvu = ((recon - target)[:, 1:].pow(2).sum((-1, -2))
           / (target[:, 1:] - target[:, 1:].mean(1, keepdim=True)).pow(2).sum((-1, -2)))
    print("fraction of MLP-output variance unexplained per layer:",
          [round(float(x), 2) for x in fvu])


if __name__ == "__main__":
    main()

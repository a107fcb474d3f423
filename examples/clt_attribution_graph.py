"""An attribution graph (circuit-tracer style) for SmolLM2 + a CLT, as viewer JSON and PNG.

    python examples/clt_attribution_graph.py [--gguf PATH] [--clt DIR] [--max-feature-nodes 300]
        [--out DIR]

The local replacement model freezes attention patterns and norm scales and replaces each
MLP output by the CLT reconstruction plus an error node; ``attribute`` computes every
direct effect between active features, error nodes, token embeddings and the top logits
with batched backward passes, then the graph is pruned by influence. Outputs:
``graph.json`` (circuit-tracer's graph-file schema, for its viewer), ``graph.png``, and the
replacement / completeness scores. With no --clt, a data-initialised random CLT is built.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import mi_core as mi
from _load import gguf_parser
from mi_clt.attribution import attribute
from mi_clt.synthetic import build_clt

PROMPT = "The capital of the state containing Dallas is"


def main() -> None:
    ap = gguf_parser(__doc__.splitlines()[0])
    ap.add_argument("--clt", default=None)
    ap.add_argument("--max-feature-nodes", type=int, default=300)
    ap.add_argument("--out", default="clt_graph_out")
    args = ap.parse_args()
    # the CLT built here is ~1 GB: removed when main returns (or at exit)
    scratch = tempfile.TemporaryDirectory(prefix="mi-clt-example-")

    model = mi.MIModel.from_pretrained(args.gguf)
    ids = model.to_tokens(PROMPT, prepend_bos=True)
    clt_dir = args.clt or build_clt(model, [ids], Path(scratch.name) / "clt",
                                    d_features=1024, n_active=6)
    clt = mi.load_dictionary(clt_dir)
    g = attribute(model, clt, ids, max_n_logits=5, desired_logit_prob=0.9,
                  max_feature_nodes=args.max_feature_nodes, batch_size=64, verbose=True)
    replacement, completeness = g.scores()
    res = g.prune(node_threshold=0.8, edge_threshold=0.98)
    print(f"{g.n_features} feature nodes, {g.adjacency.shape[0]} nodes in all; logits "
          f"{list(zip(g.logit_strings, [round(float(p), 3) for p in g.logit_probabilities]))}")
    print(f"pruned: {int(res.node_mask.sum())} nodes, {int(res.edge_mask.sum())} edges; "
          f"replacement {replacement:.3f}, completeness {completeness:.3f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    g.to_viewer_json(out / "graph.json", slug="smollm2-dallas")
    g.save_png(out / "graph.png")
    print("wrote", out / "graph.json", out / "graph.png")


if __name__ == "__main__":
    main()

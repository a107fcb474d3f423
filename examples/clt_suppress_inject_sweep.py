"""The "Planning in Poems" Figure 13 protocol on SmolLM2: suppress, inject, sweep position.

    python examples/clt_suppress_inject_sweep.py [--gguf PATH] [--strength 8] [--out DIR]

Anthropic suppress the model's planned rhyme feature and inject another one, then move the
injection over every position of the prompt and record the probability of the injected
word at the end of the line: it peaks at the planning site (the newline). Here the CLT is
built by the example (mi_clt.synthetic.build_clt) with two planted features whose
decoders point along the unembedding of " rabbit" (suppressed) and " habit" (injected);
the rest is the real protocol: ``suppression_injections`` removes the suppressed
feature's measured contribution, ``position_sweep`` batches one forward per chunk of
positions. With a synthetic CLT this shows the mechanics, not the paper's finding.
"""

from __future__ import annotations

import tempfile
from pathlib import Path


import mi_core as mi
from _load import gguf_parser
from mi_core.dictionaries import CltFeatureId
from mi_clt.interventions import position_sweep
from mi_clt.synthetic import build_clt

PROMPT = "He saw a carrot and had to grab it,\nHis hunger was like a starving"


def main() -> None:
    ap = gguf_parser(__doc__.splitlines()[0])
    ap.add_argument("--layer", type=int, default=12, help="source layer of the planted features")
    ap.add_argument("--strength", type=float, default=8.0)
    ap.add_argument("--out", default=None, help="directory for sweep.png / sweep.json")
    args = ap.parse_args()
    # the CLT built here is ~1 GB: removed when main returns (or at exit)
    scratch = tempfile.TemporaryDirectory(prefix="mi-clt-example-")

    model = mi.MIModel.from_pretrained(args.gguf)
    tok = model.tokenizer
    rabbit, habit = tok.encode(" rabbit")[-1], tok.encode(" habit")[-1]
    w_u = model.backend.get_weight("W_U")  # [d_model, vocab]
    centred = lambda t: w_u[:, t] - w_u.mean(-1)  # noqa: E731
    planted = {(args.layer, 0): centred(rabbit), (args.layer, 1): centred(habit)}
    ids = model.to_tokens(PROMPT, prepend_bos=True)
    clt_dir = build_clt(model, [ids], Path(scratch.name) / "clt", d_features=512,
                        n_active=8, planted=planted)
    clt = mi.load_dictionary(clt_dir)

    # suppress: the features (active anywhere) whose decoders push " rabbit" the most
    acts, _ = clt.encode_model(model, ids)
    from mi_clt.attribution import score_features_by_decoder_projection
    scored = score_features_by_decoder_projection(clt, centred(rabbit), clt.n_layers - 1,
                                                  cosine=True)
    active = {CltFeatureId(int(l), int(i)) for l, _, i in acts.nonzero().tolist()}
    suppress = [e.source for e in scored.edges if e.source in active][:3]
    print("suppressing", suppress)

    res = position_sweep(model, clt, ids, target_token=habit,
                         inject=[(CltFeatureId(args.layer, 1), args.strength)], suppress=suppress)
    toks = model.to_str_tokens(ids)
    print(f"P(' habit') clean {res.baseline_probability:.4f}, suppressed "
          f"{res.suppressed_probability:.4f}")
    for p, prob in zip(res.positions, res.probabilities):
        print(f"  inject at {p:2d} {toks[p]!r:>12}: {prob:.4f}")
    print(f"best position: {res.best_position} ({toks[res.best_position]!r})")
    if args.out:
        from mi_core.serialize import to_json

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        to_json(res, out / "sweep.json")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(9, 3))
        ax.bar(res.positions, res.probabilities)
        ax.set_xticks(res.positions, [repr(t)[1:-1] for t in toks], rotation=60, fontsize=7)
        ax.set_ylabel("P(' habit') at the end")
        fig.tight_layout()
        fig.savefig(out / "sweep.png", dpi=100)
        print("wrote", out / "sweep.json", out / "sweep.png")


if __name__ == "__main__":
    main()

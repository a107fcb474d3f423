"""Where is sentiment linearly readable in SmolLM2-135M? A layer sweep, then steering.

    python examples/probing_smollm2.py [--gguf PATH] [--data FILE] [--position last]
        [--out DIR]

Probes the residual stream after every layer on the committed sentiment set
(tests/probing/data/sentiment.jsonl: 30 positive / 30 negative one-sentence reviews),
5-fold cross-validated, each accuracy beside its shuffled-label baseline. Writes
``sweep.json`` and ``sweep.png`` to --out. Then it takes the probe direction at the best
middle layer and steers along it: the interp toolkit's dose-response on one negative
prompt (KL and logit change of " good"), and the mean readout of the last layer's probe
over the negative prompts as the strength grows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import mi_core as mi
from _load import gguf_parser
from mi_core.interp import dose_response
from mi_core.serialize import to_json
from mi_probing import (
    Position,
    collect_activations,
    layer_hooks,
    load_jsonl,
    plot_sweep,
    probe_activations,
    probe_direction,
    probe_steering_spec,
    steering_hooks,
)

DATA = Path(__file__).resolve().parent.parent / "tests" / "probing" / "data" / "sentiment.jsonl"


def main() -> None:
    ap = gguf_parser(__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--position", default="last")
    ap.add_argument("--out", default="probing_out")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    model = mi.MIModel.from_pretrained(args.gguf)
    data = load_jsonl(args.data)
    hooks = layer_hooks(model)  # blocks.{i}.hook_resid_post for every layer
    acts = collect_activations(model, data.texts, hooks, position=args.position, batch_size=30)
    sweep = probe_activations(acts, list(data.labels), model_name=args.gguf, data=args.data,
                              n_shuffles=5)
    to_json(sweep, out / "sweep.json")
    plot_sweep(sweep, out / "sweep.png")
    print(f"accuracy per layer ({sweep.probes[0].split}; shuffled-label baseline):")
    for c in sweep.curve:
        print(f"  layer {c.layer:2d}  {c.value:.3f} ±{c.std:.3f}   ({c.baseline:.3f})")

    # steer along the best probe in the first two thirds of the network
    cut = 2 * model.num_layers // 3
    middle = [p for p in sweep.probes if p.layer is not None and p.layer < cut]
    probe = max(middle, key=lambda p: p.score().value)
    last = sweep.probes[-1]
    print(f"\nsteering along the {probe.hook} probe (accuracy {probe.score().value:.3f}, "
          f"classes {probe.classes}; mean activation norm {probe.mean_norm:.1f})")
    negative = [t for t, lab in zip(data.texts, data.labels) if lab == "negative"]
    curve = dose_response(model, negative[0], probe_steering_spec(probe), [-16, -8, 0, 8, 16],
                          target=" good")
    print(f"  {negative[0]!r}: strength -> KL, logit change of ' good'")
    for pt in curve.points:
        print(f"    {pt.strength:+6.1f}  KL {pt.kl_divergence:.4f}  "
              f"Δlogit {pt.target_logit_diff:+.3f}")

    u = probe_direction(probe)
    ids, mask = model.to_tokens_padded(negative, side="right")
    print(f"  mean {last.hook} probe logit (positive vs negative) on {len(negative)} "
          "negative prompts:")
    for alpha in (-16, -8, 0, 8, 16):
        spec = steering_hooks(u, probe.hook, alpha).capture(last.hook)
        cache = model.forward(ids, spec, attention_mask=mask)
        feats = Position.parse(args.position).reduce(cache[last.hook], mask)
        print(f"    {alpha:+4d}  {float(np.mean(last.decision_function(feats))):+.3f}")
    print(f"\nwrote {out / 'sweep.json'} and {out / 'sweep.png'}")


if __name__ == "__main__":
    main()

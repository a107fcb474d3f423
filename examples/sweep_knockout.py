"""A resumable knockout sweep in the style of the seed's replications, at small scale.

    python examples/sweep_knockout.py [--gguf PATH] [--out DIR] [--prompts N]
                                      [--executor local|processes]

For each factual prompt ("The capital of France is" -> " Paris") and each layer, knock out
the last token's attention to the subject token in that one layer and record how much the
answer's logit drops: 6 prompts x 30 layers = 180 conditions, each a job of
``mi.run_sweep``. The first run is interrupted (a simulated Ctrl-C after a few batches);
the second run of the same call resumes and computes only what is missing. The aggregate
(mean and spread over prompts, per layer) is written as aggregate.json and a picture.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

import mi_core as mi
from mi_core.scale.analyses import aggregate, plot_aggregate

FACTS = [("The capital of France is", "France", " Paris"),
         ("The capital of Germany is", "Germany", " Berlin"),
         ("The capital of Italy is", "Italy", " Rome"),
         ("The capital of Japan is", "Japan", " Tokyo"),
         ("The capital of Spain is", "Spain", " Madrid"),
         ("The capital of Egypt is", "Egypt", " Cairo")]

#: simulate an interruption: raise KeyboardInterrupt after this many batches (None: never)
INTERRUPT_AFTER: int | None = None
_batches_seen = 0


def knockout_batch(model: mi.MIModel, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One forward per prompt for all the layers of that prompt in `jobs`: row r knocks out
    last -> subject in layer jobs[r]["layer"] only (the mask is -inf in that row and layer)."""
    global _batches_seen
    _batches_seen += 1
    if INTERRUPT_AFTER is not None and _batches_seen > INTERRUPT_AFTER:
        raise KeyboardInterrupt  # what Ctrl-C would do mid-sweep
    out: dict[int, dict[str, Any]] = {}
    for prompt in dict.fromkeys(j["prompt"] for j in jobs):
        rows = [i for i, j in enumerate(jobs) if j["prompt"] == prompt]
        ids = model.to_tokens(prompt)
        toks = model.to_str_tokens(ids[0])
        subject = next(i for i, t in enumerate(toks) if jobs[rows[0]]["subject"] in t)
        answer = model.tokenizer.encode(jobs[rows[0]]["answer"], add_special_tokens=False)[0]
        base = model.forward(ids).output[0, -1].float()
        hooks = mi.HookSpec()
        seq, heads = ids.shape[1], model.num_heads
        for r, i in enumerate(rows):
            mask = torch.zeros(len(rows), heads, seq, seq, dtype=model.dtype)
            mask[r, :, seq - 1, subject] = float("-inf")
            hooks.intervene(mi.HookPoint.attn_scores(jobs[i]["layer"]), mi.Knockout(mask))
        logits = model.forward(ids.expand(len(rows), -1), hooks).output[:, -1].float()
        for r, i in enumerate(rows):
            out[i] = {"logit_diff": float(logits[r, answer] - base[answer]),  # knocked out - baseline
                      "kl": mi.kl_divergence(base, logits[r])}
    return [out[i] for i in range(len(jobs))]


def main(model: Any = None, prompts: int = len(FACTS), out: str | None = None,
         executor: str = "local", interrupt_after: int | None = 3) -> dict[str, Any]:
    global INTERRUPT_AFTER, _batches_seen
    if model is None:
        from _load import default_gguf
        model = str(default_gguf())
    if not isinstance(model, mi.MIModel):
        loaded = mi.MIModel.from_pretrained(model)
        n_layers = loaded.num_layers
        model = loaded if executor == "local" else model  # workers load their own
    n_layers = model.num_layers if isinstance(model, mi.MIModel) else n_layers
    if executor != "local":
        interrupt_after = None  # the simulated Ctrl-C lives in this process only
    outdir = Path(out or tempfile.mkdtemp(prefix="sweep_knockout_"))
    jobs = [{"prompt": p, "subject": s, "answer": a, "layer": layer}
            for p, s, a in FACTS[:prompts] for layer in range(n_layers)]
    store = outdir / "store"
    kw = dict(model=model, store=store, executor=executor, batch_size=10)

    INTERRUPT_AFTER, _batches_seen = interrupt_after, 0
    try:
        mi.run_sweep(knockout_batch, jobs, **kw)
    except KeyboardInterrupt:
        pass
    first = len(mi.load_sweep(store).results())
    print(f"interrupted: {first} of {len(jobs)} conditions recorded in {store}")

    INTERRUPT_AFTER, _batches_seen = None, 0
    run = mi.run_sweep(knockout_batch, jobs, **kw)
    resumed_batches = _batches_seen
    print(f"resumed: {len(run.results())} of {len(jobs)} conditions done, "
          f"{len(run.failed())} failed")

    per_prompt = [[0.0] * n_layers for _ in FACTS[:prompts]]
    for job, res in run.results():
        per_prompt[[f[0] for f in FACTS].index(job["prompt"])][job["layer"]] = res["logit_diff"]
    agg = aggregate("knockout", [{"layers": list(range(n_layers)), "heads": None,
                                  "logit_diff": row, "kl": row} for row in per_prompt])
    agg.pop("kl_mean"), agg.pop("kl_std")
    agg["metric"] = "answer logit change (knocked out - baseline)"
    (outdir / "aggregate.json").write_text(json.dumps(agg, indent=1))
    png = plot_aggregate(agg, outdir / "aggregate.png", title=f"knockout of last -> subject "
                         f"attention, one layer at a time ({prompts} prompts)")
    peak = min(range(n_layers), key=lambda i: agg["mean"][i])
    print(f"largest mean drop at layer {peak}: {agg['mean'][peak]:+.3f} "
          f"(std {agg['std'][peak]:.3f} over {prompts} prompts); picture: {png}")
    return {"conditions": len(jobs), "first_run": first, "resumed_batches": resumed_batches,
            "mean": agg["mean"], "peak_layer": peak, "png": str(png), "run": run}


if __name__ == "__main__":
    import argparse

    from _load import default_gguf

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=str(default_gguf()), help="model (default: SmolLM2)")
    ap.add_argument("--out", default=None, help="output directory (default: a temporary one)")
    ap.add_argument("--prompts", type=int, default=len(FACTS), help="number of prompts (<= 6)")
    ap.add_argument("--executor", default="local", choices=["local", "processes"])
    args = ap.parse_args()
    main(args.gguf, args.prompts, args.out, args.executor)

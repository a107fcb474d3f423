"""``mi sweep`` (a built-in analysis over a JSONL file of prompts, as a resumable sweep) and
``mi cache-activations`` (the activation store). Both take ``--executor``.

Usage errors exit 2 with ``mi: error: ...`` on stderr; runtime errors exit 1 (mi.main).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from mi_cli import args as A
from mi_cli.hookspecs import command_impl
from mi_cli.models import default_model_path

PROMPT_FIELDS = ("prompt", "answer", "incorrect", "corrupt")
#: the built-in analyses of ``mi sweep`` (mi_core.scale.analyses.ANALYSES; a test checks)
ANALYSES = ("knockout", "patching", "logit-lens", "steering")


def read_prompts(path: str | Path, analysis: str) -> list[dict[str, Any]]:
    """The prompts of a JSONL file: one object per line with "prompt" and, as the analysis
    needs, "answer", "incorrect", "corrupt". ConfigError naming the file and line."""
    from mi_core import ConfigError
    from mi_core.scale.analyses import REQUIRED

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such prompts file")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{path}:{n}: not JSON ({exc})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise ConfigError(f"{path}:{n}: each line must be an object with a \"prompt\" string")
        missing = [k for k in REQUIRED[analysis] if not isinstance(obj.get(k), str)]
        if missing:
            raise ConfigError(f"{path}:{n}: the {analysis} analysis needs the string field(s) "
                              f"{', '.join(missing)}")
        unknown = sorted(set(obj) - set(PROMPT_FIELDS))
        if unknown:
            raise ConfigError(f"{path}:{n}: unknown field(s) {unknown}; known: {list(PROMPT_FIELDS)}")
        rows.append({k: obj.get(k) for k in PROMPT_FIELDS})
    if not rows:
        raise ConfigError(f"{path}: no prompts")
    return rows


def _params(args: argparse.Namespace) -> dict[str, Any]:
    p: dict[str, Any] = {"layers": args.layers or None}
    if args.analysis == "knockout":
        p.update(per_head=bool(args.per_head), to=args.to or None)
    elif args.analysis == "patching":
        p.update(kind=args.kind)
    elif args.analysis == "steering":
        p.update(to=args.to or None, strengths=args.strengths)
    return p


def _cmd_sweep(args: argparse.Namespace) -> int:
    from mi_core import ConfigError
    from mi_core.scale._fs import StoreDir
    from mi_core.scale.analyses import JOB_FNS, hooks_needed
    from mi_core.scale.sweep import run_sweep

    prompts = read_prompts(args.prompts, args.analysis)
    params = _params(args)
    jobs = [{"index": i, **row, "analysis": args.analysis, "params": params}
            for i, row in enumerate(prompts)]
    model = args.model or default_model_path()
    if model is None:
        raise ConfigError("no --model given and no embedded default model is installed")
    out = Path(args.out)
    # OUT's own files, like the store's, are written inside it and never through a link
    with StoreDir(out, create=True) as odir:
        for name in ("results.json", "aggregate.json", "aggregate.png"):
            odir.is_file(name)  # a link planted there: refused before any compute
        run = run_sweep(JOB_FNS[args.analysis], jobs, model=model, store=out / "store",
                        executor=args.executor, retries=args.retries, overwrite=args.overwrite,
                        hooks=hooks_needed(args.analysis, layers=params.get("layers")),
                        workers=args.workers, address=args.address, device=args.device,
                        model_dtype=str(args.dtype).removeprefix("torch."),
                        progress=None if not args.no_progress else False)
        done, failed = run.results(), run.failed()
        per_prompt = {"analysis": args.analysis, "model": str(model), "params": params,
                      "results": [{"index": j["index"], "prompt": j["prompt"],
                                   "answer": j["answer"], "result": r} for j, r in done],
                      "failed": [{"index": j["index"], "prompt": j["prompt"], "error": e}
                                 for j, e in failed]}
        odir.write_atomic("results.json", (json.dumps(per_prompt, indent=1) + "\n").encode())
        print(f"{args.analysis}: {len(done)}/{len(jobs)} prompts done, {len(failed)} failed "
              f"(store {out / 'store'})")
        _write_aggregate(args, odir, [r for _, r in done], model)
    for j, e in failed[:5]:
        print(f"mi: warning: prompt {j['index']} failed: {e.splitlines()[0]}", file=sys.stderr)
    return 0 if not failed else 1


def _write_aggregate(args: argparse.Namespace, odir: Any, results: list[Any],
                     model: Any) -> None:
    """OUT/aggregate.json and the picture (OUT/aggregate.png unless --plot), with the
    largest means on stdout. A knockout's effect is reported in log-probability first
    (shift-invariant), with the raw logit change beside it in the picture."""
    from mi_core.scale.analyses import aggregate
    from mi_core.util.plot import plot_sweep_aggregate

    agg = aggregate(args.analysis, results)
    if agg.get("n"):
        from mi_core.interp.describe import model_label

        agg["model"] = model_label(model)
    odir.write_atomic("aggregate.json", (json.dumps(agg, indent=1) + "\n").encode())
    if not agg.get("n"):
        return
    lp = args.analysis == "knockout" and "logprob_mean" in agg
    mean = agg["logprob_mean"] if lp else agg["mean"]
    metric = "answer log-prob change in nats (knocked out - baseline)" if lp else agg["metric"]
    flat = [(agg["rows"][i], m if not isinstance(m, list) else max(m, key=abs))
            for i, m in enumerate(mean)]
    top = sorted(flat, key=lambda t: -abs(t[1]))[:5]
    print(f"largest mean {metric} by {agg['row_label']}: " +
          ", ".join(f"{r}: {v:+.4g}" for r, v in top))
    if args.plot:
        plot = plot_sweep_aggregate(agg, Path(args.plot))
    else:  # drawn aside, then written into OUT like the other files
        plot = odir.file("aggregate.png")
        with tempfile.TemporaryDirectory(prefix="mi-sweep-") as tmp:
            odir.write_atomic("aggregate.png",
                              plot_sweep_aggregate(agg, Path(tmp) / "aggregate.png").read_bytes())
    print(f"wrote {odir.file('results.json')}, {odir.file('aggregate.json')}, {plot}")


def read_texts(path: str | Path) -> list[str]:
    """Texts of a file: JSONL (objects with "text", or strings) when it ends in .jsonl, else
    one text per non-empty line."""
    from mi_core import ConfigError

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such input file")
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if path.suffix != ".jsonl":
        return lines
    texts = []
    for n, line in enumerate(lines, 1):
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{path}:{n}: not JSON ({exc})") from None
        text = obj.get("text") if isinstance(obj, dict) else obj
        if not isinstance(text, str):
            raise ConfigError(f"{path}:{n}: expected a string or an object with a \"text\" string")
        texts.append(text)
    return texts


def _cmd_cache(args: argparse.Namespace) -> int:
    import torch

    from mi_core import ConfigError
    from mi_core.scale.activations import cache_activations

    texts = read_texts(args.input)
    model = args.model or default_model_path()
    if model is None:
        raise ConfigError("no --model given and no embedded default model is installed")
    hooks = [h.strip() for h in args.hooks.split(",") if h.strip()]
    from mi_cli.preflight import check_hook_names, checkpoint_info

    dims = checkpoint_info(args.model)
    check_hook_names(hooks, "--hooks", dims.num_layers if dims is not None else None)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    store = cache_activations(model, texts, hooks, args.out, context_len=args.context_len,
                              batch_size=args.batch_size, tokens_per_shard=args.tokens_per_shard,
                              executor=args.executor, dtype=dtype, overwrite=args.overwrite,
                              workers=args.workers, address=args.address, device=args.device,
                              progress=None if not args.no_progress else False)
    rep = store.report
    print(f"wrote {store.directory}: {rep.tokens} tokens x {len(hooks)} hook(s) in "
          f"{rep.shards} shards ({rep.shards_done_before} were already there), "
          f"{rep.planned_bytes / 2**20:.1f} MiB, {rep.seconds:.1f} s")
    return 0


def _executor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, type=A.model_source, metavar="PATH",
                   help="checkpoint: directory, hub id or .gguf (default: the embedded model); "
                   "each worker loads its own")
    p.add_argument("--device", default="cpu", type=A.device,
                   help="torch device of the model (default cpu; Ray actors use cuda when the "
                   "cluster has GPUs)")
    p.add_argument("--executor", default="local", choices=["local", "processes", "ray"],
                   help="where the forwards run: this process (default), a pool of worker "
                   "processes, or Ray actors")
    p.add_argument("--workers", type=A.positive_int, default=None,
                   help="worker processes / Ray actors (default: processes min(4, CPUs); Ray "
                   "one per GPU, else one per CPU)")
    p.add_argument("--address", default=None,
                   help="Ray cluster address for --executor ray (default: RAY_ADDRESS, else "
                   "a local Ray)")
    p.add_argument("--overwrite", action="store_true",
                   help="discard an existing store written with another model / settings")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress (it is on stderr: a redrawn line on a terminal, a line "
                   "per step when piped; -q also silences it)")
    A.output_options(p)


@command_impl
def mi_register_commands(subparsers: "argparse._SubParsersAction[Any]") -> None:
    """Add ``mi sweep`` and ``mi cache-activations`` to the ``mi`` parser."""
    register(subparsers)


def register(sub: "argparse._SubParsersAction[Any]") -> None:
    """Add ``mi sweep`` and ``mi cache-activations`` to `sub`."""
    p = sub.add_parser("sweep", help="run knockout / patching / logit-lens / steering over a "
                "JSONL file of prompts as a resumable sweep; per-prompt results, aggregates "
                "and a picture",
                description="Each line of PROMPTS is {\"prompt\": ..., \"answer\": ..., "
                "\"incorrect\": ..., \"corrupt\": ...} (answer: a single token, default the "
                "model's top-1; patching needs corrupt, answer and incorrect). Re-running the "
                "same command resumes. Writes OUT/store/ (the sweep store), "
                "OUT/results.json, OUT/aggregate.json and OUT/aggregate.png.")
    p.add_argument("prompts", help="JSONL file of prompts")
    p.add_argument("--analysis", required=True, choices=ANALYSES, help="which analysis to run")
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--layers", type=A.int_list, default=None, help="layers, e.g. 8, 4-10, 1,3 (default: all)")
    p.add_argument("--per-head", action="store_true",
                   help="knockout: one condition per (layer, head) instead of per layer")
    p.add_argument("--to", type=A.int_list, default=None,
                   help="knockout: key positions the last token stops attending to (default: "
                   "all earlier); steering: positions it attends more to (default: 0)")
    p.add_argument("--kind", default="z",
                   choices=["z", "resid_pre", "resid_post", "attn_out", "mlp_out"],
                   help="patching: what to patch (z: per head; others per position, "
                   "aggregated at the last position)")
    p.add_argument("--strengths", type=A.float_list, default=[0.0, 0.5, 1.0, 2.0, 4.0],
                   help="steering: comma-separated attention scales")
    p.add_argument("--retries", type=A.nonneg_int, default=1,
                   help="retries of a failing prompt (default: %(default)s)")
    p.add_argument("--plot", default=None, type=A.picture_path,
                   help="picture path, .png/.svg/.pdf (default OUT/aggregate.png)")
    p.add_argument("--dtype", default="float32", type=A.dtype,
                   metavar="{" + ",".join(A.DTYPES) + "}",
                   help="dtype the model is loaded in (default: %(default)s)")
    _executor_args(p)
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser("cache-activations", help="store the activations of hook points over a "
                "text corpus in safetensors shards (resumable)",
                description="Texts are tokenized, concatenated and cut into rows of "
                "--context-len tokens; activations are stored per token. Re-running the same "
                "command writes only the missing shards. Read the store with "
                "mi_core.ActivationStore(OUT).batches(hook, batch_size, shuffle, seed).")
    p.add_argument("input", help="texts: a .jsonl file (objects with \"text\", or strings) or "
                   "a text file with one text per line")
    p.add_argument("--hooks", required=True,
                   help="comma-separated hook points, e.g. blocks.6.hook_resid_post")
    p.add_argument("--out", required=True, help="store directory (created)")
    p.add_argument("--context-len", type=A.positive_int, default=128,
                   help="tokens per row (default 128)")
    p.add_argument("--batch-size", type=A.positive_int, default=32,
                   help="rows per forward (default 32)")
    p.add_argument("--tokens-per-shard", type=A.positive_int, default=2**20,
                   help="tokens per safetensors shard (default 1048576)")
    p.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                   help="storage dtype (default: the model's)")
    _executor_args(p)
    p.set_defaults(func=_cmd_cache)

"""``mi probe``: probe a model's hook points on a labelled JSONL file.

Registered with the ``mi`` command through the ``mi_cli`` entry-point group; nothing heavy is
imported until the command runs (``mi --help`` stays instant).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mi_cli import plugin as cli
from mi_cli.plugin import command_impl

POSITION_HELP = "token whose activation is probed: last, mean (over real tokens) or an index"


@command_impl
def mi_register_commands(subparsers: "argparse._SubParsersAction[Any]") -> None:
    add_probe_parser(subparsers)


def add_probe_parser(subparsers: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "probe", help="train linear probes on a model's activations for a labelled dataset",
        description="Train a linear probe per hook point on a JSONL file of "
                    '{"text": ..., "label": ...} lines and report accuracy, balanced accuracy, '
                    "AUROC (classification) or R² (regression) beside shuffled-label baselines.")
    p.add_argument("--model", default=None, type=cli.model_source, metavar="PATH",
                   help="model directory, .gguf file or hub id (default: the embedded model "
                   "a plugin provides, as every mi command)")
    p.add_argument("--data", required=True, help="JSONL file, one {text, label} object a line")
    p.add_argument("--hook", action="append", required=True, metavar="NAME",
                   help="hook point to probe; repeat for several; shell wildcards sweep "
                        "layers, e.g. 'blocks.*.hook_resid_post'")
    p.add_argument("--position", default="last", help=POSITION_HELP + " (default: last)")
    p.add_argument("--json", required=True, metavar="OUT", help="write the results here (JSON)")
    p.add_argument("--plot", metavar="OUT", type=cli.picture_path,
                   help="also save the metric-vs-hook curve (.png, .svg or .pdf)")
    p.add_argument("--task", default="auto", choices=["auto", "classification", "regression"],
                   help="probe kind; auto: regression when the labels are numbers with a "
                        "non-integer among them, else classification (default: auto)")
    split = p.add_mutually_exclusive_group()
    split.add_argument("--cv", type=cli.positive_int, default=None,
                       help="k-fold cross-validation (default 5)")
    split.add_argument("--test-size", type=float, default=None,
                       help="one held-out split of this fraction instead of CV")
    p.add_argument("--shuffles", type=cli.nonneg_int, default=5,
                   help="shuffled-label baseline runs per probe (default 5)")
    p.add_argument("--reg", type=float, default=1.0,
                   help="L2: C for logistic regression, alpha for ridge (default 1.0)")
    p.add_argument("--no-standardize", action="store_true", help="probe raw activations")
    p.add_argument("--batch-size", type=cli.positive_int, default=16,
                   help="prompts per forward pass (default 16)")
    p.add_argument("--save-activations", metavar="DIR",
                   help="stream the collected activations to DIR as safetensors shards")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the folds and the shuffled labels (default 0)")
    p.add_argument("--device", default="cpu", type=cli.device,
                   help="torch device: cpu (default), cuda, cuda:N, mps")
    p.add_argument("--dtype", default="float32", type=cli.dtype,
                   metavar="{" + ",".join(cli.DTYPES) + "}",
                   help="dtype of the weights and activations (default: float32)")
    cli.output_options(p)
    p.set_defaults(func=run_probe)
    return p


def run_probe(args: argparse.Namespace) -> int:
    import mi_core as mi
    from mi_probing.collect import Position
    from mi_probing.data import load_jsonl
    from mi_probing.errors import ProbingError
    from mi_probing.sweep import check_dataset, expand_hooks, probe_model

    position = Position.parse(args.position)
    if args.shuffles < 0:
        raise ProbingError(f"--shuffles must be >= 0, got {args.shuffles}")
    dataset = load_jsonl(args.data)  # data errors before the (slow) model load
    check_dataset(dataset, task=args.task, cv=args.cv, test_size=args.test_size)
    model = cli.load(args)
    hooks = expand_hooks(model, args.hook)
    result = probe_model(model, dataset, hooks, position=position, batch_size=args.batch_size,
                         out_dir=args.save_activations, task=args.task, cv=args.cv,
                         test_size=args.test_size,
                         regularization=args.reg, standardize=not args.no_standardize,
                         n_shuffles=args.shuffles, seed=args.seed)
    mi.to_json(result, args.json)
    if args.plot:
        from mi_probing.plot import plot_sweep

        plot_sweep(result, args.plot)
    m = result.metric
    print(f"{result.n_samples} prompts, {result.task}, {result.probes[0].split}, "
          f"position {result.position}; {m} (shuffled-label baseline, chance):")
    for c in result.curve:
        base = "-" if c.baseline is None else f"{c.baseline:.3f}"
        print(f"  {c.hook:40s} {c.value:.3f} ±{c.std:.3f}  ({base}, {c.chance:.3f})")
    best = result.best()
    print(f"best: {best.hook} {m}={best.score().value:.3f}; wrote {args.json}"
          + (f" and {args.plot}" if args.plot else ""), file=sys.stdout)
    return 0

"""The analysis subcommands: ``mi demo``, ``mi run``, ``mi logit-lens``, ``mi knockout``,
``mi patch``, ``mi attention``, ``mi steer``, ``mi heads``.

Each takes ``--model`` (path, hub id or .gguf; default: the embedded default model a plugin
provides), ``--device``, ``--dtype``, ``--prompt``, ``--json OUT`` (the result as JSON,
readable back with ``mi_core.from_json``; raw logits only with ``--raw``) and ``--plot OUT``
(.png, .svg or .pdf: a picture; .html: a self-contained interactive page). Effects are
reported intervened − baseline (``mi_core.interp.effects``). The analyses, torch and the
pictures are imported when a command runs, never while the command line is parsed.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from mi_cli import args as A
from mi_cli.hookspecs import command_impl
from mi_cli.models import model_name, model_options
from mi_cli.output import console, html_of, num, write_json, write_plot


def _load(args: argparse.Namespace) -> Any:
    """The model, with the arguments checked against it before its weights load."""
    from mi_cli.preflight import load_checked

    return load_checked(args)


def print_demo(r: Any) -> None:
    from mi_cli.demo import format_demo

    console.say(format_demo(r))


def _cmd_demo(args: argparse.Namespace) -> int:
    from mi_cli.demo import demo

    model = _load(args)
    r = demo(model, args.prompt, args.k)
    print_demo(r)
    write_json(args.json_out, r, args.raw)
    if args.plot_out:
        from mi_core.interp.logit_lens import LogitLensAnalysis
        from mi_core.util.plot import plot_logit_lens

        lens = LogitLensAnalysis(k=min(5, model.vocab_size)).run(model, args.prompt)
        write_plot(args.plot_out, lambda p: plot_logit_lens(
            lens, p, title=_lens_title(model, args, lens)), html=_lens_html(model, args, 5))
    return 0


# -- single analyses -------------------------------------------------------------------

def _lens_title(model: Any, args: argparse.Namespace, r: Any) -> str:
    tok = r.prompt_tokens[r.position] if r.prompt_tokens else str(r.position)
    targets = ", ".join(repr(t) for t in getattr(args, "target", None) or [])
    return (f"logit lens, {model_name(model)}\nprompt {args.prompt!r}: next-token prediction "
            f"after token {r.position} {tok!r}, read after every layer"
            + (f"\ntracking {targets}: probability and rank (1 = top)" if targets else ""))


def _lens_html(model: Any, args: argparse.Namespace, k: int) -> Callable[[Path], Any]:
    from mi_core.interp.lens_grid import logit_lens_grid

    def write(path: Path) -> Any:
        grid = logit_lens_grid(model, args.prompt, k=min(k, model.vocab_size),
                               include_mid=getattr(args, "mid", False),
                               targets=getattr(args, "target", None) or [])
        return grid.to_html(path)
    return write


def _cmd_logit_lens(args: argparse.Namespace) -> int:
    from mi_core.interp.logit_lens import LogitLensAnalysis
    from mi_core.util.plot import plot_logit_lens

    model = _load(args)
    r = LogitLensAnalysis(k=min(args.k, model.vocab_size), include_mid=args.mid,
                          targets=args.target or []).run(model, args.prompt, args.position)
    text = r.format_table()
    console.say(text)
    write_json(args.json_out, r, args.raw)
    write_plot(args.plot_out, lambda p: plot_logit_lens(r, p, title=_lens_title(model, args, r)),
               html=_lens_html(model, args, args.k))
    return 0


def describe_knockout(spec: Any, tokens: Any = None) -> str:
    """"layers 0-2, all heads; removed edges query → key: 4 ' is' → 0 'The'" for a
    KnockoutSpec (token names when the prompt's `tokens` are given)."""
    from mi_core.interp.describe import describe_knockout as describe

    return describe(spec, tokens)


def format_knockout(r: Any, k: int) -> str:
    s = r.summary
    b = s.baseline_top
    lines = [f"attention knockout, {r.model or 'model'}: {r.describe()}",
             "effects are knocked out - baseline (log p and p are shift-invariant; logit is "
             "the raw difference)",
             f"  KL(baseline || knocked out) = {num(s.kl_divergence, '.5f')} nats",
             f"  baseline top-1 {b.token!r}: p {b.baseline_prob:.4f} -> {b.intervened_prob:.4f}, "
             f"log p {num(b.logprob_diff, '+.4f')}, logit {num(b.logit_diff, '+.4f')}",
             "most changed tokens:",
             f"  {'token':>16}  {'p before':>8}  {'p after':>8}  {'dp':>8}  {'dlog p':>8}  "
             f"{'dlogit':>8}"]
    lines += [f"  {c.token!r:>16}  {c.baseline_prob:8.4f}  {c.intervened_prob:8.4f}  "
              f"{num(c.prob_diff, '+8.4f')}  {num(c.logprob_diff, '+8.3f')}  "
              f"{num(c.logit_diff, '+8.3f')}" for c in r.top_changed_tokens(k)]
    return "\n".join(lines)


def _cmd_knockout(args: argparse.Namespace) -> int:
    from mi_cli.preflight import knockout_spec
    from mi_core.interp.knockout import run_knockout
    from mi_core.util.plot import plot_knockout

    model = _load(args)
    r = run_knockout(model, args.prompt, knockout_spec(args), args.position)
    console.say(format_knockout(r, args.k))
    write_json(args.json_out, r, args.raw)
    write_plot(args.plot_out, lambda p: plot_knockout(r, p, k=args.k), html=html_of(r))
    return 0


def _cmd_patch(args: argparse.Namespace) -> int:
    from mi_core.interp._common import resolve_token
    from mi_core.interp.patching import attribution_patching, logit_diff_metric, patching_grid
    from mi_core.util.plot import plot_patching

    model = _load(args)
    metric = logit_diff_metric(resolve_token(model, args.correct),
                               resolve_token(model, args.incorrect))
    fn = attribution_patching if args.method == "attribution" else patching_grid
    kw = {} if args.method == "attribution" else {"show_progress": None if console.quiet else True}
    r = fn(model, args.prompt, args.corrupt, metric, kind=args.kind, layers=args.layers,
           positions=args.positions, **kw)
    units = f" {r.metric_units}" if r.metric_units else ""
    lines = [f"{r.method} patching of {r.kind}, {r.model or 'model'}: metric {r.metric_name}"
             f"{f' ({r.metric_units})' if r.metric_units else ''}: clean prompt "
             f"{num(r.clean_metric)}{units}, corrupted {args.corrupt!r} "
             f"{num(r.corrupted_metric)}{units}",
             "normalised (patched - corrupted) / (clean - corrupted): 1 = clean, 0 = corrupted",
             "largest cells (layer, column, normalised value):"]
    lines += [f"  L{layer:<3} {col:<24} {num(v, '+.3f')}" for layer, col, v in r.top(args.k)]
    console.say("\n".join(lines))
    write_json(args.json_out, r, args.raw)
    write_plot(args.plot_out, lambda p: plot_patching(r, p), html=html_of(r))
    return 0


def _cmd_attention(args: argparse.Namespace) -> int:
    from mi_cli.demo import AttentionResult
    from mi_core import HookPoint
    from mi_core.interp import display_weights, layer_attention
    from mi_core.interp._common import check_heads, check_layers
    from mi_core.util.plot import plot_attention

    model = _load(args)
    (layer,) = check_layers([args.layer], model.num_layers)
    name = model_name(model)
    ids = model.to_tokens(args.prompt)
    # an attention layer's pattern, or a recurrent layer's effective attention
    full, hp = layer_attention(model, ids, layer)
    effective = hp != HookPoint.attn_pattern(layer)
    full = display_weights(full[0].float().cpu())
    if args.head is not None:
        (h,) = check_heads([args.head], model.num_heads)
        pat = full[h]
    else:
        pat = full.mean(0)
    toks = model.to_str_tokens(ids[0])
    r = AttentionResult(layer, args.head, toks, pat, args.prompt, model.source)
    last = pat[-1]
    order = last.argsort(descending=True)[: args.k].tolist()
    which = (f"head {args.head}" if args.head is not None else "mean of heads") + (
        " (effective attention, |A| row-normalised)" if effective else "")
    console.say(f"{name}, layer {layer} {which}: last token {toks[-1]!r} attends to " +
                ", ".join(f"{i}:{toks[i]!r} {float(last[i]):.3f}" for i in order))
    write_json(args.json_out, r, args.raw)

    def html(path: Path) -> Any:
        from mi_core.plugin import view

        title = f"effective attention (|A| row-normalised), layer {layer}" if effective else None
        sub = (f"effective attention of layer {layer} ({hp}; |A| normalised per query row), "
               f"{len(toks)} tokens, rows: query, columns: source token") if effective else ""
        return view("attention")(toks, full, path, layer=layer, head=args.head, title=title,
                                 subtitle=sub, model_name=name, prompt=args.prompt)
    hook = f"{hp}" + (f"[{args.head}]" if args.head is not None else ", mean over heads")
    write_plot(args.plot_out, lambda p: plot_attention(
        pat, toks, p, title=f"{'effective attention' if effective else 'attention pattern'}, "
                            f"{name}: {hook}\nprompt {args.prompt!r}"),
        html=html)
    return 0


def format_dose(curve: Any, model: Any) -> str:
    tgt = curve.target_token_str
    lines = ["effects are steered - baseline",
             f"{'scale':>8} {'KL':>9} {'attn':>7} {'top token':>16}" +
             (f" {'p(' + repr(tgt) + ')':>12} {'dlog p':>8}" if tgt is not None else "")]
    for p in curve.points:
        top = p.top_token_str if p.top_token_str is not None else model.to_string([p.top_token])
        lines.append(f"{num(p.strength, '8.3f')} {num(p.kl_divergence, '9.5f')} "
                     f"{num(p.steered_attention or 0, '7.3f')} {top!r:>16}" +
                     (f" {num(p.target_prob, '12.4f')} {num(p.target_logprob_diff, '+8.3f')}"
                      if p.target_prob is not None else ""))
    return "\n".join(lines)


def _cmd_steer(args: argparse.Namespace) -> int:
    from mi_core.interp.steering import SteeringSpec, dose_response
    from mi_core.util.plot import plot_dose_response

    model = _load(args)
    layers = args.layers or list(range(model.num_layers))
    spec = SteeringSpec.attention(layers, args.to_pos or [0], args.from_pos or [-1], args.heads)
    curve = dose_response(model, args.prompt, spec, args.strengths, target=args.target,
                          show_progress=None if console.quiet else True)
    console.say(f"attention steering, {curve.model or 'model'}: {curve.describe()}; "
                "sweep of s:\n" + format_dose(curve, model))
    write_json(args.json_out, curve, args.raw)
    write_plot(args.plot_out, lambda p: plot_dose_response(curve, p), html=html_of(curve))
    return 0


def _cmd_heads(args: argparse.Namespace) -> int:
    from mi_core.interp.circuits import detect_heads, repeated_random_tokens
    from mi_core.util.plot import plot_head_scores

    model = _load(args)
    ids = repeated_random_tokens(model, args.length, args.batch, args.seed)
    r = detect_heads(model, ids, show_progress=None if console.quiet else True)
    r.description = (f"{args.batch} x {args.length} random tokens repeated once (seed "
                     f"{args.seed})")
    lines = [f"attention head scores, {r.model or 'model'}, on {r.description} "
             "(score: attention on the ideal edges, 0..1):"]
    for kind in r.scores:
        lines.append(f"{kind}: " + ", ".join(f"L{a}H{b} {s:.3f}"
                                             for a, b, s in r.top(kind, args.k)))
    console.say("\n".join(lines))
    write_json(args.json_out, r, args.raw)
    write_plot(args.plot_out, lambda p: plot_head_scores(r, p), html=html_of(r))
    return 0


# -- registration ----------------------------------------------------------------------

#: help of --k
K = "how many tokens / cells to print (default: %(default)s)"


def _add_demo(sub: "argparse._SubParsersAction[Any]") -> None:
    p = sub.add_parser("demo", help="top-5 next tokens, logit lens and an attention knockout on "
                       "the embedded default model (no network)",
                       description="Top-k next tokens, the logit lens and an attention knockout "
                       "on the embedded default model a plugin provides (or --model).")
    model_options(p)
    p.add_argument("--k", type=A.positive_int, default=5, help=K)
    p.set_defaults(func=_cmd_demo)


def _add_run(sub: "argparse._SubParsersAction[Any]") -> None:
    p = sub.add_parser("run", help="what `mi demo` shows, for any supported model",
                       description="What `mi demo` shows, for any supported model.")
    model_options(p)
    p.add_argument("--k", type=A.positive_int, default=5, help=K)
    p.set_defaults(func=_cmd_demo)


def _add_logit_lens(sub: "argparse._SubParsersAction[Any]") -> None:
    p = sub.add_parser("logit-lens", help="top tokens after every layer at one position",
                       description="The logit lens: the residual stream after each layer read "
                       "through the final norm and unembedding.")
    model_options(p)
    p.add_argument("--k", type=A.positive_int, default=5, help="top-k tokens per layer "
                   "(default: %(default)s)")
    p.add_argument("--position", type=int, default=-1,
                   help="token position to read (negative counts from the end; default: -1)")
    p.add_argument("--mid", action="store_true",
                   help="also lens resid_mid (between attention and MLP) of each layer")
    p.add_argument("--target", action="append", metavar="TOKEN", type=A.text,
                   help="a single-token string whose probability and rank to track (repeatable)")
    p.set_defaults(func=_cmd_logit_lens)


def _add_knockout(sub: "argparse._SubParsersAction[Any]") -> None:
    p = sub.add_parser("knockout", help="remove attention edges and measure the effect",
                       description="Remove attention edges (query -> key) and report the "
                       "effect on the next-token distribution, knocked out - baseline: KL, "
                       "probability, log-probability and logit changes.")
    model_options(p)
    p.add_argument("--layers", type=A.int_list, metavar="LIST",
                   help="layers, e.g. 8, 4-10, 1,3 (default: all)")
    p.add_argument("--heads", type=A.int_list, metavar="LIST", help="heads (default: all)")
    p.add_argument("--from", dest="from_pos", type=A.int_list, metavar="LIST",
                   help="query positions, e.g. -1 (default: last, when no edge is given)")
    p.add_argument("--to", dest="to_pos", type=A.int_list, metavar="LIST",
                   help="key positions, e.g. 0 or 1-3 (default: 0, when no edge is given)")
    p.add_argument("--edge", action="append", type=A.edge, metavar="QUERY,KEY",
                   help="one edge, e.g. -1,3 (repeatable)")
    p.add_argument("--position", type=int, default=-1,
                   help="position whose next-token logits are compared (default: -1)")
    p.add_argument("--k", type=A.positive_int, default=10, help=K)
    p.set_defaults(func=_cmd_knockout)


def _add_patch(sub: "argparse._SubParsersAction[Any]") -> None:
    p = sub.add_parser("patch", help="activation patching grid between a clean and a corrupted "
                       "prompt", description="Activation patching: run the corrupted prompt with "
                       "one clean activation patched in, for every layer x position (or head); "
                       "the metric is logit(correct) - logit(incorrect), normalised to 0 = "
                       "corrupted, 1 = clean.")
    model_options(p)
    req = p.add_argument_group("required")
    req.add_argument("--corrupt", required=True, type=A.text, metavar="TEXT",
                     help="corrupted prompt (same token length as --prompt)")
    req.add_argument("--correct", required=True, type=A.text, metavar="TOKEN",
                     help="answer token of the clean prompt (a single token, e.g. ' Paris')")
    req.add_argument("--incorrect", required=True, type=A.text, metavar="TOKEN",
                     help="answer token of the corrupted prompt (a single token)")
    p.add_argument("--kind", default="resid_pre",
                   choices=["resid_pre", "resid_post", "attn_out", "mlp_out", "z"],
                   help="what to patch: a residual / output point per position, or z per head "
                   "(default: %(default)s)")
    p.add_argument("--method", default="exact", choices=["exact", "attribution"],
                   help="exact patching, or its gradient approximation (default: %(default)s)")
    p.add_argument("--layers", type=A.int_list, metavar="LIST",
                   help="layers to patch, e.g. 0-29 or 0,6,12 (default: all; each layer is "
                   "one batch of forwards)")
    p.add_argument("--positions", type=A.int_list, metavar="LIST",
                   help="positions to patch, e.g. 3 or -2,-1 (default: all; per-position "
                   "kinds only)")
    p.add_argument("--k", type=A.positive_int, default=10, help=K)
    p.set_defaults(func=_cmd_patch)


def _add_attention(sub: "argparse._SubParsersAction[Any]") -> None:
    p = sub.add_parser("attention", help="attention pattern of one layer (one head or mean)",
                       description="The attention pattern of one layer: one head, or the mean "
                       "over heads.")
    model_options(p)
    p.add_argument("--layer", type=A.nonneg_int, default=0, help="layer (default: 0)")
    p.add_argument("--head", type=A.nonneg_int, default=None,
                   help="head (default: the mean over heads)")
    p.add_argument("--k", type=A.positive_int, default=5,
                   help="how many keys of the last token to print (default: %(default)s)")
    p.set_defaults(func=_cmd_attention)


def _add_steer(sub: "argparse._SubParsersAction[Any]") -> None:
    p = sub.add_parser("steer", help="attention steering dose-response sweep",
                       description="Multiply the attention from the query positions to the key "
                       "positions by each scale (rows renormalised) and report the effect, "
                       "steered - baseline.")
    model_options(p)
    p.add_argument("--layers", type=A.int_list, metavar="LIST", help="layers (default: all)")
    p.add_argument("--heads", type=A.int_list, metavar="LIST", help="heads (default: all)")
    p.add_argument("--from", dest="from_pos", type=A.int_list, metavar="LIST",
                   help="query positions (default: -1, the last)")
    p.add_argument("--to", dest="to_pos", type=A.int_list, metavar="LIST",
                   help="key positions to steer (default: 0)")
    p.add_argument("--strengths", default=A.float_list("0,0.5,1,2,4"), type=A.float_list,
                   metavar="LIST", help="comma-separated scales (default: 0,0.5,1,2,4)")
    p.add_argument("--target", default=None, type=A.text, metavar="TOKEN",
                   help="a single-token string whose probability to track")
    p.set_defaults(func=_cmd_steer)


def _add_heads(sub: "argparse._SubParsersAction[Any]") -> None:
    p = sub.add_parser("heads", help="previous-token / duplicate-token / induction head scores "
                       "on repeated random tokens", description="Score every head as a "
                       "previous-token, duplicate-token and induction head on repeated random "
                       "tokens.")
    model_options(p, prompt=False)
    p.add_argument("--length", type=A.positive_int, default=20,
                   help="length of the random sequence that is repeated (default: %(default)s)")
    p.add_argument("--batch", type=A.positive_int, default=4,
                   help="how many random sequences (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--k", type=A.positive_int, default=5, help="heads per kind to print "
                   "(default: %(default)s)")
    p.set_defaults(func=_cmd_heads)


@command_impl
def mi_register_commands(subparsers: "argparse._SubParsersAction[Any]") -> None:
    """Add the analysis subcommands to the ``mi`` parser."""
    register(subparsers)


def register(sub: "argparse._SubParsersAction[Any]") -> None:
    """Add the analysis subcommands to `sub` (the ``mi`` parser's subparsers)."""
    for add in (_add_demo, _add_run, _add_logit_lens, _add_knockout, _add_patch,
                _add_attention, _add_steer, _add_heads):
        add(sub)

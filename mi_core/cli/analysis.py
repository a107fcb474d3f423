"""The analysis subcommands: ``mi demo``, ``mi run``, ``mi logit-lens``, ``mi knockout``,
``mi patch``, ``mi attention``, ``mi steer``, ``mi heads``.

Each takes ``--model`` (path, hub id or .gguf; default: the embedded default model a plugin
provides), ``--prompt``, ``--json OUT`` (the result as JSON, readable back with
``mi_core.from_json``) and ``--plot OUT`` (a PNG, or a self-contained HTML file when OUT ends
in .html).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable

import attrs
import torch

from mi_core.errors import MIError, UnsupportedModelError
from mi_core.serialize import to_json

DEFAULT_PROMPT = "The capital of France is"


# -- model loading ---------------------------------------------------------------------

def default_model_path() -> str | None:
    """The default model a plugin embeds (``mi_default_model`` hook), or None."""
    from mi_core import plugins

    found = plugins.get_plugin_manager().hook.mi_default_model()
    # the hookspec is firstresult (one path or None); accept a list too
    for path in [found] if isinstance(found, (str, Path)) or found is None else found:
        if path:
            return str(path)
    return None


def load_model(model: str | None, device: str = "cpu") -> Any:
    from mi_core.backend import MIModel

    if model is None:
        model = default_model_path()
        if model is None:
            raise UnsupportedModelError(
                "no default model is available: install a plugin that embeds one (see "
                "`mi plugins` and docs/PLUGINS.md, mi_default_model), or pass --model PATH")
    return MIModel.from_pretrained(model, device=device)


def _ints(text: str | None) -> list[int] | None:
    """"3", "1,4,7", "0-5" (inclusive) or "" -> list of ints (None when not given)."""
    if text is None:
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part[1:]:
            a, b = part[0] + part[1:].split("-", 1)[0], part[1:].split("-", 1)[1]
            out += list(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def _common(p: argparse.ArgumentParser, prompt: bool = True) -> None:
    p.add_argument("--model", default=None,
                   help="checkpoint: directory, hub id or .gguf (default: the embedded model)")
    if prompt:
        p.add_argument("--prompt", default=DEFAULT_PROMPT, help="input text")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT",
                   help="write the result as JSON")
    p.add_argument("--plot", dest="plot_out", default=None, metavar="OUT",
                   help="write a picture (.png, or .html for a self-contained page)")


def _write_plot(out: str | None, make_png: Callable[[Path], Path], text: str, title: str) -> None:
    if out is None:
        return
    from mi_core.util.plot import html_report

    path = Path(out)
    if path.suffix.lower() == ".html":
        png = make_png(path.with_suffix(".png"))
        html_report([(title, png), ("text", text)], path, title=title)
        png.unlink()
    else:
        make_png(path)
    print(f"wrote {path}")


def _write_json(out: str | None, result: Any) -> None:
    if out is not None:
        to_json(result, out)
        print(f"wrote {out}")


def _fmt(s: str) -> str:
    return repr(s)


# -- demo / run ------------------------------------------------------------------------

@attrs.define
class TokenProb:
    token_id: int
    token: str
    prob: float


@attrs.define
class DemoResult:
    """What ``mi demo`` / ``mi run`` compute."""

    model: str
    prompt: str
    top_next: list[TokenProb]
    logit_lens_top1: list[tuple[str, str, float]]
    knockout_layers: list[int]
    knockout_description: str
    knockout_kl: float
    knockout_logit_diff: float
    knockout_top_changed: list[TokenProb]
    seconds: float


def demo(model: Any, prompt: str = DEFAULT_PROMPT, k: int = 5) -> DemoResult:
    """Top-k next tokens, the logit lens at the last position, and the effect of knocking out
    the last token's attention to every earlier token in the middle third of the layers."""
    from mi_core.interp.knockout import KnockoutSpec, run_knockout
    from mi_core.interp.logit_lens import LogitLensAnalysis

    t0 = time.perf_counter()
    ids = model.to_tokens(prompt)
    logits = model.forward(ids).output[0, -1].float()
    probs = torch.softmax(logits, -1)
    pv, pi = probs.topk(k)
    top = [TokenProb(int(i), model.to_string([int(i)]), float(v)) for v, i in zip(pv, pi)]
    lens = LogitLensAnalysis(k=1).run(model, ids)
    n = model.num_layers
    layers = list(range(n // 3, max(n // 3 + 1, 2 * n // 3)))
    seq = ids.shape[1]
    spec = KnockoutSpec(layers=layers, from_positions=[seq - 1],
                        to_positions=list(range(seq - 1)) or [0])
    abl = run_knockout(model, ids, spec)
    top_id = top[0].token_id
    changed = [TokenProb(c.token_id, c.token, c.ablated_prob) for c in abl.top_changed_tokens(5)]
    return DemoResult(model.source, prompt, top,
                      [(p.label, p.top[0].token, p.top[0].prob) for p in lens.points],
                      layers, f"last token -> all earlier tokens, layers {layers[0]}-{layers[-1]}",
                      abl.kl_divergence(), abl.logit_diff(top_id), changed,
                      time.perf_counter() - t0)


def print_demo(r: DemoResult) -> None:
    print(f"model: {r.model}")
    print(f"prompt: {r.prompt!r}\n")
    print("top next tokens:")
    for t in r.top_next:
        print(f"  {t.token!r:>16}  {t.prob:6.3f}")
    print("\nlogit lens (last position, top-1 after each layer):")
    print("  " + "  ".join(f"{lab}:{tok!r}" for lab, tok, _ in r.logit_lens_top1))
    print(f"\nattention knockout ({r.knockout_description}):")
    print(f"  KL(baseline || knocked out) = {r.knockout_kl:.4f} nats")
    print(f"  logit diff of {r.top_next[0].token!r} (baseline - knocked out) = "
          f"{r.knockout_logit_diff:+.4f}")
    print("  most changed: " + ", ".join(f"{t.token!r} -> {t.prob:.3f}"
                                         for t in r.knockout_top_changed))
    print(f"\n({r.seconds:.2f} s)")


def _cmd_demo(args: argparse.Namespace) -> int:
    model = load_model(getattr(args, "model", None), args.device)
    r = demo(model, args.prompt, args.k)
    print_demo(r)
    _write_json(args.json_out, r)
    if args.plot_out:
        from mi_core.interp.logit_lens import LogitLensAnalysis
        from mi_core.util.plot import plot_logit_lens

        lens = LogitLensAnalysis(k=5).run(model, args.prompt)
        _write_plot(args.plot_out, lambda p: plot_logit_lens(lens, p), lens.format_table(),
                    "logit lens")
    return 0


# -- single analyses -------------------------------------------------------------------

def _cmd_logit_lens(args: argparse.Namespace) -> int:
    from mi_core.interp.logit_lens import LogitLensAnalysis
    from mi_core.util.plot import plot_logit_lens

    model = load_model(args.model, args.device)
    r = LogitLensAnalysis(k=args.k, include_mid=args.mid, targets=args.target or []).run(
        model, args.prompt, args.position)
    text = r.format_table()
    print(text)
    _write_json(args.json_out, r)
    _write_plot(args.plot_out, lambda p: plot_logit_lens(r, p), text, "logit lens")
    return 0


def _cmd_knockout(args: argparse.Namespace) -> int:
    from mi_core.interp.knockout import KnockoutSpec, run_knockout

    model = load_model(args.model, args.device)
    ids = model.to_tokens(args.prompt)
    edges = [tuple(int(x) for x in e.split(",")) for e in args.edge or []]
    spec = KnockoutSpec(layers=_ints(args.layers), heads=_ints(args.heads), edges=edges,
                        from_positions=_ints(args.from_pos), to_positions=_ints(args.to_pos))
    if spec.is_empty():
        spec = attrs.evolve(spec, from_positions=[-1], to_positions=[0])
    r = run_knockout(model, ids, spec, args.position)
    top = int(r.baseline_logits.argmax())
    lines = [f"knockout {spec}",
             f"KL(baseline || ablated) = {r.kl_divergence():.5f} nats",
             f"logit diff of baseline top-1 {model.to_string([top])!r}: {r.logit_diff(top):+.4f}",
             "top changed tokens:"]
    lines += [f"  {c.token!r:>16}  {c.baseline_prob:.4f} -> {c.ablated_prob:.4f}"
              for c in r.top_changed_tokens(args.k)]
    print("\n".join(lines))
    _write_json(args.json_out, r)
    if args.plot_out:
        from mi_core.util.plot import plot_grid

        ch = r.top_changed_tokens(args.k)
        grid = torch.tensor([[c.baseline_prob, c.ablated_prob] for c in ch])
        _write_plot(args.plot_out, lambda p: plot_grid(
            grid, [c.token for c in ch], ["baseline", "ablated"], p,
            title="probabilities of the most changed tokens"), "\n".join(lines), "knockout")
    return 0


def _cmd_patch(args: argparse.Namespace) -> int:
    from mi_core.interp._common import resolve_token
    from mi_core.interp.patching import attribution_patching, logit_diff_metric, patching_grid
    from mi_core.util.plot import plot_patching

    model = load_model(args.model, args.device)
    clean, corrupt = model.to_tokens(args.prompt), model.to_tokens(args.corrupt)
    if args.correct is None or args.incorrect is None:
        raise MIError("mi patch needs --correct and --incorrect (the answer tokens whose logit "
                      "difference is the metric)")
    metric = logit_diff_metric(resolve_token(model, args.correct),
                               resolve_token(model, args.incorrect))
    fn = attribution_patching if args.method == "attribution" else patching_grid
    kw = {} if args.method == "attribution" else {"show_progress": None}
    r = fn(model, clean, corrupt, metric, kind=args.kind, **kw)
    lines = [f"{r.method} patching of {r.kind}: clean metric {r.clean_metric:.4f}, corrupted "
             f"{r.corrupted_metric:.4f}", "largest cells (layer, column, normalised value):"]
    lines += [f"  L{layer:<3} {col:<24} {v:+.3f}" for layer, col, v in r.top(args.k)]
    print("\n".join(lines))
    _write_json(args.json_out, r)
    _write_plot(args.plot_out, lambda p: plot_patching(r, p), "\n".join(lines), "patching")
    return 0


@attrs.define
class AttentionResult:
    layer: int
    head: int | None
    tokens: list[str]
    pattern: torch.Tensor  # [q, k] (head) or mean over heads


def _cmd_attention(args: argparse.Namespace) -> int:
    from mi_core.backend import require_points
    from mi_core.hooks import HookPoint, HookSpec
    from mi_core.interp._common import check_heads, check_layers
    from mi_core.util.plot import plot_attention

    model = load_model(args.model, args.device)
    (layer,) = check_layers([args.layer], model.num_layers)
    hp = HookPoint.attn_pattern(layer)
    require_points(model, [hp])
    ids = model.to_tokens(args.prompt)
    pat = model.forward(ids, HookSpec().capture(hp)).require(hp)[0].float().cpu()
    if args.head is not None:
        (h,) = check_heads([args.head], model.num_heads)
        pat = pat[h]
    else:
        pat = pat.mean(0)
    toks = model.to_str_tokens(ids[0])
    r = AttentionResult(layer, args.head, toks, pat)
    last = pat[-1]
    order = last.argsort(descending=True)[: args.k].tolist()
    text = (f"layer {layer} {'head ' + str(args.head) if args.head is not None else 'mean of heads'}"
            f": last token {toks[-1]!r} attends to " +
            ", ".join(f"{i}:{toks[i]!r} {float(last[i]):.3f}" for i in order))
    print(text)
    _write_json(args.json_out, r)
    _write_plot(args.plot_out, lambda p: plot_attention(pat, toks, p, title=f"layer {layer}"),
                text, "attention")
    return 0


def _cmd_steer(args: argparse.Namespace) -> int:
    from mi_core.interp.steering import SteeringSpec, dose_response
    from mi_core.util.plot import plot_dose_response

    model = load_model(args.model, args.device)
    ids = model.to_tokens(args.prompt)
    layers = _ints(args.layers) or list(range(model.num_layers))
    spec = SteeringSpec.attention(layers, _ints(args.to_pos) or [0], _ints(args.from_pos) or [-1],
                                  _ints(args.heads))
    strengths = [float(s) for s in args.strengths.split(",")]
    curve = dose_response(model, ids, spec, strengths, target=args.target)
    lines = [f"attention steering, layers {layers[0]}-{layers[-1]}, scale sweep:",
             f"{'scale':>8} {'KL':>9} {'attn':>7} {'top token':>16}" +
             (f" {'p(target)':>10}" if curve.target_token is not None else "")]
    for p in curve.points:
        lines.append(f"{p.strength:8.3f} {p.kl_divergence:9.5f} {p.steered_attention or 0:7.3f} "
                     f"{model.to_string([p.top_token])!r:>16}" +
                     (f" {p.target_prob:10.4f}" if p.target_prob is not None else ""))
    print("\n".join(lines))
    _write_json(args.json_out, curve)
    _write_plot(args.plot_out, lambda p: plot_dose_response(curve, p), "\n".join(lines),
                "dose-response")
    return 0


def _cmd_heads(args: argparse.Namespace) -> int:
    from mi_core.interp.circuits import detect_heads, repeated_random_tokens
    from mi_core.util.plot import plot_grid

    model = load_model(args.model, args.device)
    ids = repeated_random_tokens(model, args.length, args.batch, args.seed)
    r = detect_heads(model, ids)
    lines = []
    for kind in r.scores:
        lines.append(f"{kind}: " + ", ".join(f"L{a}H{b} {s:.3f}" for a, b, s in r.top(kind, args.k)))
    print("\n".join(lines))
    _write_json(args.json_out, r)
    kind = "induction" if "induction" in r.scores else next(iter(r.scores))
    _write_plot(args.plot_out, lambda p: plot_grid(
        r.scores[kind], [str(i) for i in range(model.num_layers)],
        [str(h) for h in range(model.num_heads)], p, title=f"{kind} scores",
        xlabel="head", ylabel="layer"), "\n".join(lines), "head detection")
    return 0


# -- registration ----------------------------------------------------------------------

def register(sub: "argparse._SubParsersAction[Any]") -> None:
    """Add the analysis subcommands to the ``mi`` parser."""
    p = sub.add_parser("demo", help="top-5 next tokens, logit lens and an attention knockout on "
                       "the embedded default model (no network)")
    _common(p)
    p.add_argument("--k", type=int, default=5)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("run", help="what `mi demo` shows, for any supported model")
    _common(p)
    p.add_argument("--k", type=int, default=5)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("logit-lens", help="top tokens after every layer at one position")
    _common(p)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--position", type=int, default=-1)
    p.add_argument("--mid", action="store_true", help="also lens resid_mid of each layer")
    p.add_argument("--target", action="append", help="a token to track (repeatable)")
    p.set_defaults(func=_cmd_logit_lens)

    p = sub.add_parser("knockout", help="remove attention edges and measure the effect")
    _common(p)
    p.add_argument("--layers", help="e.g. 8, 4-10, 1,3 (default: all)")
    p.add_argument("--heads", help="default: all")
    p.add_argument("--from", dest="from_pos", help="query positions (default: last)")
    p.add_argument("--to", dest="to_pos", help="key positions (default: 0)")
    p.add_argument("--edge", action="append", help="single edge QUERY,KEY (repeatable)")
    p.add_argument("--position", type=int, default=-1, help="where to compare the logits")
    p.add_argument("--k", type=int, default=10)
    p.set_defaults(func=_cmd_knockout)

    p = sub.add_parser("patch", help="activation patching grid between a clean and a corrupted "
                       "prompt")
    _common(p)
    p.add_argument("--corrupt", required=True, help="corrupted prompt (same token length)")
    p.add_argument("--correct", help="answer token on the clean prompt")
    p.add_argument("--incorrect", help="answer token on the corrupted prompt")
    p.add_argument("--kind", default="resid_pre",
                   choices=["resid_pre", "resid_post", "attn_out", "mlp_out", "z"])
    p.add_argument("--method", default="exact", choices=["exact", "attribution"])
    p.add_argument("--k", type=int, default=10)
    p.set_defaults(func=_cmd_patch)

    p = sub.add_parser("attention", help="attention pattern of one layer (one head or mean)")
    _common(p)
    p.add_argument("--layer", type=int, default=0)
    p.add_argument("--head", type=int, default=None)
    p.add_argument("--k", type=int, default=5)
    p.set_defaults(func=_cmd_attention)

    p = sub.add_parser("steer", help="attention steering dose-response sweep")
    _common(p)
    p.add_argument("--layers", help="default: all")
    p.add_argument("--heads", help="default: all")
    p.add_argument("--from", dest="from_pos", help="query positions (default: last)")
    p.add_argument("--to", dest="to_pos", help="key positions to steer (default: 0)")
    p.add_argument("--strengths", default="0,0.5,1,2,4", help="comma-separated scales")
    p.add_argument("--target", default=None, help="token whose probability to track")
    p.set_defaults(func=_cmd_steer)

    p = sub.add_parser("heads", help="previous-token / duplicate-token / induction head scores "
                       "on repeated random tokens")
    _common(p, prompt=False)
    p.add_argument("--length", type=int, default=20)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--k", type=int, default=5)
    p.set_defaults(func=_cmd_heads)

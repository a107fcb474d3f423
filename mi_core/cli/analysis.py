"""The analysis subcommands: ``mi demo``, ``mi run``, ``mi logit-lens``, ``mi knockout``,
``mi patch``, ``mi attention``, ``mi steer``, ``mi heads``.

Each takes ``--model`` (path, hub id or .gguf; default: the embedded default model a plugin
provides), ``--device``, ``--dtype``, ``--prompt``, ``--json OUT`` (the result as JSON,
readable back with ``mi_core.from_json``; raw logits only with ``--raw``) and ``--plot OUT``
(.png, .svg or .pdf: a picture; .html: a self-contained interactive page). Effects are
reported intervened − baseline (``mi_core.interp.effects``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable

import attrs
import torch

from mi_core.cli import args as A
from mi_core.errors import MIError, UnsupportedModelError
from mi_core.interp.effects import TokenEffect
from mi_core.serialize import to_json

DEFAULT_PROMPT = "The capital of France is"


# -- output ----------------------------------------------------------------------------

class _Console:
    """stdout of one command: results unless ``--quiet``, details only with ``--verbose``."""

    quiet = False
    verbose = False

    def configure(self, args: argparse.Namespace) -> None:
        self.quiet = bool(getattr(args, "quiet", False))
        self.verbose = bool(getattr(args, "verbose", False)) and not self.quiet

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text)

    def detail(self, text: str) -> None:
        if self.verbose:
            print(text)


console = _Console()


def num(x: float | None, spec: str = ".4f") -> str:
    """`x` formatted with `spec`, never as negative zero ("-0.0000" -> "0.0000")."""
    if x is None:
        return "-"
    s = format(float(x), spec)
    if float(s) == 0.0:  # "-0.000" (a tiny negative) or "-0.0"
        s = format(0.0, spec)
    return s


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


def load_model(model: str | None, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Any:
    from mi_core.backend import MIModel

    if model is None:
        model = default_model_path()
        if model is None:
            raise UnsupportedModelError(
                "no default model is available: install a plugin that embeds one (see "
                "`mi plugins` and docs/PLUGINS.md, mi_default_model), or pass --model PATH")
    t0 = time.perf_counter()
    m = MIModel.from_pretrained(model, device=device, dtype=dtype)
    console.detail(f"loaded {model} on {device} ({str(dtype).removeprefix('torch.')}) in "
                   f"{time.perf_counter() - t0:.1f} s")
    return m


def _load(args: argparse.Namespace) -> Any:
    return load_model(args.model, args.device, dtype=args.dtype)


def model_name(model: Any) -> str:
    """A short name for titles: the checkpoint's file or folder name."""
    src = str(getattr(model, "source", "") or "model")
    return Path(src).name or src


def _ints(text: str | None) -> list[int] | None:
    """"3", "1,4,7", "0-5" (inclusive) -> list of ints (None when not given)."""
    return None if text is None else A.int_list(text)


def _common(p: argparse.ArgumentParser, prompt: bool = True, html: bool = True) -> None:
    """--model, --device, --dtype, --prompt, --json, --raw, --plot, -q/--verbose (`html`:
    whether --plot accepts .html, i.e. the command has an interactive view)."""
    p.add_argument("--model", default=None, type=A.model_source, metavar="PATH",
                   help="checkpoint: directory, hub id or .gguf file (default: the embedded "
                   "model a plugin provides; see `mi plugins`)")
    p.add_argument("--device", default="cpu", type=A.device,
                   help="torch device: cpu (default), cuda, cuda:N, mps")
    p.add_argument("--dtype", default="float32", type=A.dtype,
                   metavar="{" + ",".join(A.DTYPES) + "}",
                   help="dtype of the weights and activations (default: float32)")
    if prompt:
        p.add_argument("--prompt", default=DEFAULT_PROMPT, type=A.text, metavar="TEXT",
                       help=f"input text (default: {DEFAULT_PROMPT!r})")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT",
                   help="write the result as JSON (spec, prompt, summary metrics)")
    p.add_argument("--raw", action="store_true",
                   help="with --json: also write the raw tensors (e.g. the [vocab] logits)")
    if html:
        p.add_argument("--plot", dest="plot_out", default=None, metavar="OUT", type=A.plot_path,
                       help="write a picture (.png, .svg, .pdf) or an interactive page (.html)")
    else:
        p.add_argument("--plot", dest="plot_out", default=None, metavar="OUT",
                       type=A.picture_path, help="write a picture (.png, .svg, .pdf)")
    A.output_options(p)


def _write_plot(out: str | None, make_picture: Callable[[Path], Path], text: str = "",
                title: str = "", html: Callable[[Path], Any] | None = None) -> None:
    """--plot OUT: a picture by extension, or the interactive page `html` for .html."""
    if out is None:
        return
    path = Path(out)
    if path.suffix.lower() == ".html":
        if html is None:
            raise MIError(f"--plot {out}: this command has no interactive view; use .png, "
                          ".svg or .pdf")
        html(path)
    else:
        make_picture(path)
    console.say(f"wrote {path}")


def _html_of(result: Any, **kw: Any) -> Callable[[Path], Any] | None:
    """The result's interactive view (``result.to_html(path)``), when it has one."""
    fn = getattr(result, "to_html", None)
    return None if fn is None else (lambda p: fn(p, **kw))


def _write_json(out: str | None, result: Any, raw: bool = True) -> None:
    if out is not None:
        to_json(result, out, raw=raw)
        console.say(f"wrote {out}")


# -- demo / run ------------------------------------------------------------------------

@attrs.define
class TokenProb:
    token_id: int
    token: str
    prob: float


@attrs.define
class LensRow:
    """The logit lens after one layer: its label ("L29") and top tokens."""

    label: str
    top: list[TokenProb]


@attrs.define
class DemoResult:
    """What ``mi demo`` / ``mi run`` compute. Knockout effects are knocked out − baseline."""

    model: str
    prompt: str
    top_next: list[TokenProb]
    #: (label, top-1 token, its probability) after every layer
    logit_lens_top1: list[tuple[str, str, float]]
    #: top-3 after the last layers
    logit_lens_last: list[LensRow]
    #: the first layer from which the model's answer stays the lens' top-1 (None: never)
    answer_settles_at: int | None
    #: the first layer where the answer is among the lens' top 3 (None: never)
    answer_top3_at: int | None
    knockout_layers: list[int]
    knockout_description: str
    knockout_kl: float
    #: the effect of the knockout on the model's answer (top-1 next token)
    knockout_answer: TokenEffect
    knockout_top_changed: list[TokenEffect]
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
    pv, pi = probs.topk(min(k, probs.numel()))
    top = [TokenProb(int(i), model.to_string([int(i)]), float(v)) for v, i in zip(pv, pi)]
    lens = LogitLensAnalysis(k=min(3, probs.numel())).run(model, ids)
    answer = top[0].token_id
    settles = None
    for p in reversed(lens.points):
        if p.top[0].token_id != answer:
            break
        settles = p.layer
    top3_at = next((p.layer for p in lens.points if answer in [t.token_id for t in p.top]), None)
    last = [LensRow(p.label, [TokenProb(t.token_id, t.token, t.prob) for t in p.top])
            for p in lens.points[-4:]]
    n = model.num_layers
    layers = list(range(n // 3, max(n // 3 + 1, 2 * n // 3)))
    seq = ids.shape[1]
    spec = KnockoutSpec(layers=layers, from_positions=[seq - 1],
                        to_positions=list(range(seq - 1)) or [0])
    abl = run_knockout(model, ids, spec)
    assert abl.summary is not None
    return DemoResult(model.source, prompt, top,
                      [(p.label, p.top[0].token, p.top[0].prob) for p in lens.points], last,
                      settles, top3_at, layers,
                      f"last token -> all earlier tokens, layers {layers[0]}-{layers[-1]}",
                      abl.kl_divergence(), abl.summary.baseline_top, abl.top_changed_tokens(5),
                      time.perf_counter() - t0)


def format_demo(r: DemoResult) -> str:
    tp = lambda t: f"{t.token!r} {t.prob:.2f}"  # noqa: E731
    n = len(r.logit_lens_top1)
    a = r.knockout_answer
    lines = [f"model: {r.model}", f"prompt: {r.prompt!r}", "", "top next tokens:"]
    lines += [f"  {t.token!r:>16}  {t.prob:6.3f}" for t in r.top_next]
    lines += ["", "logit lens (last position: the residual stream after each layer, read "
              "through the final norm and unembedding):"]
    if r.answer_settles_at is not None:
        lines.append(f"  {r.top_next[0].token!r} enters the top 3 at L{r.answer_top3_at} and is "
                     f"the top prediction from L{r.answer_settles_at} on (layers L0-L{n - 1}):")
    else:
        lines.append(f"  {r.top_next[0].token!r} is not the lens' top-1; the last layers' top 3:")
    lines += [f"  {row.label:>5}: " + ", ".join(tp(t) for t in row.top)
              for row in r.logit_lens_last]
    lines += ["", f"attention knockout ({r.knockout_description}), knocked out - baseline:",
              f"  KL(baseline || knocked out) = {num(r.knockout_kl)} nats",
              f"  {a.token!r}: p {a.baseline_prob:.3f} -> {a.intervened_prob:.3f}, "
              f"log p {num(a.logprob_diff, '+.3f')} nats (logit {num(a.logit_diff, '+.3f')})",
              "  most changed: " + ", ".join(f"{t.token!r} {t.baseline_prob:.3f} -> "
                                             f"{t.intervened_prob:.3f}"
                                             for t in r.knockout_top_changed),
              "", f"({r.seconds:.2f} s)"]
    return "\n".join(lines)


def print_demo(r: DemoResult) -> None:
    console.say(format_demo(r))


def _cmd_demo(args: argparse.Namespace) -> int:
    model = _load(args)
    r = demo(model, args.prompt, args.k)
    print_demo(r)
    _write_json(args.json_out, r, args.raw)
    if args.plot_out:
        from mi_core.interp.logit_lens import LogitLensAnalysis
        from mi_core.util.plot import plot_logit_lens

        lens = LogitLensAnalysis(k=min(5, model.vocab_size)).run(model, args.prompt)
        _write_plot(args.plot_out, lambda p: plot_logit_lens(
            lens, p, title=f"logit lens, {model_name(model)}\nprompt {args.prompt!r}, "
                           "next-token prediction after its last token"),
            html=_lens_html(model, args, 5))
    return 0


# -- single analyses -------------------------------------------------------------------

def _lens_html(model: Any, args: argparse.Namespace, k: int) -> Callable[[Path], Any] | None:
    try:
        from mi_core.interp.lens_grid import logit_lens_grid
    except ImportError:  # pragma: no cover - the interactive views are not installed
        return None

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
    _write_json(args.json_out, r, args.raw)
    tok = r.prompt_tokens[r.position] if r.prompt_tokens else str(r.position)
    _write_plot(args.plot_out, lambda p: plot_logit_lens(
        r, p, title=f"logit lens, {model_name(model)}\nprompt {args.prompt!r}, next-token "
                    f"prediction after token {r.position} {tok!r}"),
        html=_lens_html(model, args, args.k))
    return 0


def describe_knockout(spec: Any) -> str:
    """"layers 0-2, all heads, edges -1->0, -1->1" for a KnockoutSpec."""
    if spec is None:
        return "(unknown spec)"
    parts = [f"layers {_span(list(spec.layers))}" if spec.layers else "all layers",
             f"heads {_span(list(spec.heads))}" if spec.heads else "all heads"]
    edges = [f"{q}->{k}" for q, k in spec.edges]
    if spec.from_positions is not None or spec.to_positions is not None:
        f = "all" if spec.from_positions is None else ",".join(map(str, spec.from_positions))
        t = "all" if spec.to_positions is None else ",".join(map(str, spec.to_positions))
        edges.append(f"queries {f} -> keys {t}")
    return ", ".join(parts) + ", edges " + "; ".join(edges)


def format_knockout(r: Any, k: int) -> str:
    s = r.summary
    b = s.baseline_top
    lines = [f"knockout of {describe_knockout(r.spec)}", "effects are knocked out - baseline "
             "(log p and p are shift-invariant; logit is the raw difference)",
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
    from mi_core.interp.knockout import KnockoutSpec, run_knockout
    from mi_core.util.plot import plot_knockout

    model = _load(args)
    spec = KnockoutSpec(layers=args.layers, heads=args.heads, edges=args.edge or [],
                        from_positions=args.from_pos, to_positions=args.to_pos)
    if spec.is_empty():
        spec = attrs.evolve(spec, from_positions=[-1], to_positions=[0])
    r = run_knockout(model, args.prompt, spec, args.position)
    console.say(format_knockout(r, args.k))
    _write_json(args.json_out, r, args.raw)
    _write_plot(args.plot_out, lambda p: plot_knockout(
        r, p, k=args.k, title=f"attention knockout, {model_name(model)}, prompt {args.prompt!r}"),
        html=_html_of(r))
    return 0


def _cmd_patch(args: argparse.Namespace) -> int:
    from mi_core.interp._common import resolve_token
    from mi_core.interp.patching import attribution_patching, logit_diff_metric, patching_grid
    from mi_core.util.plot import plot_patching

    model = _load(args)
    metric = logit_diff_metric(resolve_token(model, args.correct),
                               resolve_token(model, args.incorrect))
    fn = attribution_patching if args.method == "attribution" else patching_grid
    kw = {} if args.method == "attribution" else {"show_progress": console.verbose or None}
    r = fn(model, args.prompt, args.corrupt, metric, kind=args.kind, **kw)
    lines = [f"{r.method} patching of {r.kind}, metric logit({args.correct!r}) - "
             f"logit({args.incorrect!r}): clean {num(r.clean_metric)}, corrupted "
             f"{num(r.corrupted_metric)}",
             "normalised (patched - corrupted) / (clean - corrupted): 1 = clean, 0 = corrupted",
             "largest cells (layer, column, value):"]
    lines += [f"  L{layer:<3} {col:<24} {num(v, '+.3f')}" for layer, col, v in r.top(args.k)]
    console.say("\n".join(lines))
    _write_json(args.json_out, r, args.raw)
    _write_plot(args.plot_out, lambda p: plot_patching(
        r, p, title=f"{r.method} patching of {r.kind}, {model_name(model)}\nclean "
                    f"{args.prompt!r} vs corrupted {args.corrupt!r}"), html=_html_of(r))
    return 0


@attrs.define
class AttentionResult:
    """``mi attention``: one layer's pattern [q, k] (one head, or the mean over heads)."""

    layer: int
    head: int | None
    tokens: list[str]
    pattern: torch.Tensor  # [q, k] (head) or mean over heads
    prompt: str | None = None
    model: str | None = None


def _cmd_attention(args: argparse.Namespace) -> int:
    from mi_core.backend import require_points
    from mi_core.hooks import HookPoint, HookSpec
    from mi_core.interp._common import check_heads, check_layers
    from mi_core.util.plot import plot_attention

    model = _load(args)
    (layer,) = check_layers([args.layer], model.num_layers)
    hp = HookPoint.attn_pattern(layer)
    require_points(model, [hp])
    ids = model.to_tokens(args.prompt)
    full = model.forward(ids, HookSpec().capture(hp)).require(hp)[0].float().cpu()
    if args.head is not None:
        (h,) = check_heads([args.head], model.num_heads)
        pat = full[h]
    else:
        pat = full.mean(0)
    toks = model.to_str_tokens(ids[0])
    r = AttentionResult(layer, args.head, toks, pat, args.prompt, model.source)
    last = pat[-1]
    order = last.argsort(descending=True)[: args.k].tolist()
    which = f"head {args.head}" if args.head is not None else "mean of heads"
    console.say(f"layer {layer} {which}: last token {toks[-1]!r} attends to " +
                ", ".join(f"{i}:{toks[i]!r} {float(last[i]):.3f}" for i in order))
    _write_json(args.json_out, r, args.raw)

    def html(path: Path) -> Any:
        from mi_core.viz import attention_html

        return attention_html(toks, full, path, layer=layer, head=args.head,
                              model_name=model_name(model), prompt=args.prompt)
    _write_plot(args.plot_out, lambda p: plot_attention(
        pat, toks, p, title=f"attention, {model_name(model)}, layer {layer} {which}\n"
                            f"prompt {args.prompt!r}"), html=html)
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
                          show_progress=console.verbose or None)
    console.say(f"attention steering of layers {_span(layers)}, scale sweep:\n" +
                format_dose(curve, model))
    _write_json(args.json_out, curve, args.raw)
    _write_plot(args.plot_out, lambda p: plot_dose_response(
        curve, p, title=f"attention steering, {model_name(model)}, layers {_span(layers)}\n"
                        f"prompt {args.prompt!r}"), html=_html_of(curve))
    return 0


def _span(layers: list[int]) -> str:
    return (f"{layers[0]}-{layers[-1]}" if layers == list(range(layers[0], layers[-1] + 1))
            and len(layers) > 1 else ",".join(map(str, layers)))


def _cmd_heads(args: argparse.Namespace) -> int:
    from mi_core.interp.circuits import detect_heads, repeated_random_tokens
    from mi_core.util.plot import plot_grid

    model = _load(args)
    ids = repeated_random_tokens(model, args.length, args.batch, args.seed)
    r = detect_heads(model, ids)
    lines = []
    for kind in r.scores:
        lines.append(f"{kind}: " + ", ".join(f"L{a}H{b} {s:.3f}"
                                             for a, b, s in r.top(kind, args.k)))
    console.say("\n".join(lines))
    _write_json(args.json_out, r, args.raw)
    kind = "induction" if "induction" in r.scores else next(iter(r.scores))
    _write_plot(args.plot_out, lambda p: plot_grid(
        r.scores[kind], [str(i) for i in range(model.num_layers)],
        [str(h) for h in range(model.num_heads)], p,
        title=f"{kind} head scores, {model_name(model)}\n{args.batch} x repeated random "
              f"tokens of length {args.length}",
        xlabel="head", ylabel="layer", signed=False, vmin=0.0, vmax=1.0,
        colorbar_label="attention on the ideal edges"), html=_html_of(r))
    return 0


# -- registration ----------------------------------------------------------------------

def register(sub: "argparse._SubParsersAction[Any]") -> None:
    """Add the analysis subcommands to the ``mi`` parser."""
    K = "how many tokens / cells to print (default: %(default)s)"
    p = sub.add_parser("demo", help="top-5 next tokens, logit lens and an attention knockout on "
                       "the embedded default model (no network)",
                       description="Top-k next tokens, the logit lens and an attention knockout "
                       "on the embedded default model a plugin provides (or --model).")
    _common(p)
    p.add_argument("--k", type=A.positive_int, default=5, help=K)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("run", help="what `mi demo` shows, for any supported model",
                       description="What `mi demo` shows, for any supported model.")
    _common(p)
    p.add_argument("--k", type=A.positive_int, default=5, help=K)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("logit-lens", help="top tokens after every layer at one position",
                       description="The logit lens: the residual stream after each layer read "
                       "through the final norm and unembedding.")
    _common(p)
    p.add_argument("--k", type=A.positive_int, default=5, help="top-k tokens per layer "
                   "(default: %(default)s)")
    p.add_argument("--position", type=int, default=-1,
                   help="token position to read (negative counts from the end; default: -1)")
    p.add_argument("--mid", action="store_true",
                   help="also lens resid_mid (between attention and MLP) of each layer")
    p.add_argument("--target", action="append", metavar="TOKEN", type=A.text,
                   help="a single-token string whose probability and rank to track (repeatable)")
    p.set_defaults(func=_cmd_logit_lens)

    p = sub.add_parser("knockout", help="remove attention edges and measure the effect",
                       description="Remove attention edges (query -> key) and report the "
                       "effect on the next-token distribution, knocked out - baseline: KL, "
                       "probability, log-probability and logit changes.")
    _common(p)
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

    p = sub.add_parser("patch", help="activation patching grid between a clean and a corrupted "
                       "prompt", description="Activation patching: run the corrupted prompt with "
                       "one clean activation patched in, for every layer x position (or head); "
                       "the metric is logit(correct) - logit(incorrect), normalised to 0 = "
                       "corrupted, 1 = clean.")
    _common(p)
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
    p.add_argument("--k", type=A.positive_int, default=10, help=K)
    p.set_defaults(func=_cmd_patch)

    p = sub.add_parser("attention", help="attention pattern of one layer (one head or mean)",
                       description="The attention pattern of one layer: one head, or the mean "
                       "over heads.")
    _common(p)
    p.add_argument("--layer", type=A.nonneg_int, default=0, help="layer (default: 0)")
    p.add_argument("--head", type=A.nonneg_int, default=None,
                   help="head (default: the mean over heads)")
    p.add_argument("--k", type=A.positive_int, default=5,
                   help="how many keys of the last token to print (default: %(default)s)")
    p.set_defaults(func=_cmd_attention)

    p = sub.add_parser("steer", help="attention steering dose-response sweep",
                       description="Multiply the attention from the query positions to the key "
                       "positions by each scale (rows renormalised) and report the effect, "
                       "steered - baseline.")
    _common(p)
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

    p = sub.add_parser("heads", help="previous-token / duplicate-token / induction head scores "
                       "on repeated random tokens", description="Score every head as a "
                       "previous-token, duplicate-token and induction head on repeated random "
                       "tokens.")
    _common(p, prompt=False, html=False)
    p.add_argument("--length", type=A.positive_int, default=20,
                   help="length of the random sequence that is repeated (default: %(default)s)")
    p.add_argument("--batch", type=A.positive_int, default=4,
                   help="how many random sequences (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--k", type=A.positive_int, default=5, help="heads per kind to print "
                   "(default: %(default)s)")
    p.set_defaults(func=_cmd_heads)

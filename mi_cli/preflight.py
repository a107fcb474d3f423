"""Checks of a command's arguments against the model, answered BEFORE the weights load
when a backend can read the checkpoint's config or header (hook ``mi_checkpoint_info``),
else right after loading: layer, head and position ranges, target tokens that do not
exist with the given spacing, and knockouts that would remove every key of a query.

Each check reads the option it concerns from the parsed arguments when the command has it
(``--layer(s)``, ``--head(s)``, ``--position(s)``, ``--from``, ``--to``, ``--edge``,
``--target``, ``--correct``, ``--incorrect``, ``--corrupt``), so every command gets the
same checks and the same messages. Imported when a command runs (it may import torch).
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any, Sequence

import attrs

from mi_cli.output import CommandError, console


@attrs.define
class Dims:
    """What the checks need: the model's layer and head counts, its tokenizer (None: no
    position or token checks) and a name for messages."""

    num_layers: int
    num_heads: int
    tokenizer: Any
    name: str


class PreflightError(CommandError):
    """An argument that cannot work with this model, found before anything ran: a usage
    error (exit code 2), like a malformed one."""

    exit_code = 2


def checkpoint_info(source: str | None) -> Dims | None:
    """The dimensions a ``mi_cli`` plugin reads from `source` without its weights (None:
    the embedded default model); None when no plugin reads it. A file a plugin claims but
    cannot read (a text file named .gguf) raises that plugin's error here."""
    from mi_cli.main import plugin_manager
    from mi_cli.models import default_model_path
    from mi_core.plugin import MIError

    src = source if source is not None else default_model_path()
    if src is None:
        return None
    try:
        info = plugin_manager().hook.mi_checkpoint_info(source=str(src))
    except MIError:
        raise
    except Exception as exc:  # a plugin bug must not stop the command: checks run after loading
        console.detail(f"could not read {src} before loading ({type(exc).__name__}: {exc})")
        return None
    if not info:
        return None
    from mi_core.interp.describe import model_label

    return Dims(int(info["num_layers"]), int(info["num_heads"]), info.get("tokenizer"),
                model_label(src))


def dims_of(model: Any) -> Dims:
    from mi_core.interp.describe import model_label

    return Dims(model.num_layers, model.num_heads,
                model.tokenizer if model.has_tokenizer else None, model_label(model))


def _bad(option: str, msg: str) -> PreflightError:
    return PreflightError(f"argument {option}: {msg}")


def _in_range(values: Sequence[int] | None, n: int, option: str, what: str, name: str) -> None:
    for v in values or ():
        if not 0 <= int(v) < n:
            raise _bad(option, f"{what} {v} out of range: {name} has {n} {what}s "
                               f"(valid: 0..{n - 1})")


def _positions(values: Sequence[int] | None, n: int, option: str, toks: list[str]) -> None:
    for v in values or ():
        if not -n <= int(v) < n:
            raise _bad(option, f"position {v} out of range for the prompt's {n} tokens "
                               f"{toks} (valid: {-n}..{n - 1})")


def check_ranges(args: argparse.Namespace, dims: Dims) -> None:
    """Layers and heads against the model's counts."""
    layers = getattr(args, "layers", None)
    layer = getattr(args, "layer", None)
    _in_range(layers, dims.num_layers, "--layers", "layer", dims.name)
    _in_range(None if layer is None else [layer], dims.num_layers, "--layer", "layer", dims.name)
    heads = getattr(args, "heads", None)
    head = getattr(args, "head", None)
    _in_range(heads, dims.num_heads, "--heads", "head", dims.name)
    _in_range(None if head is None else [head], dims.num_heads, "--head", "head", dims.name)


def _encode(tok: Any, text: str, special: bool) -> list[int]:
    return list(tok.encode(text, add_special_tokens=special))


def check_target(tok: Any, option: str, text: str, prompt: str | None) -> None:
    """A target must be one token; when it has no leading space, the prompt ends in a word
    and the spaced form is one token too, the model almost surely predicts the spaced one:
    warn (``--target Paris`` would silently track 'Paris', not ' Paris')."""
    ids = _encode(tok, text, False)
    spaced = None if text[:1].isspace() else " " + text
    spaced_ids = _encode(tok, spaced, False) if spaced is not None else []
    if len(ids) != 1:
        hint = (f"; {spaced!r} is one token (id {spaced_ids[0]}): did you mean "
                f"{option} {spaced!r}?" if len(spaced_ids) == 1 else "")
        raise _bad(option, f"{text!r} is {len(ids)} tokens {ids}, expected exactly one{hint}")
    after_word = prompt is None or not prompt[-1:].isspace()
    if spaced is not None and len(spaced_ids) == 1 and spaced_ids != ids and after_word:
        warnings.warn(f"{option} {text!r} is the token {text!r} (id {ids[0]}) WITHOUT a "
                      f"leading space; after a word the model predicts {spaced!r} (id "
                      f"{spaced_ids[0]}). Did you mean {option} {spaced!r}?", stacklevel=2)


def check_tokens(args: argparse.Namespace, dims: Dims) -> None:
    """Positions against the prompt's token count, target tokens, equal-length prompts and
    knockouts that would empty a query (needs the tokenizer)."""
    tok = dims.tokenizer
    prompt = getattr(args, "prompt", None)
    if tok is None or prompt is None:
        return
    ids = _encode(tok, prompt, True)
    n = len(ids)
    toks = [tok.decode([i]) for i in ids]
    for option, attr in (("--position", "position"), ("--from", "from_pos"), ("--to", "to_pos"),
                         ("--positions", "positions")):
        value = getattr(args, attr, None)
        _positions([value] if isinstance(value, int) else value, n, option, toks)
    for q, k in getattr(args, "edge", None) or ():
        _positions([q, k], n, "--edge", toks)
    corrupt = getattr(args, "corrupt", None)
    if corrupt is not None and len(_encode(tok, corrupt, True)) != n:
        raise _bad("--corrupt", f"{corrupt!r} is {len(_encode(tok, corrupt, True))} tokens, the "
                                f"prompt {prompt!r} {n}: patching needs the same token length")
    targets = getattr(args, "target", None)
    for option, value in ([("--target", t) for t in (
            targets if isinstance(targets, list) else [targets] if targets else [])]
            + [("--correct", getattr(args, "correct", None)),
               ("--incorrect", getattr(args, "incorrect", None))]):
        if value is not None:
            check_target(tok, option, value, prompt)
    if getattr(args, "command", None) == "knockout":
        check_knockout(args, dims, n, toks)


def knockout_spec(args: argparse.Namespace) -> Any:
    """The KnockoutSpec of ``mi knockout``'s arguments (default: last token -> token 0)."""
    from mi_core.interp.knockout import KnockoutSpec

    spec = KnockoutSpec(layers=args.layers, heads=args.heads, edges=args.edge or [],
                        from_positions=args.from_pos, to_positions=args.to_pos)
    if spec.is_empty():
        spec = attrs.evolve(spec, from_positions=[-1], to_positions=[0])
    return spec


def check_knockout(args: argparse.Namespace, dims: Dims, n: int, toks: list[str]) -> None:
    """Refuse a knockout that removes every key a query may attend to: softmax over nothing
    is undefined, so that query would attend to nothing at all (not an edge knockout; on a
    one-token prompt it reports a large KL with nonsense tokens)."""
    from mi_core.interp.knockout import emptied_queries

    empty = emptied_queries(knockout_spec(args), dims.num_heads, n)
    if empty:
        which = ", ".join(f"{q} {toks[q]!r}" for q in empty[:5])
        raise PreflightError(
            f"the knockout removes every key of query {which} (a query attends only to itself "
            f"and earlier tokens; the prompt has {n} tokens {toks}): that query would attend "
            "to nothing. Keep at least one key (e.g. --to positions that leave the query "
            "itself), or use a longer prompt")


def check_hook_names(names: Sequence[str], option: str, num_layers: int | None = None) -> None:
    """Refuse a hook name that is not a known point but is close to one (a typo), naming
    the nearest; a layer past the model's last one (when `num_layers` is known). Names no
    known point resembles are left to the model's own check (a backend's custom points)."""
    import difflib

    from mi_core.plugin import GLOBAL_NAMES, LAYER_SUFFIXES, HookPoint, get_plugin_manager

    get_plugin_manager()  # plugins declare their extra points when they load
    for name in names:
        try:
            hp = HookPoint.parse(name)
        except Exception as exc:  # a malformed name: the kernel's message says why
            raise _bad(option, str(exc)) from None
        if hp.layer is not None and num_layers is not None and not 0 <= hp.layer < num_layers:
            raise _bad(option, f"{name!r}: layer {hp.layer} out of range (valid: 0.."
                               f"{num_layers - 1})")
        if not getattr(hp, "is_custom", False):
            continue
        layer = 0 if hp.layer is None else hp.layer
        known = list(GLOBAL_NAMES) + [f"blocks.{layer}.{s}" for s in LAYER_SUFFIXES]
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
        if close:
            raise _bad(option, f"unknown hook point {name!r}; did you mean "
                               f"{' or '.join(repr(c) for c in close)}?")


def check(args: argparse.Namespace, dims: Dims) -> None:
    check_ranges(args, dims)
    check_tokens(args, dims)


def load_checked(args: argparse.Namespace) -> Any:
    """The command's model, with every check done before the weights load when the
    checkpoint's config or header can be read, else right after loading."""
    from mi_cli.models import load

    t0 = time.perf_counter()
    dims = checkpoint_info(getattr(args, "model", None))
    if dims is not None:
        check(args, dims)
        console.detail(f"checked the arguments against {dims.name} without its weights in "
                       f"{time.perf_counter() - t0:.2f} s")
    model = load(args)
    if dims is None:
        check(args, dims_of(model))
    return model

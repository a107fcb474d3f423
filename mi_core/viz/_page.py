"""Assembling one self-contained HTML page: inline CSS and JS from ``assets/``, the data as
JSON in a ``<script type="application/json">`` block. Nothing is fetched, so a page works
from ``file://`` with no network."""

from __future__ import annotations

import base64
import ctypes
import html
import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import torch

from mi_core.plugin import ConfigError
from mi_core.viz._safe import MAX_LINE, visible


def _asset(name: str) -> str:
    return resources.files("mi_core.viz").joinpath("assets", name).read_text(encoding="utf-8")


def _clean(x: Any) -> Any:
    """JSON-able data. JSON has no NaN: a non-finite float travels as the object
    ``{"__float__": "NaN" | "Infinity" | "-Infinity"}``, which the page's reader turns back
    into the number (a token is always a string, so it can never be mistaken for one)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else {"__float__": str(x).replace("inf", "Infinity")
                                           .replace("nan", "NaN")}
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


_SURROGATE = re.compile("[\ud800-\udfff]")


def embed_json(data: Any) -> str:
    """JSON safe inside a <script> element: ``<``, ``>`` and ``&`` as \\u escapes, so a token
    such as ``</script>`` or ``<!--`` cannot end or confuse the block."""
    text = json.dumps(_clean(data), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    # a lone surrogate (a tokenizer can decode one) cannot be written as UTF-8: as a JSON
    # escape it is valid, and the page gets the same string back
    text = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    for c, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                   ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(c, esc)
    return text


def f32(t: torch.Tensor) -> dict[str, Any]:
    """A tensor as {"b64": little-endian float32 bytes, "shape": [...]}: compact and exact
    (to float32) for the large arrays (attention patterns, activations)."""
    a = t.detach().to(torch.float32).cpu().contiguous()
    raw = bytes((ctypes.c_char * (a.numel() * 4)).from_address(a.data_ptr())) if a.numel() else b""
    return {"b64": base64.b64encode(raw).decode("ascii"), "shape": list(a.shape)}


def check_html_path(path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        raise ConfigError(f"an interactive view is an HTML page: {str(path)!r} must end in .html")
    return path


def write_page(path: str | Path, view: str, title: str, data: dict[str, Any],
               subtitle: str = "", prompt: str | None = None) -> Path:
    """Write the page for `view` (assets/<view>.js, optional assets/<view>.css) with `data`.

    `title`: what the page shows; `subtitle`: one readable line saying what was done (model,
    hook point, layers, edges, strength, metric, sign convention); `prompt`: the input text.
    All three are shown with every invisible character escaped (:func:`visible`).
    """
    path = check_html_path(path)
    css = _asset("common.css")
    try:
        css += _asset(f"{view}.css")
    except FileNotFoundError:
        pass
    js = _asset("common.js") + "\n" + _asset(f"{view}.js")
    title = visible(title, MAX_LINE)
    head = [f"<header><h1 id='title'>{html.escape(title)}</h1>"]
    if subtitle:
        head.append(f"<p class='sub' id='what'>{html.escape(visible(subtitle, 2 * MAX_LINE))}</p>")
    if prompt is not None:
        head.append("<p class='sub'>prompt: <span class='prompt' id='prompt'>"
                    f"{html.escape(visible(prompt))}</span></p>")
    head.append("</header>")
    page = (f"<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{html.escape(title)}</title><style>{css}</style></head>\n<body>\n"
            + "".join(head) + "\n<div id='app'></div>\n"
            f"<script type='application/json' id='mi-data'>{embed_json(data)}</script>\n"
            f"<script>\n{js}\n</script>\n</body></html>\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def prompt_text(tokens: Sequence[str]) -> str:
    return "".join(tokens)

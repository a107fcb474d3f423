"""Chat templates: HuggingFace's ``apply_chat_template``, for ``model.tokenizer``
(:class:`~mi_core.tl.tokenizer.TLTokenizer`) and, as a convenience the TransformerLens layer
registers, ``MIModel.apply_chat_template``
(:func:`mi_core.tl.tokenizer.model_apply_chat_template`).

Where the template comes from, as transformers reads it: a checkpoint directory's
``chat_template.jinja`` and ``additional_chat_templates/*.jinja`` (named templates), which take
priority over ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of
``{"name", "template"}``); a GGUF file's ``tokenizer.chat_template`` metadata (read with the GGUF
ring's header reader); or a ``chat_template`` attribute of the tokenizer object (a plugin's
tokenizer, or the one a transformers ``tokenizer=`` carries).

Templates are untrusted code (they come with checkpoints): they render in jinja2's
``ImmutableSandboxedEnvironment`` with transformers' settings (``trim_blocks``,
``lstrip_blocks``, the ``loopcontrols`` extension, a ``{% generation %}`` tag) and globals
(``raise_exception``, ``strftime_now``, a ``tojson`` that does not HTML-escape, a ``dict`` and a
``namespace`` that refuse underscore names), and see only plain data: the messages, tools,
documents and extra keyword arguments are rebuilt from JSON types (anything else becomes a
``"<TypeName>"`` placeholder, as transformers does). jinja2 (>= 3.1.6, the release without the
known sandbox escapes) is imported only here, when a template is rendered: ``pip install
"mi-core[tl]"``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from mi_core import MITokenizer, TokenizerError
from mi_core.tl.errors import TLTokenizerError, TLTypeError, TLValueError

CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
GGUF_CHAT_TEMPLATE = "tokenizer.chat_template"
#: Files a hub download fetches for chat templates (the ring's ``mi_hub_file_patterns``).
HUB_PATTERNS = [CHAT_TEMPLATE_FILE, f"{CHAT_TEMPLATE_DIR}/*.jinja"]
#: Names a message's reasoning goes under; the first is the one templates read (transformers).
_REASONING = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "

ChatTemplate = str | dict[str, str]


class ChatTemplateError(TokenizerError):
    """A chat template that does not compile or raises while rendering (``raise_exception``,
    a sandbox violation): a :class:`mi_core.TokenizerError`; what is raised is also the
    ``jinja2.exceptions.TemplateError`` transformers lets through (:func:`_template_error`:
    jinja2 is optional, so that subclass is made once it is imported)."""


# -- where a template comes from -------------------------------------------------------------
def read_chat_template(tokenizer: MITokenizer) -> ChatTemplate | None:
    """The chat template(s) of `tokenizer` (see the module doc): a string, {name: template}
    for several, or None when it has none."""
    own = getattr(tokenizer, "chat_template", None)
    source = Path(str(getattr(tokenizer, "source", "")))
    if own is not None:
        return _parse(own, f"{source}: the tokenizer's chat_template")
    if source.suffix == ".gguf" and source.is_file():
        from mi_core.gguf import read_gguf_header

        value = read_gguf_header(source).metadata.get(GGUF_CHAT_TEMPLATE)
        return _parse(value, f"{source}: {GGUF_CHAT_TEMPLATE}")
    if source.name == "tokenizer.json":
        return chat_template_from_directory(source.parent)
    return None


def chat_template_from_directory(directory: Path) -> ChatTemplate | None:
    """A checkpoint directory's chat template(s): the ``.jinja`` files first (transformers gives
    them priority), else ``tokenizer_config.json``'s ``chat_template``; None when neither."""
    directory = Path(directory)
    found: dict[str, str] = {}
    named = sorted((directory / CHAT_TEMPLATE_DIR).glob("*.jinja"))
    files = {"default": directory / CHAT_TEMPLATE_FILE,
             **{p.name.removesuffix(".jinja"): p for p in named}}
    for name, path in files.items():
        if not path.is_file():
            continue
        try:
            found[name] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"{path}: cannot read the chat template: {exc}") from None
    if found:
        return found["default"] if list(found) == ["default"] else found
    cfg = directory / "tokenizer_config.json"
    if not cfg.is_file():
        return None
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"{cfg}: invalid JSON: {exc}") from None
    return _parse(data.get("chat_template") if isinstance(data, dict) else None,
                  f"{cfg}: chat_template")


def _parse(value: Any, where: str) -> ChatTemplate | None:
    """A template value as stored: a string, {name: template}, or transformers' list of
    ``{"name": ..., "template": ...}``; anything else is a TokenizerError naming `where`."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(
            isinstance(t, Mapping) and isinstance(t.get("name"), str)
            and isinstance(t.get("template"), str) for t in value):
        value = {t["name"]: t["template"] for t in value}
    if isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str)
                                          for k, v in value.items()):
        return dict(value)
    raise TokenizerError(f"{where} must be a string or a list of {{\"name\": string, "
                         f"\"template\": string}}, got {value!r:.80}")


def select_template(own: ChatTemplate | None, chat_template: str | None,
                    tools: Any = None) -> str:
    """The template to render, as transformers' ``get_chat_template``: `chat_template` names
    one of several or is a template itself; of several, ``tool_use`` when tools are given, else
    ``default``. No template at all: a TLTokenizerError (transformers' ValueError)."""
    if isinstance(own, dict):
        if chat_template is not None:
            return own.get(chat_template, chat_template)
        if tools is not None and "tool_use" in own:
            return own["tool_use"]
        if "default" in own:
            return own["default"]
        raise TLTokenizerError(f"this tokenizer has several chat templates and no default: "
                               f"pass chat_template= one of {sorted(own)} (or a template)")
    if chat_template is not None:
        return chat_template
    if own is None:
        raise TLTokenizerError(
            "this tokenizer has no chat template (no chat_template.jinja or tokenizer_config."
            "json chat_template beside its tokenizer.json, no tokenizer.chat_template in its "
            "GGUF) and no chat_template= was passed")
    return own


# -- rendering -------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    """transformers' sandboxed jinja2 environment (see the module doc), built once."""
    try:
        import jinja2
        from jinja2 import nodes
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise TLTokenizerError('chat templates need jinja2: pip install "mi-core[tl]"') from None
    if tuple(int(p) for p in jinja2.__version__.split(".")[:3] if p.isdigit()) < (3, 1, 6):
        raise TLTokenizerError(f"chat templates need jinja2 >= 3.1.6 (older releases have "
                               f"sandbox escapes), found {jinja2.__version__}")

    class Generation(Extension):  # transformers' {% generation %}: the body, rendered as is
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    class TemplateDict:  # `dict(...)` without the class itself (no attribute tricks)
        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    def check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace, "
                f"got {name!r}")

    class TemplateNamespace(jinja2.utils.Namespace):  # no dunder attributes stored
        def __init__(*args: Any, **kwargs: Any) -> None:  # Namespace's signature trick
            self, rest = args[0], args[1:]
            for name in dict(*rest, **kwargs):
                check(name)
            jinja2.utils.Namespace.__init__(self, *rest, **kwargs)

        def __setitem__(self, name: str, value: Any) -> None:
            check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:  # jinja's own escapes <, >, &, '
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, dict=TemplateDict(),
                       namespace=TemplateNamespace,
                       strftime_now=lambda fmt: datetime.now().strftime(fmt))
    return env


@functools.lru_cache(maxsize=1)
def _template_error() -> type[ChatTemplateError]:
    """The :class:`ChatTemplateError` raised: also a ``jinja2.exceptions.TemplateError``."""
    from jinja2.exceptions import TemplateError

    return type("ChatTemplateError", (ChatTemplateError, TemplateError),
                {"__module__": __name__, "__doc__": ChatTemplateError.__doc__})


@functools.lru_cache(maxsize=16)
def _compiled(template: str) -> Any:
    from jinja2.exceptions import TemplateError

    try:
        return _environment().from_string(template)
    except TemplateError as exc:
        raise _template_error()(f"the chat template does not compile: {exc}") from exc


def _plain(value: Any) -> Any:
    """`value` rebuilt from JSON types for the template (transformers' defence in depth: the
    sandbox does not know which methods of rich objects are dangerous); others become
    ``"<TypeName>"``."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):  # subclasses (enums, numpy scalars) lose their methods
        return str.__str__(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if type(value).__module__ == "numpy" and type(value).__name__ != "ndarray" \
            and hasattr(value, "item"):  # a numpy scalar: np.bool_(False) must stay falsy
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic (OpenAI SDK messages)
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _messages(conversation: Any) -> list[dict[str, Any]]:
    """A conversation as plain message dicts, keys whose value is None dropped (templates
    handle a missing key, not ``content=None``), reasoning under every name templates read."""
    out = []
    for message in _plain(getattr(conversation, "messages", conversation)):
        if not isinstance(message, dict):
            raise TLTypeError(f"chat messages must be dicts (or dataclasses / pydantic "
                              f"models), got {message!r:.80}")
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING if k in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def _tool_schemas(tools: Sequence[Any] | None) -> list[dict] | None:
    """JSON schemas of the tools (functions converted with transformers' get_json_schema)."""
    if tools is None:
        return None
    out = []
    for tool in tools:
        if isinstance(tool, Mapping):
            out.append(tool)
        elif callable(tool):
            try:
                from transformers.utils import get_json_schema
            except ImportError:
                raise TLValueError(f"tool {tool!r:.60} is a function: converting it to a JSON "
                                   f"schema needs transformers; pass the schema (a dict)") from None
            out.append(get_json_schema(tool))
        else:
            raise TLValueError(f"tools must be JSON schemas (dicts) or functions, got "
                               f"{tool!r:.60}")
    return out


def render_chat(template: str, conversations: Sequence[Any], *, tools: Any = None,
                documents: Any = None, add_generation_prompt: bool = False,
                continue_final_message: bool | str = False,
                template_kwargs: Mapping[str, Any] | None = None) -> list[str]:
    """Each conversation rendered with `template`, as transformers' ``render_jinja_template``:
    `template_kwargs` (special tokens, then the caller's extra arguments) are visible to the
    template; `continue_final_message` (True: ``"content"``, or the field to continue) leaves
    the last message open, the template's text after it cut off."""
    from jinja2.exceptions import TemplateError

    compiled = _compiled(template)
    if documents is not None and not all(isinstance(d, Mapping) for d in documents):
        raise TLTypeError("documents must be a list of dicts with 'title' and 'text' keys")
    shared = {"tools": _plain(_tool_schemas(tools)), "documents": _plain(documents),
              **_plain(dict(template_kwargs or {}))}
    rendered = []
    for conversation in conversations:
        chat = _messages(conversation)
        cut = _mark_final(chat, continue_final_message, template) \
            if continue_final_message else None
        try:
            text = compiled.render(messages=chat, add_generation_prompt=add_generation_prompt,
                                   **shared)
        except TemplateError as exc:
            raise _template_error()(f"the chat template raised: {exc}") from exc
        rendered.append(text if cut is None else _cut_at_mark(text, cut))
    return rendered


def _mark_final(chat: list[dict[str, Any]], field: bool | str, template: str) -> str:
    """Append the continuation mark to the final message's `field` (its last text block for
    content blocks); the text the mark follows (transformers' continue_final_message)."""
    if not chat:
        raise TLValueError("continue_final_message is set but the conversation is empty")
    field = field if isinstance(field, str) else "content"
    final = chat[-1].get(field)
    if final is None:
        raise TLValueError(f"continue_final_message is set but the final message has no "
                           f"{field!r} to continue")
    fields = [f for f in _REASONING if chat[-1].get(f) == final] if field in _REASONING \
        else [field]
    if not any(f in template for f in fields):
        raise TLValueError(f"continue_final_message is set to {field!r} but the chat template "
                           f"does not read that field")
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if isinstance(block, dict) and "text" in block:
                text = block["text"]
                block["text"] = text + _CONTINUE_TAG
                return text
        raise TLValueError("continue_final_message is set but the final message has no text "
                           "block to continue")
    for f in fields:
        chat[-1][f] = chat[-1][f] + _CONTINUE_TAG
    return final


def _cut_at_mark(text: str, final: str) -> str:
    """`text` up to the continuation mark (spaces before it kept where the template kept the
    mark's own trailing space, else trimmed as the template trimmed them)."""
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise TLValueError(f"continue_final_message is set but the final message does not "
                           f"appear in the rendered chat (the template changed it): "
                           f"{final.strip()!r:.80}")
    at = text.rindex(tag)
    return text[:at] if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()


# -- apply_chat_template ---------------------------------------------------------------------
def apply_chat_template(tokenizer: MITokenizer, conversation: Any, *,
                        template: ChatTemplate | None, special_tokens: Mapping[str, str],
                        pad_token_id: int | None, padding_side: str = "right",
                        **options: Any) -> Any:
    """HuggingFace's ``apply_chat_template`` over `tokenizer` with `template` (the tokenizer's
    own, :func:`read_chat_template`) and `special_tokens` (``bos_token``, ... visible to the
    template); `options` are the method's arguments (documented by
    :meth:`mi_core.tl.tokenizer.TLTokenizer.apply_chat_template`).

    Returns the rendered text (``tokenize=False``; a list for a batch), else the ids without
    special tokens added (the template writes them): list[int] / list[list[int]], a LongTensor
    [batch, seq] with ``return_tensors="pt"`` (batch 1 for one conversation), or
    ``{"input_ids", "attention_mask"}`` of those with ``return_dict=True``."""
    o = _Options(**options)
    if o.return_assistant_tokens_mask or o.sanitize_control_tokens:
        raise TLValueError("apply_chat_template: return_assistant_tokens_mask and "
                           "sanitize_control_tokens are not supported by mi_core.tl")
    if o.continue_final_message and o.add_generation_prompt:
        raise TLValueError("continue_final_message and add_generation_prompt are not "
                           "compatible: the first continues the last message, the second "
                           "starts a new assistant message")
    chosen = select_template(template, o.chat_template, o.tools)
    if isinstance(conversation, (list, tuple)) and not conversation:
        raise TLValueError("cannot apply a chat template to an empty conversation")
    batched = isinstance(conversation, (list, tuple)) and (
        isinstance(conversation[0], (list, tuple)) or hasattr(conversation[0], "messages"))
    texts = render_chat(chosen, conversation if batched else [conversation], tools=o.tools,
                        documents=o.documents, add_generation_prompt=o.add_generation_prompt,
                        continue_final_message=o.continue_final_message,
                        template_kwargs={**special_tokens, **o.template_kwargs})
    if not o.tokenize:
        return texts if batched else texts[0]
    rows = [list(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    if o.truncation and o.max_length is not None:
        rows = [r[:o.max_length] for r in rows]
    masks: Any = [[1] * len(r) for r in rows]
    ids: Any = rows
    if o.padding or o.return_tensors is not None:
        ids, masks = _pad(rows, bool(o.padding), pad_token_id, padding_side, o.return_tensors)
    if o.return_tensors is None and not batched:
        ids, masks = ids[0], masks[0]
    return {"input_ids": ids, "attention_mask": masks} if o.return_dict else ids


class _Options:
    """apply_chat_template's arguments beyond the conversation (transformers' names and
    defaults, but ``return_dict=False``, transformers 4's default); the others are passed to
    the template (``template_kwargs``), as transformers passes them."""

    DEFAULTS: dict[str, Any] = {
        "tools": None, "documents": None, "chat_template": None, "add_generation_prompt": False,
        "continue_final_message": False, "tokenize": True, "padding": False,
        "truncation": False, "max_length": None, "return_tensors": None, "return_dict": False,
        "return_assistant_tokens_mask": False, "sanitize_control_tokens": False,
        "tokenizer_kwargs": None}

    def __init__(self, **options: Any) -> None:
        for name, default in self.DEFAULTS.items():
            setattr(self, name, options.pop(name, default))
        self.template_kwargs = options
        kw = dict(self.tokenizer_kwargs or {})  # only these change what the tokenizer returns
        self.padding = kw.pop("padding", self.padding)
        self.truncation = kw.pop("truncation", self.truncation)
        self.max_length = kw.pop("max_length", self.max_length)
        if self.return_tensors not in (None, "pt"):
            raise TLValueError(f"return_tensors must be 'pt' or None, got {self.return_tensors!r}")
        if self.padding not in (True, False, "longest", "do_not_pad"):
            raise TLValueError(f"padding must be True, False or 'longest', got {self.padding!r}")
        self.padding = self.padding in (True, "longest")


def _pad(rows: list[list[int]], padding: bool, pad_id: int | None, side: str,
         return_tensors: str | None) -> tuple[Any, Any]:
    """Rows padded to the longest with `pad_id` on `side` (a LongTensor [batch, seq] each with
    ``return_tensors="pt"``); rows of different lengths without `padding` cannot be a tensor."""
    n = max(len(r) for r in rows)
    if any(len(r) != n for r in rows):
        if not padding:
            raise TLValueError("conversations of different lengths need padding=True to be "
                               "returned as one tensor")
        if pad_id is None:
            raise TLTokenizerError("padding needs a pad token: this tokenizer has none (no "
                                   "pad, EOS or BOS token)")
    ids = [([pad_id] * (n - len(r)) + r) if side == "left" else (r + [pad_id] * (n - len(r)))
           for r in rows]
    masks = [([0] * (n - len(r)) + [1] * len(r)) if side == "left"
             else ([1] * len(r) + [0] * (n - len(r))) for r in rows]
    if return_tensors == "pt":
        return torch.tensor(ids, dtype=torch.long), torch.tensor(masks, dtype=torch.long)
    return ids, masks


__all__ = ["CHAT_TEMPLATE_DIR", "CHAT_TEMPLATE_FILE", "ChatTemplateError", "GGUF_CHAT_TEMPLATE",
           "HUB_PATTERNS", "apply_chat_template", "chat_template_from_directory",
           "read_chat_template", "render_chat", "select_template"]

"""The identity of a sweep's function: what changes its results.

``fn_identity(fn)`` digests the function's source text (its bytecode and constants when
there is no source), and, each under its own label, its defaults, the values it closes over,
the arguments of a ``functools.partial``, the instance of a bound method or of a callable
object. Values are digested by content and structure (dicts and sets in a canonical order,
tensors and arrays by dtype, shape and bytes, functions by their own identity, other objects
through their pickle reduction, which is only *called*, never unpickled), so the same value
gives the same digest in any process: no memory address, ``id`` or hash randomisation enters.
A value that cannot be digested stably (a lock, an open file, a generator) is a SweepError
naming it. Module-level names a function reads (globals) are not part of its identity.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import struct
import types
from pathlib import PurePath
from typing import Any, Callable

from mi_core.plugin import MIModel
from mi_core.scale._common import SweepError, model_identity

_SCALARS = (type(None), bool, int, float, complex, str, bytes, bytearray, range, slice)
_BUILTIN_CALLABLES = (types.BuiltinFunctionType, types.BuiltinMethodType,
                      types.MethodDescriptorType, types.WrapperDescriptorType,
                      types.MethodWrapperType, types.ClassMethodDescriptorType)


class _Unstable(Exception):
    """A value on `path` cannot be digested stably (turned into a SweepError by the caller)."""

    def __init__(self, path: str, value: Any, why: str) -> None:
        super().__init__(f"{path} ({type(value).__module__}.{type(value).__qualname__}): {why}")


class _Digest:
    """Feeds values into one sha256, depth first, with a guard against cycles."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.active: set[int] = set()

    def put(self, tag: str, data: bytes = b"") -> None:
        self.h.update(tag.encode() + b":" + struct.pack("<Q", len(data)) + data)

    def sub(self, value: Any, path: str) -> str:
        """The digest of `value` on its own (to sort dict entries and set members)."""
        d = _Digest()
        d.active = self.active
        d.feed(value, path)
        return d.h.hexdigest()[:32]

    def feed(self, v: Any, path: str) -> None:
        if isinstance(v, _SCALARS):
            data = v if isinstance(v, (bytes, bytearray)) else repr(v).encode(
                "utf-8", "surrogatepass")
            return self.put(type(v).__name__, bytes(data))
        if id(v) in self.active:
            return self.put("cycle")
        self.active.add(id(v))
        try:
            self._feed(v, path)
        except RecursionError:
            raise _Unstable(path, v, "nested too deeply") from None
        finally:
            self.active.discard(id(v))

    def _feed(self, v: Any, path: str) -> None:
        import torch

        if isinstance(v, (list, tuple)):
            self.put(f"seq {type(v).__qualname__}", str(len(v)).encode())
            for i, x in enumerate(v):
                self.feed(x, f"{path}[{i}]")
        elif isinstance(v, dict):
            items = sorted((self.sub(k, f"{path} key {k!r:.40}"), self.sub(x, f"{path}[{k!r:.40}]"))
                           for k, x in v.items())
            self.put(f"dict {type(v).__qualname__}", repr(items).encode())
        elif isinstance(v, (set, frozenset)):
            self.put(f"set {type(v).__qualname__}",
                     repr(sorted(self.sub(x, f"{path} member") for x in v)).encode())
        elif isinstance(v, torch.Tensor):
            self._tensor(v, path)
        elif isinstance(v, (torch.dtype, torch.device, enum.Enum, PurePath)):
            self.put(type(v).__qualname__, repr(v).encode())
        elif isinstance(v, torch.Generator):
            self.put("generator")
            self._tensor(v.get_state(), path + ".get_state()")
        elif isinstance(v, MIModel):
            self.put("model", repr(sorted(model_identity(v).items())).encode())
        elif isinstance(v, torch.nn.Module):
            self._module(v, path)
        elif type(v).__module__ == "numpy" and hasattr(v, "tobytes") and hasattr(v, "dtype"):
            self.put(f"numpy {v.dtype.str} {getattr(v, 'shape', ())}", v.tobytes())
        else:
            self._code_like(v, path)

    def _code_like(self, v: Any, path: str) -> None:
        if isinstance(v, types.CodeType):
            self.put("code", v.co_code + repr((v.co_names, v.co_varnames)).encode())
            for i, c in enumerate(v.co_consts):
                self.feed(c, f"{path}.co_consts[{i}]")
        elif isinstance(v, types.ModuleType):
            self.put("module", v.__name__.encode())
        elif isinstance(v, type):
            self.put("class", _qualified(v).encode())
            self.put("source", _source(v))
        elif isinstance(v, (types.FunctionType, types.MethodType, functools.partial)):
            self.put("function", repr(sorted(_parts(v, path, self).items())).encode())
        elif isinstance(v, _BUILTIN_CALLABLES):
            self.put("builtin", _qualified(v).encode())
            owner = getattr(v, "__self__", None)
            if owner is not None and not isinstance(owner, (types.ModuleType, type)):
                self.feed(owner, path + ".__self__")
        else:
            self._object(v, path)

    def _tensor(self, t: Any, path: str) -> None:
        import torch

        if t.device.type == "meta":
            raise _Unstable(path, t, "a meta tensor has no values")
        t = t.detach()
        if t.layout != torch.strided:
            t = t.to_dense()
        t = t.to("cpu").contiguous().reshape(-1)
        self.put(f"tensor {t.dtype} {list(t.shape)}")
        if t.numel():
            from mi_core.scale.shards import tensor_bytes

            self.h.update(tensor_bytes(t))

    def _module(self, m: Any, path: str) -> None:
        self.put("nn.Module", _qualified(type(m)).encode())
        self.put("source", _source(type(m)))
        self.feed(dict(m.state_dict()), path + ".state_dict()")
        public = {k: x for k, x in vars(m).items() if not k.startswith("_")}
        self.feed(public, path)

    def _object(self, v: Any, path: str) -> None:
        """Any other object, through its pickle reduction (``__reduce_ex__``: what pickle
        would store, i.e. its class and state), called but never unpickled."""
        try:
            rv = v.__reduce_ex__(4)
        except Exception as exc:  # locks, files, generators, C objects without state
            raise _Unstable(path, v, f"it has no stable value ({exc})") from None
        if isinstance(rv, str):  # a module-level singleton, pickled by name
            return self.put("global", f"{type(v).__module__}.{rv}".encode())
        self.put("object", _qualified(type(v)).encode())
        for i, part in enumerate(rv[:5]):
            if i >= 3 and part is not None:
                part = list(part)  # listitems / dictitems iterators
            self.feed(part, path if i == 2 else f"{path}<reduce {i}>")


def _qualified(obj: Any) -> str:
    return f"{getattr(obj, '__module__', None) or '?'}.{getattr(obj, '__qualname__', repr(obj))}"


def _source(obj: Any) -> bytes:
    try:
        return inspect.getsource(obj).encode("utf-8", "surrogatepass")
    except (OSError, TypeError):
        return b""  # a class or function without source (a builtin): its name identifies it


def _code_hash(target: Any, path: str) -> str:
    """sha256 of `target`'s source text, else of its bytecode and constants."""
    text = _source(target)
    if text:
        return hashlib.sha256(text).hexdigest()[:32]
    code = getattr(target, "__code__", None)
    if code is None:
        return hashlib.sha256(_qualified(target).encode()).hexdigest()[:32]
    return _Digest().sub(code, path + ".__code__")


def _parts(fn: Any, path: str, d: _Digest) -> dict[str, str]:
    """Label -> digest of everything that makes `fn` compute what it computes: its code
    (``code``) and each value bound to it (``default x``, ``closure k``, ``partial arg 0``,
    ``partial keyword x``, ``self``). Values are digested with `d`'s cycle guard."""
    if isinstance(fn, functools.partial):
        out = _parts(fn.func, path, d)
        for i, a in enumerate(fn.args):
            out[f"partial arg {i}"] = d.sub(a, f"{path} partial argument {i}")
        for k, a in fn.keywords.items():
            out[f"partial keyword {k}"] = d.sub(a, f"{path} partial keyword {k!r}")
        return out
    out = {}
    if isinstance(fn, types.MethodType):
        out["self"] = d.sub(fn.__self__, f"{path}.__self__")
        fn = fn.__func__
    if not isinstance(fn, types.FunctionType):  # a builtin, or a callable object + its state
        if isinstance(fn, _BUILTIN_CALLABLES):
            out["code"] = hashlib.sha256(_qualified(fn).encode()).hexdigest()[:32]
        else:
            out["code"] = _code_hash(type(fn), path)
            out["self"] = d.sub(fn, path)
        return out
    out["code"] = _code_hash(fn, path)
    code = fn.__code__
    positional = code.co_varnames[:code.co_argcount]
    defaults = fn.__defaults__ or ()
    named = list(zip(positional[len(positional) - len(defaults):], defaults))
    for name, value in named + list((fn.__kwdefaults__ or {}).items()):
        out[f"default {name}"] = d.sub(value, f"{path} default {name!r}")
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # not assigned yet
            out[f"closure {name}"] = "unassigned"
            continue
        out[f"closure {name}"] = d.sub(value, f"{path} closed-over {name!r}")
    return out


def describe_change(label: str) -> str:
    """A label of :func:`fn_identity` in words ("closure k" -> "its closed-over value 'k'")."""
    kind, _, name = label.partition(" ")
    return {"name": "its name", "source_hash": "its source",
            "closure": f"its closed-over value {name!r}", "default": f"its default {name!r}",
            "self": "its bound instance"}.get(kind, label)


def fn_identity(fn: Callable[..., Any]) -> dict[str, Any]:
    """``{"name": qualname, "module": ..., "source_hash": ..., "bound": {label: digest}}``.

    ``source_hash`` is of the source text (of the bytecode and constants when there is none),
    ``bound`` holds a digest per default, closed-over value, partial argument and bound
    instance (see the module docstring). Stores compare name, source hash and bound values,
    not the module: a script's function is ``__main__.f`` when run and ``script.f`` when
    imported. SweepError naming a value that cannot be digested stably.
    """
    target = fn
    while isinstance(target, (functools.partial, types.MethodType)):
        target = target.func if isinstance(target, functools.partial) else target.__func__
    name = getattr(target, "__qualname__", None) or _qualified(type(target))
    d = _Digest()
    try:
        parts = _parts(fn, name, d)
    except _Unstable as exc:
        raise SweepError(
            f"the sweep function {name!r} is tied to a value that cannot be fingerprinted: "
            f"{exc}. A store records what a function computes with (its source, defaults and "
            f"closed-over values) so that a resumed sweep is refused when they change; pass "
            f"this value in the jobs, or read it from a module-level name (globals are not "
            f"part of the identity)") from None
    code = parts.pop("code")
    return {"name": name, "module": str(getattr(target, "__module__", None) or "?"),
            "source_hash": code, "bound": parts}

"""TransformerLens' hooking modules: :class:`HookPoint` and :class:`HookedRootModule`.

``from mi_core.tl import HookedRootModule, HookPoint`` gives TransformerLens' own interface
(``transformer_lens.hook_points``): a ``HookPoint`` is an identity ``nn.Module`` whose forward
hooks ``fn(activation, hook=point)`` may replace the activation; a ``HookedRootModule`` names
every hook point after ``setup()`` and offers ``add_hook`` / ``reset_hooks`` / the ``hooks()``
context manager / ``run_with_hooks`` / ``run_with_cache``. A custom model built from them runs
as in TransformerLens (its forward calls the hook points itself).

:class:`mi_core.tl.HookedTransformer` has the same tree of hook points, but its forward is the
kernel's: it reads the hooks registered on these modules and runs them at the kernel's points
(see :mod:`mi_core.tl.hooked_transformer`). Not to be confused with the kernel's
:class:`mi_core.HookPoint`, the *name* of a point (``mi.HookPoint.resid_post(3)``).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterable, Iterator, Literal, Optional, Sequence, Union

import attrs
import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from mi_core.tl.errors import TLHookError, TLHookIndexError, TLTypeError, TLValueError

NamesFilter = Optional[Union[Callable[[str], bool], Sequence[str], str]]
Direction = Literal["fwd", "bwd"]


@attrs.define
class LensHandle:
    """One hook on a :class:`HookPoint` (TransformerLens' ``LensHandle``)."""

    hook: RemovableHandle
    is_permanent: bool = False
    context_level: Optional[int] = None
    user_hook: Optional[Callable[..., Any]] = None


class HookPoint(nn.Module):
    """An identity module that hook functions can read and rewrite (TransformerLens'
    ``HookPoint``). ``fn(activation, hook=self)`` returns a replacement or None."""

    def __init__(self) -> None:
        super().__init__()
        self.fwd_hooks: list[LensHandle] = []
        self.bwd_hooks: list[LensHandle] = []
        self.ctx: dict[Any, Any] = {}
        #: the point's name from the root module (set by ``HookedRootModule.setup``)
        self.name: Optional[str] = None

    def __repr__(self) -> str:
        bits = [f"name={self.name!r}"] if self.name is not None else []
        bits += [f"{len(self.fwd_hooks)} fwd"] if self.fwd_hooks else []
        bits += [f"{len(self.bwd_hooks)} bwd"] if self.bwd_hooks else []
        return f"HookPoint({', '.join(bits)})"

    def add_perma_hook(self, hook: Callable[..., Any], dir: Direction = "fwd") -> None:
        self.add_hook(hook, dir=dir, is_permanent=True)

    def add_hook(self, hook: Callable[..., Any], dir: Direction = "fwd",
                 is_permanent: bool = False, level: Optional[int] = None,
                 prepend: bool = False) -> None:
        """Register ``hook(activation, hook=self)`` (forward) or ``hook(grad, hook=self)``
        (backward); a returned tensor replaces the activation (the gradient upstream)."""
        if not callable(hook):
            raise TLTypeError(f"hook at {self.name!r} must be callable, got "
                              f"{type(hook).__name__}")
        if dir == "fwd":
            def fwd(module: nn.Module, inputs: Any, output: Any) -> Any:
                return hook(output, hook=self)
            handle = self.register_forward_hook(fwd, prepend=prepend)
            hooks = self.fwd_hooks
        elif dir == "bwd":
            def bwd(module: nn.Module, grad_in: Any, grad_out: Any) -> Any:
                out = hook(grad_out[0], hook=self)
                return None if out is None else (out if isinstance(out, tuple) else (out,))
            handle = self.register_full_backward_hook(bwd, prepend=prepend)
            hooks = self.bwd_hooks
        else:
            raise TLValueError(f"dir must be 'fwd' or 'bwd', got {dir!r}")
        entry = LensHandle(handle, is_permanent, level, user_hook=hook)
        hooks.insert(0, entry) if prepend else hooks.append(entry)

    def has_hooks(self, dir: Literal["fwd", "bwd", "both"] = "both",
                  including_permanent: bool = True, level: Optional[int] = None) -> bool:
        def any_in(handles: list[LensHandle]) -> bool:
            return any((including_permanent or not h.is_permanent)
                       and (level is None or h.context_level == level) for h in handles)
        if dir not in ("fwd", "bwd", "both"):
            raise TLValueError(f"dir must be 'fwd', 'bwd' or 'both', got {dir!r}")
        return (dir != "bwd" and any_in(self.fwd_hooks)) or (
            dir != "fwd" and any_in(self.bwd_hooks))

    def remove_hooks(self, dir: Literal["fwd", "bwd", "both"] = "fwd",
                     including_permanent: bool = False, level: Optional[int] = None) -> None:
        if dir not in ("fwd", "bwd", "both"):
            raise TLValueError(f"dir must be 'fwd', 'bwd' or 'both', got {dir!r}")

        def keep(handles: list[LensHandle]) -> list[LensHandle]:
            kept = []
            for h in handles:
                if including_permanent or (not h.is_permanent and (
                        level is None or h.context_level == level)):
                    h.hook.remove()
                else:
                    kept.append(h)
            return kept
        if dir in ("fwd", "both"):
            self.fwd_hooks = keep(self.fwd_hooks)
        if dir in ("bwd", "both"):
            self.bwd_hooks = keep(self.bwd_hooks)

    def clear_context(self) -> None:
        self.ctx = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def layer(self) -> int:
        """The layer of a ``blocks.{layer}...`` point; others raise a
        :class:`~mi_core.tl.errors.TLHookIndexError` (TransformerLens' IndexError / ValueError)."""
        if self.name is None:
            raise TLHookIndexError("this HookPoint has no name yet (HookedRootModule.setup() "
                                   "names it)")
        parts = self.name.split(".")
        if len(parts) < 2 or parts[0] != "blocks" or not parts[1].isdigit():
            raise TLHookIndexError(f"hook point {self.name!r} is not inside a block: no layer")
        return int(parts[1])


def names_filter_fn(names_filter: NamesFilter) -> Callable[[str], bool]:
    """TransformerLens' names_filter (None, a name, a list of names, a callable) as a callable."""
    if names_filter is None:
        return lambda name: True
    if isinstance(names_filter, str):
        return lambda name: name == names_filter
    if isinstance(names_filter, (list, tuple, set)):
        wanted = set(names_filter)
        return lambda name: name in wanted
    if callable(names_filter):
        return names_filter
    raise TLValueError(f"names_filter must be a name, a list of names or a function of the "
                       f"name, got {type(names_filter).__name__}")


class HookedRootModule(nn.Module):
    """A module whose :class:`HookPoint` descendants are named and hookable by name
    (TransformerLens' ``HookedRootModule``); call :meth:`setup` at the end of ``__init__``."""

    def __init__(self, *args: Any) -> None:
        super().__init__()
        self.is_caching = False
        self.context_level = 0
        self.mod_dict: dict[str, nn.Module] = {}
        self.hook_dict: dict[str, HookPoint] = {}

    def setup(self) -> None:
        """Name every submodule by its path; collect the hook points in ``hook_dict``."""
        self.mod_dict, self.hook_dict = {}, {}
        for name, module in self.named_modules():
            if name == "":
                continue
            module.name = name
            self.mod_dict[name] = module
            if isinstance(module, HookPoint):
                self.hook_dict[name] = module

    def hook_points(self) -> Iterable[HookPoint]:
        return self.hook_dict.values()

    # -- adding and removing hooks ------------------------------------------------------------
    def _point(self, name: str) -> HookPoint:
        point = self.mod_dict.get(name)
        if not isinstance(point, HookPoint):
            import difflib
            close = difflib.get_close_matches(name, list(self.hook_dict), n=3, cutoff=0.6)
            raise TLHookError(f"no hook point {name!r} in this model"
                              + (f"; nearest: {', '.join(close)}" if close else ""))
        return point

    def check_hooks_to_add(self, hook_point: HookPoint, hook_point_name: str,
                           hook: Callable[..., Any], dir: Direction = "fwd",
                           is_permanent: bool = False, prepend: bool = False) -> None:
        """Override to refuse some hooks (HookedTransformer refuses opt-in points that are off)."""

    def check_and_add_hook(self, hook_point: HookPoint, hook_point_name: str,
                           hook: Callable[..., Any], dir: Direction = "fwd",
                           is_permanent: bool = False, level: Optional[int] = None,
                           prepend: bool = False) -> None:
        self.check_hooks_to_add(hook_point, hook_point_name, hook, dir=dir,
                                is_permanent=is_permanent, prepend=prepend)
        hook_point.add_hook(hook, dir=dir, is_permanent=is_permanent, level=level,
                            prepend=prepend)

    def add_hook(self, name: Union[str, Callable[[str], bool]], hook: Callable[..., Any],
                 dir: Direction = "fwd", is_permanent: bool = False,
                 level: Optional[int] = None, prepend: bool = False) -> None:
        """A persistent hook at `name` (or at every point a callable filter accepts), kept
        until :meth:`reset_hooks` (never, with `is_permanent`, unless asked)."""
        if isinstance(name, str):
            self.check_and_add_hook(self._point(name), name, hook, dir=dir,
                                    is_permanent=is_permanent, level=level, prepend=prepend)
            return
        for point_name, point in self.hook_dict.items():
            if name(point_name):
                self.check_and_add_hook(point, point_name, hook, dir=dir,
                                        is_permanent=is_permanent, level=level, prepend=prepend)

    def add_perma_hook(self, name: Union[str, Callable[[str], bool]], hook: Callable[..., Any],
                       dir: Direction = "fwd") -> None:
        self.add_hook(name, hook, dir=dir, is_permanent=True)

    def remove_all_hook_fns(self, direction: Literal["fwd", "bwd", "both"] = "both",
                            including_permanent: bool = False,
                            level: Optional[int] = None) -> None:
        for point in self.hook_points():
            point.remove_hooks(direction, including_permanent=including_permanent, level=level)

    def clear_contexts(self) -> None:
        for point in self.hook_points():
            point.clear_context()

    def reset_hooks(self, clear_contexts: bool = True,
                    direction: Literal["fwd", "bwd", "both"] = "both",
                    including_permanent: bool = False, level: Optional[int] = None) -> None:
        if clear_contexts:
            self.clear_contexts()
        self.remove_all_hook_fns(direction, including_permanent, level=level)
        self.is_caching = False

    def _enable_hook(self, name: Union[str, Callable[[str], bool]], hook: Callable[..., Any],
                     dir: Direction) -> None:
        """A temporary hook (at the current context level); filters are not checked against
        opt-in points, as in TransformerLens (such a point simply never fires)."""
        if isinstance(name, str):
            self._point(name).add_hook(hook, dir=dir, level=self.context_level)
        elif callable(name):
            for point_name, point in self.hook_dict.items():
                if name(point_name):
                    point.add_hook(hook, dir=dir, level=self.context_level)
        else:
            raise TLTypeError(f"a hook's name must be a hook name or a function of the name, "
                              f"got {type(name).__name__}")

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: Sequence[tuple[Any, Callable[..., Any]]] = (),
              bwd_hooks: Sequence[tuple[Any, Callable[..., Any]]] = (),
              reset_hooks_end: bool = True, clear_contexts: bool = False
              ) -> Iterator["HookedRootModule"]:
        """Hooks for the duration of a ``with`` block (removed at its end unless
        `reset_hooks_end` is False)."""
        try:
            self.context_level += 1
            for name, hook in fwd_hooks:
                self._enable_hook(name, hook, "fwd")
            for name, hook in bwd_hooks:
                self._enable_hook(name, hook, "bwd")
            yield self
        finally:
            if reset_hooks_end:
                self.reset_hooks(clear_contexts, including_permanent=False,
                                 level=self.context_level)
            self.context_level -= 1

    # -- running -----------------------------------------------------------------------------
    def run_with_hooks(self, *model_args: Any,
                       fwd_hooks: Sequence[tuple[Any, Callable[..., Any]]] = (),
                       bwd_hooks: Sequence[tuple[Any, Callable[..., Any]]] = (),
                       reset_hooks_end: bool = True, clear_contexts: bool = False,
                       **model_kwargs: Any) -> Any:
        """The model's output with these hooks for this call (`reset_hooks_end=False` keeps
        them, e.g. so that backward hooks fire on a later ``.backward()``)."""
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts) as model:
            return model.forward(*model_args, **model_kwargs)

    def get_caching_hooks(self, names_filter: NamesFilter = None, incl_bwd: bool = False,
                          device: Any = None, remove_batch_dim: bool = False,
                          cache: Optional[dict[str, torch.Tensor]] = None,
                          pos_slice: Any = None
                          ) -> tuple[dict[str, torch.Tensor], list[Any], list[Any]]:
        """(cache, fwd_hooks, bwd_hooks): hooks that store each activation (``name_grad`` for
        gradients) in `cache`, not yet added."""
        from mi_core.tl.activation_cache import Slice

        cache = {} if cache is None else cache
        keep = names_filter_fn(names_filter)
        slicer = Slice.unwrap(pos_slice)  # an int keeps the axis, as TransformerLens
        self.is_caching = True

        def save(tensor: torch.Tensor, hook: HookPoint, is_backward: bool = False) -> None:
            name = hook.name + ("_grad" if is_backward else "")
            value = tensor.detach().to(device) if device is not None else tensor.detach()
            if remove_batch_dim:
                value = value[0]
            pos_dim = -3 if hook.name.endswith(("hook_q", "hook_k", "hook_v", "hook_z",
                                                "hook_result")) else -2
            if pos_slice is not None and value.dim() >= -pos_dim:
                value = slicer.apply(value, dim=pos_dim)
            cache[name] = value

        fwd = [(n, functools.partial(save, is_backward=False)) for n in self.hook_dict if keep(n)]
        bwd = [(n, functools.partial(save, is_backward=True)) for n in self.hook_dict
               if incl_bwd and keep(n)]
        return cache, fwd, bwd

    def add_caching_hooks(self, names_filter: NamesFilter = None, incl_bwd: bool = False,
                          device: Any = None, remove_batch_dim: bool = False,
                          cache: Optional[dict[str, torch.Tensor]] = None
                          ) -> dict[str, torch.Tensor]:
        """Persistent caching hooks; returns the dict they fill."""
        cache, fwd, bwd = self.get_caching_hooks(names_filter, incl_bwd, device,
                                                 remove_batch_dim, cache)
        for name, hook in fwd:
            self.hook_dict[name].add_hook(hook, "fwd")
        for name, hook in bwd:
            self.hook_dict[name].add_hook(hook, "bwd")
        return cache

    def cache_all(self, cache: Optional[dict[str, torch.Tensor]], incl_bwd: bool = False,
                  device: Any = None, remove_batch_dim: bool = False) -> None:
        """Persistent caching hooks at every point (TransformerLens' deprecated form of
        :meth:`add_caching_hooks`)."""
        self.add_caching_hooks(lambda name: True, incl_bwd, device, remove_batch_dim, cache)

    def cache_some(self, cache: Optional[dict[str, torch.Tensor]],
                   names: Callable[[str], bool], incl_bwd: bool = False, device: Any = None,
                   remove_batch_dim: bool = False) -> None:
        """Persistent caching hooks at the points `names` accepts (deprecated form)."""
        self.add_caching_hooks(names, incl_bwd, device, remove_batch_dim, cache)

    def list_hooks(self, name_filter: NamesFilter = None,
                   dir: Literal["fwd", "bwd", "both"] = "both",
                   including_permanent: bool = True) -> dict[str, list[LensHandle]]:
        """The hooks attached, by point name (points without hooks left out)."""
        keep = names_filter_fn(name_filter)
        out: dict[str, list[LensHandle]] = {}
        for name, point in self.hook_dict.items():
            if not keep(name):
                continue
            handles = (point.fwd_hooks if dir in ("fwd", "both") else []) + (
                point.bwd_hooks if dir in ("bwd", "both") else [])
            handles = [h for h in handles if including_permanent or not h.is_permanent]
            if handles:
                out[name] = handles
        return out

    def run_with_cache(self, *model_args: Any, names_filter: NamesFilter = None,
                       device: Any = None, remove_batch_dim: bool = False,
                       incl_bwd: bool = False, reset_hooks_end: bool = True,
                       clear_contexts: bool = False, pos_slice: Any = None,
                       **model_kwargs: Any) -> tuple[Any, dict[str, torch.Tensor]]:
        """(output, dict of every activation the filter selects); with `incl_bwd` the output
        (a scalar) is back-propagated and the gradients are cached as ``name_grad``."""
        cache, fwd, bwd = self.get_caching_hooks(names_filter, incl_bwd, device,
                                                 remove_batch_dim, pos_slice=pos_slice)
        with self.hooks(fwd, bwd, reset_hooks_end=reset_hooks_end,
                        clear_contexts=clear_contexts):
            out = self(*model_args, **model_kwargs)
            if incl_bwd:
                out.backward()
        return out, cache

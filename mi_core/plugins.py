"""The plugin manager: entry points of group ``mi_core``, loaded lazily on first use.

``MI_CORE_PLUGINS=name1,name2`` restricts which entry points load (by name);
unset or empty loads them all. Built-in plugins are ordinary entry points too.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import warnings
from typing import Any, Callable

import attrs
import pluggy

from mi_core import hookspecs
from mi_core.errors import MIError, PluginError, UnsupportedModelError
from mi_core.points import OPT_IN_SUFFIXES, declare_layer_points
from mi_core.registry import BackendSpec, DictionaryFormat, MixerSpec, TokenizerSpec, ViewSpec

ENTRY_POINT_GROUP = "mi_core"
ENV_VAR = "MI_CORE_PLUGINS"


@attrs.define
class PluginInfo:
    name: str
    distribution: str
    version: str
    module: str
    provides: list[str] = attrs.field(factory=list)
    #: why the plugin failed to load (it is then skipped, with a warning), else None
    error: str | None = None


class PluginLoadWarning(UserWarning):
    """A plugin's entry point could not be imported; it was skipped."""


_pm: pluggy.PluginManager | None = None
_infos: list[PluginInfo] = []
#: what mi_model_attributes / mi_register_views returned, gathered once (None: not yet)
_attributes: dict[str, Any] | None = None
_views: dict[str, ViewSpec] | None = None


def _allowed() -> set[str] | None:
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide PluginManager("mi_core"), loading entry points on first call."""
    global _pm
    if _pm is None:
        pm = pluggy.PluginManager("mi_core")
        pm.add_hookspecs(hookspecs)
        allowed = _allowed()
        infos: list[PluginInfo] = []
        for ep in md.entry_points(group=ENTRY_POINT_GROUP):
            if allowed is not None and ep.name not in allowed:
                continue
            if pm.has_plugin(ep.name):
                continue
            dist = getattr(ep, "dist", None)
            info = PluginInfo(name=ep.name, distribution=dist.name if dist else "?",
                              version=dist.version if dist else "?", module=ep.value)
            try:
                plugin = ep.load()
                pm.register(plugin, name=ep.name)
            except Exception as exc:  # a broken plugin must not take the others down: warn, skip
                info.error = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"mi-core plugin {ep.name!r} ({ep.value}) failed to load and is "
                              f"skipped: {info.error}", PluginLoadWarning, stacklevel=2)
            infos.append(info)
        _infos[:] = infos
        _pm = pm
        for plugin_name, result in call_per_plugin("mi_declare_hook_points", catch=True):
            if isinstance(result, Exception):
                raise PluginError(f"plugin {plugin_name!r}: mi_declare_hook_points failed: "
                                  f"{type(result).__name__}: {result}") from result
            _declare(plugin_name, result)
        for suffixes in pm.hook.mi_opt_in_hook_points():
            OPT_IN_SUFFIXES.update(suffixes or [])
    return _pm


def _declare(plugin_name: str, points: Any) -> None:
    if points is None:
        return
    if not isinstance(points, dict):
        raise PluginError(f"plugin {plugin_name!r}: mi_declare_hook_points must return a dict "
                          f"{{factory name: suffix}}, got {type(points).__name__}")
    declare_layer_points(points, owner=f"plugin {plugin_name!r}")


def register_plugin(plugin: Any, name: str) -> None:
    """Register an in-process plugin object (tests, notebooks) as if it were an entry point."""
    pm = get_plugin_manager()
    pm.register(plugin, name=name)
    declare = getattr(plugin, "mi_declare_hook_points", None)
    if declare is not None:
        _declare(name, declare())
    OPT_IN_SUFFIXES.update(getattr(plugin, "mi_opt_in_hook_points", list)() or [])
    _infos.append(PluginInfo(name=name, distribution="(in-process)", version="-",
                             module=getattr(plugin, "__name__", repr(plugin))))
    _forget_gathered()


def unregister_plugin(name: str) -> None:
    pm = get_plugin_manager()
    plugin = pm.get_plugin(name)
    if plugin is not None:
        pm.unregister(plugin)
    _infos[:] = [i for i in _infos if i.name != name]
    _forget_gathered()


def reset_plugins() -> None:
    """Forget the loaded plugins (the next use reloads them, honouring MI_CORE_PLUGINS)."""
    global _pm
    _pm = None
    _infos.clear()
    _forget_gathered()


def _forget_gathered() -> None:
    global _attributes, _views
    _attributes = _views = None


def _collect(results: list[Any]) -> list[Any]:
    out: list[Any] = []
    for r in results:
        if r is None:
            continue
        out.extend(r if isinstance(r, (list, tuple)) else [r])
    return out


def _hook_plugin_names(hook: Any) -> list[tuple[str, Any]]:
    pm = get_plugin_manager()
    out = []
    for impl in hook.get_hookimpls():
        out.append((pm.get_name(impl.plugin) or "?", impl.function))
    return out


def backends() -> dict[str, BackendSpec]:
    pm = get_plugin_manager()
    specs = _collect(pm.hook.mi_register_backends())
    return {s.name: s for s in specs}


def mixers() -> dict[str, MixerSpec]:
    """Every sequence mixer the plugins register (``mi_register_mixers``), by name."""
    return {s.name: s for s in _collect(get_plugin_manager().hook.mi_register_mixers())}


def mixer(name: str, needed_for: str = "this model") -> MixerSpec:
    """The mixer `name`; UnsupportedModelError naming it when no installed plugin has it."""
    found = mixers()
    if name not in found:
        raise UnsupportedModelError(f"{needed_for} needs the sequence mixer {name!r}, which no "
                                    f"installed plugin provides (mixers: "
                                    f"{', '.join(sorted(found)) or 'none'})")
    return found[name]


def dictionary_formats() -> list[DictionaryFormat]:
    return _collect(get_plugin_manager().hook.mi_register_dictionary_formats())


def tokenizer_specs() -> list[TokenizerSpec]:
    return _collect(get_plugin_manager().hook.mi_register_tokenizers())


def hub_file_patterns() -> list[str]:
    return _collect(get_plugin_manager().hook.mi_hub_file_patterns())


def model_attributes() -> dict[str, Any]:
    """{name: function or property} of every ``mi_model_attributes`` hook (gathered once); a
    name two plugins claim is a PluginError naming both."""
    global _attributes
    if _attributes is None:
        found: dict[str, tuple[str, Any]] = {}
        for plugin_name, result in call_per_plugin("mi_model_attributes"):
            if not isinstance(result, dict):
                raise PluginError(f"plugin {plugin_name!r}: mi_model_attributes must return a "
                                  f"dict {{name: function or property}}, got "
                                  f"{type(result).__name__}")
            for name, attr in result.items():
                if not (isinstance(name, str) and name.isidentifier()
                        and (callable(attr) or isinstance(attr, property))):
                    raise PluginError(f"plugin {plugin_name!r}: model attribute {name!r} must be "
                                      f"an identifier mapped to a function or a property")
                if name in found and found[name][1] is not attr:
                    raise PluginError(f"model attribute {name!r} is claimed by plugins "
                                      f"{found[name][0]!r} and {plugin_name!r}")
                found[name] = (plugin_name, attr)
        _attributes = {name: attr for name, (_, attr) in found.items()}
    return _attributes


def views() -> dict[str, ViewSpec]:
    """Every view the plugins register (``mi_register_views``), by name (gathered once)."""
    global _views
    if _views is None:
        _views = {v.name: v for v in _collect(get_plugin_manager().hook.mi_register_views())}
    return _views


def view(name: str) -> Callable[..., Any]:
    """The render function of view `name`; a PluginError when no installed plugin draws it."""
    spec = views().get(name)
    if spec is None:
        have = ", ".join(sorted(views())) or "none"
        raise PluginError(f"no installed plugin provides the view {name!r} (views: {have}); "
                          f"the built-in views come with mi-core's 'viz' plugin")
    return spec.render


def call_per_plugin(hookname: str, catch: bool = False, **kwargs: Any) -> list[tuple[str, Any]]:
    """Call hook `hookname` on each plugin separately: [(plugin name, result)].

    With `catch`, a plugin whose implementation raises something other than an MIError
    yields the exception as its result, so one broken plugin cannot hide the others.
    """
    pm = get_plugin_manager()
    hook = getattr(pm.hook, hookname)
    out: list[tuple[str, Any]] = []
    for name, fn in _hook_plugin_names(hook):
        try:
            out.append((name, fn(**kwargs)))
        except MIError:
            raise
        except Exception as exc:
            if not catch:
                raise
            out.append((name, exc))
    return out


def plugin_infos() -> list[PluginInfo]:
    """Installed plugins with versions and what each provides (for ``mi plugins``)."""
    pm = get_plugin_manager()
    out = []
    for info in _infos:
        plugin = pm.get_plugin(info.name)
        provides: list[str] = []
        if plugin is not None:
            for hookname, label in (("mi_register_backends", "backend"),
                                    ("mi_register_dictionary_formats", "dictionary format"),
                                    ("mi_register_tokenizers", "tokenizer"),
                                    ("mi_register_views", "view")):
                fn = getattr(plugin, hookname, None)
                if fn is not None:
                    for x in _collect([fn()]):
                        what = getattr(x, "description", "") or getattr(x, "looks_for", "")
                        provides.append(f"{label} {x.name}" + (f": {what}" if what else ""))
            attributes = getattr(plugin, "mi_model_attributes", None)
            if attributes is not None:
                names = sorted(attributes() or {}, key=lambda n: (n.startswith("_"), n.lower()))
                more = f", ... ({len(names)} in all)" if len(names) > 8 else ""
                provides.append(f"model attributes: {', '.join(names[:8])}{more}")
            if getattr(plugin, "mi_default_model", None) is not None:
                provides.append("default model")
            extra = getattr(plugin, "mi_plugin_info", None)
            if extra is not None:
                provides += list((extra() or {}).get("provides", []))
        out.append(attrs.evolve(info, provides=provides))
    return sorted(out, key=lambda i: i.name)

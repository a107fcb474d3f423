"""The records plugins register: backends, detections, dictionary formats, tokenizers, views,
sequence mixers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import attrs
import torch

from mi_core.protocol import MIBackend
from mi_core.tokenizer import MITokenizer


@attrs.define
class ModelSource:
    """A resolved checkpoint, as detection sees it: no weights are read.

    `path` is a directory or a single file; `config` the parsed ``config.json`` (None when
    there is none, e.g. a GGUF file); `tensor_names` from the safetensors headers.
    """

    path: Path
    config: dict[str, Any] | None = None
    tensor_names: list[str] = attrs.field(factory=list)
    tensor_shapes: dict[str, tuple[int, ...]] = attrs.field(factory=dict)

    @property
    def is_file(self) -> bool:
        return self.path.is_file()


@attrs.define
class Detection:
    """A backend's answer to "can you load this?"; score 0 means no."""

    backend: str
    score: float
    reason: str
    missing: list[str] = attrs.field(factory=list)
    unexpected: list[str] = attrs.field(factory=list)
    plugin: str = ""
    config_keys: list[str] = attrs.field(factory=list)  # config keys the backend refuses
    #: the plugin implements the checkpoint's model_type (even if it refuses this config)
    implements: bool = False
    gguf_architecture: str | None = None  # a GGUF file's general.architecture, as read

    @property
    def ok(self) -> bool:
        return self.score > 0


@attrs.define
class BackendSpec:
    """A backend a plugin provides. `load(source, device, dtype) -> MIBackend`; a backend
    that can place a model across devices takes ``placement=`` (a checked
    :class:`~mi_core.placement.Placement`) too."""

    name: str
    load: "Callable[[ModelSource, torch.device, torch.dtype], MIBackend]"
    description: str = ""


@attrs.define
class DictionaryFormat:
    """A dictionary file format. `detect(path) -> Detection`; `load(path, device, dtype)`.

    `looks_for` is what the format expects on disk, shown when nothing matches.
    """

    name: str
    detect: "Callable[[Path], Detection]"
    load: "Callable[[Path, torch.device, torch.dtype], Any]"
    looks_for: str = ""
    hub_patterns: list[str] = attrs.field(factory=list)


@attrs.define
class TokenizerSpec:
    """A tokenizer loader. `detect(dir) -> bool`; `load(dir) -> MITokenizer`."""

    name: str
    detect: "Callable[[Path], bool]"
    load: "Callable[[Path], MITokenizer]"


@attrs.define
class ViewSpec:
    """A view a plugin provides: `render(data, path, **options)` writes a picture or a page
    and returns its path. Results find views by name (``mi_core.plugins.view(name)``), so an
    analysis never imports the package that draws it."""

    name: str
    render: Callable[..., Any]
    description: str = ""


@attrs.define
class MixerSpec:
    """A sequence mixer (state space, linear attention, ...) that a backend's generic block can
    run in place of attention; its `name` is the layer type (``model.layer_types``).

    `settings(fields, keys, hidden_size)` reads the mixer's config values through a
    :class:`~mi_core.configread.ConfigFields`, `keys` naming the family's key for each
    setting; `tensors(settings)` gives its weights ({name inside the mixer's module: shape});
    `build(settings, weights, layer)` the runnable mixer (the protocol ``mi_core.recurrence.
    Mixer``, docs/PLUGINS.md). The backend owning the block never imports the plugin.

    `concatenated`: groups of its tensors the reference concatenates on load (dim 0), so a
    checkpoint may split them anywhere: read as one concatenation, re-split as expected."""

    name: str
    settings: Callable[..., Any]
    tensors: Callable[[Any], dict[str, tuple[int, ...]]]
    build: Callable[..., Any]
    description: str = ""
    concatenated: tuple[tuple[str, ...], ...] = ()


@attrs.define
class CompatibilityReport:
    """What every plugin said about a checkpoint, without loading its weights."""

    source: str
    model_type: str | None
    supported: bool
    backend: str | None
    detections: list[Detection] = attrs.field(factory=list)
    #: a GGUF file's ``general.architecture`` (it has no config.json, so no model_type)
    gguf_architecture: str | None = None

    @property
    def best(self) -> Detection | None:
        ok = [d for d in self.detections if d.ok]
        return max(ok, key=lambda d: d.score) if ok else None

    @property
    def unimplemented(self) -> bool:
        """No plugin implements the config's model_type, or the GGUF file's architecture
        (said first by :meth:`summary`)."""
        named = isinstance(self.model_type, str) or isinstance(self.gguf_architecture, str)
        return not self.supported and named and not any(
            d.implements or d.ok for d in self.detections)

    def summary(self) -> str:
        verdict = f"supported by {self.backend}" if self.supported else "NOT supported"
        what = f"model_type {self.model_type!r}" if isinstance(self.model_type, str) \
            else f"GGUF architecture {self.gguf_architecture!r}"
        lines = [f"no installed plugin implements {what}"] if self.unimplemented else []
        lines.append(f"{self.source}: model_type={self.model_type!r}, {verdict}")
        for d in sorted(self.detections, key=lambda d: -d.score):
            lines.append(f"  [{d.plugin or '?'}:{d.backend}] score={d.score:.2f}: {d.reason}")
            if d.missing:
                lines.append(f"      missing tensors: {', '.join(d.missing[:20])}"
                             + (" ..." if len(d.missing) > 20 else ""))
            if d.config_keys:
                lines.append(f"      config keys not understood: {', '.join(d.config_keys)}")
            if d.unexpected:
                lines.append(f"      unexpected tensors: {', '.join(d.unexpected[:20])}"
                             + (" ..." if len(d.unexpected) > 20 else ""))
        return "\n".join(lines)

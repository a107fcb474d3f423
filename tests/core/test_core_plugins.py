"""Plugin discovery through entry points, MI_CORE_PLUGINS, auto-detection, compatibility."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_core import plugins
from mi_core.hookspecs import hookimpl
from tests.support.toy_checkpoint import toy_reference


def test_builtin_and_third_party_plugins_are_discovered_through_entry_points() -> None:
    names = {i.name for i in plugins.plugin_infos()}
    assert {"transformer", "rwkv", "sae", "clt", "probing", "toy"} <= names
    toy = next(i for i in plugins.plugin_infos() if i.name == "toy")
    assert toy.distribution == "mi-toy-backend" and toy.version == "0.1.0"
    assert "backend toy: toy residual-MLP language model (example plugin)" in toy.provides


def test_mi_core_plugins_env_var_restricts_what_loads() -> None:
    code = "from mi_core import plugins; print(sorted(i.name for i in plugins.plugin_infos()))"
    env = dict(os.environ, MI_CORE_PLUGINS="toy,rwkv")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "['rwkv', 'toy']"


def test_importing_mi_core_loads_no_plugin() -> None:
    code = ("import sys, mi_core; from mi_core import plugins; "
            "print(plugins._pm is None, any(m.startswith('mi_toy') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "True False"


def test_third_party_backend_is_auto_detected_and_runs_a_hooked_forward(toy_dir, toy_weights) -> None:
    model = mi.MIModel.from_pretrained(toy_dir)
    assert model.backend_name == "toy" and model.num_layers == 3
    ids = torch.tensor([[1, 2, 3]])
    cache = model.forward(ids, mi.HookSpec().capture("blocks.2.hook_resid_post"))
    ref = toy_reference(toy_weights, ids)
    assert (cache["blocks.2.hook_resid_post"] - ref["blocks.2.hook_resid_post"]).abs().max() < 1e-6


def test_no_match_raises_unsupported_model_error_listing_every_reason(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "banana"}))
    with pytest.raises(mi.UnsupportedModelError) as err:
        mi.MIModel.from_pretrained(tmp_path)
    msg = str(err.value)
    assert "model_type 'banana' is not 'toy-mlp'" in msg
    assert "[toy:toy]" in msg


def test_a_model_type_no_plugin_implements_is_said_plainly_first(tmp_path: Path) -> None:
    """The report and the error begin with the plain line, then every plugin's details."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "banana"}))
    report = mi.check_compatibility(tmp_path)
    assert report.unimplemented
    lines = report.summary().splitlines()
    assert lines[0] == "no installed plugin implements model_type 'banana'"
    assert any("[toy:toy]" in line for line in lines[1:])
    with pytest.raises(mi.UnsupportedModelError) as err:
        mi.MIModel.from_pretrained(tmp_path)
    assert str(err.value).splitlines()[0] == lines[0]


def test_a_plugin_implementing_the_type_keeps_the_plain_line_out(tmp_path: Path) -> None:
    """toy-mlp without its tensors: the toy plugin implements the type (Detection.implements),
    so the refusal is about this checkpoint, not the family; no model_type: nothing to say."""
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "toy-mlp", "vocab_size": 2, "d_model": 2, "n_layers": 1}))
    report = mi.check_compatibility(tmp_path)
    assert not report.supported and not report.unimplemented
    assert not report.summary().startswith("no installed plugin")
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 2}))
    assert not mi.check_compatibility(tmp_path).unimplemented


def test_check_compatibility_reads_no_weights(toy_dir: Path, monkeypatch) -> None:
    from mi_core import loading

    def boom(*a, **k):
        raise AssertionError("weights were read")

    monkeypatch.setattr(loading.SafetensorsCheckpoint, "get", boom)
    report = mi.check_compatibility(toy_dir)
    assert report.supported and report.backend == "toy" and report.model_type == "toy-mlp"
    assert report.best is not None and report.best.plugin == "toy"


def test_detection_reports_missing_tensors(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"embed": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "toy-mlp", "vocab_size": 2, "d_model": 2, "n_layers": 1}))
    report = mi.check_compatibility(tmp_path)
    toy = next(d for d in report.detections if d.backend == "toy")
    assert not report.supported and toy.missing == ["unembed"]
    assert "missing tensors: unembed" in report.summary()


def test_explicit_backend_that_is_not_installed_is_an_error(toy_dir: Path) -> None:
    with pytest.raises(mi.UnsupportedModelError, match="backend 'nope' is not installed"):
        mi.MIModel.from_pretrained(toy_dir, backend="nope")


class _InProcessPlugin:
    """A plugin registered at run time (no entry point) that outbids the toy backend."""

    @hookimpl
    def mi_detect_backend(self, source):
        return mi.Detection("toy", 0.1, "low-confidence second opinion")

    @hookimpl
    def mi_register_tokenizers(self):
        return [mi.TokenizerSpec("never", detect=lambda d: False, load=lambda d: None)]


def test_best_detection_wins_and_in_process_plugins_take_part(toy_dir: Path) -> None:
    plugins.register_plugin(_InProcessPlugin(), name="second-opinion")
    try:
        report = mi.check_compatibility(toy_dir)
        scores = sorted(d.score for d in report.detections if d.backend == "toy")
        assert scores == [0.1, 1.0] and report.best.plugin == "toy"
        assert any(s.name == "never" for s in plugins.tokenizer_specs())
    finally:
        plugins.unregister_plugin("second-opinion")


def test_a_plugin_that_fails_to_import_is_skipped_with_a_warning_naming_it(tmp_path: Path) -> None:
    info = tmp_path / "mi_broken-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mi-broken\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[mi_core]\nbroken = mi_no_such_module.plugin\n")
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from mi_core import plugins\n"
            "infos = {i.name: i for i in plugins.plugin_infos()}\n"
            "print(infos['broken'].error.split(':')[0], 'toy' in plugins.backends())")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "ModuleNotFoundError True", out.stderr
    assert "plugin 'broken' (mi_no_such_module.plugin) failed to load" in out.stderr


def test_plugin_impl_is_the_marker_and_hookimpl_its_alias() -> None:
    assert mi.plugin_impl is mi.hookimpl is hookimpl and mi.plugin_spec is mi.hookspec


class _PointsPlugin:
    """A plugin that declares its backend's own per-layer hook points."""

    @mi.plugin_impl
    def mi_declare_hook_points(self):
        return {"mixer_gate": "mixer.hook_gate"}


def test_a_plugin_declares_its_own_hook_points_and_factories() -> None:
    assert mi.HookPoint.parse("blocks.2.mixer.hook_gate").is_custom  # unknown to the core
    plugins.register_plugin(_PointsPlugin(), name="points")
    try:
        hp = mi.HookPoint.mixer_gate(2)
        assert str(hp) == "blocks.2.mixer.hook_gate" and hp.layer == 2 and not hp.is_custom
        assert not mi.HookPoint.parse("blocks.0.mixer.hook_gate").is_custom
    finally:
        plugins.unregister_plugin("points")

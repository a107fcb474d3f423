"""The plugin SDK proves itself on the example third-party plugin (tests/example_plugin): it
imports only the SDKs, and adds a backend, an analysis on every model (a model convenience)
and a ``mi`` command. Also: every hookspec is implemented by a built-in plugin and named in
the tests, and the registries refuse clashes."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_core import plugins
from mi_core.plugin import PluginError, plugin_impl, view
from tests.support.toy_checkpoint import WORDS, toy_reference, write_toy_checkpoint

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "example_plugin"


def test_the_example_plugin_imports_only_the_sdks() -> None:
    seen = set()
    for path in (EXAMPLE / "mi_toy").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] in ("mi_core", "mi_cli"):
                    assert name in ("mi_core.plugin", "mi_cli.plugin"), f"{path.name}: {name}"
                    seen.add(name)
    assert seen == {"mi_core.plugin", "mi_cli.plugin"}


def test_the_example_plugin_adds_an_analysis_to_every_model(tmp_path: Path) -> None:
    weights = write_toy_checkpoint(tmp_path / "toy", tokenizer=True)
    model = mi.MIModel.from_pretrained(tmp_path / "toy")
    ids = model.to_tokens("the cat sat on a mat")
    assert ids[0].tolist() == [WORDS.index(w) for w in "the cat sat on a mat".split()]
    ref = toy_reference(weights, ids)
    want = [float(ref[f"blocks.{i}.hook_resid_post"][0, -1].norm()) for i in range(3)]
    assert model.resid_norms("the cat sat on a mat") == pytest.approx(want, rel=1e-6)
    assert "resid_norms" in dir(model) and "resid_norms" not in vars(type(model))


def test_the_example_plugin_adds_a_command_to_mi(tmp_path: Path) -> None:
    write_toy_checkpoint(tmp_path / "toy", tokenizer=True)
    mi_exe = Path(sys.executable).with_name("mi")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    assert "resid-norms" in subprocess.run([str(mi_exe), "--help"], capture_output=True,
                                           text=True, env=env).stdout
    proc = subprocess.run([str(mi_exe), "resid-norms", "--model", str(tmp_path / "toy"),
                           "--prompt", "the dog ran far"], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert [line.split(":")[0] for line in proc.stdout.split()[::2]] == ["L0", "L1", "L2"]


def test_every_hookspec_is_implemented_by_a_builtin_plugin_and_has_its_own_test() -> None:
    from mi_cli import hookspecs as cli_specs
    from mi_cli.main import plugin_manager
    from mi_core import hookspecs

    here = vars(sys.modules[__name__])
    for module, pm in ((hookspecs, plugins.get_plugin_manager()), (cli_specs, plugin_manager())):
        for name in [n for n in vars(module) if n.startswith("mi_")]:
            deprecated = (getattr(module, name).__doc__ or "").startswith("Deprecated")
            assert deprecated or getattr(pm.hook, name).get_hookimpls(), f"no plugin implements {name}"
            assert any(t.startswith(f"test_{name}_") for t in here), f"no test_{name}_..."


# -- one test per hookspec, on the built-in plugins (as a third party would see them) ------------
def test_mi_register_backends_offers_every_builtin_backend() -> None:
    assert {"transformer", "rwkv6", "rwkv7", "toy"} <= set(plugins.backends())


def test_mi_detect_backend_picks_the_plugin_that_knows_the_checkpoint(toy_dir: Path) -> None:
    report = mi.check_compatibility(toy_dir)
    assert report.supported and report.backend == "toy" and report.best.plugin == "toy"


def test_mi_register_dictionary_formats_offers_every_builtin_format() -> None:
    assert {"saelens", "gemmascope", "sparsify", "llamascope", "circuit-tracer-clt"} <= {
        f.name for f in plugins.dictionary_formats()}


def test_mi_register_mixers_offers_the_state_space_mixers_by_layer_type() -> None:
    found = plugins.mixers()
    assert {"mamba", "mamba2"} <= set(found) and found["mamba2"].name == "mamba2"
    assert plugins.mixer("mamba") is not None
    with pytest.raises(mi.UnsupportedModelError, match="sequence mixer 'nope'.*mamba"):
        plugins.mixer("nope", "a test")


def test_mi_opt_in_hook_points_leaves_a_plugins_large_points_out_of_run_with_cache() -> None:
    plugins.get_plugin_manager()
    from mi_core.plugin import OPT_IN_SUFFIXES

    assert {"ssm.hook_state", "ssm.hook_effective_attn", "attn.hook_result"} <= OPT_IN_SUFFIXES


def test_mi_register_tokenizers_offers_the_rwkv_world_tokenizer() -> None:
    assert "rwkv-world" in [t.name for t in plugins.tokenizer_specs()]


def test_mi_declare_hook_points_makes_a_plugins_points_known() -> None:
    plugins.get_plugin_manager()
    assert not mi.HookPoint.parse("blocks.0.rwkv.hook_state").is_custom
    assert mi.HookPoint.parse("blocks.0.nobody.hook_declares_this").is_custom


def test_mi_hub_file_patterns_extend_what_a_hub_download_fetches() -> None:
    assert "rwkv_vocab_v20230424.txt" in plugins.hub_file_patterns()


def test_mi_model_attributes_put_conveniences_on_every_model(toy_model) -> None:
    assert callable(toy_model.run_with_cache) and callable(toy_model.resid_norms)
    assert toy_model.run_with_cache(torch.tensor([[1, 2]]))[0].shape == (1, 2, 11)


def test_mi_register_views_registers_every_builtin_view() -> None:
    assert {"attention", "logit_lens", "patching", "ablation", "steering", "comparison",
            "dose_response", "attribution_graph", "feature_activations",
            "sparse_activations"} <= set(plugins.views())


def test_mi_default_model_is_the_embedded_smollm2() -> None:
    path = plugins.get_plugin_manager().hook.mi_default_model()
    assert path is not None and Path(path).name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_mi_checkpoint_info_reads_the_header_without_weights(tmp_path: Path) -> None:
    """mi-transformer answers from the GGUF header (SmolLM2: 30 layers, 9 heads) and refuses a
    text file named .gguf; a source it does not know gets None (another plugin may answer)."""
    from mi_cli.main import plugin_manager

    hook = plugin_manager().hook.mi_checkpoint_info
    info = hook(source=str(plugins.get_plugin_manager().hook.mi_default_model()))
    assert (info["num_layers"], info["num_heads"]) == (30, 9)
    fake = tmp_path / "fake.gguf"
    fake.write_text("hello\n")
    with pytest.raises(mi.WeightLoadError, match="fake.gguf"):
        hook(source=str(fake))
    assert hook(source=str(tmp_path)) is None


def test_mi_checkpoint_from_config_writes_a_checkpoint_the_backends_load(tmp_path: Path) -> None:
    """mi-transformer writes a TransformerLens config as a checkpoint that loads (every tensor
    0 but the norm gains, which are as asked: 2 per layer and the final one, so zero logits);
    a config it does not know gets None (another plugin may answer); one its format cannot
    hold, a CapabilityError naming the field."""
    import dataclasses

    from safetensors.torch import load_file

    from mi_core.tl import HookedTransformerConfig

    hook = plugins.get_plugin_manager().hook.mi_checkpoint_from_config
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=16, d_head=8, n_heads=4,
                                  d_vocab=50, d_mlp=64, act_fn="gelu_new")
    assert hook(config=cfg, directory=tmp_path, norm_gain=2.0) is True
    tensors = load_file(str(tmp_path / "model.safetensors"))
    gains = [n for n, t in tensors.items() if bool((t == 2.0).all())]
    assert len(gains) == 2 * cfg.n_layers + 1
    assert all(not t.any() for n, t in tensors.items() if n not in gains)
    logits, _ = mi.MIModel.from_pretrained(tmp_path).run_with_cache(torch.tensor([[1, 2, 3]]))
    assert logits.shape == (1, 3, 50) and not logits.any()
    assert hook(config={"d_model": 32}, directory=tmp_path / "none", norm_gain=2.0) is None
    with pytest.raises(mi.CapabilityError, match="normalization_type=None"):
        hook(config=dataclasses.replace(cfg, normalization_type=None), directory=tmp_path,
             norm_gain=2.0)


def test_mi_plugin_info_describes_what_each_plugin_provides() -> None:
    info = {i.name: i for i in plugins.plugin_infos()}
    assert any("probes" in p for p in info["probing"].provides)
    assert any(p.startswith("view attention") for p in info["viz"].provides)
    assert any("resid_norms" in p for p in info["toy"].provides)


def test_mi_register_commands_gives_mi_every_builtin_command() -> None:
    from mi_cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert {"plugins", "check", "demo", "run", "logit-lens", "knockout", "patch", "attention",
            "steer", "heads", "sweep", "cache-activations", "probe", "resid-norms"} <= set(
        sub.choices)


class _Claims:
    def __init__(self, attributes: dict) -> None:
        self.attributes = attributes

    @plugin_impl
    def mi_model_attributes(self) -> dict:
        return self.attributes


def test_a_model_attribute_that_shadows_or_clashes_is_a_plugin_error(toy_model) -> None:
    plugins.register_plugin(_Claims({"forward": lambda m: 1}), name="shadow")
    try:
        with pytest.raises(PluginError, match="already MIModel's own"):
            toy_model.anything_missing
    finally:
        plugins.unregister_plugin("shadow")
    plugins.register_plugin(_Claims({"run_with_cache": lambda m: 1}), name="clash")
    try:
        with pytest.raises(PluginError, match="claimed by plugins 'tl' and 'clash'"):
            toy_model.run_with_cache
    finally:
        plugins.unregister_plugin("clash")
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        toy_model.nonexistent


def test_views_are_found_by_name_and_a_missing_one_is_a_plugin_error() -> None:
    from mi_core.viz import attention_html

    assert view("attention") is attention_html
    with pytest.raises(PluginError, match="no installed plugin provides the view 'nope'"):
        view("nope")


def test_sparse_activations_draw_through_the_view_registry(tmp_path: Path) -> None:
    sa = mi.SparseActivations(torch.tensor([[1, 3], [0, 2]]), torch.tensor([[0.5, 0.2],
                                                                           [1.0, 0.1]]), 4)
    out = sa.to_html(tmp_path / "f.html", ["a", "b"])
    assert Path(out).read_text(encoding="utf-8").lower().startswith("<!doctype html>")


class _LegacyCommand:
    @plugin_impl
    def mi_register_commands(self, subparsers) -> None:
        p = subparsers.add_parser("legacy-hello", help="registered on mi-core's own surface")
        p.set_defaults(func=lambda args: print("hello from the kernel surface") or 0)


def test_mi_register_commands_on_the_kernels_deprecated_surface_still_run(capsys) -> None:
    from mi_cli.main import main

    plugins.register_plugin(_LegacyCommand(), name="legacy")
    try:
        assert main(["legacy-hello"]) == 0
        assert "hello from the kernel surface" in capsys.readouterr().out
        with pytest.raises(SystemExit) as exc:
            main(["no-such-command"])
        assert exc.value.code == 2
        assert "invalid choice: 'no-such-command'" in capsys.readouterr().err
    finally:
        plugins.unregister_plugin("legacy")


def test_layer_types_of_a_backend_that_does_not_declare_them_are_a_capability_error(
        toy_model) -> None:
    with pytest.raises(mi.CapabilityError, match="'layer types' capability"):
        toy_model.layer_types

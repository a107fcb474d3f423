"""``mi probe`` end to end through the real ``mi`` entry point (toy backend plugin)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mi_cli.main import main
from mi_probing import ActivationSet

from tests.support.probing_toy import LABELS, TEXTS


@pytest.fixture()
def data_file(tmp_path: Path) -> Path:
    p = tmp_path / "toy.jsonl"
    p.write_text("".join(json.dumps({"text": t, "label": l}) + "\n"
                         for t, l in zip(TEXTS, LABELS)), encoding="utf-8")
    return p


def test_probe_command_writes_json_and_png_and_exits_zero(toy_dir: Path, data_file: Path,
                                                          tmp_path: Path, capsys):
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    code = main(["probe", "--model", str(toy_dir), "--data", str(data_file),
                 "--hook", "hook_embed", "--hook", "blocks.*.hook_resid_post",
                 "--position", "last", "--cv", "3", "--shuffles", "2",
                 "--json", str(out), "--plot", str(png),
                 "--save-activations", str(tmp_path / "acts")])
    assert code == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    hooks = ["hook_embed", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post",
             "blocks.2.hook_resid_post"]
    assert [p["hook"] for p in result["probes"]] == hooks
    assert result["metric"] == "accuracy" and result["n_samples"] == len(TEXTS)
    for probe in result["probes"]:
        assert set(probe["scores"]) == {"accuracy", "balanced_accuracy", "auroc"}
        assert probe["scores"]["accuracy"]["baseline"] is not None
        assert probe["split"] == "3-fold CV" and probe["n_shuffles"] == 2
    assert result["probes"][0]["scores"]["accuracy"]["value"] == 1.0  # see test_probing_sweep
    assert png.read_bytes()[:4] == b"\x89PNG"
    saved = ActivationSet.load(tmp_path / "acts")
    assert saved.hooks == hooks and saved.n == len(TEXTS)
    assert "hook_embed" in capsys.readouterr().out


def test_probe_help_lists_the_options():
    # a real subprocess: the console entry point and argparse's exit code 0 for --help
    proc = subprocess.run([sys.executable, "-m", "mi_core.cli.main", "probe", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    for option in ("--model", "--data", "--hook", "--position", "--json", "--plot"):
        assert option in proc.stdout


@pytest.mark.parametrize(
    ("lines", "extra", "message"),
    [
        ([{"text": "the film", "label": "a"}] * 6, [], "all 6 examples have the label 'a'"),
        ([{"text": "the film"}], [], "missing key"),
        (None, ["--hook", "blocks.9.hook_resid_post"], "layer 9 out of range"),
        (None, ["--hook", "blocks.0.mlp.hook_post"], "blocks.0.mlp.hook_post"),
        (None, ["--position", "first"], "position must be 'last', 'mean' or an integer"),
        (None, ["--cv", "20"], "20-fold CV needs at least 20 examples of every class"),
    ],
)
def test_bad_input_exits_non_zero_with_the_reason_on_stderr(toy_dir: Path, data_file: Path,
                                                            tmp_path: Path, capsys, lines,
                                                            extra, message):
    if lines is not None:
        data_file.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    hook = [] if any(a == "--hook" for a in extra) else ["--hook", "hook_embed"]
    code = main(["probe", "--model", str(toy_dir), "--data", str(data_file), *hook, *extra,
                 "--json", str(tmp_path / "o.json")])
    err = capsys.readouterr().err
    # progress lines (model loading) may come first on a non-terminal stderr; the error last
    assert code != 0 and message in err and err.splitlines()[-1].startswith("mi: error:")
    assert not (tmp_path / "o.json").exists()


def test_missing_data_file_exits_non_zero(toy_dir: Path, tmp_path: Path, capsys):
    code = main(["probe", "--model", str(toy_dir), "--data", str(tmp_path / "nope.jsonl"),
                 "--hook", "hook_embed", "--json", str(tmp_path / "o.json")])
    assert code == 1 and "nope.jsonl" in capsys.readouterr().err

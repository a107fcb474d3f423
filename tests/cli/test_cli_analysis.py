"""The analysis subcommands, end to end through ``mi_cli.main.main`` on the fake model
(the loader is replaced; the real-model run is in tests/cli/test_demo_smollm2.py)."""

from __future__ import annotations

import re
import struct
import sys
from pathlib import Path

import pytest

import mi_core as mi
from mi_cli import demo, models, output, preflight
from mi_cli.main import main
from tests.support.fake_backend import fake_model  # noqa: E402


@pytest.fixture
def fake(monkeypatch):
    """The fake model instead of the embedded one; its dimensions and tokenizer are only
    known after "loading", so the argument checks run then (tests/cli/test_cli_fast.py
    covers the checks made before the weights load)."""
    m = fake_model()
    monkeypatch.setattr(models, "load_model", lambda model, device="cpu", dtype=None: m)
    monkeypatch.setattr(preflight, "checkpoint_info", lambda source: None)
    return m


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_demo_prints_top5_lens_and_knockout_and_writes_json(fake, tmp_path, capsys):
    out = tmp_path / "demo.json"
    assert main(["demo", "--prompt", "hello there", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "top next tokens" in text and "logit lens" in text and "KL(baseline" in text
    r = mi.from_json(out, demo.DemoResult)
    assert len(r.top_next) == 5 and len(r.logit_lens_top1) == fake.num_layers
    assert [row.label for row in r.logit_lens_last] == [f"L{i}" for i in range(fake.num_layers)][-4:]
    assert r.knockout_answer.token_id == r.top_next[0].token_id
    assert r.knockout_answer.baseline_prob == pytest.approx(r.top_next[0].prob, abs=1e-6)
    top = fake.forward(fake.to_tokens("hello there")).output[0, -1].argmax()
    assert r.top_next[0].token_id == int(top)
    assert r.logit_lens_top1[-1][1] == r.top_next[0].token  # last lens layer == output


def test_demo_without_default_model_fails_on_stderr(monkeypatch, capsys):
    monkeypatch.setattr(models, "default_model_path", lambda: None)
    assert main(["demo"]) == 1
    err = capsys.readouterr().err
    assert "no default model is available" in err and "Traceback" not in err


def test_run_with_unloadable_model_is_a_clean_error(tmp_path, capsys):
    bad = tmp_path / "empty"
    bad.mkdir()
    assert main(["run", "--model", str(bad), "--prompt", "x"]) == 1
    assert "mi: error:" in capsys.readouterr().err


@pytest.mark.parametrize("argv,cls", [
    (["logit-lens", "--mid", "--target", "a"], mi.LogitLensResult),
    (["knockout", "--layers", "0-1", "--from", "-1", "--to", "0,1"], mi.AblationResult),
    (["patch", "--corrupt", "jello", "--correct", "a", "--incorrect", "b"], mi.PatchingResult),
    (["patch", "--corrupt", "jello", "--correct", "a", "--incorrect", "b", "--kind", "z",
      "--method", "attribution"], mi.PatchingResult),
    (["attention", "--layer", "1", "--head", "2"], demo.AttentionResult),
    (["steer", "--layers", "0,2", "--strengths", "0,1,3", "--target", "a"], mi.DoseResponseCurve),
    (["heads", "--length", "5", "--batch", "2"], mi.interp.HeadDetectionResult),
])
def test_each_command_writes_json_and_a_png(fake, tmp_path, capsys, argv, cls):
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    prompt = [] if argv[0] == "heads" else ["--prompt", "hello"]
    assert main(argv + prompt + ["--json", str(js), "--plot", str(png)]) == 0
    assert capsys.readouterr().out.strip()
    mi.from_json(js, cls)
    w, h = png_size(png)
    assert w >= 300 and h >= 200


@pytest.mark.parametrize("suffix,magic", [(".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_plot_format_follows_the_extension(fake, tmp_path, suffix, magic):
    out = tmp_path / f"lens{suffix}"
    assert main(["logit-lens", "--prompt", "hi", "--plot", str(out)]) == 0
    assert out.read_bytes().startswith(magic)


def test_knockout_reports_intervened_minus_baseline_and_small_json(fake, tmp_path, capsys):
    """The printed effects and the JSON agree with run_knockout (the reference) and the JSON
    has no raw logits unless --raw."""
    js, raw = tmp_path / "k.json", tmp_path / "raw.json"
    argv = ["knockout", "--prompt", "hello", "--layers", "0-2", "--edge", "-1,0", "--edge", "-1,1"]
    assert main(argv + ["--json", str(js)]) == 0
    text = capsys.readouterr().out
    assert "knocked out - baseline" in text and "-0.0000" not in text
    ref = mi.interp.run_knockout(fake, "hello",
                                 mi.KnockoutSpec(layers=[0, 1, 2], edges=[(-1, 0), (-1, 1)]))
    r = mi.from_json(js, mi.AblationResult)
    assert r.baseline_logits is None and r.prompt == "hello" and r.spec == ref.spec
    assert r.kl_divergence() == pytest.approx(ref.kl_divergence(), abs=1e-6)
    b = ref.summary.baseline_top
    assert r.summary.baseline_top.logprob_diff == pytest.approx(b.logprob_diff, abs=1e-6)
    assert f"{b.logprob_diff:+.4f}" in text
    assert main(argv + ["--json", str(raw), "--raw"]) == 0
    assert js.stat().st_size < raw.stat().st_size / 2
    assert mi.from_json(raw, mi.AblationResult).ablated_logits.shape == (fake.vocab_size,)


def test_quiet_prints_nothing_and_verbose_prints_more(fake, tmp_path, capsys):
    js = tmp_path / "q.json"
    assert main(["knockout", "-q", "--prompt", "hello", "--json", str(js)]) == 0
    assert capsys.readouterr().out == "" and js.exists()
    assert main(["-q", "attention", "--prompt", "hello"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["steer", "--verbose", "--prompt", "hello", "--strengths", "0,1"]) == 0
    assert "steer" in capsys.readouterr().out


def test_numbers_never_print_as_negative_zero():
    assert output.num(-0.0000001, ".5f") == "0.00000"
    assert output.num(-0.0000001, "+.3f") == "+0.000"
    assert output.num(-0.25, "+.2f") == "-0.25"
    assert output.num(-1e-9, "9.5f") == "  0.00000"  # padded, as in the steer table


@pytest.mark.parametrize("argv,msg", [
    (["knockout", "--prompt", "hi", "--to", "9"], "out of range"),
    (["knockout", "--prompt", "hi", "--heads", "8", "--to", "0"], "head 8 out of range"),
    (["attention", "--prompt", "hi", "--layer", "7"], "layer 7 out of range"),
    (["patch", "--prompt", "hi", "--corrupt", "hello", "--correct", "a", "--incorrect", "b"],
     "same token length"),
])
def test_bad_input_is_a_one_line_usage_error(fake, capsys, argv, msg):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["demo"], ["logit-lens", "--mid"], ["knockout"],
                                  ["attention", "--layer", "1"], ["steer", "--target", "a"],
                                  ["patch", "--corrupt", "jello", "--correct", "a",
                                   "--incorrect", "b"]], ids=lambda a: a[0])
def test_plot_html_writes_one_self_contained_page(fake, tmp_path, argv):
    """The page itself is driven in a browser by tests/viz; here: one file, nothing fetched."""
    out = tmp_path / "view.html"
    assert main(argv + ["--prompt", "hello", "--plot", str(out), "-q"]) == 0
    text = out.read_text()
    assert text.lstrip().lower().startswith("<!doctype html") and "hello" in text
    assert not re.search(r"""(src|href)=["']https?:""", text)
    assert [p.name for p in tmp_path.iterdir()] == ["view.html"]


def test_heads_plot_html_writes_the_page_with_all_three_scores(fake, tmp_path, capsys):
    """`mi heads --plot X.html` (refused before issue 24) writes the head-scores page with
    previous-token, duplicate-token and induction grids, named by the measured input."""
    import json
    import re

    out = tmp_path / "heads.html"
    assert main(["heads", "--length", "5", "--batch", "2", "--plot", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    data = json.loads(re.search(r"<script type='application/json' id='mi-data'>(.*?)</script>",
                                text, re.S).group(1))
    assert data["kinds"] == ["previous_token", "duplicate_token", "induction"]
    assert "2 x 5 random tokens repeated once" in text

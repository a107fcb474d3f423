"""A CLI that answers at once: --help, --version, usage errors and typos never import
torch; layer / head / position ranges, targets and knockouts are checked from the
checkpoint's header before its weights load; `mi check` reads the header before saying
"supported"; progress is a line per step on stderr when piped, silenced by -q; every
command defaults to the embedded model; typos get the nearest name."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

import mi_core as mi
from mi_cli.main import build_parser, main

TINY = str(Path(__file__).parents[1] / "clt" / "fixtures" / "tiny_llama")
PROBE = """
import sys, time
t = time.perf_counter()
from mi_cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print("RESULT", code, "torch" in sys.modules, "mi_core" in sys.modules,
      round(time.perf_counter() - t, 3), file=sys.stderr)
"""


@pytest.mark.parametrize("argv,code,says", [
    (["--help"], 0, ""), (["--version"], 0, ""), (["patch", "--help"], 0, ""),
    (["knockout", "--layers", "x"], 2, "argument --layers"),
    (["knockot"], 2, "did you mean 'knockout'?"),
    (["knockout", "--edgee", "1,2"], 2, "did you mean --edge for --edgee?"),
    (["patch", "--kind", "resid_pr"], 2, "did you mean 'resid_pre'"),
    (["steer", "--strengths", "a"], 2, "argument --strengths"),
    (["logit-lens", "--layer", "30"], 2, "mi logit-lens has no option --layer (see mi "
     "logit-lens --help)"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_help_version_usage_errors_and_typos_never_import_torch(argv, code, says):
    """Measured on the 2-core box: 0.08-0.1 s of CPU for each (docs/PERFORMANCE.md)."""
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True,
                         timeout=120)
    result = out.stderr.strip().splitlines()[-1].split()
    assert result[:4] == ["RESULT", str(code), "False", "False"], out.stderr[-2000:]
    assert says in out.stderr and "Traceback" not in out.stderr


@pytest.fixture
def no_weights(monkeypatch):
    """The embedded model's header may be read, its weights never."""
    def refuse(*a, **k):
        raise AssertionError("the weights were loaded before the arguments were checked")
    monkeypatch.setattr(mi.MIModel, "from_pretrained", staticmethod(refuse))


@pytest.mark.parametrize("argv,says", [
    (["knockout", "--layers", "30"], "argument --layers: layer 30 out of range: "
     "SmolLM2-135M-Instruct.Q4_1.gguf has 30 layers (valid: 0..29)"),
    (["attention", "--head", "9"], "argument --head: head 9 out of range"),
    (["attention", "--layer", "31"], "argument --layer: layer 31 out of range"),
    (["logit-lens", "--position", "5"], "argument --position: position 5 out of range for "
     "the prompt's 5 tokens"),
    (["knockout", "--edge", "-1,7"], "argument --edge: position 7 out of range"),
    (["patch", "--corrupt", "The capital of Italy is big", "--correct", " Paris",
      "--incorrect", " Rome"], "patching needs the same token length"),
    (["patch", "--corrupt", "The capital of Italy is", "--correct", " Paris", "--incorrect",
      " Rome", "--layers", "40"], "layer 40 out of range"),
    (["knockout", "--prompt", "Hello"], "the knockout removes every key of query 0 'Hello'"),
    (["steer", "--target", "Parisxyzzy"], "argument --target: 'Parisxyzzy' is"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_ranges_tokens_and_knockouts_are_checked_before_the_weights_load(
        no_weights, capsys, argv, says):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("mi: error: ") and says in err and "Traceback" not in err


def test_a_target_without_its_space_warns_and_names_the_spaced_token(no_weights, capsys):
    with pytest.warns(UserWarning, match=r"--target 'Paris' is the token 'Paris' \(id \d+\) "
                      r"WITHOUT a leading space.*Did you mean --target ' Paris'"):
        assert main(["logit-lens", "--target", "Paris"]) == 1  # checked, warned, then loads
    assert "weights were loaded" in capsys.readouterr().err


def test_a_multi_token_target_suggests_its_single_token_spaced_form(no_weights, capsys):
    from mi_transformer.cli import gguf_info
    from mi_transformer.gguf import default_model_path

    tok = gguf_info(Path(default_model_path()))["tokenizer"]
    word = next(w for w in ("Rhineland", "Tokyo", "Lisbon", "Nairobi", "Reykjavik")
                if len(tok.encode(w, add_special_tokens=False)) > 1
                and len(tok.encode(" " + w, add_special_tokens=False)) == 1)
    assert main(["steer", "--target", word]) == 2
    assert f"did you mean --target ' {word}'?" in capsys.readouterr().err


def test_mi_check_reads_the_header_before_saying_supported(tmp_path, capsys):
    from mi_transformer.gguf import default_model_path

    fake = tmp_path / "model.gguf"
    fake.write_text("this is a text file, not a GGUF checkpoint\n" * 4)
    assert main(["check", str(fake)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{fake}: NOT supported: its header / config could not be read")
    assert "not a GGUF file" in out or "truncated" in out
    assert main(["check", str(default_model_path())]) == 0
    assert "read without weights: 30 layers, 9 heads, tokenizer found" in capsys.readouterr().out


def test_patch_takes_layers_and_positions_and_names_its_metric(tmp_path, capsys):
    js = tmp_path / "p.json"
    assert main(["patch", "--model", TINY, "--prompt", "w3 w17 w5 w9", "--corrupt",
                 "w3 w17 w9 w9", "--correct", "w5", "--incorrect", "w9", "--layers", "0,2",
                 "--positions", "-2,-1", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "metric logit('w5') \u2212 logit('w9') (logits)" in out
    r = mi.from_json(js, mi.PatchingResult)
    assert r.layers == [0, 2] and [c.split(":")[0] for c in r.columns] == ["2", "3"]
    assert r.metric_units == "logits"


def test_progress_is_a_line_per_step_on_stderr_when_piped_and_q_silences_it(tmp_path, capsys):
    argv = ["patch", "--model", TINY, "--prompt", "w3 w17 w5 w9", "--corrupt", "w3 w17 w9 w9",
            "--correct", "w5", "--incorrect", "w9"]
    assert main(argv) == 0
    err = capsys.readouterr().err.splitlines()  # capsys: stderr is not a terminal (piped)
    assert err[0].startswith("mi: loading tiny_llama") and err[1].startswith("mi: loaded")
    assert any(line.startswith("patch resid_pre: 3/3 it") for line in err)
    assert not any("\r" in line for line in err)  # lines, never a redrawn bar
    assert main(argv + ["-q"]) == 0
    assert capsys.readouterr().err == ""


def test_a_hook_typo_names_the_nearest_hook(tmp_path, capsys):
    texts = tmp_path / "t.txt"
    texts.write_text("hello world\n")
    assert main(["cache-activations", str(texts), "--hooks", "blocks.6.hook_resid_pots",
                 "--out", str(tmp_path / "acts")]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'blocks.6.hook_resid_post'" in err
    assert main(["cache-activations", str(texts), "--hooks", "blocks.40.hook_resid_post",
                 "--out", str(tmp_path / "acts")]) == 2
    assert "layer 40 out of range (valid: 0..29)" in capsys.readouterr().err


def test_every_command_defaults_to_the_embedded_model():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        for action in p._actions:
            if "--model" in action.option_strings:
                assert not action.required and action.default is None, f"mi {name} --model"
    args = parser.parse_args(["probe", "--data", "d.jsonl", "--hook", "h", "--json", "o"])
    assert args.model is None


def test_the_rank_is_one_based_in_the_terminal_as_on_the_pages(tmp_path, capsys):
    js = tmp_path / "l.json"
    assert main(["logit-lens", "--model", TINY, "--prompt", "w3 w17 w5", "--target", "w5",
                 "--json", str(js)]) == 0
    out = capsys.readouterr().out
    r = mi.from_json(js, mi.LogitLensResult)
    ranks = [p.targets[0].rank for p in r.points]  # 0-based fields
    assert "(rank 1 = the top token)" in out
    assert [f"rank {k + 1}]" in line for k, line in zip(ranks, out.splitlines()[1:])] == \
        [True] * len(ranks)

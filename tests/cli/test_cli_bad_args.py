"""Every ``mi`` subcommand turns a bad argument into one ``mi: error: ...`` line on stderr
naming the argument, with exit code 2 (usage, caught by the parser before any model is
loaded) or 1 (runtime), and never a traceback unless MI_CORE_DEBUG=1."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mi_cli import demo, models, output, preflight
from mi_cli.main import build_parser, main
from tests.support.fake_backend import fake_model

MI = str(Path(sys.executable).parent / "mi")
CORE_COMMANDS = ["demo", "run", "logit-lens", "knockout", "patch", "attention", "steer", "heads",
                 "sweep", "cache-activations",
                 "plugins", "check", "probe"]


@pytest.fixture
def fake(monkeypatch):
    """The fake model instead of the embedded one; its dimensions and tokenizer are only
    known after "loading", so the argument checks run then (tests/cli/test_cli_fast.py
    covers the checks made before the weights load)."""
    m = fake_model()
    monkeypatch.setattr(models, "load_model", lambda model, device="cpu", dtype=None: m)
    monkeypatch.setattr(preflight, "checkpoint_info", lambda source: None)
    return m


def run(argv: list[str], capsys, out: list[str] | None = None) -> tuple[int, str]:
    """main(argv) -> (exit code, stderr); the parser's SystemExit is an exit code too.
    stdout is appended to `out` when given."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    if out is not None:
        out.append(captured.out)
    assert "Traceback" not in captured.err
    return code, captured.err


PATCH = ["--corrupt", "jello", "--correct", "a", "--incorrect", "b"]

USAGE = [
    (["demo", "--prompt", ""], "argument --prompt"),
    (["run", "--prompt", "   "], "argument --prompt"),
    (["steer", "--strengths", "a,b"], "argument --strengths"),
    (["steer", "--strengths", "1,nan"], "argument --strengths"),
    (["knockout", "--layers", "10-"], "argument --layers"),
    (["knockout", "--layers", "5-2"], "argument --layers"),
    (["knockout", "--heads", "x"], "argument --heads"),
    (["knockout", "--edge", "1"], "argument --edge"),
    (["knockout", "--edge", "1,2,3"], "argument --edge"),
    (["knockout", "--position", "last"], "argument --position"),
    (["run", "--device", "foo"], "argument --device"),
    (["run", "--device", "cuda:99"], "argument --device"),
    (["logit-lens", "--dtype", "float8"], "argument --dtype"),
    (["demo", "--model", "./no/such/model.gguf"], "argument --model"),
    (["run", "--model", "/no/such/dir"], "argument --model"),
    (["logit-lens", "--plot", "out.jpg"], "argument --plot"),
    (["logit-lens", "--plot", "out"], "argument --plot"),
    (["logit-lens", "--k", "0"], "argument --k"),
    (["heads", "--plot", "heads.jpg"], "argument --plot"),
    (["logit-lens", "--target", ""], "argument --target"),
    (["patch", "--prompt", "hi"], "--corrupt"),
    (["patch", "--corrupt", "ho", "--correct", "a"], "--incorrect"),
    (["patch", "--kind", "nope"] + PATCH, "argument --kind"),
    (["attention", "--layer", "-1"], "argument --layer"),
    (["attention", "--head", "two"], "argument --head"),
    (["heads", "--length", "0"], "argument --length"),
    (["heads", "--batch", "-3"], "argument --batch"),
    (["knockout", "--quiet", "--verbose"], "not allowed with argument"),
    (["knockout", "--no-such-flag"], "unrecognized arguments"),
    (["probe", "--model", "./none.gguf", "--data", "d.jsonl", "--hook", "h", "--json", "o"],
     "argument --model"),
    (["probe", "--model", "m", "--data", "d.jsonl", "--hook", "h", "--json", "o", "--plot",
      "c.jpg"], "argument --plot"),
    (["probe", "--model", "m", "--data", "d.jsonl", "--hook", "h", "--json", "o", "--dtype",
      "int8"], "argument --dtype"),
]


@pytest.mark.parametrize("argv,names", USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_bad_argument_is_a_usage_error_naming_it(fake, capsys, argv, names):
    code, err = run(argv, capsys)
    assert code == 2
    assert "mi: error: " in err and names in err


def test_cuda_without_cuda_is_a_usage_error(fake, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, err = run(["run", "--device", "cuda"], capsys)
    assert code == 2 and "argument --device" in err and "CUDA is not available" in err


RUNTIME = [
    (["knockout", "--prompt", "hi", "--to", "9"], "argument --to: position 9 out of range"),
    (["knockout", "--prompt", "hi", "--edge", "-1,-7"], "argument --edge: position -7 out of"),
    (["knockout", "--prompt", "hi", "--heads", "8", "--to", "0"], "head 8 out of range"),
    (["knockout", "--prompt", "hi", "--layers", "3"], "layer 3 out of range"),
    (["attention", "--prompt", "hi", "--layer", "7"], "layer 7 out of range"),
    (["attention", "--prompt", "hi", "--head", "4"], "head 4 out of range"),
    (["logit-lens", "--prompt", "hi", "--position", "99"], "position 99 out of range"),
    (["logit-lens", "--prompt", "hi", "--target", "abc"], "'abc' is 3 tokens"),
    (["patch", "--prompt", "hi", "--corrupt", "hello", "--correct", "a", "--incorrect", "b"],
     "same token length"),
    (["patch", "--prompt", "hi", "--corrupt", "ho", "--correct", "a", "--incorrect", "b",
      "--layers", "5"], "layer 5 out of range"),
    (["patch", "--prompt", "hi", "--corrupt", "ho", "--correct", "a", "--incorrect", "b",
      "--positions", "7"], "argument --positions: position 7 out of range"),

    (["patch", "--prompt", "hi", "--corrupt", "ho", "--correct", "a", "--incorrect", "a"],
     "cannot be normalised"),
    (["steer", "--prompt", "hi", "--to", "5"], "argument --to: position 5 out of range"),
    (["steer", "--prompt", "hi", "--target", "xy"], "'xy' is 2 tokens"),
]


@pytest.mark.parametrize("argv,names", RUNTIME, ids=[" ".join(a) for a, _ in RUNTIME])
def test_bad_value_for_the_model_is_an_error_naming_it(fake, capsys, argv, names):
    """Checked against the model's dimensions and tokenizer: a usage error (2) naming the
    option when the CLI's own check finds it, a runtime error (1) from the analysis else."""
    code, err = run(argv, capsys)
    assert code == (2 if "argument --" in names or "out of range" in names
                    or "tokens" in names or "token length" in names else 1)
    assert err.startswith("mi: error: ") and names in err


@pytest.mark.parametrize("cmd", ["run", "knockout", "logit-lens", "steer"])
def test_vocabulary_smaller_than_the_top_k_works(monkeypatch, capsys, cmd):
    """A vocabulary of 8 tokens: every top-k clamps to it (run / knockout used to crash)."""
    m = fake_model(vocab=8)
    monkeypatch.setattr(models, "load_model", lambda model, device="cpu", dtype=None: m)
    # the fake tokenizer maps byte b to id b + 1: "\x01\x02" stays inside 8 ids
    code, err = run([cmd, "--prompt", "\x01\x02\x03", "--k", "50"] if cmd != "steer"
                    else [cmd, "--prompt", "\x01\x02\x03"], capsys)
    assert code == 0, err


def test_an_unexpected_exception_is_one_line_unless_debugging(monkeypatch, capsys):
    def boom(model, device="cpu", dtype=None):
        raise ValueError("weights are made of cheese")
    monkeypatch.setattr(models, "load_model", boom)
    code, err = run(["demo"], capsys)
    assert code == 1 and err.startswith("mi: error: ValueError: weights are made of cheese")
    monkeypatch.setenv("MI_CORE_DEBUG", "1")
    with pytest.raises(ValueError, match="cheese"):
        main(["demo"])


def test_every_option_of_every_command_has_help_text():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name in CORE_COMMANDS:
        for action in sub.choices[name]._actions:
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"mi {name} {'/'.join(action.option_strings) or action.dest}")
    assert not missing


def test_patch_shows_its_required_flags_as_required(capsys):
    with pytest.raises(SystemExit):
        main(["patch", "--help"])
    out = capsys.readouterr().out
    assert "required:" in out
    usage = " ".join(out.split("\n\n")[0].split())
    assert "--corrupt TEXT" in usage and "[--corrupt" not in usage


def test_negative_numbers_parse_as_values(fake, capsys):
    out: list[str] = []
    code, err = run(["knockout", "--prompt", "hello", "--edge", "-1,3", "--edge", "-2,-4",
                     "--from", "-1", "--to", "-3,-2"], capsys, out)
    assert code == 0, err
    # the edges as query -> key with their tokens ("hello": <s> h e l l o)
    assert ("removed edges query \u2192 key: 5 'o' \u2192 3 'l'; 4 'l' \u2192 2 'e'; "
            "5 'o' \u2192 3 'l', 4 'l'") in out[0]


@pytest.mark.slow
def test_the_installed_mi_prints_no_traceback():
    """Through the console script (a separate process, as a user runs it)."""
    for argv, code, names in [(["knockout", "--edge", "x,1"], 2, "argument --edge"),
                              (["run", "--model", "./missing.gguf"], 2, "argument --model")]:
        out = subprocess.run([MI, *argv], capture_output=True, text=True, timeout=120)
        assert out.returncode == code and names in out.stderr
        assert "mi: error: " in out.stderr and "Traceback" not in out.stderr

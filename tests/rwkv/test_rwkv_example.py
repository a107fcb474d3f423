"""examples/rwkv_state_knockout.py runs offline and prints one KL line per layer."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rwkv_state_knockout.py"


def test_state_knockout_example_prints_kl_per_layer(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # An empty value keeps the example's setdefault from restricting this process's plugins.
    monkeypatch.setenv("MI_CORE_PLUGINS", "")
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--layers", "2", "--seq", "6"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    assert exit_info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [ln.split() for ln in lines if ln.strip() and ln.split()[0] in ("0", "1", "all")]
    assert [r[0] for r in rows] == ["0", "1", "all"]
    assert all(float(r[1]) >= 0.0 for r in rows)

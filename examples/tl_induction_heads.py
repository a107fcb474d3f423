"""Port of TransformerLens' induction-head walk-through (Main Demo, "Finding induction heads").

The analysis is TransformerLens code; the lines that differ from the original are the import
marked ``# TL:`` and the loading line in main(). tests/examples runs ``analysis`` on mi-core
and on TransformerLens' HookedTransformer with the same SmolLM2 weights and compares the
printed figures.

Steps (as the demo): a batch of random tokens repeated twice; the per-token loss on the first
and the second half (in-context learning makes the second half cheap); induction scores per
head from a forward hook on every attention pattern (the mass on the token after the previous
occurrence, i.e. the diagonal at offset 1 - seq_len), run through ``run_with_hooks`` with a
name filter and ``return_type=None``; the top induction heads; and the loss on the repeated
half when the top heads' patterns are replaced by a uniform... (ablated via ``hook_z``).

    python examples/tl_induction_heads.py [--gguf PATH]
"""

from __future__ import annotations

import torch

import mi_core as mi  # TL: from transformer_lens import HookedTransformer

SEQ_LEN = 24
BATCH = 4


def generate_repeated_tokens(model, seq_len, batch=1):
    """[batch, 1 + 2 * seq_len]: BOS, then random tokens, then the same tokens again."""
    g = torch.Generator().manual_seed(0)
    prefix = (torch.ones(batch, 1) * model.tokenizer.bos_token_id).long()
    rep_tokens_half = torch.randint(1000, 10000, (batch, seq_len), dtype=torch.int64, generator=g)
    return torch.cat([prefix, rep_tokens_half, rep_tokens_half], dim=1)


def per_token_loss(logits, tokens):
    log_probs = logits.log_softmax(dim=-1)
    return -log_probs[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]


def analysis(model) -> dict:
    out: dict = {}
    rep_tokens = generate_repeated_tokens(model, SEQ_LEN, BATCH)
    with torch.no_grad():
        rep_logits, rep_cache = model.run_with_cache(rep_tokens)
    loss = per_token_loss(rep_logits, rep_tokens)
    out["loss_first_half"] = loss[:, :SEQ_LEN].mean().item()
    out["loss_second_half"] = loss[:, SEQ_LEN:].mean().item()
    print(f"Loss on the first half: {out['loss_first_half']:.3f}")
    print(f"Loss on the repeated half: {out['loss_second_half']:.3f}")

    induction_score_store = torch.zeros((model.cfg.n_layers, model.cfg.n_heads))

    def induction_score_hook(pattern, hook):
        # pattern [batch, head_index, dest_pos, source_pos]
        induction_stripe = pattern.diagonal(dim1=-2, dim2=-1, offset=1 - SEQ_LEN)
        induction_score_store[hook.layer(), :] = induction_stripe.mean((0, 2)).detach().cpu()

    def pattern_hook_names_filter(name):
        return name.endswith("pattern")

    with torch.no_grad():
        model.run_with_hooks(rep_tokens, return_type=None,
                             fwd_hooks=[(pattern_hook_names_filter, induction_score_hook)])
    flat = induction_score_store.flatten()
    top = flat.topk(5).indices.tolist()
    n_heads = model.cfg.n_heads
    out["induction_scores"] = induction_score_store
    out["top_heads"] = [(i // n_heads, i % n_heads, round(flat[i].item(), 3)) for i in top]
    print("Top induction heads (layer, head, score):", out["top_heads"])

    # Same scores from the cache (the pattern of every layer is cached by run_with_cache).
    cached = torch.stack([rep_cache["pattern", layer].diagonal(dim1=-2, dim2=-1,
                                                               offset=1 - SEQ_LEN).mean((0, 2))
                          for layer in range(model.cfg.n_layers)])
    out["cache_matches_hooks"] = bool((cached - induction_score_store).abs().max() < 1e-5)

    def head_ablation_hook(z, hook, heads):
        for layer, head in heads:
            if hook.layer() == layer:
                z[:, :, head, :] = 0.0
        return z

    top_heads = [(i // n_heads, i % n_heads) for i in top[:3]]
    with torch.no_grad():
        ablated_logits = model.run_with_hooks(rep_tokens, fwd_hooks=[
            (lambda name: name.endswith("hook_z"),
             lambda z, hook: head_ablation_hook(z, hook, top_heads))])
    ablated = per_token_loss(ablated_logits, rep_tokens)
    out["ablated_loss_second_half"] = ablated[:, SEQ_LEN:].mean().item()
    print(f"Repeated-half loss with the top 3 induction heads zeroed: "
          f"{out['ablated_loss_second_half']:.3f}")
    return out


def main(model=None) -> dict:
    if model is None:
        from _load import tl_processed_gguf

        # TL: model = HookedTransformer.from_pretrained(name)
        model = tl_processed_gguf(__doc__.splitlines()[0])
    return analysis(model)


if __name__ == "__main__":
    main()

"""Port of TransformerLens' "Exploratory Analysis Demo" (indirect object identification) to mi-core.

The analysis below is TransformerLens code: the only lines that differ from the original are
the two imports marked ``# TL:`` and the loading line in main() (TransformerLens:
``HookedTransformer.from_pretrained(name)``, which folds LayerNorm and centres weights by
default; here the same processing is asked for explicitly). tests/examples runs this file's
``analysis`` on mi-core and, with the two imports swapped back, on TransformerLens'
HookedTransformer with the same SmolLM2 weights, and compares the printed figures.

Steps (as the demo): the logit difference between the indirect object and the subject; that
difference recovered from the final residual stream through ``apply_ln_to_stack``; logit lens
over ``accumulated_resid``; direct logit attribution per layer (``decompose_resid``) and per
head (``stack_head_results``); activation patching of ``resid_pre`` over layers x positions.

    python examples/tl_ioi_exploratory.py [--gguf PATH]
"""

from __future__ import annotations

import torch

import mi_core as mi  # TL: from transformer_lens import HookedTransformer
from mi_core.tl import patching  # TL: import transformer_lens.patching as patching

PROMPT_FORMAT = ["When John and Mary went to the shops,{} gave the bag to",
                 "When Tom and James went to the park,{} gave the ball to"]
NAMES = [(" Mary", " John"), (" Tom", " James")]
#: None: patch every layer, as the demo; a list of layers patches only those (the tests use a
#: few, through TransformerLens' index_df, to keep their runtime small)
PATCH_LAYERS = None


def build(model):
    """Clean prompts (the subject repeats), answers (indirect object, subject), and corrupted
    prompts (the other name repeats, so the right answer flips)."""
    prompts, answers, corrupted = [], [], []
    for fmt, (a, b) in zip(PROMPT_FORMAT, NAMES):
        # IO first, then subject; both orders of the answer, as the demo
        prompts += [fmt.format(b), fmt.format(a)]
        answers += [(a, b), (b, a)]
        corrupted += [fmt.format(a), fmt.format(b)]
    tokens = model.to_tokens(prompts)
    corrupted_tokens = model.to_tokens(corrupted)
    answer_tokens = torch.tensor([[model.to_single_token(x) for x in pair] for pair in answers])
    return prompts, tokens, corrupted_tokens, answer_tokens


def logits_to_ave_logit_diff(logits, answer_tokens, per_prompt=False):
    final_logits = logits[:, -1, :]
    answer_logits = final_logits.gather(dim=-1, index=answer_tokens.to(final_logits.device))
    answer_logit_diff = answer_logits[:, 0] - answer_logits[:, 1]
    return answer_logit_diff if per_prompt else answer_logit_diff.mean()


def analysis(model) -> dict:
    """The demo's figures on `model` (mi-core or TransformerLens), printed and returned."""
    out: dict = {}
    prompts, tokens, corrupted_tokens, answer_tokens = build(model)
    with torch.no_grad():
        original_logits, cache = model.run_with_cache(tokens)
    per_prompt = logits_to_ave_logit_diff(original_logits, answer_tokens, per_prompt=True)
    out["logit_diff"] = logits_to_ave_logit_diff(original_logits, answer_tokens).item()
    print("Per prompt logit difference:", [round(v, 3) for v in per_prompt.tolist()])
    print(f"Average logit difference: {out['logit_diff']:.3f}")

    answer_residual_directions = model.tokens_to_residual_directions(answer_tokens)
    logit_diff_directions = answer_residual_directions[:, 0] - answer_residual_directions[:, 1]
    final_residual_stream = cache["resid_post", -1]
    final_token_residual_stream = final_residual_stream[:, -1, :]
    scaled_residual_stream = cache.apply_ln_to_stack(final_token_residual_stream, layer=-1,
                                                     pos_slice=-1)
    out["recovered_logit_diff"] = ((scaled_residual_stream * logit_diff_directions).sum(-1)
                                   .mean().item())
    print(f"Logit diff from the residual stream: {out['recovered_logit_diff']:.3f}")

    def residual_stack_to_logit_diff(residual_stack, cache):
        scaled = cache.apply_ln_to_stack(residual_stack, layer=-1, pos_slice=-1)
        return (scaled * logit_diff_directions).sum(-1).mean(-1)

    accumulated_residual, labels = cache.accumulated_resid(layer=-1, incl_mid=True,
                                                           pos_slice=-1, return_labels=True)
    logit_lens = residual_stack_to_logit_diff(accumulated_residual, cache)
    out["logit_lens"] = dict(zip(labels, [round(v, 3) for v in logit_lens.tolist()]))
    print("Logit lens (accumulated residual):", out["logit_lens"])

    per_layer_residual, labels = cache.decompose_resid(layer=-1, pos_slice=-1,
                                                       return_labels=True)
    per_layer = residual_stack_to_logit_diff(per_layer_residual, cache)
    out["per_layer"] = dict(zip(labels, [round(v, 3) for v in per_layer.tolist()]))
    print("Per layer logit attribution:", out["per_layer"])

    per_head_residual, labels = cache.stack_head_results(layer=-1, pos_slice=-1,
                                                         return_labels=True)
    per_head = residual_stack_to_logit_diff(per_head_residual, cache)
    order = per_head.abs().argsort(descending=True)[:5].tolist()
    out["top_heads"] = [(labels[i], round(per_head[i].item(), 3)) for i in order]
    print("Top heads by direct logit attribution:", out["top_heads"])

    with torch.no_grad():
        corrupted_logits = model.run_with_hooks(corrupted_tokens)
    clean_diff = out["logit_diff"]
    corrupted_diff = logits_to_ave_logit_diff(corrupted_logits, answer_tokens).item()
    out["corrupted_logit_diff"] = corrupted_diff
    print(f"Corrupted average logit difference: {corrupted_diff:.3f}")

    def ioi_metric(logits):
        return (logits_to_ave_logit_diff(logits, answer_tokens) - corrupted_diff) / (
            clean_diff - corrupted_diff)

    n_pos = tokens.shape[1]
    with torch.no_grad():
        if PATCH_LAYERS is None:
            layers = list(range(model.cfg.n_layers))
            resid_pre_patch = patching.get_act_patch_resid_pre(model, corrupted_tokens, cache,
                                                               ioi_metric)
        else:
            import pandas as pd

            layers = list(PATCH_LAYERS)
            index_df = pd.DataFrame([(layer, pos) for layer in layers for pos in range(n_pos)],
                                    columns=["layer", "pos"])
            resid_pre_patch = patching.get_act_patch_resid_pre(
                model, corrupted_tokens, cache, ioi_metric, index_axis_names=None,
                index_df=index_df).view(len(layers), n_pos)
    best = resid_pre_patch.flatten().abs().topk(5).indices.tolist()
    out["resid_pre_patch_shape"] = list(resid_pre_patch.shape)
    out["top_patches"] = [(layers[i // n_pos], i % n_pos,
                           round(resid_pre_patch.flatten()[i].item(), 3)) for i in best]
    out["resid_pre_patch"] = resid_pre_patch
    print("resid_pre patching, top (layer, position, value):", out["top_patches"])
    return out


def main(model=None) -> dict:
    if model is None:
        from _load import tl_processed_gguf

        # TL: model = HookedTransformer.from_pretrained(name)
        model = tl_processed_gguf(__doc__.splitlines()[0])
    return analysis(model)


if __name__ == "__main__":
    main()

"""TransformerLens' ``evals`` (``from transformer_lens import evals``): the evaluations that
need no download (:func:`sanity_check`, :func:`induction_loss`, :func:`evaluate_on_dataset`
over your own data loader); those built on hub datasets (:func:`evaluate`, the
``make_*_data_loader`` functions, :func:`ioi_eval`, :func:`mmlu_eval`) raise a
:class:`mi_core.CapabilityError` naming what they would download."""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch

from mi_core import CapabilityError
from mi_core.tl.utils import lm_cross_entropy_loss

_ZOOM_IN = ("Many important transition points in the history of science have been moments when "
            "science 'zoomed in.' At these points, we develop a visualization or tool that "
            "allows us to see the world in a new level of detail, and a new field of science "
            "develops to study the world through this lens.")


def sanity_check(model: Any) -> torch.Tensor:
    """The loss on the first paragraph of "Zoom In" (< 5: the model is probably fine)."""
    return model(_ZOOM_IN, return_type="loss")


@torch.inference_mode()
def induction_loss(model: Any, tokenizer: Any = None, batch_size: int = 4,
                   subseq_len: int = 384, prepend_bos: Optional[bool] = None,
                   device: Any = None) -> torch.Tensor:
    """The loss on the second half of random token sequences repeated twice (tokens drawn
    from 100..19999 with torch's global generator, as TransformerLens draws them); the first
    token is BOS when `prepend_bos` (default: the model's ``cfg.default_prepend_bos``)."""
    device = model.cfg.device if device is None else device
    first_half = torch.randint(100, 20000, (batch_size, subseq_len)).to(device)
    tokens = first_half.repeat(1, 2)  # "b p -> b (2 p)"
    if model.cfg.default_prepend_bos if prepend_bos is None else prepend_bos:
        tokens[:, 0] = (tokenizer if tokenizer is not None else model.tokenizer).bos_token_id
    logits = model(tokens, return_type="logits")
    per_token = lm_cross_entropy_loss(logits, tokens, per_token=True)
    return per_token[:, subseq_len + 1:].mean()


def evaluate_on_dataset(model: Any, data_loader: Iterable[dict[str, torch.Tensor]],
                        truncate: int = 100, device: Any = None) -> float:
    """Mean loss over the batches (``batch["tokens"]``) of `data_loader`, up to `truncate`
    + 1 batches."""
    device = model.cfg.device if device is None else device
    running, total = 0.0, 0
    for batch in data_loader:
        running += model(batch["tokens"].to(device), return_type="loss").mean().item()
        total += 1
        if total > truncate:
            break
    return running / total


def _downloads(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise CapabilityError(f"evals.{what} downloads a dataset from the HuggingFace hub; "
                              f"mi-core's TransformerLens layer does not download datasets: "
                              f"build your own data loader and use evals.evaluate_on_dataset")
    refuse.__name__ = what
    return refuse


make_wiki_data_loader = _downloads("make_wiki_data_loader")
make_owt_data_loader = _downloads("make_owt_data_loader")
make_pile_data_loader = _downloads("make_pile_data_loader")
make_code_data_loader = _downloads("make_code_data_loader")
make_mmlu_data_loader = _downloads("make_mmlu_data_loader")
evaluate = _downloads("evaluate")
ioi_eval = _downloads("ioi_eval")
mmlu_eval = _downloads("mmlu_eval")

__all__ = ["evaluate", "evaluate_on_dataset", "induction_loss", "ioi_eval",
           "make_code_data_loader", "make_mmlu_data_loader", "make_owt_data_loader",
           "make_pile_data_loader", "make_wiki_data_loader", "mmlu_eval", "sanity_check"]

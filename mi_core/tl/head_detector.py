"""TransformerLens' ``head_detector``: score every attention head against a detection pattern.

``detect_head(model, seq, "previous_token_head")`` (or ``"duplicate_token_head"``,
``"induction_head"``, or a [pos, pos] lower-triangular tensor) -> [n_layers, n_heads] scores,
-1 for heads not asked for; ``error_measure="mul"`` (the share of attention on the pattern) or
``"abs"`` (1 - mean absolute difference x pos, rounded to 3 places). Same signature, defaults
and numbers as TransformerLens' (3.x); ``model`` is a :class:`~mi_core.tl.HookedTransformer`.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any, Literal, Optional, Union

import torch

from mi_core.tl.utils import TLInputError, is_lower_triangular, is_square

HeadName = Literal["previous_token_head", "duplicate_token_head", "induction_head"]
HEAD_NAMES = ("previous_token_head", "duplicate_token_head", "induction_head")
ErrorMeasure = Literal["abs", "mul"]
LayerHeadTuple = tuple[int, int]
LayerToHead = dict[int, list[int]]

INVALID_HEAD_NAME_ERR = (
    f"detection_pattern must be a Tensor or one of head names: {HEAD_NAMES}; got %s")
CACHE_WITH_SEQ_LIST_ERR = (
    "A single cache cannot be reused across multiple prompts, so `cache` is not\n"
    "supported when `seq` is a list. Pass one prompt at a time, or omit `cache`\n"
    "and let each prompt be run separately.")
SEQ_LEN_ERR = "The sequence must be non-empty and must fit within the model's context window."
DET_PAT_NOT_SQUARE_ERR = ("The detection pattern must be a lower triangular matrix of shape "
                          "(sequence_length, sequence_length); sequence_length=%d; got detection "
                          "pattern of shape %s")


def detect_head(model: Any, seq: Union[str, list[str]],
                detection_pattern: Union[torch.Tensor, str],
                heads: Optional[Union[list[LayerHeadTuple], LayerToHead]] = None,
                cache: Any = None, *, exclude_bos: bool = False,
                exclude_current_token: bool = False, error_measure: str = "mul"
                ) -> torch.Tensor:
    """Scores [n_layers, n_heads] of how well each head's attention on `seq` matches the
    detection pattern (averaged over the prompts of a list, for a named pattern)."""
    cfg = model.cfg
    tokens = model.to_tokens(seq).to(cfg.device)
    seq_len = tokens.shape[-1]
    if error_measure not in ("abs", "mul"):
        raise TLInputError(f"Invalid error_measure={error_measure}; valid values are "
                           f"('abs', 'mul')")
    if isinstance(detection_pattern, str):
        if detection_pattern not in HEAD_NAMES:
            raise TLInputError(INVALID_HEAD_NAME_ERR % detection_pattern)
        if isinstance(seq, list):
            if cache is not None:
                raise TLInputError(CACHE_WITH_SEQ_LIST_ERR)
            scores = [detect_head(model, s, detection_pattern, heads=heads,
                                  exclude_bos=exclude_bos,
                                  exclude_current_token=exclude_current_token,
                                  error_measure=error_measure) for s in seq]
            return torch.stack(scores).mean(0)
        detection_pattern = _PATTERNS[detection_pattern](tokens.cpu()).to(cfg.device)
    if error_measure == "mul" and not set(detection_pattern.unique().tolist()).issubset({0, 1}):
        logging.warning("Using detection pattern with values other than 0 or 1 with "
                        "error_measure 'mul'")
    if not 1 < seq_len < cfg.n_ctx:
        raise TLInputError(SEQ_LEN_ERR)
    if not (is_lower_triangular(detection_pattern) and seq_len == detection_pattern.shape[0]):
        raise TLInputError(DET_PAT_NOT_SQUARE_ERR % (seq_len, detection_pattern.shape))
    if cache is None:
        _, cache = model.run_with_cache(tokens, remove_batch_dim=True)
    if heads is None:
        layer2heads = {i: list(range(cfg.n_heads)) for i in range(cfg.n_layers)}
    elif isinstance(heads, list):
        layer2heads = defaultdict(list)
        for layer, head in heads:
            layer2heads[layer].append(head)
    else:
        layer2heads = heads
    matches = -torch.ones(cfg.n_layers, cfg.n_heads, dtype=cfg.dtype)
    for layer, layer_heads in layer2heads.items():
        patterns = cache["pattern", layer, "attn"]  # [n_heads, q_pos, k_pos]
        for head in layer_heads:
            matches[layer, head] = compute_head_attention_similarity_score(
                patterns[head, :, :], detection_pattern=detection_pattern,
                exclude_bos=exclude_bos, exclude_current_token=exclude_current_token,
                error_measure=error_measure)
    return matches


def get_previous_token_head_detection_pattern(tokens: torch.Tensor) -> torch.Tensor:
    """[pos, pos]: ones just below the diagonal (each token attends to the previous one)."""
    n = tokens.shape[-1]
    pattern = torch.zeros(n, n)
    pattern[1:, :-1] = torch.eye(n - 1)
    return torch.tril(pattern)


def get_duplicate_token_head_detection_pattern(tokens: torch.Tensor) -> torch.Tensor:
    """[pos, pos]: ones where an earlier token equals the current one."""
    grid = tokens.reshape(-1).repeat(tokens.shape[-1], 1)
    eq = (grid == grid.T).to(torch.int64)
    eq.fill_diagonal_(0)  # a token is trivially a duplicate of itself
    return torch.tril(eq.float())


def get_induction_head_detection_pattern(tokens: torch.Tensor) -> torch.Tensor:
    """[pos, pos]: ones on the token after each earlier duplicate."""
    duplicate = get_duplicate_token_head_detection_pattern(tokens)
    shifted = torch.roll(duplicate, shifts=1, dims=1)
    zeros = torch.zeros(duplicate.shape[0], 1)
    return torch.tril(torch.cat((zeros, shifted[:, 1:]), dim=1))


_PATTERNS = {"previous_token_head": get_previous_token_head_detection_pattern,
             "duplicate_token_head": get_duplicate_token_head_detection_pattern,
             "induction_head": get_induction_head_detection_pattern}


def get_supported_heads() -> None:
    """Print the supported head names."""
    print(f"Supported heads: {HEAD_NAMES}")


def compute_head_attention_similarity_score(attention_pattern: torch.Tensor,
                                            detection_pattern: torch.Tensor, *,
                                            exclude_bos: bool, exclude_current_token: bool,
                                            error_measure: str) -> float:
    """One head's score (see :func:`detect_head`); the cached pattern is not modified."""
    if not is_square(attention_pattern):
        raise TLInputError(f"Attention pattern is not square; got shape "
                           f"{tuple(attention_pattern.shape)}")
    if error_measure == "mul":
        if exclude_bos or exclude_current_token:
            attention_pattern = attention_pattern.clone()
        if exclude_bos:
            attention_pattern[:, 0] = 0
        if exclude_current_token:
            attention_pattern.fill_diagonal_(0)
        score = attention_pattern * detection_pattern
        return (score.sum() / attention_pattern.sum()).item()
    abs_diff = (attention_pattern - detection_pattern).abs()
    if (abs_diff - torch.tril(abs_diff).to(abs_diff.device)).sum() != 0:
        raise TLInputError("the attention pattern is not lower triangular")
    size = len(abs_diff)
    if exclude_bos:
        abs_diff[:, 0] = 0
    if exclude_current_token:
        abs_diff.fill_diagonal_(0)
    return 1 - round((abs_diff.mean() * size).item(), 3)


__all__ = ["HEAD_NAMES", "compute_head_attention_similarity_score", "detect_head",
           "get_duplicate_token_head_detection_pattern", "get_induction_head_detection_pattern",
           "get_previous_token_head_detection_pattern", "get_supported_heads"]

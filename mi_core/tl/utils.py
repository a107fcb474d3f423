"""TransformerLens' ``utils`` (``transformer_lens.utils`` / ``transformer_lens.utilities``):
the functions its demos and users call, same names, signatures and numbers.

``get_device``, ``get_corner``, ``to_numpy``, ``remove_batch_dim``, ``transpose``,
``is_square``, ``is_lower_triangular``, ``get_act_name``, ``Slice``, ``test_prompt``,
``lm_cross_entropy_loss``, ``lm_accuracy``, ``sample_logits``, ``get_attention_mask``,
``get_offset_position_ids``, ``get_cumsum_along_dim``, ``repeat_along_head_dimension``,
``composition_scores``, ``gelu_new`` / ``gelu_fast`` / ``solu``, ``get_nested_attr`` /
``set_nested_attr``, ``filter_dict_by_prefix``, ``override_or_use_default_value``. Dataset
helpers that download (``get_dataset``, ``download_file_from_hf``) are not provided.
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from mi_core import CapabilityError, InputError, MIModel
from mi_core.tl.activation_cache import Slice, SliceInput, get_act_name
from mi_core.tl.errors import TLInputError  # noqa: F401  (re-exported: its home was here)

#: TransformerLens' marker for "use the model's default" (``prepend_bos``, ``padding_side``).
USE_DEFAULT_VALUE = None


class TLCapabilityError(CapabilityError, AssertionError):
    """Something TransformerLens refuses with an assertion (a flag that cannot apply to this
    model, e.g. ``refactor_factored_attn_matrices`` on a rotary model): an
    :class:`mi_core.CapabilityError` that is also the ``AssertionError`` TransformerLens
    raises."""




# -- devices and tensors -------------------------------------------------------------------------
def get_device() -> str:
    """"cuda" when available, else "cpu" (MPS only with ``TRANSFORMERLENS_ALLOW_MPS=1``)."""
    if torch.cuda.is_available():
        return "cuda"
    if (os.environ.get("TRANSFORMERLENS_ALLOW_MPS") == "1"
            and torch.backends.mps.is_available() and torch.backends.mps.is_built()):
        return "mps"
    return "cpu"


def get_corner(tensor: Any, n: int = 3) -> Any:
    """The top-left corner, n along every axis: of a FactoredMatrix, the FactoredMatrix of
    that corner, as TransformerLens 3 returns it (2.x returned its product ``.AB``; the
    matrix's own ``get_corner(n)`` is that tensor)."""
    return tensor[tuple(slice(n) for _ in range(tensor.ndim))]


def to_numpy(tensor: Any) -> Any:
    """A numpy array of a tensor, list, tuple, number or array (needs numpy)."""
    import numpy as np

    if isinstance(tensor, np.ndarray):
        return tensor
    if isinstance(tensor, (list, tuple)):
        return np.array(tensor)
    if isinstance(tensor, torch.Tensor):
        tensor = tensor.detach().cpu()
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
    if isinstance(tensor, (int, float, bool, str)):
        return np.array(tensor)
    raise InputError(f"to_numpy: cannot convert a {type(tensor).__name__}")


def remove_batch_dim(tensor: torch.Tensor) -> torch.Tensor:
    """Drop a leading axis of size 1 (unchanged otherwise)."""
    return tensor.squeeze(0) if tensor.shape[0] == 1 else tensor


def transpose(tensor: torch.Tensor) -> torch.Tensor:
    """Swap the last two axes."""
    return tensor.transpose(-1, -2)


def is_square(x: torch.Tensor) -> bool:
    return x.ndim == 2 and x.shape[0] == x.shape[1]


def is_lower_triangular(x: torch.Tensor) -> bool:
    return is_square(x) and bool(x.equal(x.tril()))


def get_cumsum_along_dim(tensor: torch.Tensor, dim: int, reverse: bool = False) -> torch.Tensor:
    """Cumulative sum along `dim` (from the end with `reverse`)."""
    if reverse:
        tensor = tensor.flip(dims=(dim,))
    out = tensor.cumsum(dim=dim)
    return out.flip(dims=(dim,)) if reverse else out


def repeat_along_head_dimension(tensor: torch.Tensor, n_heads: int,
                                clone_tensor: bool = True) -> torch.Tensor:
    """[batch, pos, d_model] -> [batch, pos, n_heads, d_model]."""
    out = tensor.unsqueeze(-2).expand(*tensor.shape[:-1], n_heads, tensor.shape[-1])
    return out.clone() if clone_tensor else out


def get_offset_position_ids(past_kv_pos_offset: int, attention_mask: torch.Tensor
                            ) -> torch.Tensor:
    """Positions counting real tokens only (left padding), from an attention mask."""
    shifted = attention_mask.cumsum(dim=1) - 1
    positions = shifted.masked_fill(shifted < 0, 0)
    return positions[:, past_kv_pos_offset:]


def filter_dict_by_prefix(dictionary: dict[str, Any], prefix: str) -> dict[str, Any]:
    if not prefix.endswith("."):
        prefix += "."
    return {k[len(prefix):]: v for k, v in dictionary.items() if k.startswith(prefix)}


def get_nested_attr(obj: Any, attr_str: str) -> Any:
    for attr in attr_str.split("."):
        obj = getattr(obj, attr)
    return obj


def set_nested_attr(obj: Any, attr_str: str, value: Any) -> None:
    *parents, last = attr_str.split(".")
    for attr in parents:
        obj = getattr(obj, attr)
    setattr(obj, last, value)


def override_or_use_default_value(default_flag: Any, override: Optional[Any] = None) -> Any:
    return override if override is not None else default_flag


# -- activations ---------------------------------------------------------------------------------
def gelu_new(input: torch.Tensor) -> torch.Tensor:
    return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                           * (input + 0.044715 * torch.pow(input, 3.0))))


def gelu_fast(input: torch.Tensor) -> torch.Tensor:
    return 0.5 * input * (1.0 + torch.tanh(input * 0.7978845608 * (1.0 + 0.044715 * input * input)))


def solu(input: torch.Tensor) -> torch.Tensor:
    return input * F.softmax(input, dim=-1)


# -- language-model losses and sampling ----------------------------------------------------------
def lm_cross_entropy_loss(logits: torch.Tensor, tokens: torch.Tensor,
                          attention_mask: Optional[torch.Tensor] = None,
                          per_token: bool = False) -> torch.Tensor:
    """Next-token cross-entropy: logits [batch, pos, d_vocab], tokens [batch, pos] -> the mean
    (over unmasked positions) or, `per_token`, [batch, pos - 1]."""
    log_probs = F.log_softmax(logits, dim=-1)
    predicted = log_probs[..., :-1, :].gather(dim=-1, index=tokens[..., 1:, None])[..., 0]
    if attention_mask is not None:
        if attention_mask.shape != tokens.shape:
            raise InputError(f"attention_mask must have the shape of tokens, got "
                             f"{tuple(attention_mask.shape)} and {tuple(tokens.shape)}")
        next_token_mask = torch.logical_and(attention_mask[:, :-1].bool(),
                                            attention_mask[:, 1:].bool())
        predicted = predicted.masked_fill(~next_token_mask.to(predicted.device), 0.0)
        n_tokens = next_token_mask.sum().item()
    else:
        n_tokens = predicted.numel()
    if per_token:
        return -predicted
    return -predicted.sum() / n_tokens


def lm_accuracy(logits: torch.Tensor, tokens: torch.Tensor, per_token: bool = False
                ) -> torch.Tensor:
    """Top-1 next-token accuracy ([batch, pos - 1] booleans with `per_token`)."""
    correct = logits.argmax(dim=-1)[:, :-1] == tokens[:, 1:]
    return correct if per_token else correct.sum() / correct.numel()


def sample_logits(final_logits: torch.Tensor, top_k: Optional[int] = None,
                  top_p: Optional[float] = None, temperature: float = 1.0,
                  freq_penalty: float = 0.0, repetition_penalty: float = 1.0,
                  tokens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """TransformerLens' sampler: [batch, d_vocab] -> [batch] token ids (greedy at temperature
    0; top-k or top-p filtering; frequency and repetition penalties over `tokens`)."""
    if repetition_penalty != 1.0 and tokens is not None:
        seen = torch.zeros_like(final_logits, dtype=torch.bool).scatter_(1, tokens, True)
        penalised = torch.where(final_logits > 0, final_logits / repetition_penalty,
                                final_logits * repetition_penalty)
        final_logits = torch.where(seen, penalised, final_logits)
    if temperature == 0.0:
        return final_logits.argmax(dim=-1)
    final_logits = final_logits / temperature
    if freq_penalty > 0:
        if tokens is None or tokens.dim() != 2:
            raise InputError("freq_penalty needs the input tokens [batch, pos]")
        for b in range(final_logits.shape[0]):
            final_logits[b] = final_logits[b] - freq_penalty * torch.bincount(
                tokens[b], minlength=final_logits.shape[-1])
    if top_k is not None:
        if top_k <= 0:
            raise InputError(f"top_k must be > 0, got {top_k}")
        top_k = min(top_k, final_logits.shape[-1])
        top_logits, _ = final_logits.topk(top_k, dim=-1)
        final_logits = final_logits.masked_fill(final_logits < top_logits[..., -1:], -math.inf)
    elif top_p is not None:
        if not 0.0 < top_p <= 1.0:
            raise InputError(f"top_p must be in (0, 1], got {top_p}")
        sorted_logits, sorted_indices = torch.sort(final_logits, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative > top_p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = 0
        final_logits = final_logits.masked_fill(remove.scatter(-1, sorted_indices, remove),
                                                -math.inf)
    final_logits = final_logits.to(torch.float32)
    return torch.distributions.categorical.Categorical(logits=final_logits).sample()


# -- tokens --------------------------------------------------------------------------------------
def get_attention_mask(tokenizer: Any, tokens: torch.Tensor, prepend_bos: bool,
                       padding_side: Optional[str] = None) -> torch.Tensor:
    """1 for real tokens, 0 for the leading (left padding) or trailing (right padding) pad
    tokens; a BOS that is also the pad token stays attended."""
    mask = torch.ones_like(tokens)
    if tokenizer is None:
        return mask
    side = padding_side or tokenizer.padding_side
    is_not_pad = tokens.ne(tokenizer.pad_token_id)
    if side == "right":
        mask[get_cumsum_along_dim(is_not_pad, -1, reverse=True) == 0] = 0
        return mask
    leading = get_cumsum_along_dim(is_not_pad, -1, reverse=False) == 0
    mask[leading] = 0
    if prepend_bos and tokenizer.bos_token_id == tokenizer.pad_token_id:
        bos_at = leading.sum(-1) - 1
        mask[torch.arange(mask.shape[0]), bos_at] = 1
    return mask


def get_input_with_manually_prepended_bos(bos_token: Optional[str], input: Any) -> Any:
    if bos_token is None:
        return input
    return bos_token + input if isinstance(input, str) else [bos_token + s for s in input]


def get_tokens_with_bos_removed(tokenizer: Any, tokens: torch.Tensor,
                                padding_side: Optional[str] = None) -> torch.Tensor:
    """Drop each row's BOS (the first token with right padding; the first real token with
    left padding)."""
    side = padding_side or tokenizer.padding_side
    if side == "right":
        return tokens[..., 1:]
    shape = list(tokens.shape)
    shape[-1] -= 1
    if tokenizer.bos_token_id == tokenizer.pad_token_id:
        leading = get_cumsum_along_dim(tokens.ne(tokenizer.pad_token_id), -1) == 0
        bos_at = leading.sum(-1) - 1
    else:
        bos_at = (tokens == tokenizer.bos_token_id).int().argmax(-1)
    tokens = tokens.scatter(dim=1, index=bos_at.unsqueeze(-1), value=-100)
    return tokens[tokens != -100].view(*shape)


# -- circuits ------------------------------------------------------------------------------------
def composition_scores(left: Any, right: Any, broadcast_dims: bool = True) -> torch.Tensor:
    """||left @ right|| / (||left|| ||right||) of two FactoredMatrix stacks (TransformerLens'
    composition score); with `broadcast_dims` every left leading index meets every right one."""
    if broadcast_dims:
        r_leading, l_leading = right.ndim - 2, left.ndim - 2
        for i in range(l_leading):
            right = right.unsqueeze(i)
        for i in range(r_leading):
            left = left.unsqueeze(i + l_leading)
    if left.rdim != right.ldim:
        raise InputError(f"composition scores need left.rdim == right.ldim, got left "
                         f"{tuple(left.shape)} and right {tuple(right.shape)}")
    new_right, new_left = right.collapse_r(), left.collapse_l()
    r_norms = new_right.norm(dim=[-2, -1])
    l_norms = new_left.norm(dim=[-2, -1])
    comp_norms = (new_left @ new_right).norm(dim=[-2, -1])
    return comp_norms / r_norms / l_norms


# -- exploration ---------------------------------------------------------------------------------
def test_prompt(prompt: str, answer: Union[str, Sequence[str]], model: Any,
                prepend_space_to_answer: bool = True, print_details: bool = True,
                prepend_bos: Optional[bool] = USE_DEFAULT_VALUE, top_k: int = 10) -> None:
    """Print how `model` ranks `answer` after `prompt`: the tokenized prompt and answer, then
    per answer token its rank, logit and probability and the `top_k` tokens, then the ranks
    (TransformerLens' lines). An :class:`mi_core.MIModel` prints through its own
    ``test_prompt`` (the same lines, its tokenizer's BOS default)."""
    if isinstance(model, MIModel):
        model.test_prompt(prompt, answer, prepend_space_to_answer, print_details, prepend_bos,
                          top_k)
        return None
    answers = [answer] if isinstance(answer, str) else list(answer)
    n_answers = len(answers)
    multiple = n_answers > 1
    if prepend_space_to_answer:
        answers = [a if a.startswith(" ") else " " + a for a in answers]
    prompt_tokens = model.to_tokens(prompt, prepend_bos=prepend_bos)
    answer_tokens = model.to_tokens(answers, prepend_bos=False)
    if multiple:
        answer_tokens = answer_tokens[:, :1]
    tokens = torch.cat((prompt_tokens.repeat(answer_tokens.shape[0], 1), answer_tokens), dim=1)
    prompt_str_tokens = model.to_str_tokens(prompt, prepend_bos=prepend_bos)
    answer_str_tokens_list = [model.to_str_tokens(a, prepend_bos=False) for a in answers]
    prompt_length = len(prompt_str_tokens)
    answer_length = 1 if multiple else len(answer_str_tokens_list[0])
    if print_details:
        print("Tokenized prompt:", prompt_str_tokens)
        if multiple:
            print("Tokenized answers:", answer_str_tokens_list)
        else:
            print("Tokenized answer:", answer_str_tokens_list[0])
    logits = model(tokens)
    probs = logits.softmax(dim=-1)
    ranks = []
    for index in range(prompt_length, prompt_length + answer_length):
        ans = tokens[:, index]
        ans_strs = [a[index - prompt_length] for a in answer_str_tokens_list]
        token_probs = probs[:, index - 1]
        sorted_probs, sorted_positions = token_probs.sort(descending=True)
        ans_ranks = sorted_positions.argsort(-1)[range(n_answers), ans.cpu()].tolist()
        ranks.append(list(zip(ans_strs, ans_ranks)))
        if print_details:
            print(f"Performance on answer token{'s' if n_answers > 1 else ''}:")
            for i in range(n_answers):
                print(f"Rank: {ans_ranks[i]: <8} Logit: {logits[i, index - 1, ans[i]].item():5.2f}"
                      f" Prob: {token_probs[i, ans[i]].item():6.2%} Token: |{ans_strs[i]}|")
            for i in range(top_k):
                print(f"Top {i}th token. Logit: "
                      f"{logits[0, index - 1, sorted_positions[0, i]].item():5.2f} "
                      f"Prob: {sorted_probs[0, i].item():6.2%} "
                      f"Token: |{model.to_string(sorted_positions[0, i])}|")
    print(f"Ranks of the answer tokens: {[r[0] for r in ranks] if not multiple else ranks}")
    return None


test_prompt.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


def get_dataset(*args: Any, **kwargs: Any) -> Any:
    raise CapabilityError("utils.get_dataset downloads from the HuggingFace hub, which "
                          "mi-core's TransformerLens layer does not do; load the dataset "
                          "yourself")


def download_file_from_hf(*args: Any, **kwargs: Any) -> Any:
    raise CapabilityError("utils.download_file_from_hf is not provided (no hub downloads "
                          "outside MIModel.from_pretrained)")


def keep_single_column(dataset: Any, col_name: str) -> Any:
    """`dataset` (a ``datasets`` Dataset) with only the column `col_name`."""
    for key in list(dataset.features):
        if key != col_name:
            dataset = dataset.remove_columns(key)
    return dataset


def tokenize_and_concatenate(dataset: Any, tokenizer: Any, streaming: bool = False,
                             max_length: int = 1024, column_name: str = "text",
                             add_bos_token: bool = True, num_proc: Optional[int] = 10,
                             set_format: bool = True) -> Any:
    """TransformerLens 3's ``tokenize_and_concatenate``: each document tokenized without
    special tokens, documents joined by EOS, cut into rows of `max_length` (BOS first when
    `add_bos_token`; a corpus shorter than a row padded with EOS, or the pad token if the
    tokenizer has one) -> a Dataset with one column ``"tokens"`` [rows, max_length]. Needs the
    ``datasets`` package (the caller's `dataset` is one)."""
    import numpy as np

    dataset = keep_single_column(dataset, column_name)
    if tokenizer.eos_token_id is None:
        raise TLInputError("Tokenizer must have an EOS token.")
    seq_len = max_length - 1 if add_bos_token else max_length
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token is not None else tokenizer.eos_token_id

    def tokenize(examples: dict[str, Any]) -> dict[str, Any]:
        texts = examples[column_name]
        if not texts:
            return {"tokens": np.array([], dtype=np.int64)}
        rows = tokenizer(texts, add_special_tokens=False)["input_ids"]
        pieces: list[Any] = []
        for i, row in enumerate(rows):  # documents joined by one EOS token
            pieces += [np.asarray(row, dtype=np.int64)] + (
                [np.array([tokenizer.eos_token_id], dtype=np.int64)] if i < len(rows) - 1
                else [])
        tokens = np.concatenate(pieces)
        n_rows = max(1, len(tokens) // seq_len)
        if len(tokens) < seq_len:
            tokens = np.concatenate([tokens, np.full(seq_len - len(tokens), pad_id)])
        tokens = tokens[:seq_len * n_rows].reshape(n_rows, seq_len)
        if add_bos_token:
            tokens = np.concatenate([np.full((n_rows, 1), tokenizer.bos_token_id), tokens], 1)
        return {"tokens": tokens}

    out = dataset.map(tokenize, batched=True, remove_columns=[column_name],
                      **({"num_proc": num_proc} if not streaming else {}))
    if set_format:
        out.set_format(type="torch", columns=["tokens"])
    return out


__all__ = [
    "SliceInput", "Slice", "USE_DEFAULT_VALUE", "TLCapabilityError", "TLInputError",
    "composition_scores", "download_file_from_hf", "filter_dict_by_prefix", "gelu_fast",
    "gelu_new", "get_act_name", "get_attention_mask", "get_corner", "get_cumsum_along_dim",
    "get_dataset", "get_device", "get_input_with_manually_prepended_bos", "get_nested_attr",
    "get_offset_position_ids", "get_tokens_with_bos_removed", "is_lower_triangular",
    "is_square", "keep_single_column", "lm_accuracy", "lm_cross_entropy_loss", "override_or_use_default_value",
    "remove_batch_dim", "repeat_along_head_dimension", "sample_logits", "set_nested_attr",
    "solu", "test_prompt", "to_numpy", "tokenize_and_concatenate", "transpose",
]

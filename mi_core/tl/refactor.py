"""TransformerLens' ``refactor_factored_attn_matrices``, in place on a loaded model.

Per layer and head: W_Q, W_K (with their biases as an extra input row) become the even SVD
factors of W_Q W_K^T; W_V, W_O become U S and V^T of W_V W_O (W_O orthogonal); the value bias
moves into b_O. Every product the forward computes is unchanged. Written through the weight
views of the weight-access capability, and read back: a backend whose weights are not views,
a bias the model lacks becoming non-zero, or grouped-query attention (K / V shared across query
heads cannot be refactored per query head) is refused with a CapabilityError, never a silent
partial rewrite. TransformerLens refuses rotary models (the QK circuit depends on positions);
so does ``HookedTransformer.process_weights_``.
"""

from __future__ import annotations

import torch

from mi_core import CapabilityError, MIError, MIModel
from mi_core.plugin import WeightAccess, require_capability
from mi_core.tl.factored_matrix import FactoredMatrix


def refactor_factored_attn_matrices(model: MIModel) -> None:
    """Refactor every layer's attention weights of `model` in place (see the module doc)."""
    require_capability(model.backend, WeightAccess, "refactor_factored_attn_matrices")
    if model.num_kv_heads != model.num_heads:
        raise CapabilityError("refactor_factored_attn_matrices: not supported for grouped-query "
                              "attention (keys and values are shared by several query heads)")
    layers = [_refactored(model, layer) for layer in range(model.num_layers)]
    for layer, new in enumerate(layers):  # check everything before writing anything
        for name, value in new.items():
            _check_writable(model, name, layer, value, new["W_Q"].abs().max().item())
    for layer, new in enumerate(layers):
        for name, value in new.items():
            _write(model, name, layer, value)


def _weight(model: MIModel, name: str, layer: int) -> torch.Tensor | None:
    try:
        return model.backend.get_weight(name, layer)
    except MIError:
        return None


def _refactored(model: MIModel, layer: int) -> dict[str, torch.Tensor]:
    """The new W_Q, b_Q, W_K, b_K, W_V, b_V, W_O, b_O of `layer` (TransformerLens' formulas)."""
    w = {n: _weight(model, n, layer) for n in
         ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O", "b_O")}
    h, d, dh = w["W_Q"].shape  # type: ignore[union-attr]
    zeros = torch.zeros(h, dh, dtype=model.dtype, device=model.device)
    b_q = w["b_Q"] if w["b_Q"] is not None else zeros
    b_k = w["b_K"] if w["b_K"] is not None else zeros
    b_v = w["b_V"] if w["b_V"] is not None else zeros
    b_o = w["b_O"] if w["b_O"] is not None else torch.zeros(d, dtype=model.dtype,
                                                              device=model.device)
    q_eff = torch.cat([w["W_Q"], b_q[:, None, :]], dim=1)
    k_eff = torch.cat([w["W_K"], b_k[:, None, :]], dim=1)
    q_even, k_even_t = FactoredMatrix(q_eff, k_eff.transpose(-1, -2)).make_even().pair
    k_even = k_even_t.transpose(-1, -2)
    w_o = w["W_O"]
    b_o_new = b_o + (b_v[:, :, None] * w_o).sum(1).sum(0)
    u, s, v = FactoredMatrix(w["W_V"], w_o).svd()
    return {"W_Q": q_even[:, :-1, :], "b_Q": q_even[:, -1, :], "W_K": k_even[:, :-1, :],
            "b_K": k_even[:, -1, :], "b_V": torch.zeros_like(b_v), "b_O": b_o_new,
            "W_V": u @ s.diag_embed(), "W_O": v.transpose(-1, -2)}


def _check_writable(model: MIModel, name: str, layer: int, value: torch.Tensor,
                    scale: float) -> None:
    target = _weight(model, name, layer)
    if target is None:
        if value.abs().max().item() > 1e-5 * max(1.0, scale):
            raise CapabilityError(f"refactor_factored_attn_matrices: layer {layer} needs a "
                                  f"{name} this model does not have")
        return
    if model.backend.get_weight(name, layer).data_ptr() != target.data_ptr():
        raise CapabilityError(f"refactor_factored_attn_matrices: this backend's {name} is not a "
                              f"view of its weights, so it cannot be rewritten in place")


def _write(model: MIModel, name: str, layer: int, value: torch.Tensor) -> None:
    target = _weight(model, name, layer)
    if target is None:  # absent, and (checked) the refactored value is zero
        return
    with torch.no_grad():
        target.copy_(value)
    if not torch.equal(model.backend.get_weight(name, layer), value.to(target.dtype)):
        raise CapabilityError(f"refactor_factored_attn_matrices: writing {name} of layer "
                              f"{layer} did not reach the model's weights")

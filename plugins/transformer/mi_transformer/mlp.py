"""The MLP: gated (separate or fused gate/up) or plain, with hooks in neuron space (d_mlp)."""

from __future__ import annotations

from typing import Callable

import attrs
import torch
import torch.nn.functional as F

from mi_core.plugin import HookRun, MIError

from mi_transformer.config import Activation, MlpLayout

ACTIVATIONS: dict[Activation, Callable[[torch.Tensor], torch.Tensor]] = {
    Activation.SILU: F.silu,
    Activation.GELU_TANH: lambda x: F.gelu(x, approximate="tanh"),
    Activation.GELU: F.gelu,
    Activation.RELU: F.relu,
    Activation.RELU2: lambda x: F.relu(x).square(),
    Activation.XIELU: lambda x: _no_shared_xielu(),  # each layer has its own (MlpWeights.act)
}


def _no_shared_xielu() -> torch.Tensor:
    raise MIError("xIELU has learned parameters per layer: the MLP needs MlpWeights.act")


@attrs.define(eq=False)
class XIeLU:
    """Apertus' xIELU with one layer's learned parameters, as transformers'
    ``XIELUActivation._xielu_python``: alpha_p = softplus(a_p), alpha_n = beta + softplus(a_n);
    x > 0: alpha_p x^2 + beta x, else (expm1(min(x, eps)) - x) alpha_n + beta x."""

    alpha_p: torch.Tensor  # [1], before softplus
    alpha_n: torch.Tensor  # [1], before softplus
    beta: torch.Tensor  # []
    eps: torch.Tensor  # [] (negative)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        alpha_p = F.softplus(self.alpha_p)
        alpha_n = self.beta + F.softplus(self.alpha_n)
        return torch.where(x > 0, alpha_p * x * x + self.beta * x,
                           (torch.expm1(torch.min(x, self.eps)) - x) * alpha_n + self.beta * x)


@attrs.define(eq=False)
class MlpWeights:
    """Weights in torch.nn.Linear layout ([out, in]).

    Gated: `w_in` is the gate, `w_up` the up projection (for a fused checkpoint both are
    row-views of the one stored tensor, no copy). Plain: `w_in` is c_fc, `w_up` None.
    """

    layout: MlpLayout
    w_in: torch.Tensor  # [d_mlp, d_model]
    w_out: torch.Tensor  # [d_model, d_mlp]
    w_up: torch.Tensor | None = None  # [d_mlp, d_model]
    b_in: torch.Tensor | None = None
    b_up: torch.Tensor | None = None
    b_out: torch.Tensor | None = None
    act: Callable[[torch.Tensor], torch.Tensor] | None = None  # a learned activation (xIELU)


def gaussian_topk(x: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Gemma-3n's activation sparsity (transformers' ``Gemma3nTextMLP._gaussian_topk``): per
    token, the values below mean + std * Phi^-1(sparsity) are cut, relu(x - cutoff), so about
    that share of the neurons is zero when x is Gaussian. x [..., d_mlp] -> the same."""
    target = torch.tensor(sparsity, dtype=torch.float32, device=x.device)
    multiplier = torch.distributions.normal.Normal(0, 1).icdf(target).type(x.dtype)
    cutoff = x.mean(dim=-1, keepdim=True) + x.std(dim=-1, keepdim=True, unbiased=False) \
        * multiplier
    return F.relu(x - cutoff)


def mlp(w: MlpWeights, x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor],
        run: HookRun, pre_name: str, post_name: str, pre_linear_name: str = "",
        sparsity: float = 0.0, *, gate_scale: float = 1.0) -> torch.Tensor:
    """x [batch, seq, d_model] -> [batch, seq, d_model].

    ``mlp.hook_pre`` is the gate pre-activation (gated) or c_fc output (plain), times
    `gate_scale` (Falcon-H1's gate multiplier); ``mlp.hook_post`` is act(gate) * up (gated)
    or act(pre) (plain), both [batch, seq, d_mlp]; ``mlp.hook_pre_linear`` (gated only,
    TransformerLens' name) the up projection's output. `sparsity` > 0 (Gemma-3n): the
    activation reads :func:`gaussian_topk` of ``hook_pre``.
    """
    pre = F.linear(x, w.w_in, w.b_in)
    pre = run.apply(pre_name, pre * gate_scale if gate_scale != 1.0 else pre)
    post = (w.act or act)(gaussian_topk(pre, sparsity) if sparsity > 0 else pre)
    if w.w_up is not None:
        up = F.linear(x, w.w_up, w.b_up)
        post = post * (run.apply(pre_linear_name, up) if pre_linear_name else up)
    post = run.apply(post_name, post)
    return F.linear(post, w.w_out, w.b_out)

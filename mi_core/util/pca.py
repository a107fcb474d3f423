"""Principal component analysis on torch.linalg (SVD of the centred data)."""

from __future__ import annotations

import attrs
import torch

from mi_core.plugin import MIError


@attrs.define
class PcaResult:
    """Top-k principal components of data [n, d].

    components [k, d] (unit rows, sign fixed so the largest |entry| is positive),
    explained_variance [k] (unbiased, like scikit-learn), explained_variance_ratio [k],
    mean [d].
    """

    components: torch.Tensor
    explained_variance: torch.Tensor
    explained_variance_ratio: torch.Tensor
    mean: torch.Tensor

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """[..., d] -> coordinates [..., k]."""
        return (x.to(self.mean.dtype) - self.mean) @ self.components.T

    def reconstruct(self, coords: torch.Tensor) -> torch.Tensor:
        """[..., k] -> [..., d] (the mean plus the components' span)."""
        return coords @ self.components + self.mean


def pca(x: torch.Tensor, k: int) -> PcaResult:
    """Top-`k` principal components of x [n, d] (float64 internally for accuracy)."""
    if x.dim() != 2:
        raise MIError(f"pca expects data [n, d], got shape {list(x.shape)}")
    n, d = x.shape
    if not 1 <= k <= min(n, d):
        raise MIError(f"pca: k={k} must be in 1..min(n, d)={min(n, d)}")
    xd = x.detach().to(torch.float64)
    mean = xd.mean(0)
    _, s, vh = torch.linalg.svd(xd - mean, full_matrices=False)
    comps = vh[:k]
    sign = torch.sign(comps.gather(1, comps.abs().argmax(1, keepdim=True)))
    comps = comps * sign
    var = s.pow(2) / max(n - 1, 1)
    total = var.sum().clamp_min(torch.finfo(torch.float64).tiny)
    dt = x.dtype if x.is_floating_point() else torch.float32
    return PcaResult(comps.to(dt), var[:k].to(dt), (var[:k] / total).to(dt), mean.to(dt))

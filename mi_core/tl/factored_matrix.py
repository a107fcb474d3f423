"""TransformerLens' ``FactoredMatrix``: a low-rank product kept as its two factors.

Same interface and numbers as ``transformer_lens.FactoredMatrix`` (3.x): ``eigenvalues``, ``S``,
``U``, ``V`` are properties, ``svd()`` returns ``(U, S, V)`` with ``U diag(S) V^T == AB``,
indexing (``OV[layer, head]``) slices the leading axes (and rows / columns of the product),
``@`` with tensors and other factored matrices keeps the product factored, and the repr is
TransformerLens'. Norms, singular values and eigenvalues come from mdim x mdim matrices; the
ldim x rdim product is only built by :attr:`AB`.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Union

import torch

from mi_core import InputError


class FactoredMatrix:
    """The product ``A @ B`` (A [..., ldim, mdim], B [..., mdim, rdim]), leading axes
    broadcast (see the module doc)."""

    def __init__(self, A: torch.Tensor, B: torch.Tensor) -> None:
        if A.shape[-1] != B.shape[-2]:
            raise _ShapeError(f"FactoredMatrix: inner dimensions differ, A {list(A.shape)} "
                              f"and B {list(B.shape)}")
        self.ldim, self.rdim, self.mdim = A.shape[-2], B.shape[-1], B.shape[-2]
        self.has_leading_dims = A.ndim > 2 or B.ndim > 2
        try:
            lead = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        except RuntimeError as exc:
            raise _ShapeError(f"FactoredMatrix: leading dimensions of A {list(A.shape)} and "
                              f"B {list(B.shape)} do not broadcast") from exc
        self.shape = torch.Size(lead + (self.ldim, self.rdim))
        self.A = A.broadcast_to(lead + (self.ldim, self.mdim))
        self.B = B.broadcast_to(lead + (self.mdim, self.rdim))

    # -- products ------------------------------------------------------------------------------
    def __matmul__(self, other: Union[torch.Tensor, "FactoredMatrix"]) -> Any:
        if isinstance(other, FactoredMatrix):
            return (self @ other.A) @ other.B
        if other.ndim < 2:
            return (self.A @ (self.B @ other.unsqueeze(-1))).squeeze(-1)
        if other.size(-2) != self.rdim:
            raise _ShapeError(f"right matrix must match on the inner dimension: {self.shape} @ "
                              f"{tuple(other.shape)}")
        if self.rdim > self.mdim:
            return FactoredMatrix(self.A, self.B @ other)
        return FactoredMatrix(self.AB, other)

    def __rmatmul__(self, other: torch.Tensor) -> Any:
        if other.size(-1) != self.ldim:
            raise _ShapeError(f"left matrix must match on the inner dimension: "
                              f"{tuple(other.shape)} @ {self.shape}")
        if other.ndim < 2:
            return ((other.unsqueeze(-2) @ self.A) @ self.B).squeeze(-2)
        if self.ldim > self.mdim:
            return FactoredMatrix(other @ self.A, self.B)
        return FactoredMatrix(other, self.AB)

    def __mul__(self, scalar: Union[int, float, torch.Tensor]) -> "FactoredMatrix":
        if isinstance(scalar, torch.Tensor) and scalar.numel() != 1:
            raise _ShapeError(f"a FactoredMatrix is multiplied by a scalar, got shape "
                              f"{tuple(scalar.shape)} (use @ for matrix products)")
        return FactoredMatrix(self.A * scalar, self.B)

    __rmul__ = __mul__

    @property
    def AB(self) -> torch.Tensor:
        """The full product [..., ldim, rdim] (materialised)."""
        return self.A @ self.B

    @property
    def BA(self) -> torch.Tensor:
        """B @ A [..., mdim, mdim] (needs ldim == rdim)."""
        if self.rdim != self.ldim:
            raise _ShapeError(f"BA needs ldim == rdim, shape is {tuple(self.shape)}")
        return self.B @ self.A

    @property
    def T(self) -> "FactoredMatrix":
        return FactoredMatrix(self.B.transpose(-2, -1), self.A.transpose(-2, -1))

    # -- spectra -------------------------------------------------------------------------------
    @cached_property
    def _svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        Ua, Sa, Vha = torch.linalg.svd(self.A, full_matrices=False)
        Ub, Sb, Vhb = torch.linalg.svd(self.B, full_matrices=False)
        Vb = Vhb.transpose(-1, -2)
        middle = Sa[..., :, None] * Vha @ Ub * Sb[..., None, :]
        Um, Sm, Vhm = torch.linalg.svd(middle, full_matrices=False)
        return Ua @ Um, Sm, Vb @ Vhm.transpose(-1, -2)

    def svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(U [..., ldim, mdim], S [..., mdim], V [..., rdim, mdim]), ``U diag(S) V^T = AB``,
        from the SVDs of the factors (never the ldim x rdim product)."""
        return self._svd

    U = property(lambda self: self.svd()[0])
    S = property(lambda self: self.svd()[1])
    V = property(lambda self: self.svd()[2])
    Vh = property(lambda self: self.svd()[2], doc="V, as TransformerLens' deprecated alias")

    @property
    def eigenvalues(self) -> torch.Tensor:
        """The eigenvalues of BA (complex, [..., mdim]): AB's non-zero eigenvalues."""
        m = self.BA
        if m.dtype in (torch.bfloat16, torch.float16):
            m = m.to(torch.float32)
        return torch.linalg.eig(m).eigenvalues

    def norm(self) -> torch.Tensor:
        """Frobenius norm [...]."""
        return self.S.pow(2).sum(-1).sqrt()

    def make_even(self) -> "FactoredMatrix":
        """The same product as (U sqrt(S)) (sqrt(S) V^T): both halves hold half the spectrum."""
        root = self.S.sqrt()
        return FactoredMatrix(self.U * root[..., None, :], root[..., :, None]
                              * self.V.transpose(-1, -2))

    def collapse_l(self) -> torch.Tensor:
        """S V^T [..., mdim, rdim]: the product without its left orthogonal factor."""
        return self.S[..., :, None] * self.V.transpose(-1, -2)

    def collapse_r(self) -> torch.Tensor:
        """U S [..., ldim, mdim]."""
        return self.U * self.S[..., None, :]

    # -- shape ---------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def pair(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.A, self.B

    def unsqueeze(self, k: int) -> "FactoredMatrix":
        return FactoredMatrix(self.A.unsqueeze(k), self.B.unsqueeze(k))

    def get_corner(self, k: int = 3) -> torch.Tensor:
        """The top-left k x ... x k block of AB (from k rows / columns of the factors)."""
        corner = self.A[..., :k, :] @ self.B[..., :, :k]
        return corner[tuple(slice(k) for _ in range(corner.ndim))]

    def __getitem__(self, idx: Any) -> "FactoredMatrix":
        """Index the leading axes; one more index selects rows of the product, two more rows
        and columns (an int keeps its axis, as TransformerLens)."""
        idx = idx if isinstance(idx, tuple) else (idx,)
        length = len([i for i in idx if i is not None])
        lead = len(self.shape) - 2
        if length <= lead:
            return FactoredMatrix(self.A[idx], self.B[idx])
        if length == lead + 1:
            idx = _int_to_slice(idx, -1)
            return FactoredMatrix(self.A[idx], self.B[idx[:-1]])
        if length == lead + 2:
            idx = _int_to_slice(_int_to_slice(idx, -1), -2)
            return FactoredMatrix(self.A[idx[:-1]], self.B[idx[:-2] + (slice(None), idx[-1])])
        from mi_core.tl.errors import TLValueError  # TransformerLens raises a ValueError here
        raise TLValueError(f"{idx} is too long an index for a FactoredMatrix with shape "
                           f"{tuple(self.shape)}")

    def __repr__(self) -> str:
        return f"FactoredMatrix: Shape({self.shape}), Hidden Dim({self.mdim})"


def _int_to_slice(idx: tuple[Any, ...], pos: int) -> tuple[Any, ...]:
    items = list(idx)
    if isinstance(items[pos], int):
        v = items[pos]
        items[pos] = slice(v, v + 1 if v != -1 else None)
    return tuple(items)


class _ShapeError(InputError, AssertionError):
    """Shapes that do not fit (an :class:`mi_core.InputError`; TransformerLens asserts)."""

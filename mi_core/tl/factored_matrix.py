"""TransformerLens' ``FactoredMatrix``: a low-rank product kept as its two factors."""

from __future__ import annotations

import torch

from mi_core import MIError


class FactoredMatrix:
    """The product ``A @ B`` (A [..., m, k], B [..., k, n]) kept as its two factors.

    Norms, singular values and eigenvalues are computed from k x k matrices; the m x n
    product is only built by :attr:`AB` (explicitly asked for).
    """

    def __init__(self, A: torch.Tensor, B: torch.Tensor) -> None:
        if A.shape[-1] != B.shape[-2]:
            raise MIError(f"FactoredMatrix: inner dimensions differ, A {list(A.shape)} "
                          f"and B {list(B.shape)}")
        self.A, self.B = A, B
        self._svd: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        batch = torch.broadcast_shapes(self.A.shape[:-2], self.B.shape[:-2])
        return (*batch, self.A.shape[-2], self.B.shape[-1])

    @property
    def ldim(self) -> int:
        return self.A.shape[-2]

    @property
    def rdim(self) -> int:
        return self.B.shape[-1]

    @property
    def mdim(self) -> int:
        return self.A.shape[-1]

    @property
    def AB(self) -> torch.Tensor:
        """The full product [..., m, n] (materialised)."""
        return self.A @ self.B

    @property
    def BA(self) -> torch.Tensor:
        """The small product B @ A [..., k, k] (needs m == n)."""
        return self.B @ self.A

    @property
    def T(self) -> "FactoredMatrix":
        return FactoredMatrix(self.B.transpose(-1, -2), self.A.transpose(-1, -2))

    def __matmul__(self, other: "torch.Tensor | FactoredMatrix") -> "FactoredMatrix":
        if isinstance(other, FactoredMatrix):
            return FactoredMatrix(self.A, (self.B @ other.A) @ other.B) if self.mdim <= other.mdim \
                else FactoredMatrix(self.A @ (self.B @ other.A), other.B)
        return FactoredMatrix(self.A, self.B @ other)

    def __rmatmul__(self, other: torch.Tensor) -> "FactoredMatrix":
        return FactoredMatrix(other @ self.A, self.B)

    def svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Compact SVD (U [..., m, k], S [..., k], Vh [..., k, n]) with ``U diag(S) Vh = AB``,
        from the SVDs of the factors (never the m x n product)."""
        if self._svd is None:
            Ua, Sa, Vha = torch.linalg.svd(self.A, full_matrices=False)
            Ub, Sb, Vhb = torch.linalg.svd(self.B, full_matrices=False)
            mid = (Sa[..., :, None] * Vha) @ (Ub * Sb[..., None, :])  # [..., k, k]
            Um, Sm, Vhm = torch.linalg.svd(mid, full_matrices=False)
            self._svd = (Ua @ Um, Sm, Vhm @ Vhb)
        return self._svd

    @property
    def S(self) -> torch.Tensor:
        return self.svd()[1]

    def norm(self) -> torch.Tensor:
        """Frobenius norm [...]."""
        return self.S.pow(2).sum(-1).sqrt()

    def eigenvalues(self) -> torch.Tensor:
        """Eigenvalues of the square AB (complex, [..., k]): the non-zero ones equal BA's."""
        if self.ldim != self.rdim:
            raise MIError(f"eigenvalues need a square matrix, got {self.shape}")
        return torch.linalg.eigvals(self.BA)

    def get_corner(self, k: int = 3) -> torch.Tensor:
        """The top-left k x k block of AB (computed from k rows / columns only)."""
        return self.A[..., :k, :] @ self.B[..., :, :k]

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={self.shape}, inner={self.mdim})"

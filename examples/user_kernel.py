"""A user kernel for one format, chosen by dispatch: a diagonal-wise product for DIA tensors.

nvmath-python's UST generates a kernel per format; in sparsetorch a kernel for a format is a
backend, and ``sparsetorch.kernels.register_kernel`` writes that backend around a function.
This example registers :func:`dia_matmul` for the DIA format, then shows that every product on
a DIA tensor (``A @ x``, ``st.matmul``, gradients) runs it, while other formats keep their
backends. Run it: ``python examples/user_kernel.py``.

DIA storage (``(i, j) -> (j - i : compressed, i : range)``): ``A.crd(0)`` holds the stored
diagonals' offsets ``j - i``; ``A.values`` holds, per diagonal, one slot per row ``i`` (slots
whose column ``i + offset`` falls outside the matrix are padding, zero).
"""

from __future__ import annotations

import torch

import sparsetorch as st
import sparsetorch.kernels
from sparsetorch.format import DIA


def dia_matmul(A: st.SparseTensor, X: torch.Tensor) -> torch.Tensor:
    """``A @ X`` for A in DIA, X of shape (n, k): one gather and one multiply-add per diagonal,
    vectorized over diagonals (no conversion to CSR)."""
    offsets = A.crd(0)
    m, n = A.format_shape
    V = A.values.reshape(offsets.numel(), m)  # (diagonals, rows)
    rows = torch.arange(m, device=X.device)
    cols = rows.unsqueeze(0) + offsets.unsqueeze(1)  # (diagonals, rows): the column of each slot
    inside = (cols >= 0) & (cols < n)
    gathered = X[cols.clamp(0, n - 1)]  # (diagonals, rows, k)
    return ((V * inside).unsqueeze(-1).to(X.dtype) * gathered).sum(0)


def tridiagonal(n: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A dense tridiagonal test matrix (-1, 2.5, -1.25) with a far diagonal at offset +n//2."""
    D = torch.diag(torch.full((n,), 2.5, dtype=dtype)) + torch.diag(torch.full((n - 1,), -1.0, dtype=dtype), -1)
    D = D + torch.diag(torch.full((n - 1,), -1.25, dtype=dtype), 1)
    return D + torch.diag(torch.linspace(0.1, 1.0, n - n // 2, dtype=dtype), n // 2)


def main() -> None:
    D = tridiagonal(200)
    A = st.SparseTensor.from_dense(D, DIA)
    x = torch.randn(200, 4, dtype=torch.float64)
    with sparsetorch.kernels.register_kernel(DIA, dia_matmul) as kernel:
        print(st.explain("matmul", A, x))  # the kernel's row is marked "->"
        y = A @ x
        print(f"{kernel.name}: max |A @ x - dense| = {float((y - D @ x).abs().max()):.2e}")
        v = A.values.clone().requires_grad_(True)
        loss = (st.matmul(A.with_values(v), x) ** 2).sum()  # gradients: SDDMM for v, the adjoint for x
        loss.backward()
        print(f"loss {loss.item():.4f}, |grad v| {v.grad.norm().item():.4f}")
    print("after remove():", st.explain("matmul", A, x).chosen.backend)


if __name__ == "__main__":
    main()

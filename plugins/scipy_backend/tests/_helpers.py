"""Matrices the tests share (SciPy-built Poisson operators, as the benchmarks use)."""

from __future__ import annotations

import scipy.sparse as sp


def poisson_scipy(m: int, dim: int) -> sp.csr_array:
    """The 5-point (2-D) or 7-point (3-D) Laplacian on an m^dim grid, CSR with sorted indices."""
    T = sp.diags_array([-1.0, 2.0, -1.0], offsets=[-1, 0, 1], shape=(m, m))
    I = sp.eye_array(m)
    if dim == 2:
        A = sp.kron(I, T) + sp.kron(T, I)
    else:
        A = sp.kron(sp.kron(I, I), T) + sp.kron(sp.kron(I, T), I) + sp.kron(sp.kron(T, I), I)
    A = sp.csr_array(A)
    A.sort_indices()
    return A

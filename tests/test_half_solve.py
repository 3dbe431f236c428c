"""Solves with float16/bfloat16 inputs (issue 17): done in float32 and rounded back, accurate to
the half dtype, differentiable. References: dense float64 torch solves."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st

HALF = [torch.float16, torch.bfloat16]


def _system(n: int, seed: int, spd: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < 0.1)
    D = D + D.T if spd else D
    return D + (n ** 0.5 + 3.0) * torch.eye(n, dtype=torch.float64)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("spd", [True, False])
def test_half_solve_is_accurate_to_the_dtype(dtype, spd):
    D = _system(60, 1, spd).to(dtype)  # the half matrix is the problem: its float64 copy is the reference
    b = torch.randn(60, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(dtype)
    A = st.SparseTensor.from_dense(D)
    x, info = st.solve(A, b, return_info=True)
    assert x.dtype == dtype and x.shape == b.shape
    ref = torch.linalg.solve(D.double(), b.double())
    err = float(torch.linalg.vector_norm(x.double() - ref) / torch.linalg.vector_norm(ref))
    # rounding the exact answer to the dtype: half its epsilon per entry
    assert err <= 2 * torch.finfo(dtype).eps, err
    assert "solved in float32" in info.reason


@pytest.mark.parametrize("dtype", HALF)
def test_half_solve_gradients_match_float64(dtype):
    D = _system(30, 3, False).to(dtype)
    A = st.SparseTensor.from_dense(D)
    vals = A.values.detach().clone().requires_grad_(True)
    b = torch.randn(30, generator=torch.Generator().manual_seed(4), dtype=torch.float64).to(dtype).requires_grad_(True)
    x = st.solve(A.with_values(vals), b)
    x.float().square().sum().backward()
    Dr = D.double().requires_grad_(True)
    br = b.detach().double().requires_grad_(True)
    torch.linalg.solve(Dr, br).square().sum().backward()
    tol = 20 * torch.finfo(dtype).eps
    torch.testing.assert_close(b.grad.double(), br.grad, rtol=tol, atol=tol * float(br.grad.abs().max()))
    rows, cols = D.nonzero(as_tuple=True)
    g = Dr.grad[rows, cols]
    torch.testing.assert_close(vals.grad.double(), g, rtol=tol, atol=tol * float(g.abs().max()))


def test_mixed_half_and_float32_operands_still_name_the_mismatch():
    A = st.SparseTensor.from_dense(_system(10, 5, True).to(torch.float16))
    with pytest.raises(st.SparseTorchError):
        st.solve(A, torch.ones(10, dtype=torch.float32))

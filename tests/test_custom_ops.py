"""The torch.library custom op: opcheck, gradcheck in float64, and torch.compile without graph breaks."""

from __future__ import annotations

import pytest
import torch

from sparsetorch.autograd.custom_ops import csr_matmul


def _csr(m=7, n=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(m, n, generator=g, dtype=dtype) * (torch.rand(m, n, generator=g) < 0.5)
    S = D.to_sparse_csr()
    return S.crow_indices(), S.col_indices(), S.values().clone(), D


def test_values_match_dense():
    crow, col, vals, D = _csr()
    X = torch.randn(5, 3, dtype=torch.float64)
    assert torch.allclose(csr_matmul(crow, col, vals, X, 7, 5), D @ X)


def test_opcheck():
    crow, col, vals, _ = _csr()
    X = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(csr_matmul, (crow, col, vals.requires_grad_(True), X, 7, 5))


def test_gradcheck_values_and_dense_operand():
    crow, col, vals, _ = _csr()
    X = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    vals.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v, x: csr_matmul(crow, col, v, x, 7, 5), (vals, X))


def test_torch_compile_traces_without_graph_break():
    crow, col, vals, D = _csr()
    X = torch.randn(5, 3, dtype=torch.float64)

    def f(v, x):
        return torch.relu(csr_matmul(crow, col, v, x, 7, 5)).sum()

    try:
        compiled = torch.compile(f, fullgraph=True, backend="eager")
        out = compiled(vals, X)
    except Exception as exc:  # pragma: no cover - environments without dynamo support
        pytest.skip(f"torch.compile unavailable here: {exc}")
    assert torch.allclose(out, torch.relu(D @ X).sum())

"""The default calls under ``torch.inference_mode()`` (how models are served): inference tensors keep no version
counter, and every cache key made of one raised "Inference tensors do not track version counter" (st.solve on a
matrix built there, or on any matrix with inference values). Against dense float64."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.format import CSR

DT = torch.float64


def _matrix(n: int) -> tuple[st.SparseTensor, torch.Tensor | None]:
    i = torch.arange(n)
    rows = torch.cat([i, i[:-1], i[1:]])
    cols = torch.cat([i, i[1:], i[:-1]])
    vals = torch.cat([torch.full((n,), 4.0, dtype=DT), -torch.ones(2 * n - 2, dtype=DT)])
    A = st.SparseTensor.from_coo(vals, rows, cols, shape=(n, n), format=CSR)
    return A, (A.to_dense() if n <= 1000 else None)


@pytest.mark.parametrize("n", [60, 50_000])
def test_ops_on_a_matrix_built_in_inference_mode(n):
    with torch.inference_mode():
        A, D = _matrix(n)
        x = torch.linspace(-1, 1, n, dtype=DT)
        for _ in range(2):  # the second call meets the caches
            y = st.solve(A, x)
            torch.testing.assert_close(A @ y, x)
            ref = D @ x if D is not None else 4 * x - torch.cat([x[1:], x.new_zeros(1)]) - torch.cat([x.new_zeros(1), x[:-1]])
            torch.testing.assert_close(A @ x, ref)
        if D is not None:
            torch.testing.assert_close(st.logdet(A), torch.logdet(D))
            torch.testing.assert_close(st.eigsh(A, 2, which="LA")[0], torch.linalg.eigvalsh(D)[-2:])
            torch.testing.assert_close(st.lstsq(A, x), torch.linalg.solve(D, x))
    y = st.solve(A, x)  # outside, the same inference tensors
    torch.testing.assert_close(A @ y, x)


def test_an_ordinary_matrix_and_a_sparse_model_inside_inference_mode():
    A, D = _matrix(80)
    model = st.nn.reformat_model(torch.nn.Sequential(torch.nn.Linear(32, 16).double()), st.nn.magnitude(0.5))
    dense = torch.nn.Linear(32, 16).double()
    with torch.no_grad():
        dense.weight.copy_(model[0].weight.to_dense() if hasattr(model[0].weight, "to_dense") else model[0].weight)
        dense.bias.copy_(model[0].bias)
    with torch.inference_mode():
        x = torch.ones(80, dtype=DT)
        torch.testing.assert_close(st.solve(A, x), torch.linalg.solve(D, x))
        inp = torch.randn(4, 32, dtype=DT)
        torch.testing.assert_close(model(inp), dense(inp))


def test_a_plan_first_loaded_in_inference_mode_serves_ordinary_calls_after():
    """The plan's snapshot of the values, taken in inference mode, was refilled in place by the next ordinary
    call on the same pattern ("Inplace update to inference tensor outside InferenceMode"; an outside sweep
    the same session)."""
    b = torch.ones(2, dtype=DT)
    with torch.inference_mode():
        st.solve(st.SparseTensor.from_dense(torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=DT)), b)
    D = torch.tensor([[5.0, 2.0], [2.0, 7.0]], dtype=DT)
    B = st.SparseTensor.from_dense(D)
    torch.testing.assert_close(st.solve(B, b), torch.linalg.solve(D, b))
    torch.testing.assert_close(st.lstsq(2 * B, b), torch.linalg.solve(2 * D, b))

"""A product whose chosen backend fails (a kernel that does not build on this device, a plugin's bug) is
answered by the torch backend with a warning naming the failure when dispatch chose that backend; a
pinned backend's failure is raised (session 27's plugin sweep: an unpinned st.matmul raised BackendError
though the torch backend could answer). Reference: the dense product in float64."""

from __future__ import annotations

import pytest
import torch

import sparsetorch
from sparsetorch.dispatch.records import BackendInfo, Offer

from test_plugins import backends  # noqa: F401 - the fixture


class _FailingPlan:
    backend, method, preconditioner = "failing", "spmm", None

    def __init__(self, A, phase: str) -> None:
        self.phase = phase
        if phase == "build":
            raise RuntimeError("NVRTC: the kernel does not compile for this device")

    def set_values(self, values):
        if self.phase == "set_values":
            raise RuntimeError("could not upload the values")

    def apply(self, X, *, adjoint=False):
        raise RuntimeError("launch failed")


class _Failing:
    def __init__(self, phase: str) -> None:
        self.phase = phase

    @sparsetorch.hookimpl
    def sparsetorch_backend_info(self) -> BackendInfo:
        return BackendInfo(name="failing", version="0", description="test double", devices=("cpu",),
                           dtypes=(torch.float64,), ops={"matmul": ("spmm",)}, priority=100)

    @sparsetorch.hookimpl
    def sparsetorch_offers(self, request):
        if request.op != "matmul":
            return []
        return [Offer("failing", "spmm", 1e-12, 0, lambda A, req: _FailingPlan(A, self.phase), notes="test double")]


def _operands():
    g = torch.Generator().manual_seed(0)
    D = torch.randn(30, 20, generator=g, dtype=torch.float64) * (torch.rand(30, 20, generator=g) < 0.3)
    return sparsetorch.SparseTensor.from_dense(D), D, torch.randn(20, 3, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("phase", ["build", "set_values", "apply"])
def test_a_failing_chosen_backend_is_answered_by_torch_with_a_warning(backends, phase):  # noqa: F811
    backends.register(_Failing(phase), "failing")
    A, D, X = _operands()
    for call in (lambda: sparsetorch.matmul(A, X), lambda: A @ X, lambda: A @ X[:, 0]):
        with pytest.warns(sparsetorch.SparseTorchWarning, match="failing/spmm.*answered by the torch backend"):
            y = call()
        ref = D @ (X if y.dim() == 2 else X[:, 0])
        torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    # gradients flow through the torch backend's product
    v = A.values.detach().clone().requires_grad_(True)
    Xg = X.clone().requires_grad_(True)
    with pytest.warns(sparsetorch.SparseTorchWarning):
        sparsetorch.matmul(A.with_values(v), Xg).sum().backward()
    Dg = D.clone().requires_grad_(True)
    Xr = X.clone().requires_grad_(True)
    (Dg @ Xr).sum().backward()
    torch.testing.assert_close(Xg.grad, Xr.grad)
    torch.testing.assert_close(v.grad, Dg.grad[D != 0])


def test_a_pinned_failing_backend_raises(backends):  # noqa: F811
    backends.register(_Failing("apply"), "failing")
    A, _, X = _operands()
    with pytest.raises(sparsetorch.BackendError, match="failing/spmm failed in apply"):
        sparsetorch.matmul(A, X, backend="failing")

"""lstsq and a misbehaving plugin: what a plan returns is checked, and a failure of a method dispatch chose hands
over to the next offer (here the built-in torch/dense SVD), as solve, eigsh and logdet do.

Session 27's plugin sweep: a wrong shape surfaced as ``ValueError: SerialCsr: shapes do not match``, a bare tensor
as ``too many values to unpack``, a NumPy array as ``AttributeError ... 'data_ptr'``; an unpinned call whose
plugin raised (or answered wrongly as DIRECT) raised BackendError / NotConvergedError "stopped after 0 iterations"
instead of falling back. Each misbehaviour below: the unpinned call answers (against torch.linalg.lstsq in
float64) from the fallback, with the failed attempt recorded; the pinned call raises naming the plugin.

In-process test backends, registered as tests/test_plugins.py does (installed plugins disabled).
"""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch import BackendInfo, Offer

from test_plugins import backends  # noqa: F401 - the fixture

NAME = "odd"


class _Plan:
    """A dense pseudo-inverse least-squares plan whose misbehaviour ``mode`` selects."""

    preconditioner = None

    def __init__(self, A: st.SparseTensor, mode: str) -> None:
        self.A, self.mode, self.backend, self.method = A, mode, NAME, "qr"
        self.D = None

    def set_values(self, values: torch.Tensor) -> None:
        if self.mode == "set_values_raises":
            raise IndexError("boom in set_values")
        self.D = self.A.with_values(values).to_dense()

    def lstsq(self, B: torch.Tensor, *, adjoint: bool = False, options=None):
        mode = self.mode
        if mode == "lstsq_raises":
            raise ValueError("boom in lstsq")
        D = self.D.mT.conj() if adjoint else self.D
        X = torch.linalg.pinv(D) @ B
        if mode == "wrong_shape" or (mode == "adjoint_wrong_shape" and adjoint):
            X = X[..., :-1, :]
        elif mode == "nan":
            X = X.clone()
            X.view(-1)[0] = float("nan")
        elif mode == "wrong_direct":
            X = 1.5 * X + 0.1
        elif mode == "ndarray":
            X = X.numpy()
        res = st.IterationResult(0, float("nan"), True, st.Status.DIRECT, "test double")
        if mode == "bare_tensor":
            return X
        return X, res


class OddBackend:
    """One lstsq offer ("qr"), cheaper than torch/dense, so that dispatch chooses it."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    @st.hookimpl
    def sparsetorch_backend_info(self) -> BackendInfo:
        return BackendInfo(name=NAME, version="0", description="misbehaving test double", devices=("cpu",),
                           dtypes=(torch.float64,), ops={"lstsq": ("qr",)})

    @st.hookimpl
    def sparsetorch_offers(self, request):
        if request.op != "lstsq":
            return []
        return [Offer(NAME, "qr", 1e-9, 0, self.build, notes="test double")]

    def build(self, A, request) -> _Plan:
        if self.mode == "factory_raises":
            raise ZeroDivisionError("boom in the factory")
        return _Plan(A, self.mode)


def _system(m: int = 12, n: int = 6):
    g = torch.Generator().manual_seed(0)
    D = torch.randn(m, n, generator=g, dtype=torch.float64) * (torch.rand(m, n, generator=g) < 0.6)
    D[:n] += 3.0 * torch.eye(n, dtype=torch.float64)  # full column rank
    b = torch.randn(m, generator=g, dtype=torch.float64)
    return st.SparseTensor.from_dense(D), D, b


def _reference(D: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.linalg.lstsq(D, b.unsqueeze(-1)).solution[:, 0]


#: misbehaviour -> (phase the pinned call's BackendError names, what its message says)
MODES = {
    "factory_raises": ("build", "boom in the factory"),
    "set_values_raises": ("set_values", "boom in set_values"),
    "lstsq_raises": ("lstsq", "boom in lstsq"),
    "wrong_shape": ("lstsq", r"shape \(5, 1\).*expected \(6, 1\)"),
    "bare_tensor": ("lstsq", r"returned Tensor, expected \(X, IterationResult\)"),
    "ndarray": ("lstsq", r"ndarray"),
    "nan": ("lstsq", "NaN or Inf"),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_failing_plugin_hands_over_unless_pinned(backends, mode) -> None:  # noqa: F811
    backends.register(OddBackend(mode), NAME)
    A, D, b = _system()
    assert st.explain("lstsq", A, b).chosen.backend == NAME
    x, info = st.lstsq(A, b, return_info=True)
    torch.testing.assert_close(x, _reference(D, b), rtol=1e-10, atol=1e-12)
    assert (info.backend, info.method) == ("torch", "dense")
    assert info.converged and len(info.attempts) == 2
    first = info.attempts[0]
    assert (first.backend, first.method, first.succeeded) == (NAME, "qr", False)
    assert info.attempts[-1].succeeded
    # the Lstsq object hands over alike (and keeps the plan that answered)
    ls = st.Lstsq(A)
    torch.testing.assert_close(ls.solve(b), _reference(D, b), rtol=1e-10, atol=1e-12)
    assert (ls.backend, ls.method) == ("torch", "dense")
    # pinned: the plugin's failure is raised, naming it and the phase
    phase, text = MODES[mode]
    with pytest.raises(st.BackendError, match=text) as err:
        st.lstsq(A, b, backend=NAME, method="qr")
    assert f"{NAME}/qr" in str(err.value)
    assert err.value.label == f"{NAME}/qr" and err.value.phase == phase


def test_a_wrong_direct_answer_hands_over_unless_pinned(backends) -> None:  # noqa: F811
    """A wrong answer flagged DIRECT: refused by the backward-error check. Unpinned, the next offer answers;
    pinned, it stays the NotConvergedError (INACCURATE) that a refused QR answer raises (test_lstsq's lp_e226 case:
    a rank decision, not only a plugin bug, can give one), naming the plugin."""
    backends.register(OddBackend("wrong_direct"), NAME)
    A, D, b = _system()
    x, info = st.lstsq(A, b, return_info=True)
    torch.testing.assert_close(x, _reference(D, b), rtol=1e-10, atol=1e-12)
    assert (info.backend, info.method) == ("torch", "dense")
    assert [a.backend for a in info.attempts] == [NAME, "torch"] and info.attempts[0].status is st.Status.INACCURATE
    with pytest.raises(st.NotConvergedError, match=f"{NAME}/qr .*not a least-squares answer"):
        st.lstsq(A, b, backend=NAME, method="qr")


def test_a_wrong_shape_of_the_adjoint_solve_hands_over_in_the_backward_pass(backends) -> None:  # noqa: F811
    """The forward answer is the plugin's (correct); its adjoint solve returns a wrong shape: the backward pass
    hands over to the next offer (gradients against dense autograd); pinned, BackendError naming the plugin."""
    backends.register(OddBackend("adjoint_wrong_shape"), NAME)
    A, D, b = _system()
    w = torch.linspace(-1.0, 1.0, D.shape[1], dtype=torch.float64)
    v = A.values.detach().clone().requires_grad_(True)
    bb = b.clone().requires_grad_(True)
    x, info = st.lstsq(A.with_values(v), bb, return_info=True)
    assert info.backend == NAME
    gv, gb = torch.autograd.grad(x @ w, (v, bb))
    Dd, bd = D.clone().requires_grad_(True), b.clone().requires_grad_(True)
    gD, gbd = torch.autograd.grad(_reference(Dd, bd) @ w, (Dd, bd))
    coords, slot = A.entries()
    torch.testing.assert_close(gv[slot], gD[coords[0], coords[1]], rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(gb, gbd, rtol=1e-8, atol=1e-10)
    x = st.lstsq(A.with_values(v), bb, backend=NAME, method="qr")
    with pytest.raises(st.BackendError, match=r"returned X of shape \(11, 1\).*expected \(12, 1\)") as err:
        torch.autograd.grad(x @ w, (v, bb))
    assert err.value.label == f"{NAME}/qr" and err.value.phase == "lstsq"


def test_every_offer_failing_raises_the_last_error_with_the_attempts(backends, monkeypatch) -> None:  # noqa: F811
    """No offer answers (torch/dense made to fail too): the last BackendError, listing what was tried."""
    from sparsetorch.backends.torch_native import dense

    backends.register(OddBackend("lstsq_raises"), NAME)
    A, _D, b = _system()
    monkeypatch.setattr(dense.DenseLstsqPlan, "lstsq", lambda self, B, **kw: B)  # m rows for n: a wrong shape
    with pytest.raises(st.BackendError, match=f"torch/dense failed in lstsq.*tried before it: {NAME}/qr") as err:
        st.lstsq(A, b, cache=False)
    assert err.value.label == "torch/dense"

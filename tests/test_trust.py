"""The default solve you can trust (issue 14): the accuracy contract, checked plugin results,
fallback with recorded attempts, learning from failures on a pattern, scaling, and input checks.

References are dense torch float64 solves; broken plugins are test doubles registered at run time."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch import BackendInfo, Offer
from sparsetorch.dispatch import reset_backends
from sparsetorch.dispatch.experience import clear_experience
from sparsetorch.dispatch.select import clear_decisions
from sparsetorch.format import BSR, CSR
from sparsetorch.testing.problems import poisson2d, random_rectangular

from test_plugins import DensePlan

DT = torch.float64


def _relres(A: st.SparseTensor, x: torch.Tensor, b: torch.Tensor) -> float:
    D = A.to_dense()
    return float(torch.linalg.vector_norm(b - D @ x) / torch.linalg.vector_norm(b))


@pytest.fixture
def torch_only(monkeypatch):
    """Only the built-in torch backend plus what a test registers."""
    monkeypatch.setenv("SPARSETORCH_DISABLE_PLUGINS", "1")
    b = reset_backends()
    clear_decisions()
    clear_experience()
    yield b
    monkeypatch.undo()
    reset_backends()
    clear_decisions()
    clear_experience()


# --- the accuracy contract ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [CSR, BSR(3, 3)], ids=["csr", "bsr3"])
def test_default_tolerance_is_the_dtypes_not_the_formats(fmt):
    """The same SPD matrix as CSR (a factorization) and as BSR(3, 3) (CG before): 1e-10 in float64."""
    A = st.SparseTensor.from_dense(poisson2d(12, 12).to_dense(), fmt)  # 144 = 48 blocks of 3
    b = torch.randn(144, dtype=DT, generator=torch.Generator().manual_seed(0))
    x = st.solve(A, b)
    assert _relres(A, x, b) <= 1e-10
    x32 = st.solve(A.to(torch.float32), b.float())
    assert _relres(A, x32.double(), b) <= 2e-5


def test_explicit_rtol_keeps_its_meaning():
    A = poisson2d(20, 20)
    b = torch.ones(400, dtype=DT)
    x, info = st.solve(A, b, backend="torch", method="cg", rtol=1e-4, return_info=True)
    assert info.converged and 1e-12 < _relres(A, x, b) <= 1e-4


def test_lstsq_default_is_as_accurate_as_qr():
    A = random_rectangular(50, 20, density=0.3, seed=1)
    b = torch.randn(50, dtype=DT, generator=torch.Generator().manual_seed(2))
    x = st.lstsq(A, b)
    ref = torch.linalg.lstsq(A.to_dense(), b.unsqueeze(-1)).solution.squeeze(-1)
    assert float(torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref)) <= 1e-9


# --- numerics that survive scaling -------------------------------------------------------------------
@pytest.mark.parametrize("bscale", [1e-170, 1e200])
@pytest.mark.parametrize("method", ["cg", "minres", "bicgstab", "gmres", None])
def test_tiny_and_huge_right_hand_sides(bscale, method):
    A = poisson2d(8, 8)
    b = torch.randn(64, dtype=DT, generator=torch.Generator().manual_seed(3)) * bscale
    x, info = st.solve(A, b, method=method, backend="torch" if method else None, return_info=True)
    ref = torch.linalg.solve(A.to_dense(), b / bscale)  # in units of bscale (the test's own norms must not under/overflow)
    assert info.converged and bool(torch.isfinite(x).all())
    assert float(torch.linalg.vector_norm(x / bscale - ref) / torch.linalg.vector_norm(ref)) <= 1e-8


def test_matrix_near_the_overflow_threshold():
    A = poisson2d(8, 8)
    As = A.with_values(A.values * 1e300)
    b = torch.randn(64, dtype=DT, generator=torch.Generator().manual_seed(4))
    x = st.solve(As, b, backend="torch", method="cg")
    ref = torch.linalg.solve(A.to_dense(), b)  # x * 1e300
    assert bool(torch.isfinite(x).all())
    assert float(torch.linalg.vector_norm(x * 1e300 - ref) / torch.linalg.vector_norm(ref)) <= 1e-8


# --- the core checks what plugins return -------------------------------------------------------------
class _Broken(DensePlan):
    def __init__(self, A, how):
        super().__init__(A, "broken", "lu")
        self.how = how
        if how == "build":
            raise KeyError("the factorization table")

    def set_values(self, values):
        if self.how == "set_values":
            raise IndexError("index 7 is out of bounds")
        super().set_values(values)

    def solve(self, B, *, adjoint=False, options=None):
        if self.how == "solve":
            raise ZeroDivisionError("float division by zero")
        X, res = super().solve(B, adjoint=adjoint, options=options)
        if self.how == "shape":
            return X[:-1], res
        if self.how == "nan":
            return torch.full_like(X, float("nan")), res
        if self.how == "wrong":
            return X + 1.0, res
        return X, res


class _BrokenBackend:
    def __init__(self, how):
        self.how = how

    @st.hookimpl
    def sparsetorch_backend_info(self):
        return BackendInfo(name="broken", version="0", description="test double", devices=("cpu",),
                           dtypes=(DT,), ops={"solve": ("lu",)}, priority=10)

    @st.hookimpl
    def sparsetorch_offers(self, request):
        return [Offer("broken", "lu", 1e-12, 0, lambda A, req: _Broken(A, self.how), notes="test double")]


@pytest.mark.parametrize("how, phase", [("build", "build"), ("set_values", "set_values"), ("solve", "solve"),
                                        ("shape", "result")])
def test_plugin_failures_are_backend_errors_naming_plugin_method_and_phase(torch_only, how, phase):
    torch_only.register(_BrokenBackend(how), "broken")
    A = poisson2d(5, 5)
    b = torch.ones(25, dtype=DT)
    with pytest.raises(st.BackendError, match="broken/lu") as exc:
        st.solve(A, b, backend="broken", method="lu")
    assert exc.value.phase == phase and exc.value.label == "broken/lu"
    if how in ("build", "set_values", "solve"):
        assert exc.value.__cause__ is not None  # the original exception, chained
    # unpinned, the call falls back to the next offer and says so
    x, info = st.solve(A, b, return_info=True)
    assert info.backend == "torch" and [a.backend for a in info.attempts][0] == "broken"
    assert not info.attempts[0].succeeded and info.attempts[-1].succeeded
    torch.testing.assert_close(x, torch.linalg.solve(A.to_dense(), b))


@pytest.mark.parametrize("how", ["nan", "wrong"])
def test_wrong_answers_are_never_handed_over(torch_only, how):
    torch_only.register(_BrokenBackend(how), "broken")
    A = poisson2d(5, 5)
    b = torch.ones(25, dtype=DT)
    x, info = st.solve(A, b, return_info=True)
    assert info.backend == "torch" and info.attempts[0].backend == "broken"
    assert _relres(A, x, b) <= 1e-12
    with pytest.raises(st.SparseTorchError):
        st.solve(A, b, backend="broken", method="lu")


def test_gradients_use_the_method_that_succeeded(torch_only):
    torch_only.register(_BrokenBackend("wrong"), "broken")
    A = poisson2d(4, 3)
    v = A.values.detach().clone().requires_grad_(True)
    b = torch.randn(12, dtype=DT, generator=torch.Generator().manual_seed(5), requires_grad=True)

    def f(v, b):
        return st.solve(A.with_values(v), b)

    assert torch.autograd.gradcheck(f, (v, b))


# --- fallback, budgets and learning ------------------------------------------------------------------
def test_a_failing_iterative_choice_falls_back_and_is_remembered(torch_only):
    """A non-symmetric system whose Krylov attempt is forced to fail (maxiter budget of a cheap-looking
    offer): the call answers from LU, records both attempts, and the next call on the pattern skips
    the failed method."""
    from sparsetorch.testing.problems import convection_diffusion

    A = convection_diffusion(30, 30)
    b = torch.ones(900, dtype=DT)
    x, info = st.solve(A, b, backend="torch", return_info=True, dense_max=100_000)
    assert _relres(A, x, b) <= 1e-10
    methods = [a.method for a in info.attempts]
    assert methods[-1] in ("lu", "bicgstab", "gmres") and info.attempts[-1].succeeded
    table = st.explain("solve", A, b, backend="torch", dense_max=100_000)
    text = str(table)
    assert "did not converge on this pattern" in text or "measured" in text or methods == ["lu"]


def test_pinned_method_still_raises_naming_what_to_try():
    from sparsetorch.testing.problems import convection_diffusion

    A = convection_diffusion(10, 10)
    b = torch.ones(100, dtype=DT)
    with pytest.raises(st.NotConvergedError, match="maxiter"):
        st.solve(A, b, backend="torch", method="bicgstab", maxiter=2)


def test_symmetric_indefinite_nonsingular_is_not_called_singular():
    """LDL^T without pivoting meets a zero pivot on [[0, 1], [1, 0]]-like blocks: LU decides."""
    D = torch.zeros(6, 6, dtype=DT)
    for i in range(0, 6, 2):
        D[i, i + 1] = D[i + 1, i] = 1.0
    A = st.SparseTensor.from_dense(D)
    b = torch.arange(1.0, 7.0, dtype=DT)
    x = st.solve(A, b)
    torch.testing.assert_close(x, torch.linalg.solve(D, b))


def test_truly_singular_is_a_named_error():
    D = poisson2d(4, 4).to_dense()
    D[3] = D[2]  # two equal rows
    A = st.SparseTensor.from_dense(D)
    with pytest.raises(st.SingularMatrixError):
        st.solve(A, torch.randn(16, dtype=DT, generator=torch.Generator().manual_seed(6)))


def test_singular_matrix_with_b_in_its_range_gets_a_solution():
    """A singular A with b = A x (b in the range): a minimum-norm least-squares solution meeting the
    contract is a right answer; with b outside the range the singular verdict stands; the gradient
    of such a solve is not defined and says so."""
    D = poisson2d(4, 4).to_dense()
    D[3] = D[2]
    D[:, 3] = D[:, 2]  # symmetric, rank 15
    A = st.SparseTensor.from_dense(D)
    g = torch.Generator().manual_seed(7)
    b = D @ torch.randn(16, dtype=DT, generator=g)
    x, info = st.solve(A, b, return_info=True)
    assert _relres(A, x, b) <= 1e-10 and "range" in info.reason and info.attempts[-1].succeeded
    assert info.method == "lu"  # refinement with the factorization of A + delta I
    D2 = D.clone()
    D2[5, 5] = 0.0  # not stored: no diagonal to shift at this slot, the small dense path answers
    A2 = st.SparseTensor.from_dense(D2)
    b2 = D2 @ torch.randn(16, dtype=DT, generator=g)
    x2, info2 = st.solve(A2, b2, return_info=True)
    assert _relres(A2, x2, b2) <= 1e-10 and "range" in info2.reason
    with pytest.raises(st.SingularMatrixError):
        st.solve(A, torch.randn(16, dtype=DT, generator=g))
    bg = b.clone().requires_grad_(True)
    y = st.solve(A, bg)
    with pytest.raises(st.SingularMatrixError):
        y.sum().backward()


# --- inputs --------------------------------------------------------------------------------------------
def test_update_values_checks_dtype_shape_and_layout():
    A = poisson2d(4, 4)
    s = st.Solver(A)
    with pytest.raises(st.InputError, match="float32"):
        s.update_values(A.values.float())
    with pytest.raises(st.InputError, match="shape"):
        s.update_values(A.values[:-1])
    with pytest.raises(st.InputError, match="complex128"):
        s.update_values(A.values.to(torch.complex128))


def test_every_offer_explain_shows_can_be_built():
    """Never offer what the plan will refuse (an unknown preconditioner reached a torch GMRES plan)."""
    from sparsetorch.testing.problems import convection_diffusion

    A = convection_diffusion(6, 6)
    b = torch.ones(36, dtype=DT)
    for pre in ("ilu", "jacobi", None):
        table = st.explain("solve", A, b, backend="torch", preconditioner=pre)
        for row in table.offers:
            x = st.solve(A, b, backend="torch", method=row.method, preconditioner=pre)
            assert _relres(A, x, b) <= 1e-8, (pre, row.method)
        if pre == "ilu":
            assert not any(r.method == "gmres" for r in table.offers)


def test_detection_of_patterns_that_are_not_symmetric():
    """Rows and columns with different counts: non-symmetric unless the unmatched entries are
    stored zeros (then the values are symmetric and detection must say so)."""
    from sparsetorch.ops.properties import detect

    rows = torch.tensor([0, 0, 1, 1, 2, 2])
    cols = torch.tensor([0, 1, 0, 1, 2, 0])
    zero = st.SparseTensor.from_coo(torch.tensor([4.0, 1.0, 1.0, 4.0, 4.0, 0.0], dtype=DT), rows, cols, shape=(3, 3))
    assert "symmetric" in detect(zero) and "spd" in detect(zero)
    nonzero = st.SparseTensor.from_coo(torch.tensor([4.0, 1.0, 1.0, 4.0, 4.0, 0.5], dtype=DT), rows, cols, shape=(3, 3))
    assert "nonsymmetric" in detect(nonzero) and "diagonally_dominant" in detect(nonzero)
    b = torch.ones(3, dtype=DT)
    torch.testing.assert_close(st.solve(nonzero, b), torch.linalg.solve(nonzero.to_dense(), b))


# --- preconditioners: one spelling, and never an offer that ignores what was asked ------------------
def test_preconditioner_names_are_normalized_once():
    from sparsetorch.dispatch.records import preconditioner_name

    assert [preconditioner_name(p) for p in (None, "Jacobi", " ILU ", "identity", "none", "")] == \
        [None, "jacobi", "ilu", "none", "none", "none"]
    assert preconditioner_name(lambda r: r) == "user"
    with pytest.raises(st.InputError, match="preconditioner must be a name"):
        preconditioner_name(3.0)
    A = poisson2d(8, 8)
    b = torch.ones(64, dtype=DT)
    x, info = st.solve(A, b, method="cg", preconditioner="Jacobi", return_info=True)
    assert info.preconditioner == "jacobi" and _relres(A, x, b) <= 1e-10
    x, info = st.solve(A, b, method="cg", preconditioner="identity", backend="torch", return_info=True)
    assert info.preconditioner in (None, "none") and _relres(A, x, b) <= 1e-10


def test_offers_that_ignore_the_asked_preconditioner_are_declined(torch_only):
    class Liar:
        @st.hookimpl
        def sparsetorch_backend_info(self):
            return BackendInfo(name="liar", version="0", description="offers jacobi whatever is asked",
                               devices=("cpu",), dtypes=(DT,), ops={"solve": ("gmres",)})

        @st.hookimpl
        def sparsetorch_offers(self, request):
            return [Offer("liar", "gmres", 1e-12, 0, lambda A, r: DensePlan(A, "liar", "gmres"), "", "jacobi",
                          iterations=1)]

    torch_only.register(Liar(), "liar")
    A = poisson2d(6, 6)
    b = torch.ones(36, dtype=DT)
    table = st.explain("solve", A, b, preconditioner="ilu")
    text = str(table)
    assert "uses preconditioner 'jacobi', not the 'ilu' asked for" in text
    assert "is a direct method; drop preconditioner=" in text
    with pytest.raises(st.NoBackendError):
        st.solve(A, b, preconditioner="ilu")
    assert st.explain("solve", A, b, preconditioner="jacobi").chosen.backend == "liar"


# --- typed option records ------------------------------------------------------------------------------
def test_solve_options_are_one_validated_record():
    from sparsetorch.dispatch.options import DEFAULT_RESTART, CallOptions, SolveOptions

    o = SolveOptions(rtol=1e-8, maxiter=50, preconditioner="Jacobi", backend_options={"x": 1})
    assert o.rtol == 1e-8 and o["maxiter"] == 50 and o.get("restart") is None and o.preconditioner == "jacobi"
    assert o.restart_or_default() == DEFAULT_RESTART and dict(o)["backend_options"] == {"x": 1}
    assert o.replace(repeat=4).repeat == 4 and o.repeat is None
    with pytest.raises(Exception):
        o.rtol = 1.0  # frozen
    for bad, match in (({"rtol": -1.0}, "rtol and atol"), ({"maxiter": 0}, "maxiter"), ({"restart": 2.5}, "restart"),
                       ({"repeat": True}, "repeat"), ({"method": 3}, "method must be a name"),
                       ({"callback": 1}, "callback"), ({"backend_options": [1]}, "backend_options"),
                       ({"rtol": 0.0, "atol": 0.0}, "both 0")):
        with pytest.raises(st.InputError, match=match):
            SolveOptions(**bad)
    c = o.call(rtol=1e-10)
    assert isinstance(c, CallOptions) and c.rtol == 1e-10 and c.maxiter == 50 and c.check_every_or_default() == 8
    with pytest.raises(st.InputError, match="maxiter"):
        st.solve(poisson2d(3, 3), torch.ones(9, dtype=DT), maxiter=-2)


def test_plans_receive_the_call_record():
    seen = []

    class Recording(DensePlan):
        def solve(self, B, *, adjoint=False, options=None):
            seen.append(options)
            return super().solve(B, adjoint=adjoint, options=options)

    from sparsetorch.dispatch.options import CallOptions

    A = poisson2d(4, 4)
    b = torch.ones(16, dtype=DT)

    class Hooks:
        @st.hookimpl
        def sparsetorch_backend_info(self):
            return BackendInfo(name="rec", version="0", description="records options", devices=("cpu",),
                               dtypes=(DT,), ops={"solve": ("lu",)})

        @st.hookimpl
        def sparsetorch_offers(self, request):
            return [Offer("rec", "lu", 1e-12, 0, lambda A, r: Recording(A, "rec", "lu"))]

    backends = reset_backends()
    try:
        backends.register(Hooks(), "rec")
        st.solve(A, b, backend="rec", rtol=1e-9, atol=0.0)
    finally:
        reset_backends()
        clear_decisions()
    assert seen and isinstance(seen[0], CallOptions) and seen[0].rtol == 1e-9 and seen[0].get("maxiter") is None

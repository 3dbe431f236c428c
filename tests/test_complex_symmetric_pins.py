"""Complex symmetric matrices (``A == A^T``, not Hermitian) and the methods that assume ``A^H = A``.

For complex values ``properties="symmetric"`` says ``A == A^T``; Cholesky and LDL^H (Eigen's
SimplicialLLT / SimplicialLDLT read one triangle and take the other as its conjugate transpose)
factor another matrix on such an A and answered a wrong determinant, gradient and solution without
an error (slogdet with a pinned eigen/cholesky: sign 1 instead of 0.94+0.35j, log|det| 9.79
instead of 10.60; a pinned solve was caught by its residual check but called the matrix "singular
to working precision"). Now: "symmetric" on complex values does not make A Hermitian in dispatch
(no Cholesky / LDL^H / CG / MINRES offers on it), a pinned Cholesky / LDL^T checks the values and
raises NotSymmetricError naming method='lu', and an ``spd`` / ``hermitian`` tag the values
contradict raises the same error instead of factoring them.
"""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.dispatch.kit import hermitian, spd_ok
from sparsetorch.errors import NoBackendError, NotSymmetricError
from sparsetorch.ops.logdet import logdet_request

pytest.importorskip("sparsetorch_eigen")


def _complex_symmetric(n: int, seed: int = 1, density: float = 0.4):
    """A complex symmetric (not Hermitian), diagonally weighted matrix: dense copy, pattern, values."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, n, generator=g) < density
    mask = mask | mask.T | torch.eye(n, dtype=torch.bool)
    R = torch.randn(n, n, dtype=torch.complex128, generator=g)
    D = torch.where(mask, R + R.T, 0) + 6 * torch.eye(n, dtype=torch.complex128)
    assert torch.equal(D, D.T) and not torch.equal(D, D.mH)
    r, c = mask.nonzero().T
    return D, r, c, D[r, c]


def _hermitian_pd(n: int, seed: int = 2, density: float = 0.4):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, n, generator=g) < density
    mask = mask | mask.T | torch.eye(n, dtype=torch.bool)
    R = torch.randn(n, n, dtype=torch.complex128, generator=g)
    H = torch.where(mask, R + R.mH, 0)
    H = H + (H.abs().sum(-1).max() + 1) * torch.eye(n, dtype=torch.complex128)  # diagonally dominant: HPD
    r, c = mask.nonzero().T
    return H, r, c, H[r, c]


def _dense_reference(D, r, c, v):
    """torch.linalg.slogdet of the matrix with values ``v`` on the pattern, and the gradient of its log|det|."""
    vd = v.clone().requires_grad_()
    M = torch.zeros(D.shape, dtype=D.dtype).index_put((r, c), vd, accumulate=True)
    sign, logabs = torch.linalg.slogdet(M)
    (grad,) = torch.autograd.grad(logabs, vd)
    return sign.detach(), logabs.detach(), grad


# --- dispatch: "symmetric" on complex values is not Hermitian -----------------------------------------------------
def test_the_hermitian_helper_does_not_read_symmetric_as_hermitian_for_complex_values():
    D, r, c, v = _complex_symmetric(6)
    A = st.SparseTensor.from_coo(v, r, c, shape=(6, 6))
    Ar = st.SparseTensor.from_coo(v.real.contiguous(), r, c, shape=(6, 6))
    assert not hermitian(logdet_request(A, properties="symmetric"))
    assert not spd_ok(logdet_request(A, method="cholesky", properties="symmetric"), "cholesky")
    assert hermitian(logdet_request(A, properties="hermitian"))
    assert hermitian(logdet_request(A, properties="spd")) and spd_ok(logdet_request(A, properties="spd"), "cholesky")
    assert hermitian(logdet_request(Ar, properties="symmetric"))  # real: symmetric is Hermitian
    assert spd_ok(logdet_request(Ar, method="cholesky", properties="symmetric"), "cholesky")


@pytest.mark.parametrize("op", ["logdet", "solve"])
def test_no_method_that_assumes_a_hermitian_matrix_is_offered_for_a_complex_symmetric_tag(op):
    D, r, c, v = _complex_symmetric(40, density=0.1)
    A = st.SparseTensor.from_coo(v, r, c, shape=(40, 40))
    operands = (A,) if op == "logdet" else (A, torch.ones(40, dtype=A.dtype))
    table = st.explain(op, *operands, properties="symmetric")
    offered = {(row.offer.backend, row.offer.method) for row in table.offers if row.offer is not None}
    for bad in [("eigen", "cholesky"), ("eigen", "ldlt"), ("eigen", "cg"), ("scipy", "minres"), ("scipy", "cg")]:
        assert bad not in offered, f"{bad} offered for a complex symmetric A: {sorted(offered)}"
    reasons = {(d.backend, d.method): d.reason for d in table.declines}
    assert "complex symmetric" in reasons[("eigen", "cholesky")] and "method='lu'" in reasons[("eigen", "cholesky")]


# --- slogdet --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [6, 300])
@pytest.mark.parametrize("props", [None, "symmetric"])
def test_default_slogdet_of_a_complex_symmetric_matrix_matches_torch_in_value_and_gradient(n, props):
    D, r, c, v = _complex_symmetric(n, density=0.4 if n < 50 else 0.02)
    sign0, logabs0, grad0 = _dense_reference(D, r, c, v)
    vv = v.clone().requires_grad_()
    sign, logabs, info = st.slogdet(st.SparseTensor.from_coo(vv, r, c, shape=(n, n)), properties=props, return_info=True)
    torch.testing.assert_close(sign.detach(), sign0, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(logabs.detach(), logabs0, rtol=1e-10, atol=1e-10)
    (grad,) = torch.autograd.grad(logabs, vv)
    torch.testing.assert_close(grad, grad0, rtol=1e-8, atol=1e-10)
    tried = {a["method"] for a in info.extra["attempts"]}
    assert not tried & {"cholesky", "ldlt"}, info.extra["attempts"]


def test_gradcheck_of_slogdet_on_a_complex_symmetric_matrix_tagged_symmetric():
    D, r, c, v = _complex_symmetric(6)
    A = st.SparseTensor.from_coo(v, r, c, shape=(6, 6))
    for backend in (None, "eigen"):
        assert torch.autograd.gradcheck(
            lambda x, b=backend: st.slogdet(A.with_values(x), backend=b, properties="symmetric")[1], (v.clone().requires_grad_(),))


@pytest.mark.parametrize("method", ["cholesky", "ldlt"])
@pytest.mark.parametrize("props", ["symmetric", "spd", "hermitian"])
def test_a_pinned_hermitian_method_on_a_complex_symmetric_matrix_raises_not_symmetric(method, props):
    D, r, c, v = _complex_symmetric(6)
    A = st.SparseTensor.from_coo(v.clone().requires_grad_(), r, c, shape=(6, 6))
    with pytest.raises(NotSymmetricError) as err:
        st.slogdet(A, backend="eigen", method=method, properties=props)
    msg = str(err.value)
    assert "complex symmetric" in msg and "not Hermitian" in msg and "method='lu'" in msg, msg
    if props != "symmetric":
        assert f"properties={props!r}" in msg and "values say otherwise" in msg, msg


@pytest.mark.parametrize("props", ["spd", "hermitian"])
def test_a_hermitian_tag_the_values_contradict_raises_without_a_pin(props):
    """Unpinned: the tag brings Cholesky / LDL^H offers; the values refute it, and slogdet raises
    instead of handing over to the next method in silence (the tag is the caller's to fix)."""
    D, r, c, v = _complex_symmetric(300, density=0.02)
    A = st.SparseTensor.from_coo(v, r, c, shape=(300, 300))
    with pytest.raises(NotSymmetricError, match="values say otherwise"):
        st.slogdet(A, backend="eigen", properties=props)


def test_a_pinned_cholesky_on_a_hermitian_matrix_tagged_symmetric_is_still_taken():
    """A Hermitian A tagged "symmetric" (the spelling many callers use): the pinned Cholesky checks
    the values, finds them Hermitian and factors them; value and gradient as torch's."""
    H, r, c, v = _hermitian_pd(8)
    sign0, logabs0, grad0 = _dense_reference(H, r, c, v)
    vv = v.clone().requires_grad_()
    sign, logabs, info = st.slogdet(st.SparseTensor.from_coo(vv, r, c, shape=(8, 8)), backend="eigen",
                                    method="cholesky", properties="symmetric", return_info=True)
    assert info.method == "cholesky"
    torch.testing.assert_close(sign.detach(), sign0, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(logabs.detach(), logabs0, rtol=1e-10, atol=1e-10)
    (grad,) = torch.autograd.grad(logabs, vv)
    torch.testing.assert_close(grad, grad0, rtol=1e-8, atol=1e-10)


def test_rounding_level_asymmetry_of_a_hermitian_matrix_is_not_refused():
    H, r, c, v = _hermitian_pd(8)
    noisy = v * (1 + 1e-14 * torch.randn(v.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3)))
    s, la = st.slogdet(st.SparseTensor.from_coo(noisy, r, c, shape=(8, 8)), backend="eigen", method="cholesky",
                       properties="spd")
    torch.testing.assert_close(la, torch.linalg.slogdet(H)[1], rtol=1e-10, atol=0)


def test_the_refused_member_of_a_value_batch_is_named():
    H, r, c, v = _hermitian_pd(8)
    V = torch.stack([v, v.real.to(v.dtype) + 1j * (v.imag + 0.5 * (r == c))])  # member 1: a complex diagonal
    with pytest.raises(NotSymmetricError, match="value-batch member 1"):
        st.slogdet(st.SparseTensor.from_coo(V, r, c, shape=(8, 8)), backend="eigen", method="cholesky", properties="spd")


def test_a_pinned_cholesky_without_tags_declines_naming_the_cause():
    D, r, c, v = _complex_symmetric(6)
    with pytest.raises(NoBackendError, match="complex symmetric matrix"):
        st.slogdet(st.SparseTensor.from_coo(v, r, c, shape=(6, 6)), backend="eigen", method="cholesky")


def test_a_real_indefinite_matrix_with_a_pinned_cholesky_still_raises_indefinite():
    Dr = torch.tensor([[1.0, 2, 0], [2, 1, 0], [0, 0, 3]], dtype=torch.float64)
    rr, cr = Dr.nonzero().T
    with pytest.raises(st.IndefiniteMatrixError):
        st.slogdet(st.SparseTensor.from_coo(Dr[rr, cr], rr, cr, shape=(3, 3)), backend="eigen", method="cholesky",
                   properties="symmetric")


# --- solve ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["cholesky", "ldlt"])
@pytest.mark.parametrize("props", ["symmetric", "spd"])
def test_a_pinned_solve_names_the_missing_hermitian_property_not_singularity(method, props):
    D, r, c, v = _complex_symmetric(6)
    b = torch.randn(6, dtype=torch.complex128, generator=torch.Generator().manual_seed(4))
    with pytest.raises(NotSymmetricError) as err:
        st.solve(st.SparseTensor.from_coo(v, r, c, shape=(6, 6)), b, backend="eigen", method=method, properties=props)
    msg = str(err.value)
    assert "singular" not in msg and "complex symmetric" in msg and "method='lu'" in msg, msg


@pytest.mark.parametrize("n", [6, 300])
def test_default_solve_of_a_complex_symmetric_matrix_tagged_symmetric_is_right(n):
    D, r, c, v = _complex_symmetric(n, density=0.4 if n < 50 else 0.02)
    b = torch.randn(n, dtype=torch.complex128, generator=torch.Generator().manual_seed(5))
    vv = v.clone().requires_grad_()
    x = st.solve(st.SparseTensor.from_coo(vv, r, c, shape=(n, n)), b, properties="symmetric")
    x0 = torch.linalg.solve(D, b)
    torch.testing.assert_close(x.detach(), x0, rtol=1e-9, atol=1e-12)
    # gradient of a real loss in A's values, against dense autograd
    w = torch.randn(n, dtype=torch.complex128, generator=torch.Generator().manual_seed(6))
    (g,) = torch.autograd.grad((w.conj() * x).real.sum(), vv)
    vd = v.clone().requires_grad_()
    xd = torch.linalg.solve(torch.zeros(n, n, dtype=D.dtype).index_put((r, c), vd, accumulate=True), b)
    (gd,) = torch.autograd.grad((w.conj() * xd).real.sum(), vd)
    torch.testing.assert_close(g, gd, rtol=1e-8, atol=1e-10)

"""slogdet / logdet / det: values against NumPy float64, gradients against finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsetorch as st
from sparsetorch.errors import InputError
from sparsetorch.ops.logdet import _by_solves, det, logdet, slogdet
from sparsetorch.testing.problems import poisson2d


def _random(n, seed, density=0.15, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < density)
    D = D + torch.diag(torch.randn(n, generator=g, dtype=torch.float64) * 3)
    if dtype.is_complex:
        D = D.to(dtype) + 1j * torch.randn(n, n, generator=g, dtype=torch.float64) * (D != 0)
    return D


def test_sign_and_value_match_numpy_on_random_nonsymmetric_matrices():
    wrong = []
    for seed in range(60):
        D = _random(25, seed)
        s, l = slogdet(st.SparseTensor.from_dense(D))
        s0, l0 = np.linalg.slogdet(D.numpy())
        if float(s) != s0 or abs(float(l) - l0) > 1e-9 * max(1.0, abs(l0)):
            wrong.append(seed)
    assert not wrong, f"wrong sign or value for seeds {wrong}"


def test_logdet_of_an_ill_scaled_poisson_matrix_is_finite():
    # 64x64 grid, scaled by 1/h^2: det overflows float64 (about 10^17000), logdet does not.
    m = 64
    A = poisson2d(m)
    h2 = (1.0 / (m + 1)) ** 2
    A = A.with_values(A.values / h2)
    ld = logdet(A)
    j = torch.arange(1, m + 1, dtype=torch.float64)
    lam1 = (2 - 2 * torch.cos(j * torch.pi / (m + 1))) / h2
    ref = torch.log(lam1[:, None] + lam1[None, :]).sum()  # closed-form eigenvalues
    assert torch.isfinite(ld)
    torch.testing.assert_close(ld, ref, rtol=1e-10, atol=0)
    assert torch.isinf(det(A))  # the determinant itself does overflow: that is why slogdet exists


def test_logdet_negative_determinant_is_nan_and_singular_is_minus_inf():
    D = torch.diag(torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64))
    assert torch.isnan(logdet(st.SparseTensor.from_dense(D)))
    Z = torch.tensor([[1.0, 2.0], [2.0, 4.0]], dtype=torch.float64)
    s, l = slogdet(st.SparseTensor.from_dense(Z))
    assert float(s) == 0.0 and l == float("-inf")


def test_value_batch():
    D1, D2 = _random(12, 1), _random(12, 2)
    mask = (D1 != 0) | (D2 != 0)
    A = st.SparseTensor.from_dense(torch.stack([D1, D2]), mask=mask)
    s, l = slogdet(A)
    s0, l0 = np.linalg.slogdet(np.stack([D1.numpy(), D2.numpy()]))
    np.testing.assert_array_equal(s.numpy(), s0)
    np.testing.assert_allclose(l.numpy(), l0, rtol=1e-12)


def test_gradients_real():
    A = st.SparseTensor.from_dense(_random(14, 3))
    v = A.values.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v: slogdet(A.with_values(v))[1], (v,))
    assert torch.autograd.gradcheck(lambda v: det(A.with_values(v)), (v,))
    # against dense autograd
    v1 = A.values.clone().requires_grad_()
    (g,) = torch.autograd.grad(slogdet(A.with_values(v1))[1], v1)
    Dv = A.to_dense().clone().requires_grad_()
    (gd,) = torch.autograd.grad(torch.linalg.slogdet(Dv)[1], Dv)
    coords, slot = A.entries()
    torch.testing.assert_close(g[slot], gd[coords[0], coords[1]], rtol=1e-10, atol=1e-12)


def test_gradients_complex_and_batched():
    A = st.SparseTensor.from_dense(_random(10, 4, dtype=torch.complex128))
    v = A.values.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v: slogdet(A.with_values(v))[1], (v,))
    assert torch.autograd.gradcheck(lambda v: torch.view_as_real(det(A.with_values(v))), (v,))
    B = st.SparseTensor.from_dense(torch.stack([_random(8, 5), _random(8, 6)]), mask=None)
    vb = B.values.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v: slogdet(B.with_values(v))[1], (vb,))


def test_exact_entries_by_solves_match_the_inverse():
    A = st.SparseTensor.from_dense(_random(300, 7, density=0.02))
    from sparsetorch.backends.torch_native.spectral import DenseEigPlan

    plan = DenseEigPlan(A)
    plan.set_values(A.values)
    coords, _ = A.entries()
    got = _by_solves(plan, coords[0], coords[1], 300, (), A)
    inv = torch.linalg.inv(A.to_dense())
    torch.testing.assert_close(got, inv[coords[1], coords[0]], rtol=1e-10, atol=1e-12)


def test_hutchinson_is_unbiased_within_its_stated_error():
    A = poisson2d(12)  # SPD, inverse decays away from the diagonal
    coords, slot = A.entries()
    vals = A.values.clone()
    vals[slot[coords[0] == coords[1]]] += 0.5
    A = A.with_values(vals)
    v = A.values.clone().requires_grad_()
    s, l, info = slogdet(A.with_values(v), grad_method="hutchinson", probes=400, seed=3, return_info=True)
    (g,) = torch.autograd.grad(l, v)
    v2 = A.values.clone().requires_grad_()
    (g_exact,) = torch.autograd.grad(slogdet(A.with_values(v2))[1], v2)
    err = info.extra["grad_stderr"]
    coords, slot = A.entries()
    z = ((g[slot] - g_exact[slot]) / err).abs()
    assert float((z < 4).float().mean()) > 0.99  # normal errors: |z| < 4 almost always
    assert float(z.mean()) < 1.2  # and not systematically off (E|z| = 0.8 for a normal)


def test_exact_gradient_by_solves_and_its_size_limit(monkeypatch):
    from sparsetorch.backends.torch_native.spectral import DenseEigPlan

    monkeypatch.delattr(DenseEigPlan, "inverse_entries")  # a plan without selected inversion
    st.plan_cache().clear()
    A = st.SparseTensor.from_dense(_random(20, 8))
    v = A.values.clone().requires_grad_()
    (g,) = torch.autograd.grad(slogdet(A.with_values(v), cache=False)[1], v)
    inv = torch.linalg.inv(A.to_dense())
    coords, slot = A.entries()
    torch.testing.assert_close(g[slot], inv[coords[1], coords[0]], rtol=1e-10, atol=1e-12)
    l = slogdet(A.with_values(v), exact_max=10, cache=False)[1]
    with pytest.raises(InputError, match="grad_method='hutchinson'"):
        l.backward()


def test_bad_input():
    with pytest.raises(InputError, match="square"):
        slogdet(st.SparseTensor.from_dense(torch.ones(3, 4, dtype=torch.float64)))
    A = poisson2d(3)
    with pytest.raises(InputError, match="grad_method"):
        slogdet(A, grad_method="magic")
    with pytest.raises(InputError, match="probes"):
        slogdet(A, probes=0)
    with pytest.raises(InputError, match="NaN"):
        slogdet(A.with_values(A.values * float("nan")))


from sparsetorch.testing import LogdetConformance  # noqa: E402


class TestTorchLogdet(LogdetConformance):
    backend = "torch"
    logdet_methods = ("dense",)
    devices = ("cpu", "cuda")  # CUDA cases skip without a GPU


# --- properties and fallback (issue 14) -----------------------------------------------------------

def _indefinite_tridiagonal(n):
    """Symmetric, positive diagonal, indefinite (eigenvalues 1 + 1.8 cos(j pi / (n + 1)))."""
    d = torch.ones(n, dtype=torch.float64)
    e = 0.9 * torch.ones(n - 1, dtype=torch.float64)
    return torch.diag(d) + torch.diag(e, 1) + torch.diag(e, -1)


def test_slogdet_detects_spd_and_uses_a_cholesky_method_where_offered():
    A = poisson2d(20)
    sign, logabs, info = slogdet(A, return_info=True)
    s0, l0 = np.linalg.slogdet(A.to_dense().numpy())
    assert float(sign) == s0 and abs(float(logabs) - l0) <= 1e-10 * abs(l0)
    assert "spd" in info.extra["properties"]
    table = st.explain("logdet", A)
    assert "spd" in table.request.properties
    if any(r.method == "cholesky" for r in table.offers):  # the Eigen plugin is installed
        assert info.method == "cholesky"


def test_slogdet_falls_back_when_a_chosen_cholesky_fails():
    # tagged SPD, it is not: a Cholesky offer (if any is chosen) meets a negative pivot and hands over
    D = _indefinite_tridiagonal(400)
    A = st.SparseTensor.from_dense(D)
    sign, logabs, info = slogdet(A, properties="spd", return_info=True)
    s0, l0 = np.linalg.slogdet(D.numpy())
    assert float(sign) == s0 and abs(float(logabs) - l0) <= 1e-9 * max(1.0, abs(l0))
    attempts = info.extra["attempts"]
    assert attempts[-1]["accepted"] and info.method == attempts[-1]["method"]
    if attempts[0]["method"] == "cholesky":
        assert not attempts[0]["accepted"] and len(attempts) >= 2
        with pytest.raises(st.SparseTorchError):
            slogdet(A, properties="spd", method="cholesky", backend=attempts[0]["backend"])


def _lap2d(m: int):
    import scipy.sparse as sp

    T = sp.diags([-np.ones(m - 1), 2 * np.ones(m), -np.ones(m - 1)], [-1, 0, 1])
    return (sp.kron(T, sp.identity(m)) + sp.kron(sp.identity(m), T)).tocsr()


@pytest.mark.parametrize("m,shift", [(12, 2.0), (15, 2.0), (30, 2.0), (20, 6.1)])
def test_slogdet_of_a_symmetric_indefinite_matrix_is_not_taken_from_unstable_pivots(m, shift):
    # lap2d - shift I (Helmholtz-like, cond ~ 1e2-1e3): Eigen's LDL^T without pivoting met small pivots and
    # answered with the wrong sign and log|det| (n = 144: (-1, 66.34) for (+1, 70.04)), or (0, -inf) at
    # n = 900 (session 20's sweep). Its factors now face a solve's backward error first; an LU decides
    import scipy.sparse as sp

    M = (_lap2d(m) - shift * sp.identity(m * m)).tocsr()
    ref = np.linalg.slogdet(M.toarray())
    s, la, info = st.slogdet(st.from_package(M), return_info=True)
    assert float(s) == ref[0]
    assert abs(float(la) - ref[1]) <= 1e-10 * abs(ref[1])


def test_slogdet_of_a_nonsingular_matrix_with_a_tiny_diagonal_is_not_singular():
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    n = 300
    R = sp.random(n, n, density=0.02, random_state=42, data_rvs=rng.standard_normal)
    M = (R + R.T + sp.diags(1e-12 * rng.standard_normal(n))).tocsr()
    M.sum_duplicates()
    ref = np.linalg.slogdet(M.toarray())
    assert ref[0] != 0
    s, la = st.slogdet(st.from_package(M))
    assert float(s) == ref[0] and abs(float(la) - ref[1]) <= 1e-9 * abs(ref[1])


def test_a_pinned_ldlt_that_meets_a_zero_pivot_raises_instead_of_calling_the_matrix_singular():
    """Pinned, LDL^T's factors were not checked: a zero pivot of a nonsingular indefinite matrix (det 125) was
    returned as (0, -inf) (session 26's sweep). Now it raises and names the pivoted method; unpinned, LU answers;
    a pinned LDL^T whose factors are sound still answers."""
    import scipy.sparse as sp

    pytest.importorskip("sparsetorch_eigen")
    B = np.array([[2.0, -1.0, 1.0, 1.0], [-1.0, -2.0, -3.0, -3.0], [1.0, -3.0, -2.0, 3.0], [1.0, -3.0, 3.0, 2.0]])
    A = st.from_package(sp.csr_array(B))
    ref = np.linalg.slogdet(B)
    s, la = st.slogdet(A)
    assert float(s) == ref[0] and abs(float(la) - ref[1]) <= 1e-12 * abs(ref[1])
    with pytest.raises(st.BackendError, match="pin method='lu'"):
        st.slogdet(A, method="ldlt")
    C = np.diag([2.0, -3.0, 4.0]) + 0.1
    s, la = st.slogdet(st.from_package(sp.csr_array(C)), method="ldlt")
    ref = np.linalg.slogdet(C)
    assert float(s) == ref[0] and abs(float(la) - ref[1]) <= 1e-12 * abs(ref[1])


# torch.func -----------------------------------------------------------------------------------------
def _random_nonsymmetric(n: int, seed: int) -> st.SparseTensor:
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < 0.3)
    D += 4 * torch.eye(n, dtype=torch.float64)
    return st.SparseTensor.from_dense(D)


def test_torch_func_grad_jacrev_and_vmap_over_values():
    """torch.func over slogdet: the call's handle was a dict torch.func flattened (meeting the SparseTensor
    in it), the backward loaded the transform's wrappers into the plan, and vmap's detection branched on a
    batched tensor. Against torch's dense slogdet and its autograd (float64)."""
    from torch.func import grad, jacrev, vmap

    A = _random_nonsymmetric(12, 4)
    coords, slot = A.entries()
    v = A.values.detach().clone()

    def dense_grad(vals):
        D = A.with_values(vals).to_dense().detach().requires_grad_(True)
        torch.linalg.slogdet(D)[1].backward()
        return D.grad[coords[0], coords[1]]

    g = grad(lambda v_: slogdet(A.with_values(v_))[1])(v)
    torch.testing.assert_close(g[slot], dense_grad(v), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(jacrev(lambda v_: logdet(poisson2d(4).with_values(v_)))(poisson2d(4).values),
                               grad(lambda v_: logdet(poisson2d(4).with_values(v_)))(poisson2d(4).values))
    V = torch.stack([v, v * torch.linspace(0.5, 1.5, v.shape[0], dtype=torch.float64)])
    sign, logabs = vmap(lambda v_: slogdet(A.with_values(v_)))(V)
    ref = [torch.linalg.slogdet(A.with_values(V[i]).to_dense()) for i in range(2)]
    torch.testing.assert_close(sign, torch.stack([r[0] for r in ref]))
    torch.testing.assert_close(logabs, torch.stack([r[1] for r in ref]), rtol=1e-12, atol=1e-12)
    G = vmap(grad(lambda v_: slogdet(A.with_values(v_))[1]))(V)
    for i in range(2):
        torch.testing.assert_close(G[i][slot], dense_grad(V[i]), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_forward_mode_jvp_and_jacfwd(dtype):
    """torch.func.jvp / jacfwd of slogdet: d log det = tr(A^-1 dA), against central differences and jacrev."""
    from torch.func import jacfwd, jacrev, jvp

    g = torch.Generator().manual_seed(2)
    D = torch.randn(10, 10, generator=g, dtype=torch.float64) * (torch.rand(10, 10, generator=g) < 0.4)
    D = (D + 5 * torch.eye(10, dtype=torch.float64)).to(dtype)
    if dtype.is_complex:
        D = D + 1j * torch.randn(10, 10, generator=g, dtype=torch.float64) * (D != 0)
    A = st.SparseTensor.from_dense(D)
    v = A.values.detach().clone()
    dv = torch.randn(v.shape, generator=g, dtype=torch.float64).to(dtype)

    def f(v_):
        return slogdet(A.with_values(v_))

    (_, _), (ts, tl) = jvp(f, (v,), (dv,))
    eps = 1e-6
    (s1, l1), (s2, l2) = f(v + eps * dv), f(v - eps * dv)
    torch.testing.assert_close(tl, (l1 - l2) / (2 * eps), rtol=1e-6, atol=1e-8)
    if dtype.is_complex:
        torch.testing.assert_close(ts, (s1 - s2) / (2 * eps), rtol=1e-6, atol=1e-8)
    if not dtype.is_complex:
        torch.testing.assert_close(jacfwd(lambda v_: f(v_)[1])(v), jacrev(lambda v_: f(v_)[1])(v))


def test_gradient_at_a_singular_matrix_is_a_named_error_and_hessians_say_first_order():
    """det's gradient at a singular matrix raised torch's LinAlgError from the dense inverse; torch.func.hessian
    of logdet raised torch's generic jvp message (an outside sweep the same session)."""
    from torch.func import hessian

    A = st.SparseTensor.from_dense(torch.tensor([[1.0, 2.0], [2.0, 4.0]], dtype=torch.float64))
    v = A.values.clone().requires_grad_(True)
    assert float(det(A.with_values(v))) == 0.0
    with pytest.raises(st.SingularMatrixError, match="singular matrix"):
        det(A.with_values(v)).backward()
    P = poisson2d(3)
    with pytest.raises(NotImplementedError, match="second derivatives"):
        hessian(lambda v_: logdet(P.with_values(v_)))(P.values.clone())
    with pytest.raises(InputError, match="det needs a square"):
        det(st.SparseTensor.from_dense(torch.ones(2, 3, dtype=torch.float64)))

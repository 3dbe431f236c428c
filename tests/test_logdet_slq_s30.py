"""The stochastic log-determinant (``logdet(method="slq")``, alias ``"hutchinson"``): stochastic Lanczos
quadrature against ``torch.linalg.slogdet`` of the dense matrix, its gradient against ``A^-1`` sampled at
the pattern, its errors, float32 and value batches.

Thresholds come from the theory: with Rademacher probes one probe's estimate ``z^T log(A) z`` has variance
``2 sum_{i != j} log(A)_ij^2`` (computed here from the dense ``log(A)``), so the mean of ``p`` probes has
standard deviation ``sd = sqrt(that / p)`` and the estimate must land within ``4 sd`` (the 40-step
quadrature error is below 1e-8 relative on these matrices: measured, 5 steps give 3e-3 .. 6e-3). With
200 probes ``4 sd`` is 1.1 % of ``|log det|`` for both matrices (measured errors over 6 seeds: at most
0.17 % on the Laplacian, 0.7 % on the random matrix).
"""

from __future__ import annotations

import math

import pytest
import torch

import sparsetorch as st
from sparsetorch.errors import IndefiniteMatrixError, InputError, NotSymmetricError
from sparsetorch.testing.problems import poisson2d

pytestmark = pytest.mark.usefixtures("single_thread")


def _laplacian(shift: float = 0.1, dtype=torch.float64) -> torch.Tensor:
    """2-D Laplacian on a 20x20 grid (n = 400), shifted: condition number ~56."""
    return (poisson2d(20).to_dense() + shift * torch.eye(400, dtype=torch.float64)).to(dtype)


def _random_spd(n: int = 500, seed: int = 0) -> torch.Tensor:
    """``M^T M + I`` with ~4 entries per column of M: ~7800 stored entries, condition number ~27, not
    diagonally dominant (detected symmetric, not SPD)."""
    g = torch.Generator().manual_seed(seed)
    M = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < 4 / n)
    return M.T @ M + torch.eye(n, dtype=torch.float64)


def _theory(D: torch.Tensor):
    """``(log det D, one Rademacher probe's standard deviation)`` from the dense ``log(D)``."""
    w, U = torch.linalg.eigh(D.to(torch.float64))
    L = (U * w.log()) @ U.T
    var = 2 * (L.pow(2).sum() - L.diagonal().pow(2).sum())
    return float(w.log().sum()), float(var.sqrt())


def _grad_ref(A: st.SparseTensor, D: torch.Tensor) -> torch.Tensor:
    """``d log det / d values``: ``(A^-1)[col, row]`` at each stored entry, summed into its slot."""
    coords, slot = A.entries()
    inv = torch.linalg.inv(D.to(torch.float64))
    return torch.zeros(A.values.shape[-1], dtype=torch.float64).index_add(0, slot, inv[coords[1], coords[0]])


@pytest.mark.parametrize("make", [_laplacian, _random_spd], ids=["laplacian20x20", "random500"])
def test_accuracy_with_200_probes_and_40_steps_is_within_the_theoretical_bound(make):
    D = make()
    A = st.SparseTensor.from_dense(D)
    ref, sd1 = _theory(D)
    p = 200
    bound = 4 * sd1 / math.sqrt(p)
    assert bound < 0.015 * abs(ref)  # the check is a 1-2 % check
    for seed in range(3):
        est, info = st.logdet(A, method="slq", num_probes=p, lanczos_steps=40, seed=seed, return_info=True)
        assert est.dtype == torch.float64 and est.shape == ()
        assert abs(float(est) - ref) < bound, (seed, float(est), ref, bound)
        # the reported standard error estimates the theoretical one
        assert 0.7 < float(info.extra["stderr"]) / (sd1 / math.sqrt(p)) < 1.4
        assert info.method == "slq" and info.extra["num_probes"] == p and info.extra["lanczos_steps"] == 40


def test_one_probe_and_two_steps_is_not_accurate():
    # the test above can fail: too few probes (the Monte-Carlo error) or steps (the quadrature's bias) are seen
    D = _random_spd()
    A = st.SparseTensor.from_dense(D)
    ref, sd1 = _theory(D)
    errs = [abs(float(st.logdet(A, method="slq", num_probes=1, lanczos_steps=2, seed=s)) - ref) / abs(ref)
            for s in range(4)]
    assert min(errs) > 0.05, errs  # measured 7-19 %
    # 2 steps with many probes: biased by far more than the probes' noise
    est = float(st.logdet(A, method="slq", num_probes=200, lanczos_steps=2, seed=0))
    assert abs(est - ref) > 10 * sd1 / math.sqrt(200)


def test_deterministic_given_a_seed_and_the_alias():
    A = st.SparseTensor.from_dense(_laplacian())
    a = st.logdet(A, method="slq", num_probes=8, lanczos_steps=10, seed=7)
    b = A.logdet(method="hutchinson", num_probes=8, lanczos_steps=10, seed=7)  # torch-sla's name, A's method
    c = st.logdet(A, method="slq", num_probes=8, lanczos_steps=10, seed=8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    g1 = st.logdet(A, method="slq", num_probes=8, lanczos_steps=10, seed=3, distribution="gaussian")
    g2 = st.logdet(A, method="slq", num_probes=8, lanczos_steps=10, seed=3, distribution="gaussian")
    assert torch.equal(g1, g2) and not torch.equal(g1, st.logdet(A, method="slq", num_probes=8, lanczos_steps=10,
                                                                    seed=3))
    sign, la = st.slogdet(A, method="slq", num_probes=8, lanczos_steps=10, seed=7)
    assert float(sign) == 1.0 and torch.equal(la, a)


def test_the_default_stays_exact():
    D = _laplacian()
    A = st.SparseTensor.from_dense(D)
    ld, info = st.logdet(A, return_info=True)
    assert info.method != "slq"
    torch.testing.assert_close(ld, torch.linalg.slogdet(D)[1], rtol=1e-12, atol=0)
    with pytest.raises(InputError, match="method='slq'"):
        st.logdet(A, num_probes=10)


def test_gradient_against_the_dense_inverse_within_its_standard_errors():
    D = _laplacian()
    A = st.SparseTensor.from_dense(D)
    v = A.values.clone().requires_grad_(True)
    est, info = st.logdet(A.with_values(v), method="slq", num_probes=200, lanczos_steps=30, seed=1,
                          return_info=True)
    est.backward()
    ref = _grad_ref(A, D)
    _, slot = A.entries()
    err = (v.grad - ref)[slot]
    z = err / info.extra["grad_stderr"]
    assert float((z.abs() < 4).float().mean()) >= 0.99  # measured: 99 % below 2.4, max 3.9
    assert float(err.norm() / ref[slot].norm()) < 0.3  # measured 0.16; 1 / sqrt(200) ~ 0.07 per unit variance
    assert info.extra["cg_iterations"] > 0
    # the CG bias is far below the noise: more probes bring the gradient closer
    v2 = A.values.clone().requires_grad_(True)
    st.logdet(A.with_values(v2), method="slq", num_probes=8, lanczos_steps=30, seed=1).backward()
    assert float((v2.grad - ref).norm()) > 2 * float((v.grad - ref).norm())


def test_identity_probes_make_value_and_gradient_exact():
    # Z Z^T = p I with Z = sqrt(n) I (p = n probes) and n Lanczos steps: no Monte-Carlo and no quadrature
    # error; the gradient formula is then A^-1 at the pattern up to the CG tolerance
    n = 30
    g = torch.Generator().manual_seed(0)
    M = torch.randn(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < 0.15)
    D = M.T @ M + torch.eye(n, dtype=torch.float64)
    A = st.SparseTensor.from_dense(D)
    v = A.values.clone().requires_grad_(True)
    est = st.logdet(A.with_values(v), method="slq", probes=math.sqrt(n) * torch.eye(n, dtype=torch.float64),
                    lanczos_steps=n, cg_rtol=1e-13)
    torch.testing.assert_close(est.detach(), torch.linalg.slogdet(D)[1], rtol=1e-12, atol=1e-12)
    est.backward()
    torch.testing.assert_close(v.grad, _grad_ref(A, D), rtol=1e-9, atol=1e-10)
    # and the per-probe estimates are the diagonal of n log(A)
    _, info = st.logdet(A, method="slq", probes=math.sqrt(n) * torch.eye(n, dtype=torch.float64), lanczos_steps=n,
                        return_info=True)
    w, U = torch.linalg.eigh(D)
    torch.testing.assert_close(info.extra["per_probe"], n * ((U * w.log()) @ U.T).diagonal(), rtol=1e-10,
                               atol=1e-10)


def test_lanczos_breakdown_is_an_exact_quadrature():
    # a diagonal matrix with 3 distinct values: every Krylov space is invariant after 3 steps (the Lanczos
    # runs break down and stop there), and a Rademacher probe's z^T log(A) z is sum log d_i exactly
    d = torch.tensor([0.5, 2.0, 7.0], dtype=torch.float64).repeat(20)
    A = st.SparseTensor.from_dense(torch.diag(d))
    est, info = st.logdet(A, method="slq", num_probes=5, lanczos_steps=30, seed=0, return_info=True)
    torch.testing.assert_close(info.extra["per_probe"], d.log().sum().expand(5), rtol=1e-13, atol=1e-12)
    assert float(info.extra["stderr"]) < 1e-12


def test_not_symmetric_and_indefinite_raise():
    D = _laplacian()
    N = D.clone()
    N[0, 1] += 0.5
    with pytest.raises(NotSymmetricError, match="exact slogdet"):
        st.logdet(st.SparseTensor.from_dense(N), method="slq", num_probes=4, seed=0)
    with pytest.raises(IndefiniteMatrixError, match="not positive definite"):
        st.logdet(st.SparseTensor.from_dense(D - 2 * torch.eye(400, dtype=torch.float64)), method="slq",
                  num_probes=4, seed=0)
    with pytest.raises(IndefiniteMatrixError):
        st.logdet(st.SparseTensor.from_dense(-D), method="slq", num_probes=2, seed=0)
    A = st.SparseTensor.from_dense(D)
    with pytest.raises(InputError, match="num_probes"):
        st.logdet(A, method="slq", probes=5)
    with pytest.raises(InputError, match="distribution"):
        st.logdet(A, method="slq", distribution="cauchy")
    with pytest.raises(InputError, match="num_probes"):
        st.logdet(A, method="slq", num_probes=0)


def test_float32():
    D = _laplacian()
    ref, sd1 = _theory(D)
    A = st.SparseTensor.from_dense(D.float())
    v = A.values.clone().requires_grad_(True)
    est, info = st.logdet(A.with_values(v), method="slq", num_probes=100, lanczos_steps=30, seed=0,
                          return_info=True)
    assert est.dtype == torch.float32 and info.extra["stderr"].dtype == torch.float32
    assert abs(float(est.detach()) - ref) < 4 * sd1 / 10 + 1e-4 * abs(ref)
    est.backward()
    assert v.grad.dtype == torch.float32 and bool(torch.isfinite(v.grad).all())
    ref_g = _grad_ref(A, D)
    assert float((v.grad.double() - ref_g).norm() / ref_g.norm()) < 0.4


def test_value_batch_is_estimated_per_member():
    shifts = (0.1, 1.0)
    Ds = [_laplacian(s) for s in shifts]
    A0 = st.SparseTensor.from_dense(Ds[0])
    # the same pattern: the shift changes only the diagonal
    vals = torch.stack([A0.values, A0.values + (st.SparseTensor.from_dense(Ds[1]).values - A0.values)])
    v = vals.clone().requires_grad_(True)
    A = A0.with_values(v)
    est, info = st.logdet(A, method="slq", num_probes=100, lanczos_steps=30, seed=0, return_info=True)
    assert est.shape == (2,) and info.extra["stderr"].shape == (2,) and info.extra["per_probe"].shape == (2, 100)
    for i, D in enumerate(Ds):
        ref, sd1 = _theory(D)
        assert abs(float(est[i].detach()) - ref) < 4 * sd1 / 10
        single = st.logdet(A0.with_values(vals[i]), method="slq", num_probes=100, lanczos_steps=30, seed=0)
        torch.testing.assert_close(est[i].detach(), single, rtol=1e-12, atol=1e-10)
    (est[0] + 2 * est[1]).backward()
    assert v.grad.shape == (2, vals.shape[-1])
    for i, D in enumerate(Ds):
        ref_g = _grad_ref(A0, D) * (1 + i)
        assert float((v.grad[i] - ref_g).norm() / ref_g.norm()) < 0.4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda():
    D = _laplacian()
    ref, sd1 = _theory(D)
    A = st.SparseTensor.from_dense(D).to("cuda")
    v = A.values.clone().requires_grad_(True)
    est = st.logdet(A.with_values(v), method="slq", num_probes=100, lanczos_steps=30, seed=0)
    assert est.device.type == "cuda" and abs(float(est.detach()) - ref) < 4 * sd1 / 10
    again = st.logdet(A, method="slq", num_probes=100, lanczos_steps=30, seed=0)  # the same probes: the same estimate
    torch.testing.assert_close(est.detach(), again, rtol=1e-12, atol=0)  # up to CUDA's summation order
    est.backward()
    assert v.grad.device.type == "cuda" and bool(torch.isfinite(v.grad).all())

"""Distributed eigsh at 2 and 4 ranks against dense float64 (torch.linalg.eigh) and the
single-process sparsetorch.eigsh: eigenvalues to 1e-10, gradients of eigenvalues (Hellmann-Feynman)
and eigenvectors, a central difference, the agreed error at a degenerate pair."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.backend import Status

from _dist_scenarios import EIG_K, M, eig_values
from sparsetorch_distributed.problems import poisson2d_rows, tridiag_rows
from test_distributed_ranks import _scenario

N = M * M
TOL = 1e-10


def _dense(values_fn=eig_values, **kw):
    r, c, _ = poisson2d_rows(M, torch.arange(N))
    A = torch.zeros(N, N, dtype=torch.float64)
    A[r, c] = values_fn(r, c, **kw)
    return A, r, c


def _wanted(ev, k, which):
    key = {"LA": -ev, "SA": ev, "LM": -ev.abs()}[which]
    return torch.sort(ev[torch.argsort(key, stable=True)[:k]]).values


def _check_pairs(A, w, X, k, which):
    ev = torch.linalg.eigvalsh(A)
    ref = _wanted(ev, k, which)
    assert float((w - ref).abs().max() / ev.abs().max()) < TOL, (w, ref)
    assert float((X.T @ X - torch.eye(k, dtype=torch.float64)).abs().max()) < 1e-10
    R = A @ X - X * w
    anorm = float(A.abs().sum(1).max())
    assert float((R.norm(dim=0) / (anorm + w.abs())).max()) <= 1e-10      # the core's contract


@pytest.mark.parametrize("which", ["LA", "SA", "LM"])
def test_eigsh_extreme_pairs_match_dense(runs, which):
    outs = _scenario(runs, "eigsh")
    A, r, c = _dense()
    shift = 5.0 if which == "LM" else 0.0          # LM ran on A - 5 I (its LM pairs are not its LA pairs)
    A = A - shift * torch.eye(N, dtype=torch.float64)
    res = [o[which] for o in outs]
    assert all(torch.equal(x["w"], res[0]["w"]) for x in res), "the ranks returned different eigenvalues"
    info = res[0]["info"]
    assert all(x["info"] == info for x in res)
    assert info.converged and info.status == Status.CONVERGED and info.tol == 1e-10 and info.method == "lanczos"
    X = torch.full((N, 4), float("nan"), dtype=torch.float64)
    for o, x in zip(outs, res):
        X[o["ids"]] = x["V"]
    _check_pairs(A, res[0]["w"], X, 4, which)
    if which == "LM":
        assert float(res[0]["w"].max()) < 0, "LM of A - 5 I must pick the negative end"
    # and the single-process sparsetorch.eigsh gives the same eigenvalues
    vals = eig_values(r, c) - shift * (r == c)
    w_sp, _ = st.eigsh(st.SparseTensor.from_coo(vals, r, c, shape=(N, N), format=st.format.CSR), 4, which=which)
    assert float((res[0]["w"] - w_sp).abs().max()) < TOL


def test_eigsh_value_batch_with_a_double_eigenvalue_and_list(runs):
    outs = _scenario(runs, "eigsh")
    A1, r, c = _dense()
    A2 = 1.5 * _dense(spread=0.0)[0]
    ev2 = torch.linalg.eigvalsh(A2)
    assert abs(float(ev2[1] - ev2[2])) < 1e-12, "member 1 must have a double eigenvalue among the wanted ones"
    for i, A in enumerate((A1, A2)):
        X = torch.full((N, 3), float("nan"), dtype=torch.float64)
        for o in outs:
            X[o["ids"]] = o["batch"]["V"][i]
        _check_pairs(A, outs[0]["batch"]["w"][i], X, 3, "SA")
    r2, c2, v2 = tridiag_rows(N, torch.arange(N))
    T = torch.zeros(N, N, dtype=torch.float64).index_put_((r2, c2), v2)
    for j, A in enumerate((A1, T)):
        X = torch.full((N, 4), float("nan"), dtype=torch.float64)
        for o in outs:
            X[o["ids"]] = o["list"][j]["V"]
        _check_pairs(A, outs[0]["list"][j]["w"], X, 4, "LA")


def test_eigsh_gradients_match_dense_single_process_and_finite_differences(runs):
    outs = _scenario(runs, "eigsh_grad")
    A, r, c = _dense()
    ev, U = torch.linalg.eigh(A)
    assert float((outs[0]["w"] - ev[:EIG_K]).abs().max()) < TOL
    # eigenvalues alone: d(sum_i c_i w_i)/dA[r, c] = sum_i c_i u_i[r] u_i[c] (dense float64, sign-free)
    cw = torch.arange(1, EIG_K + 1, dtype=torch.float64)
    G = (U[:, :EIG_K] * cw) @ U[:, :EIG_K].T
    for o in outs:
        assert float((o["g_w"] - G[o["r"], o["c"]]).abs().max() / G.abs().max()) < TOL
    # eigenvalues and eigenvectors: the single-process sparsetorch.eigsh's adjoint on the same loss
    vals = eig_values(r, c).requires_grad_(True)
    w, V = st.eigsh(st.SparseTensor.from_coo(vals, r, c, shape=(N, N), format=st.format.CSR), EIG_K, which="SA")
    ((w * cw).sum() + (torch.cos(torch.arange(N, dtype=torch.float64))[:, None] * V ** 2).sum()).backward()
    Gs = torch.zeros(N, N, dtype=torch.float64).index_put_((r, c), vals.grad)
    scale = float(Gs.abs().max())
    for o in outs:
        assert float((o["g"] - Gs[o["r"], o["c"]]).abs().max()) / scale < 1e-9
    fd, an = outs[0]["fd"]
    assert abs(fd - an) <= 1e-6 * max(1.0, abs(an)), (fd, an)


def test_eigsh_degenerate_eigenvector_gradient_raises_on_every_rank(runs):
    got = [o["degenerate"] for o in _scenario(runs, "eigsh_grad")]
    assert all(g is not None for g in got), got
    assert {g[0] for g in got} == {"DegenerateEigenvalueError"}
    assert len({g[1] for g in got}) == 1


def test_eigsh_of_scaled_matrices(runs):
    """A symmetric matrix times 1e20 / 1e-22 (float32), 1e200 / 1e-200 (float64): eigenvalues and gradients match
    the unscaled problem's (they raised "the Lanczos basis cannot be extended" / NotSymmetricError)."""
    from _dist_scenarios import EIG_SCALED_CASES, _random_spd

    outs = _scenario(runs, "eig_scaled")
    n = 13
    A0 = _random_spd(5, n) - 6.0 * torch.eye(n, dtype=torch.float64)
    # the single-process reference of s = 1 (eigenvalues and the values' gradient of the same loss)
    r, c = torch.nonzero(A0, as_tuple=True)
    vals = A0[r, c].clone().requires_grad_(True)
    w1, V1 = st.eigsh(st.SparseTensor.from_coo(vals, r, c, shape=(n, n)), 2, which="LA")
    (w1.sum() + (V1[:, 1] ** 2 * torch.cos(torch.arange(n, dtype=torch.float64))).sum()).backward()
    G1 = torch.zeros(n, n, dtype=torch.float64).index_put_((r, c), vals.grad)
    ev = torch.linalg.eigvalsh(A0)[-2:]
    for i, (dtype, scale) in enumerate(EIG_SCALED_CASES):
        got = [o["cases"][i] for o in outs]
        assert not isinstance(got[0][0], str), (dtype, scale, got[0])
        tol = 1e-4 if dtype == torch.float32 else 1e-9
        assert float(((got[0][0] / scale) - ev).abs().max() / ev.abs().max()) < tol, (dtype, scale, got[0][0])
        for o, (_, gv) in zip(outs, got):
            ref = G1[o["r"], o["c"]]
            assert float((gv * scale - ref).abs().max() / G1.abs().max()) < (1e-3 if dtype == torch.float32 else 1e-7), \
                (dtype, scale)


def test_loss_reading_one_computed_copy_of_a_repeated_eigenvalue_raises(runs):
    outs = _scenario(runs, "eig_unread_copy")
    for o in outs:
        assert isinstance(o["one"], tuple) and o["one"][0] == "DegenerateEigenvalueError", o["one"]
        assert "reads eigenvector 1 and not eigenvector 2" in o["one"][1]
    assert len({o["one"][1] for o in outs}) == 1
    # the whole eigenspace: the single-process gradient of the same loss
    n = 16
    r, c, _ = poisson2d_rows(4, torch.arange(n))
    vals = torch.where(r == c, 4.0, -1.0).to(torch.float64).requires_grad_(True)
    w, V = st.eigsh(st.SparseTensor.from_coo(vals, r, c, shape=(n, n)), 3, which="SA")
    (((V[:, 1] ** 2 + V[:, 2] ** 2) * torch.arange(n, dtype=torch.float64)).sum()).backward()
    G = torch.zeros(n, n, dtype=torch.float64).index_put_((r, c), vals.grad)
    for o in outs:
        assert not isinstance(o["both"], tuple), o["both"]
        assert float((o["both"] - G[o["r"], o["c"]]).abs().max() / G.abs().max()) < 1e-6

"""Distributed nonlinear_solve at 2 and 4 ranks against the single-process sparsetorch.nonlinear_solve
on the same global problem (values and gradients, 1e-10)."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.backend import Status

from _dist_scenarios import NL_M, nl_inputs
from sparsetorch_distributed.problems import coefficient_values, poisson2d_rows
from test_distributed_ranks import _glue, _rel, _scenario

N = NL_M * NL_M


def _reference():
    ids = torch.arange(N)
    rows, cols, nbnd = poisson2d_rows(NL_M, ids)
    kappa0, f, w = nl_inputs(ids)
    kappa = kappa0.clone().requires_grad_(True)
    c = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)

    def F(u, kappa, c):
        vals = coefficient_values(rows, cols, kappa[rows], kappa[cols], nbnd, rows, N)
        A = torch.zeros(N, N, dtype=torch.float64).index_put((rows, cols), vals, accumulate=True)
        return A @ u + c * u ** 3 - f

    u = st.nonlinear_solve(F, torch.zeros(N, dtype=torch.float64), (kappa, c))
    (w * u).sum().backward()
    assert float(F(u.detach(), kappa.detach(), c.detach()).abs().max()) < 1e-9
    return u.detach(), kappa.grad, c.grad


@pytest.mark.parametrize("jac", ["assembled", "matrix_free"])
def test_nonlinear_solve_values_and_gradients_match_single_process(runs, jac):
    outs = _scenario(runs, "nonlinear")
    u_ref, gk_ref, gc_ref = _reference()
    per = [dict(o[jac], ids=o["ids"]) for o in outs]
    assert _rel(_glue(per, "u", N), u_ref) < 1e-10
    assert _rel(_glue(per, "gk", N), gk_ref) < 1e-10
    assert abs(per[0]["gc"] - float(gc_ref)) <= 1e-10 * abs(float(gc_ref))
    info = per[0]["info"]
    assert all(o["info"] == info for o in per)
    assert info.converged and info.status == Status.CONVERGED and info.rtol == 1e-10
    assert info.jacobian == {"assembled": "assembled", "matrix_free": "matrix-free"}[jac]
    assert info.iterations <= 12

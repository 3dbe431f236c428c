"""The method records of ``nonlinear_solve``: ``Newton(...)``, ``Anderson(...)``, ``Picard(...)`` give
the same iterations as the string spellings with the same keywords, are checked when built, and
are never mixed with the flat keywords they carry."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import sparsetorch as st
from sparsetorch import Anderson, Newton, Picard, nonlinear_solve
from sparsetorch.errors import InputError
from sparsetorch.format import CSR


def tanh_F(u):
    return torch.tanh(1.5 * u + 0.5) - u


def _laplacian(n: int) -> st.SparseTensor:
    i = torch.arange(n)
    rows = torch.cat([i, i[1:], i[:-1]])
    cols = torch.cat([i, i[:-1], i[1:]])
    vals = torch.cat([torch.full((n,), 2.0), torch.full((n - 1,), -1.0), torch.full((n - 1,), -1.0)]).double()
    return st.SparseTensor.from_coo(vals * (n + 1) ** 2, rows, cols, shape=(n, n), format=CSR)


L = _laplacian(40)


def bratu_F(u, f, c):
    return L @ u + c * u**3 - f


def _same(a, b) -> None:
    (ua, ia), (ub, ib) = a, b
    assert torch.equal(ua, ub)
    assert ia.method == ib.method and ia.iterations == ib.iterations
    assert ia.residual_history == ib.residual_history
    assert [x.method for x in ia.attempts] == [x.method for x in ib.attempts]
    assert ia.method_pinned == ib.method_pinned


def test_exported_and_frozen():
    assert st.Newton is Newton and st.Anderson is Anderson and st.Picard is Picard
    for name in ("Newton", "Anderson", "Picard"):
        assert name in st.__all__
    rec = Newton(line_search=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.line_search = True  # type: ignore[misc]
    assert Newton() == Newton(line_search=True, max_backtracks=20, maxiter=None)
    assert Anderson() == Anderson(depth=5, damping=1.0, omega=1.0, maxiter=None)
    assert Picard() == Picard(omega=1.0, damping=1.0, maxiter=None)


@pytest.mark.parametrize("record, name, kw", [
    (Newton(), "newton", {}),
    (Newton(line_search=False, maxiter=30), "newton", {"line_search": False, "maxiter": 30}),
    (Newton(max_backtracks=3), "newton", {"max_backtracks": 3}),
    (Anderson(depth=2, damping=0.7), "anderson", {"depth": 2, "damping": 0.7}),
    (Picard(omega=0.9, maxiter=400), "picard", {"omega": 0.9, "maxiter": 400}),
])
def test_record_matches_the_string_spelling(record, name, kw):
    u0 = torch.full((1,), 0.5, dtype=torch.float64)
    a = nonlinear_solve(tanh_F, u0, method=record, return_info=True, on_nonconvergence="ignore")
    b = nonlinear_solve(tanh_F, u0, method=name, return_info=True, on_nonconvergence="ignore", **kw)
    _same(a, b)
    assert a[1].method_pinned


def test_records_on_a_sparse_problem_with_gradients():
    n = L.shape[0]
    f = torch.linspace(0, 1, n, dtype=torch.float64).requires_grad_()
    c = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    u0 = torch.zeros(n, dtype=torch.float64)
    grads = []
    for method, kw in ((Newton(max_backtracks=5), {}), ("newton", {"max_backtracks": 5}),
                       (Anderson(depth=3), {"preconditioner": L}), ("anderson", {"depth": 3, "preconditioner": L})):
        u, info = nonlinear_solve(bratu_F, u0, (f, c), jac_pattern=L, method=method, return_info=True, **kw)
        assert info.converged
        gf, gc = torch.autograd.grad((u**2).sum(), (f, c))
        grads.append((u.detach(), gf, gc))
    for a, b in ((grads[0], grads[1]), (grads[2], grads[3])):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_library_choice_unchanged_by_keywords():
    u0 = torch.zeros(1, dtype=torch.float64)
    u, info = nonlinear_solve(tanh_F, u0, return_info=True, depth=3)
    assert not info.method_pinned and [a.method for a in info.attempts] == ["newton", "anderson"]
    assert abs(float(u) - 0.9594710428) < 1e-8


@pytest.mark.parametrize("record, kw, match", [
    (Newton(), {"line_search": False}, r"line_search= \(set it in the record: method=Newton"),
    (Newton(), {"maxiter": 10}, r"maxiter= \(set it in the record"),
    (Newton(), {"depth": 3}, r"depth= \(an option of Anderson, not of Newton"),
    (Picard(), {"damping": 0.5}, r"damping= \(set it in the record: method=Picard"),
    (Anderson(), {"max_backtracks": 2}, r"max_backtracks= \(an option of Newton, not of Anderson"),
])
def test_keywords_beside_a_record_raise(record, kw, match):
    with pytest.raises(InputError, match=match):
        nonlinear_solve(tanh_F, torch.zeros(1, dtype=torch.float64), method=record, **kw)


def test_default_valued_keyword_beside_a_record_still_raises():
    # a keyword given at its default is still given: it cannot silently lose to the record
    with pytest.raises(InputError, match="line_search="):
        nonlinear_solve(tanh_F, torch.zeros(1, dtype=torch.float64), method=Newton(line_search=False), line_search=True)


@pytest.mark.parametrize("build, match", [
    (lambda: Anderson(damping=2), r"damping must be a number in \(0, 1\]"),
    (lambda: Picard(omega=0), r"omega must be a number in \(0"),
    (lambda: Anderson(depth=-1), r"depth \(Anderson memory\) must be an int >= 0"),
    (lambda: Newton(max_backtracks=1.5), r"max_backtracks must be an int >= 0"),
    (lambda: Newton(maxiter=0), r"maxiter must be a positive int or None"),
])
def test_records_are_checked_when_built(build, match):
    with pytest.raises(InputError, match=match):
        build()


def test_wrong_method_values():
    u0 = torch.zeros(1, dtype=torch.float64)
    with pytest.raises(InputError, match=r"method=Newton is the class; pass an instance"):
        nonlinear_solve(tanh_F, u0, method=Newton)
    with pytest.raises(InputError, match="method must be one of"):
        nonlinear_solve(tanh_F, u0, method="broyden")
    with pytest.raises(InputError, match="preconditioner= is for method='anderson'/'picard'"):
        nonlinear_solve(tanh_F, u0, method=Newton(), preconditioner=lambda r: r)

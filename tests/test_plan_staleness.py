"""Plans must compute with the matrix of the call, whatever was written in place since they were made.

Two ways session 27's sweep found to leave a plan on other numbers or another pattern:
- a cached plan that wraps the caller's values without a copy (SciPy / Eigen Krylov, spectral plans) kept
  reading them after the caller overwrote them in place, while another tensor with the plan's *old*
  numbers was taken for "the values the plan holds" (snapshot equality) and never loaded;
- a ``Solver`` kept its factorization after a tracked in-place write to A's index buffers.
The references are dense float64 solves / eigendecompositions.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import sparsetorch as st
from sparsetorch.format import CSR

HAS_SCIPY = importlib.util.find_spec("sparsetorch_scipy") is not None
HAS_EIGEN = importlib.util.find_spec("sparsetorch_eigen") is not None


def _tridiag(n: int = 30) -> torch.Tensor:
    return (torch.diag(torch.full((n,), 4.0)) - torch.diag(torch.ones(n - 1), 1)
            - torch.diag(torch.ones(n - 1), -1)).double()


def _solve_cases():
    cases = [dict(backend="torch", method="cg", rtol=1e-12), dict(method="cg", rtol=1e-12)]
    if HAS_SCIPY:
        cases += [dict(backend="scipy", method="cg", rtol=1e-12), dict(backend="scipy", method="gmres", rtol=1e-12),
                  dict(backend="scipy", method="bicgstab", rtol=1e-12)]
    if HAS_EIGEN:
        cases += [dict(backend="eigen", method="cg", rtol=1e-12), dict(backend="eigen", method="bicgstab", rtol=1e-12)]
    return cases


@pytest.mark.parametrize("kw", _solve_cases(), ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_solve_after_the_planned_values_were_overwritten_in_place(kw):
    D = _tridiag()
    b = torch.ones(D.shape[0], dtype=torch.float64)
    A1 = st.SparseTensor.from_dense(D, format=CSR)
    st.solve(A1, b, **kw)  # a cached plan loaded with A1's values
    A1.values.mul_(3.0)  # A1's memory now holds other numbers; A1 itself is never solved again
    A2 = st.SparseTensor.from_dense(D, format=CSR)  # the same pattern, A1's original numbers
    x2 = st.solve(A2, b, **kw)
    torch.testing.assert_close(x2, torch.linalg.solve(D, b), rtol=1e-9, atol=1e-12)
    # and A1's new numbers are seen when A1 is solved
    torch.testing.assert_close(st.solve(A1, b, **kw), torch.linalg.solve(3.0 * D, b), rtol=1e-9, atol=1e-12)


def test_solve_after_a_shortcut_then_a_write_to_the_first_tensor():
    # A2 equal to A1: no reload; then A1 (the memory a wrapping plan reads) is written: A2 must still be answered
    D = _tridiag()
    b = torch.ones(D.shape[0], dtype=torch.float64)
    kw = dict(method="cg", rtol=1e-12)
    A1 = st.SparseTensor.from_dense(D, format=CSR)
    A2 = st.SparseTensor.from_dense(D, format=CSR)
    st.solve(A1, b, **kw)
    st.solve(A2, b, **kw)
    A1.values.mul_(3.0)
    torch.testing.assert_close(st.solve(A2, b, **kw), torch.linalg.solve(D, b), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("method", ["lanczos", "dense"] + (["arpack"] if HAS_SCIPY else []))
def test_eigsh_after_the_planned_values_were_overwritten_in_place(method):
    n = 40
    g = torch.Generator().manual_seed(3)
    R = torch.rand(n, n, generator=g, dtype=torch.float64)
    D = (R + R.T) * (torch.rand(n, n, generator=g) < 0.2).double()
    D = D + D.T + torch.diag(torch.arange(n, dtype=torch.float64))
    A1 = st.SparseTensor.from_dense(D, format=CSR)
    st.eigsh(A1, k=2, which="LA", method=method)
    A1.values.mul_(-2.0)
    A2 = st.SparseTensor.from_dense(D, format=CSR)
    w = st.eigsh(A2, k=2, which="LA", method=method)[0]
    ref = torch.linalg.eigvalsh(D)[-2:]
    torch.testing.assert_close(torch.sort(w).values, ref, rtol=1e-8, atol=1e-8)


@pytest.mark.skipif(not HAS_SCIPY, reason="needs the SciPy plugin (lsqr)")
def test_lstsq_after_the_planned_values_were_overwritten_in_place():
    g = torch.Generator().manual_seed(5)
    D = torch.randn(40, 12, generator=g, dtype=torch.float64) * (torch.rand(40, 12, generator=g) < 0.5)
    D[:12] += 3 * torch.eye(12, dtype=torch.float64)
    b = torch.randn(40, generator=g, dtype=torch.float64)
    kw = dict(backend="scipy", method="lsqr")
    A1 = st.SparseTensor.from_dense(D, format=CSR)
    st.lstsq(A1, b, **kw)
    A1.values.mul_(3.0)
    x = st.lstsq(st.SparseTensor.from_dense(D, format=CSR), b, **kw)
    torch.testing.assert_close(x, torch.linalg.lstsq(D, b.unsqueeze(-1)).solution.squeeze(-1), rtol=1e-8, atol=1e-10)


def test_solver_update_values_equal_to_old_numbers_after_an_overwrite():
    D = _tridiag()
    b = torch.ones(D.shape[0], dtype=torch.float64)
    A = st.SparseTensor.from_dense(D, format=CSR)
    s = st.Solver(A, method="cg", rtol=1e-12, cache=True)
    s.solve(b)
    A.values.mul_(3.0)  # the memory the plan was loaded from
    s.update_values(st.SparseTensor.from_dense(D, format=CSR).values)  # equal to the plan's snapshot
    torch.testing.assert_close(s.solve(b), torch.linalg.solve(D, b), rtol=1e-9, atol=1e-12)


def _index_cases():
    cases = [dict(backend="torch", method="lu"), dict(method="gmres", rtol=1e-12), {}]
    if HAS_SCIPY:
        cases.append(dict(backend="scipy", method="lu"))
    if HAS_EIGEN:
        cases.append(dict(backend="eigen", method="lu"))
    return cases


@pytest.mark.parametrize("kw", _index_cases(), ids=lambda kw: "-".join(str(v) for v in kw.values()) or "default")
def test_solver_sees_an_in_place_write_to_the_index_buffers(kw):
    D = torch.diag(torch.full((6,), 4.0, dtype=torch.float64))
    D += torch.diag(torch.ones(5, dtype=torch.float64), 1) + torch.diag(torch.ones(5, dtype=torch.float64), -1)
    A = st.SparseTensor.from_dense(D, format=CSR)
    b = torch.arange(1.0, 7.0, dtype=torch.float64)
    s = st.Solver(A, **kw)
    torch.testing.assert_close(s.solve(b), torch.linalg.solve(D, b))
    A.crd(1)[1] = 3  # row 0: column 1 -> column 3 (still sorted and valid): another matrix
    new = A.to_dense()
    assert not torch.equal(new, D)
    x = s.solve(b)
    torch.testing.assert_close(x, torch.linalg.solve(new, b), rtol=1e-9, atol=1e-12)
    # and the gradient flows to the new pattern's values
    v = A.values.detach().clone().requires_grad_(True)
    s.update_values(v)
    s.solve(b).sum().backward()
    vd = v.detach().clone().requires_grad_(True)
    ref = torch.linalg.solve(A.with_values(vd).to_dense(), b).sum()
    (gv,) = torch.autograd.grad(ref, vd)
    torch.testing.assert_close(v.grad, gv, rtol=1e-8, atol=1e-12)


def test_solver_threads_after_an_index_write_all_get_the_new_matrix():
    # two threads that solve right after a write to A's index buffers: neither plans on the old pattern nor
    # reads the plan state while the other replaces it (one of them read None)
    import sys
    import threading

    D = torch.diag(torch.full((6,), 4.0, dtype=torch.float64))
    D += torch.diag(torch.ones(5, dtype=torch.float64), 1) + torch.diag(torch.ones(5, dtype=torch.float64), -1)
    b = torch.arange(1.0, 7.0, dtype=torch.float64)
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _rep in range(20):
            A = st.SparseTensor.from_dense(D, format=CSR)
            s = st.Solver(A, backend="torch", method="lu")
            s.solve(b)
            A.crd(1)[1] = 3
            ref = torch.linalg.solve(A.to_dense(), b)
            out, errors = [None] * 4, []

            def work(i):
                try:
                    out[i] = s.solve(b)
                except Exception as exc:  # noqa: BLE001 - collected and asserted below
                    errors.append(exc)

            threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, errors
            for x in out:
                torch.testing.assert_close(x, ref, rtol=1e-10, atol=1e-12)
    finally:
        sys.setswitchinterval(old_interval)


def test_solver_factorize_and_solve_racing_after_an_index_write_plan_once(monkeypatch):
    # the re-plan window widened (obtain_plan sleeps): a factorize() from one thread and a solve() from another,
    # right after a write to A's index buffers, plan once and neither reads the state the other is replacing
    import importlib
    import threading
    import time

    solve_mod = importlib.import_module("sparsetorch.ops.solve")  # (the package's "solve" is the function)

    orig, calls = solve_mod.obtain_plan, []

    def slow(*a, **k):
        calls.append(threading.current_thread().name)
        time.sleep(0.05)
        return orig(*a, **k)

    n = 50
    D = torch.diag(torch.full((n,), 4.0, dtype=torch.float64))
    D += torch.diag(torch.ones(n - 1, dtype=torch.float64), 1) + torch.diag(torch.ones(n - 1, dtype=torch.float64), -1)
    b = torch.arange(1.0, n + 1, dtype=torch.float64)
    A = st.SparseTensor.from_dense(D, format=CSR)
    s = st.Solver(A, backend="torch", method="lu")
    s.solve(b)
    monkeypatch.setattr(solve_mod, "obtain_plan", slow)
    A.crd(1)[1] = 3
    errors, out = [], []

    def t_solve():
        try:
            out.append(s.solve(b))
        except Exception as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    def t_factorize():
        time.sleep(0.01)  # the solving thread is re-planning now
        try:
            s.factorize()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=t_solve, name="solve"), threading.Thread(target=t_factorize, name="factorize")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert calls == ["solve"], calls
    torch.testing.assert_close(out[0], torch.linalg.solve(A.to_dense(), b), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(s.solve(b), torch.linalg.solve(A.to_dense(), b), rtol=1e-10, atol=1e-12)

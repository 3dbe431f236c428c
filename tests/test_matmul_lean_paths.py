"""The lean per-call paths of products (issue 16, goal 5), on the CPU with a stand-in bound launch:
``Matmul.execute``'s direct path holding its operands (``_Direct``), and the one-shot
``st.matmul``'s remembered launch (``_OneShot``): when they serve a call, when they decline it
(values swapped, X of another dtype, shape or device, gradients, index buffers written), the
dispatcher's call counting across them, clearing, threads. Every result is compared with the
dense product."""

from __future__ import annotations

import gc
import sys
import threading

import pytest
import torch

import sparsetorch as st
from sparsetorch.dispatch import plan as plan_mod
from sparsetorch.format import CSR

M = sys.modules["sparsetorch.ops.matmul"]


class _Bound:
    """What a GPU plan's ``bind`` returns, on the CPU: ``bound(X, Y)`` writes ``A X`` into ``Y``
    from the values tensor it was bound to (read at call time), or declines a non-contiguous X."""

    made = 0
    calls = 0

    def __init__(self, A, values):
        self.A, self.values = A, values
        type(self).made += 1

    def __call__(self, X, Y):
        if not X.is_contiguous():
            return False
        type(self).calls += 1
        Y.copy_((self.A.with_values(self.values).to_dense() @ X).reshape(Y.shape))
        return True


class _Plan:
    """The torch backend's product plan with a ``bind`` (how the bound paths run on the CPU)."""

    def __init__(self, inner, A):
        self.inner, self.A = inner, A

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def bind(self, values, X):
        return _Bound(self.A, values)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    st.clear_caches()
    monkeypatch.setattr(_Bound, "made", 0)
    monkeypatch.setattr(_Bound, "calls", 0)
    yield
    st.clear_caches()


def _matrix(m=30, n=20, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(m, n, generator=g, dtype=dtype) * (torch.rand(m, n, generator=g) < 0.3)
    return D, st.SparseTensor.from_dense(D).convert(CSR, index_dtype=torch.int32)


def _bindable_one_shot(A, X):
    """One st.matmul (plans and caches), then the cached plan wrapped with a bind."""
    y = st.matmul(A, X, backend="torch")
    states = [e[0] for _, e in plan_mod.plan_cache()._lru.items()]
    assert len(states) == 1
    state = states[0]
    if state.plan is None:
        state.build()
    state.plan = _Plan(state.plan, A.detach())  # not A itself: the test sees A go
    return y


def test_one_shot_remembers_the_launch_on_a_pattern_seen_before():
    D, A = _matrix()
    b = torch.randn(20, dtype=torch.float64)
    assert torch.allclose(_bindable_one_shot(A, b), D @ b)
    assert id(A) not in M._ONE_SHOT  # the first product: nothing remembered
    assert torch.allclose(st.matmul(A, b, backend="torch"), D @ b)  # seen before: remembered now
    assert id(A) in M._ONE_SHOT and _Bound.made == 1 and _Bound.calls == 0
    for _ in range(5):
        assert torch.allclose(st.matmul(A, b, backend="torch"), D @ b)
    assert _Bound.calls == 5 and _Bound.made == 1
    b.mul_(-2)  # in place: the same tensor, read at call time
    assert torch.allclose(st.matmul(A, b, backend="torch"), D @ b)
    b2 = torch.randn(20, dtype=torch.float64)  # another X of the same shape, dtype, device
    assert torch.allclose(st.matmul(A, b2, backend="torch"), D @ b2) and _Bound.calls == 7
    with torch.no_grad():
        A.values.mul_(3)  # A's values in place: read where they lie
    assert torch.allclose(st.matmul(A, b2, backend="torch"), 3 * D @ b2)
    B = torch.randn(20, 4, dtype=torch.float64)  # another shape: the full path (right), entry kept
    assert torch.allclose(st.matmul(A, B, backend="torch"), 3 * D @ B) and _Bound.calls == 8
    assert torch.allclose(st.matmul(A, b2, backend="torch"), 3 * D @ b2) and _Bound.calls == 9


def test_one_shot_declines_what_it_cannot_serve():
    D, A = _matrix()
    b = torch.randn(20, dtype=torch.float64)
    _bindable_one_shot(A, b)
    st.matmul(A, b, backend="torch")
    assert id(A) in M._ONE_SHOT
    calls = _Bound.calls
    # X of another dtype: the full path, which refuses it as it always did
    with pytest.raises(st.InputError, match="dtype"):
        st.matmul(A, b.float(), backend="torch")
    # a non-contiguous X: the bound launch declines, the full path computes it
    bn = torch.randn(40, dtype=torch.float64)[::2]
    assert torch.allclose(st.matmul(A, bn, backend="torch"), D @ bn)
    # X requiring grad: the Function path, with gradients
    bg = b.clone().requires_grad_(True)
    yg = st.matmul(A, bg, backend="torch")
    assert yg.requires_grad
    yg.sum().backward()
    assert torch.allclose(bg.grad, D.sum(0))
    assert _Bound.calls == calls  # none of these launched the remembered product
    # another backend asked for: the full path
    assert torch.allclose(st.matmul(A, b, backend="torch"), D @ b)


def test_one_shot_values_swapped_or_index_written():
    D, A = _matrix()
    b = torch.randn(20, dtype=torch.float64)
    _bindable_one_shot(A, b)
    st.matmul(A, b, backend="torch")
    # another tensor with new values on the same pattern: not A, so not A's launch
    A2 = A.with_values(A.values * 2)
    assert torch.allclose(st.matmul(A2, b, backend="torch"), 2 * D @ b)
    # A's column indices written in place (still valid): the launch is forgotten, the full path
    # re-validates and plans again
    col = A.crd(1)
    with torch.no_grad():
        col.add_(0)
    assert torch.allclose(st.matmul(A, b, backend="torch"), D @ b)
    with torch.no_grad():
        col[0] = 10_000  # out of range: raises before anything reads it
    with pytest.raises(st.ValidationError):
        st.matmul(A, b, backend="torch")


def test_one_shot_counts_calls_for_the_dispatcher(monkeypatch):
    """With an offer that has a setup to spread, the dispatcher counts calls per pattern and
    re-decides at powers of two: the remembered launch serves the calls in between, counts them
    there when it hands back, and never skips a power of two."""
    monkeypatch.setattr(plan_mod, "counts_calls", lambda request, table: True)
    monkeypatch.setattr(M, "counts_calls", lambda request, table: True)
    D, A = _matrix()
    b = torch.randn(20, dtype=torch.float64)
    key = plan_mod.calls_key("matmul", A)
    full = []
    real = plan_mod.obtain_plan

    def counting(*args, **kw):
        full.append(plan_mod.calls_seen(key) + 1)  # the number of this call
        return real(*args, **kw)

    monkeypatch.setattr(M, "obtain_plan", counting)
    _bindable_one_shot(A, b)
    for _ in range(39):
        assert torch.allclose(st.matmul(A, b, backend="torch"), D @ b)
    assert full == [1, 2, 4, 8, 16, 32]  # the decisions' repeat changes exactly there
    e = M._ONE_SHOT[id(A)]
    assert plan_mod.calls_seen(key) + (e.start - e.left) == 40
    assert _Bound.calls == 40 - len(full) and _Bound.made == 5


def test_one_shot_recheck_bound_and_clearing(monkeypatch):
    monkeypatch.setattr(M, "ONE_SHOT_RECHECK", 3)
    D, A = _matrix()
    b = torch.randn(20, dtype=torch.float64)
    _bindable_one_shot(A, b)
    hits = st.plan_cache().hits
    for _ in range(9):
        assert torch.allclose(st.matmul(A, b, backend="torch"), D @ b)
    # 1 full + 3 remembered, twice, then 1 full: the remembered calls count as plan-cache hits
    assert _Bound.calls == 6 and st.plan_cache().hits == hits + 9
    assert id(A) in M._ONE_SHOT
    st.plan_cache().clear()  # a cleared plan cache: the launch goes with its plan
    assert torch.allclose(st.matmul(A, b, backend="torch"), D @ b)
    assert _Bound.calls == 6 and id(A) not in M._ONE_SHOT
    _bindable_one_shot(A, b)
    st.matmul(A, b, backend="torch")
    assert id(A) in M._ONE_SHOT
    st.clear_caches()
    assert id(A) not in M._ONE_SHOT
    _bindable_one_shot(A, b)
    st.matmul(A, b, backend="torch")
    key = id(A)
    assert key in M._ONE_SHOT
    st.plan_cache().clear()
    del A
    gc.collect()
    assert key not in M._ONE_SHOT  # the entry goes with its tensor


def test_one_shot_from_several_threads():
    D, A = _matrix()
    b = torch.randn(20, dtype=torch.float64)
    _bindable_one_shot(A, b)
    st.matmul(A, b, backend="torch")
    xs = [torch.randn(20, dtype=torch.float64) for _ in range(4)]
    errors = []

    def work(x):
        try:
            for _ in range(50):
                if not torch.allclose(st.matmul(A, x, backend="torch"), D @ x):
                    errors.append("wrong result")
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(x,)) for x in xs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and _Bound.calls > 0


def _bindable_matmul(A, b, c=None, **kw):
    mm = st.Matmul(A, b, c, backend="torch", **kw)
    mm.plan()
    mm._state.plan = _Plan(mm._state.plan, A)
    return mm


def test_execute_direct_path_keeps_its_operands_current():
    D, A = _matrix()
    b = torch.randn(20, dtype=torch.float64)
    mm = _bindable_matmul(A, b)
    assert torch.allclose(mm.execute(), D @ b) and mm._direct is not None
    d = mm._direct
    b2 = torch.randn(20, dtype=torch.float64)
    mm.reset_operands_unchecked(b=b2)  # same layout: the bind stays, with the new b
    assert mm._direct is d and d.X.data_ptr() == b2.data_ptr()
    assert torch.allclose(mm.execute(), D @ b2)
    b3 = torch.randn(20, dtype=torch.float32)  # another dtype: bound anew (then refused by the plan)
    mm.reset_operands_unchecked(b=b3)
    assert mm._direct is None
    mm.reset_operands_unchecked(b=b2)
    assert torch.allclose(mm.execute(), D @ b2) and mm._direct is not None
    # the values tensor swapped (reset_operands with A on new values, same pattern): bound anew
    A2 = A.with_values(A.values * -1)
    mm.reset_operands(a=A2)
    assert mm._direct is None and torch.allclose(mm.execute(), -D @ b2)
    assert mm._direct is not None and mm._direct.values is A2.values


def test_execute_direct_path_into_c_and_overlaps():
    D, A = _matrix()
    b = torch.randn(20, dtype=torch.float64)
    c = torch.full((30,), float("nan"), dtype=torch.float64)
    mc = _bindable_matmul(A, b, c, beta=0)
    assert mc.execute() is c and torch.allclose(c, D @ b) and mc._direct.into_c and mc._direct.c is c
    c2 = torch.zeros(30, dtype=torch.float64)
    mc.reset_operands_unchecked(c=c2)  # another c: bound anew, written there
    assert mc.execute() is c2 and torch.allclose(c2, D @ b)
    # c overlapping A's values: never bound (the launch would read what it writes)
    Dsq, As = _matrix(30, 30, seed=3)
    cv = As.values[:30] if As.values.numel() >= 30 else None
    if cv is not None:
        mo = _bindable_matmul(As, torch.randn(30, dtype=torch.float64), cv, beta=0)
        ref = Dsq @ mo.b
        assert torch.allclose(mo.execute(), ref) and mo._direct is None
    # c requiring grad (a gradient recorded): not written in place, a new tensor returned
    cg = torch.zeros(30, dtype=torch.float64, requires_grad=True)
    mg = _bindable_matmul(A, b, cg, beta=0)
    calls = _Bound.calls
    y = mg.execute()
    assert y is not cg and torch.allclose(y, D @ b) and float(cg.detach().abs().sum()) == 0 and _Bound.calls == calls
    with torch.no_grad():  # no gradient recorded: c itself, through the bound launch
        assert mg.execute() is cg and torch.allclose(cg.detach(), D @ b) and _Bound.calls == calls + 1


def test_execute_direct_path_declines_x_whose_data_was_swapped():
    """``b.data`` replaced by a tensor of another shape or dtype after the bind: the bound launch
    (which would read the new buffer with the old extents / element type) is not called with it;
    the call binds again or takes the general path, which checks X and raises a clear error."""
    D, A = _matrix()
    b = torch.randn(20, 3, dtype=torch.float64)
    mm = _bindable_matmul(A, b)
    assert torch.allclose(mm.execute(), D @ b) and mm._direct is not None
    calls = _Bound.calls
    b.data = torch.randn(7, 3, dtype=torch.float64)  # fewer rows than A has columns
    with pytest.raises(st.BackendError, match="shapes"):
        mm.execute()
    assert _Bound.calls == calls
    b.data = torch.randn(20, 3, dtype=torch.float64)  # the shape bound: served again, with the new data
    assert torch.allclose(mm.execute(), D @ b)


@pytest.mark.parametrize("layout", ["COO", "unordered", "CSC"])
def test_converted_formats_take_the_remembered_launch_of_the_torch_backend(layout):
    """A matrix reached by a conversion (COO, triplets as given, CSC) binds too: its values are gathered
    into CSR order at each call (the one-shot COO product took the general path: 146 against 14.5 us on
    CSR, session 23). In-place writes to the values are seen; several threads at once gather their own."""
    D, _ = _matrix(40, 30, seed=3)
    r, c = torch.nonzero(D, as_tuple=True)
    if layout == "unordered":
        perm = torch.randperm(r.numel(), generator=torch.Generator().manual_seed(1))
        r, c = r[perm], c[perm]
    A = st.SparseTensor.from_coo(D[r, c].clone(), r, c, shape=tuple(D.shape))
    if layout == "CSC":
        A = A.convert("CSC")
    b = torch.randn(30, dtype=torch.float64)
    for _ in range(3):
        torch.testing.assert_close(st.matmul(A, b, backend="torch"), D @ b)
    assert id(A) in M._ONE_SHOT  # served by the remembered launch
    with torch.no_grad():
        A.values.mul_(-2)
    torch.testing.assert_close(st.matmul(A, b, backend="torch"), -2 * D @ b)
    B = torch.randn(30, 3, dtype=torch.float64)
    torch.testing.assert_close(st.matmul(A, B, backend="torch"), -2 * D @ B)
    errors = []

    def work(seed):
        x = torch.randn(30, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        for _ in range(50):
            if not torch.allclose(st.matmul(A, x, backend="torch"), -2 * D @ x):
                errors.append(seed)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors

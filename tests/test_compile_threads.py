"""torch.compile in one thread, eager sparsetorch in another (session 28's sweep).

``torch.compiler.is_compiling()`` reads one process-wide flag that torch holds for a whole
compile session: while a thread compiled anything (dense code included), eager sparsetorch
calls in other threads took the compile-only paths (``A.T`` became a ``TracedTranspose``, the
layer and ``SparseWeight`` products went to the custom op) and failed with "'TracedTranspose'
object has no attribute '_cache'". sparsetorch now asks :func:`sparsetorch.tensor._compiling.compiling`,
true only in the thread that traces. Checked here: eager products, a layer's forward and
backward, ``x @ SparseWeight`` and ``st.solve`` in the main thread against their dense twins
while a second thread compiles dense functions one after another (the test waits until each
kind has run several times with the flag on, so the overlap is certain); and, in one thread,
that compiled code (``fullgraph=True``) and non-strict ``torch.export`` still take the traced
paths and agree with eager.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sparsetorch as st
from sparsetorch.nn import SparseLinear, SparseWeight
from sparsetorch.tensor._compiling import compiling

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64


def _layer(seed: int = 0, n: int = 24) -> SparseLinear:
    torch.manual_seed(seed)
    lin = nn.Linear(n, n).double()
    return SparseLinear.from_linear(lin, mask=torch.rand(n, n) < 0.35)


def _spd(n: int = 12, seed: int = 1) -> tuple[st.SparseTensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    M = torch.randn(n, n, generator=g, dtype=F64) * (torch.rand(n, n, generator=g) < 0.3)
    D = M @ M.T + n * torch.eye(n, dtype=F64)
    return st.SparseTensor.from_dense(D), D


def _flag_on() -> bool:
    return bool(torch.compiler.is_compiling())


class _Compiler(threading.Thread):
    """Compiles fresh dense functions (nothing of sparsetorch in them) until told to stop, or
    ``limit`` compiles: torch's compiling flag is on for most of its time."""

    def __init__(self, limit: int = 400) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.limit = limit
        self.compiles = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for i in range(self.limit):
                if self.stop.is_set():
                    return
                # a new code object each time (dynamo caches per code object, and stops recompiling one after
                # its recompile limit): every call is a fresh compile
                ns: dict = {}
                exec(f"def f(t):\n    return (t * {i + 1}).sin().cumsum(0).sum()\n", {}, ns)  # noqa: S102
                torch.compile(ns["f"], backend="eager")(torch.randn(3 + i % 40))
                self.compiles += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def test_eager_calls_beside_a_compiling_thread_take_the_eager_paths() -> None:
    lin0 = _layer()
    Wd, b = lin0.to_dense().detach(), lin0.bias.detach()
    mask = Wd != 0
    _, Sd = _spd()
    x = torch.randn(5, 24, dtype=F64)
    rhs = torch.randn(12, 2, dtype=F64)
    Sinv_rhs = torch.linalg.solve(Sd, rhs)
    # each call on sparse objects made for it: their plans are built while the other thread compiles (a
    # cached plan hid the failure: the transposed view was only built by a new plan)
    fresh = lambda: st.SparseTensor.from_dense(Wd, mask=mask)  # noqa: E731

    def layer_fwd_bwd() -> None:
        lin = SparseLinear(fresh(), b)
        xx = x.clone().requires_grad_(True)
        y = lin(xx)
        y.square().sum().backward()
        ref = x @ Wd.T + b
        torch.testing.assert_close(y.detach(), ref)
        torch.testing.assert_close(xx.grad, (2 * ref) @ Wd)
        coords, slot = lin.weight.entries()
        torch.testing.assert_close(lin.values.grad[slot], ((2 * ref).T @ x)[coords[0], coords[1]])

    def not_compiling() -> None:
        assert not compiling(), "compiling() said True in an eager thread"

    kinds = {
        "A.T @ x": lambda: torch.testing.assert_close(fresh().T @ x.T, Wd.T @ x.T),
        "st.matmul(A, X)": lambda: torch.testing.assert_close(st.matmul(fresh(), x.T), Wd @ x.T),
        "x @ A": lambda: torch.testing.assert_close(x @ fresh(), x @ Wd),
        "SparseLinear forward + backward": layer_fwd_bwd,
        "x @ SparseWeight": lambda: torch.testing.assert_close(x @ SparseWeight(fresh()), x @ Wd),
        "F.linear(x, SparseWeight, b)": lambda: torch.testing.assert_close(F.linear(x, SparseWeight(fresh()), b),
                                                                            x @ Wd.T + b),
        "st.solve": lambda: torch.testing.assert_close(st.solve(st.SparseTensor.from_dense(Sd), rhs), Sinv_rhs),
        "compiling() is False here": not_compiling,
    }
    for check in kinds.values():  # every call once without the other thread
        check()
    overlapped = dict.fromkeys(kinds, 0)
    errors: dict[str, str] = {}
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # frequent switches: calls interleave with the compile
    compiler = _Compiler()
    compiler.start()
    try:
        deadline = time.monotonic() + 120
        while (any(n < 5 for k, n in overlapped.items() if k not in errors) and compiler.is_alive()
               and time.monotonic() < deadline):
            for name, check in kinds.items():
                if name in errors:
                    continue
                on = _flag_on()
                try:
                    check()
                except Exception as exc:  # noqa: BLE001 - collected, reported together
                    errors[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
                if on and _flag_on():
                    overlapped[name] += 1
    finally:
        compiler.stop.set()
        compiler.join()
        sys.setswitchinterval(before)
    assert compiler.error is None, compiler.error
    assert not errors, f"eager calls failed while another thread compiled: {errors}"
    assert min(overlapped.values()) >= 5, (f"the calls did not overlap the compile often enough to test it "
                                           f"({overlapped}, {compiler.compiles} compiles)")


def test_compiling_is_true_only_in_the_tracing_thread() -> None:
    seen: list[bool] = []
    flag_seen: list[bool] = []

    def f(x: torch.Tensor) -> torch.Tensor:
        return x + 1 if compiling() else x - 1

    g = torch.compile(f, fullgraph=True, backend="eager")
    x = torch.zeros(3)
    torch.testing.assert_close(g(x), x + 1)  # dynamo folds it to True in the trace
    assert f(x).eq(-1).all() and not compiling()  # eager

    compiler = _Compiler(limit=60)
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    compiler.start()
    try:
        while compiler.is_alive() and sum(flag_seen) < 20:
            flag_seen.append(_flag_on())
            seen.append(compiling())
    finally:
        compiler.stop.set()
        compiler.join()
        sys.setswitchinterval(before)
    assert sum(flag_seen) >= 20, "the compile flag was never seen on"
    assert not any(seen)


def test_compiled_matches_eager_fullgraph_in_one_thread() -> None:
    lin = _layer(3)
    A = lin.weight.detach()
    Wd, b = lin.to_dense().detach(), lin.bias.detach()
    W = SparseWeight(A)
    S, Sd = _spd(10, 4)
    x = torch.randn(4, 24, dtype=F64)
    rhs = torch.randn(10, dtype=F64)

    compile_ = lambda fn: torch.compile(fn, fullgraph=True, backend="aot_eager")  # noqa: E731
    cases = [
        (lambda X: A.T @ X, (x.T,), Wd.T @ x.T),
        (lambda X: X @ W, (x,), x @ Wd),
        (lambda X: F.linear(X, W, b), (x,), x @ Wd.T + b),
        (lambda X: lin(X), (x,), x @ Wd.T + b),
        (lambda r: st.solve(S, r), (rhs,), torch.linalg.solve(Sd, rhs)),
    ]
    for fn, args, ref in cases:
        eager = fn(*args)
        torch.testing.assert_close(eager, ref)
        torch.testing.assert_close(compile_(fn)(*args), eager)

    # gradients through the compiled layer equal the eager layer's
    xx = x.clone().requires_grad_(True)
    compile_(lin)(xx).square().sum().backward()
    g_compiled, gx_compiled = lin.values.grad.clone(), xx.grad.clone()
    lin.zero_grad(set_to_none=True)
    xx = x.clone().requires_grad_(True)
    lin(xx).square().sum().backward()
    torch.testing.assert_close(g_compiled, lin.values.grad)
    torch.testing.assert_close(gx_compiled, xx.grad)


def test_non_strict_export_takes_the_traced_path() -> None:
    # torch.export(strict=False) runs the Python code for real under a fake tensor mode, with torch's flag on
    # and no dynamo: compiling() must say True there (the layer's custom op, not eager dispatch)
    lin = _layer(5)
    A = lin.weight.detach()

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = lin

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) + (A.T @ x.T).T

    m = M()
    x = torch.randn(3, 24, dtype=F64)
    ep = torch.export.export(m, (x,), strict=False)
    assert any("spmm" in str(node.target) for node in ep.graph.nodes)
    torch.testing.assert_close(ep.module()(x), m(x))

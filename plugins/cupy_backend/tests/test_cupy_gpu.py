"""CuPy on the GPU beyond the conformance kit: the descriptors are made once and re-used, the
DLPack hand-off copies nothing, torch's current stream is honoured, the eigsh (Lanczos) and
lstsq (LSMR) plans against dense references, ILU(0) and Jacobi preconditioners, CGS, gradients
through preconditioned solves. Every test skips without CUDA and CuPy."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.backend import OperandInfo, Request
from sparsetorch.format import COO, CSC, CSR, DIA
from sparsetorch.testing.problems import convection_diffusion, poisson2d, random_rectangular

import sparsetorch_cupy.plugin as plugin
from _cupy_helpers import gpu

pytestmark = gpu


def _offer(A, op, props=("symmetric",), rhs=None, **options):
    info = OperandInfo("sparse", tuple(A.shape), A.dtype, A.device, format=A.format, nse=A.nse,
                       batch_shape=tuple(A.batch_shape))
    ops = (info,) if rhs is None else (info, OperandInfo("dense", tuple(rhs.shape), rhs.dtype, rhs.device))
    req = Request(op, ops, frozenset(props), options)
    offers = [a for a in plugin.sparsetorch_offers(req) if isinstance(a, st.Offer)]
    assert offers, plugin.sparsetorch_offers(req)
    return offers[0], req


@pytest.mark.parametrize("fmt", [CSR, COO, CSC, DIA], ids=lambda f: f.name)
def test_descriptors_made_once_and_reused(cupy_backend, fmt) -> None:
    A = convection_diffusion(7, 6, format=fmt, device="cuda")
    dense = A.to_dense()
    x1, x2 = torch.randn(A.shape[1], 1, dtype=torch.float64, device="cuda"), torch.randn(A.shape[1], 1, dtype=torch.float64, device="cuda")
    offer, req = _offer(A, "matmul")
    plan = offer.build(A.detach(), req)
    plan.set_values(A.values)
    y1 = plan.apply(x1)
    side = plan.matrix._fwd
    handles = (side.spmat.handle, side.vec[0].handle, side.vec[1].handle, side.vec[2].data_ptr())
    y2 = plan.apply(x2)
    assert (side.spmat.handle, side.vec[0].handle, side.vec[1].handle, side.vec[2].data_ptr()) == handles
    torch.testing.assert_close(y1, dense @ x1)
    torch.testing.assert_close(y2, dense @ x2)
    # new values on the same pattern: the same descriptors see them
    plan.set_values(A.values * 3)
    torch.testing.assert_close(plan.apply(x1), 3 * (dense @ x1))
    assert plan.matrix._fwd is side
    # adjoint and several columns
    X = torch.randn(A.shape[0], 3, dtype=torch.float64, device="cuda")
    torch.testing.assert_close(plan.apply(X, adjoint=True), 3 * dense.T @ X)
    assert plan.matrix.converted == (fmt in (DIA, COO))


@pytest.mark.parametrize("fmt", [CSR, CSC], ids=lambda f: f.name)
def test_int64_indices_are_narrowed_once(cupy_backend, fmt) -> None:
    """int64 index buffers go to cuSPARSE as int32 (narrowed once in the plan), same products."""
    A32 = convection_diffusion(9, 7, format=fmt, device="cuda")
    A = st.SparseTensor.from_dense(A32.to_dense(), fmt.replace(index_dtype=torch.int64))
    assert A.index_dtype == torch.int64
    offer, req = _offer(A, "matmul")
    plan = offer.build(A.detach(), req)
    plan.set_values(A.values)
    assert plan.matrix.index_dtype == torch.int32
    X = torch.randn(A.shape[1], 2, dtype=torch.float64, device="cuda")
    torch.testing.assert_close(plan.apply(X), A32.to_dense() @ X)
    torch.testing.assert_close(plan.apply(X, adjoint=True), A32.to_dense().T @ X)


def test_dlpack_hand_off_copies_nothing() -> None:
    from sparsetorch_cupy._cuda import on_torch_stream, to_cupy, to_torch

    t = torch.arange(10, dtype=torch.float64, device="cuda")
    with on_torch_stream(t.device):
        a = to_cupy(t)
        assert a.data.ptr == t.data_ptr()
        back = to_torch(a * 2)
        assert to_torch(a).data_ptr() == t.data_ptr()
    torch.testing.assert_close(back, 2 * t)


def test_runs_on_torchs_current_stream(cupy_backend) -> None:
    A = poisson2d(30, 30, device="cuda")
    x = torch.randn(A.shape[1], dtype=torch.float64, device="cuda")
    ref = A.to_dense() @ x
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        big = x * 1.0  # queued on s; the product must see it without a synchronization
        y = st.matmul(A, big, backend="cupy")
        b = ref.clone()
        xs = st.solve(A, b, backend="cupy", method="cg", rtol=1e-10)
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(xs, x, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("which", ["LA", "SA", "LM"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_eigsh_lanczos_matches_dense(cupy_backend, which, dtype) -> None:
    A = poisson2d(12, 10, dtype=dtype, device="cuda")
    offer, req = _offer(A, "eigsh", k=4, which=which)
    plan = offer.build(A.detach(), req)
    plan.set_values(A.values)
    w, V, info = plan.eigsh(4, which=which)
    ref = torch.linalg.eigvalsh(A.to_dense().double())
    expect = {"LA": ref[-4:], "SA": ref[:4], "LM": ref[ref.abs().argsort()[-4:]].sort().values}[which]
    tol = 1e-8 if dtype == torch.float64 else 1e-3
    torch.testing.assert_close(w.double(), expect, rtol=tol, atol=tol)
    D = A.to_dense().double()
    Vd = V.double()
    torch.testing.assert_close(Vd.T @ Vd, torch.eye(4, dtype=torch.float64, device="cuda"), rtol=0, atol=10 * tol)
    torch.testing.assert_close(D @ Vd, Vd * w.double(), rtol=0, atol=100 * tol)
    assert info.converged and info.iterations > 0


def test_eigsh_value_batch(cupy_backend) -> None:
    A = poisson2d(8, 7, device="cuda")
    vals = torch.stack([A.values, 2 * A.values])
    Ab = A.with_values(vals)
    offer, req = _offer(Ab, "eigsh", k=3, which="LA")
    plan = offer.build(Ab.detach(), req)
    plan.set_values(Ab.values)
    w, V, info = plan.eigsh(3, which="LA")
    ref = torch.linalg.eigvalsh(A.to_dense())[-3:]
    assert w.shape == (2, 3) and V.shape == (2, A.shape[0], 3)
    torch.testing.assert_close(w[0], ref)
    torch.testing.assert_close(w[1], 2 * ref)


@pytest.mark.parametrize("adjoint", [False, True])
def test_lstsq_lsmr_matches_dense(cupy_backend, adjoint) -> None:
    A = random_rectangular(40, 25, density=0.3, device="cuda")
    D = A.to_dense()
    rows = 25 if adjoint else 40
    B = torch.randn(rows, 2, dtype=torch.float64, device="cuda")
    offer, req = _offer(A, "lstsq", props=(), rhs=B, atol=1e-12, btol=1e-12, maxiter=2000)
    plan = offer.build(A.detach(), req)
    plan.set_values(A.values)
    X, info = plan.lstsq(B, adjoint=adjoint)
    ref = torch.linalg.lstsq((D.T if adjoint else D).cpu(), B.cpu(), driver="gelsd").solution.cuda()
    torch.testing.assert_close(X, ref, rtol=1e-6, atol=1e-8)
    assert info.converged


def test_ilu0_preconditioner_reduces_iterations(cupy_backend) -> None:
    A = convection_diffusion(20, 20, convection=2.0, device="cuda")
    b = torch.linspace(0.5, 1.5, A.shape[0], dtype=torch.float64, device="cuda")
    ref = torch.linalg.solve(A.to_dense(), b)
    x0, i0 = st.solve(A, b, backend="cupy", method="gmres", rtol=1e-10, return_info=True)
    x1, i1 = st.solve(A, b, backend="cupy", method="gmres", preconditioner="ilu", rtol=1e-10, return_info=True)
    assert i1.preconditioner == "ilu" and i1.iterations < i0.iterations
    for x in (x0, x1):
        torch.testing.assert_close(x, ref, rtol=1e-7, atol=1e-9)


def test_jacobi_zero_diagonal_raises(cupy_backend) -> None:
    dense = convection_diffusion(4, 3).to_dense()
    dense[2, 2] = 0
    A = st.SparseTensor.from_dense(dense.cuda(), CSR)
    with pytest.raises(st.SingularMatrixError, match=r"A\[2, 2\] is 0"):
        st.solve(A, torch.ones(12, dtype=torch.float64, device="cuda"), backend="cupy", method="gmres",
                 preconditioner="jacobi")


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_cgs_plan_matches_dense(dtype) -> None:
    from sparsetorch_cupy.iterative import KrylovPlan

    A = convection_diffusion(6, 5, dtype=dtype, device="cuda")
    plan = KrylovPlan(A.detach(), "cgs", {"preconditioner": "jacobi"})
    plan.set_values(A.values)
    B = torch.randn(A.shape[0], 2, dtype=dtype, device="cuda")
    X, info = plan.solve(B, options={"rtol": 1e-10})
    torch.testing.assert_close(X, torch.linalg.solve(A.to_dense(), B), rtol=1e-7, atol=1e-9)
    assert info.converged
    Xh, info = plan.solve(B, adjoint=True, options={"rtol": 1e-10})
    torch.testing.assert_close(Xh, torch.linalg.solve(A.to_dense().mH, B), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize(("method", "pre", "kind"), [("gmres", "ilu", "general"), ("cg", "jacobi", "spd"),
                                                     ("minres", "jacobi", "spd")])
def test_gradcheck_preconditioned(cupy_backend, method, pre, kind) -> None:
    A = convection_diffusion(4, 3, device="cuda") if kind == "general" else poisson2d(4, 3, device="cuda")
    v = A.values.detach().clone().requires_grad_()
    b = torch.linspace(0.5, 1.5, 12, dtype=torch.float64, device="cuda").requires_grad_()
    props = None if kind == "general" else "spd"

    def f(values, rhs):
        return st.solve(A.with_values(values), rhs, backend="cupy", method=method, preconditioner=pre, rtol=1e-12,
                        properties=props, cache=False)

    assert torch.autograd.gradcheck(f, (v, b), atol=1e-5, rtol=1e-3)


def test_auto_dispatch_lists_cupy_offer_for_cuda(cupy_backend) -> None:
    A = poisson2d(50, 50, device="cuda")
    x = torch.ones(A.shape[1], dtype=torch.float64, device="cuda")
    table = st.explain("matmul", A, x)
    rows = [r for r in table.rows if r.backend == "cupy"]
    assert rows and rows[0].offer is not None and rows[0].method == "spmm"
    y = st.matmul(A, x)
    torch.testing.assert_close(y, A.to_dense() @ x)

"""Cases 2-4: CG on 2-D Poisson.

2. ``cg_1m``: 1000^2 (1M unknowns, float64) to ``||b - A x|| <= 1e-6 ||b||`` for a smooth
   ``b = A 1`` (torch-sla's benchmark uses it; it flatters CG) and a random ``b``: sparsetorch
   auto, sparsetorch pinned (torch/cg, cupy/cg), plain torch CG, CuPy's own cg, torch-sla 0.4.0
   (``backend="pytorch", method="cg"``; its ``tol`` is ignored, so ``atol = 1e-6 ||b||``).
   Median of ``reps`` solves after one warm-up, with the iteration count and the true residual.
3. ``cg_64m``: 8000^2 (64M unknowns): memory per unknown (peak allocated during the solve, and
   the part above the inputs already held) and time per CG iteration over a fixed number of
   iterations.
4. ``backward_1m``: peak memory of the backward pass over the forward one for 1000 CG
   iterations at 1M unknowns (the adjoint method keeps O(n + nnz); unrolled autograd O(k n)).

CuPy allocates through torch's caching allocator in this suite, so its memory is counted.
"""

from __future__ import annotations

import gc
import statistics
import time
import warnings
from typing import Any, Callable

import torch

import sparsetorch as st
from sparsetorch.format import CSR

from common import cupy_on_torch_allocator, guard, peer, poisson2d_csr

__all__ = ["run_1m", "run_64m", "run_backward"]


def _sync() -> None:
    torch.cuda.synchronize()


def _timed(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    out = fn()  # warm-up (plans, calibration, compilation)
    times = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        out = fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _csr_torch(crow, col, vals, n):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.sparse_csr_tensor(crow, col, vals, (n, n))


def plain_cg(A, b: torch.Tensor, rtol: float, maxiter: int) -> tuple[torch.Tensor, int]:
    """Textbook CG with torch's CSR product; one convergence check (host sync) per iteration."""
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = torch.dot(r, r)
    stop = float((rtol * torch.linalg.vector_norm(b)) ** 2)
    it = 0
    while it < maxiter and float(rr) > stop:
        Ap = A @ p
        alpha = rr / torch.dot(p, Ap)
        x += alpha * p
        r -= alpha * Ap
        rr_new = torch.dot(r, r)
        p = r + (rr_new / rr) * p
        rr = rr_new
        it += 1
    return x, it


def _rel(A, x, b) -> float:
    return float(torch.linalg.vector_norm(b - A @ x) / torch.linalg.vector_norm(b))


def run_1m(ctx: dict, *, m: int = 1000, rtol: float = 1e-6, reps: int = 3) -> dict:
    n = m * m
    crow, col, vals = poisson2d_csr(m)
    A = st.SparseTensor(CSR, (n, n), [None, crow], [None, col], vals, check=False)
    T = _csr_torch(crow, col, vals, n)
    maxiter = 20 * m + 1000
    tsla, tsla_ver = peer("torch_sla")
    cp, _ = peer("cupy")
    rows_i = torch.repeat_interleave(torch.arange(n, device="cuda"), crow[1:] - crow[:-1])
    g = torch.Generator(device="cuda").manual_seed(1)
    rhs = {"A@ones": T @ torch.ones(n, dtype=torch.float64, device="cuda"),
           "random": torch.randn(n, dtype=torch.float64, device="cuda", generator=g)}
    out: dict[str, Any] = {"problem": {"grid": f"{m}^2", "unknowns": n, "nnz": int(col.numel()), "dtype": "float64",
                                       "rtol": rtol, "maxiter": maxiter, "reps": reps}, "rows": []}
    for name, b in rhs.items():
        bnorm = float(torch.linalg.vector_norm(b))

        def sparsetorch_row(label: str, **kw: Any) -> dict:
            t, (x, info) = _timed(lambda: st.solve(A, b, rtol=rtol, maxiter=maxiter, return_info=True, **kw), reps)
            row = {"seconds": t, "iterations": info.iterations, "residual": _rel(T, x, b),
                   "choice": f"{info.backend}/{info.method}", "preconditioner": info.preconditioner}
            if not kw:
                row["explain"] = str(st.explain("solve", A, b, rtol=rtol, maxiter=maxiter))
            return row

        impls: dict[str, Callable[[], dict]] = {
            "sparsetorch auto": lambda: sparsetorch_row("auto"),
            "sparsetorch torch/cg": lambda: sparsetorch_row("torch", backend="torch", method="cg"),
            "sparsetorch torch/cg (no CUDA graph)": lambda: sparsetorch_row(
                "torch", backend="torch", method="cg", backend_options={"cuda_graph": False}),
            "sparsetorch torch/cg+jacobi": lambda: sparsetorch_row("torch", backend="torch", method="cg",
                                                                   preconditioner="jacobi"),
            "sparsetorch cuda/cg": lambda: sparsetorch_row("cuda", backend="cuda", method="cg"),
            "sparsetorch cuda/cg+jacobi": lambda: sparsetorch_row("cuda", backend="cuda", method="cg", preconditioner="jacobi"),
            "sparsetorch cupy/cg": lambda: sparsetorch_row("cupy", backend="cupy", method="cg"),
            "sparsetorch cupy/cg+jacobi": lambda: sparsetorch_row("cupy", backend="cupy", method="cg", preconditioner="jacobi"),
        }

        def plain() -> dict:
            t, (x, it) = _timed(lambda: plain_cg(T, b, rtol, maxiter), reps)
            return {"seconds": t, "iterations": it, "residual": _rel(T, x, b)}

        impls["plain torch CG"] = plain
        if cp is not None:
            def cupy_cg() -> dict:
                import inspect

                import cupyx.scipy.sparse as csp
                from cupyx.scipy.sparse.linalg import cg

                Ac = csp.csr_matrix((cp.from_dlpack(vals), cp.from_dlpack(col.to(torch.int32)),
                                     cp.from_dlpack(crow.to(torch.int32))), shape=(n, n))
                bc = cp.from_dlpack(b)
                key = "rtol" if "rtol" in inspect.signature(cg).parameters else "tol"
                count = [0]

                def solve():
                    count[0] = 0
                    x, _ = cg(Ac, bc, **{key: 0.0}, atol=rtol * bnorm, maxiter=maxiter,
                              callback=lambda xk: count.__setitem__(0, count[0] + 1))
                    return torch.from_dlpack(x)

                t, x = _timed(solve, reps)
                return {"seconds": t, "iterations": count[0], "residual": _rel(T, x, b),
                        "note": "cupyx.scipy.sparse.linalg.cg on a CuPy CSR (its own fast matvec)"}

            impls["cupy cg (cupyx, raw)"] = cupy_cg
        if tsla is not None:
            def torch_sla() -> dict:
                fn = lambda: tsla.spsolve(vals, rows_i, col, (n, n), b, backend="pytorch", method="cg",  # noqa: E731
                                          atol=rtol * bnorm, maxiter=maxiter)
                t, x = _timed(fn, reps)
                return {"seconds": t, "iterations": None, "residual": _rel(T, x, b),
                        "note": "torch-sla reports no iteration count; tol is ignored by its CG, atol = rtol * ||b||"}

            impls["torch-sla 0.4.0 cg"] = torch_sla
        else:
            out["rows"].append({"rhs": name, "impl": "torch-sla", "skipped": tsla_ver})
        for impl, fn in impls.items():
            row = {"rhs": name, "impl": impl, **guard(fn)}
            out["rows"].append(row)
            st.plan_cache().clear()
            print(f"cg_1m {name:7s} {impl:28s} " + (f"{row['seconds']:.3f} s  it {row['iterations']}  res {row['residual']:.1e}"
                                                     if "seconds" in row else row.get("error", "")), flush=True)
    return out


def _memory_run(fn: Callable[[], Any], n: int, iters: int) -> dict:
    gc.collect()
    torch.cuda.empty_cache()
    _sync()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    fn()
    _sync()
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated()
    return {"inputs_bytes": base, "peak_bytes": peak, "extra_bytes": peak - base, "bytes_per_unknown": peak / n,
            "extra_bytes_per_unknown": (peak - base) / n, "seconds": dt, "iterations": iters,
            "seconds_per_iteration": dt / iters}


def run_64m(ctx: dict, *, m: int = 8000, iters: int = 100) -> dict:
    """Memory per unknown and time per CG iteration at m^2 unknowns (no preconditioner anywhere)."""
    with cupy_on_torch_allocator():
        return _run_64m(m, iters)


def _run_64m(m: int, iters: int) -> dict:
    n = m * m
    out: dict[str, Any] = {"problem": {"grid": f"{m}^2", "unknowns": n, "iterations": iters, "dtype": "float64",
                                       "note": "fixed iteration count (rtol 1e-30), one warm-up run of 5 iterations first"},
                           "rows": []}
    tsla, tsla_ver = peer("torch_sla")
    crow, col, vals = poisson2d_csr(m)
    out["problem"]["nnz"] = int(col.numel())
    b = torch.ones(n, dtype=torch.float64, device="cuda")
    held = {"A": st.SparseTensor(CSR, (n, n), [None, crow], [None, col], vals, check=False)}
    for backend, graph in (("cuda", True), ("torch", True), ("torch", False), ("cupy", True)):
        def solve(k, backend=backend, graph=graph):
            return st.solve(held["A"], b, backend=backend, method="cg", preconditioner="none", rtol=1e-30, maxiter=k,
                            on_nonconvergence="ignore", properties="spd",
                            backend_options=None if graph else {"cuda_graph": False})

        def one(backend=backend, solve=solve) -> dict:
            solve(5)
            return _memory_run(lambda: solve(iters), n, iters)

        row = {"impl": f"sparsetorch {backend}/cg" + ("" if graph else " (no CUDA graph)"), **guard(one)}
        st.plan_cache().clear()  # the cached plan holds this backend's buffers
        out["rows"].append(row)
        print(f"cg_64m {row['impl']:24s} " + (f"{row['peak_bytes'] / 1e9:.2f} GB peak, {row['seconds_per_iteration'] * 1e3:.2f} ms/it"
                                               if "peak_bytes" in row else row.get("error", "")), flush=True)
    held["T"] = _csr_torch(crow, col, vals, n)

    def plain() -> dict:
        plain_cg(held["T"], b, 1e-30, 5)
        return _memory_run(lambda: plain_cg(held["T"], b, 1e-30, iters), n, iters)

    out["rows"].append({"impl": "plain torch CG", **guard(plain)})
    held.clear()
    if tsla is not None:
        rows_i = torch.repeat_interleave(torch.arange(n, device="cuda"), crow[1:] - crow[:-1])
        del crow
        gc.collect()
        torch.cuda.empty_cache()

        def sla() -> dict:
            tsla.spsolve(vals, rows_i, col, (n, n), b, backend="pytorch", method="cg", atol=1e-300, maxiter=5)
            return _memory_run(lambda: tsla.spsolve(vals, rows_i, col, (n, n), b, backend="pytorch", method="cg",
                                                    atol=1e-300, maxiter=iters), n, iters)

        out["rows"].append({"impl": "torch-sla 0.4.0 cg", **guard(sla)})
        del rows_i
    else:
        out["rows"].append({"impl": "torch-sla", "skipped": tsla_ver})
    for row in out["rows"][-2:]:
        print(f"cg_64m {row['impl']:24s} " + (f"{row['peak_bytes'] / 1e9:.2f} GB peak, {row['seconds_per_iteration'] * 1e3:.2f} ms/it"
                                               if "peak_bytes" in row else row.get("error", row.get("skipped", ""))), flush=True)
    gc.collect()
    torch.cuda.empty_cache()
    return out


def run_backward(ctx: dict, *, m: int = 1000, iters: int = 1000) -> dict:
    """Peak memory of forward and of backward, each above what was allocated before the forward."""
    with cupy_on_torch_allocator():
        return _run_backward(m, iters)


def _run_backward(m: int, iters: int) -> dict:
    n = m * m
    crow, col, vals = poisson2d_csr(m)
    A = st.SparseTensor(CSR, (n, n), [None, crow], [None, col], vals, check=False)
    rows_i = torch.repeat_interleave(torch.arange(n, device="cuda"), crow[1:] - crow[:-1])
    g = torch.Generator(device="cuda").manual_seed(2)
    b0 = torch.randn(n, dtype=torch.float64, device="cuda", generator=g)
    tsla, tsla_ver = peer("torch_sla")
    out: dict[str, Any] = {"problem": {"grid": f"{m}^2", "unknowns": n, "nnz": int(col.numel()), "iterations": iters,
                                       "loss": "sum(x^2)", "note": "peaks are above the memory allocated before the forward "
                                       "call (matrix, b, values with requires_grad)"}, "rows": []}

    def measure(forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> dict:
        v = vals.clone().requires_grad_(True)
        b = b0.clone().requires_grad_(True)
        gc.collect()
        torch.cuda.empty_cache()
        _sync()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        x = forward(v, b)
        _sync()
        t_fwd = time.perf_counter() - t0
        fwd = torch.cuda.max_memory_allocated() - base
        held = torch.cuda.memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        x.square().sum().backward()
        _sync()
        t_bwd = time.perf_counter() - t0
        bwd = torch.cuda.max_memory_allocated() - base
        ok = v.grad is not None and bool(torch.isfinite(v.grad).all()) and b.grad is not None
        return {"forward_peak_bytes": fwd, "graph_held_bytes": held, "backward_peak_bytes": bwd,
                "backward_over_forward": bwd / fwd if fwd else None, "forward_s": t_fwd, "backward_s": t_bwd,
                "gradients_finite": ok}

    for backend in ("cuda", "torch", "cupy"):
        def fwd(v, b, backend=backend):
            return st.solve(A.with_values(v), b, backend=backend, method="cg", preconditioner="none", rtol=1e-30,
                            maxiter=iters, on_nonconvergence="ignore", properties="spd")

        row = {"impl": f"sparsetorch {backend}/cg (adjoint)", **guard(lambda fwd=fwd: measure(fwd))}
        st.plan_cache().clear()
        out["rows"].append(row)
    if tsla is not None:
        def fwd_sla(v, b):
            return tsla.spsolve(v, rows_i, col, (n, n), b, backend="pytorch", method="cg", atol=1e-300, maxiter=iters)

        out["rows"].append({"impl": "torch-sla 0.4.0 cg", **guard(lambda: measure(fwd_sla))})
    else:
        out["rows"].append({"impl": "torch-sla", "skipped": tsla_ver})
    for row in out["rows"]:
        print(f"backward {row['impl']:32s} " + (f"fwd {row['forward_peak_bytes'] / 1e6:.0f} MB, bwd {row['backward_peak_bytes'] / 1e6:.0f} MB"
                                                 if "forward_peak_bytes" in row else row.get("error", row.get("skipped", ""))), flush=True)
    return out

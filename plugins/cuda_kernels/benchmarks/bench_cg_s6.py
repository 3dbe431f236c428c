"""Issue 16 items 6-7 (session 6): the cuda backend's fused CG against the other CGs, side by side.

Cases (``--cases``, comma separated):

- ``cg_1m``: the GPU suite's case (benchmarks/gpu/cg.py): 2-D Poisson 1000^2, float64, int64 CSR
  as the suite builds it, ``||b - A x|| <= 1e-6 ||b||``, a smooth ``b = A 1`` and a random ``b``
  (seed 1): sparsetorch auto, cuda/cg (with and without Jacobi), torch/cg (CUDA graphs), the plan
  called directly, plain torch CG, CuPy's cg when CuPy is there. Median of ``--reps`` solves after
  one warm-up; iterations, the true residual, microseconds per iteration.
- ``per_iteration``: time per iteration over a fixed count (``rtol = 0``) for CSR int32, DIA,
  Jacobi with a varying diagonal (on Poisson's constant diagonal Jacobi is skipped, see
  krylov.py), and the torch backend's CG, each with its bytes floor (bytes per iteration over the
  copy bandwidth measured in this run).
- ``memory``: peak memory above the inputs per unknown, 1000^2 and 8000^2 (int32 CSR input):
  cuda/cg through ``st.solve`` and through the plan, torch/cg, plain torch CG.
- ``big``: a 2-D Poisson system in DIA (5 diagonals, no index arrays) of ``--big-m``^2 unknowns,
  ``--big-iters`` iterations, float64: peak memory, time per iteration against the bytes floor;
  through the plan, then through ``st.solve``.

Writes one JSON (``--out``) with the machine, versions and command.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import sparsetorch as st  # noqa: E402
from sparsetorch.format import CSR, DIA  # noqa: E402

from sparsetorch_cuda import krylov  # noqa: E402

from common import copy_bandwidth, poisson2d_csr  # noqa: E402


def _sync() -> None:
    torch.cuda.synchronize()


def guard(fn: Callable[[], dict]) -> dict:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - recorded in the JSON
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}"[:600]}
    finally:
        gc.collect()
        torch.cuda.empty_cache()


def timed(fn: Callable[[], Any], reps: int) -> tuple[float, list[float], Any]:
    out = fn()
    times = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        out = fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, out


def rel_res(T, x, b) -> float:
    return float(torch.linalg.vector_norm(b - T @ x) / torch.linalg.vector_norm(b))


def plain_cg(A, b: torch.Tensor, rtol: float, maxiter: int) -> tuple[torch.Tensor, int]:
    """The suite's textbook CG (benchmarks/gpu/cg.py): torch's CSR product, a host check per iteration."""
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


def torch_csr(crow, col, vals, n):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.sparse_csr_tensor(crow, col, vals, (n, n))


def poisson_dia(m: int, dtype=torch.float64, diag: float = 4.0) -> st.SparseTensor:
    """The 5-point Laplacian on an m^2 grid as DIA (offsets -m, -1, 0, 1, m; values by row),
    built one diagonal at a time (no temporaries of the matrix's size)."""
    n = m * m
    vals = torch.empty(5 * n, dtype=dtype, device="cuda")
    d = vals.view(5, m, m)  # diagonal, grid row, grid column of the matrix row
    d[0].fill_(-1.0)
    d[0][0].zero_()  # A[i, i - m]: none in the first grid row
    d[1].fill_(-1.0)
    d[1][:, 0].zero_()  # A[i, i - 1]: none in the first grid column
    d[2].fill_(diag)
    d[3].fill_(-1.0)
    d[3][:, m - 1].zero_()
    d[4].fill_(-1.0)
    d[4][m - 1].zero_()
    offs = torch.tensor([-m, -1, 0, 1, m], dtype=torch.int64, device="cuda")
    pos = torch.tensor([0, 5], dtype=torch.int64, device="cuda")
    return st.SparseTensor(DIA, (n, n), [pos, None], [offs, None], vals, check=False)


def dia_residual(A: st.SparseTensor, x: torch.Tensor, b: torch.Tensor) -> float:
    """||b - A x|| / ||b|| for a DIA matrix by torch ops (one diagonal at a time: two temporaries of size n),
    independent of the kernels under test."""
    n = x.numel()
    offs = A.crd(0).tolist()
    v = A.values.view(len(offs), n)
    y = v[offs.index(0)] * x
    for d, o in enumerate(offs):
        if o > 0:
            y[:-o] += v[d][:-o] * x[o:]
        elif o < 0:
            y[-o:] += v[d][-o:] * x[:o]
    y.sub_(b)
    return float(torch.linalg.vector_norm(y) / torch.linalg.vector_norm(b))


# cg_1m --------------------------------------------------------------------------------------------------
def case_cg_1m(out: dict, m: int, reps: int) -> None:
    n = m * m
    rtol = 1e-6
    maxiter = 20 * m + 1000
    crow, col, vals = poisson2d_csr(m)
    A = st.SparseTensor(CSR, (n, n), [None, crow], [None, col], vals, check=False)
    T = torch_csr(crow, col, vals, n)
    g = torch.Generator(device="cuda").manual_seed(1)
    rhs = {"A@ones": T @ torch.ones(n, dtype=torch.float64, device="cuda"),
           "random": torch.randn(n, dtype=torch.float64, device="cuda", generator=g)}
    try:
        import cupy as cp
    except Exception:  # noqa: BLE001
        cp = None
    res: dict[str, Any] = {"problem": {"grid": f"{m}^2", "unknowns": n, "nnz": int(col.numel()), "dtype": "float64",
                                       "index": "int64 CSR (as the suite builds it)", "rtol": rtol, "maxiter": maxiter,
                                       "reps": reps}, "rows": []}
    for name, b in rhs.items():
        def sp_row(**kw: Any) -> dict:
            t, ts, (x, info) = timed(lambda: st.solve(A, b, rtol=rtol, maxiter=maxiter, return_info=True, **kw), reps)
            return {"seconds": t, "all_seconds": ts, "iterations": info.iterations, "residual": rel_res(T, x, b),
                    "choice": f"{info.backend}/{info.method}", "preconditioner": info.preconditioner,
                    "us_per_iteration": 1e6 * t / max(info.iterations, 1)}

        def plan_row(pre: str | None) -> dict:
            plan = krylov.CudaCGPlan(A, preconditioner=pre)
            plan.set_values(A.values)
            B = b.reshape(n, 1)
            t, ts, (x, info) = timed(lambda: plan.solve(B, options={"rtol": rtol, "maxiter": maxiter}), reps)
            return {"seconds": t, "all_seconds": ts, "iterations": info.iterations, "residual": rel_res(T, x[:, 0], b),
                    "us_per_iteration": 1e6 * t / max(info.iterations, 1), "jacobi_constant": plan.jacobi_constant}

        def plain() -> dict:
            t, ts, (x, it) = timed(lambda: plain_cg(T, b, rtol, maxiter), reps)
            return {"seconds": t, "all_seconds": ts, "iterations": it, "residual": rel_res(T, x, b),
                    "us_per_iteration": 1e6 * t / max(it, 1)}

        impls: dict[str, Callable[[], dict]] = {
            "sparsetorch auto": lambda: sp_row(),
            "sparsetorch cuda/cg": lambda: sp_row(backend="cuda", method="cg", preconditioner=None),
            "sparsetorch cuda/cg+jacobi": lambda: sp_row(backend="cuda", method="cg", preconditioner="jacobi"),
            "cuda CudaCGPlan.solve (no dispatch)": lambda: plan_row(None),
            "sparsetorch torch/cg": lambda: sp_row(backend="torch", method="cg"),
            "sparsetorch torch/cg+jacobi": lambda: sp_row(backend="torch", method="cg", preconditioner="jacobi"),
            "plain torch CG": plain,
        }
        if cp is not None:
            def cupy_cg() -> dict:
                import inspect

                import cupyx.scipy.sparse as csp
                from cupyx.scipy.sparse.linalg import cg

                Ac = csp.csr_matrix((cp.from_dlpack(vals), cp.from_dlpack(col.to(torch.int32)),
                                     cp.from_dlpack(crow.to(torch.int32))), shape=(n, n))
                bc = cp.from_dlpack(b)
                bnorm = float(torch.linalg.vector_norm(b))
                key = "rtol" if "rtol" in inspect.signature(cg).parameters else "tol"
                count = [0]

                def solve():
                    count[0] = 0
                    x, _ = cg(Ac, bc, **{key: 0.0}, atol=rtol * bnorm, maxiter=maxiter,
                              callback=lambda xk: count.__setitem__(0, count[0] + 1))
                    return torch.from_dlpack(x)

                t, ts, x = timed(solve, reps)
                return {"seconds": t, "all_seconds": ts, "iterations": count[0], "residual": rel_res(T, x, b),
                        "us_per_iteration": 1e6 * t / max(count[0], 1), "version": cp.__version__,
                        "note": "cupyx.scipy.sparse.linalg.cg on a CuPy int32 CSR"}

            impls["cupy cg (cupyx, raw)"] = cupy_cg
        for impl, fn in impls.items():
            row = {"rhs": name, "impl": impl, **guard(fn)}
            st.plan_cache().clear()
            res["rows"].append(row)
            print(f"cg_1m {name:7s} {impl:38s} " + (f"{row['seconds'] * 1e3:8.1f} ms  it {row['iterations']:5d}  "
                                                     f"{row['us_per_iteration']:6.1f} us/it  res {row['residual']:.1e}  "
                                                     f"{row.get('choice', '')}" if "seconds" in row else row["error"]),
                  flush=True)
    out["cg_1m"] = res


# per_iteration ------------------------------------------------------------------------------------------
def case_per_iteration(out: dict, m: int, iters: int, bw: float) -> None:
    n = m * m
    crow, col, vals = poisson2d_csr(m)
    crow32, col32 = crow.to(torch.int32), col.to(torch.int32)
    nnz = int(col.numel())
    del crow, col
    A32 = st.SparseTensor(CSR, (n, n), [None, crow32], [None, col32], vals, check=False)
    g = torch.Generator(device="cuda").manual_seed(7)
    wobble = vals.clone()
    diag = (col32.to(torch.int64) == torch.repeat_interleave(torch.arange(n, device="cuda"),
                                                              (crow32[1:] - crow32[:-1]).to(torch.int64)))
    wobble[diag] += torch.rand(n, dtype=torch.float64, device="cuda", generator=g)  # a varying diagonal (still SPD)
    Aw = A32.with_values(wobble)
    Ad = poisson_dia(m)
    dw = Ad.values.clone()
    dw[2 * n:3 * n] += torch.rand(n, dtype=torch.float64, device="cuda", generator=g)
    Adw = Ad.with_values(dw)
    b = torch.ones(n, 1, dtype=torch.float64, device="cuda")
    res: dict[str, Any] = {"problem": {"grid": f"{m}^2", "unknowns": n, "nnz": nnz, "iterations": iters,
                                       "how": "plan.solve with rtol = 0 (a fixed count), best of 3 after a warm-up; "
                                              "seconds / iterations, host polls included",
                                       "floor": "bytes per iteration of the 3-kernel schedule (krylov.bytes_per_iteration) / "
                                                "copy bandwidth of this run"}, "rows": []}
    csr_bytes = nnz * 12 + (n + 1) * 4

    def plan_case(A, pre, matrix_bytes: int) -> dict:
        plan = krylov.CudaCGPlan(A, preconditioner=pre)
        plan.set_values(A.values)
        jac = pre == "jacobi" and not plan.jacobi_constant
        fn = lambda: plan.solve(b, options={"rtol": 0.0, "maxiter": iters})  # noqa: E731
        fn()
        best = math.inf
        for _ in range(3):
            _sync()
            t0 = time.perf_counter()
            _, info = fn()
            _sync()
            best = min(best, time.perf_counter() - t0)
        assert info.iterations == iters, info
        nbytes = krylov.bytes_per_iteration(n, matrix_bytes, 8, jac)
        per = best / iters
        return {"us_per_iteration": per * 1e6, "bytes_per_iteration": nbytes, "floor_us": nbytes / bw * 1e6,
                "fraction_of_floor": nbytes / bw / per, "time_over_floor": per / (nbytes / bw), "kernels_per_iteration": 3,
                "jacobi_kernels": jac}

    def torch_case() -> dict:
        fn = lambda: st.solve(A32, b[:, 0], backend="torch", method="cg", preconditioner=None, rtol=1e-30,  # noqa: E731
                              maxiter=iters, on_nonconvergence="ignore", properties="spd")
        fn()
        best = math.inf
        for _ in range(3):
            _sync()
            t0 = time.perf_counter()
            fn()
            _sync()
            best = min(best, time.perf_counter() - t0)
        st.plan_cache().clear()
        return {"us_per_iteration": best / iters * 1e6, "kernels_per_iteration": 16}

    cases = {
        "cuda fused CG, CSR int32": lambda: plan_case(A32, None, csr_bytes),
        "cuda fused CG, DIA (5 diagonals, no indices)": lambda: plan_case(Ad, None, 5 * n * 8),
        "cuda fused CG + Jacobi, DIA, varying diagonal": lambda: plan_case(Adw, "jacobi", 5 * n * 8),
        "cuda fused CG + Jacobi, CSR int32, varying diagonal": lambda: plan_case(Aw, "jacobi", csr_bytes),
        "cuda fused CG + Jacobi, CSR int32, Poisson (constant diagonal: skipped)": lambda: plan_case(A32, "jacobi", csr_bytes),
        "torch backend CG (CUDA graphs), CSR int32, st.solve": torch_case,
    }
    for name, fn in cases.items():
        row = {"impl": name, **guard(fn)}
        res["rows"].append(row)
        print(f"per_it {name:70s} " + (f"{row['us_per_iteration']:6.1f} us/it" + (
            f"  floor {row['floor_us']:5.1f} us ({row['fraction_of_floor']:.2f} of it)" if "floor_us" in row else "")
            if "us_per_iteration" in row else row["error"]), flush=True)
    out["per_iteration"] = res


# memory -------------------------------------------------------------------------------------------------
def mem_run(fn: Callable[[], Any], n: int) -> dict:
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
    return {"inputs_bytes": base, "peak_bytes": peak, "extra_bytes": peak - base,
            "extra_bytes_per_unknown": (peak - base) / n, "seconds": dt}


def case_memory(out: dict, ms: list[int], iters: int) -> None:
    res: dict[str, Any] = {"how": "peak torch.cuda.max_memory_allocated during one solve of a fixed iteration count, "
                                  "minus what was allocated before it (the matrix as int32 CSR, b, a cached plan); "
                                  "one warm-up solve of 5 iterations first", "rows": []}
    for m in ms:
        n = m * m
        crow, col, vals = poisson2d_csr(m)
        crow, col = crow.to(torch.int32), col.to(torch.int32)
        gc.collect()
        torch.cuda.empty_cache()
        held = {"A": st.SparseTensor(CSR, (n, n), [None, crow], [None, col], vals, check=False)}
        b = torch.ones(n, dtype=torch.float64, device="cuda")

        def sp(backend: str, pre: str | None, k: int) -> Any:
            return st.solve(held["A"], b, backend=backend, method="cg", preconditioner=pre, rtol=1e-30, maxiter=k,
                            on_nonconvergence="ignore", properties="spd")

        def plan_solve(pre: str | None) -> dict:
            B = b.reshape(n, 1)

            def once(k: int) -> bool:
                plan = krylov.CudaCGPlan(held["A"], preconditioner=pre)
                plan.set_values(held["A"].values)
                plan.solve(B, options={"rtol": 0.0, "maxiter": k})
                return plan.keep

            once(5)  # kernels loaded
            r = mem_run(lambda: once(iters), n)
            r["note"] = "plan built, loaded and solved inside the measurement"
            return r

        def via(backend: str, pre: str | None) -> dict:
            sp(backend, pre, 5)  # kernels compiled, rates calibrated
            st.plan_cache().clear()  # the measured call builds its plan: everything it holds counts
            r = mem_run(lambda: sp(backend, pre, iters), n)
            st.plan_cache().clear()
            r["note"] = "first call on an empty plan cache (plan, work buffers, graph, the core's checks)"
            return r

        rows = {
            "cuda/cg via st.solve": lambda: via("cuda", None),
            "cuda/cg+jacobi via st.solve": lambda: via("cuda", "jacobi"),
            "cuda CudaCGPlan.solve": lambda: plan_solve(None),
            "torch/cg via st.solve": lambda: via("torch", None),
        }
        for name, fn in rows.items():
            row = {"grid": f"{m}^2", "unknowns": n, "iterations": iters, "impl": name, **guard(fn)}
            res["rows"].append(row)
            print(f"memory {m}^2 {name:28s} " + (f"{row['extra_bytes_per_unknown']:6.1f} B/unknown extra, "
                                                  f"{row['seconds'] / iters * 1e3:.3f} ms/it" if "extra_bytes" in row else row["error"]),
                  flush=True)
        T = torch_csr(crow, col, vals, n)
        held["T"] = T

        def plain() -> dict:
            plain_cg(held["T"], b, 1e-30, 5)
            return mem_run(lambda: plain_cg(held["T"], b, 1e-30, iters), n)

        row = {"grid": f"{m}^2", "unknowns": n, "iterations": iters, "impl": "plain torch CG", **guard(plain)}
        res["rows"].append(row)
        print(f"memory {m}^2 plain torch CG               " + (f"{row['extra_bytes_per_unknown']:6.1f} B/unknown extra"
                                                              if "extra_bytes" in row else row["error"]), flush=True)
        held.clear()
        del T, crow, col, vals
        gc.collect()
        torch.cuda.empty_cache()
    out["memory"] = res


# big ----------------------------------------------------------------------------------------------------
def case_big(out: dict, m: int, iters: int, bw: float, via_solve: bool) -> None:
    n = m * m
    props = torch.cuda.get_device_properties(0)
    res: dict[str, Any] = {"problem": {"grid": f"{m}^2", "unknowns": n, "format": "DIA, 5 diagonals (values only, no index "
                                       "arrays)", "dtype": "float64", "iterations": iters,
                                       "gpu_memory_bytes": props.total_memory}, "rows": []}
    hold = {"A": poisson_dia(m), "b": torch.ones(n, 1, dtype=torch.float64, device="cuda")}
    A, b = hold["A"], hold["b"]
    _sync()
    inputs = torch.cuda.memory_allocated()
    res["problem"]["inputs_bytes"] = inputs
    nbytes = krylov.bytes_per_iteration(n, 5 * n * 8, 8, False)

    def plan_run() -> dict:
        torch.cuda.reset_peak_memory_stats()
        plan = krylov.CudaCGPlan(A, preconditioner=None)
        plan.set_values(A.values)
        X, info = plan.solve(b, options={"rtol": 0.0, "maxiter": 2})  # warm-up (compile, graph)
        del X
        gc.collect()
        _sync()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        X, info = plan.solve(b, options={"rtol": 0.0, "maxiter": iters, "check_every": 10})
        _sync()
        dt = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated()
        finite = bool(torch.isfinite(X).all())
        true_res = dia_residual(A, X[:, 0], b[:, 0])
        del X
        per = dt / max(info.iterations, 1)
        return {"iterations": info.iterations, "status": info.status.value, "recursive_residual": info.residual,
                "true_residual": true_res, "x_finite": finite, "seconds": dt, "ms_per_iteration": per * 1e3, "bytes_per_iteration": nbytes,
                "floor_ms": nbytes / bw * 1e3, "time_over_floor": per / (nbytes / bw), "peak_bytes": peak,
                "extra_bytes": peak - base, "extra_bytes_per_unknown": (peak - base) / n,
                "peak_fraction_of_gpu": peak / props.total_memory}

    def solve_run() -> dict:
        gc.collect()
        torch.cuda.empty_cache()
        _sync()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        x, info = st.solve(A, b[:, 0], backend="cuda", method="cg", preconditioner=None, rtol=1e-30, maxiter=iters,
                           on_nonconvergence="ignore", properties="spd", return_info=True)
        _sync()
        dt = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated()
        del x
        return {"iterations": info.iterations, "status": info.status.value, "residual": info.residual, "seconds": dt,
                "ms_per_iteration": dt / max(info.iterations, 1) * 1e3, "peak_bytes": peak, "extra_bytes": peak - base,
                "extra_bytes_per_unknown": (peak - base) / n, "note": "first call: includes planning and the core's "
                "residual check"}

    row = {"impl": "cuda CudaCGPlan.solve, DIA", **guard(plan_run)}
    res["rows"].append(row)
    print("big plan", json.dumps(row)[:600], flush=True)
    if via_solve:
        row = {"impl": "st.solve(backend='cuda', method='cg'), DIA", **guard(solve_run)}
        res["rows"].append(row)
        print("big st.solve", json.dumps(row)[:600], flush=True)
    out["big"] = res
    hold.clear()
    gc.collect()
    torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="cg_1m,per_iteration,memory,big")
    ap.add_argument("--m", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--mem-ms", default="1000,8000")
    ap.add_argument("--mem-iters", type=int, default=100)
    ap.add_argument("--big-m", type=int, default=34700)
    ap.add_argument("--big-iters", type=int, default=100)
    ap.add_argument("--no-big-solve", action="store_true")
    ap.add_argument("--commit", default="")
    a = ap.parse_args()
    cases = a.cases.split(",")
    out: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "commit": a.commit,
        "machine": {"gpu": torch.cuda.get_device_name(0), "platform": platform.platform(), "python": platform.python_version()},
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "sparsetorch": getattr(st, "__version__", "?")},
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    try:
        import cupy

        out["versions"]["cupy"] = cupy.__version__
    except Exception as exc:  # noqa: BLE001
        out["versions"]["cupy"] = f"not available ({type(exc).__name__})"
    bw = copy_bandwidth()
    out["copy_bandwidth"] = bw
    print(f"copy bandwidth {bw['bytes_per_s'] / 1e12:.3f} TB/s", flush=True)

    def save() -> None:
        Path(a.out).write_text(json.dumps(out, indent=1, default=str))

    if "cg_1m" in cases:
        case_cg_1m(out, a.m, a.reps)
        save()
    if "per_iteration" in cases:
        case_per_iteration(out, a.m, a.iters, bw["bytes_per_s"])
        save()
    if "memory" in cases:
        case_memory(out, [int(v) for v in a.mem_ms.split(",")], a.mem_iters)
        save()
    if "big" in cases:
        case_big(out, a.big_m, a.big_iters, bw["bytes_per_s"], not a.no_big_solve)
        save()
    save()


if __name__ == "__main__":
    main()

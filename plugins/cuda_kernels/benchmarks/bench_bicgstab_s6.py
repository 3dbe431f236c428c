"""Issue 16 item 6 (session 6): the cuda backend's fused BiCGStab against the other BiCGStabs, side by side.

Problem: 2-D convection-diffusion on the unit square, ``-Laplace(u) + c . grad(u)``, first-order
upwind differences, ``--m``^2 interior points (default 1000^2 = 1M unknowns), scaled by h^2
(centre 4 + h (cx + cy), west -1 - h cx, south -1 - h cy, east / north -1): non-symmetric,
float64, ``||b - A x|| <= 1e-6 ||b||``.

Cases (``--cases``, comma separated):

- ``solve``: a smooth ``b = A 1`` and a random ``b`` (seed 1): the plan called directly (CSR int32,
  DIA), ``st.solve(..., backend="cuda", method="bicgstab")`` (with and without Jacobi; the diagonal
  is constant, so Jacobi is skipped, see krylov.py), ``st.solve(..., backend="torch",
  method="bicgstab")``, sparsetorch auto (no method), CuPy's ``cupyx.scipy.sparse.linalg.bicgstab``
  where CuPy has one. Median of ``--reps`` solves after one warm-up; iterations, the true residual
  (torch's CSR product), time per iteration.
- ``per_iteration``: time per iteration over a fixed count (``rtol = 0``) for CSR int32, DIA, and
  Jacobi with a varying diagonal, each with its bytes floor (krylov.bicgstab_bytes_per_iteration
  over the copy bandwidth measured in this run), and the torch backend's BiCGStab.
- ``kernels``: device time of each of the four kernels (torch.profiler / CUPTI over eager launches,
  ``--iters`` iterations), CSR int32 and DIA, against each kernel's own bytes.
- ``memory``: peak memory above the inputs (the int32 CSR matrix and b) per unknown during one
  solve of 100 iterations: the plan, ``st.solve`` cuda/bicgstab, ``st.solve`` torch/bicgstab.

Writes one JSON (``--out``) with the machine, versions and command.
"""

from __future__ import annotations

import argparse
import gc
import inspect
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

from common import copy_bandwidth  # noqa: E402


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


def convdiff(m: int, c: tuple[float, float], dtype=torch.float64):
    """(crow int64, col int64, values) CSR and the DIA values (offsets -m, -1, 0, 1, m; by row)."""
    n = m * m
    h = 1.0 / (m + 1)
    cx, cy = c
    k = torch.arange(n, device="cuda")
    iy, ix = k // m, k % m
    cols = torch.stack([k - m, k - 1, k, k + 1, k + m], 1)
    valid = torch.stack([iy > 0, ix > 0, torch.ones_like(ix, dtype=torch.bool), ix < m - 1, iy < m - 1], 1)
    coef = torch.tensor([-1.0 - h * cy, -1.0 - h * cx, 4.0 + h * (cx + cy), -1.0, -1.0], dtype=dtype, device="cuda")
    vals = coef.expand(n, 5)
    dia = torch.where(valid, vals, torch.zeros((), dtype=dtype, device="cuda")).T.contiguous().reshape(-1)
    crow = torch.zeros(n + 1, dtype=torch.int64, device="cuda")
    crow[1:] = torch.cumsum(valid.sum(1), 0)
    return crow, cols[valid], vals[valid].contiguous(), dia


def torch_csr(crow, col, vals, n):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.sparse_csr_tensor(crow, col, vals, (n, n))


def rel_res(T, x, b) -> float:
    return float(torch.linalg.vector_norm(b - T @ x) / torch.linalg.vector_norm(b))


def build(m: int, c: tuple[float, float]) -> dict:
    n = m * m
    crow, col, vals, dia = convdiff(m, c)
    crow32, col32 = crow.to(torch.int32), col.to(torch.int32)
    del crow, col
    A32 = st.SparseTensor(CSR, (n, n), [None, crow32], [None, col32], vals, check=False)
    offs = torch.tensor([-m, -1, 0, 1, m], dtype=torch.int64, device="cuda")
    Ad = st.SparseTensor(DIA, (n, n), [torch.tensor([0, 5], device="cuda"), None], [offs, None], dia, check=False)
    return {"n": n, "nnz": int(col32.numel()), "A32": A32, "Ad": Ad, "T": torch_csr(crow32, col32, vals, n),
            "crow32": crow32, "col32": col32, "vals": vals}


# solve --------------------------------------------------------------------------------------------------
def case_solve(out: dict, P: dict, reps: int, rtol: float, maxiter: int) -> None:
    n, A32, Ad, T = P["n"], P["A32"], P["Ad"], P["T"]
    g = torch.Generator(device="cuda").manual_seed(1)
    rhs = {"A@ones": T @ torch.ones(n, dtype=torch.float64, device="cuda"),
           "random": torch.randn(n, dtype=torch.float64, device="cuda", generator=g)}
    try:
        import cupy as cp
        import cupyx.scipy.sparse.linalg as cla
    except Exception:  # noqa: BLE001
        cp = cla = None
    res: dict[str, Any] = {"rows": [], "cupy_bicgstab": bool(cla is not None and hasattr(cla, "bicgstab"))}
    for name, b in rhs.items():
        def sp_row(A=A32, **kw: Any) -> dict:
            t, ts, (x, info) = timed(lambda: st.solve(A, b, rtol=rtol, maxiter=maxiter, return_info=True, **kw), reps)
            return {"seconds": t, "all_seconds": ts, "iterations": info.iterations, "residual": rel_res(T, x, b),
                    "status": str(info.status.value), "choice": f"{info.backend}/{info.method}",
                    "preconditioner": info.preconditioner, "us_per_iteration": 1e6 * t / max(info.iterations, 1)}

        def plan_row(A, pre: str | None) -> dict:
            plan = krylov.CudaBiCGStabPlan(A, preconditioner=pre)
            plan.set_values(A.values)
            B = b.reshape(n, 1)
            t, ts, (x, info) = timed(lambda: plan.solve(B, options={"rtol": rtol, "maxiter": maxiter}), reps)
            return {"seconds": t, "all_seconds": ts, "iterations": info.iterations, "residual": rel_res(T, x[:, 0], b),
                    "status": str(info.status.value), "us_per_iteration": 1e6 * t / max(info.iterations, 1)}

        impls: dict[str, Callable[[], dict]] = {
            "cuda CudaBiCGStabPlan.solve, CSR int32 (no dispatch)": lambda: plan_row(A32, None),
            "cuda CudaBiCGStabPlan.solve, DIA (no dispatch)": lambda: plan_row(Ad, None),
            "sparsetorch cuda/bicgstab, CSR int32": lambda: sp_row(backend="cuda", method="bicgstab"),
            "sparsetorch cuda/bicgstab+jacobi, CSR int32": lambda: sp_row(backend="cuda", method="bicgstab",
                                                                           preconditioner="jacobi"),
            "sparsetorch torch/bicgstab, CSR int32": lambda: sp_row(backend="torch", method="bicgstab"),
            "sparsetorch auto, CSR int32": lambda: sp_row(),
        }
        if cla is not None and hasattr(cla, "bicgstab"):
            def cupy_row() -> dict:
                import cupyx.scipy.sparse as csp

                Ac = csp.csr_matrix((cp.from_dlpack(P["vals"]), cp.from_dlpack(P["col32"]), cp.from_dlpack(P["crow32"])),
                                    shape=(n, n))
                bc = cp.from_dlpack(b)
                bnorm = float(torch.linalg.vector_norm(b))
                params = inspect.signature(cla.bicgstab).parameters
                key = "rtol" if "rtol" in params else "tol"
                count = [0]

                def solve():
                    count[0] = 0
                    x, _ = cla.bicgstab(Ac, bc, **{key: 0.0}, atol=rtol * bnorm, maxiter=maxiter,
                                        callback=lambda xk: count.__setitem__(0, count[0] + 1))
                    return torch.from_dlpack(x)

                t, ts, x = timed(solve, reps)
                return {"seconds": t, "all_seconds": ts, "iterations": count[0], "residual": rel_res(T, x, b),
                        "us_per_iteration": 1e6 * t / max(count[0], 1), "version": cp.__version__,
                        "note": "cupyx.scipy.sparse.linalg.bicgstab on a CuPy int32 CSR (callback counts iterations)"}

            impls["cupy bicgstab (cupyx, raw)"] = cupy_row
        for impl, fn in impls.items():
            row = {"rhs": name, "impl": impl, **guard(fn)}
            st.plan_cache().clear()
            res["rows"].append(row)
            print(f"solve {name:7s} {impl:52s} " + (f"{row['seconds'] * 1e3:8.1f} ms  it {row['iterations']:5d}  "
                                                    f"{row['us_per_iteration']:7.1f} us/it  res {row['residual']:.1e}  "
                                                    f"{row.get('choice', '')} {row.get('status', '')}"
                                                    if "seconds" in row else row["error"]), flush=True)
    out["solve"] = res


# per_iteration ------------------------------------------------------------------------------------------
def case_per_iteration(out: dict, P: dict, iters: int, bw: float, torch_iters: int) -> None:
    n, nnz, A32, Ad = P["n"], P["nnz"], P["A32"], P["Ad"]
    g = torch.Generator(device="cuda").manual_seed(7)
    crow32, col32 = P["crow32"], P["col32"]
    rows = torch.repeat_interleave(torch.arange(n, device="cuda"), (crow32[1:] - crow32[:-1]).to(torch.int64))
    wobble = P["vals"].clone()
    wobble[col32.to(torch.int64) == rows] += torch.rand(n, dtype=torch.float64, device="cuda", generator=g)
    Aw = A32.with_values(wobble)
    dw = Ad.values.clone()
    dw[2 * n:3 * n] += torch.rand(n, dtype=torch.float64, device="cuda", generator=g)
    Adw = Ad.with_values(dw)
    b = torch.ones(n, 1, dtype=torch.float64, device="cuda")
    csr_bytes = nnz * 12 + (n + 1) * 4
    res: dict[str, Any] = {"problem": {"iterations": iters, "how": "plan.solve with rtol = 0 (a fixed count), best of 3 "
                                       "after a warm-up; seconds / iterations, host polls included",
                                       "floor": "bytes per iteration of the 4-kernel schedule "
                                                "(krylov.bicgstab_bytes_per_iteration: the matrix twice + 18 vector passes, "
                                                "21 with Jacobi) / copy bandwidth of this run"}, "rows": []}

    def best_of(fn: Callable[[], Any]) -> tuple[float, Any]:
        fn()
        best, got = math.inf, None
        for _ in range(3):
            _sync()
            t0 = time.perf_counter()
            got = fn()
            _sync()
            best = min(best, time.perf_counter() - t0)
        return best, got

    def plan_case(A, pre, matrix_bytes: int) -> dict:
        plan = krylov.CudaBiCGStabPlan(A, preconditioner=pre)
        plan.set_values(A.values)
        jac = pre == "jacobi" and not plan.jacobi_constant
        best, (_, info) = best_of(lambda: plan.solve(b, options={"rtol": 0.0, "maxiter": iters}))
        nbytes = krylov.bicgstab_bytes_per_iteration(n, matrix_bytes, 8, jac)
        per = best / max(info.iterations, 1)
        return {"us_per_iteration": per * 1e6, "iterations": info.iterations, "status": str(info.status.value),
                "bytes_per_iteration": nbytes, "floor_us": nbytes / bw * 1e6, "fraction_of_floor": nbytes / bw / per,
                "time_over_floor": per / (nbytes / bw), "kernels_per_iteration": 4, "jacobi_kernels": jac}

    def torch_case() -> dict:
        def fn():
            return st.solve(A32, b[:, 0], backend="torch", method="bicgstab", preconditioner=None, rtol=1e-30,
                            maxiter=torch_iters, on_nonconvergence="ignore", return_info=True)

        best, (_, info) = best_of(fn)
        st.plan_cache().clear()
        nbytes = krylov.bicgstab_bytes_per_iteration(n, csr_bytes, 8, False)
        per = best / max(info.iterations, 1)
        return {"us_per_iteration": per * 1e6, "iterations": info.iterations,
                "time_over_floor_of_the_fused_schedule": per / (nbytes / bw)}

    cases = {
        "cuda fused BiCGStab, CSR int32": lambda: plan_case(A32, None, csr_bytes),
        "cuda fused BiCGStab, DIA (5 diagonals, no indices)": lambda: plan_case(Ad, None, 5 * n * 8),
        "cuda fused BiCGStab + Jacobi, CSR int32, varying diagonal": lambda: plan_case(Aw, "jacobi", csr_bytes),
        "cuda fused BiCGStab + Jacobi, DIA, varying diagonal": lambda: plan_case(Adw, "jacobi", 5 * n * 8),
        "torch backend BiCGStab, CSR int32, st.solve": torch_case,
    }
    for name, fn in cases.items():
        row = {"impl": name, **guard(fn)}
        res["rows"].append(row)
        print(f"per_it {name:60s} " + (f"{row['us_per_iteration']:7.1f} us/it it {row['iterations']}" + (
            f"  floor {row['floor_us']:5.1f} us ({row['fraction_of_floor']:.2f} of it)" if "floor_us" in row else "")
            if "us_per_iteration" in row else row["error"]), flush=True)
    out["per_iteration"] = res


# kernels ------------------------------------------------------------------------------------------------
#: vector passes of each kernel (no Jacobi), besides the matrix (K1, K2 read it once each)
_KERNEL_PASSES = {"spmv_v": 3, "spmv_t": 3, "update_xr": 8, "update_p": 4}


def case_kernels(out: dict, P: dict, iters: int, bw: float) -> None:
    from torch.profiler import ProfilerActivity, profile

    n, nnz = P["n"], P["nnz"]
    b = torch.ones(n, 1, dtype=torch.float64, device="cuda")
    res: dict[str, Any] = {"how": f"torch.profiler (CUPTI) device time per launch over {iters} eager iterations "
                                  "(backend_options cuda_graph False), rtol = 0", "rows": []}
    for label, A, mbytes in (("CSR int32", P["A32"], nnz * 12 + (n + 1) * 4), ("DIA", P["Ad"], 5 * n * 8)):
        plan = krylov.CudaBiCGStabPlan(A, preconditioner=None)
        plan.set_values(A.values)
        opts = {"rtol": 0.0, "maxiter": iters, "backend_options": {"cuda_graph": False}}
        plan.solve(b, options=opts)
        _sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            _, info = plan.solve(b, options=opts)
            _sync()
        for ev in prof.key_averages():
            name = ev.key
            if not name.startswith("bicg_"):
                continue
            short = name.replace("bicg_csr_", "").replace("bicg_dia_", "").replace("bicg_", "")
            dev_us = getattr(ev, "device_time", None) or getattr(ev, "cuda_time", 0.0)
            nbytes = _KERNEL_PASSES.get(short, 0) * n * 8 + (mbytes if short.startswith("spmv") else 0)
            row = {"format": label, "kernel": name, "calls": ev.count, "us_per_call": dev_us,
                   "bytes": nbytes, "floor_us": nbytes / bw * 1e6, "iterations": info.iterations}
            res["rows"].append(row)
            print(f"kernel {label:9s} {name:18s} calls {ev.count:5d} {dev_us:7.2f} us  floor {row['floor_us']:6.2f} us",
                  flush=True)
    out["kernels"] = res


# memory -------------------------------------------------------------------------------------------------
def mem_run(fn: Callable[[], Any], n: int) -> dict:
    gc.collect()
    torch.cuda.empty_cache()
    _sync()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    _sync()
    peak = torch.cuda.max_memory_allocated()
    return {"inputs_bytes": base, "peak_bytes": peak, "extra_bytes": peak - base, "extra_bytes_per_unknown": (peak - base) / n}


def case_memory(out: dict, P: dict, iters: int) -> None:
    n, A32 = P["n"], P["A32"]
    b = torch.ones(n, dtype=torch.float64, device="cuda")
    res: dict[str, Any] = {"how": "peak torch.cuda.max_memory_allocated during one solve of a fixed iteration count minus "
                                  "what was allocated before it (the int32 CSR matrix, its DIA twin, the torch CSR used "
                                  "for residuals, b); st.solve rows: the first call on an empty plan cache (plan, work "
                                  "buffers, graph and the core's checks count)", "iterations": iters, "rows": []}

    def plan_solve() -> None:
        plan = krylov.CudaBiCGStabPlan(A32, preconditioner=None)
        plan.set_values(A32.values)
        plan.solve(b.reshape(n, 1), options={"rtol": 0.0, "maxiter": iters})

    def via(backend: str) -> Callable[[], Any]:
        return lambda: st.solve(A32, b, backend=backend, method="bicgstab", preconditioner=None, rtol=1e-30, maxiter=iters,
                                on_nonconvergence="ignore")

    rows = {"cuda CudaBiCGStabPlan.solve": plan_solve, "cuda/bicgstab via st.solve": via("cuda"),
            "torch/bicgstab via st.solve": via("torch")}
    for name, fn in rows.items():
        def one(fn=fn) -> dict:
            fn()  # compiled, calibrated
            st.plan_cache().clear()
            r = mem_run(fn, n)
            st.plan_cache().clear()
            return r

        row = {"impl": name, **guard(one)}
        res["rows"].append(row)
        print(f"memory {name:32s} " + (f"{row['extra_bytes_per_unknown']:6.1f} B/unknown extra" if "extra_bytes" in row
                                       else row["error"]), flush=True)
    out["memory"] = res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="solve,per_iteration,kernels,memory")
    ap.add_argument("--m", type=int, default=1000)
    ap.add_argument("--cx", type=float, default=100.0)
    ap.add_argument("--cy", type=float, default=50.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rtol", type=float, default=1e-6)
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--torch-iters", type=int, default=200)
    ap.add_argument("--mem-iters", type=int, default=100)
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
    P = build(a.m, (a.cx, a.cy))
    n = P["n"]
    out["problem"] = {"what": "2-D convection-diffusion, first-order upwind, unit square, scaled by h^2", "grid": f"{a.m}^2",
                      "unknowns": n, "nnz": P["nnz"], "c": [a.cx, a.cy], "h_times_c": [a.cx / (a.m + 1), a.cy / (a.m + 1)],
                      "dtype": "float64", "rtol": a.rtol, "maxiter": 20 * a.m + 1000, "reps": a.reps,
                      "bytes_floor_per_iteration_csr_int32": krylov.bicgstab_bytes_per_iteration(n, P["nnz"] * 12 + (n + 1) * 4, 8, False),
                      "bytes_floor_per_iteration_dia": krylov.bicgstab_bytes_per_iteration(n, 5 * n * 8, 8, False)}
    out["problem"]["floor_us_csr_int32"] = out["problem"]["bytes_floor_per_iteration_csr_int32"] / bw["bytes_per_s"] * 1e6
    out["problem"]["floor_us_dia"] = out["problem"]["bytes_floor_per_iteration_dia"] / bw["bytes_per_s"] * 1e6
    print(json.dumps(out["problem"]), flush=True)

    def save() -> None:
        Path(a.out).write_text(json.dumps(out, indent=1, default=str))

    if "solve" in cases:
        case_solve(out, P, a.reps, a.rtol, 20 * a.m + 1000)
        save()
    if "per_iteration" in cases:
        case_per_iteration(out, P, a.iters, bw["bytes_per_s"], a.torch_iters)
        save()
    if "kernels" in cases:
        case_kernels(out, P, 200, bw["bytes_per_s"])
        save()
    if "memory" in cases:
        case_memory(out, P, a.mem_iters)
        save()
    save()


if __name__ == "__main__":
    main()

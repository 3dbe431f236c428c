"""cuDSS through sparsetorch vs nvmath-python's DirectSolver (same cuDSS) vs torch-sla, on a GPU.

Problems: 2-D Poisson 1000² (1M unknowns) and 2000² (4M), 3-D Poisson 100³ (1M), SPD, float64.
For each, the phases a training loop pays:

- ``first``: analysis + factorization + solve of a fresh pattern;
- ``repeat``: new values on the same pattern (refactorization) + solve, median of ``--repeats``;
- ``backward``: the backward pass of ``loss = sum(x^2)`` w.r.t. A's values and b (one adjoint
  solve + the gradient on A's pattern);
- ``step``: new values + solve + backward (the training-loop step).

nvmath-python 1.0 ``DirectSolver`` (the raw cuDSS 0.8 path): plan + factorize + solve, then for
repeats the values are written into the same CSR buffers in place and ``factorize`` + ``solve``
run again (nvmath has no backward). torch-sla 0.4.0: ``SparseTensor.solve`` with its cuDSS
backend, then its default GPU path, each recorded with its error if it fails.

Timing: ``torch.cuda.synchronize()`` around host wall-clock time (the phases include host work:
cuDSS's analysis runs mostly on the host). GPU memory: cudaMemGetInfo before/after (cuDSS
allocates outside torch's caching allocator).

Usage (on the GPU machine; libcudss from the nvidia-cudss wheel, SPARSETORCH_CUDSS_LIBRARY to pick one):
    PYTHONPATH=core:plugins/cudss_backend python plugins/cudss_backend/benchmarks/bench_cudss.py \
        --out benchmarks/results/cudss_h200.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import traceback

import torch

import sparsetorch as st



def poisson(shape: tuple[int, ...], device: str) -> st.SparseTensor:
    """-Laplacian, 5-point (2-D) / 7-point (3-D) stencil, Dirichlet, CSR int32, float64."""
    n = math.prod(shape)
    idx = torch.arange(n, device=device).reshape(shape)
    rows, cols, vals = [idx.reshape(-1)], [idx.reshape(-1)], [torch.full((n,), 2.0 * len(shape), dtype=torch.float64, device=device)]
    for axis in range(len(shape)):
        a = idx.narrow(axis, 0, shape[axis] - 1).reshape(-1)
        b = idx.narrow(axis, 1, shape[axis] - 1).reshape(-1)
        for r, c in ((a, b), (b, a)):
            rows.append(r)
            cols.append(c)
            vals.append(torch.full((r.numel(),), -1.0, dtype=torch.float64, device=device))
    r, c, v = torch.cat(rows), torch.cat(cols), torch.cat(vals)
    order = torch.argsort(r * n + c)
    r, c, v = r[order], c[order], v[order]
    crow = torch.zeros(n + 1, dtype=torch.int64, device=device)
    crow[1:] = torch.cumsum(torch.bincount(r, minlength=n), 0)
    t = torch.sparse_csr_tensor(crow.to(torch.int32), c.to(torch.int32), v, (n, n))
    return st.from_package(t)


def sync() -> None:
    torch.cuda.synchronize()


def timed(fn):
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t0, out


def free_mem() -> int:
    return int(torch.cuda.mem_get_info()[0])


def ours(A: st.SparseTensor, b: torch.Tensor, repeats: int, method: str, options: dict) -> dict:
    out: dict = {"method": method, "backend_options": options}
    base = A.values.detach()
    free0 = free_mem()
    solver = st.Solver(A, backend="cudss", method=method, properties="spd", backend_options=options)
    t, x = timed(lambda: solver.solve(b))
    plan = solver._state.plan
    out["first_s"] = t
    out["analysis_host_s"] = plan.analysis_seconds
    out["threading_layer"] = plan._fwd.threading
    out["factor_nnz"] = plan.factor_nnz
    out["memory_estimates"] = plan.memory_estimates
    out["gpu_mem_used_bytes"] = free0 - free_mem()
    ref = torch.linalg.vector_norm(st.matmul(A, x) - b) / torch.linalg.vector_norm(b)
    out["relative_residual"] = float(ref)
    reps, solves_only = [], []
    for i in range(repeats):
        v = base * (1.0 + 0.01 * (i + 1))
        t, _ = timed(lambda: (solver.update_values(v), solver.solve(b))[1])
        reps.append(t)
        t, _ = timed(lambda: solver.solve(b))
        solves_only.append(t)
    out["repeat_s"] = statistics.median(reps)
    out["repeat_all_s"] = reps
    out["solve_only_s"] = statistics.median(solves_only)
    # backward and the whole training-loop step (values and b require grad)
    bw, steps = [], []
    for i in range(repeats):
        v = (base * (1.0 + 0.01 * (i + 1))).requires_grad_(True)
        bb = b.detach().clone().requires_grad_(True)
        sync()
        t0 = time.perf_counter()
        solver.update_values(v)
        x = solver.solve(bb)
        loss = x.square().sum()
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        bw.append(t2 - t1)
        steps.append(t2 - t0)
    out["backward_s"] = statistics.median(bw)
    out["step_s"] = statistics.median(steps)
    out["factorizations"] = plan.factorizations
    out["backward_over_solve"] = out["backward_s"] / out["solve_only_s"]
    solver.close() if hasattr(solver, "close") else None
    return out


def nvmath_direct(A: st.SparseTensor, b: torch.Tensor, repeats: int) -> dict:
    try:
        import nvmath  # noqa: PLC0415
        from nvmath.sparse.advanced import DirectSolver, DirectSolverMatrixType, DirectSolverOptions  # noqa: PLC0415
    except Exception as exc:  # noqa: BLE001
        return {"error": f"nvmath-python not available: {exc!r}"}
    out: dict = {"version": getattr(nvmath, "__version__", "?")}
    try:
        t_csr = A.to_package("torch")
        crow, col = t_csr.crow_indices(), t_csr.col_indices()
        vals = t_csr.values().clone()
        a = torch.sparse_csr_tensor(crow, col, vals, t_csr.shape)
        bb = b.clone()
        opts = DirectSolverOptions(sparse_system_type=DirectSolverMatrixType.SPD)
        t0 = time.perf_counter()
        solver = DirectSolver(a, bb, options=opts)
        sync()
        t_plan, _ = timed(solver.plan)
        t_fac, _ = timed(solver.factorize)
        t_sol, x = timed(solver.solve)
        out.update(first_s=time.perf_counter() - t0, plan_s=t_plan, factorize_s=t_fac, solve_s=t_sol)
        out["relative_residual"] = float(torch.linalg.vector_norm(st.matmul(A, x) - b) / torch.linalg.vector_norm(b))
        reps, facs, sols = [], [], []
        base = vals.clone()
        for i in range(repeats):
            def step():
                a.values().copy_(base * (1.0 + 0.01 * (i + 1)))
                tf, _ = timed(solver.factorize)
                ts, y = timed(solver.solve)
                facs.append(tf)
                sols.append(ts)
                return y
            t, _ = timed(step)
            reps.append(t)
        out.update(repeat_s=statistics.median(reps), repeat_factorize_s=statistics.median(facs),
                   repeat_solve_s=statistics.median(sols))
        solver.free()
    except Exception as exc:  # noqa: BLE001
        out["error"] = f"{type(exc).__name__}: {exc}"[:500]
    return out


def torch_sla(A: st.SparseTensor, b: torch.Tensor, timeout_s: float) -> dict:
    try:
        import torch_sla  # noqa: PLC0415
    except Exception as exc:  # noqa: BLE001
        return {"error": f"torch-sla not available: {exc!r}"}
    out: dict = {"version": getattr(torch_sla, "__version__", "?")}
    t_csr = A.to_package("torch")
    coo = t_csr.to_sparse_coo().coalesce()
    idx, val = coo.indices(), coo.values()
    n = A.shape[-1]
    for backend in ("cudss", None):
        key = backend or "default"
        try:
            S = torch_sla.SparseTensor(val.clone().requires_grad_(True), idx[0], idx[1], (n, n))
            kw = {"backend": backend} if backend else {}
            t, x = timed(lambda: S.solve(b, **kw))
            res = float(torch.linalg.vector_norm(st.matmul(A, x.detach()) - b) / torch.linalg.vector_norm(b))
            tb, _ = timed(lambda: x.square().sum().backward())
            out[key] = {"solve_s": t, "backward_s": tb, "relative_residual": res}
        except Exception as exc:  # noqa: BLE001
            out[key] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        if time.perf_counter() > timeout_s:
            break
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="2d-1000,2d-2000,3d-100")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--methods", default="cholesky")
    ap.add_argument("--peers", default="nvmath,torch-sla")
    ap.add_argument("--out", default="benchmarks/results/cudss_h200.json")
    ap.add_argument("--single-threaded", action="store_true",
                    help="also run ours with host_threads=False (cuDSS's analysis without its OpenMP layer)")
    args = ap.parse_args()
    from sparsetorch.backend import get_backends  # noqa: PLC0415
    from sparsetorch_cudss import _lib, plugin  # noqa: PLC0415

    if "cudss" not in get_backends().names:  # run from a source checkout: register the plugin in-process
        get_backends().register(plugin, "cudss")
    lib = _lib.load()
    record = {
        "command": " ".join(sys.argv),
        "machine": {"gpu": torch.cuda.get_device_name(), "host": platform.node(), "python": platform.python_version(),
                    "torch": torch.__version__, "cuda": torch.version.cuda},
        "cudss": {"version": ".".join(map(str, lib.version)), "path": lib.path},
        "cases": {},
    }
    peers = set(args.peers.split(",")) if args.peers else set()
    for case in args.cases.split(","):
        dim, size = case.split("-")
        shape = (int(size),) * (2 if dim == "2d" else 3)
        A = poisson(shape, "cuda")
        n = A.shape[-1]
        b = torch.randn(n, dtype=torch.float64, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
        entry: dict = {"n": n, "nse": int(A.nse)}
        for method in args.methods.split(","):
            variants = (("default", {}),) if not args.single_threaded else (("default", {}), ("1thread", {"host_threads": False}))
            for opts_name, opts in variants:
                key = f"sparsetorch_{method}" + ("" if opts_name == "default" else f"_{opts_name}")
                try:
                    entry[key] = ours(A, b, args.repeats, method, opts)
                except Exception as exc:  # noqa: BLE001
                    entry[key] = {"error": f"{type(exc).__name__}: {exc}"[:800], "trace": traceback.format_exc()[-1500:]}
                print(case, key, json.dumps(entry[key], default=str)[:900], flush=True)
        torch.cuda.empty_cache()
        if "nvmath" in peers:
            entry["nvmath_directsolver"] = nvmath_direct(A, b, args.repeats)
            print(case, "nvmath", json.dumps(entry["nvmath_directsolver"])[:600], flush=True)
        if "torch-sla" in peers and n <= 1_100_000:
            entry["torch_sla"] = torch_sla(A, b, time.perf_counter() + 120)
            print(case, "torch-sla", json.dumps(entry["torch_sla"])[:600], flush=True)
        record["cases"][case] = entry
        torch.cuda.empty_cache()
        with open(args.out, "w") as fh:
            json.dump(record, fh, indent=1, default=str)
    print("wrote", args.out)


if __name__ == "__main__":
    main()

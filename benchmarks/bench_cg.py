"""CG on 2-D Poisson, side by side: sparsetorch vs plain torch vs torch-sla 0.4.0, plus the
memory the autograd graph holds for 100 and 1000 iterations.

    python benchmarks/bench_cg.py                     # CPU, 1000 x 1000 grid (1M unknowns)
    python benchmarks/bench_cg.py --device cuda       # on a GPU
    python benchmarks/bench_cg.py --n 300 --reps 3    # quicker

Every solve runs to a relative residual of 1e-6 (``||b - A x|| <= 1e-6 ||b||``), reported with
its iteration count and the true final residual, for two right-hand sides: the smooth
``b = A @ 1`` that torch-sla's own benchmark uses (it flatters CG) and a random one. torch-sla's
``tol`` argument is ignored by its CG, so it gets ``atol = 1e-6 * ||b||`` (the same stop).

Graph memory is the bytes of the tensors autograd saves for backward (counted with
``torch.autograd.graph.saved_tensors_hooks``, each storage once), for a fixed number of CG
iterations (rtol 0, maxiter k): the adjoint method keeps O(n + nnz) whatever k; unrolling the
iterations under autograd keeps O(k n). On CUDA the peak allocated memory of forward and of
backward is recorded too.

Writes ``benchmarks/results/cg_<device>.json``. CPU timings on a shared 2-core machine: compare
ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

import sparsetorch as st
from sparsetorch.format import CSR

ROOT = Path(__file__).resolve().parent


def poisson(n: int, device, dtype=torch.float64):
    N = n * n
    k = torch.arange(N, device=device)
    r, c = k // n, k % n
    rows, cols, vals = [k], [k], [torch.full((N,), 4.0, dtype=dtype, device=device)]
    for dr, dc in ((0, 1), (0, -1), (1, 0), (-1, 0)):
        ok = (r + dr >= 0) & (r + dr < n) & (c + dc >= 0) & (c + dc < n)
        rows.append(k[ok])
        cols.append(((r + dr) * n + (c + dc))[ok])
        vals.append(torch.full((int(ok.sum()),), -1.0, dtype=dtype, device=device))
    return st.SparseTensor.from_coo(torch.cat(vals), torch.cat(rows), torch.cat(cols), shape=(N, N), format=CSR)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, reps):
    out = None
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def plain_torch_cg(Acsr, b, rtol, maxiter):
    """Textbook CG with torch's CSR product, one convergence check (host sync) per iteration."""
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = torch.dot(r, r)
    stop = (rtol * torch.linalg.vector_norm(b)) ** 2
    it = 0
    while it < maxiter and rr.item() > stop.item():
        Ap = Acsr @ p
        alpha = rr / torch.dot(p, Ap)
        x += alpha * p
        r -= alpha * Ap
        rr_new = torch.dot(r, r)
        p = r + (rr_new / rr) * p
        rr = rr_new
        it += 1
    return x, it


def rel_res(Acsr, x, b):
    return float(torch.linalg.vector_norm(b - Acsr @ x) / torch.linalg.vector_norm(b))


def saved_bytes(fn):
    """Bytes of tensors saved for backward while running fn (each storage counted once)."""
    seen: dict[int, int] = {}

    def pack(t):
        try:
            key = t.untyped_storage().data_ptr()
            seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        except Exception:  # noqa: BLE001
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(seen.values()), out


def unrolled_cg(Acsr_fn, b, iters):
    """CG written with differentiable torch ops: autograd records every iteration."""
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = torch.dot(r, r)
    for _ in range(iters):
        Ap = Acsr_fn(p)
        alpha = rr / torch.dot(p, Ap)
        x = x + alpha * p
        r = r - alpha * Ap
        rr_new = torch.dot(r, r)
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000, help="grid side (n^2 unknowns)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--rtol", type=float, default=1e-6)
    ap.add_argument("--memory-n", type=int, default=200, help="grid side for the graph-memory part")
    ap.add_argument("--skip-torch-sla", action="store_true")
    args = ap.parse_args()
    device = torch.device(args.device)
    A = poisson(args.n, device)
    N = A.shape[0]
    Acsr = A.to_package("torch")
    maxiter = 20 * args.n + 1000
    cases = []
    try:
        import torch_sla  # noqa: F401

        tsla = None if args.skip_torch_sla else torch_sla
        tsla_version = getattr(torch_sla, "__version__", "?")
    except ImportError:
        tsla, tsla_version = None, None
    coords, vals = A.coordinates()
    g = torch.Generator(device="cpu").manual_seed(0)
    rhs = {
        "A@ones": Acsr @ torch.ones(N, dtype=torch.float64, device=device),
        "random": torch.randn(N, dtype=torch.float64, generator=g).to(device),
    }
    for name, b in rhs.items():
        row = {"rhs": name}
        st.solve(A, b, method="cg", rtol=args.rtol, maxiter=maxiter)  # warm-up (plan, calibration)
        t, (x, info) = timed(lambda: st.solve(A, b, method="cg", rtol=args.rtol, maxiter=maxiter, return_info=True), device, args.reps)
        row["sparsetorch_cg"] = {"seconds": t, "iterations": info.iterations, "residual": rel_res(Acsr, x, b),
                                 "preconditioner": info.preconditioner}
        table = st.explain("solve", A, b, rtol=args.rtol, maxiter=maxiter)
        t, (x, info) = timed(lambda: st.solve(A, b, rtol=args.rtol, maxiter=maxiter, return_info=True), device, args.reps)
        row["sparsetorch_auto"] = {"seconds": t, "iterations": info.iterations, "residual": rel_res(Acsr, x, b),
                                   "choice": f"{info.backend}/{info.method}", "explain": str(table)}
        t, (x, it) = timed(lambda: plain_torch_cg(Acsr, b, args.rtol, maxiter), device, args.reps)
        row["plain_torch_cg"] = {"seconds": t, "iterations": it, "residual": rel_res(Acsr, x, b)}
        if tsla is not None:
            atol = args.rtol * float(torch.linalg.vector_norm(b))
            fn = lambda: tsla.spsolve(vals, coords[0], coords[1], (N, N), b, backend="pytorch", method="cg",  # noqa: E731
                                      atol=atol, maxiter=maxiter)
            fn()
            t, x = timed(fn, device, args.reps)
            row["torch_sla_cg"] = {"seconds": t, "iterations": None, "residual": rel_res(Acsr, x, b),
                                   "note": "torch-sla does not report iterations; atol = rtol * ||b||"}
        ours = row["sparsetorch_cg"]["seconds"]
        row["ratio_plain_torch_over_ours"] = row["plain_torch_cg"]["seconds"] / ours
        if "torch_sla_cg" in row:
            row["ratio_torch_sla_over_ours"] = row["torch_sla_cg"]["seconds"] / ours
        cases.append(row)
        print(f"{name:>8}: ours {ours:.3f}s ({row['sparsetorch_cg']['iterations']} it, res {row['sparsetorch_cg']['residual']:.1e})"
              f" | plain torch {row['plain_torch_cg']['seconds']:.3f}s ({row['plain_torch_cg']['iterations']} it)"
              + (f" | torch-sla {row['torch_sla_cg']['seconds']:.3f}s (res {row['torch_sla_cg']['residual']:.1e})" if "torch_sla_cg" in row else ""),
              flush=True)

    # Graph memory for a fixed iteration count.
    Am = poisson(args.memory_n, device)
    Mcsr = Am.to_package("torch")
    Nm = Am.shape[0]
    memory = []
    for iters in (100, 1000):
        rec = {"iterations": iters, "unknowns": Nm, "nse": Am.nse}
        v = Am.values.clone().requires_grad_(True)
        bm = torch.randn(Nm, dtype=torch.float64, device=device, generator=None).requires_grad_(True)
        A2 = Am.with_values(v)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        nbytes, x = saved_bytes(lambda: st.solve(A2, bm, method="cg", rtol=0.0, atol=1e-300, maxiter=iters,
                                                 on_nonconvergence="ignore", preconditioner="none"))
        if device.type == "cuda":
            fwd_peak = torch.cuda.max_memory_allocated() - base
            torch.cuda.reset_peak_memory_stats()
        (x.square().sum()).backward()
        if device.type == "cuda":
            rec["sparsetorch_forward_peak_bytes"] = fwd_peak
            rec["sparsetorch_backward_peak_bytes"] = torch.cuda.max_memory_allocated() - base
        rec["sparsetorch_graph_bytes"] = nbytes
        vals_m = Am.values.clone().requires_grad_(True)
        crow, col = Mcsr.crow_indices(), Mcsr.col_indices()
        if iters <= 1000:
            nb, xu = saved_bytes(lambda: unrolled_cg(lambda p: torch.sparse_csr_tensor(crow, col, vals_m, (Nm, Nm)) @ p,
                                                      bm.detach().requires_grad_(True), iters))
            rec["unrolled_autograd_graph_bytes"] = nb
            del xu
        rec["bytes_floor_n_plus_nnz"] = (Nm + Am.nse) * 8
        memory.append(rec)
        print(f"graph bytes, {iters} iterations: ours {rec['sparsetorch_graph_bytes'] / 1e6:.2f} MB vs unrolled "
              f"{rec.get('unrolled_autograd_graph_bytes', float('nan')) / 1e6:.1f} MB", flush=True)

    out = {
        "benchmark": "cg_poisson2d",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpu_count": __import__("os").cpu_count(),
                    "torch_threads": torch.get_num_threads(),
                    "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "sparsetorch": st.__version__,
                     "torch_sla": tsla_version},
        "problem": {"grid": args.n, "unknowns": N, "nse": A.nse, "dtype": "float64", "rtol": args.rtol, "maxiter": maxiter},
        "note": "median of --reps runs after a warm-up; CPU runs share 2 cores: compare ratios",
        "cases": cases,
        "graph_memory": memory,
    }
    path = ROOT / "results" / f"cg_{device.type}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

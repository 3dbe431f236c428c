"""Where the time of one torch-backend CG solve goes on the GPU (a diagnostic, not a suite case).

Prints, for 2-D Poisson m^2 (default 1000^2, float64, rtol 1e-6):
- wall time of the solve with and without CUDA graphs, and a plain torch CG loop;
- the kernels of the graph solve (torch.profiler, CUDA activity): count and device time per
  kernel name, and the device-busy fraction of the wall time;
- the device time of the building blocks replayed in a CUDA graph (median of 200 replays of a
  graph of 20 repetitions): the SpMV, three ways of taking an inner product, a vector update.

    python benchmarks/gpu/profile_cg.py [--m 1000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import sparsetorch as st
from sparsetorch.format import CSR

from cg import plain_cg
from common import poisson2d_csr


def graph_time(fn, reps: int = 20, replays: int = 50) -> float:
    """Device seconds per call of fn, captured ``reps`` times in one graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / reps)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=1000)
    ap.add_argument("--json", default=None)
    ap.add_argument("--blocks-only", action="store_true", help="only the building blocks (no solves)")
    args = ap.parse_args()
    m = args.m
    n = m * m
    crow, col, vals = poisson2d_csr(m)
    A = st.SparseTensor(CSR, (n, n), [None, crow], [None, col], vals, check=False)
    T = torch.sparse_csr_tensor(crow.to(torch.int32), col.to(torch.int32), vals, (n, n))
    g = torch.Generator(device="cuda").manual_seed(1)
    b = torch.randn(n, dtype=torch.float64, device="cuda", generator=g)
    out: dict = {"m": m, "n": n}

    def wall(fn, reps=3):
        fn()
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = fn()
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts), r

    for label, bo in (() if args.blocks_only else (("graph", None), ("eager", {"cuda_graph": False}))):
        t, (x, info) = wall(lambda: st.solve(A, b, backend="torch", method="cg", rtol=1e-6, return_info=True,
                                             backend_options=bo, maxiter=30000))
        out[f"torch/cg {label}"] = {"seconds": t, "iterations": info.iterations, "us_per_iteration": 1e6 * t / info.iterations}
        print(f"torch/cg {label}: {t:.3f} s, {info.iterations} it, {1e6 * t / info.iterations:.1f} us/it", flush=True)
    B8 = torch.randn(n, 8, dtype=torch.float64, device="cuda", generator=g)
    for label, bo in (() if args.blocks_only else (("graph", None), ("eager", {"cuda_graph": False}))):
        t, (x, info) = wall(lambda: st.solve(A, B8, backend="torch", method="cg", rtol=1e-6, return_info=True,
                                             backend_options=bo, maxiter=30000))
        out[f"torch/cg 8 columns {label}"] = {"seconds": t, "iterations": info.iterations,
                                              "us_per_iteration": 1e6 * t / info.iterations}
        print(f"torch/cg 8 columns {label}: {t:.3f} s, {info.iterations} it, {1e6 * t / info.iterations:.1f} us/it",
              flush=True)
    if not args.blocks_only:
        solves_and_profile(A, T, b, out, wall)
    blocks_(A, T, n, out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def solves_and_profile(A, T, b, out, wall) -> None:
    t, (x, it) = wall(lambda: plain_cg(T, b, 1e-6, 30000))
    out["plain torch CG"] = {"seconds": t, "iterations": it, "us_per_iteration": 1e6 * t / it}
    print(f"plain torch CG: {t:.3f} s, {it} it, {1e6 * t / it:.1f} us/it", flush=True)

    # kernels of one graph solve
    from torch.profiler import ProfilerActivity, profile

    st.solve(A, b, backend="torch", method="cg", rtol=1e-6)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        _, info = st.solve(A, b, backend="torch", method="cg", rtol=1e-6, return_info=True)
        torch.cuda.synchronize()
        t = time.perf_counter() - t0
    kernels: dict[str, list[float]] = {}
    for ev in prof.events():
        if getattr(ev, "device_type", None) is not None and str(ev.device_type).endswith("CUDA"):
            kernels.setdefault(ev.name[:90], []).append(ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total)
    rows = sorted(((k, len(v), sum(v)) for k, v in kernels.items()), key=lambda r: -r[2])
    busy = sum(r[2] for r in rows) / 1e6
    print(f"profiled graph solve: {t:.3f} s wall (profiler on), {info.iterations} it, device busy {busy:.3f} s", flush=True)
    out["profile"] = {"wall_s": t, "iterations": info.iterations, "device_busy_s": busy,
                      "kernels": [{"name": k, "count": c, "us_total": u, "us_per_iteration": u / info.iterations} for k, c, u in rows[:30]]}
    for k, c, u in rows[:25]:
        print(f"  {u / info.iterations:8.2f} us/it  {c:7d}x  {k}")



def blocks_(A, T, n, out) -> None:
    """Device time of the building blocks, replayed in a graph."""
    p = torch.randn(n, 1, dtype=torch.float64, device="cuda")
    X8 = torch.randn(n, 8, dtype=torch.float64, device="cuda")
    X8c = X8.mT.contiguous().mT  # column-major (n, 8)
    from sparsetorch.backends.torch_native.spmm import TorchSpmmPlan

    tp = TorchSpmmPlan(A)
    tp.set_values(A.values)
    q = torch.randn(n, 1, dtype=torch.float64, device="cuda")
    s11 = torch.ones(1, 1, dtype=torch.float64, device="cuda")
    plan = st.Matmul(A, p)
    blocks = {
        "torch CSR mv (int32)": lambda: T @ p[:, 0],
        "dot via (1,n)@(n,1) mm": lambda: p.mT @ q,
        "dot via torch.dot": lambda: torch.dot(p[:, 0], q[:, 0]),
        "dot via vecdot": lambda: torch.linalg.vecdot(p, q, dim=-2),
        "dot via (p*q).sum": lambda: (p * q).sum(),
        "addcmul (n,1) with (1,1) scalar": lambda: torch.addcmul(p, s11, q),
        "scalar where/div on (1,1)": lambda: s11 / torch.where(s11 == 0, 1.0, s11),
        "SpMM 8 columns, row-major X": lambda: T @ X8,
        "SpMM 8 columns, column-major X": lambda: T @ X8c,
        "8 separate SpMVs": lambda: [T @ X8[:, j] for j in range(8)],
        "sparsetorch torch plan.apply, 8 columns": lambda: tp.apply(X8),
        "sparsetorch Matmul.execute": lambda: plan.execute(),  # last: a failed capture may upset later ones
    }
    out["blocks_us"] = {}
    for k, fn in blocks.items():
        try:
            us = graph_time(fn) * 1e6
            out["blocks_us"][k] = us
            print(f"block {k:36s} {us:8.2f} us", flush=True)
        except Exception as e:  # noqa: BLE001
            out["blocks_us"][k] = f"{type(e).__name__}: {e}"
            print(f"block {k:36s} failed: {e}", flush=True)


if __name__ == "__main__":
    main()

"""Distributed CG over gloo (CPU) or NCCL (GPU): time per iteration, halo volume and memory per
rank, for 1/2/4 processes, against the single-process torch CG (sparsetorch.solve, backend="torch")
on the same device.

    .venv/bin/python benchmarks/bench_distributed.py [--grid 160] [--iters 200] [--procs 1 2 4]
    python benchmarks/bench_distributed.py --device cuda --procs 1 --grid 2000   # one GPU, NCCL

On the GPU every timed solve is bracketed by ``torch.cuda.synchronize()``, each rank uses the GPU
of its local rank, and "cuda_max_allocated_bytes" is the peak of torch's allocator over assembly
and solves (the single process: from the CSR matrix on); the CPU-time figures mean little there.

2-D Poisson (5-point) on a grid x grid mesh, each rank assembling its own contiguous rows; a
random right-hand side; CG without a preconditioner for a fixed number of iterations (rtol 0,
on_nonconvergence="ignore"), best of 3 timed solves after a warm-up, at ``--iters`` and at twice
that: "s_per_iteration" is the time of the solve over its iterations (per-call overhead
included), "s_per_iteration_marginal" the difference of the two over ``--iters`` (the cost of one
more iteration, free of per-call overhead: robust to changes in the dispatch path); "cpu_*" the
same in the calling thread's CPU time (robust to other load on a busy machine; at p > 1 it leaves
out the time spent waiting for peers). "stored bytes" counts every
distinct storage the DSparseTensor holds on the rank after the solves (pattern, halo plan, values,
cached CSR blocks; views counted once); the single-process figure counts the CSR matrix. The
time ratio p=1 / single process is measured ``--runs`` times (each pair: single process, then a
p = 1 launch) and every ratio is recorded. max RSS includes the Python/torch runtime (~300 MB).
On a machine with fewer cores than processes the per-iteration times of p > cores are
oversubscribed: the JSON records the core count.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _device_memory(device: str) -> dict:
    if not device.startswith("cuda"):
        return {}
    return dict(cuda_max_allocated_bytes=int(torch.cuda.max_memory_allocated()),
                cuda_allocated_bytes=int(torch.cuda.memory_allocated()))


def _rank_run(comm, grid: int, iters: int, device: str = "cpu") -> dict:
    import sparsetorch_distributed as sd
    from sparsetorch_distributed.problems import poisson2d_rows

    dev = comm.device if device.startswith("cuda") else torch.device("cpu")
    N = grid * grid
    off = sd.contiguous_offsets(N, comm.size)
    ids = torch.arange(off[comm.rank], off[comm.rank + 1])
    r, c, _ = poisson2d_rows(grid, ids)
    v = torch.where(r == c, 4.0, -1.0).to(torch.float64)
    r, c, v = r.to(dev), c.to(dev), v.to(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    _sync(device)
    t0 = time.perf_counter()
    A = sd.DSparseTensor.from_local_rows(r, c, v, (N, N), comm=comm)
    _sync(device)
    build = time.perf_counter() - t0
    del r, c, v
    b = torch.randn(ids.numel(), generator=torch.Generator().manual_seed(comm.rank), dtype=torch.float64).to(dev)
    kw = dict(method="cg", preconditioner=None, rtol=0.0, on_nonconvergence="ignore", return_info=True, symmetric=True)
    sd.solve(A, b, maxiter=iters, **kw)
    times, cpu = {}, {}
    for m in (iters, 2 * iters):
        best, best_cpu = float("inf"), float("inf")
        for _ in range(3):
            comm.allreduce(torch.zeros(1, device=comm.device))
            _sync(device)
            t, c = time.perf_counter(), time.thread_time()
            _, info = sd.solve(A, b, maxiter=m, **kw)
            _sync(device)
            best, best_cpu = min(best, time.perf_counter() - t), min(best_cpu, time.thread_time() - c)
        times[m] = comm.allreduce(torch.tensor([best], device=comm.device), "max").item()
        cpu[m] = comm.allreduce(torch.tensor([best_cpu], device=comm.device), "max").item()
    worst = times[iters]
    marginal = (times[2 * iters] - times[iters]) / iters
    stored = A.stored_bytes()
    tensors = {k: int(t.numel() * t.element_size()) for k, t in A.storage().items()}
    return dict(rank=comm.rank, n_local=A.n_local, nse_local=A.nse_local, halo=A.halo_volume(), build_s=build,
                solve_s=worst, iterations=iters, s_per_iteration=worst / iters, s_per_iteration_marginal=marginal,
                cpu_s_per_iteration=cpu[iters] / iters, cpu_s_per_iteration_marginal=(cpu[2 * iters] - cpu[iters]) / iters,
                reductions=info.reductions, stored_bytes=stored, stored_tensors=tensors,
                max_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **_device_memory(device))


def _single(grid: int, iters: int, device: str = "cpu") -> dict:
    import sparsetorch as st
    from sparsetorch_distributed.problems import poisson2d_rows

    N = grid * grid
    r, c, _ = poisson2d_rows(grid, torch.arange(N))
    v = torch.where(r == c, 4.0, -1.0).to(torch.float64)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    A = st.SparseTensor.from_coo(v.to(device), r.to(device), c.to(device), shape=(N, N), format=st.format.CSR)
    del r, c, v
    b = torch.randn(N, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(device)
    kw = dict(backend="torch", method="cg", preconditioner=None, rtol=1e-300, on_nonconvergence="ignore",
              return_info=True, properties="spd")
    st.solve(A, b, maxiter=iters, **kw)
    times, cpu = {}, {}
    for m in (iters, 2 * iters):
        best, best_cpu = float("inf"), float("inf")
        for _ in range(3):
            _sync(device)
            t, c = time.perf_counter(), time.thread_time()
            _, info = st.solve(A, b, maxiter=m, **kw)
            _sync(device)
            best, best_cpu = min(best, time.perf_counter() - t), min(best_cpu, time.thread_time() - c)
        times[m], cpu[m] = best, best_cpu
    best = times[iters]
    marginal = (times[2 * iters] - times[iters]) / iters
    stored = sum(x.numel() * x.element_size() for x in (A.pos(1), A.crd(1), A.values) if x is not None)
    return dict(solve_s=best, iterations=iters, s_per_iteration=best / iters, s_per_iteration_marginal=marginal,
                cpu_s_per_iteration=cpu[iters] / iters, cpu_s_per_iteration_marginal=(cpu[2 * iters] - cpu[iters]) / iters,
                stored_bytes=stored, max_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                **_device_memory(device))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", type=int, default=160)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--runs", type=int, default=3, help="independent single/p=1 pairs for the time ratio")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: NCCL, one GPU per rank (ranks <= visible GPUs), the single process on cuda:0")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/distributed_cpu.json (cuda: distributed_cuda.json)")
    args = ap.parse_args()
    if args.out is None:
        args.out = str(ROOT / "benchmarks" / "results" / f"distributed_{args.device}.json")
    backend = "nccl" if args.device == "cuda" else "gloo"
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device is visible")
        too_many = [p for p in args.procs if p > torch.cuda.device_count()]
        if too_many:
            raise SystemExit(f"--device cuda: {too_many} ranks asked for, {torch.cuda.device_count()} GPU(s) visible "
                             "(one GPU per rank)")
    import sparsetorch
    import sparsetorch_distributed as sd
    from sparsetorch_distributed.launch import run_local

    torch.set_num_threads(1)
    env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")])}
    singles, p1s, ratios, marg, cpus = [], [], [], [], []
    if 1 in args.procs:
        # the goal is a ratio: measure it in several independent pairs (single process, then p = 1)
        for i in range(args.runs):
            single = _single(args.grid, args.iters, args.device)
            ranks = run_local(1, "bench_distributed:_rank_run", (args.grid, args.iters, args.device), timeout=600, env=env,
                              backend=backend)
            singles.append(single)
            p1s.append(ranks)
            if args.device == "cuda":
                torch.cuda.empty_cache()
            ratios.append(ranks[0]["s_per_iteration"] / single["s_per_iteration"])
            marg.append(ranks[0]["s_per_iteration_marginal"] / single["s_per_iteration_marginal"])
            cpus.append(ranks[0]["cpu_s_per_iteration"] / single["cpu_s_per_iteration"])
            print(f"run {i}: single-process torch CG {single['s_per_iteration'] * 1e3:.3f} ms/iteration "
                  f"(marginal {single['s_per_iteration_marginal'] * 1e3:.3f}), p=1 {ranks[0]['s_per_iteration'] * 1e3:.3f} "
                  f"(marginal {ranks[0]['s_per_iteration_marginal'] * 1e3:.3f}); ratio {ratios[-1]:.3f}, marginal "
                  f"{marg[-1]:.3f}; CPU-time ratio {cpus[-1]:.3f}")
    else:
        singles.append(_single(args.grid, args.iters, args.device))
    single = min(singles, key=lambda r: r["s_per_iteration"])
    print(f"single process torch CG (best run): {single['s_per_iteration'] * 1e3:.3f} ms/iteration, stored "
          f"{single['stored_bytes'] / 2**20:.2f} MB")
    runs = {}
    for p in args.procs:
        ranks = min(p1s, key=lambda r: r[0]["s_per_iteration"]) if p == 1 else \
            run_local(p, "bench_distributed:_rank_run", (args.grid, args.iters, args.device), timeout=600, env=env,
                      backend=backend)
        runs[str(p)] = ranks
        r0 = ranks[0]
        print(f"p={p}: {r0['s_per_iteration'] * 1e3:.3f} ms/iteration (slowest rank), halo rows received per rank "
              f"{[r['halo']['rows_received'] for r in ranks]}, stored MB per rank "
              f"{[round(r['stored_bytes'] / 2**20, 2) for r in ranks]}")
    out = dict(
        benchmark="bench_distributed", command=" ".join([Path(sys.executable).name] + sys.argv[:1] + sys.argv[1:]),
        machine=dict(platform=platform.platform(), processor=platform.processor(), cpus=os.cpu_count(),
                     load_average_at_end=os.getloadavg(),
                     gpu=torch.cuda.get_device_name(0) if args.device == "cuda" else None),
        versions=dict(python=platform.python_version(), torch=torch.__version__, sparsetorch=sparsetorch.__version__,
                      sparsetorch_distributed=sd.__version__),
        problem=dict(kind="2-D Poisson 5-point", grid=args.grid, N=args.grid ** 2, iterations=args.iters,
                     method="cg", preconditioner=None, backend=backend, device=args.device, threads_per_process=1),
        single_process=single,
        distributed=runs,
        ratio_p1_vs_single=runs["1"][0]["s_per_iteration"] / single["s_per_iteration"] if "1" in runs else None,
        ratio_p1_vs_single_per_run=ratios,
        marginal_ratio_p1_vs_single_per_run=marg,
        cpu_ratio_p1_vs_single_per_run=cpus,
        single_process_s_per_iteration_per_run=[r["s_per_iteration"] for r in singles],
        p1_s_per_iteration_per_run=[r[0]["s_per_iteration"] for r in p1s],
        stored_ratio_p1_vs_single=runs["1"][0]["stored_bytes"] / single["stored_bytes"] if "1" in runs else None,
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    if ratios:
        print(f"p=1 / single-process time per iteration: best {out['ratio_p1_vs_single']:.3f} (best of each), per run "
              f"{[round(r, 3) for r in ratios]}, marginal per run {[round(r, 3) for r in marg]}, CPU time per run "
              f"{[round(r, 3) for r in cpus]}; stored bytes p=1 / single: {out['stored_ratio_p1_vs_single']:.2f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

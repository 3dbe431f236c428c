"""Distributed CG to convergence: weak and strong scaling over GPUs (NCCL) or CPU processes (gloo).

One launch measures one rank count; ``benchmarks/scaling_report.py`` merges launches into the
efficiency table and plot. Run under torchrun (one process per GPU):

    # weak scaling: ~150M unknowns per GPU, 2-D 5-point (or --dim 3, 7-point)
    torchrun --nproc-per-node 4 benchmarks/bench_scaling.py --per-rank 150e6 --dim 2 --tag weak2d
    # strong scaling: 400M unknowns in all
    torchrun --nproc-per-node 8 benchmarks/bench_scaling.py --unknowns 4e8 --dim 2 --tag strong2d
    # one training step at that size (solve + adjoint solve + transposed halo), and the gradient
    # checked against central finite differences on a small replica on the same ranks
    torchrun --nproc-per-node 8 benchmarks/bench_scaling.py --unknowns 4e8 --backward --check-gradients --tag train

``benchmarks/gpu/run_scaling.sh`` runs the whole campaign of issue 19. Each rank assembles its own
contiguous block of grid rows on its device (nothing global exists anywhere), CG (or PCG with
block-Jacobi, ``--preconditioner block_jacobi``) runs to a true relative residual ``--rtol``
(converged, not a fixed count: the solve raises when ``--maxiter`` is reached), with a random
right-hand side. Recorded per launch: unknowns, ranks, iterations, true residual, assembly and
solve seconds, seconds per iteration, halo rows and bytes sent per rank per product, peak device
memory per rank (torch's allocator) and bytes per unknown. JSON under
``benchmarks/results/scaling/`` (``--out``), written by rank 0.

Keep NVLink multicast off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1): the lent multi-GPU machines require it; this script refuses to start
on CUDA with them unset.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
_NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _grid_side(unknowns: float, dim: int) -> int:
    return max(2, int(round(unknowns ** (1.0 / dim))))


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _assemble(sd, comm, m: int, dim: int, dev: torch.device, dtype: torch.dtype, requires_grad: bool):
    from sparsetorch_distributed.problems import stencil_rows

    N = m ** dim
    off = sd.contiguous_offsets(N, comm.size)
    ids = torch.arange(off[comm.rank], off[comm.rank + 1], device=dev)
    r, c, _ = stencil_rows(m, dim, ids)
    v = torch.where(r == c, float(2 * dim), -1.0).to(dtype)
    if requires_grad:
        v.requires_grad_(True)
    A = sd.DSparseTensor.from_local_rows(r, c, v, (N, N), comm=comm, cache=False)
    del r, c
    return A, v, ids


def _solve_once(sd, comm, args, m: int, dev: torch.device) -> dict:
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    _sync(dev)
    t0 = time.perf_counter()
    A, v, ids = _assemble(sd, comm, m, args.dim, dev, dtype, args.backward)
    _sync(dev)
    assembly = time.perf_counter() - t0
    n_local = ids.numel()
    g = torch.Generator(device="cpu").manual_seed(1000 + comm.rank)
    b = torch.randn(n_local, generator=g, dtype=torch.float64).to(device=dev, dtype=dtype)
    if args.backward:
        b.requires_grad_(True)
    kw = dict(method="cg", preconditioner=None if args.preconditioner == "none" else args.preconditioner,
              rtol=args.rtol, maxiter=args.maxiter, return_info=True, symmetric=True)
    comm.allreduce(torch.zeros(1, device=comm.device))
    _sync(dev)
    t0 = time.perf_counter()
    x, info = sd.solve(A, b, **kw)
    _sync(dev)
    solve_s = time.perf_counter() - t0
    out = dict(assembly_s=assembly, solve_s=solve_s, iterations=info.iterations, residual=info.residual,
               converged=bool(info.converged), status=str(info.status), reductions=info.reductions,
               s_per_iteration=solve_s / max(1, info.iterations), n_local=n_local, nse_local=A.nse_local,
               halo=A.halo_volume())
    if args.backward:
        w = torch.randn(n_local, generator=g, dtype=torch.float64).to(device=dev, dtype=dtype)
        _sync(dev)
        t0 = time.perf_counter()
        loss = sd.dot(w, x, comm)
        loss.backward()
        _sync(dev)
        out["backward_s"] = time.perf_counter() - t0
        out["training_step_s"] = out["backward_s"] + solve_s
        out["grad_b_finite"] = bool(torch.isfinite(b.grad).all())
        out["grad_values_finite"] = bool(torch.isfinite(v.grad).all())
    if dev.type == "cuda":
        out["peak_bytes"] = int(torch.cuda.max_memory_allocated(dev))
    else:
        import resource
        out["peak_bytes"] = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    out["peak_bytes_per_unknown"] = out["peak_bytes"] / max(1, n_local)
    out["stored_bytes"] = A.stored_bytes()
    return out


def _gradient_check(sd, comm, dev: torch.device, dim: int) -> dict:
    """d loss / d (values, b) along a random direction against central differences, loss =
    w . A^-1 b, on a small replica (grid 24^2 or 10^3) spread over the same ranks; float64, CG to
    rtol 1e-12. The values' direction ``s_i + s_j`` on entry (i, j) keeps A symmetric (CG)."""
    m = 24 if dim == 2 else 10
    A0, _, ids = _assemble(sd, comm, m, dim, dev, torch.float64, False)
    vals = A0.values.detach().clone().requires_grad_(True)       # the rank's slots
    A = A0.with_values(vals)
    n = ids.numel()
    g = torch.Generator(device="cpu").manual_seed(7 + comm.rank)
    b = torch.randn(n, generator=g, dtype=torch.float64).to(dev).requires_grad_(True)
    w = torch.randn(n, generator=g, dtype=torch.float64).to(dev)
    kw = dict(method="cg", rtol=1e-12, symmetric=True)
    loss = sd.dot(w, sd.solve(A, b, **kw), comm)
    loss.backward()
    P = A.pattern
    s = 0.1 * torch.randn(n, generator=g, dtype=torch.float64).to(dev)
    s_ext = torch.cat([s, sd.halo_exchange(s, P.halo)])
    dv = s_ext[P.row] + s_ext[P.col]
    db = torch.randn(n, generator=g, dtype=torch.float64).to(dev)
    analytic = float(sd.dot(vals.grad, dv, comm) + sd.dot(b.grad, db, comm))
    h = 1e-6

    def f(t: float) -> float:
        with torch.no_grad():
            At = A0.with_values(vals.detach() + t * dv)
            return float(sd.dot(w, sd.solve(At, b.detach() + t * db, **kw), comm))

    fd = (f(h) - f(-h)) / (2 * h)
    return dict(grid=m, dim=dim, analytic=analytic, finite_difference=fd, step=h,
                relative_error=abs(analytic - fd) / max(abs(fd), 1e-300))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = ap.add_mutually_exclusive_group(required=True)
    size.add_argument("--per-rank", type=float, help="weak scaling: unknowns per rank (the grid side is rounded)")
    size.add_argument("--unknowns", type=float, help="strong scaling: unknowns in all")
    ap.add_argument("--dim", type=int, default=2, choices=[2, 3])
    ap.add_argument("--preconditioner", default="none", choices=["none", "jacobi", "block_jacobi"])
    ap.add_argument("--rtol", type=float, default=1e-6)
    ap.add_argument("--maxiter", type=int, default=200000)
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--backward", action="store_true", help="time one training step (solve + adjoint)")
    ap.add_argument("--check-gradients", action="store_true", help="finite-difference check on a small replica")
    ap.add_argument("--backend", default=None, choices=["nccl", "gloo"], help="default: nccl with CUDA, else gloo")
    ap.add_argument("--tag", default="run")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/scaling/<tag>_p<ranks>.json")
    args = ap.parse_args()

    import sparsetorch
    import sparsetorch_distributed as sd

    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        unset = {k: v for k, v in _NO_MULTICAST.items() if os.environ.get(k) != v}
        if unset:
            raise SystemExit(f"NVLink multicast must be off: set {' '.join(f'{k}={v}' for k, v in unset.items())}")
    comm = sd.init(backend, timeout=600.0)
    dev = comm.device
    if backend == "gloo":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // comm.size))
    total = args.unknowns if args.unknowns else args.per_rank * comm.size
    m = _grid_side(total, args.dim)
    mine = _solve_once(sd, comm, args, m, dev)
    ranks = comm.allgather_object(mine)
    grad = _gradient_check(sd, comm, dev, args.dim) if args.check_gradients else None
    if comm.rank == 0:
        N = m ** args.dim
        worst = max(ranks, key=lambda r: r["solve_s"])
        summary = dict(
            unknowns=N, ranks=comm.size, grid_side=m, dim=args.dim, iterations=worst["iterations"],
            residual=worst["residual"], converged=all(r["converged"] for r in ranks),
            solve_s=worst["solve_s"], s_per_iteration=worst["s_per_iteration"],
            assembly_s=max(r["assembly_s"] for r in ranks),
            halo_rows_sent_per_rank=[r["halo"]["rows_sent"] for r in ranks],
            halo_bytes_per_product_max=max(r["halo"]["rows_sent"] for r in ranks) * (8 if args.dtype == "float64" else 4),
            peak_bytes_per_rank=[r["peak_bytes"] for r in ranks],
            peak_bytes_per_unknown_max=max(r["peak_bytes_per_unknown"] for r in ranks),
            training_step_s=max((r.get("training_step_s", 0.0) for r in ranks), default=None) if args.backward else None,
        )
        out = dict(
            benchmark="bench_scaling", tag=args.tag,
            command=" ".join(["torchrun", f"--nproc-per-node {comm.size}", "benchmarks/bench_scaling.py"] + sys.argv[1:]),
            mode="strong" if args.unknowns else "weak",
            machine=dict(platform=platform.platform(), cpus=os.cpu_count(), backend=backend,
                         gpu=torch.cuda.get_device_name(0) if dev.type == "cuda" else None,
                         gpus_visible=torch.cuda.device_count() if torch.cuda.is_available() else 0,
                         env={k: os.environ.get(k) for k in _NO_MULTICAST}),
            versions=dict(python=platform.python_version(), torch=torch.__version__,
                          sparsetorch=sparsetorch.__version__, sparsetorch_distributed=sd.__version__),
            problem=dict(kind=f"{args.dim}-D Poisson {2 * args.dim + 1}-point", method="cg",
                         preconditioner=args.preconditioner, rtol=args.rtol, maxiter=args.maxiter, dtype=args.dtype,
                         rhs="random (seeded per rank)"),
            summary=summary, per_rank=ranks, gradient_check=grad,
        )
        path = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / "scaling" / f"{args.tag}_p{comm.size}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1))
        gtxt = "" if grad is None else f"; gradient check rel. error {grad['relative_error']:.2e}"
        print(f"[{args.tag}] p={comm.size} N={N:.3e}: {summary['iterations']} iterations, residual {summary['residual']:.2e}, "
              f"{summary['s_per_iteration'] * 1e3:.3f} ms/iteration, solve {summary['solve_s']:.2f} s, assembly "
              f"{summary['assembly_s']:.2f} s, peak {max(summary['peak_bytes_per_rank']) / 2**30:.2f} GiB/rank "
              f"({summary['peak_bytes_per_unknown_max']:.0f} B/unknown){gtxt} -> {path}")
    import torch.distributed as dist
    dist.destroy_process_group()
    if not math.isfinite(mine["residual"]):
        sys.exit(1)


if __name__ == "__main__":
    main()

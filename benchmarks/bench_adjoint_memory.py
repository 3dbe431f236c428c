"""Backward memory of the adjoint method against unrolled autograd, as the iteration count grows.

    python benchmarks/bench_adjoint_memory.py                 # writes benchmarks/results/adjoint_memory_cpu.json
    python benchmarks/bench_adjoint_memory.py --quick         # smaller grids and counts, no JSON

Two loops, each run for a fixed number of iterations (the tolerance is set out of reach, so
every run does exactly that many), each differentiated two ways:

- **CG** on 1-D Poisson (tridiagonal ``[-1, 2, -1]``, ``--cg-n`` = 4096 unknowns), ``loss = w . x``,
  gradient with respect to ``b``:
  ``sparsetorch.solve(A, b, method="cg", maxiter=k)`` (one autograd node; backward is one adjoint
  CG solve of k iterations on the same plan) against textbook CG in plain torch (torch CSR
  product), differentiated by autograd through its k iterations. k = 100, 1000, 5000. (1-D,
  because with the tolerance out of reach CG's recursive residual keeps shrinking until its
  square underflows: on 2-D Poisson 48² that happens at iteration 2168 and on 100² at 3776, where
  sparsetorch's CG stops with NOT_FINITE and plain CG turns to NaN; on 1-D Poisson of 4096
  unknowns all 5000 iterations stay finite.)
- **Newton** on ``-Lap u + u^3 = f`` (2-D, ``--newton-grid``² unknowns), gradient with respect to
  ``f``: ``nonlinear_solve(..., method="newton", line_search=False, maxiter=k)`` with the inner
  linear solves by sparsetorch CG (the backward pass is one adjoint solve at ``u*`` and one VJP of
  F) against the same Newton-CG loop in plain torch (inner CG to relative 1e-12, Jacobian-vector
  products ``L p + 3 u^2 p``), differentiated through every Newton and CG iteration.
  k = 5, 20, 50.

Measured per case, each in a fresh subprocess (so one case's memory does not hide another's):

- ``saved_bytes``: the bytes of the tensors autograd saves for backward, counted with
  ``torch.autograd.graph.saved_tensors_hooks`` (each storage once): what the graph holds between
  forward and backward. Exact and deterministic.
- ``forward_peak_rss_bytes`` / ``backward_peak_rss_bytes``: the rise of the process's peak
  resident set size (``VmHWM`` from ``/proc/self/status``, reset through ``/proc/self/clear_refs``
  before each phase; ``resource.getrusage`` where that is not available) above the RSS at the
  start of the phase; ``backward_peak_over_pre_forward_rss_bytes``: the peak during backward
  above the RSS before forward (the graph still held plus the backward's own work: the memory a
  training step needs at its worst). Includes allocator slack; Linux only.
- the gradient of each method against the other at the same k (relative difference), and the
  time of forward and backward (shared 2-core machine: compare ratios only).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "core"))

import sparsetorch as st  # noqa: E402
from sparsetorch.format import CSR  # noqa: E402
from sparsetorch.ops.nonlinear import nonlinear_solve  # noqa: E402

DT = torch.float64


# --------------------------------------------------------------------------------------------------
# Memory probes


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def rss_bytes() -> int:
    kb = _status_kb("VmRSS")
    return (kb or 0) * 1024


def peak_bytes() -> int:
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Phase:
    """Peak RSS rise over the RSS at entry, for one block."""

    def __enter__(self):
        self.resettable = _reset_peak()
        self.start = rss_bytes()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self.peak = peak_bytes()
        self.peak_rise = max(0, self.peak - self.start)
        self.held = rss_bytes() - self.start


class Saved:
    """Bytes of the storages autograd saves for backward (each once)."""

    def __init__(self):
        self.storages: dict[int, int] = {}
        self.count = 0

    def pack(self, t):
        self.count += 1
        if t.layout == torch.sparse_csr:
            parts = (t.crow_indices(), t.col_indices(), t.values())
        elif t.layout == torch.sparse_coo:
            parts = (t._indices(), t._values())
        else:
            parts = (t,)
        for p in parts:
            s = p.untyped_storage()
            self.storages[s.data_ptr()] = max(self.storages.get(s.data_ptr(), 0), s.nbytes())
        return t

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


# --------------------------------------------------------------------------------------------------
# Problems


def poisson_coo(m: int):
    N = m * m
    k = torch.arange(N)
    r, c = k // m, k % m
    rows, cols, vals = [k], [k], [torch.full((N,), 4.0, dtype=DT)]
    for dr, dc in ((0, 1), (0, -1), (1, 0), (-1, 0)):
        ok = (r + dr >= 0) & (r + dr < m) & (c + dc >= 0) & (c + dc < m)
        rows.append(k[ok])
        cols.append(((r + dr) * m + (c + dc))[ok])
        vals.append(torch.full((int(ok.sum()),), -1.0, dtype=DT))
    return torch.cat(rows), torch.cat(cols), torch.cat(vals), N


def plain_cg(matvec, b, iters: int | None, rtol: float | None = None):
    """Textbook CG in plain torch (differentiable by autograd through every iteration)."""
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = torch.dot(r, r)
    stop = None if rtol is None else (rtol * float(torch.linalg.vector_norm(b))) ** 2
    k = 0
    while True:
        if iters is not None and k >= iters:
            break
        if stop is not None and (float(rr) <= stop or k >= 10 * b.numel()):
            break
        Ap = matvec(p)
        alpha = rr / torch.dot(p, Ap)
        x = x + alpha * p
        r = r - alpha * Ap
        rr_new = torch.dot(r, r)
        p = r + (rr_new / rr) * p
        rr = rr_new
        k += 1
    return x, k


# --------------------------------------------------------------------------------------------------
# One case (run in a subprocess)


def run_case(kind: str, iters: int, grid: int) -> dict:
    torch.manual_seed(0)
    if kind.startswith("cg"):  # 1-D Poisson, `grid` unknowns
        N = grid
        i = torch.arange(N)
        rows, cols = torch.cat([i, i[:-1], i[1:]]), torch.cat([i, i[1:], i[:-1]])
        vals = torch.cat([torch.full((N,), 2.0, dtype=DT), torch.full((2 * N - 2,), -1.0, dtype=DT)])
    else:  # 2-D Poisson, grid x grid
        rows, cols, vals, N = poisson_coo(grid)
    w = torch.linspace(-1, 1, N, dtype=DT)
    out: dict = {"kind": kind, "iterations": iters, "grid": grid, "unknowns": N, "nnz": int(vals.numel())}
    if kind.startswith("cg"):
        A = st.SparseTensor.from_coo(vals, rows, cols, shape=(N, N), format=CSR)
        Acsr = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (N, N)).coalesce().to_sparse_csr()
        b0 = torch.rand(N, dtype=DT)

        def forward(b, k):
            if kind == "cg_adjoint":
                x, info = st.solve(A, b, method="cg", backend="torch", properties="spd", rtol=1e-300, maxiter=k,
                                   on_nonconvergence="ignore", return_info=True)
                return x, info.iterations
            return plain_cg(lambda p: Acsr @ p, b, k)
    else:
        h = 1.0 / (grid + 1)
        L = st.SparseTensor.from_coo(vals / h**2, rows, cols, shape=(N, N), format=CSR)
        Lcsr = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals / h**2, (N, N)).coalesce().to_sparse_csr()
        coords, slot = L.entries()
        on = coords[0] == coords[1]
        x = torch.arange(N, dtype=DT) / N
        b0 = 50 * torch.sin(3 * x) + 20

        def F(u, f):
            return L @ u + u**3 - f

        def J(u, f):
            add = torch.zeros(L.values.shape, dtype=DT).index_put((slot[on],), (3 * u**2)[coords[0][on]], accumulate=True)
            return L.with_values(L.values + add)

        def forward(f, k):
            u0 = torch.zeros(N, dtype=DT)
            if kind == "newton_adjoint":
                u, info = nonlinear_solve(
                    F, u0, (f,), jacobian=J, line_search=False, rtol=1e-300, maxiter=k, on_nonconvergence="ignore",
                    linear_options={"backend": "torch", "method": "cg", "properties": "spd", "rtol": 1e-12},
                    return_info=True,
                )
                return u, info.iterations
            u = u0
            for _ in range(k):  # the same Newton-CG loop in plain torch, unrolled by autograd
                r = Lcsr @ u + u**3 - f
                d, _ = plain_cg(lambda p, u=u: Lcsr @ p + 3 * u**2 * p, -r, None, rtol=1e-12)
                u = u + d
            return u, k

    # warm-up (kernels, dispatch, calibration) at a small count
    bw = b0.clone().requires_grad_()
    xw, _ = forward(bw, 2)
    (w * xw).sum().backward()
    del xw, bw
    b = b0.clone().requires_grad_()
    saved = Saved()
    with Phase() as fwd, saved.hooks():
        x, done = forward(b, iters)
        loss = (w * x).sum()
    with Phase() as bwd:
        loss.backward()
    out.update(
        iterations_done=int(done), saved_bytes=saved.bytes, saved_tensors=saved.count,
        forward_peak_rss_bytes=fwd.peak_rise, forward_held_rss_bytes=fwd.held, backward_peak_rss_bytes=bwd.peak_rise,
        backward_peak_over_pre_forward_rss_bytes=max(0, bwd.peak - fwd.start),
        forward_seconds=fwd.seconds, backward_seconds=bwd.seconds, peak_resettable=fwd.resettable,
        finite=bool(torch.isfinite(b.grad).all()), grad=b.grad.tolist(),
    )
    return out


# --------------------------------------------------------------------------------------------------
# Driver


def _child(kind: str, iters: int, grid: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1"))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", kind, "--iters", str(iters), "--grid", str(grid)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"case {kind} k={iters} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _rel(a: list[float], b: list[float]) -> float:
    ta, tb = torch.tensor(a, dtype=DT), torch.tensor(b, dtype=DT)
    return float(torch.linalg.vector_norm(ta - tb) / torch.linalg.vector_norm(tb))


def _versions() -> dict:
    v = {"python": platform.python_version(), "torch": torch.__version__, "sparsetorch": st.__version__}
    for mod in ("numpy", "scipy"):
        try:
            v[mod] = __import__(mod).__version__
        except ImportError:
            pass
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case")
    ap.add_argument("--iters", type=int)
    ap.add_argument("--grid", type=int)
    ap.add_argument("--cg-n", type=int, default=4096)
    ap.add_argument("--newton-grid", type=int, default=32)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "results" / "adjoint_memory_cpu.json"))
    args = ap.parse_args()
    if args.case:
        torch.set_num_threads(1)
        print(json.dumps(run_case(args.case, args.iters, args.grid)))
        return
    cg_counts, newton_counts = ((20, 100), (3, 6)) if args.quick else ((100, 1000, 5000), (5, 20, 50))
    cg_grid, newton_grid = (256, 12) if args.quick else (args.cg_n, args.newton_grid)
    cases = []
    for loop, counts, grid in (("cg", cg_counts, cg_grid), ("newton", newton_counts, newton_grid)):
        for k in counts:
            pair = {}
            for how in ("adjoint", "unrolled"):
                res = _child(f"{loop}_{how}", k, grid)
                pair[how] = res
                if res["iterations_done"] != k or not res["finite"]:
                    print(f"WARNING: {loop} {how} k={k} ran {res['iterations_done']} iterations, finite={res['finite']}")
                print(f"{loop:6s} {how:8s} k={k:5d} done={res['iterations_done']:5d} saved={res['saved_bytes'] / 2**20:9.3f} MiB "
                      f"fwd peak +{res['forward_peak_rss_bytes'] / 2**20:8.1f} MiB  "
                      f"bwd peak (over pre-forward) +{res['backward_peak_over_pre_forward_rss_bytes'] / 2**20:8.1f} MiB "
                      f"fwd {res['forward_seconds']:.3f}s bwd {res['backward_seconds']:.3f}s", flush=True)
            diff = _rel(pair["adjoint"]["grad"], pair["unrolled"]["grad"])
            for how in ("adjoint", "unrolled"):
                r = dict(pair[how])
                r.pop("grad")
                r["method"] = how
                r["loop"] = loop
                r["grad_rel_diff_adjoint_vs_unrolled"] = diff
                cases.append(r)
    if args.quick:
        return
    result = {
        "benchmark": "bench_adjoint_memory",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 flock /tmp/sparsetorch-bench.lock python benchmarks/bench_adjoint_memory.py",
        "machine": {
            "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": 1,
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        },
        "versions": _versions(),
        "setup": {
            "cg": f"1-D Poisson [-1, 2, -1], {cg_grid} unknowns, float64, rtol 1e-300 (never met), maxiter k, torch "
                  f"backend CG (Jacobi); loss w.x, grad wrt b",
            "newton": f"-Lap u + u^3 = f on {newton_grid}x{newton_grid}, float64, line_search=False, rtol 1e-300, maxiter k; "
                      f"inner CG rtol 1e-12 (sparsetorch CG / plain-torch CG); loss w.u, grad wrt f",
            "saved_bytes": "bytes of storages saved for backward (torch.autograd.graph.saved_tensors_hooks), each once",
            "peak_rss": "rise of VmHWM (reset via /proc/self/clear_refs) over VmRSS at the start of the phase",
            "grad_rel_diff": "the two gradients agree only where the loop has converged: the unrolled gradient is the "
                             "derivative of the truncated iteration, the adjoint one assumes the solution (its adjoint "
                             "CG runs the same k iterations); 1-D Poisson of 4096 unknowns needs ~N CG iterations",
        },
        "cases": cases,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

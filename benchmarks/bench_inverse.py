"""Inverse coefficient problem (issue 6): sparsetorch against torch-sla 0.4.0, side by side in one run.

The set-up is torch-sla's own benchmark (sparsexlab/torch-sla,
``benchmarks/ops/benchmark_inverse_coefficient.py``), rebuilt in ``examples/inverse_coefficient.py``:
64 x 64 nodes, 62^2 = 3,844 unknowns, kappa = softplus(theta) from 1, Adam lr 0.05, Tikhonov
1e-4 on first differences, observations everywhere, relative L2 error of kappa over the grid.
Every implementation uses the same matrix values, loss, optimiser and metric; only the solve
differs:

- ``sparsetorch``: the example (one CSR pattern, ``Solver`` with plan reuse: refactorization per
  step, the backward one transposed solve on the same factors) with its default solver (on the
  CPU SciPy SuperLU, ``method="lu"``, panel size 4) unless ``--method`` says otherwise;
  ``eigen`` as an extra row when that plugin is installed, SuperLU's default panel size as an
  extra row with ``--extra-default-panel``;
- ``torch-sla (benchmark)``: torch-sla's benchmark configuration, ``SparseTensor(val, row, col,
  shape).solve(f, backend="pytorch", method="cg", atol=1e-10, maxiter=2000)`` per step
  (observations at atol 1e-12), as its script does;
- ``torch-sla (auto)``: the same with torch-sla's own choice (``backend="auto"``: SciPy LU on
  the CPU).

The implementations run interleaved, ``--block`` steps of each in turn (each with its own
parameters and optimiser), so all of them meet the same load on a shared machine; each stops at the target
kappa error ``--target`` (0.23 %) or ``--max-steps``. Recorded: steps to the target, the median
step time, the end-to-end time (set-up, observations and steps until the target), on the CPU
also the process's CPU time for both (less sensitive to other processes), the final error, and
for sparsetorch a per-stage breakdown (a separate timed run).

Run (the numbers in benchmarks/results/inverse_cpu.json)::

    flock /tmp/sparsetorch-bench.lock env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
        PYTHONPATH=core python benchmarks/bench_inverse.py

On a GPU: ``python benchmarks/bench_inverse.py --device cuda`` writes inverse_cuda.json
(torch-sla runs there only if it is installed: ``--skip-torch-sla`` leaves it out).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "examples"))

import inverse_coefficient as ic  # noqa: E402

import sparsetorch as st  # noqa: E402

#: The eigen row: Eigen's SimplicialLLT (pattern analysed once, numeric factorization per step).
EIGEN = {"backend": "eigen", "method": "cholesky"}

#: Where each detail of the set-up comes from (torch-sla's script, read at commit 02d36316 of
#: sparsexlab/torch-sla through the search tool) and what had to be decided here.
SETUP = {
    "source": "sparsexlab/torch-sla benchmarks/ops/benchmark_inverse_coefficient.py (commit 02d36316a73e), defaults",
    "matched": {
        "grid": "n=64 nodes per side on [0,1]^2 (linspace), h = 1/(n-1); unknowns the (n-2)^2 = 3844 interior nodes",
        "boundary": "u = 0 on the boundary nodes (eliminated); faces to boundary nodes enter the diagonal",
        "stencil": "5-point, face conductivity = arithmetic mean of the two nodal kappas, scaled by 1/h^2",
        "truth": "kappa* = 1 + 0.5 sin(2 pi x) sin(2 pi y) on all n^2 nodes",
        "rhs": "f = 1 at every unknown; observations u_obs = A(kappa*)^-1 f at every unknown, noise-free",
        "parameterization": "kappa = softplus(theta), theta = log(e - 1) everywhere (kappa = 1)",
        "loss": "sum (u - u_obs)^2 + 1e-4 * (sum dx^2 + sum dy^2) / n^2, first differences of kappa on the full grid",
        "optimizer": "torch.optim.Adam(lr=0.05), float64",
        "metric": "||kappa - kappa*||_2 / ||kappa*||_2 over the n x n grid, evaluated after each Adam update",
        "torch_sla_solver": "SparseTensor(val, row, col, shape).solve(f, backend='pytorch', method='cg', atol=1e-10, "
                            "maxiter=2000); observations with atol=1e-12",
        "seed": "torch.manual_seed(0) (nothing in the set-up is random)",
    },
    "guessed_or_decided_here": {
        "target": "0.23 % is the published figure (paper v2, not in the store); reading it as the first step whose "
                  "kappa error is <= 2.3e-3. torch-sla's script runs a fixed 2000 steps (0.48 % on this CPU); the "
                  "run here stops each implementation at the target instead",
        "device": "torch-sla's script defaults to cuda:0; on this CPU-only machine it runs with --device cpu and its "
                  "default pytorch/cg solver (the 40 ms/step anchor); its CPU auto choice (scipy LU) is a second row",
        "our_solver": "direct (SuperLU via the scipy plugin, method='lu' pinned, backend_options panel_size=4, the "
                      "example's CPU default: the cost model ranks scipy/cg first for this matrix); exact to rounding "
                      "where torch-sla's CG stops at atol 1e-10",
        "coo_order": "torch-sla's script orders COO entries diag, east, west, south, north; here diag, then each "
                     "coupling pair (same matrix; only summation order inside SpMV can differ)",
        "timing": "end to end = grid/pattern set-up + observation solve + steps until the target, including the "
                  "per-step metric (torch-sla's script also computes it every step); plotting and file output excluded; "
                  "one-time imports excluded for every row by an untimed 3-step warm-up of each implementation on n=8",
    },
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Runner:
    """One implementation: ``setup()`` (timed: pattern, observations, optimiser), then ``step()``
    returning ``(loss, kappa error after the update)``. The driver interleaves the runners step by
    step, so every implementation meets the same load on a shared machine."""

    name: str
    implementation: str

    def setup(self) -> None:
        raise NotImplementedError

    def step(self) -> tuple[float, float]:
        raise NotImplementedError

    def info(self) -> dict:
        return {}


class SparsetorchRunner(Runner):
    implementation = "sparsetorch"

    def __init__(self, args, device: torch.device, solver: dict, name: str) -> None:
        self.args, self.device, self.solver, self.name = args, device, solver, name

    def setup(self) -> None:
        a = self.args
        self.prob = ic.InverseProblem.build(a.n, lr=a.lr, reg=a.reg, device=self.device, **{"rtol": a.rtol, **self.solver})

    def step(self) -> tuple[float, float]:
        return self.prob.step()  # returns floats: the step has synchronised

    def info(self) -> dict:
        s = self.prob.solver
        return {"backend": s.backend, "method": s.method, "solver_options": dict(self.solver),
                "rtol_if_iterative": self.args.rtol, "factorizations": getattr(s._state.plan, "factorizations", None)}


class TorchSlaRunner(Runner):
    """torch-sla the way its benchmark script drives it: a new ``SparseTensor(val, row, col, shape)``
    from COO triplets and ``.solve(f, ...)`` every step (same stencil values, loss, optimiser)."""

    implementation = "torch-sla"

    def __init__(self, args, device: torch.device, backend: str, method: str, name: str) -> None:
        self.args, self.device, self.backend, self.method, self.name = args, device, backend, method, name

    def setup(self) -> None:
        import torch_sla

        warnings.filterwarnings("ignore", message="PCG did not converge")
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support")
        warnings.filterwarnings("ignore", message="Sparse invariant checks")
        self.sla = torch_sla
        a, dtype = self.args, torch.float64
        self.grid = ic.make_grid(a.n, device=self.device, dtype=dtype)  # the same stencil, as COO triplets
        self.truth = ic.kappa_star(a.n, device=self.device, dtype=dtype)
        with torch.no_grad():
            self.u_obs = self._solve(self.truth, 1e-12)
        self.theta = torch.full((a.n, a.n), ic.theta_for_kappa(1.0), device=self.device, dtype=dtype, requires_grad=True)
        self.opt = torch.optim.Adam([self.theta], lr=a.lr)

    def _solve(self, kappa: torch.Tensor, atol: float) -> torch.Tensor:
        rows, cols, coeff = self.grid.coo
        vals = ic.stencil_coefficients(kappa, self.grid.h)[coeff]
        A = self.sla.SparseTensor(vals, rows, cols, (self.grid.unknowns, self.grid.unknowns))
        return A.solve(self.grid.f, backend=self.backend, method=self.method, atol=atol, maxiter=self.args.sla_maxiter)

    def step(self) -> tuple[float, float]:
        self.opt.zero_grad()
        kappa = F.softplus(self.theta)
        u = self._solve(kappa, self.args.sla_atol)
        loss = (u - self.u_obs).square().sum() + self.args.reg * ic.smoothness(kappa)
        loss.backward()
        self.opt.step()
        with torch.no_grad():
            err = ic.relative_l2(F.softplus(self.theta), self.truth)
        return float(loss.detach()), err

    def info(self) -> dict:
        resolved = self.backend
        if self.backend == "auto":
            try:
                resolved = f"auto -> {self.sla.backends.select_backend(self.device, self.grid.unknowns, torch.float64)}"
            except Exception as exc:  # noqa: BLE001 - their helper; the run is unaffected
                resolved = f"auto (could not ask torch-sla: {exc})"
        return {"version": self.sla.__version__, "backend": resolved, "method": self.method, "atol": self.args.sla_atol,
                "maxiter": self.args.sla_maxiter}


def run_interleaved(runners: list[Runner], args, device: torch.device, *, verbose: bool = True) -> list[dict]:
    """Set every runner up, then step them in turns of ``args.block`` steps until each reaches the
    target or ``max_steps``.

    Per step: wall time (``perf_counter``) and, on the CPU, the thread's CPU time (``thread_time``:
    time spent by this process's thread, which other processes' load inflates less)."""
    cpu = device.type == "cpu"
    state = {}
    for r in runners:
        torch.manual_seed(args.seed)
        _sync(device)
        w0, c0 = time.perf_counter(), time.thread_time()
        r.setup()
        _sync(device)
        state[r.name] = {"setup": time.perf_counter() - w0, "setup_cpu": time.thread_time() - c0,
                         "wall": [], "cpu": [], "loss": [], "err": [], "done": False}
    block = max(1, args.block)
    for k0 in range(0, args.max_steps, block):
        active = [r for r in runners if not state[r.name]["done"]]
        if not active:
            break
        for r in active:
            s = state[r.name]
            for k in range(k0, min(k0 + block, args.max_steps)):
                w0, c0 = time.perf_counter(), time.thread_time()
                loss, err = r.step()
                s["wall"].append(time.perf_counter() - w0)
                s["cpu"].append(time.thread_time() - c0)
                s["loss"].append(loss)
                s["err"].append(err)
                if verbose and k % args.log_every == 0:
                    print(f"  [{r.name}] step {k + 1:5d} loss={loss:.4e} kappa_rel_err={err:.4e} "
                          f"({1e3 * s['wall'][-1]:.2f} ms)", flush=True)
                if args.target > 0 and err <= args.target:
                    s["done"] = True
                    break
    out = []
    for r in runners:
        rec = _summary(r, state[r.name], args.target, cpu)
        if verbose:
            print(f"  [{r.name}] {_line(rec)}", flush=True)
        out.append(rec)
    return out


def _summary(r: Runner, s: dict, target: float, cpu: bool) -> dict:
    errors, wall = s["err"], s["wall"]
    reached = next((k + 1 for k, e in enumerate(errors) if e <= target), None) if target > 0 else None
    upto = reached if reached is not None else len(wall)
    rec = {
        "name": r.name,
        "implementation": r.implementation,
        **r.info(),
        "steps_run": len(wall),
        "steps_to_target": reached,
        "target": target,
        "reached_target": reached is not None,
        "median_step_ms": 1e3 * statistics.median(wall) if wall else None,
        "mean_step_ms": 1e3 * sum(wall) / len(wall) if wall else None,
        "setup_seconds": s["setup"],
        "end_to_end_seconds": s["setup"] + sum(wall[:upto]),
        "initial_loss": s["loss"][0] if s["loss"] else None,
        "final_kappa_rel_err": errors[-1] if errors else None,
        "kappa_rel_err_at": {str(k): errors[k - 1] for k in (1, 10, 100, 500, 1000, 1500, 2000, 2400, 3000, 4000)
                             if k <= len(errors)},
    }
    if cpu:
        c = s["cpu"]
        rec["median_step_cpu_ms"] = 1e3 * statistics.median(c) if c else None
        rec["end_to_end_cpu_seconds"] = s["setup_cpu"] + sum(c[:upto])
    return rec


def breakdown_sparsetorch(args, device: torch.device, solver: dict) -> dict:
    """Per-stage times of our step (a separate run: warm-up, then ``--breakdown-steps`` timed steps)."""
    prob = ic.InverseProblem.build(args.n, lr=args.lr, reg=args.reg, device=device, **{"rtol": args.rtol, **solver})
    stages = {"assembly": prob.assemble, "refactorization": prob.refactorize, "solve_and_loss": prob.forward,
              "backward": prob.backward, "adam_and_metric": prob.update}
    wall = {k: [] for k in stages}
    cpu = {k: [] for k in stages}
    for k in range(args.breakdown_steps + 20):
        for name, fn in stages.items():
            _sync(device)
            w0, c0 = time.perf_counter(), time.thread_time()
            fn()
            _sync(device)
            if k >= 20:
                wall[name].append(time.perf_counter() - w0)
                cpu[name].append(time.thread_time() - c0)
    med = {k: 1e3 * statistics.median(v) for k, v in wall.items()}
    out = {
        "steps_timed": args.breakdown_steps,
        "median_ms": med,
        "sum_of_medians_ms": sum(med.values()),
        "stages": {
            "assembly": "zero_grad, softplus, stencil coefficients, gather into the CSR slots",
            "refactorization": "Solver.update_values: new values on the kept plan, one numeric factorization",
            "solve_and_loss": "Solver.solve (autograd node, one solve with the kept factors) + data and regularisation loss",
            "backward": "loss.backward(): one transposed solve with the same factors, the SDDMM for dA, assembly backward",
            "adam_and_metric": "Adam update + kappa error (one device-to-host read)",
        },
    }
    if device.type == "cpu":
        out["median_cpu_ms"] = {k: 1e3 * statistics.median(v) for k, v in cpu.items()}
    return out


def _line(rec: dict) -> str:
    hit = f"target at step {rec['steps_to_target']}" if rec["reached_target"] else f"target NOT reached in {rec['steps_run']}"
    return (f"{hit}; median {rec['median_step_ms']:.2f} ms/step; end to end {rec['end_to_end_seconds']:.2f} s; "
            f"final error {rec['final_kappa_rel_err']:.4e}")


# environment ---------------------------------------------------------------------------------------
def machine(device: torch.device) -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    out = {"platform": platform.platform(), "python": platform.python_version(), "cpu": cpu,
           "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
           "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS")}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def versions() -> dict:
    import numpy
    import scipy

    out = {"torch": torch.__version__, "numpy": numpy.__version__, "scipy": scipy.__version__,
           "sparsetorch": st.__version__}
    for mod in ("torch_sla", "sparsetorch_scipy", "sparsetorch_eigen"):
        try:
            out[mod] = __import__(mod).__dict__.get("__version__", "installed")
        except ImportError:
            out[mod] = None
    return out


def eigen_available(args, device: torch.device) -> tuple[str | None, str]:
    """``(None, how)`` when the eigen backend solves a small instance of this problem correctly, else
    ``(why not, how)``. The plugin is optional and may be unfinished: any failure is recorded, not
    raised. Not installed but importable (``PYTHONPATH=...:plugins/eigen_backend`` over an in-tree
    build): registered here by hand, and ``how`` says so."""
    how = "installed plugin (entry point)"
    try:
        if "eigen" not in st.registry().names:
            import importlib

            st.registry().register(importlib.import_module("sparsetorch_eigen.plugin"), "eigen")
            how = "in-tree plugin registered by the benchmark (sparsetorch_eigen importable, not pip-installed)"
        g = ic.make_grid(8, device=device)
        A = g.A.with_values(ic.assemble_values(g, ic.kappa_star(8, device=device)))
        u = st.Solver(A, properties="spd", **EIGEN).solve(g.f)
        ref = torch.linalg.solve(A.to_dense(), g.f)
        if not torch.allclose(u, ref, rtol=1e-10, atol=1e-12):
            return f"wrong answer on n=8 (max error {float((u - ref).abs().max()):.3g})", how
    except Exception as exc:  # noqa: BLE001 - a probe: the reason goes into the JSON
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}", how
    return None, how


def _command(argv: list[str] | None) -> str:
    """The invocation as it ran: the environment variables that matter, then the arguments."""
    env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONPATH")
                   if k in os.environ)
    args = " ".join(sys.argv[1:] if argv is None else argv)
    return f"{env + ' ' if env else ''}python benchmarks/bench_inverse.py {args}".strip()


def make_runners(args, device: torch.device, solver: dict, eigen: bool, sla: bool) -> list[Runner]:
    name = f"sparsetorch ({solver.get('backend') or 'auto'} {solver.get('method') or 'auto'})"
    runners: list[Runner] = [SparsetorchRunner(args, device, solver, name)]
    if args.extra_default_panel and device.type == "cpu":
        runners.append(SparsetorchRunner(args, device, {"backend": "scipy", "method": "lu"},
                                         "sparsetorch (scipy lu, SuperLU default panel)"))
    if eigen:
        runners.append(SparsetorchRunner(args, device, EIGEN, "sparsetorch (eigen cholesky)"))
    if sla:
        runners.append(TorchSlaRunner(args, device, "pytorch", "cg", "torch-sla (benchmark: pytorch/cg)"))
        if not args.skip_sla_auto:
            runners.append(TorchSlaRunner(args, device, "auto", "auto", "torch-sla (auto)"))
    return runners


def warm_up(args, device: torch.device, solver: dict, eigen: bool, sla: bool) -> None:
    """A few steps of every implementation on a small grid, untimed: one-time costs (imports such as
    torch._dynamo pulled in by the first optimiser, plugin loading, calibration) then burden none
    of the timed runs."""
    small = argparse.Namespace(**{**vars(args), "n": 8, "max_steps": 3, "target": 0.0})
    run_interleaved(make_runners(small, device, solver, eigen, sla), small, device, verbose=False)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description="inverse coefficient problem: sparsetorch vs torch-sla, side by side")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--max-steps", type=int, default=4000)
    p.add_argument("--target", type=float, default=2.3e-3)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--reg", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads for both sides (default 1)")
    p.add_argument("--method", default=None,
                   help="our method (default: the example's, lu with SuperLU panel size 4 on the CPU, chosen by cost elsewhere)")
    p.add_argument("--backend", default=None, help="our backend (default: the example's, scipy on the CPU)")
    p.add_argument("--extra-default-panel", action="store_true",
                   help="add a row with SuperLU's default panel size (CPU)")
    p.add_argument("--rtol", type=float, default=1e-10, help="our tolerance if an iterative method is used")
    p.add_argument("--sla-atol", type=float, default=1e-10)
    p.add_argument("--sla-maxiter", type=int, default=2000)
    p.add_argument("--skip-torch-sla", action="store_true")
    p.add_argument("--skip-sla-auto", action="store_true", help="leave out the torch-sla auto (SciPy LU) row")
    p.add_argument("--block", type=int, default=50,
                   help="steps each implementation runs before the next takes its turn (default 50: caches stay warm "
                        "within a block, load changes on the shared machine reach every implementation alike)")
    p.add_argument("--breakdown-steps", type=int, default=300)
    p.add_argument("--log-every", type=int, default=250)
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/inverse_<device type>.json)")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    solver = {"method": args.method} if args.method else ic.default_solver(device)
    if args.backend:
        solver["backend"] = args.backend
    out = Path(args.out) if args.out else HERE / "results" / f"inverse_{device.type}.json"
    print(f"[bench_inverse] n={args.n} device={device} threads={args.threads} target={args.target}", flush=True)

    why_not_eigen, eigen_how = eigen_available(args, device)
    eigen, sla = why_not_eigen is None, not args.skip_torch_sla
    warm_up(args, device, solver, eigen, sla)
    rows = run_interleaved(make_runners(args, device, solver, eigen, sla), args, device)
    breakdown = breakdown_sparsetorch(args, device, solver)
    print(f"  [breakdown] {json.dumps({k: round(v, 3) for k, v in breakdown['median_ms'].items()})}", flush=True)

    ratios = {}
    for ours in (r for r in rows if r["implementation"] == "sparsetorch"):
        for r in (r for r in rows if r["implementation"] == "torch-sla"):
            key = f"{ours['name']} vs {r['name']}"
            ratios[key] = {
                "end_to_end_speedup": r["end_to_end_seconds"] / ours["end_to_end_seconds"],
                "median_step_speedup": r["median_step_ms"] / ours["median_step_ms"],
                "both_reached_target": bool(r["reached_target"] and ours["reached_target"]),
            }
            if "end_to_end_cpu_seconds" in r:
                ratios[key]["end_to_end_cpu_time_speedup"] = r["end_to_end_cpu_seconds"] / ours["end_to_end_cpu_seconds"]
                ratios[key]["median_step_cpu_time_speedup"] = r["median_step_cpu_ms"] / ours["median_step_cpu_ms"]
    result = {
        "benchmark": "inverse coefficient problem (issue 6)",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": _command(argv),
        "reproduce_on_the_shared_cpu": "flock /tmp/sparsetorch-bench.lock env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "
                                       "PYTHONPATH=core python benchmarks/bench_inverse.py [options]",
        "machine": machine(device),
        "versions": versions(),
        "setup": SETUP,
        "problem": {"n": args.n, "unknowns": (args.n - 2) ** 2, "lr": args.lr, "reg": args.reg, "target": args.target,
                    "max_steps": args.max_steps, "device": str(device)},
        "eigen_backend": f"included: {eigen_how}" if why_not_eigen is None else f"not available: {why_not_eigen}",
        "results": rows,
        "sparsetorch_breakdown": breakdown,
        "speedups": ratios,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for name, r in ratios.items():
        cpu = (f" (CPU time: end to end {r['end_to_end_cpu_time_speedup']:.2f}x, median step "
               f"{r['median_step_cpu_time_speedup']:.2f}x)" if "end_to_end_cpu_time_speedup" in r else "")
        print(f"[ratio] {name}: end to end {r['end_to_end_speedup']:.2f}x, median step {r['median_step_speedup']:.2f}x{cpu}",
              flush=True)
    print(f"[bench_inverse] wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}", flush=True)
    return result


if __name__ == "__main__":
    main()

"""Benchmarks of the scipy backend (issue 4, "Done means"), side by side in one process.

Parts (``--part``, default all; each writes ``benchmarks/results/scipy_<part>.json`` with the
machine, versions and command):

- ``overhead``: one ``sparsetorch.solve(A, b, backend="scipy", method=...)`` against the same
  SciPy call made directly, on 2-D Poisson 256² and 1000², for SuperLU (same ordering options
  as the plugin; each sparsetorch call gets new values, so both sides factor) and plain CG at
  rtol 1e-6 (same iteration count). Interleaved repetitions; ratios of the best and of the
  median times (also against the direct call on a fresh copy of the values, ``scipy, new
  values``: what each sparsetorch call gets). Three sparsetorch variants show where the overhead goes: the default call
  (property detection and the NaN check included), ``properties="spd"`` (no detection), and
  ``properties="spd", check_finite=False``.
- ``problems``: AMG-preconditioned CG vs plain CG vs SuperLU vs PyAMG as the solver (through
  sparsetorch's ``Solver``: setup and solve timed apart, iterations), and torch-sla 0.4.0 on the
  same problems (its ``scipy`` backend LU and CG, its ``pytorch`` CG, its ``pyamg`` backend), on
  2-D Poisson 1000² and 3-D Poisson 64³, b = ones, rtol 1e-6. torch-sla's CG ignores ``tol``;
  it gets ``atol = rtol ||b||`` (its scipy backend passes only ``atol``, so SciPy's default
  ``rtol=1e-5`` also applies: see the true residuals).
- ``training``: a training loop on one pattern (new values -> solve -> loss -> backward -> Adam
  step) on 2-D Poisson 256² with a learned diagonal, for LU and AMG-CG, with plan reuse (the plan
  cache, a ``Solver``), without (``cache=False``), with the AMG hierarchy kept across steps
  (``backend_options={"amg_reuse": ...}``), and torch-sla's ``spsolve``.

Run (from the repository root, under the benchmark lock on shared machines)::

    flock /tmp/sparsetorch-bench.lock env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
        PYTHONPATH=core:plugins/scipy_backend python plugins/scipy_backend/benchmarks/bench_scipy.py

``--quick`` uses small sizes (a smoke test). Timings on a shared 2-core machine: compare ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import scipy
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

import sparsetorch as st
from sparsetorch.backend import get_backends

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent / "tests"))
from _helpers import poisson_scipy as poisson  # noqa: E402  (one Poisson builder for tests and benchmarks)

RTOL = 1e-6


def _register() -> None:
    if "scipy" not in get_backends().names:  # a source checkout: register the plugin in-process
        import sparsetorch_scipy.plugin as plugin

        get_backends().register(plugin, "scipy")


def _versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
           "scipy": scipy.__version__, "sparsetorch": st.__version__}
    for mod in ("pyamg", "torch_sla"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as exc:  # noqa: BLE001 (recorded, not hidden)
            out[mod] = f"unavailable: {exc}"
    import sparsetorch_scipy

    out["sparsetorch_scipy"] = sparsetorch_scipy.__version__
    return out


def _write(part: str, payload: dict, out_dir: Path) -> None:
    payload = {
        "benchmark": f"plugins/scipy_backend/benchmarks/bench_scipy.py --part {part}",
        "command": " ".join([os.path.basename(sys.executable)] + [a for a in sys.argv]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "environment": {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")},
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        "versions": _versions(),
        **payload,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"scipy_{part}.json"
    path.write_text(json.dumps(payload, indent=1))
    print("wrote", path.relative_to(REPO) if path.is_relative_to(REPO) else path, flush=True)


def _rel_res(Asp: sp.csr_array, x: torch.Tensor | np.ndarray, b: np.ndarray) -> float:
    x = x.detach().numpy() if isinstance(x, torch.Tensor) else x
    return float(np.linalg.norm(b - Asp @ x) / np.linalg.norm(b))


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


# --- part 1: call overhead ------------------------------------------------------------------------
def part_overhead(args) -> dict:
    sizes = [64, 128] if args.quick else (args.sizes or [256, 1000])
    rows = []
    for m in sizes:
        Asp = poisson(m, 2)
        n = Asp.shape[0]
        Acsc = Asp.tocsc()
        A = st.from_package(Asp)
        b_np = np.ones(n)
        b = torch.from_numpy(b_np)
        lu_opts = dict(permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.1, options={"SymmetricMode": True})
        variants = {
            "default": {},
            "properties=spd": {"properties": "spd"},
            "properties=spd, check_finite=False": {"properties": "spd", "check_finite": False},
        }
        cg_only = {"properties=spd, curvature_check=False": {"properties": "spd",
                                                              "backend_options": {"curvature_check": False}}}
        for method in args.methods:
            reps = args.reps if (m < 1000 or method == "lu" or args.sizes) else max(2, args.reps - 1)
            variants_m = {**variants, **(cg_only if method == "cg" else {})}

            def direct():
                if method == "lu":
                    return spla.splu(Acsc, **lu_opts).solve(b_np), 0
                its = [0]

                def count(_):
                    its[0] += 1

                x, info = spla.cg(Asp, b_np, rtol=RTOL, callback=count)
                return x, its[0]

            def direct_new_values():
                # The direct call on a fresh copy of the values, as each sparsetorch call gets (a
                # fresh buffer streams measurably slower than the long-lived one: huge pages).
                if method == "lu":
                    M = sp.csc_array((Acsc.data.copy(), Acsc.indices, Acsc.indptr), shape=Acsc.shape)
                    return spla.splu(M, **lu_opts).solve(b_np), 0
                M = sp.csr_array((Asp.data.copy(), Asp.indices, Asp.indptr), shape=Asp.shape)
                its = [0]

                def count(_):
                    its[0] += 1

                x, info = spla.cg(M, b_np, rtol=RTOL, callback=count)
                return x, its[0]

            def ours(kw):
                # New values every call (a copy): the plan comes from the cache, the numeric phase
                # (SuperLU factorization) runs as in the direct call.
                Ai = A.with_values(A.values.clone())
                return st.solve(Ai, b, backend="scipy", method=method, rtol=RTOL, **kw), None

            for kw in variants_m.values():  # warm the plan cache and imports
                st.solve(A, b, backend="scipy", method=method, rtol=RTOL, **kw)
            times: dict[str, list[float]] = {"scipy": [], "scipy, new values": [], **{k: [] for k in variants_m}}
            iters, resid = {}, {}
            for _ in range(reps):
                t, (x, its) = _timed(direct)
                times["scipy"].append(t)
                iters["scipy"], resid["scipy"] = its, _rel_res(Asp, x, b_np)
                t, (x, its) = _timed(direct_new_values)
                times["scipy, new values"].append(t)
                resid["scipy, new values"] = _rel_res(Asp, x, b_np)
                for name, kw in variants_m.items():
                    t, (x, its) = _timed(lambda: ours(kw))
                    times[name].append(t)
                    resid[name] = _rel_res(Asp, x, b_np)
            # iterations from one more (untimed) call: return_info costs a product (the variants run the same plan)
            iters["sparsetorch"] = st.solve(A, b, backend="scipy", method=method, rtol=RTOL, return_info=True)[1].iterations
            best = {k: min(v) for k, v in times.items()}
            med = {k: statistics.median(v) for k, v in times.items()}
            row = {"problem": f"2-D Poisson {m}^2", "n": n, "nnz": int(Asp.nnz), "method": method, "reps": reps,
                   "times": times, "best": best, "median": med, "iterations": iters, "residual": resid,
                   "ratio_best": {k: best[k] / best["scipy"] for k in variants_m},
                   "ratio_median": {k: med[k] / med["scipy"] for k in variants_m},
                   "ratio_best_vs_new_values": {k: best[k] / best["scipy, new values"] for k in variants_m},
                   "ratio_median_vs_new_values": {k: med[k] / med["scipy, new values"] for k in variants_m}}
            rows.append(row)
            print(f"overhead {row['problem']:>18} {method}: scipy {best['scipy']:.4f}s  "
                  f"scipy, new values {best['scipy, new values']:.4f}s  "
                  + "  ".join(f"{k}: {best[k]:.4f}s ({row['ratio_best'][k]:.3f}x)" for k in variants_m)
                  + f"  iterations {iters}", flush=True)
    return {"what": "sparsetorch.solve(backend='scipy') vs the same SciPy call made directly; seconds per call, "
                    "interleaved repetitions", "rtol": RTOL,
            "direct_calls": {"lu": "splu(A_csc, permc_spec='MMD_AT_PLUS_A', diag_pivot_thresh=0.1, "
                                   "options={'SymmetricMode': True}).solve(b) (the plugin's options for symmetric patterns)",
                             "cg": "scipy.sparse.linalg.cg(A_csr, b, rtol=1e-6) with an iteration-counting callback"},
            "rows": rows}


# --- part 2 + 3: AMG vs CG vs LU, and torch-sla -----------------------------------------------------
OURS = [
    # label, method, preconditioner
    ("sparsetorch scipy cg+amg", "cg", "amg"),
    ("sparsetorch scipy cg", "cg", None),
    ("sparsetorch scipy cg+jacobi", "cg", "jacobi"),
    ("sparsetorch scipy amg", "amg", None),
    ("sparsetorch scipy lu", "lu", None),
]


def _ours(A: st.SparseTensor, b: torch.Tensor, method: str, pre: str | None) -> dict:
    s = st.Solver(A, backend="scipy", method=method, preconditioner=pre, rtol=RTOL, properties="spd")
    t_plan, _ = _timed(s.plan)
    t_setup, _ = _timed(s.factorize)
    t_solve, (x, info) = _timed(lambda: s.solve(b, return_info=True))
    return {"seconds": t_plan + t_setup + t_solve, "plan_seconds": t_plan, "setup_seconds": t_setup,
            "solve_seconds": t_solve, "iterations": info.iterations, "x": x}


def _torch_sla(Asp: sp.csr_array, b: torch.Tensor, backend: str, method: str) -> dict:
    import torch_sla

    coo = Asp.tocoo()
    val = torch.from_numpy(coo.data.copy())
    row = torch.from_numpy(coo.row.astype(np.int64))
    col = torch.from_numpy(coo.col.astype(np.int64))
    atol = RTOL * float(torch.linalg.vector_norm(b))
    kw = {"atol": atol, "maxiter": 20000}
    t, x = _timed(lambda: torch_sla.spsolve(val, row, col, tuple(Asp.shape), b, backend=backend, method=method, **kw))
    return {"seconds": t, "iterations": None, "x": x, "call": f"torch_sla.spsolve(val, row, col, shape, b, backend={backend!r}, "
            f"method={method!r}, atol=1e-6*||b||, maxiter=20000)"}


def part_problems(args) -> dict:
    problems = [(2, 128), (3, 16)] if args.quick else (
        [tuple(int(x) for x in p.split(":")) for p in args.problems] if args.problems else [(2, 1000), (3, 64)])
    rows = []
    from sparsetorch.backend import rates
    from sparsetorch_scipy import cost

    for dim, m in problems:
        Asp = poisson(m, dim)
        n = Asp.shape[0]
        A = st.from_package(Asp)
        b_np = np.ones(n)
        b = torch.from_numpy(b_np)
        row = {"problem": f"{dim}-D Poisson {m}^{dim}", "n": n, "nnz": int(Asp.nnz), "results": {}}
        cands = [(lbl, "ours", meth, pre) for lbl, meth, pre in OURS] + [
            ("torch-sla scipy lu", "tsla", "scipy", "lu"),
            ("torch-sla scipy cg", "tsla", "scipy", "cg"),
            ("torch-sla pytorch cg", "tsla", "pytorch", "cg"),
            ("torch-sla pyamg", "tsla", "pyamg", "amg"),
        ]
        for label, who, a1, a2 in cands:
            if args.only and not any(o in label for o in args.only):
                continue
            if "lu" in label and dim == 3 and not args.lu_3d:
                req = st.explain("solve", A, b, backend="scipy", method="lu", properties="spd")
                est = cost.lu_estimate(rates("cpu"), req.request)
                row["results"][label] = {"skipped": f"SuperLU on 3-D {m}^3: ~{est.fill / 1e6:.0f}M factor entries "
                                                    f"(~{est.fill * 12 / 2**30:.1f} GiB), estimated {est.seconds:.0f} s "
                                                    f"(48^3 measured 33 s in crossover_cpu.json); pass --lu-3d to run it"}
                print(f"{row['problem']}: {label} skipped", flush=True)
                continue
            if who == "ours":
                res = _ours(A, b, a1, a2)
            else:
                try:
                    res = _torch_sla(Asp, b, a1, a2)
                except Exception as exc:  # noqa: BLE001 (a peer's failure is a result)
                    row["results"][label] = {"error": f"{type(exc).__name__}: {exc}"}
                    print(f"{row['problem']}: {label} failed: {exc}", flush=True)
                    continue
            x = res.pop("x")
            res["residual"] = _rel_res(Asp, x, b_np)
            row["results"][label] = res
            print(f"{row['problem']}: {label}: {res['seconds']:.3f}s it={res.get('iterations')} "
                  f"res={res['residual']:.1e}" + (f" (setup {res['setup_seconds']:.3f}s, solve {res['solve_seconds']:.3f}s)"
                                                  if "setup_seconds" in res else ""), flush=True)
        done = {k: v for k, v in row["results"].items() if "seconds" in v and v["residual"] <= 1.01 * RTOL}
        row["fastest_converged"] = min(done, key=lambda k: done[k]["seconds"]) if done else None
        rows.append(row)
    return {"what": "one cold solve each (plan + setup + solve), b = ones, rtol 1e-6 (sparsetorch: ||b - A x|| <= "
                    "1e-6 ||b||; torch-sla: atol = 1e-6 ||b||); residual = true relative residual",
            "rtol": RTOL, "rows": rows}


# --- part 4: training loop ---------------------------------------------------------------------------
def _training_problem(m: int):
    """2-D Poisson with a learned diagonal: A(theta) = L + diag(softplus(theta)); the loss asks x
    to match a target field. Returns (A pattern tensor, base values, diagonal slots, b, target)."""
    Asp = poisson(m, 2)
    n = Asp.shape[0]
    A = st.from_package(Asp)
    coords, slot = A.entries()
    diag = slot[coords[0] == coords[1]]
    g = torch.Generator().manual_seed(0)
    b = torch.rand(n, generator=g, dtype=torch.float64)
    target = torch.rand(n, generator=g, dtype=torch.float64) * 0.01
    return A, A.values.detach().clone(), diag, b, target


def part_training(args) -> dict:
    import torch_sla

    m = 48 if args.quick else 256
    steps = 5 if args.quick else args.steps
    A, base, diag, b, target = _training_problem(m)
    n = b.shape[0]

    def values_of(theta):
        return base.index_add(0, diag, torch.nn.functional.softplus(theta))

    coo = st.from_package(poisson(m, 2)).entries()[0]
    rows_i, cols_i = coo[0].long(), coo[1].long()
    perm = A.entries()[1]

    def loop(solve_fn, setup, label):
        theta = torch.full((n,), -3.0, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.Adam([theta], lr=0.05)
        ctx = setup() if setup is not None else None
        times, losses = [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            opt.zero_grad()
            x = solve_fn(values_of(theta), ctx)
            loss = ((x - target) ** 2).mean()
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            losses.append(float(loss.detach()))
        st.plan_cache().clear()
        out = {"seconds_per_step_median": statistics.median(times), "seconds_per_step_first": times[0],
               "seconds_total": sum(times), "losses": [losses[0], losses[-1]]}
        print(f"training {label}: {out['seconds_per_step_median'] * 1e3:.1f} ms/step (first {times[0] * 1e3:.1f} ms), "
              f"loss {losses[0]:.6g} -> {losses[-1]:.6g}", flush=True)
        return out

    def st_solve(**kw):
        return lambda v, ctx: st.solve(A.with_values(v), b, backend="scipy", properties="spd", rtol=1e-8, **kw)

    def solver(**kw):
        def setup():
            return st.Solver(A, backend="scipy", properties="spd", rtol=1e-8, **kw)

        def run(v, s):
            s.update_values(v)
            return s.solve(b)

        return run, setup

    def tsla(backend, method):
        def run(v, ctx):
            vals = v[perm]  # torch-sla takes COO triples: values in entry order
            kw = {"atol": 1e-8 * float(torch.linalg.vector_norm(b)), "maxiter": 20000} if method != "lu" else {}
            return torch_sla.spsolve(vals, rows_i, cols_i, (n, n), b, backend=backend, method=method, **kw)

        return run

    results = {}
    results["sparsetorch scipy lu, plan cache"] = loop(st_solve(method="lu"), None, "lu cache")
    results["sparsetorch scipy lu, Solver.update_values"] = loop(*solver(method="lu"), "lu Solver")
    results["sparsetorch scipy lu, cache=False (fresh plan)"] = loop(st_solve(method="lu", cache=False), None, "lu fresh")
    results["torch-sla scipy lu"] = loop(tsla("scipy", "lu"), None, "torch-sla lu")
    amg = dict(method="cg", preconditioner="amg")
    results["sparsetorch scipy cg+amg, plan cache (hierarchy rebuilt per step)"] = loop(st_solve(**amg), None, "amg cache")
    results["sparsetorch scipy cg+amg, cache=False"] = loop(st_solve(**amg, cache=False), None, "amg fresh")
    for policy in ("pattern", 0.05):
        try:
            results[f"sparsetorch scipy cg+amg, amg_reuse={policy!r}"] = loop(
                st_solve(**amg, backend_options={"amg_reuse": policy}), None, f"amg reuse {policy}")
        except Exception as exc:  # noqa: BLE001 (an older plugin without amg_reuse)
            results[f"sparsetorch scipy cg+amg, amg_reuse={policy!r}"] = {"error": f"{type(exc).__name__}: {exc}"}
    results["torch-sla pyamg"] = loop(tsla("pyamg", "amg"), None, "torch-sla pyamg")
    return {"what": "Adam steps on theta: values = L + diag(softplus(theta)) -> x = A^-1 b -> loss = ||x - t||^2 -> "
                    "backward (adjoint solve) -> step; seconds per step (median, first), loss first and last",
            "problem": f"2-D Poisson {m}^2 with a learned diagonal", "n": n, "steps": steps, "rtol_iterative": 1e-8,
            "results": results}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("overhead", "problems", "training", "all"), default="all")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--sizes", type=int, nargs="*", help="overhead: grid sizes m of 2-D Poisson m^2 (default 256 1000)")
    ap.add_argument("--methods", nargs="*", default=["lu", "cg"], choices=["lu", "cg"], help="overhead: methods")
    ap.add_argument("--problems", nargs="*", help="problems: DIM:M pairs (default 2:1000 3:64)")
    ap.add_argument("--only", nargs="*", help="problems: run only candidates whose label contains one of these")
    ap.add_argument("--tag", default="", help="suffix of the JSON file name (scipy_<part><tag>.json)")
    ap.add_argument("--lu-3d", action="store_true", help="also run SuperLU on 3-D Poisson 64^3 (minutes, GBs)")
    ap.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    _register()
    out_dir = Path(args.out_dir)
    suffix = ("_quick" if args.quick else "") + args.tag
    for part, fn in (("overhead", part_overhead), ("problems", part_problems), ("training", part_training)):
        if args.part in (part, "all"):
            _write(part + suffix, fn(args), out_dir)


if __name__ == "__main__":
    main()

"""The default ``sparsetorch.solve(A, b)`` on matrices users bring, side by side with SciPy's
``spsolve`` and with every method dispatch could have pinned (issue 14, item 9).

    python benchmarks/bench_collection.py                          # every matrix, every family
    python benchmarks/bench_collection.py --only west,convdiff     # names containing these
    python benchmarks/bench_collection.py --no-families            # Matrix Market files only
    python benchmarks/bench_collection.py --matrices DIR           # another folder of .mtx files

The collection: every Matrix Market file in ``--matrices`` (default ``../shared/matrices`` beside
the repository, else ``tests/data``) plus the generated families of
:mod:`sparsetorch.testing.families` (``collection()``). Rectangular files are listed as skipped.
Per matrix, in float64 (complex128 for complex matrices), for two right-hand sides (``b = A @
x_true`` for a random ``x_true``, and a random ``b``):

- ``auto``: ``sparsetorch.solve(A, b, return_info=True)`` with no options: its choice (backend,
  method, preconditioner, iterations, the info's attempts where it records them), its time;
- ``scipy``: ``scipy.sparse.linalg.spsolve`` (SuperLU), its time, and whether it reported the
  matrix singular (MatrixRankWarning, or a non-finite answer);
- ``pinned``: each offer ``sparsetorch.explain("solve", A, b)`` lists, pinned by backend, method
  and preconditioner, asked for ``rtol=1e-10`` (the contract's float64 accuracy) and capped by
  ``maxiter`` and a wall-clock deadline (a callback that stops the iteration), so a failing
  method costs seconds, not minutes.

Every answer's relative residual ``||b - A x|| / ||b||`` is computed here, in SciPy float64 /
complex128, from the returned ``x``: no backend's own report is trusted. Errors are recorded by
type and message. A case passes the contract when its residual is <= max(100 x SciPy's, 1e-10),
or when it raises SingularMatrixError on a matrix SciPy reports singular or that is singular by
construction (a generated ``singular`` family member).

Times: the calling thread's CPU time (``--clock thread``, the default: every library runs in the
calling thread, one BLAS/torch/Eigen thread, so a busy shared machine taking the core away does
not count; ``--clock wall``: ``time.perf_counter``), each run on a fresh copy of the matrix with
A and b scaled by 2^run (exact, the same x; every auto and pinned run is a one-shot call, as
spsolve is, and none finds an earlier run's factorization), best of ``--repeats`` for runs under
0.1 s. The first run's time is kept too: later runs are warm in two ways a user's repeated
solves on one pattern are too, plans shared by pattern content (the pattern's symbolic analysis
is reused; spsolve has none to reuse) and what auto measured on the pattern (recognized by
content in the next fresh copy, so later runs may choose differently);
``auto_over_scipy_first_runs`` is the cold ratio, without either. Each matrix runs in its own subprocess (``--no-isolate`` to
turn off), so a crash (SIGSEGV) is recorded against the matrix rather than ending the run; each
subprocess first warms up (imports, plugin loading, first kernels) on small unrelated systems.
One intra-op torch thread (``--threads``).

Writes ``benchmarks/results/collection_cpu.json`` (``--out``) and prints a summary table. On a
shared 2-core machine compare ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import scipy
import scipy.io
import scipy.sparse as sp
import scipy.sparse.linalg as spla

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
CONTRACT_RTOL = 1e-10
FAST = 0.1  # seconds: runs faster than this are repeated


def default_matrices() -> Path:
    shared = REPO.parent / "shared" / "matrices"
    return shared if shared.is_dir() else REPO / "tests" / "data"


def rel(path: Path) -> str:
    """``path`` relative to the repository (no absolute paths of this machine in the output)."""
    try:
        return os.path.relpath(path.resolve(), REPO)
    except ValueError:
        return path.name


# --------------------------------------------------------------------------------------------
# the collection
# --------------------------------------------------------------------------------------------

def mtx_header(path: Path) -> dict:
    """The SuiteSparse header fields (name, kind) of a Matrix Market file, where it has them."""
    out = {}
    with open(path, "r", errors="replace") as f:
        first = f.readline()
        out["mm_header"] = first.strip()
        for line in f:
            if not line.startswith("%"):
                break
            body = line[1:].strip()
            for key in ("name", "kind"):
                if body.startswith(key + ":"):
                    out["suitesparse_" + key] = body.split(":", 1)[1].strip()
    return out


def list_cases(matrices: Path | None, families: bool, scale: float) -> list[dict]:
    cases = []
    if matrices is not None:
        for p in sorted(matrices.glob("*.mtx")):
            cases.append({"name": p.stem, "source": "matrix_market", "path": p, **mtx_header(p)})
    if families:
        from sparsetorch.testing import families as fam

        for g in fam.collection(scale=scale):
            cases.append({"name": g.name, "source": "family", "family": g.family, "description": g.description,
                          "generated": g, "singular_by_construction": g.singular})
    return cases


def load_matrix(case: dict) -> sp.csr_matrix:
    if case["source"] == "family":
        return case["generated"].matrix
    A = scipy.io.mmread(str(case["path"]))
    A = sp.csr_matrix(A)
    if A.dtype.kind in "iub":
        A = A.astype(np.float64)
    elif A.dtype.kind == "f":
        A = A.astype(np.float64)
    elif A.dtype.kind == "c":
        A = A.astype(np.complex128)
    A.sum_duplicates()
    A.sort_indices()
    return A


# --------------------------------------------------------------------------------------------
# one matrix
# --------------------------------------------------------------------------------------------

def residual(A: sp.csr_matrix, x, b: np.ndarray) -> float:
    """``||b - A x|| / ||b||`` in float64 / complex128, from ``x`` as returned (any array)."""
    x = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
    if x.shape != b.shape:
        return float("nan")
    x = x.astype(np.complex128 if (np.iscomplexobj(x) or np.iscomplexobj(A.data)) else np.float64)
    if not np.all(np.isfinite(x)):
        return float("inf")
    r = b - A @ x
    nb = np.linalg.norm(b)
    return float(np.linalg.norm(r) / (nb if nb > 0 else 1.0))


def err_record(exc: BaseException) -> dict:
    return {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc)[:600]}


#: the clock of every timed run: the calling thread's CPU time by default (``--clock thread``:
#: every library runs in the calling thread here, one BLAS, torch and Eigen thread, so it counts
#: all their work, and not the time other processes on a shared machine take the core away);
#: ``--clock wall`` for ``time.perf_counter``
CLOCK = time.thread_time


def timed(fn, repeats: int):
    """Run ``fn()`` (which builds its own fresh inputs and returns (value, seconds)); repeat runs
    faster than FAST up to ``repeats`` times in all; the best time and the last value. An
    exception on the first run propagates with its time (``exc._seconds``)."""
    value, best = fn()
    timed.first = best  # the first run's time (the caller reads it right after)
    runs = 1
    while runs < repeats and best < FAST:
        v, t = fn()
        runs += 1
        if t < best:
            best, value = t, v
    return value, best, runs


class Deadline(Exception):
    """Raised by the benchmark's callback when a pinned iterative run passes its time cap."""


def scipy_solve(A: sp.csr_matrix, b: np.ndarray, repeats: int) -> dict:
    Acsc = A.tocsc()

    def once():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = CLOCK()
            x = spla.spsolve(Acsc, b)
            t = CLOCK() - t0
        msgs = [f"{w.category.__name__}: {w.message}" for w in caught]
        return (x, msgs), t

    (x, msgs), t, runs = timed(once, repeats)
    singular = any("MatrixRankWarning" in m for m in msgs) or not np.all(np.isfinite(x))
    return {"seconds": t, "first_seconds": timed.first, "runs": runs, "residual": residual(A, x, b), "singular": bool(singular),
            "warnings": msgs[:3]}


def st_solve(A: sp.csr_matrix, b: np.ndarray, repeats: int, **kw) -> dict:
    """``sparsetorch.solve`` on a fresh SparseTensor per run (timed: the call only)."""
    import torch

    import sparsetorch as st

    bt = torch.from_numpy(b)
    deadline = kw.pop("_deadline", None)
    run = [0]

    def once():
        # each run's A and b are scaled by 2^run (exact: the same x): the values differ, so no run
        # finds the previous run's factorization (the pattern's analysis may be reused: what a
        # plan cache keyed by content does for a matrix rebuilt with new values)
        scale = 2.0 ** run[0]
        run[0] += 1
        T = st.SparseTensor.from_package(A * scale if scale != 1.0 else A.copy())
        bs = bt * scale if scale != 1.0 else bt
        opts = dict(kw)
        t0, w0 = CLOCK(), time.perf_counter()
        if deadline is not None:
            def cb(iteration, res):
                if time.perf_counter() - w0 > deadline:
                    raise Deadline(f"stopped by the benchmark after {deadline:.3g} s (iteration {iteration}, "
                                   f"reported residual {res:.3g})")
            opts["callback"] = cb
        try:
            x, info = st.solve(T, bs, return_info=True, **opts)
        except Exception as exc:  # noqa: BLE001 - a failure is data
            exc._seconds = CLOCK() - t0
            raise
        return (x, info), CLOCK() - t0

    try:
        (x, info), t, runs = timed(once, repeats)
    except Exception as exc:  # noqa: BLE001
        return {"seconds": getattr(exc, "_seconds", None), "runs": 1, "error": err_record(exc)}
    rec = {"seconds": t, "first_seconds": timed.first, "runs": runs, "residual": residual(A, x, b), "backend": info.backend, "method": info.method,
           "preconditioner": info.preconditioner, "iterations": info.iterations, "reported_residual": info.residual,
           "status": getattr(info.status, "value", str(info.status))}
    attempts = getattr(info, "attempts", None) or (info.extra or {}).get("attempts")
    if attempts:
        rec["attempts"] = json.loads(json.dumps(attempts, default=str))
    return rec


def verdict(rec: dict, scipy_rec: dict, singular_known: bool) -> str:
    """'ok', 'short' (accuracy shortfall), 'singular-missed', 'wrong-singular' or 'error:<Type>'."""
    singular = scipy_rec["singular"] or singular_known
    if "error" in rec:
        kind = rec["error"]["type"]
        if kind == "SingularMatrixError":
            return "ok" if singular else "wrong-singular"
        return f"error:{kind}"
    if scipy_rec["singular"]:
        # SciPy reports it singular: SingularMatrixError, or (b in the range) an x that solves the
        # system to the contract's residual, as tests/test_collection.py accepts
        return "ok" if rec["residual"] <= CONTRACT_RTOL else "singular-missed"
    if singular:
        # singular by construction, though SciPy's LU found no exact zero pivot: only a
        # consistent system can have a small residual, and such an x is still a solution;
        # anything else should have raised
        return "ok" if rec["residual"] <= CONTRACT_RTOL else "singular-missed"
    bound = max(100 * scipy_rec["residual"], CONTRACT_RTOL)
    return "ok" if rec["residual"] <= bound else "short"


def pinned_offers(A: sp.csr_matrix, b: np.ndarray) -> tuple[list[dict], str]:
    import torch

    import sparsetorch as st

    table = st.explain("solve", st.SparseTensor.from_package(A.copy()), torch.from_numpy(b))
    out = []
    for row in table.offers:
        o = row.offer
        out.append({"backend": o.backend, "method": o.method, "preconditioner": o.preconditioner,
                    "estimated_seconds": o.seconds, "chosen": row.chosen})
    return out, str(table)


def run_case(case: dict, args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    t_load = time.perf_counter()
    A = load_matrix(case)
    rec = {k: v for k, v in case.items() if k not in ("path", "generated")}
    if "path" in case:
        rec["file"] = rel(case["path"])
    rec.update({"n_rows": int(A.shape[0]), "n_cols": int(A.shape[1]), "nnz": int(A.nnz), "dtype": str(A.dtype),
                "load_seconds": time.perf_counter() - t_load})
    if A.shape[0] != A.shape[1]:
        rec["skipped"] = "rectangular: solve needs a square matrix (a least-squares problem)"
        return rec
    n = A.shape[0]
    cplx = np.iscomplexobj(A.data)
    rng = np.random.default_rng(args.seed)
    x_true = rng.standard_normal(n) + (1j * rng.standard_normal(n) if cplx else 0)
    b_rand = rng.standard_normal(n) + (1j * rng.standard_normal(n) if cplx else 0)
    rhs = {"A_x_true": A @ x_true, "random": b_rand}
    singular_known = bool(case.get("singular_by_construction", False))
    rec["rhs"] = {}
    for rname, b in rhs.items():
        b = np.ascontiguousarray(b, dtype=np.complex128 if cplx else np.float64)
        r = {}
        r["scipy"] = scipy_solve(A, b, args.repeats)
        r["auto"] = st_solve(A, b, args.repeats)
        r["auto"]["verdict"] = verdict(r["auto"], r["scipy"], singular_known)
        if not args.no_pinned and (args.pinned_rhs == "both" or rname == "A_x_true"):
            try:
                offers, table = pinned_offers(A, b)
            except Exception as exc:  # noqa: BLE001
                offers, table = [], None
                r["explain_error"] = err_record(exc)
            r["explain"] = table
            cap = max(args.pinned_timeout, args.pinned_factor * r["scipy"]["seconds"])
            pins = []
            for o in offers:
                kw = {"backend": o["backend"], "method": o["method"], "rtol": CONTRACT_RTOL,
                      "maxiter": args.pinned_maxiter, "_deadline": cap}
                if o["preconditioner"] is not None:
                    kw["preconditioner"] = o["preconditioner"]
                p = st_solve(A, b, args.repeats, **kw)
                p.update({"pinned": {k: o[k] for k in ("backend", "method", "preconditioner")},
                          "estimated_seconds": o["estimated_seconds"], "chosen_by_explain": o["chosen"],
                          "cap_seconds": cap})
                p["verdict"] = verdict(p, r["scipy"], singular_known)
                pins.append(p)
            r["pinned"] = pins
            good = [p for p in pins if p["verdict"] == "ok" and "error" not in p]
            r["best_pinned"] = (min(good, key=lambda p: p["seconds"])["pinned"] | {
                "seconds": min(p["seconds"] for p in good)}) if good else None
        rec["rhs"][rname] = r
    return rec


# --------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------

def warm_up() -> None:
    """Imports, plugin loading and first kernels, outside any timing."""
    import torch

    import sparsetorch as st
    from sparsetorch.testing import families as fam

    for g in (fam.poisson(6), fam.convection_diffusion(6, 10.0), fam.complex_symmetric(6),
              fam.helmholtz(6, 5.0)):
        A = g.matrix
        b = np.ones(A.shape[0], dtype=A.dtype)
        spla.spsolve(A.tocsc(), b)
        T = st.SparseTensor.from_package(A.copy())
        bt = torch.from_numpy(b)
        try:
            st.solve(T, bt)
        except Exception:  # noqa: BLE001 - only warming up
            pass
        for row in st.explain("solve", T, bt).offers:
            o = row.offer
            try:
                st.solve(st.SparseTensor.from_package(A.copy()), bt, backend=o.backend, method=o.method,
                         preconditioner=o.preconditioner, maxiter=50)
            except Exception:  # noqa: BLE001
                pass


def versions() -> dict:
    import torch

    import sparsetorch as st

    out = {"python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__,
           "torch": torch.__version__, "sparsetorch": st.__version__}
    try:
        out["plugins"] = {i.name: {"version": i.version, "distribution": i.distribution}
                          for i in st.registry().info()}
        out["plugins_broken"] = [str(b) for b in getattr(st.registry(), "broken", [])]
    except Exception as exc:  # noqa: BLE001
        out["plugins"] = {"error": err_record(exc)}
    try:
        out["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                           timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        out["git_dirty"] = bool(dirty)
    except Exception:  # noqa: BLE001
        pass
    return out


def worker_main(args) -> None:
    cases = {c["name"]: c for c in list_cases(args.matrices_path, not args.no_families, args.scale)}
    warm_up()
    rec = run_case(cases[args.worker], args)
    sys.stdout.write("\n@@RESULT@@" + json.dumps(rec, default=str) + "\n")


def run_isolated(case: dict, argv: list[str], timeout: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--worker", case["name"]]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"name": case["name"], "crash": f"timed out after {timeout:.0f} s (whole matrix)"}
    if p.returncode != 0 or "@@RESULT@@" not in p.stdout:
        how = f"signal {-p.returncode}" if p.returncode < 0 else f"exit status {p.returncode}"
        return {"name": case["name"], "crash": f"worker died: {how}", "stderr_tail": p.stderr[-2000:],
                "seconds": time.perf_counter() - t0}
    return json.loads(p.stdout.rsplit("@@RESULT@@", 1)[1])


def fmt(x, spec=".1e") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return format(x, spec)


def summarize(records: list[dict]) -> tuple[str, dict]:
    lines = [f"{'matrix':<34}{'rhs':<9}{'auto choice':<26}{'auto res':>9}{'scipy res':>10}{'auto/scipy':>11}"
             f"{'auto/best':>10}  verdict"]
    tot_auto = tot_scipy = tot_best = tot_auto_first = tot_scipy_first = 0.0
    counts: dict[str, int] = {}
    failing = []
    per_ratio_over3 = []
    for rec in records:
        if "skipped" in rec:
            lines.append(f"{rec['name']:<34}skipped: {rec['skipped']}")
            continue
        if "crash" in rec:
            lines.append(f"{rec['name']:<34}CRASH: {rec['crash']}")
            counts["crash"] = counts.get("crash", 0) + 1
            failing.append((rec["name"], "-", "crash: " + rec["crash"]))
            continue
        for rname, r in rec["rhs"].items():
            a, s = r["auto"], r["scipy"]
            choice = (f"{a['backend']}/{a['method']}" + (f"+{a['preconditioner']}" if a.get("preconditioner") else "")
                      if "error" not in a else f"! {a['error']['type']}")
            ratio = a["seconds"] / s["seconds"] if a.get("seconds") and s["seconds"] else None
            best = r.get("best_pinned")
            bratio = a["seconds"] / best["seconds"] if best and a.get("seconds") and "error" not in a else None
            if a.get("seconds") is not None:
                tot_auto += a["seconds"]
                tot_scipy += s["seconds"]
                tot_auto_first += a.get("first_seconds", a["seconds"])
                tot_scipy_first += s.get("first_seconds", s["seconds"])
                if best:
                    tot_best += best["seconds"]
            v = a["verdict"]
            counts[v] = counts.get(v, 0) + 1
            if v != "ok":
                failing.append((rec["name"], rname, v + (f" ({a['error']['message'][:120]})" if "error" in a else
                                                         f" (residual {a['residual']:.2e})")))
            if bratio is not None and bratio > 3:
                per_ratio_over3.append((rec["name"], rname, bratio))
            lines.append(f"{rec['name'][:33]:<34}{rname[:8]:<9}{choice[:25]:<26}{fmt(a.get('residual')):>9}"
                         f"{fmt(s['residual']):>10}{fmt(ratio, '.2f'):>11}{fmt(bratio, '.2f'):>10}  {v}"
                         + ("  [scipy: singular]" if s["singular"] else ""))
    totals = {"auto_seconds": tot_auto, "scipy_seconds": tot_scipy,
              "auto_over_scipy": tot_auto / tot_scipy if tot_scipy else None,
              "best_pinned_seconds_where_measured": tot_best,
              # the first run of each case only (no run before it in that process saw the pattern)
              "auto_first_run_seconds": tot_auto_first, "scipy_first_run_seconds": tot_scipy_first,
              "auto_over_scipy_first_runs": tot_auto_first / tot_scipy_first if tot_scipy_first else None,
              "verdicts": counts,
              "not_ok": [list(f) for f in failing],
              "auto_over_best_pinned_above_3": [[n, r, round(x, 2)] for n, r, x in per_ratio_over3]}
    lines.append("")
    lines.append(f"totals: auto {tot_auto:.3f} s, scipy spsolve {tot_scipy:.3f} s: auto / scipy = "
                 f"{fmt(totals['auto_over_scipy'], '.2f')}x  (over every solved or failed case, auto's time until it "
                 f"returned or raised)")
    lines.append(f"first runs only: auto {tot_auto_first:.3f} s, scipy {tot_scipy_first:.3f} s: "
                 f"{fmt(totals['auto_over_scipy_first_runs'], '.2f')}x")
    lines.append(f"verdicts: {counts}")
    lines.append(f"auto > 3x the best pinned method on {len(per_ratio_over3)} case(s)")
    for name, rname, why in failing:
        lines.append(f"  NOT OK  {name} [{rname}]: {why}")
    return "\n".join(lines), totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--matrices", default=None, help="folder of .mtx files (default ../shared/matrices, else "
                                                     "tests/data); 'none' for families only")
    ap.add_argument("--no-families", action="store_true")
    ap.add_argument("--scale", type=float, default=1.0, help="size factor of the generated families")
    ap.add_argument("--only", default=None, help="comma-separated substrings of matrix names to keep")
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs for runs under 0.1 s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--clock", choices=("thread", "wall"), default="thread",
                    help="thread: the calling thread's CPU time (one thread for every library); wall: perf_counter")
    ap.add_argument("--no-pinned", action="store_true", help="skip the pinned methods")
    ap.add_argument("--pinned-rhs", choices=("both", "first"), default="both",
                    help="run pinned methods for both right-hand sides or only b = A x_true")
    ap.add_argument("--pinned-maxiter", type=int, default=5000)
    ap.add_argument("--pinned-timeout", type=float, default=2.0, help="minimum wall-clock cap of a pinned run (s)")
    ap.add_argument("--pinned-factor", type=float, default=20.0, help="cap = max(timeout, factor x spsolve's time)")
    ap.add_argument("--no-isolate", action="store_true", help="run every matrix in this process")
    ap.add_argument("--matrix-timeout", type=float, default=900.0, help="seconds per matrix subprocess")
    ap.add_argument("--out", default=str(RESULTS / "collection_cpu.json"))
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.thread_time if args.clock == "thread" else time.perf_counter
    if args.clock == "thread":
        if args.threads != 1:
            ap.error("--clock thread counts the calling thread only: use it with --threads 1 (or --clock wall)")
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "SPARSETORCH_EIGEN_THREADS"):
            os.environ[var] = "1"
    if args.matrices == "none":
        args.matrices_path = None
    else:
        args.matrices_path = Path(args.matrices) if args.matrices else default_matrices()
    if args.worker:
        worker_main(args)
        return

    import torch

    torch.set_num_threads(args.threads)
    cases = list_cases(args.matrices_path, not args.no_families, args.scale)
    if args.only:
        keys = [k for k in args.only.split(",") if k]
        cases = [c for c in cases if any(k in c["name"] for k in keys)]
    passthrough = [a for a in sys.argv[1:]]
    records = []
    t_all = time.perf_counter()
    if args.no_isolate:
        warm_up()
    for case in cases:
        t0 = time.perf_counter()
        rectangular = case["source"] == "matrix_market" and len(set(scipy.io.mminfo(str(case["path"]))[:2])) == 2
        if args.no_isolate or rectangular:  # a rectangular one is only listed as skipped: no subprocess
            try:
                rec = run_case(case, args)
            except Exception as exc:  # noqa: BLE001
                rec = {"name": case["name"], "crash": f"benchmark error: {type(exc).__name__}: {exc}"}
        else:
            rec = run_isolated(case, passthrough, args.matrix_timeout)
        records.append(rec)
        a = rec.get("rhs", {}).get("A_x_true", {}).get("auto", {})
        print(f"[{time.perf_counter() - t_all:7.1f} s] {case['name']}: "
              + (rec.get("skipped") or rec.get("crash") or f"auto {a.get('verdict')}") + f" ({time.perf_counter() - t0:.1f} s)",
              flush=True)
    table, totals = summarize(records)
    result = {
        "benchmark": "collection",
        "command": "python benchmarks/bench_collection.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpu_count": os.cpu_count(),
                    "torch_threads": args.threads, "clock": args.clock,
                    "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
                    "note": "shared machine; quote ratios, not absolute times"},
        "versions": versions(),
        "settings": {"matrices": rel(args.matrices_path) if args.matrices_path else None,
                     "families": not args.no_families, "scale": args.scale, "repeats": args.repeats,
                     "seed": args.seed, "contract": "residual <= max(100 x scipy's, 1e-10); SingularMatrixError "
                                                     "where scipy reports singular or singular by construction",
                     "pinned": None if args.no_pinned else {"rtol": CONTRACT_RTOL, "maxiter": args.pinned_maxiter,
                                                             "cap": f"max({args.pinned_timeout} s, "
                                                                    f"{args.pinned_factor} x spsolve)",
                                                             "rhs": args.pinned_rhs},
                     "isolated": not args.no_isolate},
        "wall_seconds": time.perf_counter() - t_all,
        "totals": totals,
        "summary": table.splitlines(),
        "matrices": records,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(table)
    print(f"wrote {rel(Path(args.out))}")


if __name__ == "__main__":
    main()

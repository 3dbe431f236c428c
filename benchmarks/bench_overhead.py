"""Per-call host overhead of the core on small matrices: ``Matmul.execute``, one-shot ``matmul``,
one-shot ``solve`` (plan cache hit, and fresh index buffers holding the same indices: a
plan found by content since session 5), ``Solver.solve``.

The matrices are tiny (2-D Poisson 16x16, 256 unknowns) so the time is the core's own work:
validation, dispatch, the plan cache, locks, checks. Plugins are disabled and the torch
backend is pinned, so two trees of the core compare like with like::

    python benchmarks/bench_overhead.py --out benchmarks/results/overhead_cpu.json
    python benchmarks/bench_overhead.py --tree /path/to/old/checkout --label before --out before.json

``--tree`` runs the same measurements against another checkout's ``core`` (through a subprocess
with that tree first on ``sys.path``): the renovation's before/after in one run with
``--compare REV`` (a git revision, checked out into a temporary worktree).
Median of ``--reps`` calls after a warm-up, in the calling thread's CPU time (``time.thread_time``:
robust to a busy machine preempting the process), one intra-op thread; with ``--compare`` the two
trees alternate ``--rounds`` times (default 3) and the summary is the best run of each (the
least disturbed by other work on a shared machine; ``nice -n -15`` helps too).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def measure(reps: int) -> dict:
    os.environ["SPARSETORCH_DISABLE_PLUGINS"] = "1"
    import torch

    torch.set_num_threads(1)
    import sparsetorch as st
    from sparsetorch.testing.problems import poisson2d

    A = poisson2d(16, 16)
    n = A.shape[0]
    x = torch.ones(n, dtype=torch.float64)
    b = A.to_dense() @ x

    def median_us(fn) -> float:
        for _ in range(max(20, reps // 10)):
            fn()
        ts = []
        for _ in range(reps):
            # the calling thread's CPU time: a shared, busy machine preempts the process, which
            # wall time would count (torch runs one intra-op thread here, so this is all the work)
            t0 = time.thread_time()
            fn()
            ts.append(time.thread_time() - t0)
        return statistics.median(ts) * 1e6

    mm = st.Matmul(A, x, backend="torch")
    mm.plan()
    solver = st.Solver(A, backend="torch", method="lu")
    out = {
        "Matmul.execute": median_us(lambda: mm.execute()),
        "matmul one-shot (same pattern)": median_us(lambda: st.matmul(A, x, backend="torch")),
        "solve one-shot, lu (plan cache hit)": median_us(lambda: st.solve(A, b, backend="torch", method="lu")),
        "Solver.solve, lu": median_us(lambda: solver.solve(b)),
        "solve one-shot, lu (fresh buffers, same indices)": median_us(
            lambda: st.solve(_fresh(A), b, backend="torch", method="lu")),
    }
    # rows added in session 17 (a tree without them measures them too: the calls are old API)
    from sparsetorch.format import COO  # noqa: PLC0415

    out["A @ x (same pattern)"] = median_us(lambda: A @ x)
    out["convert CSR -> COO (first, cache emptied)"] = median_us(lambda: (A.clear_cache(), A.convert(COO)))
    return {"microseconds": out, "torch": torch.__version__, "sparsetorch": getattr(st, "__version__", "?")}


def _fresh(A):
    import sparsetorch as st

    k = A.format.num_levels
    return st.SparseTensor(A.format, A.shape, [A.pos(i).clone() if A.pos(i) is not None else None for i in range(k)],
                           [A.crd(i).clone() if A.crd(i) is not None else None for i in range(k)], A.values.clone())


def run_tree(tree: Path, reps: int) -> dict:
    code = (f"import sys, json; sys.path.insert(0, {str(tree / 'core')!r}); sys.path.insert(0, {str(HERE)!r}); "
            f"import bench_overhead as b; print(json.dumps(b.measure({reps})))")
    env = {**os.environ, "SPARSETORCH_DISABLE_PLUGINS": "1", "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--tree", type=Path, help="another checkout whose core to measure")
    ap.add_argument("--compare", help="a git revision to measure side by side with this tree")
    ap.add_argument("--label", default=None)
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the two trees with --compare")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = {}
    if args.compare:
        with tempfile.TemporaryDirectory() as tmp:
            wt = Path(tmp) / "old"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(wt), args.compare],
                           check=True, capture_output=True)
            try:
                # alternate the two trees so that machine load falls on both alike
                for _ in range(args.rounds):
                    rows.setdefault(f"before ({args.compare})", []).append(run_tree(wt, args.reps))
                    rows.setdefault("after (this tree)", []).append(run_tree(ROOT, args.reps))
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(wt)], capture_output=True)
    else:
        rows[args.label or ("tree" if args.tree else "this tree")] = [run_tree(args.tree or ROOT, args.reps)]
    summary = {}
    for label, runs in rows.items():
        keys = runs[0]["microseconds"].keys()
        summary[label] = {k: round(min(r["microseconds"][k] for r in runs), 1) for k in keys}
    for label, vals in summary.items():
        print(label)
        for k, v in vals.items():
            print(f"  {k:<45} {v:9.1f} us")
    if args.out:
        rec = {"benchmark": "bench_overhead", "command": "python benchmarks/bench_overhead.py " + " ".join(
                   a if not a.startswith("/") else Path(a).name for a in sys.argv[1:]),
               "date": time.strftime("%Y-%m-%d"), "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                                              "python": platform.python_version()},
               "settings": {"reps": args.reps, "rounds": args.rounds if args.compare else 1,
                            "matrix": "2-D Poisson 16x16 (256 unknowns), CSR float64",
                            "backend": "torch (plugins disabled)",
                            "statistic": "median thread CPU time per call, best of runs"},
               "results_us": summary, "runs": rows}
        args.out.write_text(json.dumps(rec, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Small CPU products and solves on an idle and on a busy machine (wall time, torch's default threads).

torch's CPU CSR kernels open an intra-op parallel region whatever the size of the product; so does
torch's advanced indexing (``t[idx]``) from a few thousand elements. While other processes keep the
cores busy, such a region waits until every thread of torch's pool is scheduled, and a product of
microseconds takes milliseconds. ``sparsetorch/tensor/_serial.py`` runs small CPU products serially
(NumPy) and the per-call gathers of ``st.solve`` use ``index_select``. This benchmark measures, in one
process:

- the product ``A @ x`` of 2-D Poisson matrices (256 / 1024 / 4096 unknowns) by torch's CSR kernel,
  by ``SerialCsr``, by SciPy, and through sparsetorch's torch-backend plan (``Matmul.execute``) with
  the serial path on and off (``_serial.SERIAL_MAX = 0``, the behaviour before);
- ``st.solve(A, b)`` against ``scipy.sparse.linalg.spsolve`` on the same systems;

in blocks of calls per case over four rounds, first with nothing else running, then with ``--busy`` background processes (default: one per core)
each looping over dense torch matmuls with torch's default threads (another training job, DataLoader
workers). Median and 90th percentile of wall time per call. Writes JSON::

    python benchmarks/bench_serial_spmv.py --out benchmarks/results/serial_spmv_cpu.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from pathlib import Path


def _busy(stop) -> None:  # a background process: dense matmuls with torch's default threads
    import torch

    a = torch.randn(256, 256)
    while not stop.is_set():
        for _ in range(20):
            a = torch.tanh(a @ a)


def _stats(ts: list[float]) -> dict:
    import numpy as np

    a = np.asarray(ts) * 1e6
    return {"median_us": round(float(np.median(a)), 1), "p90_us": round(float(np.percentile(a, 90)), 1),
            "mean_us": round(float(a.mean()), 1)}


def measure(reps: int) -> list[dict]:
    import scipy.sparse as sp
    import scipy.sparse.linalg as spl
    import torch

    import sparsetorch as st
    from sparsetorch.tensor import _serial

    rows = []
    for k in (16, 32, 64):
        T1 = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(k, k))
        A = (sp.kron(sp.eye(k), T1) + sp.kron(T1, sp.eye(k))).tocsr()
        n = A.shape[0]
        At = st.from_package(A)
        C = torch.sparse_csr_tensor(torch.from_numpy(A.indptr), torch.from_numpy(A.indices), torch.from_numpy(A.data),
                                    A.shape)
        x = torch.randn(n, dtype=torch.float64)
        b = x.numpy().copy()
        serial = _serial.SerialCsr(torch.from_numpy(A.indptr), torch.from_numpy(A.indices), A.shape)
        vals = torch.from_numpy(A.data)
        mm = st.Matmul(At, x, backend="torch")
        mm.plan()
        default_max = _serial.SERIAL_MAX

        def execute_off():
            _serial.SERIAL_MAX = 0
            try:
                return st.Matmul(At, x, backend="torch").execute()  # a fresh Matmul: binds without the serial path
            finally:
                _serial.SERIAL_MAX = default_max

        cases = {
            "torch csr @ x": lambda: C @ x,
            "SerialCsr": lambda: serial(vals, x),
            "scipy A @ x": lambda: A @ b,
            "Matmul.execute (torch backend)": mm.execute,
            "Matmul + execute, serial off": execute_off,
            "Matmul + execute, serial on": lambda: st.Matmul(At, x, backend="torch").execute(),
            "st.solve": lambda: st.solve(At, x),
            "scipy spsolve": lambda: spl.spsolve(A, b),
        }
        # blocks of calls per case (a case whose threads stall leaves torch's pool spinning, which
        # would slow the next case's call if calls alternated), in rounds (against drifting load);
        # each block's first calls are not counted
        ts: dict[str, list[float]] = {name: [] for name in cases}
        rounds = 4
        for _ in range(rounds):
            for name, f in cases.items():
                for _ in range(5):
                    f()
                for _ in range(max(1, reps // rounds)):
                    t0 = time.perf_counter()
                    f()
                    ts[name].append(time.perf_counter() - t0)
        for name in cases:
            rows.append({"n": n, "nnz": int(A.nnz), "case": name, **_stats(ts[name])})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="background processes in the busy run")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import numpy
    import scipy
    import torch

    result = {
        "benchmark": "bench_serial_spmv",
        "command": "python benchmarks/bench_serial_spmv.py " + " ".join(sys.argv[1:]),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
                     "scipy": scipy.__version__},
        "runs": {},
    }
    result["runs"]["idle"] = measure(args.reps)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_busy, args=(stop,), daemon=True) for _ in range(args.busy)]
    for p in procs:
        p.start()
    time.sleep(2.0)
    try:
        result["runs"][f"busy ({args.busy} background processes)"] = measure(args.reps)
    finally:
        stop.set()
        for p in procs:
            p.join(10)
    for run, rows in result["runs"].items():
        print(f"== {run}")
        for r in rows:
            print(f"  n={r['n']:5d} {r['case']:34s} median {r['median_us']:9.1f} us   p90 {r['p90_us']:9.1f} us")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

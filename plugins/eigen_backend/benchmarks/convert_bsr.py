"""CSR -> BSR: the compiled kernel (``sparsetorch_eigen.convert.csr_to_bsr``, canonical BSR) against
SciPy's ``tobsr`` (blocks in first-seen order) and ``tobsr`` + ``sort_indices`` (canonical).

Matrix: 20000 x 20000, ~1M entries at distinct random positions (``np.random.default_rng(0)``),
float64 values, CSR with sorted columns; block sizes (2, 2) and (4, 4). Timed, alternating the
calls in every round (in a new random order per round, so that drift and the state the previous
call leaves the allocator in fall on all of them alike):

- ``scipy_raw``: ``A.tobsr(blocksize=b)`` (what the kernel must stay within 1.2x of);
- ``scipy_sorted``: ``A.tobsr(blocksize=b)`` then ``sort_indices()``;
- ``ours``: ``csr_to_bsr(bh, bw, m, n, A.indptr, A.indices, A.data, max_blocks, False)``;
- ``ours_slots``: the same with ``want_slots=True`` (also the (nnz,) int64 map entry -> slot).

``scipy_sorted`` is timed in rounds of its own against ``ours`` (it frees large arrays, and the
call after it pays page faults for memory fresh from the OS: a few ms, on whichever call follows).
Both index dtypes (int32, int64) by default.

Reports medians (ms) and the median over rounds of each per-round ratio to ``scipy_raw`` (and
``ours`` to ``scipy_sorted``). The machine may be shared: ratios of neighbouring calls, not
absolute times, are the result. Checks
first that the kernel's output equals SciPy's canonical BSR bit for bit.

    OPENBLAS_NUM_THREADS=1 python plugins/eigen_backend/benchmarks/convert_bsr.py \\
        --out plugins/eigen_backend/benchmarks/results/convert_bsr.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import scipy
import scipy.sparse as sp

from sparsetorch_eigen import eigen_version
from sparsetorch_eigen.convert import csr_to_bsr

BIG = 2**62


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def matrix(n: int, nnz: int, index_dtype) -> sp.csr_array:
    rng = np.random.default_rng(0)
    lin = np.unique(rng.integers(0, n * n, nnz))  # sorted, distinct
    A = sp.csr_array((rng.standard_normal(lin.size), (lin // n, lin % n)), shape=(n, n))
    A.sort_indices()
    A.indptr = A.indptr.astype(index_dtype)
    A.indices = A.indices.astype(index_dtype)
    return A


def verify(A: sp.csr_array, bh: int, bw: int) -> int:
    m, n = A.shape
    bp, bj, data, slots = csr_to_bsr(bh, bw, m, n, A.indptr, A.indices, A.data, BIG, True)
    ref = A.tobsr(blocksize=(bh, bw))
    ref.sort_indices()
    assert np.array_equal(bp, ref.indptr) and np.array_equal(bj, ref.indices)
    assert np.array_equal(data.view(np.int64), ref.data.reshape(-1).view(np.int64))
    assert np.array_equal(data[slots].view(np.int64), A.data.view(np.int64))
    return int(bj.size)


def interleaved(fns: dict, rounds: int, seed: int) -> dict[str, list[float]]:
    """Seconds per call, all of fns once per round in a new random order (each call follows each
    other one about as often: the state a call leaves the allocator in falls on all alike)."""
    names = list(fns)
    for f in fns.values():  # warm-up
        f()
    times: dict[str, list[float]] = {k: [] for k in names}
    order = random.Random(seed)
    for _ in range(rounds):
        for k in order.sample(names, len(names)):
            t0 = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t0)
    return times


def summary(times: dict[str, list[float]], ref: str) -> dict:
    base = times[ref]
    return {
        "median_ms": {k: round(statistics.median(v) * 1e3, 3) for k, v in times.items()},
        f"ratio_to_{ref}": {k: round(statistics.median(t / b for t, b in zip(v, base)), 3)
                            for k, v in times.items() if k != ref},
    }


def run(A: sp.csr_array, bh: int, bw: int, rounds: int) -> dict:
    m, n = A.shape
    ptr, col, vals = A.indptr, A.indices, A.data

    def scipy_sorted():
        B = A.tobsr(blocksize=(bh, bw))
        B.sort_indices()

    ours = lambda: csr_to_bsr(bh, bw, m, n, ptr, col, vals, BIG, False)  # noqa: E731
    ours_slots = lambda: csr_to_bsr(bh, bw, m, n, ptr, col, vals, BIG, True)  # noqa: E731
    # scipy_sorted runs in rounds of its own: it frees large arrays, and the call after it gets
    # memory fresh from the OS and pays the page faults (measured: +3 to +4 ms for any of the
    # calls at BSR(2, 2), about a third), which would fall on whichever call follows it.
    main = interleaved({"scipy_raw": lambda: A.tobsr(blocksize=(bh, bw)), "ours": ours, "ours_slots": ours_slots},
                       rounds, 0)
    sort = interleaved({"scipy_sorted": scipy_sorted, "ours": ours}, rounds, 1)
    out = summary(main, "scipy_raw")
    out["against_scipy_sorted"] = summary(sort, "scipy_sorted")
    out["rounds"] = rounds
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--nnz", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--index-dtypes", default="int32,int64", help="index dtypes of the CSR, comma-separated")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    cases = {}
    nnz = 0
    for index_dtype in args.index_dtypes.split(","):
        A = matrix(args.n, args.nnz, np.dtype(index_dtype))
        nnz = int(A.nnz)
        for bh, bw in [(2, 2), (4, 4)]:
            nblocks = verify(A, bh, bw)
            res = run(A, bh, bw, args.rounds)
            res["nblocks"] = nblocks
            cases[f"{index_dtype} {bh}x{bw}"] = res
            srt = res["against_scipy_sorted"]
            print(f"{index_dtype} BSR({bh}, {bw}) {nblocks} blocks: "
                  + "  ".join(f"{k} {v:.2f} ms" for k, v in res["median_ms"].items())
                  + "  | / scipy_raw: " + "  ".join(f"{k} {v:.3f}" for k, v in res["ratio_to_scipy_raw"].items())
                  + f"  | scipy_sorted {srt['median_ms']['scipy_sorted']:.2f} ms, ours / scipy_sorted "
                  + f"{srt['ratio_to_scipy_sorted']['ours']:.3f}", flush=True)
    out = {
        "benchmark": "csr_to_bsr",
        "matrix": {"n": args.n, "nnz": nnz, "dtype": "float64", "index_dtypes": args.index_dtypes.split(","),
                   "generator": "np.random.default_rng(0): unique linear indices, sorted"},
        "cases": cases,
        "machine": {"platform": platform.platform(), "cpu": cpu_model(), "cpus": os.cpu_count(),
                    "python": sys.version.split()[0]},
        "versions": {"numpy": np.__version__, "scipy": scipy.__version__, "eigen": eigen_version()},
        "env": {k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS") if k in os.environ},
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()

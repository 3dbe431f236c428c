"""Where the time of a GPU CSR -> COO goes, ours against CuPy's ``tocoo`` (session 11, helper s11f).

    python benchmarks/profile_convert_s11f.py --out DIR

The matrix of bench_convert_gpu.py (uniform random 20000^2, ~1M nonzeros, float64), int64 and int32
indices. Per case, in one run:

- ``ab``: synchronised wall time per call, the implementations alternating one call each per round
  (median): ours on a prewrapped tensor (plan cache emptied), ours with a fresh wrap
  (``SparseTensor(..., check=False)`` + convert) with validate's pos[-1] memo (session 10) and with the
  memo disabled (``validate._last`` replaced by a plain read-back), the fresh wrap alone both ways,
  CuPy ``tocoo``;
- ``thr``: calls back to back, one synchronize (host-bound rate: the host time per call);
- ``device``: GPU kernel time per call (torch.profiler's CUDA activity: every kernel of the process, CuPy's
  included), with the kernels' names;
- ``cprofile``: the Python functions of our prewrapped call by own time (cProfile, 300 calls; cProfile's
  overhead inflates every entry, the ranking is what counts).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import platform
import pstats
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

import sparsetorch as st
from sparsetorch.format import COO, CSR
from sparsetorch.tensor import validate

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))

from common import thr as _thr  # noqa: E402


def alternate(fns: dict, reps: int) -> dict:
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def thr(fn, calls: int = 300, reps: int = 5) -> float:
    """:func:`common.thr` (benchmarks/gpu/common.py) with this profile's default number of calls."""
    return _thr(fn, calls, reps)


def device_time(fn, calls: int = 20) -> dict:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = {}
    total = 0.0
    for avg in prof.key_averages():
        t = getattr(avg, "self_device_time_total", None)
        if t is None:
            t = getattr(avg, "self_cuda_time_total", 0.0)
        if t <= 0 or not str(getattr(avg, "device_type", "")).endswith("CUDA"):
            continue
        kernels[avg.key[:60]] = t / calls
        total += t / calls
    return {"per_call_us": total, "kernels_us": kernels}


def cprof(fn, calls: int = 300, top: int = 14) -> list:
    fn()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    st_ = pstats.Stats(pr, stream=s)
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _) in sorted(st_.stats.items(), key=lambda kv: -kv[1][2])[:top]:
        rows.append({"func": f"{Path(file).name}:{line}:{func}", "calls_per_call": nc / calls, "own_us": tt / calls * 1e6,
                     "cum_us": ct / calls * 1e6})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--reps", type=int, default=41)
    args = ap.parse_args()
    import cupy
    import cupyx.scipy.sparse as csp

    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(0)
    n, nnz = 20000, 1_000_000
    rows = torch.randint(0, n, (nnz,), generator=g)
    cols = torch.randint(0, n, (nnz,), generator=g)
    vals = torch.randn(nnz, generator=g, dtype=torch.float64)
    A = st.SparseTensor.from_coo(vals.to(dev), rows.to(dev), cols.to(dev), shape=(n, n), format=CSR)
    A32 = A.convert(CSR, index_dtype=torch.int32)
    real_last = validate._last

    def fresh(t):
        return st.SparseTensor(t.format, t.shape, t.pos_buffers, t.crd_buffers, t.values, check=False)

    def no_memo(fn):
        def run():
            validate._last = lambda p: int(p[-1])
            try:
                return fn()
            finally:
                validate._last = real_last
        return run

    out_cases = []
    for label, src in (("int64", A), ("int32", A32)):
        m = csp.csr_matrix((cupy.from_dlpack(src.values), cupy.from_dlpack(src.crd(1).int()), cupy.from_dlpack(src.pos(1).int())),
                           shape=src.shape)
        pre = fresh(src)
        got = pre.convert(COO)
        ref = m.tocoo()
        assert torch.equal(got.crd(0).long().cpu(), torch.from_dlpack(ref.row).long().cpu())
        ours_pre = lambda: (pre.clear_cache(), pre.convert(COO))  # noqa: E731
        ours_fresh = lambda: fresh(src).convert(COO)  # noqa: E731
        wrap = lambda: fresh(src)  # noqa: E731
        cupy_coo = lambda: m.tocoo()  # noqa: E731
        fns = {"ours_prewrapped": ours_pre, "ours_fresh_memo": ours_fresh, "ours_fresh_nomemo": no_memo(ours_fresh),
               "wrap_memo": wrap, "wrap_nomemo": no_memo(wrap), "cupy_tocoo": cupy_coo}
        row = {"case": f"CSR->COO {label}", "ab_s": alternate(fns, args.reps)}
        row["ab_ratio_over_cupy"] = {k: v / row["ab_s"]["cupy_tocoo"] for k, v in row["ab_s"].items()}
        row["thr_s"] = {"ours_prewrapped": thr(ours_pre), "ours_fresh_memo": thr(ours_fresh), "wrap_memo": thr(wrap),
                        "cupy_tocoo": thr(cupy_coo), "empty_launch": thr(lambda: torch.cuda._sleep(0))}
        try:
            row["device"] = {"ours_prewrapped": device_time(ours_pre), "cupy_tocoo": device_time(cupy_coo)}
        except Exception as exc:  # noqa: BLE001 - the profiler's event API moves between versions
            row["device"] = {"error": repr(exc)}
        row["cprofile_ours_prewrapped"] = cprof(ours_pre)
        row["cprofile_ours_fresh_memo"] = cprof(ours_fresh, top=10)
        out_cases.append(row)
        print(json.dumps({k: row[k] for k in ("case", "ab_s", "thr_s")}, indent=None), flush=True)
        print("device", row["device"], flush=True)
        for r in row["cprofile_ours_prewrapped"][:10]:
            print(f"  {r['func'][:70]:70s} own {r['own_us']:6.2f} us  cum {r['cum_us']:7.2f} us  x{r['calls_per_call']:.1f}")
    doc = {"benchmark": "profile_convert_s11f", "command": " ".join([Path(sys.executable).name, *sys.argv]),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": {"platform": platform.platform(), "gpu": torch.cuda.get_device_name()},
           "versions": {"torch": torch.__version__, "cupy": cupy.__version__, "sparsetorch": st.__version__},
           "matrix": {"n": n, "nnz_requested": nnz, "nse": A.nse},
           "note": __doc__, "cases": out_cases}
    path = Path(args.out) / "profile_convert_s11f.json"
    path.write_text(json.dumps(doc, indent=1))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

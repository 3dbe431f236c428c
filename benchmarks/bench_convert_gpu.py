"""Format conversion on a GPU: sparsetorch vs CuPy (cupyx.scipy.sparse), side by side in one run.

A uniform random 20000 x 20000 float64 matrix with ~1M nonzeros (and a banded one for DIA) is
converted CSR -> format -> CSR on the device. Each repeat wraps the buffers in a fresh
SparseTensor, so the per-pattern conversion cache does not help ("ours"); the cached,
values-only re-conversion is reported as "ours_cached". CuPy's own conversions are timed where
CuPy has them (tocsc, tocoo, tocsr; todia does not exist in CuPy). Times are medians of CUDA-
synchronised wall time. Results are checked against CuPy/SciPy on the host once.

torch's own conversions (``torch.sparse_csr_tensor(...).to_sparse_csc()`` / ``to_sparse_coo()``)
are timed beside them ("torch_builtin_s"), and the CuPy cases are repeated on int32 indices (what
CuPy uses) as "ours_int32_s".

    python benchmarks/bench_convert_gpu.py          # writes benchmarks/results/convert_cuda.json
    python benchmarks/bench_convert_gpu.py --out benchmarks/results/convert_cuda_s6.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

import sparsetorch as st
from sparsetorch.format import BSR, COO, CSC, CSR, DELTA, DIA, ELL
from sparsetorch.tensor import construct

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "gpu"))

from common import thr as _thr  # noqa: E402


def timed(fn, reps=7):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def alternate(fns, reps):
    """Median seconds of each of ``fns``, timed one call each per round (synchronised), in turn."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def thr(fn, calls: int = 200, reps: int = 5) -> float:
    """:func:`common.thr` with this benchmark's default number of calls."""
    return _thr(fn, calls, reps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "results" / "convert_cuda.json"))
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--profile", action="store_true", help="print torch.profiler tables of the CuPy cases")
    ap.add_argument("--only-peers", action="store_true", help="only the cases CuPy has (CSR->CSC, CSR->COO, COO->CSR)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 1
    import cupy
    import cupyx.scipy.sparse as csp

    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(0)
    n, nnz = 20000, 1_000_000
    rows = torch.randint(0, n, (nnz,), generator=g)
    cols = torch.randint(0, n, (nnz,), generator=g)
    vals = torch.randn(nnz, generator=g, dtype=torch.float64)
    A = st.SparseTensor.from_coo(vals.to(dev), rows.to(dev), cols.to(dev), shape=(n, n), format=CSR)
    offs = torch.tensor([-200, -20, -1, 0, 1, 20, 200])
    k = torch.arange(n)
    br = torch.cat([k for _ in offs])
    bc = torch.cat([k + o for o in offs])
    ok = (bc >= 0) & (bc < n)
    B = st.SparseTensor.from_coo(torch.randn(int(ok.sum()), dtype=torch.float64).to(dev), br[ok].to(dev), bc[ok].to(dev),
                                 shape=(n, n), format=CSR)

    def fresh(t):
        return st.SparseTensor(t.format, t.shape, t.pos_buffers, t.crd_buffers, t.values, check=False)

    def cupy_csr(t):
        return csp.csr_matrix((cupy.from_dlpack(t.values), cupy.from_dlpack(t.crd(1).int()),
                               cupy.from_dlpack(t.pos(1).int())), shape=t.shape)

    reps = args.reps
    A32 = A.convert(CSR, index_dtype=torch.int32)

    def torch_csr(t):
        return torch.sparse_csr_tensor(t.pos(1), t.crd(1), t.values, size=t.shape)

    builtin = {"CSR->CSC": lambda t: torch_csr(t).to_sparse_csc(), "CSR->COO": lambda t: torch_csr(t).to_sparse_coo()}
    cases = []
    for name, src, fmt, peer in [
        ("CSR->CSC", A, CSC, lambda m: m.tocsc()),
        ("CSR->COO", A, COO, lambda m: m.tocoo()),
        ("CSR->BSR(2,2)", A, BSR(2, 2), None),
        ("CSR->ELL", A, ELL, None),
        ("CSR->DELTA(8)", A, DELTA(8), None),
        ("banded CSR->DIA", B, DIA, None),
    ]:
        if args.only_peers and peer is None:
            continue
        ours = timed(lambda: fresh(src).convert(fmt), reps)
        out = src.convert(fmt)
        back = timed(lambda: fresh(out).convert(CSR), reps)
        cached = timed(lambda: src.convert(fmt), reps)
        assert torch.equal(out.convert(CSR, drop_zeros=True).to_dense(), src.to_dense()), name
        row = {"case": name, "ours_s": ours, "ours_back_to_csr_s": back, "ours_cached_s": cached, "nse_out": out.nse}
        if peer is not None:
            m = cupy_csr(src)
            row["cupy_s"] = timed(lambda: peer(m), reps)
            row["ratio_ours_over_cupy"] = ours / row["cupy_s"]
            out32 = A32.convert(fmt)
            assert torch.equal(out32.to_dense(), src.to_dense()), name
            row["ours_int32_s"] = timed(lambda: fresh(A32).convert(fmt), reps)
            row["ratio_ours_int32_over_cupy"] = row["ours_int32_s"] / row["cupy_s"]
            row["ours_int32_back_to_csr_s"] = timed(lambda: fresh(out32).convert(CSR), reps)
            # without the wrapper (its structural checks read pos[-1] back: a sync): the tensor
            # exists already, as CuPy's matrix does; its plan cache is emptied before each call
            pre = fresh(src)
            row["ours_prewrapped_s"] = timed(lambda: (pre.clear_cache(), pre.convert(fmt)), reps)
            row["ratio_ours_prewrapped_over_cupy"] = row["ours_prewrapped_s"] / row["cupy_s"]
            pre32 = fresh(A32)
            row["ours_int32_prewrapped_s"] = timed(lambda: (pre32.clear_cache(), pre32.convert(fmt)), reps)
            # the alternatives of the GPU path in the same run (construct.EXPAND, construct.SORT16_MAX)
            alternatives = {"CSR->COO": (("repeat", "EXPAND", "repeat"), ("fused", "EXPAND", "fused")),
                            "CSR->CSC": (("key32", "SORT16_MAX", -1),)}
            for key, attr, alt in alternatives.get(name, ()):
                keep = getattr(construct, attr)
                setattr(construct, attr, alt)
                try:
                    got = fresh(src).convert(fmt)
                    assert torch.equal(got.to_dense(), src.to_dense()), (name, key)
                    row[f"ours_prewrapped_{key}_s"] = timed(lambda: (pre.clear_cache(), pre.convert(fmt)), reps)
                    row[f"ours_int32_prewrapped_{key}_s"] = timed(lambda: (pre32.clear_cache(), pre32.convert(fmt)), reps)
                finally:
                    setattr(construct, attr, keep)
            # host time alone: calls back to back, one synchronize (the GPU work queued behind)
            row["ours_prewrapped_thr_s"] = thr(lambda: (pre.clear_cache(), pre.convert(fmt)))
            row["cupy_thr_s"] = thr(lambda: peer(m))

            def general(p):
                """p's conversion through the general steps (construct.FAST_DIRECT off: the code before session 17)"""
                construct.FAST_DIRECT = False
                try:
                    p.clear_cache()
                    p.convert(fmt)
                finally:
                    construct.FAST_DIRECT = True

            row["ours_prewrapped_general_thr_s"] = thr(lambda: general(pre))
            # ours and CuPy alternately (one call each per round): drift of the machine hits both
            ab = alternate([lambda: (pre.clear_cache(), pre.convert(fmt)), lambda: peer(m),
                            lambda: (pre32.clear_cache(), pre32.convert(fmt)), lambda: fresh(src).convert(fmt),
                            lambda: fresh(A32).convert(fmt), lambda: fresh(src), lambda: fresh(A32),
                            lambda: general(pre), lambda: general(pre32)], max(reps, 41))
            (row["ours_prewrapped_ab_s"], row["cupy_ab_s"], row["ours_int32_prewrapped_ab_s"], row["ours_ab_s"],
             row["ours_int32_ab_s"], row["fresh_wrap_ab_s"], row["fresh_wrap_int32_ab_s"],
             row["ours_prewrapped_general_ab_s"], row["ours_int32_prewrapped_general_ab_s"]) = ab
            row["ratio_ours_prewrapped_ab_over_cupy"] = ab[0] / ab[1]
            row["ratio_ours_int32_prewrapped_ab_over_cupy"] = ab[2] / ab[1]
            row["ratio_ours_ab_over_cupy"] = ab[3] / ab[1]
            row["ratio_ours_int32_ab_over_cupy"] = ab[4] / ab[1]
            if name == "CSR->COO":  # where the host time of a CSR -> COO goes (calls back to back)
                ptr = pre.pos(1)
                unit = ptr.clone()  # not ptr itself: an in-place op moves its version counter (re-validation)
                nn = int(pre.nse)
                row["host_pieces_thr_s"] = {
                    "arange": thr(lambda: torch.arange(nn, dtype=ptr.dtype, device=ptr.device)),
                    "searchsorted": thr(lambda: torch.searchsorted(ptr[1:], ptr, right=True)),
                    "clone_ends": thr(lambda: ptr[::n].clone(memory_format=torch.contiguous_format)),
                    "_direct": thr(lambda: construct._direct(pre, fmt, torch.int64, True)),
                    "Conversion": thr(lambda: construct.Conversion(pre, fmt, torch.int64, None, values_too=True)),
                    "convert": row["ours_prewrapped_thr_s"],
                    "launch_unit": thr(lambda: unit.add_(0)),
                    "new_empty": thr(lambda: ptr.new_empty(nn)),
                }
                rows_kernel = construct._plugin_kernel("csr_rows")
                if rows_kernel is not None:  # the cuda plugin's step alone (checks, lookup, launch), its output kept
                    rows_out = ptr.new_empty(nn)
                    row["host_pieces_thr_s"]["csr_rows_plugin"] = thr(lambda: rows_kernel(ptr, rows_out))
                    row["host_pieces_thr_s"]["_expand"] = thr(lambda: construct._expand(ptr, n, nn))
            if args.profile:
                from torch.profiler import ProfilerActivity, profile

                for label, p in (("int64", pre), ("int32", pre32)):
                    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                        for _ in range(5):
                            p.clear_cache()
                            p.convert(fmt)
                        torch.cuda.synchronize()
                    print(name, label, "5 calls")
                    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=16, max_name_column_width=40))
        if name in builtin:
            row["torch_builtin_s"] = timed(lambda: builtin[name](src), reps)
        cases.append(row)
        print({k: (f"{v:.5f}" if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    m = cupy_csr(A).tocoo()
    for label, base in (("COO->CSR", A), ("COO->CSR int32", A32)):
        coo = base.convert(COO)
        assert torch.equal(fresh(coo).convert(CSR).to_dense(), A.to_dense())
        cases.append({"case": label, "ours_s": timed(lambda: fresh(coo).convert(CSR), reps),
                      "cupy_s": timed(lambda: m.tocsr(), reps)})
        cases[-1]["ratio_ours_over_cupy"] = cases[-1]["ours_s"] / cases[-1]["cupy_s"]
        print(cases[-1], flush=True)
    out = {
        "benchmark": "convert_gpu",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "gpu": torch.cuda.get_device_name()},
        "versions": {"torch": torch.__version__, "cupy": cupy.__version__, "sparsetorch": st.__version__},
        "matrix": {"n": n, "nnz_requested": nnz, "nse": A.nse, "banded_nse": B.nse},
        "note": (f"median of {reps} CUDA-synchronised runs after a warm-up; 'ours' = first conversion of a pattern "
                 "(int64 indices, as from_coo makes them; 'ours_int32' on int32 indices as CuPy's); CuPy's "
                 "matrices have int32 indices; 'torch_builtin' = torch.sparse_csr_tensor(...).to_sparse_csc()/"
                 "to_sparse_coo() on the int64 buffers; '_repeat' / '_fused' / '_key32': the same code with "
                 "construct.EXPAND = 'repeat' / 'fused' / construct.SORT16_MAX = -1 (32-bit sort keys); '_thr_s': "
                 "calls back to back, one synchronize (host-bound rate); '_ab_s': ours (prewrapped and fresh, int64 "
                 "and int32; '_general': construct.FAST_DIRECT off, the general steps the short path replaced in "
                 "session 17), CuPy, and the fresh wrap alone (SparseTensor(..., check=False): its structural "
                 "checks read pos[-1] back, a device-to-host copy) timed alternately, one call each per round, median"),
        "cases": cases,
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Device time of the CSR -> COO row expansion, kernel by kernel (torch.profiler's CUDA activity):
the cuda plugin's ``csr_rows`` against the core's torch paths (arange + searchsorted, repeat_interleave,
torch's fused CSR -> COO index kernel) and CuPy's ``tocoo`` (cuSPARSE csr2coo), on the matrix of
benchmarks/bench_convert_gpu.py (20000^2, ~1M uniform random nonzeros) and on a skewed one (one row
holding half the entries). Writes JSON (--out).

    python benchmarks/gpu/s16/csr_rows_kernel.py --out benchmarks/results/csr_rows_h200_s16.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone

import torch
from torch.profiler import ProfilerActivity, profile


def matrices(dev):
    g = torch.Generator().manual_seed(0)
    n, nnz = 20000, 1_000_000
    lin = torch.unique(torch.randint(0, n * n, (nnz,), generator=g))
    rows = lin // n
    counts = torch.bincount(rows, minlength=n)
    yield "uniform 20000^2 1M", counts
    skew = counts.clone()
    skew[n // 3] += int(counts.sum())  # one row with half the entries
    yield "skewed (one row of 50 %)", skew


def kernel_us(fn, calls=50):
    """Mean device microseconds per call of the CUDA kernels ``fn`` launches."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = sum(e.device_time_total for e in prof.key_averages() if e.device_time_total and not e.key.startswith("Memcpy"))
    # key_averages lists the kernels and the ops that launched them: keep kernels only
    kern = [e for e in prof.key_averages() if e.device_type.name == "CUDA"] if hasattr(prof.key_averages()[0], "device_type") else []
    if kern:
        total = sum(e.device_time_total for e in kern)
    names = sorted({e.key for e in kern})[:6]
    return total / calls, names


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = torch.device("cuda")
    from sparsetorch_cuda.convert import csr_rows

    rows = []
    for label, counts in matrices(dev):
        for idt in (torch.int64, torch.int32):
            ptr = torch.zeros(counts.numel() + 1, dtype=idt)
            ptr[1:] = torch.cumsum(counts, 0)
            ptr = ptr.to(dev)
            nnz = int(ptr[-1])
            out = torch.empty(nnz, dtype=idt, device=dev)
            ref = torch.repeat_interleave(torch.arange(counts.numel(), device=dev), counts.to(dev)).to(idt)
            assert csr_rows(ptr, out) and torch.equal(out, ref), "csr_rows is wrong"
            i32 = idt == torch.int32
            cases = {
                "ours csr_rows": lambda: csr_rows(ptr, out),
                "torch arange + searchsorted": lambda: torch.searchsorted(
                    ptr[1:], torch.arange(nnz, dtype=idt, device=dev), right=True, out_int32=i32),
                "torch repeat_interleave": lambda: torch.repeat_interleave(ptr[1:] - ptr[:-1], output_size=nnz),
            }
            if hasattr(torch, "_convert_indices_from_csr_to_coo"):
                cols = torch.empty(nnz, dtype=idt, device=dev)
                cases["torch fused csr->coo"] = lambda: torch._convert_indices_from_csr_to_coo(ptr, cols, out_int32=i32)
            try:
                import cupy
                import cupyx.scipy.sparse as cps

                if i32:
                    cm = cps.csr_matrix((cupy.ones(nnz, dtype=cupy.float32), cupy.zeros(nnz, dtype=cupy.int32),
                                         cupy.asarray(ptr)), shape=(counts.numel(), 1))
                    cases["cupy tocoo (cuSPARSE csr2coo)"] = lambda: cm.tocoo()
            except Exception as exc:  # noqa: BLE001
                print("cupy:", exc)
            for name, fn in cases.items():
                us, kn = kernel_us(fn)
                row = {"matrix": label, "index": str(idt).replace("torch.", ""), "impl": name, "kernel_us": us, "kernels": kn}
                print({k: v for k, v in row.items() if k != "kernels"}, flush=True)
                rows.append(row)
    out = {"benchmark": "csr_rows_kernel", "command": " ".join(sys.argv), "date": datetime.now(timezone.utc).isoformat(),
           "machine": platform.node(), "gpu": torch.cuda.get_device_name(), "versions": {"torch": torch.__version__},
           "note": "device time per call from torch.profiler (CUDA kernels only, mean of 50 calls); host time excluded",
           "rows": rows}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

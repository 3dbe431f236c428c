"""Session 8: batch-1 SpMV of 90 % pruned LLM layers (half precision, bias fused) -- csr16_xs1 (session 6)
against the csr16_xv* / csr16_x12* kernels (kernels/mma.cu) and dense cuBLAS (F.linear), side by side in
one run, with the parts of the time (diagnostic builds) and programmatic dependent launch (PDL).

    python plugins/cuda_kernels/benchmarks/bench_s8_llm.py --out DIR [--shapes 4096x4096,4096x11008]
                                                           [--dtypes float16,bfloat16]

W (out x in) pruned by magnitude to 90 % (benchmarks/bench_llm.py's rule, CSR int32), x one column,
bias fused: per-call time of 20 calls captured in one CUDA graph, median of 15 replays' CUDA-event
times (bench_llm_gpu.py's graph20). Rows:

- ``dense``: F.linear(x, W, b); ``tiny``: a 1-block kernel (the graph's per-launch floor);
- ``xs1``, ``xv_<T>``, ``xvf_<T>``, ``x12_<T>``, ``x12f_<T>``, ``xva_<T>``, ``x12a_<T>``, ``xr_<T>[_c<C>]``,
  ``auto_<T>``: the plan's launch (``plan.apply``) with ``plan.csr16_kernel`` set, T threads per block
  (C copies of X for xr; default 8); ``xr_bank_stats``: the plan's count of gather wavefronts per row;
- ``diag_<kernel>_<T>_d<F>``: the diagnostic builds (timing only): F = 1 no bank conflicts (X[lane]),
  2 no copy of X, 4 no value / column loads, 8 the empty grid of the same shape;
- ``pdl_<kernel>[_trig]``: the same kernel launched by cuLaunchKernelEx with the programmatic-stream-
  serialization attribute (each call may start while the one before it finishes; ``griddepcontrol.wait``
  in the kernel orders every read of values / X and the write of Y after it), ``_trig``: with
  ``griddepcontrol.launch_dependents`` at the start of each kernel (flags = 1). Not what the plan's
  launch does today (launch.py has no PDL launch): a measurement of what it would give.

Errors are max |y - ref| / max |ref| against a float32 product of the same half-precision operands.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "benchmarks"))
sys.path.insert(0, str(HERE))

from sparsetorch_cuda import _mma  # noqa: E402
from sparsetorch_cuda.launch import _driver, _launch_config, kernel, raw_stream  # noqa: E402
from sparsetorch_cuda.plan import CudaSpmmPlan  # noqa: E402

from bench_s5 import graph_time, kernel_regs as _kernel_regs, pruned_layer, record_variant  # noqa: E402


class PdlLaunch:
    """One kernel launch by cuLaunchKernelEx, optionally with the programmatic-stream-serialization
    attribute, on torch's current stream (captured by torch.cuda.graph)."""

    def __init__(self, kern, grid: int, block: int, args: tuple[int, ...], shared: int, pdl: bool = True) -> None:
        cu = _driver()
        self.cu, self.fn = cu, kern._fn
        self.args = np.array([int(a) & 0xFFFFFFFFFFFFFFFF for a in args], dtype=np.uint64)
        self.ptrs = np.array([self.args.ctypes.data + 8 * i for i in range(len(args))], dtype=np.uint64)
        self.cfg = _launch_config(cu, self.fn, (grid, 1), block, shared, pdl)

    def __call__(self) -> None:
        self.cfg.hStream = self.cu.CUstream(raw_stream(torch.cuda.current_device()))
        (err,) = self.cu.cuLaunchKernelEx(self.cfg, self.fn, int(self.ptrs.ctypes.data), 0)
        if int(err) != 0:
            raise RuntimeError(f"cuLaunchKernelEx failed ({int(err)})")


def kernel_regs(names: list[str], dtype: torch.dtype) -> dict:
    return _kernel_regs(names, dtype, lambda name: 9 if name.startswith("csr16_x") and name != "csr16_xs1" else 8)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="4096x4096,4096x11008")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--variants", default="x12:1024,x12a:1024,x12a:512,xr:1024,xr:512,xr:1024:4,xr:1024:2,auto:1024")
    ap.add_argument("--diag", default="x12a:1024:1.4,xr:1024:1,xv:1024:8",
                    help="kernel:threads:F.F.. diagnostic builds csr16_<kernel>_d<F> timed (4096x4096 float16)")
    ap.add_argument("--pdl", default="x12a:1024,xr:1024", help="kernel:threads timed with PDL launches")
    ap.add_argument("--name", default="llm_s8_bench.json")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    dev = torch.device("cuda")
    tiny = torch.zeros(8, dtype=torch.float16, device=dev)
    one = kernel("mma", "csr16_xv_d8", torch.float16, torch.int32, 0, 9)
    tiny_us = graph_time(lambda: one((1, 1), 32, (1, 8, tiny.data_ptr(), tiny.data_ptr(), tiny.data_ptr(), tiny.data_ptr(), 0,
                                                    tiny.data_ptr(), 0)), 15) * 1e6
    print(f"one tiny kernel: {tiny_us:.2f} us per call in a graph of 20", flush=True)
    rows_out = []
    for shape in args.shapes.split(","):
        n_in, n_out = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        base = torch.nn.Linear(n_in, n_out)
        for dname in args.dtypes.split(","):
            dtype = getattr(torch, dname)
            dense, A, W, b = pruned_layer(base, dtype, "90 %", dev)
            plan = CudaSpmmPlan(A)
            plan.set_values(A.values)
            x = torch.randn(1, n_in, device=dev, dtype=dtype)
            ref = x.float() @ W.float().T + b.float()
            row = {"in": n_in, "out": n_out, "sparsity": "90 %", "dtype": dname, "k": 1, "nnz": plan.nnz,
                   "times_us": {}, "errors": {}}
            t = row["times_us"]

            def rec(name, fn, y=None, row=row, ref=ref, plan=plan):
                record_variant(row, name, fn, ref, plan=plan, y=y)

            rec("dense", lambda: torch.nn.functional.linear(x, W, b))
            call = lambda: plan.apply(x.mT, bias=b)  # noqa: E731
            plan.csr16_kernel = "xs1"
            rec("xs1", call)
            for cfg in args.variants.split(","):
                kn, th, *cp = cfg.split(":")
                plan.csr16_kernel, plan.csr16_threads = kn, int(th)
                plan.csr16_copies = int(cp[0]) if cp else _mma.CSR16_XR_COPIES
                rec(f"{kn}_{th}" + (f"_c{cp[0]}" if cp else ""), call)
                if kn == "xr":
                    row.setdefault("xr_bank_stats", {})[f"copies={plan.csr16_copies}"] = plan._mma_layout().get("xr_stats")
            plan.csr16_copies = _mma.CSR16_XR_COPIES
            lay = plan._mma_layout()
            v = plan._values
            y = torch.empty(n_out, dtype=dtype, device=dev)

            def kargs(name, flags=0):
                if name == "xr":
                    plan.csr16_copies = _mma.CSR16_XR_COPIES
                    col = plan._xr_cols()
                    flags |= (_mma.CSR16_XR_COPIES << 8) | (_mma._xr_stride(n_in) << 16)
                else:
                    col = plan._col12() if name.startswith("x12") else lay["col"]
                return (n_out, n_in, lay["rowptr"].data_ptr(), col.data_ptr(), v.data_ptr(), x.data_ptr(), b.data_ptr(),
                        y.data_ptr(), flags)

            if (n_in, n_out, dname) == (4096, 4096, "float16"):
                for cfg in [s for s in args.diag.split(",") if s]:
                    kn, th, fl = cfg.split(":")
                    for f in fl.split("."):
                        kern = kernel("mma", f"csr16_{kn}_d{f}", dtype, torch.int32, 0, 9)
                        smem = _mma._xs_bytes(kn, n_in)
                        _mma._allow_smem(kern, 0, smem)
                        fn = lambda kern=kern, kn=kn, smem=smem, th=int(th): kern((-(-n_out // (th // 32)), 1), th, kargs(kn),  # noqa: E731
                                                                                  shared=smem)
                        tt = graph_time(fn, 15)
                        t[f"diag_{kn}_{th}_d{f}"] = tt * 1e6 if isinstance(tt, float) else tt
            for cfg in [s for s in args.pdl.split(",") if s]:
                kn, th = cfg.split(":")
                th_i = int(th)
                kern = kernel("mma", _mma.CSR16_XV_KERNELS[kn], dtype, torch.int32, 0, 9)
                smem = -(-_mma._xs_bytes(kn, n_in) // 16) * 16
                _mma._allow_smem(kern, 0, smem)
                grid = -(-n_out // (th_i // 32))
                for suffix, flags, pdl in (("_nopdl", 0, False), ("", 0, True), ("_trig", 1, True)):
                    la = PdlLaunch(kern, grid, th_i, kargs(kn, flags), smem, pdl)
                    y.zero_()
                    rec(f"pdl_{kn}_{th}{suffix}", la, y)
            ours = {kk: vv for kk, vv in t.items() if kk != "dense" and not kk.startswith("diag") and isinstance(vv, float)}
            if ours and isinstance(t.get("dense"), float):
                best = min(ours, key=ours.get)
                row["best"] = best
                row["speedups_vs_dense"] = {kk: round(t["dense"] / vv, 3) for kk, vv in ours.items()}
            rows_out.append(row)
            print(f"{n_in}x{n_out} {dname:8s} " + " ".join(
                f"{kk}={vv:.2f}" if isinstance(vv, float) else f"{kk}={vv}" for kk, vv in t.items())
                + f" | best {row.get('best')} x{row.get('speedups_vs_dense', {}).get(row.get('best'), float('nan'))} "
                f"maxerr={max(row['errors'].values()):.1e}", flush=True)
            plan = A = W = dense = None  # noqa: F841
            torch.cuda.empty_cache()
    names = ["csr16_xs1", *_mma.CSR16_XV_KERNELS.values()]
    doc = {"benchmark": "cuda plugin session 8: batch-1 SpMV kernels on 90 % pruned LLM layers against dense cuBLAS "
                        "(kernel time, CUDA graph of 20 calls, bias fused)",
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "command": "python plugins/cuda_kernels/benchmarks/bench_s8_llm.py " + " ".join(sys.argv[1:]),
           "commit": args.commit,
           "machine": {"platform": platform.platform(), "gpu": torch.cuda.get_device_name(0)},
           "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()},
           "tiny_kernel_graph20_us": tiny_us,
           "kernels_float16": kernel_regs(names, torch.float16),
           "rows": rows_out}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / args.name).write_text(json.dumps(doc, indent=1))
    print(f"wrote {out / args.name}")


if __name__ == "__main__":
    main()

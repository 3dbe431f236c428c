"""Session 14: where the DELTA(4) half kernel's fixed cost (4.7 us per call on an 8192^2 matrix with one
entry, against ~1 us for a trivial torch kernel in the same CUDA graph; floor_probe_h200_s14*.json) goes.
delta_tc8pkbx_b4 (kernels/delta.cu, benchmarking only, wrong results) is tc8pkb with parts switched off by
flags: 1 return right after griddepcontrol.wait, 2 no copy of X into shared memory, 4 no barrier after it,
8 no stores of Y, 16 no row-pointer reads for the rows after the first, 32 return after the barrier. Each
flag set timed as graph_time does (20 launches in a CUDA graph, with programmatic dependent launch as the
plan launches tc8pkb), on the one-entry matrix and on the 10 % one.

    python benchmarks/gpu/s14/skeleton_probe.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/

import sparsetorch as st  # noqa: E402
from bench_cuda_kernels import graph_time  # noqa: E402
from sparsetorch.format import DELTA  # noqa: E402

FLAGS = (0, 1, 32, 2, 2 | 4, 8, 16, 2 | 8 | 16, 2 | 4 | 8 | 16)


def main() -> int:
    from sparsetorch_cuda.launch import allow_pdl, kernel
    from sparsetorch_cuda.layout import _sm_count
    from sparsetorch_cuda.plan import CudaSpmmPlan

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(3)
    rows = []
    for dens in (0.0, 0.1):
        mask = torch.rand(8192, 8192, device=dev, generator=gen) < dens
        mask[0, 0] = True
        W = (torch.randn(8192, 8192, device=dev, dtype=torch.float64, generator=gen) * mask).half()
        x = torch.randn(8192, 1, device=dev, dtype=torch.float64, generator=gen).half()
        A = st.SparseTensor.from_dense(W, mask=mask).convert(DELTA(4), index_dtype=torch.int32)
        p = CudaSpmmPlan(A, variant="tc8pkb")
        p.set_values(A.values)
        ref = p.apply(x)
        y = torch.empty_like(ref)
        kern = kernel("delta", "delta_tc8pkbx_b4", torch.float16, torch.int32, dev.index or 0, 10)
        allow_pdl(kern, dev.index or 0)
        m, n = p.shape
        smem = -(-(n + 64) * 2 // 16) * 16
        grid = max(1, min(-(-m // 32), _sm_count(dev.index or 0)))
        ub = p._unit_bases()
        for flags in FLAGS:
            args = (m, n, p.nnz, p.rowptr.data_ptr(), p.words.data_ptr(), A.values.data_ptr(), x.data_ptr(), y.data_ptr(),
                    ub.data_ptr(), flags)

            def fn(args=args):
                kern((grid, 1), 1024, args, shared=smem, pdl=True)

            fn()
            torch.cuda.synchronize()
            ok = bool(torch.equal(y, ref)) if flags == 0 else None
            t = graph_time(fn)
            rows.append({"density": dens, "flags": flags, "per_call_us": t * 1e6, "matches_plan": ok})
            print(f"{dens:4.0%} flags {flags:3d}: {t * 1e6:6.2f} us{'' if ok is None else f' (equal to the plan: {ok})'}",
                  flush=True)
        del W, mask, A
    out = {"benchmark": "skeleton_probe (session 14)", "command": " ".join(["python", *sys.argv]),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows,
           "flags": "1 return after griddepcontrol.wait, 2 no X copy, 4 no barrier, 8 no Y stores, "
                    "16 no row pointers after the first row, 32 return after the barrier"}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "skeleton_probe_h200_s14.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

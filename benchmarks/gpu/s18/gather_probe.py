"""Session 18: where the DELTA(4) half default at 50 % (tc8pkbfr, 28.7 us cold on 8192^2 against cuBLAS GEMV's
36-38 us; issue 16 asks <= ~26) and at 10 % (tc8pkbr-like work, 10.3 us cold) spends its time. delta_tc8pkbfrx_b4
(kernels/delta.cu, benchmarking only, wrong results) is tc8pkbfr with parts switched off by flags: 64 the X gathers
at conflict-free addresses (the same count of shared-memory loads, lane L on word L: the bank conflicts' cost),
128 no X gathers (X read as 1.0; the gap decode then mostly drops out too), and the session-14 flags (1 return after
griddepcontrol.wait, 32 return after the X copy and its barrier). (Flag 256, no loads after a row's first step, is
left out: its stale bases sent gathers past the copy of X, an illegal address, in the first run.) The probe build is
itself slower than the default (runtime flag tests in the loop): compare its rows with each other. Each flag set
timed as graph_time
does (20 launches in a CUDA graph, programmatic dependent launch), warm (one matrix) and cold (copies of the
matrix, its plan arrays and X holding three L2s, cycled), on matrices drawn as bench_s11_delta draws them.

    python benchmarks/gpu/s18/gather_probe.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/

import sparsetorch as st  # noqa: E402
from bench_cuda_kernels import cold_copies, cycle, graph_time  # noqa: E402
from sparsetorch.format import DELTA  # noqa: E402

FLAGS = (0, 64, 128, 1, 32)


def main() -> int:
    from sparsetorch_cuda.launch import allow_pdl, kernel
    from sparsetorch_cuda.layout import _sm_count
    from sparsetorch_cuda.plan import CudaSpmmPlan

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--densities", default="0.5,0.1")
    a = ap.parse_args()
    dev = torch.device("cuda")
    di = dev.index or 0
    gen = torch.Generator(device=dev).manual_seed(5)
    rows = []
    kern = kernel("delta", "delta_tc8pkbfrx_b4", torch.float16, torch.int32, di, 10)
    allow_pdl(kern, di)
    for dens in (float(d) for d in a.densities.split(",")):
        mask = torch.rand(8192, 8192, device=dev, generator=gen) < dens
        W = (torch.randn(8192, 8192, device=dev, dtype=torch.float64, generator=gen) * mask).half()
        x = torch.randn(8192, 1, device=dev, dtype=torch.float64, generator=gen).half()
        A = st.SparseTensor.from_dense(W, mask=mask).convert(DELTA(4), index_dtype=torch.int32)
        del W
        nbytes = 2.5 * A.nse + 0.25 * A.nse  # values, gap words, unit bases
        ncopy = cold_copies(nbytes)
        plans = []
        for i in range(ncopy):
            Ai = A if i == 0 else A.clone()
            p = CudaSpmmPlan(Ai, variant="tc8pkbfr")
            p.set_values(Ai.values)
            plans.append((p, Ai.values, x if i == 0 else x.clone()))
        ref = plans[0][0].apply(x)
        m, n = plans[0][0].shape
        smem = -(-(n + 64) * 2 // 16) * 16
        grid = max(1, min(-(-m // 32), _sm_count(di)))
        for flags in FLAGS:
            ys = [torch.empty_like(ref) for _ in plans]

            def launcher(p, v, xi, y, flags=flags):
                args = (m, n, p.nnz, p.rowptr.data_ptr(), p.words.data_ptr(), v.data_ptr(), xi.data_ptr(), y.data_ptr(),
                        p._unit_bases().data_ptr(), flags)
                return lambda: kern((grid, 1), 1024, args, shared=smem, pdl=True)

            fns = [launcher(p, v, xi, y) for (p, v, xi), y in zip(plans, ys)]
            fns[0]()
            torch.cuda.synchronize()
            ok = bool(torch.equal(ys[0], ref)) if flags == 0 else None
            warm = graph_time(fns[0])
            cold = graph_time(cycle(fns))
            rows.append({"density": dens, "flags": flags, "warm_us": warm * 1e6, "cold_us": cold * 1e6, "copies": ncopy,
                         "stored": int(A.nse), "matches_plan": ok})
            print(f"{dens:4.0%} flags {flags:3d}: warm {warm * 1e6:6.2f} us, cold {cold * 1e6:6.2f} us"
                  f"{'' if ok is None else f' (equal to the plan: {ok})'}", flush=True)
        del plans, A, mask
        torch.cuda.empty_cache()
    out = {"benchmark": "gather_probe (session 18)", "command": " ".join(["python", *sys.argv]),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows,
           "flags": "64 conflict-free X gathers, 128 no X gathers, 256 no loads after a row's first step (tc8pkbfr)"}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "gather_probe_h200_s18.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

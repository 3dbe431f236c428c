"""Session 18: would a dense route help the batch-64 forward of a pruned layer? Times, on one H200 and in one
run (20 calls in a CUDA graph, as bench_llm_gpu's graph20 column): dense ``F.linear``; the plan's product
(``CudaSpmmPlan.apply`` on x^T, the tensor-core SpMM the layer runs today); and a forward "dense route" as the
backward already has one (plan.DENSE_ROUTE): the values scattered into a zeroed dense (m, n) buffer, then
``F.linear`` on it (zero + index_copy + GEMM, all captured). Layers 4096^2 and 4096 -> 11008 at 90 %, batch 64,
fp16; the outputs are checked against a float32 reference.

    python benchmarks/gpu/s18/dense_route_fwd.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/

import sparsetorch as st  # noqa: E402
from bench_cuda_kernels import graph_time  # noqa: E402
from sparsetorch.format import CSR  # noqa: E402


def main() -> int:
    from sparsetorch_cuda.plan import CudaSpmmPlan

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(7)
    rows = []
    for n_in, n_out in ((4096, 4096), (4096, 11008)):
        for dtype in (torch.float16, torch.bfloat16):
            mask = torch.rand(n_out, n_in, device=dev, generator=g) < 0.1
            W = (torch.randn(n_out, n_in, device=dev, generator=g) * 0.02 * mask).to(dtype)
            x = torch.randn(64, n_in, device=dev, generator=g).to(dtype)
            A = st.SparseTensor.from_dense(W, mask=mask).convert(CSR, index_dtype=torch.int32)
            p = CudaSpmmPlan(A)
            p.set_values(A.values)
            rowptr, col = A.pos(1).long(), A.crd(1).long()
            r = torch.repeat_interleave(torch.arange(n_out, device=dev), rowptr[1:] - rowptr[:-1])
            flat = r * n_in + col
            buf = torch.empty(n_out, n_in, device=dev, dtype=dtype)
            vals = A.values

            def route(buf=buf, flat=flat, vals=vals, x=x):
                buf.zero_()
                buf.view(-1).index_copy_(0, flat, vals)
                return F.linear(x, buf)

            ref = x.float() @ W.float().T
            outs = {"dense F.linear": lambda x=x, W=W: F.linear(x, W), "plan.apply (today)": lambda p=p, x=x: p.apply(x.mT).mT,
                    "dense route (zero + index_copy + GEMM)": route}
            for name, fn in outs.items():
                err = float((fn().float() - ref).norm() / ref.norm())
                t = graph_time(fn)
                rows.append({"layer": f"{n_in}x{n_out}", "dtype": str(dtype), "impl": name, "graph20_us": t * 1e6,
                             "rel_err": err, "plan_kernel": getattr(p, "variant", None)})
                print(f"{n_in}x{n_out} {dtype} {name:<40} {t * 1e6:7.1f} us  err {err:.1e}", flush=True)
            outs.clear()
            torch.cuda.empty_cache()
    out = {"benchmark": "dense_route_fwd (session 18)", "command": " ".join(["python", *sys.argv]),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "dense_route_fwd_h200_s18.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

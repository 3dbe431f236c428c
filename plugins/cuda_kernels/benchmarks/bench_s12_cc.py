"""Session 12: the plan's default product with and without the non-finite fix-up (spmm_fixup;
"auto_fixup": ``mma_nonfinite = "sparse"``, timed between two runs of the default); spmm_cc with one
cluster reduction after the last round ("once", the ``_o`` builds) against the per-round build, dense
F.linear and the plan's default kernel, magnitude-pruned fp16 layers; and the empty skeletons (flags 15)
of both.

    python plugins/cuda_kernels/benchmarks/bench_s12_cc.py --out DIR [--ks 1,16,64,128] [--shapes 4096x4096,4096x11008]
    python plugins/cuda_kernels/benchmarks/bench_s12_cc.py --profile      # one launch of each, for Nsight Compute
                                                                           # (spmm_cc builds; the plan's ws / fl / bm)

Times: 20 calls in one CUDA graph, median of 15 replays (bench_s5.graph_time). Errors: relative 2-norm against a
float64 product of the same operands.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import sparsetorch as st  # noqa: E402
from sparsetorch.format import CSR  # noqa: E402
from sparsetorch_cuda import _spmm_cc  # noqa: E402
from sparsetorch_cuda.plan import CudaSpmmPlan  # noqa: E402

from bench_s5 import graph_time  # noqa: E402


def layer(out_f: int, in_f: int, density: float, seed: int, dtype=torch.float16):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(in_f, out_f, device="cuda", dtype=dtype)
    W = lin.weight.detach().clone()
    thr = W.abs().float().flatten().kthvalue(int((1 - density) * W.numel())).values
    W = (W * (W.abs() > thr)).contiguous()
    A = st.SparseTensor.from_dense(W, mask=W != 0).convert(CSR, index_dtype=torch.int32)
    return W, lin.bias.detach().contiguous(), A


def err(y, ref) -> float:
    return float(torch.linalg.vector_norm(y.double() - ref) / torch.linalg.vector_norm(ref))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--ks", default="1,16,64,128")
    ap.add_argument("--shapes", default="4096x4096,4096x11008")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    if a.profile:
        W, b, A = layer(4096, 4096, a.density, 1)
        x = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
        out = torch.empty(64, 4096, device="cuda", dtype=torch.float16)
        for once in (False, True):
            for flags in (0, 15):
                op = _spmm_cc.CcSpmm(A.pos(1), A.crd(1), A.values, (4096, 4096), clusters=8, fmt="dense",
                                     once=once, flags=flags)
                op(x, b, out=out)
                torch.cuda.synchronize()
        plan = CudaSpmmPlan(A)  # the plan's default (spmm_ws at k = 64), spmm_fl, spmm_bm: for the same profile
        plan.set_values(A.values)
        for kind in ("auto", "fl", "bm"):
            plan.mma_kernel = kind
            plan._prepared.clear()
            plan.apply(x.mT, bias=b)
            torch.cuda.synchronize()
        return 0
    rows = []
    for shape in a.shapes.split(","):
        in_f, out_f = (int(v) for v in shape.split("x"))
        W, b, A = layer(out_f, in_f, a.density, in_f + out_f)
        plan = CudaSpmmPlan(A)
        plan.set_values(A.values)
        plan_s = CudaSpmmPlan(A)  # sparse semantics for non-finite X: the product and spmm_fixup (session 12)
        plan_s.set_values(A.values)
        plan_s.mma_nonfinite = "sparse"
        ops = {o: _spmm_cc.CcSpmm(A.pos(1), A.crd(1), A.values, (out_f, in_f), fmt="dense", once=o) for o in (False, True)}
        for k in (int(v) for v in a.ks.split(",")):
            x = torch.randn(k, in_f, device="cuda", dtype=torch.float16)
            ref = x.double() @ W.double().T + b.double()
            row = {"layer": f"{in_f}->{out_f}", "density": a.density, "k": k}
            row["dense_us"] = round(graph_time(lambda: torch.nn.functional.linear(x, W, b), 15) * 1e6, 3)
            row["auto_err"] = err(plan.apply(x.mT, bias=b).mT, ref)
            row["auto_us"] = round(graph_time(lambda plan=plan: plan.apply(x.mT, bias=b), 15) * 1e6, 3)
            row["auto_fixup_us"] = round(graph_time(lambda plan=plan_s: plan.apply(x.mT, bias=b), 15) * 1e6, 3)
            row["auto_us_again"] = round(graph_time(lambda plan=plan: plan.apply(x.mT, bias=b), 15) * 1e6, 3)
            for once, op in ops.items():
                tag = "once" if once else "rounds"
                out = torch.full((k, out_f), float("nan"), dtype=torch.float16, device="cuda")
                row[f"cc_{tag}_kernel"] = op._launch_args(k)[0].name
                row[f"cc_{tag}_err"] = err(op(x, b, out=out), ref)
                row[f"cc_{tag}_us"] = round(graph_time(lambda op=op, out=out: op(x, b, out=out), 15) * 1e6, 3)
                if k > 16 and op.C == 8:
                    op.flags = 15
                    row[f"cc_{tag}_skeleton_us"] = round(graph_time(lambda op=op, out=out: op(x, b, out=out), 15) * 1e6, 3)
                    op.flags = 0
            rows.append(row)
            print(" ".join(f"{kk}={v:.3g}" if isinstance(v, float) else f"{kk}={v}" for kk, v in row.items()), flush=True)
        del ops, plan, plan_s
    if a.out:
        doc = {"benchmark": "bench_s12_cc", "command": " ".join(["python", *sys.argv]),
               "date": datetime.now(timezone.utc).isoformat(), "machine": platform.node(),
               "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "method": "20 calls in one CUDA graph, median of 15 replays, per call", "rows": rows}
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "bench_s12_cc.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Session 6: csr16_xs (X in shared memory, kernels/mma.cu) against csr16_warp at k = 1, and the
tensor-core SpMM (spmm_mma) per cluster size at k >= 8, on LLM-sized layers, side by side with
dense cuBLAS (F.linear) in one run. (A bitmask tensor-core SpMM, spmm_bm, was measured with this
script at commit 6b27252 and left out: cuda_kernels_h200_s6.json, _s6_ablation.json.)

    python plugins/cuda_kernels/benchmarks/bench_s6.py --out DIR [--ks 1,8,64] [--dtypes float16,bfloat16]

W (out x in) pruned as benchmarks/bench_llm.py prunes (magnitude 90 % / 50 %: CSR; 2:4: NM(2, 4)),
X^T of k columns as a linear layer holds it (``(k, in)`` contiguous), bias fused: per-call time of
20 calls captured in one CUDA graph (median of 10 replays), the same measure as bench_s5.py and
benchmarks/bench_llm_gpu.py's graph20. Errors against a float32 product of the same operands.
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
sys.path.insert(0, str(HERE.parents[2] / "benchmarks"))
sys.path.insert(0, str(HERE))

from sparsetorch_cuda.launch import kernel  # noqa: E402
from sparsetorch_cuda.plan import CudaSpmmPlan  # noqa: E402

from bench_llm import RULES  # noqa: E402
from bench_s5 import copy_bw, graph_time, kernel_regs, pruned_layer  # noqa: E402


def kernel_info(names: list[str], dtype: torch.dtype) -> dict:
    """Registers and local (spill) bytes per thread of each kernel, from the driver."""
    return kernel_regs(names, dtype, lambda name: 12 if name.startswith("spmm") else 7 if name == "csr16_warp" else 8)


def _layer(n_in: int, n_out: int, rule: str, dtype: torch.dtype):
    torch.manual_seed(0)
    base = torch.nn.Linear(n_in, n_out)
    dense = torch.nn.Linear(n_in, n_out).to("cuda", dtype)
    with torch.no_grad():
        dense.weight.copy_(base.weight)
        dense.bias.copy_(base.bias)
    A = RULES[rule]()("layer", dense)
    plan = CudaSpmmPlan(A)
    plan.set_values(A.values)
    return A, plan, dense.bias.detach()


def profile() -> None:
    """One call of each kernel of interest between cudaProfilerStart / Stop (for ncu
    --profile-from-start off): csr16_xs1 and csr16_warp (k = 1), spmm_mma (k = 64)."""
    A, plan, b = _layer(4096, 4096, "90 %", torch.float16)
    x1 = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    x64 = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
    calls = []
    for kern in ("xs1", "warp"):
        calls.append((kern, x1))
    calls.append(("xs1", x64))
    for kern, x in calls:  # warm: compile, layouts (the recorded launches are dropped per call)
        plan.csr16_kernel = kern
        plan._prepared = {}
        plan.apply(x.mT, bias=b)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for kern, x in calls:
        plan.csr16_kernel = kern
        plan._prepared = {}
        plan.apply(x.mT, bias=b)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", action="store_true", help="one call per kernel inside cudaProfilerStart/Stop")
    ap.add_argument("--out")
    ap.add_argument("--shapes", default="4096x4096,4096x11008")
    ap.add_argument("--ks", default="1,8,64")
    ap.add_argument("--sparsities", default="90 %,2:4,50 %")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--splits", default="auto,4,8")
    args = ap.parse_args()
    if args.profile:
        profile()
        return
    if not args.out:
        ap.error("--out is required")
    dev = torch.device("cuda")
    bw = copy_bw()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    tiny = torch.zeros(1, dtype=torch.float16, device=dev)
    one = kernel("mma", "add_bias", torch.float16, torch.int32, 0, 6)
    empty_us = graph_time(lambda: one((1, 1), 32, (1, 1, 1, 1, tiny.data_ptr(), tiny.data_ptr()))) * 1e6
    print(f"one tiny kernel: {empty_us:.2f} us per call in a graph of 20", flush=True)
    rows = []
    ks = [int(v) for v in args.ks.split(",")]
    for shape in args.shapes.split(","):
        n_in, n_out = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        base = torch.nn.Linear(n_in, n_out)
        by_name = {r.replace(" ", ""): r for r in RULES}  # "90%" or "90 %"
        for rule in [by_name[s.strip().replace(" ", "")] for s in args.sparsities.split(",")]:
            for dname in args.dtypes.split(","):
                dtype = getattr(torch, dname)
                dense, A, W, b = pruned_layer(base, dtype, rule, dev)
                plan = CudaSpmmPlan(A)
                plan.set_values(A.values)
                for k in ks:
                    x = torch.randn(k, n_in, device=dev, dtype=dtype)
                    ref = x.float() @ W.float().T + b.float()
                    row = {"in": n_in, "out": n_out, "sparsity": rule, "dtype": dname, "k": k, "nnz": plan.nnz,
                           "format": A.format.name, "times_us": {}, "errors": {}}
                    t = row["times_us"]

                    def rec(name, fn):
                        plan._prepared = {}
                        y = fn()
                        yy = y if y.shape == ref.shape else y.mT
                        row["errors"][name] = float((yy.float() - ref).abs().max() / ref.abs().max())
                        tt = graph_time(fn)
                        t[name] = tt * 1e6 if isinstance(tt, float) else tt

                    rec("dense", lambda: torch.nn.functional.linear(x, W, b))
                    call = lambda: plan.apply(x.mT, bias=b)  # noqa: E731
                    if k == 1:
                        for kern in ("warp", "xs1", "xs2") if plan.kind != "nm" else ("default",):
                            plan.csr16_kernel = kern
                            rec(f"csr16_{kern}", call)
                        del plan.csr16_kernel
                    elif plan.kind == "nm":
                        rec("tile_Sauto", call)
                    else:
                        for s in args.splits.split(","):
                            plan.mma_split_override = None if s == "auto" else int(s)
                            rec(f"tile_S{s}", call)
                        plan.mma_split_override = None
                    ours = {kk: v for kk, v in t.items() if kk != "dense" and isinstance(v, float)}
                    if ours:
                        best = min(ours, key=ours.get)
                        row["best"] = best
                        row["speedup_vs_dense"] = t["dense"] / ours[best]
                        row["speedups_vs_dense"] = {kk: t["dense"] / v for kk, v in ours.items()}
                    rows.append(row)
                    print(f"{n_in}x{n_out} {rule:>5s} {dname:8s} k={k:<3d} " + " ".join(
                        f"{kk}={v:.2f}" if isinstance(v, float) else f"{kk}=n/c" for kk, v in t.items())
                        + f" | best {row.get('best')} x{row.get('speedup_vs_dense', float('nan')):.2f} "
                        f"err={max(row['errors'].values()):.1e}", flush=True)
                plan = A = W = dense = None  # noqa: F841
                torch.cuda.empty_cache()
    names = ["spmm_mma_s4", "spmm_mma_s8", "csr16_warp", "csr16_xs1", "csr16_xs2"]
    doc = {"benchmark": "cuda plugin session 6: bitmask tensor-core SpMM and csr16_xs on LLM layers "
                        "(kernel time, CUDA graph of 20 calls, dense cuBLAS in the same run)",
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "command": "python plugins/cuda_kernels/benchmarks/bench_s6.py " + " ".join(sys.argv[1:]),
           "machine": {"gpu": torch.cuda.get_device_name(0), "platform": platform.platform()},
           "versions": {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda},
           "copy_bandwidth_bytes_per_s": bw, "tiny_kernel_graph20_us": empty_us,
           "kernels_float16": kernel_info(names, torch.float16), "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_kernels_h200_s6.json").write_text(json.dumps(doc, indent=1))
    print("wrote", out / "cuda_kernels_h200_s6.json")


if __name__ == "__main__":
    main()

"""Session 7: the pipelined CSR tensor-core SpMM (spmm_fl<BM>_s<S>, kernels/mma.cu) against the
earlier spmm_mma_s<S> and dense cuBLAS (F.linear) on pruned LLM layers, side by side in one run.

    python plugins/cuda_kernels/benchmarks/bench_s7.py --out DIR [--ks 64,8] [--dtypes float16,bfloat16]

W (out x in) pruned by magnitude to 90 % (benchmarks/bench_llm.py's rule, CSR int32), X^T of k
columns as a linear layer holds it (``(k, in)`` contiguous), bias fused: per-call time of 20 calls
captured in one CUDA graph, median of the replays' CUDA-event times (bench_llm_gpu.py's graph20).
For each spmm_fl configuration the driver's count of blocks resident at once is recorded (the
plan's cluster-size rule uses it). Errors are against a float32 product of the same operands.
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

from sparsetorch_cuda import _mma  # noqa: E402
from sparsetorch_cuda.plan import CudaSpmmPlan  # noqa: E402

from bench_llm import RULES  # noqa: E402
from bench_s5 import copy_bw, graph_time, kernel_regs as _kernel_regs, pruned_layer  # noqa: E402


def kernel_regs(names: list[str], dtype: torch.dtype) -> dict:
    return _kernel_regs(names, dtype, lambda name: 12 if name.startswith("spmm") else 8)


#: the tensor-core rate with nothing else in the way: each warp issues independent m16n8k16 (dense) or
#: m16n8k32 2:4 (mma.sp: the sparse tensor cores, twice the k per instruction) products on registers
PEAK_SRC = r"""
extern "C" __global__ void mma_dense(long long iters, float* out) {
  unsigned a0 = threadIdx.x * 0x00010001u, a1 = a0 ^ 0x3c003c00u, a2 = a0 + 7u, a3 = a1 + 9u, b0 = a0 ^ 0x11u, b1 = a1 ^ 0x22u;
  float acc[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  for (long long i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                   : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  if (s == 1234.5f) out[0] = s;
}
extern "C" __global__ void mma_sparse(long long iters, float* out) {
  unsigned a0 = threadIdx.x * 0x00010001u, a1 = a0 ^ 0x3c003c00u, a2 = a0 + 7u, a3 = a1 + 9u;
  unsigned b0 = a0 ^ 0x11u, b1 = a1 ^ 0x22u, b2 = a2 ^ 0x33u, b3 = a3 ^ 0x44u, meta = 0x44444444u;
  float acc[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  for (long long i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      asm volatile("mma.sp.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, "
                   "{%0,%1,%2,%3}, %12, 0x0;"
                   : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(b2), "r"(b3), "r"(meta));
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  if (s == 1234.5f) out[0] = s;
}
"""


def mma_peak() -> dict:
    """Tensor-core rates on this GPU: mma.sync m16n8k16 and mma.sp m16n8k32 (2:4) per SM and clock,
    8 warps per block, 1 to 4 blocks per SM (dense-equivalent TFLOPS: the sparse product counts its k
    of 32, half of it zeros)."""
    import ctypes  # noqa: PLC0415

    from sparsetorch_cuda import compile as c  # noqa: PLC0415
    from sparsetorch_cuda.launch import _driver, arch_of  # noqa: PLC0415

    cu = _driver()
    out: dict = {}
    try:
        data = c.compile_text(PEAK_SRC, "mma_peak.cu", "float16", "int32", arch_of(0))
    except Exception as exc:  # noqa: BLE001 - recorded
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    err, lib = cu.cuLibraryLoadData(data, [], [], 0, [], [], 0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    buf = torch.zeros(1, device="cuda")
    for name, flop in (("mma_dense", 2 * 16 * 8 * 16), ("mma_sparse", 2 * 16 * 8 * 32)):
        err, kern = cu.cuLibraryGetKernel(lib, name.encode())
        if int(err) != 0:
            out[name] = f"cuLibraryGetKernel: {err}"
            continue
        fn = cu.CUfunction(int(kern))
        for per_sm in (1, 2, 4):
            iters = 4096
            args = (ctypes.c_longlong(iters), ctypes.c_void_p(buf.data_ptr()))
            ptrs = (ctypes.c_void_p * 2)(*[ctypes.addressof(a) for a in args])
            stream = torch.cuda.current_stream().cuda_stream

            def launch():
                (e,) = cu.cuLaunchKernel(fn, sms * per_sm, 1, 1, 256, 1, 1, 0, stream, ctypes.addressof(ptrs), 0)
                if int(e) != 0:
                    raise RuntimeError(f"cuLaunchKernel {name}: {e}")

            launch()
            torch.cuda.synchronize()
            ts = []
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                launch()
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b) * 1e-3)
            t = sorted(ts)[len(ts) // 2]
            n_mma = sms * per_sm * 8 * iters * 8
            out[f"{name}_{per_sm}_blocks_per_sm"] = {"seconds": t, "mma_per_sm_per_us": n_mma / sms / (t * 1e6),
                                                      "tflops_dense_equivalent": n_mma * flop / t / 1e12}
    return out


def profile(configs: str) -> None:
    """One call of each configuration on the 4096 x 4096 90 % float16 layer, k = 64, between
    cudaProfilerStart / Stop (warmed up first: compilation and layouts stay outside)."""
    torch.manual_seed(0)
    dense = torch.nn.Linear(4096, 4096).to("cuda", torch.float16)
    A = RULES["90 %"]()("layer", dense)
    plan = CudaSpmmPlan(A)
    plan.set_values(A.values)
    x = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
    cfgs = [c.split(":") for c in configs.split(",")]
    for phase in ("warm", "profile"):
        if phase == "profile":
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
        for kn, r_, s in cfgs:
            plan.mma_kernel, plan.mma_rows = kn, int(r_)
            plan.mma_split_override = None if s == "auto" else int(s)
            plan._prepared = {}
            plan.apply(x.mT, bias=dense.bias.detach())
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="4096x4096,4096x11008")
    ap.add_argument("--ks", default="64")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--fl", default="auto:128:auto,fl:128:auto,fl:128:8,ws:128:auto,ws:128:3,ws:128:4",
                    help="configurations kernel:rows:S to time (kernel: plan.mma_kernel, auto / fl / ws; rows: 128)")
    ap.add_argument("--ablate", default="fl:128:8,ws:128:3",
                    help="configurations timed with parts switched off (plan.mma_flags), 4096x4096 float16 k=64 only")
    ap.add_argument("--profile", action="store_true", help="one call per --ablate configuration inside "
                    "cudaProfilerStart / Stop (for ncu --profile-from-start off), then exit")
    ap.add_argument("--tile", default="auto", help="spmm_mma cluster sizes to time (the earlier kernel)")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    dev = torch.device("cuda")
    if args.profile:
        profile(args.ablate)
        return
    bw = copy_bw()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
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
            for k in [int(v) for v in args.ks.split(",")]:
                x = torch.randn(k, n_in, device=dev, dtype=dtype)
                ref = x.float() @ W.float().T + b.float()
                row = {"in": n_in, "out": n_out, "sparsity": "90 %", "dtype": dname, "k": k, "nnz": plan.nnz,
                       "times_us": {}, "errors": {}, "split": {}, "resident_blocks": {}}
                t = row["times_us"]

                def rec(name, fn):
                    plan._prepared = {}
                    y = fn()
                    yy = y if y.shape == ref.shape else y.mT
                    row["errors"][name] = float((yy.float() - ref).abs().max() / ref.abs().max())
                    tt = graph_time(fn, 15)
                    t[name] = tt * 1e6 if isinstance(tt, float) else tt

                rec("dense", lambda: torch.nn.functional.linear(x, W, b))
                call = lambda: plan.apply(x.mT, bias=b)  # noqa: E731
                if k == 1:
                    rec("csr16_xs1", call)
                else:
                    plan.mma_kernel = "tile"
                    for s in args.tile.split(","):
                        plan.mma_split_override = None if s == "auto" else int(s)
                        rec(f"tile_S{s}", call)
                        row["split"][f"tile_S{s}"] = plan.mma_split(k)
                    for cfg in args.fl.split(","):
                        kn, r_, s = cfg.split(":")
                        plan.mma_kernel = kn
                        plan.mma_rows = int(r_)
                        plan.mma_split_override = None if s == "auto" else int(s)
                        name = f"{kn}_{r_}_S{s}"
                        try:
                            rec(name, call)
                            ss = plan.fl_split(k)
                            row["split"][name] = ss
                            lay = plan._mma_layout()
                            kind = plan.fl_kind(k)
                            row.setdefault("kind", {})[name] = kind
                            smem = plan._fl_smem(-(-lay["T"] // ss), kind)
                            kname, threads, _ = plan._fl_kernel(ss, kind)
                            row["resident_blocks"][name] = _mma._fl_capacity(kname, dtype, 0, ss, threads, smem)
                        except Exception as exc:  # noqa: BLE001 - recorded
                            t[name] = f"error: {type(exc).__name__}: {str(exc)[:160]}"
                    if args.ablate and (n_in, n_out, dname, k) == (4096, 4096, "float16", 64):
                        row["ablation_us"] = {}
                        for cfg in args.ablate.split(","):
                            kn, r_, s = cfg.split(":")
                            plan.mma_kernel, plan.mma_rows = kn, int(r_)
                            plan.mma_split_override = None if s == "auto" else int(s)
                            extra = (15 | 16, 15 | 16 | 32) if kn == "ws" else ()
                            for fl in (0, 1, 2, 4, 8, 2 | 4, 1 | 8, 1 | 2 | 4 | 8, *extra):
                                plan.mma_flags = fl
                                plan._prepared = {}
                                tt = graph_time(call, 15)
                                row["ablation_us"][f"{cfg} flags={fl}"] = tt * 1e6 if isinstance(tt, float) else tt
                            plan.mma_flags = 0
                        print("ablation (flags: 1 no products, 2 no A tiles, 4 no entry loads, 8 no X^T copies, "
                              "16 no cluster reduction, 32 no offsets): "
                              + " ".join(f"{kk}={v:.2f}" for kk, v in row["ablation_us"].items()), flush=True)
                    plan.mma_kernel, plan.mma_rows, plan.mma_split_override = _mma.MMA_KERNEL_DEFAULT, 128, None
                ours = {kk: v for kk, v in t.items() if kk != "dense" and isinstance(v, float)}
                if ours:
                    best = min(ours, key=ours.get)
                    row["best"] = best
                    row["speedup_vs_dense"] = t["dense"] / ours[best]
                    row["speedups_vs_dense"] = {kk: round(t["dense"] / v, 3) for kk, v in ours.items()}
                rows_out.append(row)
                print(f"{n_in}x{n_out} {dname:8s} k={k:<3d} " + " ".join(
                    f"{kk}={v:.2f}" if isinstance(v, float) else f"{kk}={v}" for kk, v in t.items())
                    + f" | best {row.get('best')} x{row.get('speedup_vs_dense', float('nan')):.2f} "
                    f"err={max(row['errors'].values()):.1e} splits={row['split']} resident={row['resident_blocks']}", flush=True)
            plan = A = W = dense = None  # noqa: F841
            torch.cuda.empty_cache()
    names = [f"spmm_{f}_s{s}" for f in ("fl", "ws") for s in (1, 2, 3, 4, 8)] + ["spmm_mma_s8"]
    peak = mma_peak()
    print("tensor-core rates:", json.dumps(peak)[:600], flush=True)
    doc = {"benchmark": "cuda plugin session 7: pipelined CSR tensor-core SpMM (spmm_fl) against spmm_mma and dense "
                        "cuBLAS on 90 % pruned LLM layers (kernel time, CUDA graph of 20 calls)",
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "command": "python plugins/cuda_kernels/benchmarks/bench_s7.py " + " ".join(sys.argv[1:]),
           "commit": args.commit,
           "machine": {"platform": platform.platform(), "gpu": torch.cuda.get_device_name(0)},
           "versions": {"torch": torch.__version__},
           "copy_bandwidth_bytes_per_s": bw,
           "kernels_float16": kernel_regs(names, torch.float16),
           "tensor_core_rates": peak,
           "rows": rows_out}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_kernels_h200_s7.json").write_text(json.dumps(doc, indent=1))
    print(f"wrote {out / 'cuda_kernels_h200_s7.json'}")


if __name__ == "__main__":
    main()

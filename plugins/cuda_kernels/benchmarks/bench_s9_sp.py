"""Session 9: the 2:4 sparse-tensor-core SpMM (spmm_sp, kernels/spmm_sp.cu) on 90 % magnitude-pruned
LLM layers at batch 64, against dense cuBLAS (F.linear) in the same run.

    python plugins/cuda_kernels/benchmarks/bench_s9_sp.py --out DIR [--shapes 4096x4096,4096x11008]
        [--dtypes float16,bfloat16] [--ks 64] [--layer] [--old]

Per (layer, dtype): dense F.linear(x, W, b) with W the pruned weight as a dense tensor; the plan's
product ``plan.apply(x.mT, bias=b)`` with ``mma_kernel = "sp"`` for every compiled configuration
(R, WR, WK, CS) that fits and for the plan's own choice, the choice with parts switched off
(``sp_flags``: 1 no products, 2 no value loads, 4 no residual, 8 no copies into shared memory, 16 no
cluster sum; wrong results, for the bounds);
``--layer``: SparseLinear's forward with "auto" set to run spmm_sp; ``--old``: the session-7 CSR kernel
(spmm_fl / spmm_ws). Times: 20 calls captured in one CUDA graph, per call, median of 15 replays
(bench_s5.graph_time). Errors: relative 2-norm against a float64 product of the same operands.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "benchmarks"))
sys.path.insert(0, str(HERE))

import sparsetorch as st  # noqa: E402
from sparsetorch.format import CSR  # noqa: E402
from sparsetorch_cuda import _spmm_sp  # noqa: E402
from sparsetorch_cuda.plan import CudaSpmmPlan  # noqa: E402

from bench_llm import RULES  # noqa: E402
from bench_s5 import graph_time  # noqa: E402


def _us(t) -> float | str:
    return round(t * 1e6, 3) if isinstance(t, float) else t


def _err(y: torch.Tensor, ref: torch.Tensor) -> float:
    y = y.double()
    return float(torch.linalg.vector_norm(y - ref) / torch.linalg.vector_norm(ref))


def case(out_f: int, in_f: int, dtype: torch.dtype, ks: list[int], args) -> dict:
    torch.manual_seed(out_f + in_f)
    dense = torch.nn.Linear(in_f, out_f, device="cuda", dtype=dtype)
    layer = st.nn.SparseLinear(RULES["90 %"]()("layer", dense), dense.bias.detach())
    W = layer.to_dense().detach().contiguous()
    b = dense.bias.detach().contiguous()
    t0 = time.perf_counter()
    A = st.SparseTensor.from_dense(W, mask=W != 0).convert(CSR, index_dtype=torch.int32)
    plan = CudaSpmmPlan(A)
    plan.set_values(A.values)
    plan.mma_kernel = "sp"
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    lay = plan._sp_layout()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    res: dict = {"layer": f"{in_f}->{out_f}", "dtype": str(dtype).replace("torch.", ""), "nnz": int(A.nnz),
                 "plan_s": t1 - t0, "sp_layout_s": t2 - t1, "sp_layout_stats": lay["stats"] if lay else None, "ks": {}}
    for k in ks:
        x = torch.randn(k, in_f, device="cuda", dtype=torch.float64).to(dtype)
        ref = x.double() @ W.double().T + b.double()
        row: dict = {}
        row["dense_us"] = _us(graph_time(lambda: torch.nn.functional.linear(x, W, b), 15))
        row["dense_err"] = _err(torch.nn.functional.linear(x, W, b), ref)
        configs = {}
        for cfg in [(*c, s) for c in _spmm_sp.SP_CONFIGS for s in _spmm_sp.SP_CLUSTERS]:
            plan.sp_config_override = cfg
            if not plan._sp_ok(k):
                continue
            y = plan.apply(x.mT, bias=b).mT
            configs["r{}w{}k{}_s{}".format(*cfg)] = {"us": _us(graph_time(lambda: plan.apply(x.mT, bias=b), 15)),
                                                     "err": _err(y, ref), "kpw": plan.sp_choice(k)[4],
                                                     "smem": plan.sp_choice(k)[5], "vcap": plan.sp_choice(k)[6]}
        row["configs"] = configs
        plan.sp_config_override = None
        choice = plan.sp_choice(k)
        row["chosen"] = "r{}w{}k{}_s{}".format(*choice[:4])
        y = plan.apply(x.mT, bias=b).mT
        row["sp_us"] = _us(graph_time(lambda: plan.apply(x.mT, bias=b), 15))
        row["sp_err"] = _err(y, ref)
        best = min(configs.items(), key=lambda kv: kv[1]["us"] if isinstance(kv[1]["us"], float) else 1e9)
        row["best"] = {"config": best[0], "us": best[1]["us"]}
        if isinstance(row["dense_us"], float) and isinstance(row["sp_us"], float):
            row["speedup_chosen"] = row["dense_us"] / row["sp_us"]
            row["speedup_best"] = row["dense_us"] / best[1]["us"]
        abl = {}
        for flags in (1, 2, 4, 7, 15, 31):
            plan.sp_flags = flags
            abl[str(flags)] = _us(graph_time(lambda: plan.apply(x.mT, bias=b), 15))
        plan.sp_flags = 0
        row["ablation_us"] = abl
        if args.old:
            plan.mma_kernel = "auto"
            plan._prepared.clear()
            saved, _spmm_sp.SP_AUTO_MIN_K = _spmm_sp.SP_AUTO_MIN_K, None
            try:
                row["old_us"] = _us(graph_time(lambda: plan.apply(x.mT, bias=b), 15))
                row["old_kernel"] = plan.fl_kind(k) if plan._fl_ok() else "tile"
            finally:
                _spmm_sp.SP_AUTO_MIN_K = saved
                plan.mma_kernel = "sp"
                plan._prepared.clear()
        if args.layer:
            saved, _spmm_sp.SP_AUTO_MIN_K = _spmm_sp.SP_AUTO_MIN_K, 8
            try:
                with torch.no_grad():
                    yl = layer(x)
                    row["layer_us"] = _us(graph_time(lambda: layer(x), 15))
                row["layer_err"] = _err(yl, ref)
                row["layer_plan"] = [str(p.get("plan")) for p in layer.plans() if p.get("batch") == k]
            except Exception as exc:  # noqa: BLE001 - recorded
                row["layer_us"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            finally:
                _spmm_sp.SP_AUTO_MIN_K = saved
        res["ks"][str(k)] = row
        print(f"{res['layer']} {res['dtype']} k={k}: dense {row['dense_us']} us, sp {row['sp_us']} us ({row['chosen']}), "
              f"best {row['best']}, err {row['sp_err']:.2e}, ablation {abl}, layer {row.get('layer_us')}, "
              f"old {row.get('old_us')}", flush=True)
    return res


def profile(args, k: int) -> None:
    in_f, out_f = (int(v) for v in args.shapes.split(",")[0].split("x"))
    dtype = getattr(torch, args.dtypes.split(",")[0])
    torch.manual_seed(out_f + in_f)
    dense = torch.nn.Linear(in_f, out_f, device="cuda", dtype=dtype)
    W = st.nn.SparseLinear(RULES["90 %"]()("layer", dense), dense.bias.detach()).to_dense().detach()
    A = st.SparseTensor.from_dense(W, mask=W != 0).convert(CSR, index_dtype=torch.int32)
    plan = CudaSpmmPlan(A)
    plan.set_values(A.values)
    plan.mma_kernel = "sp"
    x = torch.randn(k, in_f, device="cuda", dtype=dtype)
    for name in args.profile.split(","):
        r, rest = name[1:].split("w")
        w, rest = rest.split("k")
        kk, cs = rest.split("_s")
        plan.sp_config_override = (int(r), int(w), int(kk), int(cs))
        plan.apply(x.mT, bias=dense.bias.detach())
        torch.cuda.synchronize()
        print("profiled", name, plan.sp_choice(k), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="4096x4096,4096x11008", help="in x out features")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--ks", default="64")
    ap.add_argument("--layer", action="store_true", help="also SparseLinear's forward with auto running spmm_sp")
    ap.add_argument("--old", action="store_true", help="also the session-7 kernel (compiles the mma module)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--commit", default="")
    ap.add_argument("--profile", default="", help="only launch these configurations once each on the first shape and "
                    "dtype (for ncu), e.g. r2w2k4_s8,r4w4k2_s8")
    args = ap.parse_args()
    ks = [int(v) for v in args.ks.split(",")]
    if args.profile:
        profile(args, ks[0])
        return
    results = []
    for shape in args.shapes.split(","):
        in_f, out_f = (int(v) for v in shape.split("x"))
        for dt in args.dtypes.split(","):
            results.append(case(out_f, in_f, getattr(torch, dt), ks, args))
    doc = {"benchmark": "session 9: spmm_sp (2:4 sparse tensor cores) vs dense F.linear, 90 % magnitude-pruned, "
                        "bias fused, 20 calls per CUDA graph",
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": args.commit,
           "command": "python " + " ".join(sys.argv), "gpu": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "platform": platform.platform(), "results": results}
    out = Path(args.out)
    path = out / f"cuda_kernels_h200_s9_sp{args.tag}.json" if out.is_dir() or not out.suffix else out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

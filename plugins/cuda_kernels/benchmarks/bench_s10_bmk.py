"""Session 10, task H6: spmm_bmk (spmm_bm split over the column tiles without clusters, float32 workspace and
a last-block finish; kernels/spmm_bmk.cu) against dense cuBLAS (F.linear), the committed default ("auto":
spmm_ws / spmm_fl) and spmm_bm, in the same run.

    python plugins/cuda_kernels/benchmarks/bench_s10_bmk.py --out DIR [--shapes 4096x4096,4096x11008]
        [--dtypes float16,bfloat16] [--density 0.1] [--k 64] [--no-ablation] [--no-bm]

Per (layer, dtype): the magnitude-pruned layer of bench_s10_bm.py (same seeds); dense F.linear(x, W, b); the plan's
``apply(x.mT, bias=b)`` with mma_kernel "auto" (which kernel), "bm" (its own choice), "bmk" (its own choice of
block shape and KS), "bmk" for each block shape at a few KS around the choice, and (unless --no-ablation) "bmk"
with parts off (``bmk_flags``: 1 no products, 2 no A fragments, 4 no value copies, 8 no X^T copies, 16 no
reduction / Y; wrong results, for the bounds). Times: 20 calls in one CUDA graph, per call, median of 15 replays
(bench_s5.graph_time). Errors: relative 2-norm against float64. The JSON is rewritten after every case (a
timeout keeps what finished).
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
sys.path.insert(0, str(HERE))

import sparsetorch as st  # noqa: E402
from sparsetorch.format import CSR  # noqa: E402
from sparsetorch_cuda import _spmm_bmk  # noqa: E402
from sparsetorch_cuda.plan import CudaSpmmPlan  # noqa: E402

from bench_s10_bm import _err, _kind, _us  # noqa: E402
from bench_s5 import graph_time  # noqa: E402


def case(out_f: int, in_f: int, dtype: torch.dtype, density: float, k: int, args) -> dict:
    torch.manual_seed(out_f + in_f)  # bench_s10_bm.case's layer
    dense = torch.nn.Linear(in_f, out_f, device="cuda", dtype=dtype)
    layer = st.nn.SparseLinear(st.nn.magnitude(1.0 - density)("layer", dense), dense.bias.detach())
    W = layer.to_dense().detach().contiguous()
    b = dense.bias.detach().contiguous()
    A = st.SparseTensor.from_dense(W, mask=W != 0).convert(CSR, index_dtype=torch.int32)
    plan = CudaSpmmPlan(A)
    plan.set_values(A.values)
    lay = plan._bm_layout()
    x = torch.randn(k, in_f, device="cuda", dtype=torch.float64).to(dtype)
    ref = x.double() @ W.double().T + b.double()
    row: dict = {"layer": f"{in_f}->{out_f}", "dtype": str(dtype).replace("torch.", ""), "density": density, "k": k,
                 "nnz": int(A.nnz), "bm_stats": lay["stats"] if lay else None}
    t0 = time.perf_counter()

    def run(kind: str) -> tuple[float | str, float | str]:
        plan.mma_kernel = kind
        plan._prepared.clear()  # a recorded launch of another kind is not replayed
        try:
            y = plan.apply(x.mT, bias=b).mT
            return _us(graph_time(lambda: plan.apply(x.mT, bias=b), 15)), _err(y, ref)
        except Exception as exc:  # noqa: BLE001 - recorded, the other rows still run
            torch.cuda.synchronize()
            return f"failed: {type(exc).__name__}: {str(exc)[:160]}", "n/a"

    # bmk first (the new kernel), then the references
    plan.mma_kernel = "bmk"
    ok = lay is not None and plan._bmk_ok(k)
    row["bmk_ok"] = ok
    if ok:
        v0, ks0 = plan.bmk_split(k)
        row["bmk_choice"] = f"{v0}_ks{ks0}"
        row["bmk_us"], row["bmk_err"] = run("bmk")
        splits = {}
        T = -(-in_f // 64)
        for v in _spmm_bmk.BMK_VARIANTS:
            for s in sorted({max(1, ks0 // 2), ks0, min(T, 2 * ks0), min(T, 4 * ks0)}):
                plan.bmk_variant_override = v
                plan.bmk_split_override = s
                us, err = run("bmk")
                splits[f"{v}_ks{s}"] = {"us": us, "err": err}
        plan.bmk_variant_override = None
        plan.bmk_split_override = None
        row["bmk_splits"] = splits
        if args.ablation:
            abl = {}
            plan.mma_kernel = "bmk"
            for flags in (1, 2, 4, 8, 16, 3, 15, 31):
                plan.bmk_flags = flags
                abl[str(flags)] = _us(graph_time(lambda: plan.apply(x.mT, bias=b), 15))
            plan.bmk_flags = 0
            row["bmk_ablation_us"] = abl
    row["dense_us"] = _us(graph_time(lambda: torch.nn.functional.linear(x, W, b), 15))
    plan.mma_kernel = "auto"
    row["auto_kernel"] = _kind(plan, k)
    row["auto_us"], row["auto_err"] = run("auto")
    if args.bm:
        plan.mma_kernel = "bm"
        row["bm_choice"] = "{}_s{}".format(*plan.bm_split(k)) if plan._bm_ok(k) else None
        row["bm_us"], row["bm_err"] = run("bm")
    for key in ("bmk_us", "auto_us", "bm_us"):
        if isinstance(row.get(key), float) and isinstance(row["dense_us"], float):
            row[key.replace("_us", "_x_dense")] = round(row["dense_us"] / row[key], 3)
    if isinstance(row.get("bmk_us"), float) and isinstance(row.get("auto_us"), float):
        row["bmk_x_auto"] = round(row["auto_us"] / row["bmk_us"], 3)
    row["case_s"] = round(time.perf_counter() - t0, 2)
    print(f"{row['layer']} {row['dtype']} d={density} k={k}: dense {row['dense_us']} auto {row['auto_us']} "
          f"({row['auto_kernel']}) bm {row.get('bm_us')} ({row.get('bm_choice')}) bmk {row.get('bmk_us')} "
          f"({row.get('bmk_choice')}, err {row.get('bmk_err')}) splits "
          f"{ {s: v['us'] for s, v in row.get('bmk_splits', {}).items()} } abl {row.get('bmk_ablation_us')}", flush=True)
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="4096x4096,4096x11008", help="in x out features")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--no-ablation", dest="ablation", action="store_false")
    ap.add_argument("--no-bm", dest="bm", action="store_false")
    ap.add_argument("--tag", default="")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    out = Path(args.out)
    path = out / f"cuda_kernels_h200_s10_bmk{args.tag}.json" if out.is_dir() or not out.suffix else out
    doc = {"benchmark": "session 10 H6: spmm_bmk (bitmap tensor-core SpMM, split-K without clusters, workspace + "
                        "last-block finish) vs spmm_bm vs auto (spmm_ws / spmm_fl) vs dense F.linear, magnitude-pruned, "
                        "bias fused, 20 calls per CUDA graph",
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": args.commit,
           "command": "python " + " ".join(sys.argv), "gpu": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "platform": platform.platform(), "bmk_auto": _spmm_bmk.BMK_AUTO, "results": []}
    for dt in args.dtypes.split(","):
        for shape in args.shapes.split(","):
            in_f, out_f = (int(v) for v in shape.split("x"))
            try:
                doc["results"].append(case(out_f, in_f, getattr(torch, dt), args.density, args.k, args))
            except Exception as exc:  # noqa: BLE001 - recorded, the next case still runs
                torch.cuda.synchronize()
                doc["results"].append({"layer": shape, "dtype": dt, "failed": f"{type(exc).__name__}: {str(exc)[:300]}"})
                print("case failed", shape, dt, exc, flush=True)
            path.write_text(json.dumps(doc, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()

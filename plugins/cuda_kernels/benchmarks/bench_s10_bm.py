"""Session 10: the bitmap tensor-core SpMM (spmm_bm, kernels/spmm_bm.cu) on magnitude-pruned LLM layers,
against the session-7 CSR kernels (spmm_fl / spmm_ws) and dense cuBLAS (F.linear) in the same run.

    python plugins/cuda_kernels/benchmarks/bench_s10_bm.py --out DIR [--shapes 4096x4096,4096x11008]
        [--dtypes float16] [--densities 0.5,0.1,0.01] [--ks 16,64,128] [--ablation]

Per (layer, dtype, density, k): dense F.linear(x, W, b) with W the pruned weight as a dense tensor; the
plan's product ``plan.apply(x.mT, bias=b)`` with ``mma_kernel`` "bm" for every block shape (BM_VARIANTS) and cluster
size and for the plan's own choice, the spmm_fl / spmm_ws kernel that "auto" ran before this session (``old``), and "auto"
as committed (``auto``: which kernel it ran; ``--measured-rule``: with BM_AUTO_MEASURED); ``--ablation``: spmm_bm with parts switched off
(``bm_flags``: 1 no products, 2 no A fragments, 4 no value copies, 8 no X^T copies; wrong results, for the
bounds) at the plan's choice. Times: 20 calls captured in one CUDA graph, per call, median of 15 replays
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
sys.path.insert(0, str(HERE))

import sparsetorch as st  # noqa: E402
from sparsetorch.format import CSR  # noqa: E402
from sparsetorch_cuda import _spmm_bm  # noqa: E402
from sparsetorch_cuda.plan import CudaSpmmPlan  # noqa: E402

from bench_s5 import graph_time  # noqa: E402


def _us(t) -> float | str:
    return round(t * 1e6, 3) if isinstance(t, float) else t


def _err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(y.double() - ref) / torch.linalg.vector_norm(ref))


def _kind(plan: CudaSpmmPlan, k: int) -> str:
    if plan._bm_ok(k):
        return "{}_s{}".format(*plan.bm_split(k))
    if plan._fl_ok():
        kind = plan.fl_kind(k)
        return f"{kind}_s{plan.fl_split(k, kind)}"
    return "tile"


def case(out_f: int, in_f: int, dtype: torch.dtype, density: float, ks: list[int], args) -> dict:
    torch.manual_seed(out_f + in_f)
    dense = torch.nn.Linear(in_f, out_f, device="cuda", dtype=dtype)
    layer = st.nn.SparseLinear(st.nn.magnitude(1.0 - density)("layer", dense), dense.bias.detach())
    W = layer.to_dense().detach().contiguous()
    b = dense.bias.detach().contiguous()
    A = st.SparseTensor.from_dense(W, mask=W != 0).convert(CSR, index_dtype=torch.int32)
    plan = CudaSpmmPlan(A)
    plan.set_values(A.values)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    lay = plan._bm_layout()
    torch.cuda.synchronize()
    res: dict = {"layer": f"{in_f}->{out_f}", "dtype": str(dtype).replace("torch.", ""), "density": density,
                 "nnz": int(A.nnz), "bm_layout_s": time.perf_counter() - t0, "bm_stats": lay["stats"] if lay else None,
                 "ks": {}}
    committed = _spmm_bm.BM_AUTO
    for k in ks:
        x = torch.randn(k, in_f, device="cuda", dtype=torch.float64).to(dtype)
        ref = x.double() @ W.double().T + b.double()
        row: dict = {}
        row["dense_us"] = _us(graph_time(lambda: torch.nn.functional.linear(x, W, b), 15))

        def run(kind: str, split: int | None = None, variant: str | None = None) -> tuple[float | str, float]:
            plan.mma_kernel = kind
            plan.bm_split_override = split  # drops the recorded launches
            plan.bm_variant_override = variant
            y = plan.apply(x.mT, bias=b).mT
            return _us(graph_time(lambda: plan.apply(x.mT, bias=b), 15)), _err(y, ref)

        _spmm_bm.BM_AUTO = None
        try:
            plan.mma_kernel = "auto"
            row["old_kernel"] = _kind(plan, k)
            row["old_us"], row["old_err"] = run("auto")
        finally:
            _spmm_bm.BM_AUTO = committed
        splits = {}
        if lay is not None:
            for v in _spmm_bm.BM_VARIANTS:
                for s in _spmm_bm.BM_SPLITS if _spmm_bm._cluster_ok(0) else (1,):
                    us, err = run("bm", s, v)
                    splits[f"{v}_s{s}"] = {"us": us, "err": err}
            plan.bm_split_override = None
            plan.bm_variant_override = None
            plan.mma_kernel = "bm"
            row["bm_choice"] = "{}_s{}".format(*plan.bm_split(k))
            row["bm_us"], row["bm_err"] = run("bm")
            if args.ablation:
                abl = {}
                for flags in (1, 2, 4, 8, 3, 15):
                    plan.bm_flags = flags
                    abl[str(flags)] = _us(graph_time(lambda: plan.apply(x.mT, bias=b), 15))
                plan.bm_flags = 0
                row["ablation_us"] = abl
        row["bm_splits"] = splits
        plan.mma_kernel = "auto"
        row["auto_kernel"] = _kind(plan, k)
        row["auto_us"], row["auto_err"] = run("auto")
        for key in ("bm_us", "old_us", "auto_us"):
            if isinstance(row.get(key), float) and isinstance(row["dense_us"], float):
                row[key.replace("_us", "_x_dense")] = round(row["dense_us"] / row[key], 3)
        res["ks"][str(k)] = row
        print(f"{res['layer']} {res['dtype']} d={density} k={k}: dense {row['dense_us']} old {row['old_us']} "
              f"({row['old_kernel']}) bm {row.get('bm_us')} ({row.get('bm_choice')}, err {row.get('bm_err', 0):.1e}) "
              f"auto {row['auto_us']} ({row['auto_kernel']}) splits "
              f"{ {s: v['us'] for s, v in splits.items()} } abl {row.get('ablation_us')}", flush=True)
    torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="4096x4096,4096x11008", help="in x out features")
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--densities", default="0.5,0.1,0.01")
    ap.add_argument("--ks", default="16,64,128")
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--measured-rule", action="store_true",
                    help="run 'auto' with _spmm_bm.BM_AUTO_MEASURED instead of the committed BM_AUTO")
    ap.add_argument("--tag", default="")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    ks = [int(v) for v in args.ks.split(",")]
    if args.measured_rule:
        _spmm_bm.BM_AUTO = _spmm_bm.BM_AUTO_MEASURED
    results = []
    for shape in args.shapes.split(","):
        in_f, out_f = (int(v) for v in shape.split("x"))
        for dt in args.dtypes.split(","):
            for d in args.densities.split(","):
                results.append(case(out_f, in_f, getattr(torch, dt), float(d), ks, args))
    doc = {"benchmark": "session 10: spmm_bm (bitmap tensor-core SpMM) vs spmm_fl / spmm_ws vs dense F.linear, "
                        "magnitude-pruned, bias fused, 20 calls per CUDA graph",
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": args.commit,
           "command": "python " + " ".join(sys.argv), "gpu": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "platform": platform.platform(), "bm_auto": _spmm_bm.BM_AUTO, "results": results}
    out = Path(args.out)
    path = out / f"cuda_kernels_h200_s10_bm{args.tag}.json" if out.is_dir() or not out.suffix else out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

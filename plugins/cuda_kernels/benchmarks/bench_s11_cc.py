"""Session 11 (H2): the strip-compacted tensor-core SpMM (spmm_cc, kernels/spmm_cc.cu, _spmm_cc.py) on
magnitude-pruned LLM layers, against dense cuBLAS (F.linear) and the plan's default kernel (spmm_ws /
spmm_fl / csr16: ``mma_kernel`` "auto") in the same run.

    python plugins/cuda_kernels/benchmarks/bench_s11_cc.py --out DIR [--shapes 4096x4096,4096x11008]
        [--dtypes float16,bfloat16] [--densities 0.1,0.5] [--ks 1,16,64,128] [--sweep-k 64] [--ablation] [--rot 4]

Per (layer, dtype, density): the layout is built once (its time reported); at k = --sweep-k every spmm_cc
variant (B format x cluster size) is timed and the fastest is used for the other k.
Per k: dense F.linear(x, W, b) (W the pruned weight, dense), the plan's product plan.apply(x.mT, bias=b)
("auto", the kernel it ran named), spmm_cc's Y^T = op(x, b). Times: 20 calls captured in one CUDA graph, per call,
median of 15 replays (bench_s5.graph_time, the "graph20" of bench_llm_gpu.py). ``--rot R``: also at
k = --sweep-k, dense and spmm_cc over R different layers in turn inside the graph (R x the bytes: not
served from the 50 MB L2 across calls). ``--ablation``: spmm_cc with parts switched off (flags 1 no products,
2 no A loads, 4 no pattern loads, 8 no X slice; 15 the empty skeleton; wrong results, for the bounds). Errors:
relative 2-norm against a float64 product of the same operands.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
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


def _us(t) -> float | str:
    return round(t * 1e6, 3) if isinstance(t, float) else t


def _err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(y.double() - ref) / torch.linalg.vector_norm(ref))


def _kind(plan: CudaSpmmPlan, k: int) -> str:
    try:
        if k == 1:
            return "k1:" + str(plan._csr16_name())
        if plan._bm_ok(k):
            return "bm_s{}".format(plan.bm_split(k)[1])
        if plan._fl_ok():
            kind = plan.fl_kind(k)
            return f"{kind}_s{plan.fl_split(k, kind)}"
    except Exception as exc:  # noqa: BLE001 - a label only
        return f"? ({type(exc).__name__})"
    return "tile"


def _layer(out_f: int, in_f: int, dtype: torch.dtype, density: float, seed: int):
    torch.manual_seed(seed)
    dense = torch.nn.Linear(in_f, out_f, device="cuda", dtype=dtype)
    layer = st.nn.SparseLinear(st.nn.magnitude(1.0 - density)("layer", dense), dense.bias.detach())
    W = layer.to_dense().detach().contiguous()
    return W, dense.bias.detach().contiguous()


def _csr(W: torch.Tensor):
    A = st.SparseTensor.from_dense(W, mask=W != 0).convert(CSR, index_dtype=torch.int32)
    return A, A.pos(1), A.crd(1), A.values


VARIANTS = [(f, c) for f in _spmm_cc.CC_FORMATS for c in (4, 8)]


def case(out_f: int, in_f: int, dtype: torch.dtype, density: float, args) -> dict:
    W, b = _layer(out_f, in_f, dtype, density, out_f + in_f)
    A, rowptr, col, vals = _csr(W)
    plan = CudaSpmmPlan(A)
    plan.set_values(vals)
    res: dict = {"layer": f"{in_f}->{out_f}", "dtype": str(dtype).replace("torch.", ""), "density": density,
                 "nnz": int(A.nnz), "ks": {}}
    ops = {}
    for f, c in VARIANTS:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            ops[(f, c)] = _spmm_cc.CcSpmm(rowptr, col, vals, (out_f, in_f), clusters=c, fmt=f)
        except ValueError as exc:
            res.setdefault("declined", {})[f"{f}_c{c}"] = str(exc)
            continue
        torch.cuda.synchronize()
        res.setdefault("layout_s", {})[f"{f}_c{c}"] = round(time.perf_counter() - t0, 4)
    some = next(iter(ops.values()))
    res["stats_c8"] = next((o.layout["stats"] for (f, c), o in ops.items() if c == 8), some.layout["stats"])
    ks = [int(v) for v in args.ks.split(",")]
    sk = args.sweep_k
    order = [sk] + [k for k in ks if k != sk]
    best = None
    for k in order:
        x = torch.randn(k, in_f, device="cuda", dtype=torch.float64).to(dtype)
        ref = x.double() @ W.double().T + b.double()
        row: dict = {}
        row["dense_us"] = _us(graph_time(lambda: torch.nn.functional.linear(x, W, b), 15))
        plan.mma_kernel = "auto"
        row["auto_kernel"] = _kind(plan, k)
        try:
            y = plan.apply(x.mT, bias=b).mT
            row["auto_err"] = _err(y, ref)
            row["auto_us"] = _us(graph_time(lambda p=plan: p.apply(x.mT, bias=b), 15))
        except Exception as exc:  # noqa: BLE001 - the baseline's failure is recorded, the run goes on
            row["auto_err"], row["auto_us"] = float("nan"), f"failed: {type(exc).__name__}: {str(exc)[:160]}"
        if k == sk:
            sweep = {}
            for key, op in ops.items():
                out = torch.full((k, out_f), float("nan"), dtype=dtype, device="cuda")
                y = op(x, b, out=out)
                e = _err(y, ref)
                t = graph_time(lambda: op(x, b, out=out), 15)
                sweep[f"{key[0]}_c{key[1]}"] = {"us": _us(t), "err": e, "ncl": op._launch_args(k)[4]}
                if isinstance(t, float) and e < 3e-2 and (best is None or t < best[0]):
                    best = (t, key)
            row["cc_sweep"] = sweep
        key = best[1] if best else next(iter(ops))
        op = ops[key]
        out = torch.full((k, out_f), float("nan"), dtype=dtype, device="cuda")
        y = op(x, b, out=out)
        row["cc_variant"] = f"{key[0]}_c{key[1]}"
        row["cc_err"] = _err(y, ref)
        row["cc_us"] = _us(graph_time(lambda: op(x, b, out=out), 15))
        if k == sk and args.ablation and key[1] == 8:
            abl = {}
            for flags in (1, 2, 4, 8, 3, 15):
                op.flags = flags
                abl[str(flags)] = _us(graph_time(lambda: op(x, b, out=out), 15))
            op.flags = 0
            row["cc_ablation_us"] = abl
        if k == sk and args.rot > 1:
            # R different layers in turn (same shape and density, other seeds): bytes beyond the L2
            layers = [(W, b, op)]
            for i in range(1, args.rot):
                W2, b2 = _layer(out_f, in_f, dtype, density, out_f + in_f + 1000 * i)
                _, rp2, c2, v2 = _csr(W2)
                layers.append((W2, b2, _spmm_cc.CcSpmm(rp2, c2, v2, (out_f, in_f), clusters=key[1], fmt=key[0])))
            ii = [0]

            def dense_rot():
                Wi, bi, _ = layers[ii[0] % len(layers)]
                ii[0] += 1
                return torch.nn.functional.linear(x, Wi, bi)

            def cc_rot():
                _, bi, oi = layers[ii[0] % len(layers)]
                ii[0] += 1
                return oi(x, bi, out=out)

            row["rot"] = args.rot
            row["dense_rot_us"] = _us(graph_time(dense_rot, 15))
            row["cc_rot_us"] = _us(graph_time(cc_rot, 15))
            del layers
        for kk in ("cc_us", "auto_us"):
            if isinstance(row.get(kk), float) and isinstance(row["dense_us"], float):
                row[kk.replace("_us", "_x_dense")] = round(row["dense_us"] / row[kk], 3)
        res["ks"][str(k)] = row
        print(f"{res['layer']} {res['dtype']} d={density} k={k}: dense {row['dense_us']} auto {row['auto_us']} "
              f"({row['auto_kernel']}) cc {row['cc_us']} ({row['cc_variant']}, err {row['cc_err']:.1e}) "
              f"x_dense {row.get('cc_x_dense')}"
              + (f" rot dense {row['dense_rot_us']} cc {row['cc_rot_us']}" if "rot" in row else "")
              + (f" sweep { {s: v['us'] for s, v in row['cc_sweep'].items()} }" if "cc_sweep" in row else "")
              + (f" abl {row['cc_ablation_us']}" if "cc_ablation_us" in row else ""), flush=True)
    del ops, plan
    torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="4096x4096,4096x11008", help="in x out features")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--densities", default="0.1,0.5")
    ap.add_argument("--ks", default="1,16,64,128")
    ap.add_argument("--sweep-k", type=int, default=64)
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--rot", type=int, default=0)
    ap.add_argument("--variants", default="", help="comma list of fmt:C to sweep (default: all)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    if args.variants:
        VARIANTS[:] = [(f, int(c)) for f, c in (v.split(":") for v in args.variants.split(","))]
    results = []
    for shape in args.shapes.split(","):
        in_f, out_f = (int(v) for v in shape.split("x"))
        for dt in args.dtypes.split(","):
            for d in args.densities.split(","):
                results.append(case(out_f, in_f, getattr(torch, dt), float(d), args))
    speed = [r["ks"][str(args.sweep_k)].get("cc_x_dense") for r in results if str(args.sweep_k) in r["ks"]]
    doc = {"benchmark": "session 11 (H2): spmm_cc (strip-compacted, batch as the MMA's M) vs dense F.linear vs the "
                        "plan's auto kernel, magnitude-pruned, bias fused, 20 calls per CUDA graph (median of 15 replays)",
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": args.commit,
           "command": "python " + " ".join(sys.argv), "gpu": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "platform": platform.platform(),
           "median_cc_x_dense_at_sweep_k": statistics.median([s for s in speed if s]) if any(speed) else None,
           "results": results}
    out = Path(args.out)
    path = out / f"cuda_kernels_h200_s11b_cc{args.tag}.json" if out.is_dir() or not out.suffix else out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

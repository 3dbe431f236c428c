"""Session 25: spmm_pb (the pair-bitmap tensor-core SpMM, plugins/cuda_kernels/sparsetorch_cuda/_spmm_pb.py) against
dense ``F.linear``, the plan's current product (``CudaSpmmPlan.apply``: what ``SparseLinear``'s forward runs) and
session 22's spmm_wd, on magnitude-pruned layers (``--density`` of the entries kept) at batch k, float16 and
bfloat16, warm (the same operands every call) and cold (the 20 calls of the graph cycle through copies of the
operands that together hold three L2s). Every (configuration, K-split) of spmm_pb, its X permute alone, and the
ablation builds of the default configuration at S = 4.

    python benchmarks/gpu/s25/bench_pb.py --out DIR [--shapes 4096x4096,4096x11008] [--dtypes float16,bfloat16]
        [--k 64] [--density 0.1] [--no-cold] [--name spmm_pb_h200_s25.json]

Times: 20 calls in one CUDA graph, median of ``--repeats`` replays, per call. Errors: relative 2-norm against the
float64 product of the same operands.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu" / "s22"))
sys.path.insert(0, str(ROOT / "plugins" / "cuda_kernels" / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_cuda_kernels import cold_copies, cycle  # noqa: E402
from bench_s5 import graph_time  # noqa: E402
from bench_wd import err, layer, sanitize, us, versions, wd_copy  # noqa: E402
from sparsetorch_cuda import _spmm_pb, _spmm_wd  # noqa: E402
from sparsetorch_cuda.plan import CudaSpmmPlan  # noqa: E402

ABLATION = {"hdr_only": 1, "no_k_loop": 2, "no_mma": 4, "no_a_loads": 8, "no_b_loads": 16}


def pb_copy(op: _spmm_pb.PbSpmm) -> _spmm_pb.PbSpmm:
    c = copy.copy(op)
    c.hdr = op.hdr.clone()
    c.words = op.words.clone()
    return c


def regs(op, k: int) -> dict:
    from cuda.bindings import driver as cu  # noqa: PLC0415

    kern, grid, threads, smem = op.launch_shape(k)[:4]
    h, d = cu.CUkernel(int(kern._fn)), cu.CUdevice(op.dev_index)
    _, r = cu.cuKernelGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, h, d)
    _, loc = cu.cuKernelGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, h, d)
    return {"kernel": kern.name, "grid": list(grid), "threads": threads, "smem": smem, "registers": int(r),
            "local_bytes": int(loc)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default="spmm_pb_h200_s25.json")
    ap.add_argument("--shapes", default="4096x4096,4096x11008")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--no-cold", action="store_true")
    a = ap.parse_args()
    t_start = time.time()
    rows: list[dict] = []
    doc = {"benchmark": "bench_pb (session 25)", "command": sanitize(" ".join(["python", *sys.argv])),
           "date": datetime.now(timezone.utc).isoformat(), "machine": platform.node(), "versions": versions(),
           "method": "20 calls in one CUDA graph, median of %d replays, per call; cold: the 20 calls cycle through "
                     "copies of the operands that together hold three L2s" % a.repeats, "rows": rows}

    def save() -> None:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        doc["elapsed_s"] = round(time.time() - t_start, 1)
        (Path(a.out) / a.name).write_text(json.dumps(doc, indent=1, default=str))

    k = a.k
    for shape in a.shapes.split(","):
        in_f, out_f = (int(v) for v in shape.split("x"))
        for dname in a.dtypes.split(","):
            dtype = getattr(torch, dname)
            W, b, A = layer(out_f, in_f, a.density, in_f + out_f, dtype)
            rowptr, col, vals = A.pos(1), A.crd(1), A.values
            nnz = int(vals.numel())
            x = torch.randn(k, in_f, device="cuda", dtype=dtype)
            ref = x.double() @ W.double().T + b.double()
            row: dict = {"layer": f"{in_f}->{out_f}", "dtype": dname, "k": k, "density": round(nnz / W.numel(), 4),
                         "nnz": nnz}
            row["dense_us"] = us(graph_time(lambda: torch.nn.functional.linear(x, W, b), a.repeats))
            plan = CudaSpmmPlan(A)
            plan.set_values(A.values)
            row["plan_err"] = err(plan.apply(x.mT, bias=b).mT, ref)
            row["plan_us"] = us(graph_time(lambda: plan.apply(x.mT, bias=b), a.repeats))
            planpb = CudaSpmmPlan(A)
            planpb.mma_kernel = "pb"
            planpb.set_values(A.values)
            row["plan_pb_err"] = err(planpb.apply(x.mT, bias=b).mT, ref)
            row["plan_pb_us"] = us(graph_time(lambda: planpb.apply(x.mT, bias=b), a.repeats))
            wd = _spmm_wd.WdSpmm(rowptr, col, vals, (out_f, in_f), config=(2, 4), clusters=8, prefetch=2)
            row["wd_err"] = err(wd(x, b), ref)
            row["wd_us"] = us(graph_time(lambda: wd(x, b), a.repeats))
            pb = _spmm_pb.PbSpmm(rowptr, col, vals, (out_f, in_f))
            row["pb_default"] = {**regs(pb, k), "S": pb.S, "layout": pb.layout["stats"]}
            row["pb_err"] = err(pb(x, b), ref)
            row["pb_us"] = us(graph_time(lambda: pb(x, b), a.repeats))
            pbr = _spmm_pb.PbSpmm(rowptr, col, vals, (out_f, in_f), csr=True)
            row["pbr_default"] = {**regs(pbr, k), "S": pbr.S, "layout": pbr.layout["stats"]}
            row["pbr_err"] = err(pbr(x, b), ref)
            row["pbr_us"] = us(graph_time(lambda: pbr(x, b), a.repeats))
            xp = pb.permute_x(x)
            row["pb_xperm_us"] = us(graph_time(lambda: pb.permute_x(x, xp), a.repeats))
            tune = {}
            variants = [(c, cf, s, False) for c in (False, True) for cf in _spmm_pb.PB_CONFIGS for s in _spmm_pb.PB_CLUSTERS]
            variants += [(c, cf, s, True) for c in (False, True) for cf in _spmm_pb.PB_DEEP for s in _spmm_pb.PB_CLUSTERS]
            for csr, cfg, S, deep in variants:
                    key = f"{'r' if csr else ''}{'d' if deep else ''}p{cfg[0]}_w{cfg[1]}_s{S}"
                    try:
                        op = _spmm_pb.PbSpmm(rowptr, col, vals, (out_f, in_f), config=cfg, clusters=S, csr=csr, deep=deep)
                        tune[key] = {"us": us(graph_time(lambda op=op: op(x, b), a.repeats)), "err": err(op(x, b), ref),
                                     "registers": regs(op, k)["registers"]}
                    except Exception as exc:  # noqa: BLE001 - recorded
                        tune[key] = {"error": repr(exc)[:200]}
            row["pb_tune"] = tune
            best = min((v["us"], kk) for kk, v in tune.items() if isinstance(v.get("us"), float) and kk[0] in "pd")
            row["pb_best"] = {"config": best[1], "us": best[0]}
            bestr = min((v["us"], kk) for kk, v in tune.items() if isinstance(v.get("us"), float) and kk[0] == "r")
            row["pbr_best"] = {"config": bestr[1], "us": bestr[0]}
            for key in (best[1], bestr[1]):  # the best builds with programmatic dependent launch
                try:
                    csr, deep = key.startswith("r"), "d" in key.split("_")[0]
                    p_, w_, s_ = key.lstrip("rd").split("_")
                    op = _spmm_pb.PbSpmm(rowptr, col, vals, (out_f, in_f), config=(int(p_[1:]), int(w_[1:])),
                                         clusters=int(s_[1:]), csr=csr, deep=deep)
                    op.pdl = True
                    row[f"{key}_pdl_err"] = err(op(x, b), ref)
                    row[f"{key}_pdl_us"] = us(graph_time(lambda op=op: op(x, b), a.repeats))
                except Exception as exc:  # noqa: BLE001 - recorded
                    row[f"{key}_pdl_error"] = repr(exc)[:200]
            for csr in (False, True):
                for label, fl in ABLATION.items():
                    op = _spmm_pb.PbSpmm(rowptr, col, vals, (out_f, in_f), config=(1, 4), clusters=4, flags=fl, csr=csr,
                                         deep=True)
                    row[f"pb{'r' if csr else ''}d_abl_{label}_us"] = us(graph_time(lambda op=op: op(x, b), a.repeats))
            print(" ".join(f"{kk}={v}" for kk, v in row.items() if not isinstance(v, dict)), flush=True)
            print("  tune " + " ".join(f"{kk}={v.get('us', v.get('error'))}" for kk, v in tune.items()), flush=True)
            if not a.no_cold:
                def cold(make, nbytes):
                    fns = [make(i) for i in range(cold_copies(nbytes))]
                    for f in fns:
                        f()
                    return us(graph_time(cycle(fns), a.repeats)), len(fns)

                xs = [x.clone() for _ in range(20)]
                bs = [b.clone() for _ in range(20)]
                keep: dict = {}

                def mk_dense(i):
                    keep[i] = W if i == 0 else W.clone()
                    return lambda Wi=keep[i], i=i: torch.nn.functional.linear(xs[i], Wi, bs[i])

                row["dense_cold_us"], _ = cold(mk_dense, W.numel() * 2)
                keep.clear()

                def mk_plan(i):
                    Ai = A if i == 0 else A.clone()
                    p = CudaSpmmPlan(Ai)
                    p.set_values(Ai.values)
                    keep[i] = p
                    return lambda p=p, i=i: p.apply(xs[i].mT, bias=bs[i])

                row["plan_cold_us"], _ = cold(mk_plan, 4 * nnz)
                keep.clear()

                def mk_plan_pb(i):
                    Ai = A if i == 0 else A.clone()
                    p = CudaSpmmPlan(Ai)
                    p.mma_kernel = "pb"
                    p.set_values(Ai.values)
                    keep[i] = p
                    return lambda p=p, i=i: p.apply(xs[i].mT, bias=bs[i])

                row["plan_pb_cold_us"], _ = cold(mk_plan_pb, 4 * nnz)
                keep.clear()

                def mk_wd(i):
                    keep[i] = wd if i == 0 else wd_copy(wd)
                    return lambda o=keep[i], i=i: o(xs[i], bs[i])

                row["wd_cold_us"], _ = cold(mk_wd, 4 * nnz)
                keep.clear()
                def from_key(key):
                    csr, deep = key.startswith("r"), "d" in key.split("_")[0]
                    p_, w_, s_ = key.lstrip("rd").split("_")
                    return _spmm_pb.PbSpmm(rowptr, col, vals, (out_f, in_f), config=(int(p_[1:]), int(w_[1:])),
                                           clusters=int(s_[1:]), csr=csr, deep=deep)

                for label, make_op in (("pb", lambda: pb), ("pbr", lambda: pbr), ("pb_best", lambda: from_key(best[1])),
                                       ("pbr_best", lambda: from_key(bestr[1]))):
                    base = make_op()

                    def mk_pb(i, base=base):
                        keep[i] = base if i == 0 else pb_copy(base)
                        return lambda o=keep[i], i=i: o(xs[i], bs[i])

                    row[f"{label}_cold_us"], _ = cold(mk_pb, base.layout["stats"]["bytes"])
                    keep.clear()
                del xs, bs
                print(" ".join(f"{kk}={v}" for kk, v in row.items() if "cold" in kk), flush=True)
            rows.append(row)
            save()
            torch.cuda.empty_cache()
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

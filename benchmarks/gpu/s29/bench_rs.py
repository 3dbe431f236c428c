"""Session 29: spmm_rs (the resident-copy tensor-core SpMM, plugins/cuda_kernels/sparsetorch_cuda/_spmm_rs.py) against
dense ``F.linear`` and session 25's best spmm_pb build (deep pipeline, (1, 4), S = 4, programmatic dependent launch
behind its X permute) on magnitude-pruned layers (``--density`` kept) at batch k, warm (the same operands every
call) and cold (the 20 calls of the graph cycle through copies of the operands that together hold three L2s).
Every (configuration, K-split) of spmm_rs that fits shared memory, and ablation builds of the default.

    python benchmarks/gpu/s29/bench_rs.py --out DIR [--shapes 4096x4096,4096x11008] [--dtypes float16,bfloat16]
        [--k 64] [--density 0.1] [--no-cold] [--name spmm_rs_h200_s29.json]

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
from bench_wd import err, layer, sanitize, us, versions  # noqa: E402
from sparsetorch_cuda import _spmm_pb, _spmm_rs  # noqa: E402

ABLATION = {"copies_only": 1, "no_k_loop": 2, "no_mma": 4, "no_a_words": 8, "launch_epilogue": 16,
            "launch_local_store": 48, "no_cluster_sum": 32}


def rs_copy(op: _spmm_rs.RsSpmm) -> _spmm_rs.RsSpmm:
    c = copy.copy(op)
    c.layout = dict(op.layout)
    c.layout["hdr"] = op.layout["hdr"].clone()
    c.layout["gbase"] = op.layout["gbase"].clone()
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
    ap.add_argument("--name", default="spmm_rs_h200_s29.json")
    ap.add_argument("--shapes", default="4096x4096,4096x11008")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--no-cold", action="store_true")
    a = ap.parse_args()
    t_start = time.time()
    rows: list[dict] = []
    doc = {"benchmark": "bench_rs (session 29)", "command": sanitize(" ".join(["python", *sys.argv])),
           "date": datetime.now(timezone.utc).isoformat(), "machine": platform.node(), "versions": versions(),
           "device": torch.cuda.get_device_name(),
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
            pb = _spmm_pb.PbSpmm(rowptr, col, vals, (out_f, in_f), config=(1, 4), clusters=4, deep=True)
            pb.pdl = True
            row["pb_s25best_err"] = err(pb(x, b), ref)
            row["pb_s25best_us"] = us(graph_time(lambda: pb(x, b), a.repeats))
            tune = {}
            for cfg in _spmm_rs.RS_CONFIGS:
                for S in _spmm_rs.RS_CLUSTERS:
                    key = f"p{cfg[0]}_w{cfg[1]}_s{S}"
                    try:
                        op = _spmm_rs.RsSpmm(rowptr, col, vals, (out_f, in_f), config=cfg, clusters=S)
                        tune[key] = {"us": us(graph_time(lambda op=op: op(x, b), a.repeats)), "err": err(op(x, b), ref),
                                     **regs(op, k)}
                    except Exception as exc:  # noqa: BLE001 - recorded
                        tune[key] = {"error": repr(exc)[:200]}
            row["rs_tune"] = tune
            try:
                auto = _spmm_rs.RsSpmm(rowptr, col, vals, (out_f, in_f))
                row["rs_default"] = {"S": auto.S, "config": list(auto.config), "us": us(graph_time(lambda: auto(x, b), a.repeats)),
                                     "err": err(auto(x, b), ref), "layout": auto.layout["stats"]}
            except Exception as exc:  # noqa: BLE001 - recorded
                row["rs_default"] = {"error": repr(exc)[:200]}
            ok = [(v["us"], kk) for kk, v in tune.items() if isinstance(v.get("us"), float)]
            best = min(ok) if ok else None
            row["rs_best"] = {"config": best[1], "us": best[0]} if best else None
            if best:
                p_, w_, s_ = best[1].split("_")
                cfg_best, s_best = (int(p_[1:]), int(w_[1:])), int(s_[1:])
                for label, fl in ABLATION.items():
                    try:
                        op = _spmm_rs.RsSpmm(rowptr, col, vals, (out_f, in_f), config=cfg_best, clusters=8, flags=fl)
                        row[f"rs_abl_{label}_us"] = us(graph_time(lambda op=op: op(x, b), a.repeats))
                    except Exception as exc:  # noqa: BLE001 - recorded
                        row[f"rs_abl_{label}_error"] = repr(exc)[:200]
            print(" ".join(f"{kk}={v}" for kk, v in row.items() if not isinstance(v, dict)), flush=True)
            print("  tune " + " ".join(f"{kk}={v.get('us', v.get('error'))}" for kk, v in tune.items()), flush=True)
            if not a.no_cold and best:
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
                base = _spmm_rs.RsSpmm(rowptr, col, vals, (out_f, in_f), config=cfg_best, clusters=s_best)

                def mk_rs(i):
                    keep[i] = base if i == 0 else rs_copy(base)
                    return lambda o=keep[i], i=i: o(xs[i], bs[i])

                row["rs_best_cold_us"], _ = cold(mk_rs, base.layout["stats"]["bytes"])
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

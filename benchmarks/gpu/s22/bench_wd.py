"""Session 22: spmm_wd (the warp-decoded tensor-core SpMM, plugins/cuda_kernels/sparsetorch_cuda/_spmm_wd.py)
against dense ``F.linear``, the plan's current product (``CudaSpmmPlan.apply(x.mT, bias=b)``: what
``SparseLinear``'s forward runs, spmm_ws / spmm_fl plus the non-finite fix-up) and spmm_cc, on magnitude-pruned
layers (90 %: 10 % of the entries kept) at batch k, float16 and bfloat16; warm (the same operands every call) and
cold (20 calls cycling through copies of the operands that together hold three L2s, as ``--cold`` in
plugins/cuda_kernels/benchmarks/bench_s11_delta.py); spmm_wd's ablation builds and the other configurations.

    python benchmarks/gpu/s22/bench_wd.py --out DIR [--shapes 4096x4096,4096x11008] [--dtypes float16,bfloat16]
        [--k 64] [--tune] [--no-cold] [--name spmm_wd_h200_s22.json]

Times: 20 calls in one CUDA graph, median of ``--repeats`` replays, per call (bench_s5.graph_time).
Errors: relative 2-norm against the float64 product of the same operands.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "plugins" / "cuda_kernels" / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import sparsetorch as st  # noqa: E402
from sparsetorch.format import CSR  # noqa: E402
from sparsetorch_cuda import _spmm_cc, _spmm_wd  # noqa: E402
from sparsetorch_cuda.plan import CudaSpmmPlan  # noqa: E402

from bench_cuda_kernels import cold_copies, cycle  # noqa: E402
from bench_s5 import graph_time  # noqa: E402

#: the variants timed with --tune: ((SPW, W), S, prefetch)
TUNE = [((2, 4), 8, 1), ((2, 4), 8, 2), ((2, 5), 8, 1), ((2, 5), 8, 2), ((2, 8), 4, 1), ((2, 8), 4, 2), ((2, 8), 8, 2),
        ((1, 8), 8, 1), ((1, 8), 8, 2), ((4, 4), 4, 1), ((4, 4), 8, 1), ((4, 2), 8, 1)]
ABLATION = {"x_copy_only": 1, "no_k_loop": 2, "no_mma": 4, "no_scatter": 8, "no_mma_no_scatter": 12, "no_x_copy": 16}


def layer(out_f: int, in_f: int, density: float, seed: int, dtype):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(in_f, out_f, device="cuda", dtype=dtype)
    W = lin.weight.detach().clone()
    thr = W.abs().float().flatten().kthvalue(int((1 - density) * W.numel())).values
    W = (W * (W.abs() > thr)).contiguous()
    A = st.SparseTensor.from_dense(W, mask=W != 0).convert(CSR, index_dtype=torch.int32)
    return W, lin.bias.detach().contiguous(), A


def err(y, ref) -> float:
    return float(torch.linalg.vector_norm(y.double() - ref) / torch.linalg.vector_norm(ref))


def us(v) -> float | str:
    return round(v * 1e6, 3) if isinstance(v, float) else v


def regs(op: _spmm_wd.WdSpmm, k: int) -> dict:
    from cuda.bindings import driver as cu  # noqa: PLC0415

    kern, grid, threads, smem, ncl = op.launch_shape(k)
    h, d = cu.CUkernel(int(kern._fn)), cu.CUdevice(op.dev_index)
    _, r = cu.cuKernelGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, h, d)
    _, loc = cu.cuKernelGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, h, d)
    return {"kernel": kern.name, "grid": list(grid), "threads": threads, "smem": smem, "clusters": ncl,
            "S": op.S, "KR": op.KR, "registers": int(r), "local_bytes": int(loc)}


def wd_copy(op: _spmm_wd.WdSpmm) -> _spmm_wd.WdSpmm:
    """The same op on its own copies of the pattern arrays (cold timing)."""
    c = copy.copy(op)
    c.toff = op.toff.clone()
    c.words = op.words.clone()
    return c


def cc_copy(op: _spmm_cc.CcSpmm) -> _spmm_cc.CcSpmm:
    c = copy.copy(op)
    c.layout = dict(op.layout, sptr=op.layout["sptr"].clone(), cols=op.layout["cols"].clone(),
                    recs=op.layout["recs"].clone())
    c.bv = op.bv.clone()
    return c


def versions() -> dict:
    from sparsetorch_cuda.compile import nvrtc_version  # noqa: PLC0415

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda (torch)": torch.version.cuda,
           "sparsetorch": st.__version__, "nvrtc": ".".join(map(str, nvrtc_version())),
           "gpu": torch.cuda.get_device_name(0)}
    try:
        import subprocess  # noqa: PLC0415

        out["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=20).stdout.strip()
        out["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                           timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001 - informational only
        pass
    return out


def sanitize(text: str) -> str:
    return re.sub(r"(/root|/tmp|/work)(/[^\s]*)?", "<path>", text)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default="spmm_wd_h200_s22.json")
    ap.add_argument("--shapes", default="4096x4096,4096x11008")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--tune", action="store_true", help="also every configuration x S in (4, 8), warm")
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--no-others", action="store_true", help="spmm_wd only (no dense / plan / cc rows)")
    ap.add_argument("--profile", action="store_true", help="one launch of each --tune variant (for Nsight Compute)")
    a = ap.parse_args()
    if a.profile:
        W, b, A = layer(4096, 4096, a.density, 1, torch.float16)
        x = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
        for cfg, S, pf in TUNE[:6]:
            op = _spmm_wd.WdSpmm(A.pos(1), A.crd(1), A.values, (4096, 4096), config=cfg, clusters=S, prefetch=pf)
            op(x, b)
            torch.cuda.synchronize()
        return 0
    t_start = time.time()
    rows: list[dict] = []
    l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20))
    doc = {"benchmark": "bench_wd (session 22)", "command": sanitize(" ".join(["python", *sys.argv])),
           "date": datetime.now(timezone.utc).isoformat(), "machine": platform.node(), "versions": versions(),
           "method": "20 calls in one CUDA graph, median of %d replays, per call; cold: the 20 calls cycle through "
                     "copies of the operands (matrix / pattern arrays, X, bias) that together hold three L2s" % a.repeats,
           "l2_bytes": l2, "rows": rows}

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
            wd = _spmm_wd.WdSpmm(rowptr, col, vals, (out_f, in_f))
            row["wd_launch"] = regs(wd, k)
            row["wd_err"] = err(wd(x, b), ref)
            row["wd_us"] = us(graph_time(lambda: wd(x, b), a.repeats))
            if not a.no_others:
                row["dense_us"] = us(graph_time(lambda: torch.nn.functional.linear(x, W, b), a.repeats))
                plan = CudaSpmmPlan(A)
                plan.set_values(A.values)
                row["plan_err"] = err(plan.apply(x.mT, bias=b).mT, ref)
                row["plan_us"] = us(graph_time(lambda: plan.apply(x.mT, bias=b), a.repeats))
                try:
                    cc = _spmm_cc.CcSpmm(rowptr, col, vals, (out_f, in_f))
                    row["cc_err"] = err(cc(x, b), ref)
                    row["cc_us"] = us(graph_time(lambda: cc(x, b), a.repeats))
                except Exception as exc:  # noqa: BLE001 - recorded
                    cc = None
                    row["cc_error"] = repr(exc)[:200]
            # ablation: the default configuration's _abl build (S = 8)
            if wd.S == 8:
                for label, fl in ABLATION.items():
                    op = copy.copy(wd)
                    op.flags = fl
                    row[f"wd_abl_{label}_us"] = us(graph_time(lambda op=op: op(x, b), a.repeats))
                op = copy.copy(wd)
                op.flags = 0
            print(" ".join(f"{kk}={v}" for kk, v in row.items() if not isinstance(v, dict)), flush=True)
            if not a.no_cold:
                def cold(make, nbytes):
                    fns = [make(i) for i in range(cold_copies(nbytes))]
                    for f in fns:
                        f()
                    return us(graph_time(cycle(fns), a.repeats)), len(fns)

                xs = [x.clone() for _ in range(20)]
                bs = [b.clone() for _ in range(20)]
                wds = {}

                def mk_wd(i):
                    wds[i] = wd if i == 0 else wd_copy(wd)
                    return lambda o=wds[i], i=i: o(xs[i], bs[i])

                row["wd_cold_us"], row["wd_cold_copies"] = cold(mk_wd, 4 * nnz + x.numel() * 2)
                wds.clear()
                if not a.no_others:
                    Ws = {}

                    def mk_dense(i):
                        Ws[i] = W if i == 0 else W.clone()
                        return lambda Wi=Ws[i], i=i: torch.nn.functional.linear(xs[i], Wi, bs[i])

                    row["dense_cold_us"], row["dense_cold_copies"] = cold(mk_dense, W.numel() * 2)
                    Ws.clear()
                    plans = {}

                    def mk_plan(i):
                        Ai = A if i == 0 else A.clone()
                        p = CudaSpmmPlan(Ai)
                        p.set_values(Ai.values)
                        plans[i] = p
                        return lambda p=p, i=i: p.apply(xs[i].mT, bias=bs[i])

                    row["plan_cold_us"], row["plan_cold_copies"] = cold(mk_plan, 4 * nnz)
                    plans.clear()
                    if cc is not None:
                        ccs = {}

                        def mk_cc(i):
                            ccs[i] = cc if i == 0 else cc_copy(cc)
                            return lambda o=ccs[i], i=i: o(xs[i], bs[i])

                        row["cc_cold_us"], row["cc_cold_copies"] = cold(mk_cc, 4 * nnz)
                        ccs.clear()
                del xs, bs
                print(" ".join(f"{kk}={v}" for kk, v in row.items() if "cold" in kk), flush=True)
            if a.tune:
                tune = {}
                for cfg, S, pf in TUNE:
                    key = f"p{cfg[0]}_w{cfg[1]}_s{S}" + ("_f2" if pf == 2 else "")
                    try:
                        op = _spmm_wd.WdSpmm(rowptr, col, vals, (out_f, in_f), config=cfg, clusters=S, prefetch=pf)
                        e = err(op(x, b), ref)
                        tune[key] = {"us": us(graph_time(lambda op=op: op(x, b), a.repeats)), "err": e, **regs(op, k)}
                        if not a.no_cold:
                            ops = [op] + [wd_copy(op) for _ in range(19)]
                            xs = [x.clone() for _ in ops]
                            fns = [lambda o=o, xi=xi: o(xi, b) for o, xi in zip(ops, xs)]
                            for f in fns:
                                f()
                            tune[key]["cold_us"] = us(graph_time(cycle(fns), a.repeats))
                            del ops, xs, fns
                    except Exception as exc:  # noqa: BLE001 - recorded
                        tune[key] = {"error": repr(exc)[:200]}
                    print(f"  tune {key}: {tune[key].get('us', tune[key].get('error'))} cold {tune[key].get('cold_us')} "
                          f"clusters {tune[key].get('clusters')} regs {tune[key].get('registers')}", flush=True)
                row["wd_tune"] = tune
            rows.append(row)
            save()
            torch.cuda.empty_cache()
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

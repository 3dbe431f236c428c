"""Session 9: batch-1 SpMV of 90 % pruned LLM layers (half precision, bias fused) with programmatic
dependent launch (PDL, launch.py) and csr16_x12b (the plan's per-pair rotation of the entries against
shared-memory bank conflicts), against dense cuBLAS (F.linear) in the same run.

    python plugins/cuda_kernels/benchmarks/bench_s9_llm.py --out DIR [--shapes 4096x4096,4096x11008]
                                                           [--dtypes float16,bfloat16] [--variants ...]

W (out x in) pruned by magnitude to 90 % (benchmarks/bench_llm.py's rule, CSR int32), x one column,
bias fused: per-call time of 20 calls captured in one CUDA graph, median of 15 replays' CUDA-event
times (bench_s5.graph_time, as bench_s8_llm.py). Rows:

- ``dense``: F.linear(x, W, b);
- ``<kernel>/<threads>+<flags>`` (``!`` appended: PDL off): the plan's launch (``plan.apply``) with
  ``plan.csr16_kernel``, ``csr16_threads``, ``csr16_flags`` (kernels/mma.cu: 1 launch_dependents at the
  start, 2 after the barrier, 4 the pattern read before griddepcontrol.wait) and ``csr16_pdl``;
- ``default``: the plan as it comes (nothing set);
- ``nm24`` / ``nm24_dense``: the same layer pruned 2:4 (NM(2, 4)) through ``plan.apply``, and dense;
- ``pdl_race``: y_{i+1} = A y_i (the 4096^2 layer) launched back to back with PDL, the outputs NaN first,
  each kernel triggering its dependents at its start: NaN outputs of the real kernel and of
  csr16_x12a_d16 (no griddepcontrol.wait): shows that the GPU tests' chain would catch a missing wait;
- ``rot_stats``: csr16_x12b's plan statistics (gather steps' fullest-bank counts per row).

Errors are max |y - ref| / max |ref| against a float32 product of the same half-precision operands.
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
from sparsetorch_cuda.launch import Prepared, allow_pdl, kernel  # noqa: E402
from sparsetorch_cuda.plan import CudaSpmmPlan  # noqa: E402

from bench_llm import RULES  # noqa: E402
from bench_s5 import kernel_regs as _kernel_regs, pruned_layer, record_variant  # noqa: E402

VARIANTS = ("x12a/512+0!,x12a/512+0,x12a/512+1,x12a/512+2,x12a/512+4,x12a/512+5,x12a/512+6,"
            "x12b/512+0!,x12b/512+0,x12b/512+1,x12b/512+2,x12b/512+4,x12b/512+5,x12b/512+6,"
            "x12a/1024+4,x12a/1024+6,x12b/1024+4,x12b/1024+6,x12b/256+4,x12b/256+6,xva/512+4,xva/512+6")


def pdl_race(plan: CudaSpmmPlan, n: int, dtype: torch.dtype, steps: int = 16) -> dict:
    """NaN outputs of a back-to-back PDL chain y_{i+1} = A y_i (flags 1: each kernel lets its dependent
    start at once), with csr16_x12a and with csr16_x12a_d16 (no griddepcontrol.wait), eager and in a graph."""
    lay = plan._mma_layout()
    col = plan._col12()
    v = plan._values
    m = plan.shape[0]
    out = {}
    for name in ("csr16_x12a", "csr16_x12a_d16"):
        kern = allow_pdl(kernel("mma", name, dtype, torch.int32, 0, 9), 0)
        _mma._allow_smem(kern, 0, 2 * n)
        Ys = torch.full((steps + 1, n), float("nan"), dtype=dtype, device="cuda")
        Ys[0].normal_()
        args = (m, n, lay["rowptr"].data_ptr(), col.data_ptr(), v.data_ptr(), Ys[0].data_ptr(), 0, Ys[1].data_ptr(), 1)
        prep = Prepared(kern, (-(-m // 16), 1), 512, args, 2 * n, 5, 7, 0)
        res = {"pdl": prep.pdl}
        for mode in ("eager", "graph"):
            Ys[1:].fill_(float("nan"))
            if mode == "eager":
                for i in range(steps):
                    prep(Ys[i].data_ptr(), Ys[i + 1].data_ptr())
            else:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for i in range(steps):
                        prep(Ys[i].data_ptr(), Ys[i + 1].data_ptr())
                Ys[1:].fill_(float("nan"))
                g.replay()
            torch.cuda.synchronize()
            res[f"{mode}_nan_outputs_of_{steps}"] = int((~torch.isfinite(Ys[1:].float())).any(1).sum())
        out[name] = res
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="4096x4096,4096x11008")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--variants", default=VARIANTS)
    ap.add_argument("--no-nm24", action="store_true")
    ap.add_argument("--name", default="llm_h200_s9.json")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows_out = []
    race = None
    for shape in args.shapes.split(","):
        n_in, n_out = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        base = torch.nn.Linear(n_in, n_out)
        for dname in args.dtypes.split(","):
            dtype = getattr(torch, dname)
            dense, A, W, b = pruned_layer(base, dtype, "90 %", dev)
            x = torch.randn(1, n_in, device=dev, dtype=dtype)
            ref = x.float() @ W.float().T + b.float()
            row = {"in": n_in, "out": n_out, "sparsity": "90 %", "dtype": dname, "k": 1, "times_us": {}, "errors": {}}
            t = row["times_us"]

            def rec(name, fn, plan=None, ref=ref, row=row):
                record_variant(row, name, fn, ref, plan=plan)

            rec("dense", lambda: torch.nn.functional.linear(x, W, b))
            plan = CudaSpmmPlan(A)
            plan.set_values(A.values)
            row["nnz"] = plan.nnz
            call = lambda plan=plan: plan.apply(x.mT, bias=b)  # noqa: E731
            rec("default", call, plan)
            row["default_kernel"] = plan._csr16_name()
            for spec in [s for s in args.variants.split(",") if s]:
                pdl = not spec.endswith("!")
                kn, rest = spec.rstrip("!").split("/")
                th, _, fl = rest.partition("+")
                plan.csr16_kernel, plan.csr16_threads, plan.csr16_flags, plan.csr16_pdl = kn, int(th), int(fl or 0), pdl
                rec(spec, call, plan)
            for attr in ("csr16_kernel", "csr16_threads", "csr16_flags", "csr16_pdl"):
                plan.__dict__.pop(attr, None)
            row["rot_stats"] = plan._mma_layout().get("rot_stats")
            if race is None and n_in == n_out:
                race = pdl_race(plan, n_in, dtype)
            plan = A = None
            if not args.no_nm24:
                A24 = RULES["2:4"]()("layer", dense)
                W24 = A24.to_dense().to(dtype)
                ref24 = x.float() @ W24.float().T + b.float()
                p24 = CudaSpmmPlan(A24)
                p24.set_values(A24.values)
                rec("nm24_dense", lambda: torch.nn.functional.linear(x, W24, b), ref=ref24)
                rec("nm24", lambda: p24.apply(x.mT, bias=b), p24, ref=ref24)
                p24 = A24 = W24 = None
            ours = {kk: vv for kk, vv in t.items() if not kk.startswith(("dense", "nm24")) and isinstance(vv, float)}
            if ours and isinstance(t.get("dense"), float):
                best = min(ours, key=ours.get)
                row["best"] = best
                row["speedups_vs_dense"] = {kk: round(t["dense"] / vv, 3) for kk, vv in ours.items()}
            if isinstance(t.get("nm24"), float) and isinstance(t.get("nm24_dense"), float):
                row["nm24_speedup_vs_dense"] = round(t["nm24_dense"] / t["nm24"], 3)
            rows_out.append(row)
            print(f"{n_in}x{n_out} {dname:8s} " + " ".join(
                f"{kk}={vv:.2f}" if isinstance(vv, float) else f"{kk}={vv}" for kk, vv in t.items())
                + f" | best {row.get('best')} x{row.get('speedups_vs_dense', {}).get(row.get('best'), float('nan'))}"
                f" default({row['default_kernel']}) x{row.get('speedups_vs_dense', {}).get('default', float('nan'))}"
                f" nm24 x{row.get('nm24_speedup_vs_dense')} maxerr={max(row['errors'].values()):.1e} rot={row['rot_stats']}",
                flush=True)
            W = dense = None
            torch.cuda.empty_cache()
    print(f"pdl_race: {race}", flush=True)
    names = ["csr16_x12a", "csr16_x12b", "csr16_xva"]
    doc = {"benchmark": "cuda plugin session 9: batch-1 SpMV of 90 % pruned LLM layers with programmatic dependent "
                        "launch and csr16_x12b against dense cuBLAS (kernel time, CUDA graph of 20 calls, bias fused)",
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "command": "python plugins/cuda_kernels/benchmarks/bench_s9_llm.py " + " ".join(sys.argv[1:]),
           "commit": args.commit,
           "machine": {"platform": platform.platform(), "gpu": torch.cuda.get_device_name(0)},
           "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()},
           "defaults": {"csr16_auto": list(_mma.CSR16_AUTO), "flags_by": dict(_mma.CSR16_FLAGS_BY),
                        "threads_by": dict(_mma.CSR16_XV_THREADS_BY), "pdl": _mma.CSR16_PDL_DEFAULT},
           "pdl_race": race,
           "kernels_float16": _kernel_regs(names, torch.float16, lambda name: 10 if name == "csr16_x12b" else 9),
           "rows": rows_out}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / args.name).write_text(json.dumps(doc, indent=1))
    print(f"wrote {out / args.name}")


if __name__ == "__main__":
    main()

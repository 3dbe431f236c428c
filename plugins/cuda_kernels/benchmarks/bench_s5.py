"""Session 5: the tensor-core SpMM (kernels/mma.cu) and the batch-1 uint16-column CSR kernel on
LLM-sized layers, kernel time, against dense cuBLAS, in one run.

    python plugins/cuda_kernels/benchmarks/bench_s5.py --out DIR [--ks 1,8,16,32,64,128] [--quick]
    python plugins/cuda_kernels/benchmarks/bench_s5.py --refit RESULTS.json sparsetorch_cuda/cost_h200.json

For W (out x in) pruned as benchmarks/bench_llm.py prunes (magnitude 50 / 90 / 99 %: CSR; 2:4:
NM(2, 4)), float16 (and bfloat16 for the 90 % / 2:4 rows), X^T of k columns given as a linear
layer holds it (``(k, in)`` contiguous): per-call time of 20 calls captured in one CUDA graph
(median of 10 replays) for ``F.linear(x, W, b)`` (dense), ``plan.apply(x.mT, bias=b)`` with the
tensor-core kernel at every cluster size S (k >= 8; ``S=auto`` is the plan's own choice), the
earlier CUDA-core path (``use_mma = False``, bias added by a second kernel) and, at k = 1,
csr16_warp against the earlier CSR kernel. Also the bytes each moves (values, indices, X, Y) and
the fraction of the copy bandwidth measured in the same run, for the cost model's fit.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from sparsetorch_cuda.plan import CudaSpmmPlan  # noqa: E402

from bench_llm import RULES  # noqa: E402

CALLS = 20


def kernel_regs(names: list[str], dtype: torch.dtype, nargs: Callable[[str], int]) -> dict:
    """Registers and local (spill) bytes per thread of each kernel of the mma module, from the
    driver (``nargs(name)``: the kernel's argument count, as the launcher takes it); an error is
    recorded in place of a kernel that does not load."""
    from cuda.bindings import driver as cu  # noqa: PLC0415

    from sparsetorch_cuda.launch import kernel  # noqa: PLC0415

    out = {}
    for name in names:
        try:
            k = kernel("mma", name, dtype, torch.int32, 0, nargs(name))
            h, d = cu.CUkernel(int(k._fn)), cu.CUdevice(0)
            _, regs = cu.cuKernelGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, h, d)
            _, local = cu.cuKernelGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, h, d)
            out[name] = {"registers": int(regs), "local_bytes": int(local)}
        except Exception as exc:  # noqa: BLE001 - recorded
            out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:100]}"}
    return out


def capture(fn, calls: int = CALLS) -> "torch.cuda.CUDAGraph":
    """``calls`` calls of ``fn`` captured in one CUDA graph (three warm-up calls on a side stream first)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return g


def graph_time(fn, repeats: int = 10) -> float | str:
    try:
        g = capture(fn)
    except Exception as exc:  # noqa: BLE001
        torch.cuda.synchronize()
        return f"not capturable: {type(exc).__name__}: {str(exc)[:120]}"
    ts = []
    for _ in range(repeats + 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3 / CALLS)
    return statistics.median(ts[2:])


def pruned_layer(base: torch.nn.Linear, dtype: torch.dtype, rule: str = "90 %", dev: torch.device | str = "cuda") -> tuple:
    """The LLM benchmarks' layer: a dense ``nn.Linear`` with ``base``'s weights in ``dtype`` on
    ``dev``, pruned by ``RULES[rule]`` (benchmarks/bench_llm.py). Returns ``(dense, A, W, b)``: the
    dense layer, its pruned SparseTensor, A as a dense matrix in ``dtype``, the bias."""
    from bench_llm import RULES  # noqa: PLC0415 - benchmarks/ is on sys.path (above)

    dense = torch.nn.Linear(base.in_features, base.out_features).to(dev, dtype)
    with torch.no_grad():
        dense.weight.copy_(base.weight)
        dense.bias.copy_(base.bias)
    A = RULES[rule]()("layer", dense)
    return dense, A, A.to_dense().to(dtype), dense.bias.detach()


def record_variant(row: dict, name: str, fn, ref: torch.Tensor, *, plan=None, y: torch.Tensor | None = None) -> None:
    """One row entry of the LLM-layer benches: run ``fn`` (into ``y`` when given; ``plan``'s
    prepared launches dropped first, so a changed kernel choice takes effect), its max error
    against ``ref`` into ``row["errors"][name]`` and its device time (graph of 20, µs) into
    ``row["times_us"][name]``; an exception is recorded, not raised."""
    t = row["times_us"]
    try:
        if plan is not None:
            plan._prepared = {}
        out = fn()
        out = y if y is not None else out
        torch.cuda.synchronize()
        yy = out.reshape(ref.shape)
        row["errors"][name] = float((yy.float() - ref).abs().max() / ref.abs().max())
        tt = graph_time(fn, 15)
        t[name] = tt * 1e6 if isinstance(tt, float) else tt
    except Exception as exc:  # noqa: BLE001 - recorded
        t[name] = f"error: {type(exc).__name__}: {str(exc)[:200]}"


def copy_bw() -> float:
    x = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = graph_time(lambda: y.copy_(x))
    return 2 * x.numel() / t


def refit(doc: dict, cost_path: Path) -> dict:
    """Fit the cost model's tensor-core and csr16 parts to a run of this script and write them into
    the cost JSON at ``cost_path`` (the other families and fields are kept): ``mma.rows`` (one per
    case with k >= 8: the plan's own cluster size, kernel time), ``mma.coefficients``
    (:func:`sparsetorch_cuda.cost.fit_mma` of those rows), and ``rows`` of family ``csr16`` (k = 1,
    CSR: bytes, kernel time) with ``efficiency["csr16"]`` their median."""
    from sparsetorch_cuda import cost  # noqa: PLC0415

    data = json.loads(cost_path.read_text())
    bw = data["copy_bandwidth_bytes_per_s"]
    mrows, crows = [], []
    for r in doc["rows"]:
        kind = "nm" if r["format"].startswith("NM") else "csr"
        m, n, t = r["out"], r["in"], r["times_us"]
        if r["k"] >= 8 and isinstance(t.get("mma_Sauto"), float):
            mrows.append({"kind": kind, "m": m, "n": n, "nnz": r["nnz"], "k": r["k"], "dtype": r["dtype"], "sparsity": r["sparsity"],
                          "split": r.get("auto_split"), "kernel_s": t["mma_Sauto"] * 1e-6})
        if r["k"] == 1 and kind == "csr" and isinstance(t.get("ours_bias"), float):
            nbytes = cost.traffic("csr", m=m, n=n, nnz=r["nnz"], k=1, vs=2, isz=4, variant="csr16")
            crows.append({"family": "csr16", "case": f"{n}x{m} {r['sparsity']} {r['dtype']} k=1 (bias fused)", "bytes": nbytes,
                          "kernel_s": t["ours_bias"] * 1e-6})
    data["mma"] = {"coefficients": cost.fit_mma(mrows), "rows": mrows,
                   "source": "benchmarks/results/cuda_kernels_h200_s5.json (" + doc["command"] + ", " + doc["date"] + ")"}
    data["rows"] = [r for r in data["rows"] if r.get("family") != "csr16"] + crows
    data["efficiency"]["csr16"] = statistics.median(r["bytes"] / (r["kernel_s"] * bw) for r in crows)
    data.setdefault("notes", []).append("mma and csr16 (session 5): refit offline by bench_s5.py --refit from "
                                        "benchmarks/results/cuda_kernels_h200_s5.json; csr16 efficiencies against this file's copy bandwidth")
    cost_path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--refit", nargs=2, metavar=("RESULTS_JSON", "COST_JSON"),
                    help="fit the cost model's mma / csr16 parts to a results file of this script and exit")
    ap.add_argument("--out")
    ap.add_argument("--shapes", default="4096x4096,4096x11008")
    ap.add_argument("--ks", default="1,8,16,32,64,128")
    ap.add_argument("--sparsities", default="90 %,2:4,50 %,99 %")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", default="128,64", help="rows of A per block of the tensor-core kernel to time (plan.mma_rows)")
    args = ap.parse_args()
    if args.refit:
        refit(json.loads(Path(args.refit[0]).read_text()), Path(args.refit[1]))
        return
    if not args.out:
        ap.error("--out is required")
    dev = torch.device("cuda")
    bw = copy_bw()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    ks = [int(v) for v in args.ks.split(",")]
    for shape in args.shapes.split(","):
        n_in, n_out = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        base = torch.nn.Linear(n_in, n_out)
        for rule in [s.strip() for s in args.sparsities.split(",")]:
            dtypes = ("float16", "bfloat16") if rule in ("90 %", "2:4") and not args.quick else ("float16",)
            for dname in dtypes:
                dtype = getattr(torch, dname)
                dense = torch.nn.Linear(n_in, n_out).to(dev, dtype)
                with torch.no_grad():
                    dense.weight.copy_(base.weight)
                    dense.bias.copy_(base.bias)
                A = RULES[rule]()("layer", dense)
                W = A.to_dense().to(dtype)
                b = dense.bias.detach()
                plan = CudaSpmmPlan(A)
                plan.set_values(A.values)
                nnz = plan.nnz
                for k in ks:
                    x = torch.randn(k, n_in, device=dev, dtype=dtype)
                    ref = x.float() @ W.float().T + b.float()
                    row = {"in": n_in, "out": n_out, "sparsity": rule, "dtype": dname, "k": k, "nnz": nnz,
                           "format": A.format.name, "times_us": {}, "errors": {}}
                    t = row["times_us"]

                    def rec(name, fn, out_t):
                        y = fn()
                        yy = y if y.shape == ref.shape else y.mT
                        row["errors"][name] = float((yy.float() - ref).abs().max() / ref.abs().max())
                        tt = graph_time(fn)
                        t[name] = tt * 1e6 if isinstance(tt, float) else tt

                    rec("dense", lambda: torch.nn.functional.linear(x, W, b), None)
                    if k >= 8:
                        plan.use_mma = True
                        for s in (None, 1, 2, 4, 8):
                            plan.mma_split_override = s
                            plan._prepared = {}
                            rec(f"mma_S{s or 'auto'}", lambda: plan.apply(x.mT, bias=b), None)
                        plan.mma_split_override = None
                        row["auto_split"] = plan.mma_split(k)
                        for rows_ in [int(v) for v in args.rows.split(",") if int(v) != 128]:  # other block heights
                            plan.mma_rows = rows_
                            for s in (None, 4, 8):
                                plan.mma_split_override = s
                                plan._prepared = {}
                                rec(f"mma_r{rows_}_S{s or 'auto'}", lambda: plan.apply(x.mT, bias=b), None)
                            plan.mma_rows, plan.mma_split_override = 128, None
                        if k in (8, 64) and (rule != "2:4" or k == 8) and rule != "50 %":
                            plan.use_mma = False
                            plan._prepared = {}
                            rec("cuda_core", lambda: plan.apply(x.mT, bias=b), None)
                            plan.use_mma = True
                        plan._prepared = {}
                    else:
                        plan._prepared = {}
                        rec("ours_bias", lambda: plan.apply(x.mT, bias=b), None)
                        plan._prepared = {}
                        rec("ours_nobias", lambda: plan.apply(x.mT), None)
                        if plan.kind == "csr":
                            plan.use_csr16 = False
                            plan._prepared = {}
                            rec("csr_old_bias", lambda: plan.apply(x.mT, bias=b), None)
                            plan.use_csr16 = True
                            plan._prepared = {}
                    vs = 2
                    if plan.kind == "nm":
                        mat = nnz * vs + nnz * 2 / 8
                    else:
                        mat = nnz * (vs + 2) + (n_out + 1) * 4 + (-(-n_in // 64) + 1) * n_out * 2 * (1 if k >= 8 else 0)
                    row["bytes"] = {"matrix": mat, "x": k * n_in * vs, "y": k * n_out * vs, "dense_weight": n_in * n_out * vs}
                    best = min((v for kk, v in t.items() if kk.startswith(("mma_S", "ours", "csr16")) and isinstance(v, float)),
                               default=None)
                    if best:
                        row["best_us"] = best
                        row["speedup_vs_dense"] = t["dense"] / best
                        row["fraction_of_copy_bw"] = (mat + row["bytes"]["x"] + row["bytes"]["y"]) / (best * 1e-6) / bw
                    rows.append(row)
                    print(f"{n_in}x{n_out} {rule:>5s} {dname:8s} k={k:<4d} " + " ".join(
                        f"{kk}={v:.1f}" if isinstance(v, float) else f"{kk}=n/c" for kk, v in t.items())
                          + f" | x{row.get('speedup_vs_dense', float('nan')):.2f} err={max(row['errors'].values()):.1e}", flush=True)
                plan = A = W = dense = None  # noqa: F841 - freed before the next pattern
                torch.cuda.empty_cache()
    doc = {"benchmark": "cuda plugin session 5: tensor-core SpMM and csr16 on LLM layers (kernel time, CUDA graph of 20 calls)",
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "command": "python plugins/cuda_kernels/benchmarks/bench_s5.py " + " ".join(sys.argv[1:]),
           "machine": {"gpu": torch.cuda.get_device_name(0), "platform": platform.platform(), "torch": torch.__version__},
           "copy_bandwidth_bytes_per_s": bw, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_kernels_h200_s5.json").write_text(json.dumps(doc, indent=1))
    print("wrote", out / "cuda_kernels_h200_s5.json")


if __name__ == "__main__":
    main()

"""LLM-sized sparse linear layers on the CPU: dense nn.Linear vs sparsetorch vs torch's sparse CSR.

Issue 17, item 5, the CPU part: the 4096 x 4096 (attention projection) and 4096 -> 11008 (MLP
up projection) layers of a 7B-class model, pruned by magnitude to 50 %, 90 % and 99 % sparsity
(CSR) and to 2:4 (the NM(2, 4) format), at batch 1 (one token) and 64, float32, forward and
forward+backward, eager. Side by side in one run, on the same pruned weight:

- ``dense``: ``nn.functional.linear`` with the pruned weight as a dense matrix (GEMM);
- ``sparsetorch``: ``SparseLinear`` (dispatch picks the backend; the chosen one is recorded);
- ``torch CSR``: ``torch.sparse.mm`` on the pruned weight as a torch CSR tensor (forward only:
  torch has no gradient for a CSR weight's values).

Every output is checked against a float64 dense product with the pruned weight. Times are
medians of ``--repeats`` wall-clock runs after a warm-up, with ``--threads`` torch threads
(default 1: this machine's cores are shared); quote ratios. The half-precision, compiled and GPU
parts of item 5 are not run here (float16/bfloat16 GEMM on this CPU is not what an LLM would use;
``torch.compile`` on the CPU needs a C++ toolchain; GPUs are for the H200 runs).

    python benchmarks/bench_llm.py                     # writes benchmarks/results/llm_cpu.json
    python benchmarks/bench_llm.py --quick --out /tmp/llm.json   # 1024-wide layers, 2 repeats
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

import sparsetorch as st

HERE = Path(__file__).resolve().parent

RULES = {
    "50 %": lambda: st.nn.magnitude(0.5),
    "2:4": lambda: st.nn.n_m(2, 4),
    "90 %": lambda: st.nn.magnitude(0.9),
    "99 %": lambda: st.nn.magnitude(0.99),
}


def _time(fn, repeats: int) -> float:
    fn()  # warm-up (plans, conversions, allocator)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _values_grad_kernel(layer: st.nn.SparseLinear, batch: int, repeats: int) -> float:
    """The values' gradient alone (the SDDMM the backward pass calls: the torch product plan's
    ``sddmm``), timed outside autograd, a diagnostic of the forward+backward column."""
    from sparsetorch.backends.torch_native.spmm import TorchSpmmPlan  # noqa: PLC0415 - core internals, diagnostic only

    A = layer.weight.detach()
    gen = torch.Generator().manual_seed(1)
    P = torch.randn(layer.out_features, batch, generator=gen)
    Q = torch.randn(layer.in_features, batch, generator=gen)
    plan = TorchSpmmPlan(A)
    plan.set_values(A.values)
    return _time(lambda: plan.sddmm(P, Q), repeats)


def _case(dense: nn.Linear, layer: st.nn.SparseLinear, batch: int, repeats: int, seed: int) -> dict:
    W = layer.to_dense().detach()
    b = dense.bias.detach()
    x = torch.randn(batch, dense.in_features, generator=torch.Generator().manual_seed(seed))
    ref = (x.double() @ W.double().T + b.double())
    scale = float(ref.abs().max())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "sparse CSR support is in beta" warning
        Wcsr = W.to_sparse_csr()
    impls = {
        "dense": lambda: torch.nn.functional.linear(x, W, b),
        "sparsetorch": lambda: layer(x),
        "torch CSR": lambda: torch.sparse.mm(Wcsr, x.mT).mT + b,
    }
    out: dict = {}
    for name, fn in impls.items():
        with torch.no_grad():
            y = fn()
            err = float((y.double() - ref).abs().max()) / scale
            row: dict = {"forward_s": _time(fn, repeats), "max_rel_error_vs_float64": err}
        if name == "sparsetorch":
            table = st.explain("matmul", layer.weight, x.mT.contiguous())
            row["backend"] = f"{table.chosen.backend}/{table.chosen.method}"
        if name == "dense":
            Wg = W.clone().requires_grad_(True)
            bg = b.clone().requires_grad_(True)
            xx = x.clone().requires_grad_(True)

            def step():
                Wg.grad = bg.grad = xx.grad = None
                torch.nn.functional.linear(xx, Wg, bg).sum().backward()

            row["forward_backward_s"] = _time(step, repeats)
        elif name == "sparsetorch":
            xx = x.clone().requires_grad_(True)

            def step():
                layer.zero_grad(set_to_none=True)
                xx.grad = None
                layer(xx).sum().backward()

            row["forward_backward_s"] = _time(step, repeats)
        out[name] = row
    return out


def _git_commit() -> str | None:
    import subprocess  # noqa: PLC0415

    try:
        return subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x4096,4096x11008", help="in x out, comma-separated")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--sparsities", default=",".join(RULES))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="1024x1024 and 1024x2752, 2 repeats (a smoke run)")
    ap.add_argument("--out", default=str(HERE / "results" / "llm_cpu.json"))
    ap.add_argument("--commit", default=None, help="the commit measured (default: git rev-parse HEAD of this checkout)")
    args = ap.parse_args()
    if args.quick:
        args.shapes, args.repeats = "1024x1024,1024x2752", 2
    torch.set_num_threads(args.threads)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    batches = [int(v) for v in args.batches.split(",")]
    rules = [s.strip() for s in args.sparsities.split(",")]
    results = []
    for n_in, n_out in shapes:
        torch.manual_seed(0)
        dense = nn.Linear(n_in, n_out)
        for rule in rules:
            t0 = time.perf_counter()
            layer = st.nn.SparseLinear(RULES[rule]()("layer", dense), dense.bias.detach())
            prune_s = time.perf_counter() - t0
            for batch in batches:
                case = _case(dense, layer, batch, args.repeats, seed=batch)
                row = {"in_features": n_in, "out_features": n_out, "sparsity": rule, "batch": batch,
                       "format": layer.weight.format.name, "stored": layer.values.numel(),
                       "density": round(layer.density, 6), "prune_and_build_s": prune_s, **case}
                results.append(row)
                row["values_grad_kernel_s"] = _values_grad_kernel(layer, batch, args.repeats)
                d, s, c = case["dense"], case["sparsetorch"], case["torch CSR"]
                fb = s["forward_backward_s"]
                fbs = f"{fb * 1e3:8.2f} ms ({d['forward_backward_s'] / fb:5.2f}x)"
                print(f"{n_in}x{n_out} {rule:>5s} b={batch:<3d} fwd dense {d['forward_s'] * 1e3:8.2f} ms | ours "
                      f"{s['forward_s'] * 1e3:8.2f} ms ({d['forward_s'] / s['forward_s']:5.2f}x) | torch CSR "
                      f"{c['forward_s'] * 1e3:8.2f} ms ({d['forward_s'] / c['forward_s']:5.2f}x) || fwd+bwd dense "
                      f"{d['forward_backward_s'] * 1e3:8.2f} ms | ours {fbs} [{s['backend']}] sddmm "
                      f"{row['values_grad_kernel_s'] * 1e3:.2f} ms", flush=True)
            del layer
            gc.collect()
        del dense
        gc.collect()
    doc = {
        "benchmark": "LLM-sized sparse linear layers, CPU, float32 (issue 17 item 5, CPU part)",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join([Path(os.path.relpath(sys.argv[0], HERE.parent)).as_posix()] + sys.argv[1:]),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "processor": platform.processor(),
                    "torch_threads": torch.get_num_threads(), "load_average": list(os.getloadavg())},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "sparsetorch": st.__version__,
                     "commit": args.commit or _git_commit()},
        "problem": {"dtype": "float32", "repeats": args.repeats, "mode": "eager",
                    "speedup": "dense time / implementation time (> 1: faster than dense)"},
        "notes": ("medians of wall-clock timings after a warm-up, all implementations in one run on the same pruned "
                  "weight; the machine's cores are shared with other work, so quote ratios; torch CSR has no "
                  "forward+backward (no gradient for a CSR weight's values); errors against float64 dense"),
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

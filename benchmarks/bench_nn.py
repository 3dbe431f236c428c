"""Sparse layers on the CPU: forward and forward+backward of one linear layer, side by side.

A 4096 x 4096 float32 layer on a batch of 64 inputs, pruned to several densities by magnitude
(CSR) and to 2:4 (N:M), against the dense ``nn.Linear`` (MKL/OpenBLAS GEMM) and torch's own
sparse CSR ``torch.sparse.mm`` on the same pruned weight. Median of ``--repeats`` timings after
a warm-up; torch's thread count as set by ``--threads`` (default 1: this machine's 2 cores are
shared). Every implementation's output is checked against the dense layer with the pruned weight.

    python benchmarks/bench_nn.py                      # writes benchmarks/results/nn_cpu.json
    python benchmarks/bench_nn.py --n 1024 --repeats 3 --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
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


def _time(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _case(dense: nn.Linear, layer: st.nn.SparseLinear, x: torch.Tensor, repeats: int) -> dict:
    W = layer.to_dense().detach()
    with torch.no_grad():
        ref = torch.nn.functional.linear(x, W, dense.bias)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Wt = W.to_sparse_csr()
    out: dict = {"stored": layer.values.numel(), "density": layer.density}
    impls = {
        "dense nn.Linear (pruned weight)": lambda: torch.nn.functional.linear(x, W, dense.bias),
        "torch.sparse CSR mm": lambda: torch.sparse.mm(Wt, x.mT).mT + dense.bias,
        "sparsetorch SparseLinear": lambda: layer(x),
    }
    for name, fn in impls.items():
        with torch.no_grad():
            y = fn()
        err = float((y - ref).abs().max() / ref.abs().max())
        row = {"forward_s": _time(lambda: fn(), repeats), "max_rel_error": err}
        if name.startswith("sparsetorch"):
            table = st.explain("matmul", layer.weight, x.reshape(-1, x.shape[-1]).mT)
            row["backend"] = f"{table.chosen.backend}/{table.chosen.method}"
        if name != "torch.sparse CSR mm":  # torch's sparse mm has no gradient for a CSR weight's values
            xx = x.clone().requires_grad_(True)

            def step(fn=fn, xx=xx):
                if name.startswith("dense"):
                    Wg = W.clone().requires_grad_(True)
                    torch.nn.functional.linear(xx, Wg, dense.bias).sum().backward()
                else:
                    layer.zero_grad(set_to_none=True)
                    layer(xx).sum().backward()

            row["forward_backward_s"] = _time(step, repeats)
        out[name] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(HERE / "results" / "nn_cpu.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dense = nn.Linear(args.n, args.n)
    x = torch.randn(args.batch, args.n)
    cases = {}
    for label, fn in (("magnitude 50 %", st.nn.magnitude(0.5)), ("2:4", st.nn.n_m(2, 4)),
                      ("magnitude 90 %", st.nn.magnitude(0.9)), ("magnitude 99 %", st.nn.magnitude(0.99))):
        layer = st.nn.SparseLinear(fn("layer", dense), dense.bias.detach())
        cases[label] = _case(dense, layer, x, args.repeats)
        c = cases[label]
        print(f"{label:16s} " + "  ".join(f"{k.split(' ')[0]}: {v['forward_s'] * 1e3:.2f} ms" for k, v in c.items()
                                          if isinstance(v, dict)), flush=True)
    doc = {
        "benchmark": "sparse linear layer, CPU",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join([Path(os.path.relpath(sys.argv[0], HERE.parent)).as_posix()] + sys.argv[1:]),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "processor": platform.processor(),
                    "torch_threads": torch.get_num_threads()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "sparsetorch": st.__version__},
        "problem": {"in_features": args.n, "out_features": args.n, "batch": args.batch, "dtype": "float32",
                    "repeats": args.repeats},
        "notes": "medians of wall-clock timings after a warm-up; quote ratios (2 shared cores)",
        "cases": cases,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

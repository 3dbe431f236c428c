"""Session 14: the per-call floor of a kernel in a CUDA graph of 20 calls on this GPU, beside the DELTA(4)
kernel at vanishing densities (its fixed cost): trivial torch kernels (a 16 KB zero fill, a 16 KB copy, a
1024^2 fp16 GEMV) and the plan's default DELTA(4) kernel on 8192^2 at 0 (one entry), 0.1 %, 1 % and 10 %
stored density, timed as bench_cuda_kernels.graph_time does (median of 10 replays / 20).

    python benchmarks/gpu/s14/floor_probe.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/

import sparsetorch as st  # noqa: E402
from bench_cuda_kernels import GRAPH_CALLS as CALLS, graph_time  # noqa: E402
from sparsetorch.format import DELTA  # noqa: E402


def main() -> int:
    from sparsetorch_cuda.plan import CudaSpmmPlan

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default="default,tc8pk", help="DELTA variants (default: the plan's choice)")
    ap.add_argument("--densities", default="0,0.001,0.01,0.1")
    ap.add_argument("--name", default="floor_probe_h200_s14.json")
    a = ap.parse_args()
    dev = "cuda"
    y = torch.empty(8192, device=dev, dtype=torch.float16)
    x = torch.randn(8192, device=dev).half()
    M = torch.randn(1024, 1024, device=dev).half()
    v = torch.randn(1024, 1, device=dev).half()
    cases = [("torch zero_ 16 KB", lambda: y.zero_()), ("torch copy_ 16 KB", lambda: y.copy_(x)),
             ("torch GEMV 1024^2 fp16", lambda: M @ v)]
    gen = torch.Generator(device=dev).manual_seed(3)
    xs = x.reshape(-1, 1)
    for dens in (float(d) for d in a.densities.split(",")):
        mask = torch.rand(8192, 8192, device=dev, generator=gen) < dens
        mask[0, 0] = True  # at least one entry
        W = (torch.randn(8192, 8192, device=dev, dtype=torch.float64, generator=gen) * mask).half()
        A = st.SparseTensor.from_dense(W, mask=mask).convert(DELTA(4), index_dtype=torch.int32, max_fill=float("inf"))
        for var in a.variants.split(","):
            p = CudaSpmmPlan(A, variant=None if var == "default" else var)
            p.set_values(A.values)
            p.apply(xs)
            cases.append((f"DELTA(4) 8192^2 {dens:.1%} [{p.variant}] stored {int(A.nse)}", lambda p=p: p.apply(xs)))
        del W, mask
    rows = []
    for name, fn in cases:
        t = graph_time(fn)
        rows.append({"case": name, "per_call_us": t * 1e6})
        print(f"{name:<50} {t * 1e6:7.2f} us", flush=True)
    out = {"benchmark": "floor_probe (session 14)", "command": " ".join(["python", *sys.argv]),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "calls_per_graph": CALLS, "rows": rows}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / a.name).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Session 14 (for the next device call): where spmm_bm's time goes at batch 64 (issue 17), by the
kernel's benchmarking flags (kernels/spmm_bm.cu; wrong results): 16 return after the pipeline's prologue,
32 after the column-tile loop, 1 no products, 2 no A fragments, 4 no value copies, 8 no X^T copies, and
their sums; for the plan's cluster-size choice and for each cluster size, beside dense nn.Linear and the
plan's default kernel, on 4096^2 at 10 % (float16, X^T as a linear layer holds it). Graph of 20 calls
(bench_cuda_kernels.graph_time). Writes bm_probe_h200.json under --out.

    python benchmarks/gpu/s14/bm_probe.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/

import sparsetorch as st  # noqa: E402
from bench_cuda_kernels import graph_time  # noqa: E402
from sparsetorch.format import CSR  # noqa: E402

FLAGS = (0, 16, 32, 1, 2, 4, 8, 1 | 2, 4 | 8, 1 | 2 | 4 | 8, 1 | 2 | 4 | 8 | 32)


def main() -> int:
    from sparsetorch_cuda.plan import CudaSpmmPlan

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--splits", default="auto,1,2,4,8")
    a = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(7)
    n = a.size
    mask = torch.rand(n, n, device=dev, generator=g) < 0.1
    W = (torch.randn(n, n, device=dev, generator=g) * mask).half()
    X = torch.randn(64, n, device=dev, generator=g).half()
    A = st.SparseTensor.from_dense(W, mask=mask).convert(CSR, index_dtype=torch.int32)
    ref = (X.float() @ W.float().T).T
    rows = [{"impl": "dense linear", "us": graph_time(lambda: torch.nn.functional.linear(X, W)) * 1e6}]
    p0 = CudaSpmmPlan(A)
    p0.set_values(A.values)
    rows.append({"impl": f"plan default ({p0.fl_kind(64) if hasattr(p0, 'fl_kind') else '?'})",
                 "us": graph_time(lambda: p0.apply(X.mT)) * 1e6})
    for sp in a.splits.split(","):
        p = CudaSpmmPlan(A)
        p.set_values(A.values)
        p.mma_kernel = "bm"
        if sp != "auto":
            p.bm_split_override = int(sp)
        variant, s = p.bm_split(64)
        for flags in FLAGS:
            p.bm_flags = flags
            y = p.apply(X.mT)
            err = float((y.float() - ref).abs().max() / ref.abs().max()) if flags == 0 else None
            t = graph_time(lambda p=p: p.apply(X.mT)) * 1e6
            rows.append({"impl": f"bm {variant} S={s}", "split": sp, "flags": flags, "us": t, "max_rel_err": err})
            print(f"bm {variant} S={s} ({sp}) flags {flags:2d}: {t:6.2f} us" + (f" err {err:.1e}" if err is not None else ""),
                  flush=True)
    for r in rows[:2]:
        print(f"{r['impl']}: {r['us']:.2f} us")
    out = {"benchmark": "bm_probe (session 14)", "command": " ".join(["python", *sys.argv]),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "bm_probe_h200.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

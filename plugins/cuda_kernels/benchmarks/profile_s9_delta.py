"""Session 9, diagnosis of the DELTA(4) one-right-hand-side kernels (float16, 8192 x 8192, 50 % and 10 %).

    python plugins/cuda_kernels/benchmarks/profile_s9_delta.py --time --out DIR   # graph-timed kernel us -> DIR/cuda_delta_h200_s9_profile.json
    ncu --clock-control none -k regex:delta_ ... python .../profile_s9_delta.py --profile   # each kernel launched twice

Rows: the plan's "chunk" (default) and "tile" kernels, the chunk kernel with one block of 1024
threads per SM (``delta_c8_b4_smem_k1024``, launched directly: one copy of X per SM), and a
trivial kernel (``y.zero_()`` of 8192 values) timed the same way, the fixed cost of one launch in
a CUDA graph. Kernel time as in bench_s9_delta.py (20 calls in a CUDA graph, median of 10 replays).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import torch  # noqa: E402

import sparsetorch as st  # noqa: E402
from sparsetorch.format import DELTA  # noqa: E402

import bench_cuda_kernels as B  # noqa: E402


def main() -> int:
    from sparsetorch_cuda.launch import kernel
    from sparsetorch_cuda.plan import CudaSpmmPlan

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    size, dtype = 8192, torch.float16
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    g = torch.Generator(device="cuda").manual_seed(1)
    rows = []
    for density in (0.5, 0.1):
        mask = torch.rand(size, size, device="cuda", generator=g) < density
        W = (torch.randn(size, size, device="cuda", dtype=torch.float64, generator=g) * mask).to(dtype)
        x = torch.randn(size, 1, device="cuda", dtype=torch.float64, generator=g).to(dtype)
        ref = W.double() @ x.double()
        A = st.SparseTensor.from_dense(W, mask=mask).convert(DELTA(4), index_dtype=torch.int32)
        chunk = CudaSpmmPlan(A)
        chunk.set_values(A.values)
        tile = CudaSpmmPlan(A, variant="tile")
        tile.set_values(A.values)
        y = torch.empty(size, 1, device="cuda", dtype=dtype)
        k1024 = kernel("delta", "delta_c8_b4_smem_k1024", dtype, torch.int32, 0, 8)
        args = (size, size, chunk.nnz, chunk.rowptr.data_ptr(), chunk.words.data_ptr(), chunk._values.data_ptr(), x.data_ptr(), y.data_ptr())

        def big(args=args, y=y, k1024=k1024):
            k1024((min(sm, size // 32), 1), 1024, args, shared=(size + 32) * 4, device=0)
            return y

        z = torch.empty(size, device="cuda", dtype=dtype)
        fns = [("chunk (default)", lambda p=chunk: p.apply(x)), ("tile", lambda p=tile: p.apply(x)),
               ("chunk, one block of 1024 per SM", big), ("launch floor: y.zero_() of 8192 values", z.zero_)]
        for label, fn in fns:
            if a.profile:
                for _ in range(2):
                    fn()
                torch.cuda.synchronize()
            if a.time:
                err = None
                if not label.startswith("launch"):
                    err = float(torch.linalg.vector_norm(fn().double().reshape(ref.shape) - ref) / torch.linalg.vector_norm(ref))
                kt = B.graph_time(fn)
                rows.append({"density": density, "impl": label, "kernel_s": kt, "rel_err": err})
                print(f"{int(density * 100)}% {label:<40} kernel {kt * 1e6:6.1f} us  err {err}", flush=True)
        del A, chunk, tile, W, mask
        torch.cuda.empty_cache()
    if a.time and a.out:
        out = {"benchmark": "profile_s9_delta", "command": " ".join(["python", *sys.argv]),
               "date": datetime.now(timezone.utc).isoformat(), "machine": platform.node(), "gpu": torch.cuda.get_device_name(0),
               "versions": B.versions(), "kernel_time": "20 calls captured in a CUDA graph, replayed, median of 10 replays",
               "rows": rows}
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "cuda_delta_h200_s9_profile.json").write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

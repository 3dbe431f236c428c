"""Session 11 (s11d), Nsight Compute diagnosis of the DELTA(4) one-right-hand-side kernels (float16,
8192 x 8192 at 50 % and 10 %: bench_s10_delta's generator): each variant's product launched once (the
plan's first launch, without programmatic dependent launch), for

    ncu --clock-control none -k regex:'delta_(tc|tq|c8)' --metrics ... python .../profile_s11_delta.py [--variants tc8,chunk8,tq4p]

(run_s11_delta.sh with PROFILE=1 runs it and keeps the report as ncu_s11d_delta.txt)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import sparsetorch as st  # noqa: E402
from sparsetorch.format import DELTA  # noqa: E402


def main() -> int:
    from sparsetorch_cuda.plan import CudaSpmmPlan

    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="tc8,chunk8,tq4p,tq4p3")
    ap.add_argument("--densities", default="0.5,0.1")
    a = ap.parse_args()
    size, dtype = 8192, torch.float16
    g = torch.Generator(device="cuda").manual_seed(1)
    for density in (float(d) for d in a.densities.split(",")):
        mask = torch.rand(size, size, device="cuda", generator=g) < density
        W = (torch.randn(size, size, device="cuda", dtype=torch.float64, generator=g) * mask).to(dtype)
        x = torch.randn(size, 1, device="cuda", dtype=torch.float64, generator=g).to(dtype)
        A = st.SparseTensor.from_dense(W, mask=mask).convert(DELTA(4), index_dtype=torch.int32)
        for v in a.variants.split(","):
            p = CudaSpmmPlan(A, variant=v)
            p.set_values(A.values)
            p.apply(x)
            torch.cuda.synchronize()
            print(f"{int(density * 100)}% {v}: launched", flush=True)
        del A, W, mask
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

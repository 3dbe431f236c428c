"""Session 10: the DELTA(4) "tc" kernels (kernels/delta.cu: the chunk layout, X as 16-bit values in
shared memory, the products on the tensor cores) against the chunk kernel and dense cuBLAS GEMV, one run.

    python plugins/cuda_kernels/benchmarks/bench_s10_delta.py --out DIR [--size 8192] [--dtypes float16,bfloat16]

8192 x 8192 random patterns at 50 %, 10 % and 30 % density (the issue-16 shapes; the 50 % and 10 %
matrices are bench_s8_delta's / bench_s9_delta's: same generator, same order), one right-hand side;
kernel time = 20 calls captured in a CUDA graph, replayed, median of 10 replays
(bench_cuda_kernels.graph_time); every row of the JSON from this one run: dense ``W @ x`` (cuBLAS
GEMV), DELTA(4) with the plan's default ("tc"), "tc8", "tc16", "chunk" (session 9's default), CSR
int32 (the plan's default, csr16_warp for the half types). (results/cuda_delta_h200_s10_run1.json: commit
241fbf5 with "tc16" and "tc8_o3"; cuda_delta_h200_s10.json: 448ac0b with the since removed "warp2" /
"warp4" kernels; --variants names the rows.) Floor = the bytes the kernel must
read (bench_s9_delta._delta_bytes) / copy bandwidth of this run; relative errors against a float64
product of the same rounded inputs.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import bench_s9_delta as S9  # noqa: E402  (puts the repository's benchmarks on sys.path)
from bench_s9_delta import B, copy_bandwidth  # noqa: E402

#: DELTA(4) variants per density (None: the plan's default)
VARIANTS = [None, "tc8", "tc16", "chunk"]
#: densities in generation order (50 % and 10 % first: the session 8 / 9 matrices)
DENSITIES = (0.5, 0.1, 0.3)


def matrices(tab: B.Table, size: int, dtypes: list[torch.dtype], densities=DENSITIES):
    """Like bench_s8_delta.matrices (same seed and draw order, so its 50 % and 10 % matrices), for
    ``densities``: records the dense GEMV row, yields ``(case, density, dtype, vs, W, mask, x, ref, extra)``."""
    g = torch.Generator(device="cuda").manual_seed(1)
    for density in densities:
        mask = torch.rand(size, size, device="cuda", generator=g) < density
        W64 = torch.randn(size, size, device="cuda", dtype=torch.float64, generator=g) * mask
        for dtype in dtypes:
            name = str(dtype).replace("torch.", "")
            vs = torch.empty((), dtype=dtype).element_size()
            W = W64.to(dtype)
            x = torch.randn(size, 1, device="cuda", dtype=torch.float64, generator=g).to(dtype)
            ref = W.double() @ x.double()
            extra = {"dtype": name, "density": density, "k": 1}
            case = f"{size}^2 {int(density * 100)}% {name}"
            tab.record(case, "dense cuBLAS GEMV", lambda W=W, x=x: W @ x, lambda W=W, x=x: W @ x, ref,
                       size * size * vs + 2 * size * vs, **extra)
            yield case, density, dtype, vs, W, mask, x, ref, extra
        del W64, mask


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--variants", default=",".join(v or "default" for v in VARIANTS))
    ap.add_argument("--no-csr", action="store_true")
    ap.add_argument("--name", default="cuda_delta_h200_s10.json")
    a = ap.parse_args()
    S9.ROWS = [(4, None if v == "default" else v) for v in a.variants.split(",")]  # the rows bench_s9_delta.run times
    S9.ROWS_LOW = []
    S9.matrices = lambda tab, size, dtypes: matrices(tab, size, dtypes)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw['bytes_per_s'] / 1e12:.2f} TB/s", flush=True)
    tab = B.Table(bw["bytes_per_s"], a.reps)
    dtypes = [getattr(torch, d) for d in a.dtypes.split(",")]
    vers = B.versions()

    def save() -> None:
        out = {"benchmark": "bench_s10_delta", "command": " ".join(["python", *sys.argv]),
               "date": datetime.now(timezone.utc).isoformat(), "machine": platform.node(),
               "gpu": torch.cuda.get_device_name(0), "copy_bandwidth": bw, "versions": vers,
               "kernel_time": "20 calls captured in a CUDA graph, replayed, median of 10 replays", "rows": tab.rows}
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / a.name).write_text(json.dumps(out, indent=1, default=str))

    S9.run(tab, a.size, dtypes, not a.no_csr, save)
    save()
    gemv = {r["case"]: r.get("kernel_s") for r in tab.rows if r["impl"] == "dense cuBLAS GEMV"}
    for r in tab.rows:
        k = r.get("kernel_s")
        d = gemv.get(r["case"])
        sp = f"{d / k:5.2f}x" if k and d else "     "
        print(f"{r['case']:<22} {r['impl']:<34} kernel {k * 1e6 if k else float('nan'):7.1f} us {sp}  err {r.get('rel_err')}  "
              f"{r.get('error', '')}"[:200])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Session 11: the DELTA(4) "range" kernels (kernels/delta.cu ``delta_range*_b4``: the work split by
equal ranges of entries, tc's steps inside a range, rows cut by a range boundary combined in the plan's
float32 workspace) against the default ("tc") and dense cuBLAS GEMV, one run.

    python plugins/cuda_kernels/benchmarks/bench_s10_range.py --out DIR [--size 8192] [--dtypes float16,bfloat16]

The matrices, timing and floors of bench_s10_delta.py (imported: 8192 x 8192 at 50 %, 10 %, 30 %, the
same generator and order; 20 calls captured in a CUDA graph, replayed, median of 10 replays; relative
errors against a float64 product of the same rounded inputs); rows: dense ``W @ x`` (cuBLAS GEMV),
DELTA(4) with the plan's default ("tc"), "range" (two steps' loads in flight), "range1" (one),
"range3" (three); no CSR row unless --csr. JSON: DIR/cuda_delta_h200_s10_range.json (written after
every case, so a run cut short keeps what it measured).
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
import bench_s10_delta as S10  # noqa: E402
from bench_s9_delta import B, copy_bandwidth  # noqa: E402

#: DELTA(4) variants per density ("default": the plan's default)
VARIANTS = ("default", "range", "range1", "range3")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--densities", default=",".join(str(d) for d in S10.DENSITIES))
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--csr", action="store_true")
    ap.add_argument("--name", default="cuda_delta_h200_s10_range.json")
    a = ap.parse_args()
    densities = tuple(float(d) for d in a.densities.split(","))
    S9.ROWS = [(4, None if v == "default" else v) for v in a.variants.split(",")]  # the rows bench_s9_delta.run times
    S9.ROWS_LOW = []
    S9.matrices = lambda tab, size, dtypes: S10.matrices(tab, size, dtypes, densities)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw['bytes_per_s'] / 1e12:.2f} TB/s", flush=True)
    tab = B.Table(bw["bytes_per_s"], a.reps)
    dtypes = [getattr(torch, d) for d in a.dtypes.split(",")]
    vers = B.versions()

    def save() -> None:
        out = {"benchmark": "bench_s10_range", "command": " ".join(["python", *sys.argv]),
               "date": datetime.now(timezone.utc).isoformat(), "machine": platform.node(),
               "gpu": torch.cuda.get_device_name(0), "copy_bandwidth": bw, "versions": vers,
               "kernel_time": "20 calls captured in a CUDA graph, replayed, median of 10 replays", "rows": tab.rows}
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / a.name).write_text(json.dumps(out, indent=1, default=str))

    S9.run(tab, a.size, dtypes, a.csr, save)
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

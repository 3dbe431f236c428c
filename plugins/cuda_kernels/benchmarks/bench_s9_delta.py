"""Session 9: the DELTA(4) "tile" kernels (kernels/delta.cu: consecutive lanes on consecutive
entries, gaps re-packed per tile by the plan) and the "chunk" kernel with its row-boundary checks
in a row's last step only, against dense cuBLAS GEMV, one run.

    python plugins/cuda_kernels/benchmarks/bench_s9_delta.py --out DIR [--size 8192] [--dtypes float16,bfloat16]

8192 x 8192 random patterns at 50 % and 10 % density (the issue-16 shapes), one right-hand side;
kernel time = 20 calls captured in a CUDA graph, replayed, median of 10 replays
(bench_cuda_kernels.graph_time); every row of the JSON from this one run: dense ``W @ x`` (cuBLAS
GEMV), DELTA(4) with the plan's default, "chunk16", "tile", "tile_f", "tile_p1", DELTA(8) "chunk"
at 10 %, CSR int32 (the plan's default). Floor = bytes the kernel must read / copy bandwidth of
this run (the tile rows count their own gap words and tile offsets); relative errors against a
float64 product of the same rounded inputs.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import torch  # noqa: E402

import sparsetorch as st  # noqa: E402
from sparsetorch.format import CSR, DELTA  # noqa: E402

import bench_cuda_kernels as B  # noqa: E402
from bench_s8_delta import matrices  # noqa: E402
from common import copy_bandwidth  # noqa: E402

#: (bits, variant) rows of DELTA per density; None: the plan's default
ROWS = [(4, None), (4, "chunk16"), (4, "tile"), (4, "tile_f"), (4, "tile_p1")]
ROWS_LOW = [(8, None)]


def _delta_bytes(m: int, n: int, nse: int, vs: int, bits: int) -> float:
    return nse * vs + nse * bits / 8 + (m + 1) * 4 + (m + n) * vs


def run(tab: B.Table, size: int, dtypes: list[torch.dtype], csr: bool, save=lambda: None) -> None:
    from sparsetorch_cuda.plan import CudaSpmmPlan

    for case, density, _dtype, vs, W, mask, x, ref, extra in matrices(tab, size, dtypes):
        S = st.SparseTensor.from_dense(W, mask=mask)
        conv: dict = {}
        for bits, variant in ROWS + (ROWS_LOW if density < 0.3 else []):
            try:
                A = conv.get(bits)
                if A is None:
                    A = conv[bits] = S.convert(DELTA(bits), index_dtype=torch.int32)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                p = CudaSpmmPlan(A, variant=variant)
                torch.cuda.synchronize()
                plan_s = time.perf_counter() - t0
                p.set_values(A.values)
                nse = int(A.nse)
                label = f"DELTA({bits}) [{p.variant}{' default' if variant is None else ''}]"
                nb = _delta_bytes(size, size, nse, vs, bits)
                tiles = getattr(p, "tiles", None)
                if tiles is not None:  # the tile kernels read their own gap words and tile offsets
                    nt = int(tiles["tiles"])
                    nb = nse * vs + 32 * 4 * nt + 4 * (nt + 1) + 4 * (size + 1) + 2 * size * vs
                tab.record(case, label, lambda p=p: p.apply(x), lambda p=p: p.apply(x), ref, nb, stored=nse,
                           padding=nse - int(mask.sum()), plan_s=plan_s, tiles=None if tiles is None else int(tiles["tiles"]),
                           **extra)
                print(f"  {case} {label}: {tab.rows[-1].get('kernel_s')}", flush=True)
                del p
            except Exception as exc:  # noqa: BLE001 - a failing row is recorded, the run goes on
                tab.rows.append({"case": case, "impl": f"DELTA({bits}) [{variant}]", "error": repr(exc), **extra})
                print(f"  {case} DELTA({bits}) [{variant}]: {exc!r}", flush=True)
        conv.clear()
        if csr:
            try:
                A = S.convert(CSR, index_dtype=torch.int32)
                p = CudaSpmmPlan(A)
                p.set_values(A.values)
                tab.record(case, f"CSR int32 [{p.variant}]", lambda p=p: p.apply(x), lambda p=p: p.apply(x), ref,
                           B._csr_bytes(size, size, int(A.nse), vs, 4), **extra)
                del A, p
            except Exception as exc:  # noqa: BLE001
                tab.rows.append({"case": case, "impl": "CSR int32", "error": repr(exc), **extra})
        del S, W
        torch.cuda.empty_cache()
        save()  # after every case: a run cut short keeps what it measured


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--no-csr", action="store_true")
    ap.add_argument("--name", default="cuda_delta_h200_s9.json")
    a = ap.parse_args()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw['bytes_per_s'] / 1e12:.2f} TB/s", flush=True)
    tab = B.Table(bw["bytes_per_s"], a.reps)
    dtypes = [getattr(torch, d) for d in a.dtypes.split(",")]
    vers = B.versions()

    def save() -> None:
        out = {"benchmark": "bench_s9_delta", "command": " ".join(["python", *sys.argv]),
               "date": datetime.now(timezone.utc).isoformat(), "machine": platform.node(),
               "gpu": torch.cuda.get_device_name(0), "copy_bandwidth": bw, "versions": vers,
               "kernel_time": "20 calls captured in a CUDA graph, replayed, median of 10 replays", "rows": tab.rows}
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / a.name).write_text(json.dumps(out, indent=1, default=str))

    run(tab, a.size, dtypes, not a.no_csr, save)
    save()
    for r in tab.rows:
        k = r.get("kernel_s")
        print(f"{r['case']:<22} {r['impl']:<34} kernel {k * 1e6 if k else float('nan'):7.1f} us  err {r.get('rel_err')}  "
              f"{r.get('error', '')}"[:200])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

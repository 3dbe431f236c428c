"""Session 8: the DELTA(b) chunk kernels (kernels/delta.cu) against dense cuBLAS GEMV, one run.

    python plugins/cuda_kernels/benchmarks/bench_s8_delta.py --out DIR [--size 8192] [--dtypes float16,bfloat16] [--diagnose]

8192 x 8192 random patterns at 50 % and 10 % density, one right-hand side; kernel time = 20 calls
captured in a CUDA graph, replayed, median of 10 replays (bench_cuda_kernels.graph_time), every
row of the JSON from this one run: dense ``W @ x`` (cuBLAS GEMV), DELTA(4) with the plan's default
("chunk"), "chunk16", "chunk8_o3", the earlier "packed" kernel, DELTA(8) at 10 %, CSR int32.
``--diagnose`` adds what runs 1-2 measured and dropped: "chunk8", the L2-prefetch variants, and
direct launches of the chunk kernels with conflict-free gathers (``_nc``: wrong results, no error
column; what the shared-memory bank conflicts cost), X from global memory, other grids. Floor =
bytes / copy bandwidth of this run; relative errors against a float64 product of the same
rounded inputs.
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
from sparsetorch.format import CSR, DELTA  # noqa: E402

import bench_cuda_kernels as B  # noqa: E402
from common import copy_bandwidth  # noqa: E402


#: --diagnose: also the variants measured and dropped in runs 1-2 (conflict-free gathers, X from global memory, grids, L2 prefetch)
DIAGNOSE = False


def _delta_bytes(m: int, n: int, nse: int, vs: int, bits: int) -> float:
    return nse * vs + nse * bits / 8 + (m + 1) * 4 + (m + n) * vs


def matrices(tab: B.Table, size: int, dtypes: list[torch.dtype]):
    """MACKO's set-up: (size x size) at 50 % and 10 % density (a uniform random mask, seed 1), one
    right-hand side, each dtype; records the dense cuBLAS GEMV row and yields
    ``(case, density, dtype, vs, W, mask, x, ref, extra)`` (also used by bench_s9_delta.py)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    for density in (0.5, 0.1):
        mask = torch.rand(size, size, device="cuda", generator=g) < density
        W64 = torch.randn(size, size, device="cuda", dtype=torch.float64, generator=g) * mask
        for dtype in dtypes:
            name = str(dtype).replace("torch.", "")
            vs = torch.empty((), dtype=dtype).element_size()
            W = W64.to(dtype)
            case = f"{size}^2 {int(density * 100)}% {name}"
            x = torch.randn(size, 1, device="cuda", dtype=torch.float64, generator=g).to(dtype)
            ref = W.double() @ x.double()
            extra = {"dtype": name, "density": density, "k": 1}
            tab.record(case, "dense cuBLAS GEMV", lambda W=W, x=x: W @ x, lambda W=W, x=x: W @ x, ref,
                       size * size * vs + 2 * size * vs, **extra)
            yield case, density, dtype, vs, W, mask, x, ref, extra


def run(tab: B.Table, size: int, dtypes: list[torch.dtype]) -> None:
    from sparsetorch_cuda.launch import kernel
    from sparsetorch_cuda.plan import CudaSpmmPlan

    for case, density, dtype, vs, W, mask, x, ref, extra in matrices(tab, size, dtypes):
        S = st.SparseTensor.from_dense(W, mask=mask)
        fmts = [(4, None), (4, "chunk16"), (4, "chunk8_o3"), (4, "packed")]
        if DIAGNOSE:
            fmts += [(4, "chunk8"), (4, "chunk16_pf"), (4, "chunk8_pf")]
        if density < 0.3:
            fmts += [(8, None), (8, "chunk16"), (8, "packed")]
        conv: dict = {}
        for bits, variant in fmts:
            A = conv.get(bits)
            if A is None:
                A = conv[bits] = S.convert(DELTA(bits), index_dtype=torch.int32)
            p = CudaSpmmPlan(A, variant=variant)
            p.set_values(A.values)
            nse = int(A.nse)
            label = f"DELTA({bits}) [{p.variant}{' default' if variant is None else ''}]"
            nb = _delta_bytes(size, size, nse, vs, bits)
            tab.record(case, label, lambda p=p: p.apply(x), lambda p=p: p.apply(x), ref, nb, stored=nse,
                       padding=nse - int(mask.sum()), **extra)
            if DIAGNOSE and bits == 4 and variant in ("chunk16", "chunk8"):
                unit = 16 if variant == "chunk16" else 8
                sm = torch.cuda.get_device_properties(0).multi_processor_count
                y = torch.empty(size, 1, device="cuda", dtype=dtype)
                args = (size, size, p.nnz, p.rowptr.data_ptr(), p.words.data_ptr(), p._values.data_ptr(), x.data_ptr(),
                        y.data_ptr())
                # (label, kernel, grid, shared bytes, correct results)
                direct = [(f"{variant}, conflict-free gathers: wrong results, diagnosis", f"delta_c{unit}_b4_smem_nc",
                           min(size // 16, 2 * sm), (size + 32) * 4, False),
                          (f"{variant}, X from global memory, grid 2/SM", f"delta_c{unit}_b4", min(size // 16, 2 * sm), 0, True),
                          (f"{variant}, X from global memory, a warp per row", f"delta_c{unit}_b4", size // 16, 0, True),
                          (f"{variant}, a warp per row (grid m / 16)", f"delta_c{unit}_b4_smem", size // 16, (size + 32) * 4, True)]
                for what, kname, grid, shared, ok in direct:
                    kern = kernel("delta", kname, dtype, torch.int32, 0, 8)

                    def call(kern=kern, grid=grid, shared=shared, args=args, y=y):
                        kern((grid, 1), 512, args, shared=shared, device=0)
                        return y

                    tab.record(case, f"DELTA(4) [{what}]", call, call if ok else None, ref if ok else None, nb, **extra)
            del A, p
        conv.clear()
        A = S.convert(CSR, index_dtype=torch.int32)
        p = CudaSpmmPlan(A)
        p.set_values(A.values)
        tab.record(case, f"CSR int32 [{p.variant}]", lambda p=p: p.apply(x), lambda p=p: p.apply(x), ref,
                   B._csr_bytes(size, size, int(A.nse), vs, 4), **extra)
        del A, p, S, W
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--diagnose", action="store_true")
    a = ap.parse_args()
    global DIAGNOSE
    DIAGNOSE = a.diagnose
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw['bytes_per_s'] / 1e12:.2f} TB/s", flush=True)
    tab = B.Table(bw["bytes_per_s"], a.reps)
    dtypes = [getattr(torch, d) for d in a.dtypes.split(",")]
    run(tab, a.size, dtypes)
    out = {"benchmark": "bench_s8_delta", "command": " ".join(["python", *sys.argv]),
           "date": datetime.now(timezone.utc).isoformat(), "machine": platform.node(),
           "gpu": torch.cuda.get_device_name(0), "copy_bandwidth": bw, "versions": B.versions(),
           "kernel_time": "20 calls captured in a CUDA graph, replayed, median of 10 replays", "rows": tab.rows}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "cuda_delta_h200_s8_delta.json").write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Session 12: what does a launch cost by itself, with thread-block clusters and large dynamic shared
memory? (spmm_cc's empty skeleton, no loads and no products, took 19.8 us a call at k = 64 and its k = 1
build 13.3 us, with 15 clusters of 8 blocks of 512 threads and 128 KB of shared memory each.)

    python plugins/cuda_kernels/benchmarks/diag_s12_cluster.py --out DIR

Kernels (CuPy RawKernel, compiled here): ``k_c<C>`` with ``__cluster_dims__(C)`` (C = 1: none), 512
threads; each block writes one word (so no launch is optimised away); "sync" builds also run 1 / 3
cluster barriers (barrier.cluster.arrive / wait, as spmm_cc's rounds do). Per (C, dynamic shared memory,
blocks, barriers): 20 launches captured in one CUDA graph (CuPy stream capture), median of 15 replays,
per launch. The SM clock is not touched.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import cupy as cp

SRC = r"""
__device__ __forceinline__ void csync() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;" ::: "memory");
#else
  __syncthreads();
#endif
}
#define K(C, ATTR) \
extern "C" __global__ void ATTR __launch_bounds__(512, 1) k_c##C(int* out, int syncs, int touch) { \
  extern __shared__ int sm[]; \
  if (touch) { sm[threadIdx.x] = threadIdx.x; __syncthreads(); } \
  for (int s = 0; s < syncs; ++s) csync(); \
  if (threadIdx.x == 0) out[blockIdx.x] = (touch ? sm[5] : 0) + blockIdx.x; \
}
K(1, )
K(2, __cluster_dims__(2, 1, 1))
K(4, __cluster_dims__(4, 1, 1))
K(8, __cluster_dims__(8, 1, 1))
"""

CALLS = 20


def graph_time(launch, repeats: int = 15) -> float:
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        for _ in range(3):
            launch()
        s.synchronize()
        s.begin_capture()
        for _ in range(CALLS):
            launch()
        g = s.end_capture()
        g.launch(s)
        s.synchronize()
        ts = []
        for _ in range(repeats + 2):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(s)
            g.launch(s)
            b.record(s)
            b.synchronize()
            ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / CALLS)
    return statistics.median(ts[2:])


def cc_rounds() -> list[dict]:
    """spmm_cc (dense B, clusters of 8) on the 4096^2 10 % fp16 layer with fewer clusters than resident
    (more rounds per cluster): per-round cost, full kernel and empty skeleton (flags 15), k = 1 and 64."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import sparsetorch as st
    from bench_s5 import graph_time as tgraph
    from sparsetorch.format import CSR
    from sparsetorch_cuda import _spmm_cc

    torch.manual_seed(4096)
    W = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    thr = W.abs().float().flatten().kthvalue(int(0.9 * W.numel())).values
    W = (W * (W.abs() > thr)).contiguous()
    A = st.SparseTensor.from_dense(W, mask=W != 0).convert(CSR, index_dtype=torch.int32)
    op = _spmm_cc.CcSpmm(A.pos(1), A.crd(1), A.values, (4096, 4096), clusters=8, fmt="dense")
    rows = []
    for k in (1, 64):
        x = torch.randn(k, 4096, device="cuda", dtype=torch.float16)
        out = torch.empty(k, 4096, device="cuda", dtype=torch.float16)
        for ncl in (0, 8, 4, 2):
            for flags in ((0, 15) if k == 64 else (0,)):
                op.ncl, op.flags = ncl or None, flags
                t = tgraph(lambda: op(x, None, out=out), 15)
                used = op._launch_args(k)[4]
                rows.append({"case": "spmm_cc dense c8", "k": k, "ncl": used, "flags": flags, "us": round(t * 1e6, 3)})
                print(f"spmm_cc c8 k={k} ncl={used} flags={flags}: {t * 1e6:.2f} us", flush=True)
    op.ncl, op.flags = None, 0
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    mod = cp.RawModule(code=SRC, options=("-std=c++17",))
    out = cp.zeros(4096, dtype=cp.int32)
    rows = []
    for C in (1, 2, 4, 8):
        fn = mod.get_function(f"k_c{C}")
        fn.max_dynamic_shared_size_bytes = 200 * 1024
        for smem_kb in (0, 64, 128, 200):
            for blocks in (128, 120 if C == 8 else 132):
                if blocks % C:
                    continue
                for syncs in ((0, 1, 3) if C > 1 else (0,)):
                    def launch(fn=fn, blocks=blocks, smem=smem_kb * 1024, syncs=syncs):
                        fn((blocks,), (512,), (out, cp.int32(syncs), cp.int32(1 if smem else 0)), shared_mem=smem)
                    try:
                        t = graph_time(launch)
                        res = round(t, 3)
                    except Exception as exc:  # noqa: BLE001 - recorded
                        res = f"failed: {type(exc).__name__}: {str(exc)[:100]}"
                    rows.append({"C": C, "smem_kb": smem_kb, "blocks": blocks, "syncs": syncs, "us": res})
                    print(f"C={C} smem={smem_kb:3d} KB blocks={blocks} syncs={syncs}: {res} us per launch", flush=True)
    rows += cc_rounds()
    doc = {"benchmark": "diag_s12_cluster", "command": " ".join(["python", *sys.argv]),
           "date": datetime.now(timezone.utc).isoformat(), "machine": platform.node(),
           "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "cupy": cp.__version__,
           "method": __doc__.split("\n\n")[2].strip(), "rows": rows}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "diag_s12_cluster.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

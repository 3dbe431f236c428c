"""Session 14: are the short kernels timed at a low SM clock? The same CUDA graph of 20 calls timed two
ways: "idle" (graph_time's way: replays separated by host syncs, the GPU idle in between) and "hot" (each
replay queued right behind ~20 ms of dense matmuls, so the SM clock is at its boost when the replay runs;
the events bracket the replay alone). Also the SM clock nvidia-smi reads while the heater runs and idle.
Cases: DELTA(4) 8192^2 fp16 at 1 % / 10 % / 50 % (default plan), dense GEMV 8192^2, SparseLinear-style
CSR 4096^2 90 % fp16 batch 64 (CudaSpmmPlan default) against dense linear.

    python benchmarks/gpu/s14/clock_probe.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/

import sparsetorch as st  # noqa: E402
from bench_cuda_kernels import GRAPH_CALLS as CALLS, graph_time  # noqa: E402
from sparsetorch.format import CSR, DELTA  # noqa: E402


def smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,clocks.max.sm", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        return repr(exc)


def main() -> int:
    from sparsetorch_cuda.plan import CudaSpmmPlan

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    H = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)

    def heat(n: int = 12) -> None:
        for _ in range(n):
            torch.mm(H, H)

    def time_graph(fn, hot: bool) -> float:
        return graph_time(fn, a.reps, before=heat if hot else None)

    rows = []
    clocks = {"idle": smi()}
    heat(200)
    clocks["during_heat"] = smi()
    torch.cuda.synchronize()
    clocks["after_sync"] = smi()
    gen = torch.Generator(device="cuda").manual_seed(1)
    cases = []
    for dens in (0.01, 0.1, 0.5):
        mask = torch.rand(8192, 8192, device="cuda", generator=gen) < dens
        W = (torch.randn(8192, 8192, device="cuda", generator=gen) * mask).half()
        x = torch.randn(8192, 1, device="cuda", generator=gen).half()
        A = st.SparseTensor.from_dense(W, mask=mask).convert(DELTA(4), index_dtype=torch.int32)
        p = CudaSpmmPlan(A)
        p.set_values(A.values)
        p.apply(x)
        cases.append((f"DELTA(4) 8192^2 {dens:.0%} fp16 [{p.variant}]", lambda p=p, x=x: p.apply(x)))
        if dens == 0.5:
            cases.append(("dense GEMV 8192^2 fp16", lambda W=W, x=x: W @ x))
    mask = torch.rand(4096, 4096, device="cuda", generator=gen) < 0.1
    W = (torch.randn(4096, 4096, device="cuda", generator=gen) * mask).half()
    X = torch.randn(64, 4096, device="cuda", generator=gen).half()
    A = st.SparseTensor.from_dense(W, mask=mask).convert(CSR, index_dtype=torch.int32)
    p = CudaSpmmPlan(A)
    p.set_values(A.values)
    p.apply(X.mT)  # X^T read where it lies (a linear layer's input)
    cases.append(("CSR 4096^2 10% fp16 k=64 (plan default)", lambda p=p: p.apply(X.mT)))
    cases.append(("dense linear 4096^2 fp16 batch 64", lambda W=W, X=X: torch.nn.functional.linear(X, W)))
    for name, fn in cases:
        idle = time_graph(fn, False)
        hot = time_graph(fn, True)
        rows.append({"case": name, "idle_us": idle * 1e6, "hot_us": hot * 1e6})
        print(f"{name:<45} idle {idle * 1e6:7.2f} us  hot {hot * 1e6:7.2f} us  ({idle / hot:.2f}x)", flush=True)
    out = {"benchmark": "clock_probe (session 14)", "command": " ".join(["python", *sys.argv]), "gpu": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "calls_per_graph": CALLS, "clocks_sm_mem_maxsm": clocks, "rows": rows}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "clock_probe_h200_s14.json").write_text(json.dumps(out, indent=1))
    print(clocks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

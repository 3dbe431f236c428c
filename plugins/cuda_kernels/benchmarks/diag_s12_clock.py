"""Session 12: is the SM clock low while our short benchmarks run? (session 11's lead: nvidia-smi read
345 MHz idle at each call's start; latency-bound kernels would lose to memory-bound cuBLAS if short
graphs never boost the clock.) Reads nothing from nvidia-smi: a spin kernel (CuPy RawKernel) counts SM
cycles (clock64) against the global nanosecond timer (%globaltimer) for ``--spin-us`` and reports MHz.

    python plugins/cuda_kernels/benchmarks/diag_s12_clock.py --out DIR

Per kernel (dense F.linear and the plan's auto kernel at 4096^2 10 % fp16 k = 64; spmm_cc "dense" with 8
blocks per cluster and its empty skeleton, flags 15; DELTA(4) at 8192^2 10 % / 50 % fp16 k = 1 and GEMV):
"cold" = bench_s5.graph_time as every earlier session timed (20 calls in one graph, 15 synchronized
replays), with the clock read right before and right after; "hot" = the same graph replayed back to
back for ``--hot-ms`` first, then 15 replays timed by events with no host synchronisation between them,
the clock read right after (same stream, no gap). Changes no clock setting (METHOD.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import cupy as cp
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import sparsetorch as st  # noqa: E402
from sparsetorch.format import CSR, DELTA  # noqa: E402

from bench_s5 import CALLS, capture, graph_time  # noqa: E402

_SPIN = cp.RawKernel(r"""
extern "C" __global__ void spin(unsigned long long ns, unsigned long long* out) {
  unsigned long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  long long c0 = clock64();
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1)); } while (t1 - t0 < ns);
  long long c1 = clock64();
  if (threadIdx.x == 0 && blockIdx.x == 0) { out[0] = t1 - t0; out[1] = (unsigned long long)(c1 - c0); }
}
""", "spin")
_BUF = None


def spin_launch(us: float) -> cp.ndarray:
    """Queue the spin kernel on torch's current stream; returns its (ns, cycles) buffer (read after a sync)."""
    buf = cp.zeros(2, dtype=cp.uint64)
    stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    with stream:
        _SPIN((1,), (32,), (cp.uint64(int(us * 1000)), buf))
    return buf


def mhz(buf: cp.ndarray) -> float:
    ns, cyc = (int(v) for v in buf.get())
    return round(cyc / ns * 1e3, 1) if ns else float("nan")


def cold(fn, spin_us: float) -> dict:
    torch.cuda.synchronize()
    before = spin_launch(spin_us)
    t = graph_time(fn, 15)
    after = spin_launch(spin_us)
    torch.cuda.synchronize()
    return {"us": round(t * 1e6, 3) if isinstance(t, float) else t, "mhz_before": mhz(before), "mhz_after": mhz(after)}


def hot(fn, hot_ms: float, spin_us: float) -> dict:
    g = capture(fn)
    # how many replays fill hot_ms: time one
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    g.replay()
    b.record()
    b.synchronize()
    one_ms = max(a.elapsed_time(b), 1e-3)
    warm = spin_launch(spin_us)
    for _ in range(int(hot_ms / one_ms) + 1):
        g.replay()
    evs = [torch.cuda.Event(enable_timing=True) for _ in range(16)]
    evs[0].record()
    for i in range(15):
        g.replay()
        evs[i + 1].record()
    after = spin_launch(spin_us)
    torch.cuda.synchronize()
    ts = [evs[i].elapsed_time(evs[i + 1]) * 1e3 / CALLS for i in range(15)]
    return {"us": round(statistics.median(ts), 3), "us_min": round(min(ts), 3), "mhz_at_start": mhz(warm),
            "mhz_after": mhz(after)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--hot-ms", type=float, default=300.0)
    ap.add_argument("--spin-us", type=float, default=200.0)
    ap.add_argument("--skip-delta", action="store_true")
    a = ap.parse_args()
    from sparsetorch_cuda import _spmm_cc
    from sparsetorch_cuda.plan import CudaSpmmPlan

    rows: list[dict] = []
    idle = spin_launch(a.spin_us)
    torch.cuda.synchronize()
    print(f"idle clock {mhz(idle)} MHz", flush=True)
    time.sleep(0.5)
    idle2 = spin_launch(a.spin_us)
    torch.cuda.synchronize()
    print(f"after 0.5 s idle {mhz(idle2)} MHz", flush=True)

    def run(name: str, fn) -> None:
        c = cold(fn, a.spin_us)
        h = hot(fn, a.hot_ms, a.spin_us)
        c2 = cold(fn, a.spin_us)
        rows.append({"case": name, "cold": c, "hot": h, "cold_again": c2})
        print(f"{name:42s} cold {c['us']} us ({c['mhz_before']}->{c['mhz_after']} MHz)  hot {h['us']} "
              f"(min {h['us_min']}; {h['mhz_at_start']}->{h['mhz_after']} MHz)  cold again {c2['us']} "
              f"({c2['mhz_before']}->{c2['mhz_after']})", flush=True)

    torch.manual_seed(4096)
    dt = torch.float16
    lin = torch.nn.Linear(4096, 4096, device="cuda", dtype=dt)
    W = lin.weight.detach().clone()
    thr = W.abs().float().flatten().kthvalue(int(0.9 * W.numel())).values
    W = (W * (W.abs() > thr)).contiguous()
    bias = lin.bias.detach().contiguous()
    A = st.SparseTensor.from_dense(W, mask=W != 0).convert(CSR, index_dtype=torch.int32)
    plan = CudaSpmmPlan(A)
    plan.set_values(A.values)
    x = torch.randn(64, 4096, device="cuda", dtype=dt)
    run("4096^2 10% k=64 dense F.linear", lambda: torch.nn.functional.linear(x, W, bias))
    run("4096^2 10% k=64 plan auto", lambda plan=plan: plan.apply(x.mT, bias=bias))
    op = _spmm_cc.CcSpmm(A.pos(1), A.crd(1), A.values, (4096, 4096), clusters=8, fmt="dense")
    out = torch.empty(64, 4096, device="cuda", dtype=dt)
    run("4096^2 10% k=64 spmm_cc dense c8", lambda op=op: op(x, bias, out=out))
    op.flags = 15
    run("4096^2 10% k=64 spmm_cc skeleton (flags 15)", lambda op=op: op(x, bias, out=out))
    op.flags = 0
    del op, plan
    if not a.skip_delta:
        g = torch.Generator(device="cuda").manual_seed(1)
        for density in (0.1, 0.5):
            mask = torch.rand(8192, 8192, device="cuda", generator=g) < density
            W8 = (torch.randn(8192, 8192, device="cuda", generator=g) * mask).to(dt)
            x1 = torch.randn(8192, 1, device="cuda", dtype=dt)
            run(f"8192^2 {int(density * 100)}% GEMV", lambda W8=W8, x1=x1: W8 @ x1)
            D = st.SparseTensor.from_dense(W8, mask=mask).convert(DELTA(4), index_dtype=torch.int32)
            p = CudaSpmmPlan(D)
            p.set_values(D.values)
            run(f"8192^2 {int(density * 100)}% DELTA(4) [{p.variant}]", lambda p=p, x1=x1: p.apply(x1))
            del D, p, W8, mask
    res = {"benchmark": "diag_s12_clock", "command": " ".join(["python", *sys.argv]),
           "date": datetime.now(timezone.utc).isoformat(), "machine": platform.node(),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "idle_mhz": [mhz(idle), mhz(idle2)],
           "method": __doc__.split("\n\n")[2].strip(), "rows": rows}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "diag_s12_clock.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

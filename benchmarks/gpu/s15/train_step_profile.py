"""Session 15: where a training step (forward + backward) of a pruned SparseLinear spends its GPU time.

For 4096 x 4096 (and 4096 -> 11008) half-precision layers pruned to 90 % (CSR) and 2:4 (NM(2, 4)), at batch 1 and 64:
the step's time (CUDA events, median; host included, as bench_llm_gpu's forward_backward_eager_s) with the cuda
plugin's dense backward route (values-gradient and adjoint product) on and off (sparsetorch_cuda.plan.DENSE_ROUTE), beside the dense layer's step,
the values-gradient checked against the dense twin's masked weight gradient, and torch.profiler's table of the
step's kernels (CUDA time per call). Writes train_step_profile.json under --out.

    python benchmarks/gpu/s15/train_step_profile.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/

import sparsetorch as st  # noqa: E402
from bench_llm import RULES  # noqa: E402
from bench_llm_gpu import _events  # noqa: E402


def _time(fn, repeats: int = 15) -> float:
    """Microseconds per call (bench_llm_gpu's CUDA-event median, host included)."""
    return _events(fn, repeats) * 1e6


def _kernels(fn, top: int = 12) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        dev = getattr(e, "self_device_time_total", None)
        if dev is None:
            dev = getattr(e, "self_cuda_time_total", 0)
        if dev and e.count:
            rows.append({"name": e.key[:90], "calls": e.count, "device_us": round(dev, 1)})
    rows.sort(key=lambda r: -r["device_us"])
    return rows[:top]


def _host(fn, calls: int = 30, top: int = 25) -> list[dict]:
    """The Python functions of ``calls`` steps by own time (cProfile; its overhead inflates every entry)."""
    import cProfile  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    fn()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    pr.disable()
    st_ = pstats.Stats(pr)
    rows = [{"func": f"{Path(k[0]).name}:{k[1]}:{k[2]}", "calls_per_step": v[1] / calls, "own_us": v[2] / calls * 1e6,
             "cum_us": v[3] / calls * 1e6} for k, v in st_.stats.items()]  # type: ignore[attr-defined]
    rows.sort(key=lambda r: -r["own_us"])
    return rows[:top]


def main() -> int:
    from sparsetorch_cuda import plan as cplan

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="4096x4096,4096x11008")
    a = ap.parse_args()
    dev = torch.device("cuda")
    out = []
    for shape in a.shapes.split(","):
        n_in, n_out = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        base = nn.Linear(n_in, n_out).to(dev, torch.float16)
        for rule in ("90 %", "2:4"):
            layer = st.nn.SparseLinear(RULES[rule]()("layer", base), base.bias.detach())
            W = layer.to_dense().detach()
            mask = W != 0
            for batch in (1, 64):
                x = torch.randn(batch, n_in, device=dev, dtype=torch.float16)
                xx = x.clone().requires_grad_(True)
                Wg = W.clone().requires_grad_(True)
                bg = layer.bias.detach().clone().requires_grad_(True)
                gy = torch.randn(batch, n_out, device=dev, dtype=torch.float16)

                def dense_step():
                    Wg.grad = bg.grad = xx.grad = None
                    torch.nn.functional.linear(xx, Wg, bg).backward(gy)

                def ours_step(lay=layer):
                    lay.zero_grad(set_to_none=True)
                    xx.grad = None
                    lay(xx).backward(gy)

                row = {"shape": shape, "rule": rule, "batch": batch, "dense_step_us": _time(dense_step)}
                dense_step()
                ref_dw, ref_dx = (Wg.grad * mask).float(), xx.grad.float()
                for on in (False, True):
                    cplan.DENSE_ROUTE = on
                    tag = "dense_route" if on else "kernels"
                    row[f"ours_step_us_{tag}"] = _time(ours_step)
                    ours_step()
                    dw = layer.weight.with_values(layer.values.grad).to_dense().float()
                    row[f"dw_err_{tag}"] = float((dw - ref_dw).abs().max() / ref_dw.abs().max())
                    row[f"dx_err_{tag}"] = float((xx.grad.float() - ref_dx).abs().max() / ref_dx.abs().max())
                    row[f"kernels_{tag}"] = _kernels(ours_step)
                cplan.DENSE_ROUTE = True
                row["host_profile"] = _host(ours_step)
                row["plans"] = layer.plans()
                out.append(row)
                print(shape, rule, batch, "dense %.1f us, ours kernels %.1f / dense route %.1f us, dW err %.1e / %.1e, dX err %.1e"
                      % (row["dense_step_us"], row["ours_step_us_kernels"], row["ours_step_us_dense_route"],
                         row["dw_err_kernels"], row["dw_err_dense_route"], row["dx_err_dense_route"]), flush=True)
                for k in row["kernels_dense_route"][:6]:
                    print("    ", k, flush=True)
            del layer
    doc = {"benchmark": "train_step_profile (session 15)", "command": " ".join(["python", *sys.argv]),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": out}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "train_step_profile.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Suite case ``loop_1m``: a training loop of one-shot ``st.solve`` calls on one pattern.

2-D Poisson 1000² (1M unknowns, SPD, float64); every step passes new values (A scaled by
1 + step/100) and solves once, with a sync after each step. Rows:

- ``auto``: nothing said; dispatch counts the calls on the pattern and spreads one-time setups
  (cuDSS's analysis) over as many calls as it has seen (docs/dispatch.md);
- ``auto, repeat=steps``: the loop length given up front;
- ``torch/cg`` and ``cudss/cholesky`` pinned, for scale.

Each row records the backend/method of every step, the seconds of every step and the total.
Needs the cudss plugin and libcudss for the cuDSS rows; without them the case says so.
"""

from __future__ import annotations

import time
from typing import Any

import torch

import sparsetorch as st
from sparsetorch.format import CSR

from common import guard, poisson2d_csr


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _loop(A: st.SparseTensor, b: torch.Tensor, steps: int, **kw: Any) -> dict:
    st.plan_cache().clear()
    from sparsetorch.dispatch.select import clear_decisions
    from sparsetorch.dispatch import plan as dispatch_plan

    clear_decisions()
    dispatch_plan._CALLS.clear()  # a fresh loop: no calls seen on this pattern yet
    used, secs = [], []
    total0 = time.perf_counter()
    for k in range(steps):
        Ak = A.with_values(A.values * (1.0 + k / 100))
        _sync(b.device)
        t0 = time.perf_counter()
        x, info = st.solve(Ak, b, return_info=True, properties="spd", **kw)
        _sync(b.device)
        secs.append(time.perf_counter() - t0)
        used.append(f"{info.backend}/{info.method}")
    total = time.perf_counter() - total0
    rel = float(torch.linalg.vector_norm(b - Ak @ x) / torch.linalg.vector_norm(b))
    switches = [k for k in range(1, steps) if used[k] != used[k - 1]]
    return {"total_s": total, "step_s": secs, "used": used, "switch_steps": switches, "last_residual": rel}


def run_loop_1m(ctx: dict, *, m: int = 1000, steps: int = 40, device: str = "cuda") -> dict:
    from sparsetorch.dispatch import get_backends

    n = m * m
    crow, col, vals = poisson2d_csr(m, device=device)
    A = st.SparseTensor(CSR, (n, n), [None, crow], [None, col], vals, check=False)
    b = torch.randn(n, dtype=torch.float64, device=device, generator=torch.Generator(device).manual_seed(0))
    have_cudss = "cudss" in get_backends().names
    why = None
    if not have_cudss:
        try:
            from sparsetorch_cudss import _lib, plugin

            _lib.load()
            get_backends().register(plugin, "cudss")
            have_cudss = True
        except Exception as exc:  # noqa: BLE001 - recorded
            why = f"{type(exc).__name__}: {exc}"
    out: dict[str, Any] = {"problem": {"grid": f"{m}^2", "unknowns": n, "nnz": int(col.numel()), "steps": steps,
                                       "dtype": "float64", "cudss": have_cudss or why}, "rows": []}
    rows = {"auto": {}, f"auto, repeat={steps}": {"repeat": steps}, "torch/cg pinned": {"backend": "torch", "method": "cg"}}
    if have_cudss:
        rows["cudss/cholesky pinned"] = {"backend": "cudss", "method": "cholesky"}
    for label, kw in rows.items():
        row = {"impl": label, **guard(lambda kw=kw: _loop(A, b, steps, **kw))}
        out["rows"].append(row)
        if "total_s" in row:
            print(f"loop_1m {label:28s} total {row['total_s']:.2f} s, switches at {row['switch_steps']}, "
                  f"first {row['used'][0]}, last {row['used'][-1]}", flush=True)
        else:
            print(f"loop_1m {label:28s} {row.get('error')}", flush=True)
    st.plan_cache().clear()
    return out

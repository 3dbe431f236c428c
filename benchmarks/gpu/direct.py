"""Suite case ``direct_1m``: the training-loop step with a sparse direct solver on the GPU.

2-D Poisson 1000² (1M unknowns, SPD, float64): sparsetorch's cudss backend (Cholesky; first
call, new values + solve, backward, the whole step) against nvmath-python's DirectSolver on the
same cuDSS (factorize + solve after writing the values in place) and torch-sla 0.4.0 (its cuDSS
path; recorded with its error if it fails), and, for scale, sparsetorch's auto choice for one
solve + backward. The measuring code is the cudss plugin's benchmark
(``plugins/cudss_backend/benchmarks/bench_cudss.py``), imported, not repeated. Needs libcudss
(the nvidia-cudss wheel; ``SPARSETORCH_CUDSS_LIBRARY`` picks one); without it the case records
why and the suite goes on.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]


def _bench_module():
    path = str(ROOT / "plugins" / "cudss_backend" / "benchmarks")
    if path not in sys.path:
        sys.path.insert(0, path)
    import bench_cudss  # noqa: PLC0415

    return bench_cudss


def run_direct_1m(ctx: dict, *, m: int = 1000, repeats: int = 5) -> dict:
    import sparsetorch as st  # noqa: PLC0415
    from sparsetorch.dispatch import get_backends  # noqa: PLC0415

    try:
        from sparsetorch_cudss import _lib, plugin  # noqa: PLC0415

        lib = _lib.load()
    except Exception as exc:  # noqa: BLE001 - no plugin or no libcudss: recorded
        return {"skipped": f"cudss backend unavailable: {type(exc).__name__}: {exc}"}
    if "cudss" not in get_backends().names:
        get_backends().register(plugin, "cudss")
    bc = _bench_module()
    A = bc.poisson((m, m), "cuda")
    n = A.shape[-1]
    b = torch.randn(n, dtype=torch.float64, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    out: dict[str, Any] = {"problem": {"grid": f"{m}^2", "unknowns": n, "nnz": int(A.nse), "dtype": "float64",
                                       "cudss": ".".join(map(str, lib.version)), "repeats": repeats}, "rows": []}
    ours = bc.ours(A, b, repeats, "cholesky", {})
    out["rows"].append({"impl": "sparsetorch cudss/cholesky", **ours})
    st.plan_cache().clear()
    out["rows"].append({"impl": "nvmath DirectSolver", **bc.nvmath_direct(A, b, repeats)})
    out["rows"].append({"impl": "torch-sla 0.4.0", **bc.torch_sla(A, b, time.perf_counter() + 60)})
    # sparsetorch's own choice for one solve + backward (no plan alive: the first call's costs decide)
    v = A.values.detach().clone().requires_grad_(True)
    bb = b.clone().requires_grad_(True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    x, info = st.solve(A.with_values(v), bb, return_info=True, rtol=1e-8, properties="spd")
    x.square().sum().backward()
    torch.cuda.synchronize()
    out["rows"].append({"impl": "sparsetorch auto (one step, cold)", "step_s": time.perf_counter() - t0,
                        "choice": f"{info.backend}/{info.method}", "relative_residual": info.residual})
    for r in out["rows"]:
        print("direct_1m", r["impl"], {k: r.get(k) for k in ("first_s", "repeat_s", "backward_s", "step_s", "error")}, flush=True)
    return out

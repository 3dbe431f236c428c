"""eigsh on the GPU: sparsetorch's Lanczos vs torch.lobpcg vs torch-sla 0.4.0, one run.

    PYTHONPATH=core python benchmarks/bench_spectral_gpu.py --grid 512 --out results/spectral_gpu.json

2-D Poisson (float64), the k largest eigenvalues (a well-separated end of the spectrum), errors
against the closed-form eigenvalues. Median of CUDA-synchronised wall times.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch

import sparsetorch as st
from sparsetorch.testing.problems import poisson2d


def timed(fn, repeats):
    ts, out = [], None
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    m, k = a.grid, a.k
    A = poisson2d(m).cuda()
    j = torch.arange(1, m + 1, dtype=torch.float64)
    lam1 = 2 - 2 * torch.cos(j * torch.pi / (m + 1))
    ref = (lam1[:, None] + lam1[None, :]).reshape(-1).sort().values[-k:]
    rows = {}

    def err(w):
        return float((w.detach().cpu().sort().values - ref).abs().max())

    for label, fn in {
        "sparsetorch lanczos": lambda: st.eigsh(A, k, which="LA", method="lanczos")[0],
        "sparsetorch auto": lambda: st.eigsh(A, k, which="LA")[0],
        "torch.lobpcg (direct)": lambda: torch.lobpcg(torch.sparse_coo_tensor(*A.coordinates(), tuple(A.shape)).coalesce(),
                                                      k=k, largest=True, tol=1e-9, niter=2000)[0],
    }.items():
        try:
            t, w = timed(fn, a.repeats)
            rows[label] = {"seconds": t, "max_abs_error": err(w)}
        except Exception as exc:
            rows[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    v = A.values.clone().requires_grad_()

    def fb():
        w, _ = st.eigsh(A.with_values(v), k, which="LA", method="lanczos")
        w.sum().backward()
        return w

    t, _ = timed(fb, a.repeats)
    rows["sparsetorch lanczos forward+backward (eigenvalues)"] = {"seconds": t}
    try:
        import torch_sla

        c, vals = A.coordinates()
        T = torch_sla.SparseTensor(vals, c[0], c[1], tuple(A.shape))
        t, (w, _) = timed(lambda: T.eigsh(k=k, which="LA"), a.repeats)
        rows["torch_sla eigsh"] = {"seconds": t, "max_abs_error": err(w), "version": torch_sla.__version__}
    except Exception as exc:
        rows["torch_sla eigsh"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    out = {"benchmark": "spectral_gpu", "command": "python benchmarks/bench_spectral_gpu.py " + " ".join(sys.argv[1:]),
           "machine": {"gpu": torch.cuda.get_device_name(), "platform": platform.platform()},
           "versions": {"torch": torch.__version__, "sparsetorch": st.__version__, "python": platform.python_version()},
           "problem": f"2-D Poisson {m}x{m} (n={m * m}), float64, k={k} largest", "rows": rows}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

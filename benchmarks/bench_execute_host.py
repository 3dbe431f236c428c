"""Host time of ``Matmul.execute``'s direct path in the core, without a GPU.

    python benchmarks/bench_execute_host.py [--out benchmarks/results/execute_host_cpu.json] [--label NAME]

The planned product's bound launch (``plan.bind``, the cuda plugin's on a GPU) is replaced by a
no-op, so what is timed is the core's own per-call work: the gradient / forward-AD / transform /
compile checks, the index-version check, the output allocation, the call. A tiny CSR (1000 rows,
1 % dense, float32, a vector), best of 7 rounds of 20000 calls (seconds per call); also the pieces
(``torch.empty_like`` of the template, a no-op lambda). Also the general path (``general_execute_s``:
``Matmul.execute`` through the autograd Function and the torch backend's plan, 5000 calls a
round). On a shared CPU quote ratios; the H200's host adds the real launch (4.3 us through
cuda.bindings in session 7).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

import sparsetorch as st
from sparsetorch.format import CSR

ROOT = Path(__file__).resolve().parents[1]


class _NopBound:
    def __call__(self, X: torch.Tensor, Y: torch.Tensor) -> bool:
        return True


class _BindingPlan:
    """The torch backend's plan with a ``bind`` that returns a no-op launch (so the direct path runs)."""

    def __init__(self, plan) -> None:
        self._plan = plan

    def bind(self, values, X):
        return _NopBound()

    def __getattr__(self, name):
        return getattr(self._plan, name)


def best(fn, calls: int = 20000, rounds: int = 7) -> float:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls)
    return min(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "execute_host_cpu.json"))
    ap.add_argument("--label", default="HEAD", help="name of this measurement in the JSON (appended to a file that exists)")
    args = ap.parse_args()
    torch.manual_seed(0)
    D = torch.randn(1000, 1000) * (torch.rand(1000, 1000) < 0.01)
    A = st.SparseTensor.from_dense(D).convert(CSR, index_dtype=torch.int32)
    b = torch.randn(1000)
    mm = st.Matmul(A, b, backend="torch")
    mm.plan()
    mm._state.plan = _BindingPlan(mm._state.plan)
    mm.execute()
    if mm._direct is None:
        print("the direct path did not bind", file=sys.stderr)
        return 1
    tmpl = mm._direct.template
    row = {"label": args.label, "execute_s": best(mm.execute), "empty_like_s": best(lambda: torch.empty_like(tmpl)),
           "noop_lambda_s": best(lambda: None)}
    row["core_python_s"] = row["execute_s"] - row["empty_like_s"]
    # the general path (autograd Function, the torch backend's plan): what a plan without bind runs
    general = st.Matmul(A, b, backend="torch")
    general.plan()
    row["general_execute_s"] = best(general.execute, calls=5000)
    print(json.dumps(row))
    path = Path(args.out)
    doc = json.loads(path.read_text()) if path.exists() else {
        "benchmark": "Matmul.execute direct path, core host time with a no-op launch (CPU)",
        "command": " ".join(["python", "benchmarks/bench_execute_host.py", *sys.argv[1:]]),
        "machine": {"platform": platform.platform(), "cpu_count": __import__("os").cpu_count()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "sparsetorch": st.__version__},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "rows": []}
    doc["rows"].append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

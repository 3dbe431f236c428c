"""Session 10: host time of ``Matmul.execute`` and the one-shot ``st.matmul``, A/B between trees.

    python plugins/cuda_kernels/benchmarks/bench_host_ab.py --label NAME --round R --out FILE.jsonl
    python plugins/cuda_kernels/benchmarks/bench_host_ab.py --combine FILE.jsonl --json OUT.json

The first form measures whatever ``sparsetorch`` / ``sparsetorch_cuda`` import (run_s10_host.sh
points ``PYTHONPATH`` at one tree per process and alternates the trees, so each is measured in
several processes on one host) and appends one row to ``FILE.jsonl``; the second folds the rows
into a table (per label: the median over rounds of each measurement, and its spread).

What is measured (``thr``: N calls back to back, one synchronize, wall / N, best of 5), on the
tiny CSR of bench_s7b's host case (1000 rows, float32, int32, a vector):

- the references: ``t.add_(1)`` (the launch unit), ``cuLaunchKernel`` through cuda.bindings with
  the bound launch's own arguments, the stream query, ``torch.empty_like`` of the output template;
- the bound launch alone (``bound(X, Y)``, Y fixed) and with the allocation (``bound(X,
  empty_like(template))``): whether allocation and launch add up;
- ``Matmul.execute`` on the direct path, new output and into ``c`` (``beta=0``), each also with the
  bound launch replaced by a no-op (``*_nop``: the core's own per-call work, allocation included);
- the general path (the autograd Function) and the one-shot ``st.matmul`` on a pattern seen before.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import torch  # noqa: E402

from common import bench_doc, thr as _thr  # noqa: E402

CALLS = 2000


def thr(fn: Any) -> float:
    return _thr(fn, CALLS, 5)


class _Nop:
    """A bound launch that launches nothing (what is left is the core's per-call work)."""

    def __call__(self, X: torch.Tensor, Y: torch.Tensor) -> bool:
        return True


def measure() -> dict:
    import sparsetorch as st
    import sparsetorch_cuda
    from sparsetorch.format import CSR
    from sparsetorch_cuda.launch import _stream, raw_stream

    n = 1000
    D = torch.diag(torch.full((n,), 2.0, device="cuda")) + torch.diag(torch.ones(n - 1, device="cuda"), 1)
    A = st.SparseTensor.from_dense(D).convert(CSR, index_dtype=torch.int32)
    x = torch.ones(n, device="cuda")
    ref = D @ x
    out: dict[str, Any] = {"sparsetorch": str(Path(st.__file__).parent), "sparsetorch_cuda": str(Path(sparsetorch_cuda.__file__).parent)}
    t = torch.ones(8, device="cuda")
    out["launch_unit"] = thr(lambda: t.add_(1))
    out["raw_stream"] = thr(lambda: raw_stream(0))
    mm = st.Matmul(A, x, backend="cuda")
    mm.plan()
    assert torch.allclose(mm.execute(), ref) and mm._direct is not None, "direct path"
    d = mm._direct
    bound, tpl, X = d.bound, d.template, mm._rhs.Xn
    out["bound_kernel"] = getattr(bound, "name", None)
    out["empty_like_template"] = thr(lambda: torch.empty_like(tpl))
    Y = torch.empty((n, 1), device="cuda")
    out["bound_launch_only"] = thr(lambda: bound(X, Y))
    out["bound_launch_alloc"] = thr(lambda: bound(X, torch.empty_like(tpl)))
    s = _stream(raw_stream(0))
    cu = bound._cu
    args = (bound._fn, bound._gx, bound._gy, 1, bound._block, 1, 1, bound._shared, s, bound._addr, 0)
    out["cuLaunchKernel_bindings"] = thr(lambda: cu.cuLaunchKernel(*args))
    out["execute_direct"] = thr(mm.execute)
    torch.cuda.synchronize()
    assert torch.allclose(mm.execute(), ref)
    c = torch.empty(n, device="cuda")
    mc = st.Matmul(A, x, c, beta=0, backend="cuda")
    assert mc.execute() is c and torch.allclose(c, ref) and mc._direct is not None
    out["execute_into_c"] = thr(mc.execute)
    # the core's own work: the same objects with a launch that does nothing
    mn = st.Matmul(A, x, backend="cuda")
    mn.execute()
    mn._direct.bound = _Nop()
    out["execute_direct_nop"] = thr(mn.execute)
    mcn = st.Matmul(A, x, torch.empty(n, device="cuda"), beta=0, backend="cuda")
    mcn.execute()
    mcn._direct.bound = _Nop()
    out["execute_into_c_nop"] = thr(mcn.execute)
    mg = st.Matmul(A, x, backend="cuda")
    mg.plan()
    mg._direct, mg._direct_tried = None, True  # the general path (the autograd Function)
    out["execute_general"] = thr(mg.execute)
    import sparsetorch_cuda.launch as launch_mod

    launch_mod.BOUND_LAUNCH = "ctypes"  # the bound launch through ctypes: the same calls, interleaved with bindings'
    try:
        mk = st.Matmul(A, x, backend="cuda")
        mkc = st.Matmul(A, x, torch.empty(n, device="cuda"), beta=0, backend="cuda")
        assert torch.allclose(mk.execute(), ref) and mkc.execute() is mkc.c and mk._direct is not None
    finally:
        launch_mod.BOUND_LAUNCH = "bindings"
    for i in range(2):
        out[f"execute_direct_bindings_{i}"] = thr(mm.execute)
        out[f"execute_direct_ctypes_{i}"] = thr(mk.execute)
        out[f"execute_into_c_bindings_{i}"] = thr(mc.execute)
        out[f"execute_into_c_ctypes_{i}"] = thr(mkc.execute)
    for _ in range(3):
        st.matmul(A, x, backend="cuda")  # a pattern seen before
    torch.cuda.synchronize()
    assert torch.allclose(st.matmul(A, x, backend="cuda"), ref)
    out["one_shot"] = thr(lambda: st.matmul(A, x, backend="cuda"))
    out["one_shot_new_x"] = thr(lambda: st.matmul(A, x.clone(), backend="cuda"))  # minus clone_x: a fresh X per call
    out["clone_x"] = thr(lambda: x.clone())
    torch.cuda.synchronize()
    return out


def combine(rows: list[dict]) -> dict:
    """Per label: each measurement's median over the rounds, min and max, and the derived
    figures (in launch units; "added" = execute minus cuLaunchKernel of the same process)."""
    labels = list(dict.fromkeys(r["label"] for r in rows))
    table: dict[str, Any] = {}
    for label in labels:
        rs = [r for r in rows if r["label"] == label]
        keys = [k for k, v in rs[0].items() if isinstance(v, float) and k != "wall_s"]
        derived = []
        for r in rs:
            lu, cl = r["launch_unit"], r["cuLaunchKernel_bindings"]
            derived.append({
                "execute_direct_in_launch_units": r["execute_direct"] / lu,
                "execute_into_c_in_launch_units": r["execute_into_c"] / lu,
                "one_shot_in_launch_units": r["one_shot"] / lu,
                "execute_direct_added_to_launch_s": r["execute_direct"] - cl,
                "execute_into_c_added_to_launch_s": r["execute_into_c"] - cl,
                "one_shot_added_to_launch_s": r["one_shot"] - cl,
                "one_shot_over_execute": r["one_shot"] / r["execute_direct"],
                "alloc_in_context_s": r["bound_launch_alloc"] - r["bound_launch_only"],
            })
            if "execute_direct_ctypes_0" in r:
                best = {k: min(r[f"{k}_0"], r[f"{k}_1"]) for k in ("execute_direct_bindings", "execute_direct_ctypes",
                                                                     "execute_into_c_bindings", "execute_into_c_ctypes")}
                derived[-1]["direct_ctypes_minus_bindings_s"] = best["execute_direct_ctypes"] - best["execute_direct_bindings"]
                derived[-1]["into_c_ctypes_minus_bindings_s"] = best["execute_into_c_ctypes"] - best["execute_into_c_bindings"]
        entry: dict[str, Any] = {"rounds": len(rs), "tree": rs[0].get("sparsetorch"), "median": {}, "min": {}, "max": {}}
        for k in keys:
            vals = [r[k] for r in rs]
            entry["median"][k], entry["min"][k], entry["max"][k] = statistics.median(vals), min(vals), max(vals)
        for k in derived[0]:
            vals = [dd[k] for dd in derived if k in dd]
            entry["median"][k], entry["min"][k], entry["max"][k] = statistics.median(vals), min(vals), max(vals)
        table[label] = entry
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="tree")
    ap.add_argument("--round", type=int, default=0)
    ap.add_argument("--out", default="host_ab.jsonl")
    ap.add_argument("--combine", default=None, help="fold the rows of this JSONL file into --json")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "host_h200_s10_ab.json"))
    ap.add_argument("--note", action="append", default=[], help="a line for the result's notes (repeatable)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    if args.combine:
        rows = [json.loads(line) for line in Path(args.combine).read_text().splitlines() if line.strip()]
        doc = bench_doc("cuda plugin session 10: Matmul.execute / st.matmul host time, A/B of trees (one process per "
                        "tree and round, trees alternated)", "plugins/cuda_kernels/benchmarks/bench_host_ab.py",
                        sys.argv[1:], "", float("nan"),
                        ["thr = N calls back to back, one synchronize, wall / N, best of 5 (seconds)",
                         "*_added_to_launch_s: the measurement minus cuLaunchKernel_bindings of the same process",
                         *args.note])
        doc["table"] = combine(rows)
        doc["rows"] = rows
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
        for label, e in doc["table"].items():
            med = e["median"]
            print(f"{label:8s} " + "  ".join(f"{k}={v:.2f}" if "units" in k or "over" in k else f"{k}={v * 1e6:.2f}"
                                            for k, v in med.items()), flush=True)
        print(f"wrote {args.json}")
        return 0
    t0 = time.perf_counter()
    row = {"label": args.label, "round": args.round, **measure()}
    row["wall_s"] = time.perf_counter() - t0
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(args.label, args.round, " ".join(f"{k}={v * 1e6:.2f}" for k, v in row.items() if isinstance(v, float) and k != "wall_s"),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

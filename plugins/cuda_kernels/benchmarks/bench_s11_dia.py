"""Session 11 (helper s11f): issue 16's float32 DIA goal on the 114^3 stencil, the s11 DIA variants side by side.

    python plugins/cuda_kernels/benchmarks/bench_s11_dia.py --out DIR [--m 114] [--rounds 2] [--all]

The 3-D 7-point stencil of 114^3 = 1,481,544 rows in DIA (``A.convert(DIA)`` of the suite's CSR, as in
benchmarks/gpu/spmv.py), one right-hand side, float32 and float64. In one run, each measured in
``--rounds`` rounds (the order of the variants reversed every other round: drift shows as spread):

- ``graph``: the kernel of each variant (``plan.apply`` of an (n, 1) X; 20 calls captured in a CUDA graph,
  replayed, median of 10, / 20: bench_cuda_kernels.graph_time); "!nopdl": the same variant with
  launch.PDL = False (the PDL kernels launched plainly: the wait is a no-op);
- ``b2b``: ``st.Matmul(A, x).execute()`` (auto dispatch, as the suite's row "sparsetorch Matmul DIA [auto]")
  with the variant as the module default (plan.DIA_DEFAULT_FEW / DIA_DEFAULT_FEW_F64 monkeypatched),
  100 calls between one pair of CUDA events, per call, median of 5 (the suite's time_cuda_stream),
  plus the suite's per-call event median (time_cuda, 30 calls) and the host-bound rate (``thr``: wall
  time of 300 calls, one synchronize, best of 5);
- every product checked against the float64 CSR product (rel. error).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import warnings
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import torch  # noqa: E402

import sparsetorch as st  # noqa: E402
from sparsetorch.format import CSR, DIA  # noqa: E402

import bench_cuda_kernels as B  # noqa: E402
from common import copy_bandwidth, stencil3d_csr, thr, time_cuda, time_cuda_stream  # noqa: E402

#: ``--all`` (the lists of the committed run, benchmarks/results/cuda_kernels_h200_s11f_dia.json)
GRAPH_ALL = {torch.float32: ("p1", "p1!nopdl", "p1w", "p1w!nopdl", "p1wt", "p2w", "q", "qw", "qw!nopdl", "qwt", "qwe", "qwb",
                             "qw/256", "qwt/256"),
             torch.float64: ("p1nb", "p1nbw", "p1nbw!nopdl", "p1", "p1w", "p1wt", "q", "qw", "qwt", "qwb")}
B2B_ALL = {torch.float32: ("p1", "p1w", "p1w!nopdl", "p1wt", "qw", "qw!nopdl", "qwt", "qwb", "qwt/256"),
           torch.float64: ("p1nb", "p1nbw", "p1nbw!nopdl", "qw", "qwt")}
#: the default (shorter) lists: the defaults before and after session 11 and the close candidates
GRAPH = {torch.float32: ("p1", "p1w", "p1w!nopdl", "p1wt", "qwe"), torch.float64: ("p1nb", "p1nbw", "p1nbw!nopdl", "qwt")}
B2B = {torch.float32: ("p1", "p1w", "p1w!nopdl", "p1wt", "qwe"), torch.float64: ("p1nb", "p1nbw", "p1nbw!nopdl", "qwt")}


class Setting:
    """``variant[/threads][!nopdl]``: the plan's variant, DIA_BLOCK_Q, launch.PDL, for the block's duration."""

    def __init__(self, spec: str, dtype: torch.dtype, default: bool = False) -> None:
        import sparsetorch_cuda.launch as launch_mod
        import sparsetorch_cuda.plan as plan_mod

        self.spec, self.dtype, self.default = spec, dtype, default
        body, _, flag = spec.partition("!")
        self.variant, _, threads = body.partition("/")
        self.threads = int(threads) if threads else None
        self.pdl = flag != "nopdl"
        self.plan_mod, self.launch_mod = plan_mod, launch_mod

    def __enter__(self) -> "Setting":
        pm = self.plan_mod
        self.saved = (pm.DIA_BLOCK_Q, pm.DIA_DEFAULT_FEW, pm.DIA_DEFAULT_FEW_F64, self.launch_mod.PDL)
        if self.threads:
            pm.DIA_BLOCK_Q = self.threads
        self.launch_mod.PDL = self.pdl
        if self.default:
            if self.dtype == torch.float64:
                pm.DIA_DEFAULT_FEW_F64 = self.variant
            else:
                pm.DIA_DEFAULT_FEW = self.variant
        return self

    def __exit__(self, *exc) -> None:
        pm = self.plan_mod
        pm.DIA_BLOCK_Q, pm.DIA_DEFAULT_FEW, pm.DIA_DEFAULT_FEW_F64, self.launch_mod.PDL = self.saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--m", type=int, default=114)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--all", action="store_true", help="every s11 variant (the committed run's lists)")
    args = ap.parse_args()
    graph_specs, b2b_specs = (GRAPH_ALL, B2B_ALL) if args.all else (GRAPH, B2B)
    bw = copy_bandwidth()
    m = args.m
    n = m ** 3
    (crow, col, v64), _ = stencil3d_csr(m)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows: list[dict] = []
    for dtype in (torch.float32, torch.float64):
        name = str(dtype).replace("torch.", "")
        vs = torch.empty((), dtype=dtype).element_size()
        A = st.SparseTensor(CSR, (n, n), [None, crow], [None, col], v64.to(dtype), check=False).convert(DIA)
        x = torch.randn(n, dtype=torch.float64, device="cuda", generator=g).to(dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = torch.sparse_csr_tensor(crow, col, v64, (n, n)) @ x.double()
        floor = (7 * n * vs + 7 * 8 + 2 * n * vs) / bw["bytes_per_s"]
        x2 = x[:, None]

        def err(y: torch.Tensor) -> float:
            return float(torch.linalg.vector_norm(y.double().reshape(-1) - ref) / torch.linalg.vector_norm(ref))

        for r in range(args.rounds):
            order = graph_specs[dtype] if r % 2 == 0 else graph_specs[dtype][::-1]
            for spec in order:
                try:
                    with Setting(spec, dtype) as s:
                        p = B._plan(A, s.variant)
                        e = err(p.apply(x2))
                        p.apply(x2)
                        name_k = p._prepared[(1, 0)]._kern.name if p._prepared.get((1, 0)) is not None else None
                        pdl = bool(p._prepared[(1, 0)].pdl) if name_k else None
                        kt = B.graph_time(lambda p=p: p.apply(x2))
                    rows.append({"dtype": name, "how": "graph", "spec": spec, "round": r, "kernel": name_k, "pdl": pdl,
                                 "s": kt, "floor_s": floor, "rel_err": e})
                    print(f"{name:8s} graph r{r} {spec:14s} {kt * 1e6:7.2f} us  {name_k} pdl={pdl}  err {e:.1e}", flush=True)
                except Exception as exc:  # noqa: BLE001 - record and go on
                    rows.append({"dtype": name, "how": "graph", "spec": spec, "round": r, "error": repr(exc)})
                    print(name, "graph", spec, repr(exc), flush=True)
            order = b2b_specs[dtype] if r % 2 == 0 else b2b_specs[dtype][::-1]
            for spec in order:
                try:
                    with Setting(spec, dtype, default=True) as s:
                        mm = st.Matmul(A, x)
                        table = mm.plan()
                        e = err(mm.execute())
                        chosen = f"{table.chosen.backend}/{table.chosen.method}" if table.chosen else None
                        plan = mm._state.plan
                        b2b = time_cuda_stream(mm.execute)
                        call = time_cuda(mm.execute, reps=30)
                        host = thr(mm.execute, 300, 5)
                        direct = mm._direct
                        bound = getattr(direct, "bound", None) if direct is not None else None
                    rows.append({"dtype": name, "how": "b2b", "spec": spec, "round": r, "chosen": chosen,
                                 "variant": getattr(plan, "variant", None), "bound": direct is not None,
                                 "bound_pdl": getattr(bound, "pdl", None), "s": b2b["median_s"], "b2b_min_s": b2b["min_s"],
                                 "per_call_event_s": call["median_s"], "thr_wall_s": host, "floor_s": floor, "rel_err": e})
                    print(f"{name:8s} b2b   r{r} {spec:14s} {b2b['median_s'] * 1e6:7.2f} us  event {call['median_s'] * 1e6:6.2f}"
                          f"  thr {host * 1e6:6.2f}  {chosen} {getattr(plan, 'variant', None)} bound={direct is not None}"
                          f" pdl={getattr(bound, 'pdl', None)}  err {e:.1e}", flush=True)
                except Exception as exc:  # noqa: BLE001
                    rows.append({"dtype": name, "how": "b2b", "spec": spec, "round": r, "error": repr(exc)})
                    print(name, "b2b", spec, repr(exc), flush=True)
        del A
    summary = {}
    for rrow in rows:
        if "s" in rrow:
            summary.setdefault((rrow["dtype"], rrow["how"], rrow["spec"]), []).append(rrow["s"])
    print("\nsummary (us; per round, then median)")
    table = []
    for (dt, how, spec), ts in summary.items():
        table.append({"dtype": dt, "how": how, "spec": spec, "per_round_us": [round(t * 1e6, 2) for t in ts],
                      "median_us": round(statistics.median(ts) * 1e6, 2)})
        print(f"{dt:8s} {how:5s} {spec:14s} {' '.join(f'{t * 1e6:6.2f}' for t in ts)}  -> {statistics.median(ts) * 1e6:6.2f}")
    doc = {"benchmark": "bench_s11_dia", "command": " ".join(["python3", *sys.argv]),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": {"platform": platform.platform(), "gpu": torch.cuda.get_device_name()},
           "versions": {"torch": torch.__version__, "sparsetorch": st.__version__},
           "bandwidth": bw, "matrix": {"grid": f"{m}^3", "rows": n, "diagonals": 7}, "note": __doc__,
           "summary": table, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_kernels_h200_s11f_dia.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

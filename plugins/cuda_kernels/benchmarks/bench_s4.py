"""The cuda backend's kernels and its cost model against the torch and cupy backends, in one run.

    python plugins/cuda_kernels/benchmarks/bench_s4.py --out DIR [--fit PATH] [--cases host,stencil,lowsparsity,nm]

Reuses benchmarks/bench_cuda_kernels.py (its table, graph timing, low-sparsity and N:M cases and
fit) and adds:

- ``host``: CPU time per call of many calls back to back (``thr_s``: N calls, one synchronize,
  wall time / N, best of 5) for ``plan.apply``, its pieces (``torch.empty``, the stream query),
  the core's launch unit (``t.add_(1)``, as sparsetorch's calibration times it), torch CSR ``mv``
  and ``Matmul.execute`` on each backend, on a tiny matrix (1000 rows). The cost model's host
  time is ``plan.apply``'s, in launch units of this run.
- ``stencil``: the 114^3 7-point stencil, float64 and float32: every CSR and DIA kernel variant
  through ``plan.apply`` (kernel time from CUDA-graph replay), ELL, torch CSR ``mv``; and for CSR
  int32, CSR int64 and DIA, ``Matmul.execute`` pinned to each backend and on auto (per-call
  CUDA-event median ``call_s`` and back-to-back ``thr_s``), with every backend's estimate from the
  auto plan's explain table: ``choices`` in the fit, checked by tests/test_cuda_plugin.py.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import torch  # noqa: E402

import sparsetorch as st  # noqa: E402
from sparsetorch.backend import rates as device_rates  # noqa: E402
from sparsetorch.format import CSR, DIA, ELL  # noqa: E402

import bench_cuda_kernels as B  # noqa: E402
from common import copy_bandwidth, guard, stencil3d_csr, thr as _thr  # noqa: E402

CSR_VARIANTS = ("stream", "streamcs", "stream16", "vector")
#: DIA variants, with the "p" kernels' block size (plan.DIA_BLOCK) where given as "variant/threads"
DIA_VARIANTS = ("p1", "p1cs", "p1/128", "p1/512", "p1cs/512", "rows2")


def thr(fn: Callable[[], Any], calls: int = 500, reps: int = 5) -> float:
    """:func:`common.thr` with this benchmark's default number of calls."""
    return _thr(fn, calls, reps)


def case_host(tab: B.Table) -> dict:
    from sparsetorch_cuda.launch import raw_stream

    n = 1000
    D = torch.diag(torch.full((n,), 2.0, device="cuda")) + torch.diag(torch.ones(n - 1, device="cuda"), 1)
    A = st.SparseTensor.from_dense(D).convert(CSR, index_dtype=torch.int32)
    x = torch.ones(n, device="cuda")
    x2 = x[:, None]
    p = B._plan(A)
    ref = D.double() @ x.double()
    out: dict[str, Any] = {}
    t = torch.ones(8, device="cuda")
    out["launch_unit_thr_s"] = thr(lambda: t.add_(1), calls=1000)
    out["plan_apply_thr_s"] = thr(lambda: p.apply(x2), calls=1000)
    out["torch_empty_thr_s"] = thr(lambda: torch.empty((n, 1), dtype=torch.float32, device=p.device), calls=1000)
    out["raw_stream_thr_s"] = thr(lambda: raw_stream(0), calls=1000)
    out["current_stream_thr_s"] = thr(lambda: torch.cuda.current_stream(0).cuda_stream, calls=1000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        T = D.to_sparse_csr()
    out["torch_csr_mv_thr_s"] = thr(lambda: T @ x, calls=1000)
    for backend in ("cuda", "torch", "cupy"):
        got = guard(lambda backend=backend: {"mm": st.Matmul(A, x, backend=backend)})
        if "mm" in got:
            mm = got["mm"]
            mm.plan()
            out[f"matmul_execute_{backend}_thr_s"] = thr(mm.execute, calls=300)
    r = device_rates(torch.device("cuda"))
    out["rates"] = {"bandwidth": r.bandwidth, "flops": r.flops, "launch": r.launch, "measured": r.measured}
    out["host_launches"] = out["plan_apply_thr_s"] / out["launch_unit_thr_s"]
    a = tab.record("host", "cuda plan.apply tiny CSR", lambda: p.apply(x2), lambda: p.apply(x2), ref, 0.0, dtype="float32")
    out["plan_apply_call_s"] = a.get("call_s")
    for k, v in out.items():
        if k.endswith("_s"):
            print(f"host {k:36s} {v * 1e6:8.2f} us", flush=True)
    print(f"host launch units per plan.apply {out['host_launches']:.2f}; rates {out['rates']}", flush=True)
    return out


def _explain(A, x) -> dict:
    mm = st.Matmul(A, x)
    table = mm.plan()
    est = {r.backend: r.seconds for r in table.offers}
    return {"estimates": est, "auto": table.chosen.backend if table.chosen else None}


def case_stencil(tab: B.Table, m: int, choices: list) -> None:
    import sparsetorch_cuda.plan as plan_mod
    from sparsetorch_cuda.cost import traffic

    dia_block = plan_mod.DIA_BLOCK
    n = m ** 3
    (crow, col, v64), _ = stencil3d_csr(m)
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.float64, torch.float32):
        name = str(dtype).replace("torch.", "")
        vs = torch.empty((), dtype=dtype).element_size()
        x = torch.randn(n, dtype=torch.float64, device="cuda", generator=g).to(dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = torch.sparse_csr_tensor(crow, col, v64, (n, n)) @ x.double()
        A64 = st.SparseTensor(CSR, (n, n), [None, crow], [None, col], v64.to(dtype), check=False)
        mats = {"CSR int32": A64.convert(CSR, index_dtype=torch.int32), "CSR int64": A64, "DIA": A64.convert(DIA),
                "ELL": A64.convert(ELL)}
        x2 = x[:, None]
        case = f"stencil {name}"
        for label, A in mats.items():
            kind = label.split()[0].lower()
            variants = {"csr": CSR_VARIANTS, "dia": DIA_VARIANTS}.get(kind, (None,))
            p0 = B._plan(A)
            default = p0.variant if kind in ("csr", "dia") else None
            isz = torch.empty((), dtype=p0.idx).element_size()  # CSR int64 runs on int32 copies of its indices
            del p0
            nb = traffic(kind, m=n, n=n, nnz=int(A.nse), k=1, vs=vs, isz=isz, slots=int(A.values.shape[-1]))
            for label_v in variants:
                variant, _, threads = (label_v or "").partition("/")
                variant = variant or None
                if threads:
                    plan_mod.DIA_BLOCK = int(threads)
                p = B._plan(A, variant)
                p.apply(x2)  # records the launch (grid and block) that the timed calls replay
                plan_mod.DIA_BLOCK = dia_block
                if threads:
                    variant = None  # not what the plan runs by default
                if kind == "csr":
                    fam = f"csr_{'stream' if p.variant.startswith('stream') else p.variant}" if variant == default else None
                else:
                    fam = kind if variant == default else None
                tab.record(case, f"cuda plan.apply {label}" + (f" [{label_v}]" if label_v else ""), lambda p=p: p.apply(x2),
                           lambda p=p: p.apply(x2), ref, nb, family=fam, dtype=name, format=label, variant=label_v,
                           default=variant == default)
                del p
            if label == "ELL":
                continue
            info = _explain(A, x)
            measured: dict[str, float] = {}
            for backend in ("cuda", "torch", "cupy", None):
                got = guard(lambda A=A, backend=backend: {"mm": st.Matmul(A, x, backend=backend)})
                if "mm" not in got:
                    tab.rows.append({"case": case, "impl": f"Matmul {label} [{backend}]", **got})
                    continue
                mm = got["mm"]
                table = mm.plan()
                chosen = table.chosen.backend if table.chosen else None
                row = tab.record(case, f"sparsetorch Matmul.execute {label} [{backend or 'auto'}]", mm.execute, mm.execute, ref, nb,
                                 graph=False, dtype=name, format=label, choice=chosen)
                row["thr_s"] = guard(lambda mm=mm: {"t": thr(mm.execute, calls=100, reps=3)}).get("t")
                est = {k: round(v * 1e6, 1) for k, v in info["estimates"].items()}
                tail = "" if backend else f"  (auto: {chosen}; estimates {est} us)"
                print(f"{'':12s} {'  back to back':58s} {row['thr_s'] * 1e6 if row['thr_s'] else float('nan'):8.1f} us per call{tail}",
                      flush=True)
                if backend is not None and row.get("thr_s"):
                    measured[backend] = row["thr_s"]
                del mm
            choices.append({"case": case, "format": label, "dtype": name, "m": n, "n": n, "nse": int(A.nse), "k": 1,
                            "index": "int32" if "int32" in label else "int64", **info, "measured_thr_s": measured})
        del mats, A64
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefix", default="cuda_kernels_h200_s4")
    ap.add_argument("--fit", default=None)
    ap.add_argument("--cases", default="host,stencil,lowsparsity,nm")
    ap.add_argument("--low-dtypes", default="float16,bfloat16")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    t0 = time.perf_counter()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw['bytes_per_s'] / 1e12:.2f} TB/s", flush=True)
    tab = B.Table(bw["bytes_per_s"], args.reps)
    p = torch.cuda.get_device_properties(0)
    doc: dict[str, Any] = {"bench": "cuda_kernels_s4", "command": " ".join(["python", "plugins/cuda_kernels/benchmarks/bench_s4.py",
                                                                           *sys.argv[1:]]),
                           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                           "machine": {"gpu": torch.cuda.get_device_name(0), "compute_capability": f"{p.major}.{p.minor}",
                                       "sm_count": p.multi_processor_count, "platform": platform.platform()},
                           "versions": B.versions(), "copy_bandwidth": bw,
                           "notes": ["call_s: median of per-call CUDA-event timings (host time counts when the GPU waits)",
                                     f"kernel_s: {B.GRAPH_CALLS} calls captured in one CUDA graph, replayed, median / {B.GRAPH_CALLS}",
                                     "thr_s: calls back to back, one synchronize, wall time / calls, best of several",
                                     "floor_s: bytes the format must move / copy bandwidth of this run"]}
    host: dict[str, Any] = {}
    choices: list[dict] = []
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{args.prefix}.json"
    for case in args.cases.split(","):
        t = time.perf_counter()
        print(f"== {case}", flush=True)
        if case == "host":
            host = guard(lambda: case_host(tab))
        elif case == "stencil":
            guard(lambda: case_stencil(tab, 114, choices) or {})
        elif case == "lowsparsity":
            low = tuple(getattr(torch, d) for d in args.low_dtypes.split(","))
            guard(lambda: B.case_lowsparsity(tab, 8192, low, (1,)) or {})
        elif case == "nm":
            guard(lambda: B.case_nm(tab, 8192, (torch.float16, torch.bfloat16)) or {})
        print(f"   ({time.perf_counter() - t:.1f} s)", flush=True)
        doc["host"], doc["rows"], doc["choices"] = host, tab.rows, choices
        doc["wall_seconds"] = time.perf_counter() - t0
        path.write_text(json.dumps(doc, indent=1, default=str))
        torch.cuda.empty_cache()
    if args.fit:
        fitted = B.fit(tab.rows, bw["bytes_per_s"], max(host.get("plan_apply_thr_s") or 12e-6, 1e-6))
        fitted.update({"host_launches": host.get("host_launches"), "launch_unit_s": host.get("launch_unit_thr_s"),
                       "rates": host.get("rates"), "choices": choices,
                       "machine": doc["machine"], "versions": doc["versions"], "command": doc["command"], "date": doc["date"],
                       "notes": ["efficiency[family]: median of bytes / (kernel_s * copy bandwidth) over the rows of that family "
                                 "(each the variant the plan runs by default)",
                                 "host_s: plan.apply's CPU seconds per call, back to back (tiny CSR); host_launches: the same in "
                                 "launch units of this run (t.add_(1) back to back), priced at rates.launch at run time",
                                 "choices: per matrix, every backend's estimate in the auto plan of this run (the cuda one from "
                                 "the cost model committed then) and Matmul.execute pinned to each backend, back to back"]})
        Path(args.fit).write_text(json.dumps(fitted, indent=1, default=str))
        print(f"wrote {args.fit}: efficiency {fitted['efficiency']}, host {fitted['host_s'] * 1e6:.1f} us "
              f"({fitted['host_launches']} launch units)", flush=True)
    print(f"wrote {path} in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

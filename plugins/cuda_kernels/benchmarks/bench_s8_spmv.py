"""Session 8: issue 16's stencil SpMV goals for ELL, COO and DIA (and CSR, torch's CSR beside them).

    python plugins/cuda_kernels/benchmarks/bench_s8_spmv.py --out DIR [--m 114] [--dtypes float64,float32]

The 114^3 3-D 7-point stencil (1,481,544 rows) in CSR int32 / int64, COO (int64), DIA, ELL int64 /
int32, float64 and float32, one right-hand side (a vector). Per format, in one run:

- kernel time of the plan's variants (``plan.apply`` of a (n, 1) X: 20 calls captured in a CUDA
  graph, replayed, median of 10, / 20), with the bytes floor (bytes / this run's 1 GiB copy
  bandwidth; ELL / CSR bytes with 4-byte indices where the plan runs on int32 copies);
- ``st.Matmul(A, x, backend="cuda").execute()`` back to back (``thr``: N calls, one synchronize,
  wall / N, best of 5), whether it took the bound launch, and its per-call CUDA-event median; for
  ELL and DIA also with each candidate default (the module default monkeypatched);
- ``st.Matmul(A, x)`` (auto): the backend the dispatcher chose, every offer's estimate, and its
  ``execute`` back to back; the torch (and cupy, where installed) backend's ``execute``;
- torch's own CSR int32 ``mv`` kernel time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import torch  # noqa: E402

import sparsetorch as st  # noqa: E402
from sparsetorch.format import COO, CSR, DIA, ELL  # noqa: E402

import bench_cuda_kernels as B  # noqa: E402
from common import bench_doc, copy_bandwidth, guard, stencil3d_csr, time_cuda, thr as _thr  # noqa: E402

#: kernel variants per format (DIA "variant/threads": threads per block of the "p1na" / "v2" kernels; "p1pd@rows": prefetch distance)
VARIANTS = {"CSR int32": ("streamcs",), "CSR int64": ("streamcs",), "COO": (None,),
            "DIA": ("p1", "p1na/128", "p1nb", "p1nc", "p1pd@2048", "p1pd@8192", "p1pd@32768", "v2na/128"),
            "ELL int64": ("rows", "p", "pcs", "streamcs"), "ELL int32": ("rows", "p", "pcs", "streamcs")}
#: candidate defaults measured through Matmul.execute (monkeypatched module defaults)
EXEC_CANDIDATES: dict[str, tuple[str, ...]] = {"DIA": ("p1nb", "p1nc", "p1pd")}


def thr(fn: Callable[[], Any], calls: int = 200, reps: int = 5) -> float:
    """:func:`common.thr` with this benchmark's default number of calls."""
    return _thr(fn, calls, reps)


def _kind_bytes(label: str, A: st.SparseTensor, n: int, vs: int) -> float:
    from sparsetorch_cuda.cost import traffic

    kind = {"CSR": "csr", "COO": "generic", "DIA": "dia", "ELL": "ell"}[label.split()[0]]
    slots = int(A.values.shape[-1])
    if kind == "ell":  # int32 column copy, no counts read: slots * (vs + 4) + X + Y
        return slots * (vs + 4) + 2 * n * vs
    return traffic(kind, m=n, n=n, nnz=int(A.nse), k=1, vs=vs, isz=4, slots=slots)


def case_stencil(m: int, bw: float, dtypes: list[torch.dtype]) -> list[dict]:
    import sparsetorch_cuda.plan as plan_mod

    n = m ** 3
    (crow, col, v64), _ = stencil3d_csr(m)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows: list[dict] = []
    saved = {k: getattr(plan_mod, k) for k in ("DIA_BLOCK_NA", "DIA_BLOCK_V2", "ELL_DEFAULT", "DIA_DEFAULT_FEW_F64",
                                               "DIA_PREFETCH_ROWS")}

    def row(**kw: Any) -> None:
        rows.append(kw)
        t = kw.get("kernel_s") or kw.get("thr_s") or float("nan")
        extra = f"  bound {kw['bound']}" if "bound" in kw else ""
        extra += f"  chose {kw['chosen']}" if "chosen" in kw else ""
        print(f"stencil {kw['dtype']:8s} {kw['impl']:52s} {t * 1e6:8.2f} us  floor {kw.get('floor_s', 0) * 1e6:6.1f}"
              f"  err {kw.get('rel_err', float('nan')):.1e}{extra}", flush=True)

    for dtype in dtypes:
        name = str(dtype).replace("torch.", "")
        vs = torch.empty((), dtype=dtype).element_size()
        x = torch.randn(n, dtype=torch.float64, device="cuda", generator=g).to(dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = torch.sparse_csr_tensor(crow, col, v64, (n, n)) @ x.double()
            T = torch.sparse_csr_tensor(crow.int(), col.int(), v64.to(dtype), (n, n))
        A64 = st.SparseTensor(CSR, (n, n), [None, crow], [None, col], v64.to(dtype), check=False)
        x2 = x[:, None]

        def err(y: torch.Tensor) -> float:
            y = y.double().reshape(ref.shape)
            return float(torch.linalg.vector_norm(y - ref) / torch.linalg.vector_norm(ref))

        builders = {"CSR int32": lambda: A64.convert(CSR, index_dtype=torch.int32), "CSR int64": lambda: A64,
                    "COO": lambda: A64.convert(COO), "DIA": lambda: A64.convert(DIA),
                    "ELL int64": lambda: A64.convert(ELL), "ELL int32": lambda: A64.convert(ELL, index_dtype=torch.int32)}
        for label, build in builders.items():
            A = build()
            floor = _kind_bytes(label, A, n, vs) / bw
            for spec in VARIANTS[label]:
                spec_v, _, ahead = (spec or "").partition("@")
                variant, _, threads = spec_v.partition("/")
                if threads:
                    plan_mod.DIA_BLOCK_NA = plan_mod.DIA_BLOCK_V2 = int(threads)
                if ahead:
                    plan_mod.DIA_PREFETCH_ROWS = int(ahead)
                try:
                    p = B._plan(A, variant or None)
                    e = err(p.apply(x2))
                    kt = B.graph_time(lambda p=p: p.apply(x2))
                    row(case="stencil", dtype=name, fmt=label, impl=f"cuda plan.apply {label} [{spec or p.variant}]",
                        variant=spec or p.variant, kernel_s=kt, floor_s=floor, fraction_of_floor=floor / kt, rel_err=e)
                except Exception as exc:  # noqa: BLE001 - record and go on
                    rows.append({"case": "stencil", "dtype": name, "fmt": label, "impl": f"cuda plan.apply {label} [{spec}]",
                                 "error": repr(exc)})
                    print("stencil", name, label, spec, repr(exc), flush=True)
                finally:
                    plan_mod.DIA_BLOCK_NA, plan_mod.DIA_BLOCK_V2 = saved["DIA_BLOCK_NA"], saved["DIA_BLOCK_V2"]
                    plan_mod.DIA_PREFETCH_ROWS = saved["DIA_PREFETCH_ROWS"]
            # Matmul.execute, cuda, with the defaults as committed
            mm = st.Matmul(A, x, backend="cuda")
            mm.plan()
            e = err(mm.execute())
            plan = mm._state.plan
            row(case="stencil", dtype=name, fmt=label, impl=f"Matmul.execute {label} [cuda]", thr_s=thr(mm.execute),
                call_s=time_cuda(mm.execute)["median_s"], floor_s=floor, rel_err=e, bound=mm._direct is not None,
                plan=repr(plan))
            for cand in EXEC_CANDIDATES.get(label, ()):  # each candidate default through Matmul.execute
                key = "ELL_DEFAULT" if label.startswith("ELL") else "DIA_DEFAULT_FEW_F64"
                if key == "DIA_DEFAULT_FEW_F64" and dtype != torch.float64:
                    continue
                setattr(plan_mod, key, cand)
                try:
                    mc = st.Matmul(A, x, backend="cuda")
                    mc.plan()
                    e = err(mc.execute())
                    row(case="stencil", dtype=name, fmt=label, impl=f"Matmul.execute {label} [cuda, default {cand}]",
                        thr_s=thr(mc.execute), floor_s=floor, rel_err=e, bound=mc._direct is not None,
                        plan=repr(mc._state.plan))
                except Exception as exc:  # noqa: BLE001
                    print("stencil exec", name, label, cand, repr(exc), flush=True)
                finally:
                    setattr(plan_mod, key, saved[key])
            # auto: which backend, its estimates, its execute
            got = guard(lambda: {"mm": st.Matmul(A, x)})
            if "mm" in got:
                ma = got["mm"]
                tab = ma.plan()
                chosen = tab.chosen.backend if tab.chosen is not None else None
                offers = {r.backend: r.seconds for r in tab.offers}
                e = err(ma.execute())
                row(case="stencil", dtype=name, fmt=label, impl=f"Matmul.execute {label} [auto]", thr_s=thr(ma.execute),
                    floor_s=floor, rel_err=e, chosen=chosen, estimates=offers, bound=ma._direct is not None)
            for backend in ("torch", "cupy"):
                got = guard(lambda backend=backend: {"mm": st.Matmul(A, x, backend=backend)})
                if "mm" not in got:
                    rows.append({"case": "stencil", "dtype": name, "fmt": label, "impl": f"Matmul.execute {label} [{backend}]",
                                 "error": got.get("error")})
                    continue
                mb = got["mm"]
                r = guard(lambda mb=mb: {"e": err(mb.execute()), "t": thr(mb.execute, 50, 2)})
                if "t" in r:
                    row(case="stencil", dtype=name, fmt=label, impl=f"Matmul.execute {label} [{backend}]", thr_s=r["t"],
                        floor_s=floor, rel_err=r["e"])
                else:
                    rows.append({"case": "stencil", "dtype": name, "fmt": label, "impl": f"Matmul.execute {label} [{backend}]",
                                 "error": r.get("error")})
        from sparsetorch_cuda.cost import traffic

        nb = traffic("csr", m=n, n=n, nnz=int(col.numel()), k=1, vs=vs, isz=4, slots=int(col.numel()))
        kt = B.graph_time(lambda: T @ x)
        row(case="stencil", dtype=name, fmt="CSR int32", impl="torch CSR int32 mv (kernel)", kernel_s=kt, floor_s=nb / bw,
            fraction_of_floor=nb / bw / kt, rel_err=err(T @ x))
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--prefix", default="cuda_kernels_h200_s8_spmv")
    ap.add_argument("--m", type=int, default=114)
    ap.add_argument("--dtypes", default="float64,float32")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    bw = copy_bandwidth()["bytes_per_s"]
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    doc: dict[str, Any] = bench_doc(
        "cuda plugin session 8: stencil SpMV (ELL, COO, DIA, CSR): kernel variants, Matmul.execute, auto choice",
        "plugins/cuda_kernels/benchmarks/bench_s8_spmv.py", sys.argv[1:], args.commit, bw,
        ["kernel_s = 20 calls in one CUDA graph, replayed, median of 10, / 20",
        "thr_s = N calls of Matmul.execute back to back, one synchronize, wall / N, best of 5; call_s = median "
        "per-call CUDA events", "floor_s = bytes / copy bandwidth (ELL: slots * (value + 4) + X + Y)"])
    path = Path(args.out) / f"{args.prefix}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    doc["stencil"] = case_stencil(args.m, bw, dtypes)
    doc["wall_seconds"] = time.perf_counter() - t0
    path.write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {path} in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

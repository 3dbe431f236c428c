"""Session 7b: host time of ``Matmul.execute``, and the stencil SpMV kernels, in one run.

    python plugins/cuda_kernels/benchmarks/bench_s7b.py --out DIR [--cases host,stencil]

- ``host``: CPU time per call of many calls back to back (``thr``: N calls, one synchronize, wall
  time / N, best of 5) on a tiny CSR (1000 rows, float32, int32, a vector): ``Matmul.execute``
  through the bound launch (``plan.bind``, the direct path) and through the general path (the
  autograd Function, ``plan.apply``'s replay) in the same run; with ``c`` and ``beta=0`` (written
  in place); the torch and cupy backends; the pieces: the core's launch unit (``t.add_(1)``),
  output allocations, the bound launch alone, ``cuLaunchKernel`` through cuda.bindings and
  through ctypes with the same argument block, the stream query.
- ``stencil``: the 114^3 7-point stencil, float64 and float32: kernel time (20 calls captured in
  a CUDA graph, replayed, median of 10) of the CSR int32 and DIA kernel variants, DIA "p" kernels
  at 128 and 256 threads, torch CSR ``mv``; ``Matmul.execute`` back to back (thr) and per call
  (CUDA events), direct and general path; bytes floor = bytes / copy bandwidth of this run.
"""

from __future__ import annotations

import argparse
import ctypes
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
from sparsetorch.format import CSR, DIA  # noqa: E402

import bench_cuda_kernels as B  # noqa: E402
from common import bench_doc, copy_bandwidth, guard, stencil3d_csr, time_cuda, thr as _thr  # noqa: E402


def thr(fn: Callable[[], Any], calls: int = 1000, reps: int = 5) -> float:
    """:func:`common.thr` with this benchmark's default number of calls."""
    return _thr(fn, calls, reps)


def _general(mm: st.Matmul) -> st.Matmul:
    """``mm`` pinned to the general path (the autograd Function and plan.apply) for A/B timing."""
    mm._direct, mm._direct_tried = None, True
    return mm


def case_host() -> dict:
    from sparsetorch_cuda.launch import _stream, raw_stream

    n = 1000
    dev = torch.device("cuda", 0)
    D = torch.diag(torch.full((n,), 2.0, device="cuda")) + torch.diag(torch.ones(n - 1, device="cuda"), 1)
    A = st.SparseTensor.from_dense(D).convert(CSR, index_dtype=torch.int32)
    x = torch.ones(n, device="cuda")
    x2 = x[:, None]
    ref = D @ x
    out: dict[str, Any] = {}
    t = torch.ones(8, device="cuda")
    out["launch_unit"] = thr(lambda: t.add_(1))
    out["torch_empty_tuple_device"] = thr(lambda: torch.empty((n,), dtype=torch.float32, device=dev))
    out["torch_empty_int_device"] = thr(lambda: torch.empty(n, dtype=torch.float32, device=0))
    out["new_empty"] = thr(lambda: x.new_empty((n,)))
    out["empty_like"] = thr(lambda: torch.empty_like(x))
    tpl = x.new_empty((1,)).expand(n)
    out["empty_like_template"] = thr(lambda: torch.empty_like(tpl))
    out["raw_stream"] = thr(lambda: raw_stream(0))
    out["raw_stream_and_object"] = thr(lambda: _stream(raw_stream(0)))
    plan = B._plan(A)
    out["plan_apply"] = thr(lambda: plan.apply(x2))
    bound = plan.bind(A.values, x2)
    out["bound_kernel"] = bound.name if bound is not None else None
    Y = torch.empty((n, 1), device="cuda")
    if bound is not None:
        out["bound_launch_only"] = thr(lambda: bound(x2, Y))
        torch.cuda.synchronize()
        assert torch.allclose(Y[:, 0], ref), "bound launch"
        cu = bound._cu
        s = _stream(raw_stream(0))
        args = (bound._fn, bound._gx, bound._gy, 1, bound._block, 1, 1, bound._shared, s, bound._addr, 0)
        out["cuLaunchKernel_bindings"] = thr(lambda: cu.cuLaunchKernel(*args))
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            f = lib.cuLaunchKernel
            f.restype = ctypes.c_int
            f.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            cargs = (int(bound._fn), bound._gx, bound._gy, 1, bound._block, 1, 1, bound._shared, int(s), bound._addr, None)
            assert f(*cargs) == 0
            out["cuLaunchKernel_ctypes"] = thr(lambda: f(*cargs))
            f2 = ctypes.CDLL("libcuda.so.1").cuLaunchKernel  # no argtypes: arguments made as ctypes objects once
            f2.restype = ctypes.c_int
            u = ctypes.c_uint
            pre = (ctypes.c_void_p(int(bound._fn)), u(bound._gx), u(bound._gy), u(1), u(bound._block), u(1), u(1),
                   u(bound._shared), ctypes.c_void_p(int(s)), ctypes.c_void_p(bound._addr), None)
            assert f2(*pre) == 0
            out["cuLaunchKernel_ctypes_prebuilt"] = thr(lambda: f2(*pre))
        except Exception as exc:  # noqa: BLE001 - a measurement only
            out["cuLaunchKernel_ctypes_error"] = repr(exc)
    for backend in ("cuda", "torch", "cupy"):
        got = guard(lambda backend=backend: {"mm": st.Matmul(A, x, backend=backend)})
        if "mm" not in got:
            out[f"matmul_execute_{backend}_error"] = got.get("error")
            continue
        mm = got["mm"]
        mm.plan()
        y = mm.execute()
        assert torch.allclose(y, ref), backend
        if backend == "cuda":
            out["direct_bound"] = mm._direct is not None
            out["matmul_execute_cuda_direct"] = thr(mm.execute)
            out["matmul_execute_cuda_general"] = thr(_general(mm).execute)
        else:
            out[f"matmul_execute_{backend}"] = thr(mm.execute)
            if backend == "torch":  # session 17: the torch plan binds (torch's CSR mv with out=)
                out["direct_bound_torch"] = mm._direct is not None
                out["matmul_execute_torch_general"] = thr(_general(mm).execute)
    c = torch.empty(n, device="cuda")
    mc = st.Matmul(A, x, c, beta=0, backend="cuda")
    assert mc.execute() is c and torch.allclose(c, ref)
    out["matmul_execute_cuda_direct_into_c"] = thr(mc.execute)
    out["matmul_execute_cuda_general_into_c"] = thr(_general(mc).execute)
    import sparsetorch_cuda.launch as launch_mod

    launch_mod.BOUND_LAUNCH = "ctypes"  # the bound launch through ctypes (arguments made once per stream)
    try:
        m2 = st.Matmul(A, x, backend="cuda")
        assert torch.allclose(m2.execute(), ref) and m2._direct is not None
        out["matmul_execute_cuda_direct_ctypes"] = thr(m2.execute)
        c2 = torch.empty(n, device="cuda")
        mc2 = st.Matmul(A, x, c2, beta=0, backend="cuda")
        assert mc2.execute() is c2 and torch.allclose(c2, ref)
        out["matmul_execute_cuda_direct_into_c_ctypes"] = thr(mc2.execute)
        b2 = plan.bind(A.values, x2)
        out["bound_launch_only_ctypes"] = thr(lambda: b2(x2, Y))
    finally:
        launch_mod.BOUND_LAUNCH = "bindings"
    out["st_matmul_one_shot_cuda"] = thr(lambda: st.matmul(A, x, backend="cuda"))
    out["st_matmul_one_shot_torch"] = thr(lambda: st.matmul(A, x, backend="torch"))
    tcsr = torch.sparse_csr_tensor(A.pos(1), A.crd(1), A.values, size=A.shape)
    out["torch_csr_matmul_bare"] = thr(lambda: tcsr @ x)
    out["kernel_graph"] = B.graph_time(lambda: plan.apply(x2))
    out["tiny_kernel_graph"] = B.graph_time(lambda: t.add_(1))
    for k, v in out.items():
        if isinstance(v, float):
            print(f"host {k:40s} {v * 1e6:8.2f} us", flush=True)
        else:
            print(f"host {k:40s} {v}", flush=True)
    return out


def case_stencil(m: int, bw: float, variants: dict[str, tuple[str, ...]]) -> list[dict]:
    import sparsetorch_cuda.plan as plan_mod
    from sparsetorch_cuda.cost import traffic

    n = m ** 3
    (crow, col, v64), _ = stencil3d_csr(m)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows: list[dict] = []
    base_block, base_na = plan_mod.DIA_BLOCK, plan_mod.DIA_BLOCK_NA

    def row(**kw: Any) -> None:
        rows.append(kw)
        t = kw.get("kernel_s") or kw.get("thr_s") or kw.get("call_s") or float("nan")
        print(f"stencil {kw['dtype']:8s} {kw['impl']:52s} {t * 1e6:8.2f} us  floor {kw.get('floor_s', 0) * 1e6:6.1f}"
              f"  err {kw.get('rel_err', float('nan')):.1e}", flush=True)

    for dtype in (torch.float64, torch.float32):
        name = str(dtype).replace("torch.", "")
        vs = torch.empty((), dtype=dtype).element_size()
        x = torch.randn(n, dtype=torch.float64, device="cuda", generator=g).to(dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = torch.sparse_csr_tensor(crow, col, v64, (n, n)) @ x.double()
            T = torch.sparse_csr_tensor(crow.int(), col.int(), v64.to(dtype), (n, n))
        A64 = st.SparseTensor(CSR, (n, n), [None, crow], [None, col], v64.to(dtype), check=False)
        mats = {"CSR int32": A64.convert(CSR, index_dtype=torch.int32), "DIA": A64.convert(DIA)}
        x2 = x[:, None]

        def err(y: torch.Tensor) -> float:
            y = y.double().reshape(ref.shape)
            return float(torch.linalg.vector_norm(y - ref) / torch.linalg.vector_norm(ref))

        for label, A in mats.items():
            kind = label.split()[0].lower()
            nb = traffic(kind, m=n, n=n, nnz=int(A.nse), k=1, vs=vs, isz=4, slots=int(A.values.shape[-1]))
            floor = nb / bw
            default = B._plan(A).variant
            for spec in variants[kind]:
                variant, _, threads = spec.partition("/")
                plan_mod.DIA_BLOCK = int(threads) if threads else base_block
                plan_mod.DIA_BLOCK_NA = int(threads) if threads else base_block
                try:
                    p = B._plan(A, variant)
                    e = err(p.apply(x2))
                    kt = B.graph_time(lambda p=p: p.apply(x2))
                    row(case="stencil", dtype=name, impl=f"cuda plan.apply {label} [{spec}]", variant=spec, kernel_s=kt,
                        floor_s=floor, fraction_of_floor=floor / kt, rel_err=e, bytes=nb, default=spec == default)
                except Exception as exc:  # noqa: BLE001 - record and go on
                    rows.append({"case": "stencil", "dtype": name, "impl": f"cuda plan.apply {label} [{spec}]",
                                 "error": repr(exc)})
                    print("stencil", name, label, spec, repr(exc), flush=True)
                finally:
                    plan_mod.DIA_BLOCK, plan_mod.DIA_BLOCK_NA = base_block, base_na
            mm = st.Matmul(A, x, backend="cuda")
            mm.plan()
            e = err(mm.execute())
            bound = mm._direct is not None
            row(case="stencil", dtype=name, impl=f"Matmul.execute {label} [cuda, direct]", thr_s=thr(mm.execute, 200),
                call_s=time_cuda(mm.execute)["median_s"], floor_s=floor, rel_err=e, bound=bound)
            _general(mm)
            row(case="stencil", dtype=name, impl=f"Matmul.execute {label} [cuda, general]", thr_s=thr(mm.execute, 200),
                call_s=time_cuda(mm.execute)["median_s"], floor_s=floor, rel_err=err(mm.execute()))
        nb = traffic("csr", m=n, n=n, nnz=int(col.numel()), k=1, vs=vs, isz=4, slots=int(col.numel()))
        kt = B.graph_time(lambda: T @ x)
        row(case="stencil", dtype=name, impl="torch CSR int32 mv", kernel_s=kt, floor_s=nb / bw, fraction_of_floor=nb / bw / kt,
            rel_err=err(T @ x))
        del mats, A64
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--prefix", default="cuda_kernels_h200_s7b")
    ap.add_argument("--cases", default="host,stencil")
    ap.add_argument("--m", type=int, default=114)
    ap.add_argument("--csr", default="streamcs,stream", help="CSR variants of the stencil case")
    ap.add_argument("--dia", default="p1,p1/128,p1pf,p1na/256,p1na/128", help="DIA variants[/threads]")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    bw = copy_bandwidth()["bytes_per_s"]
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    doc: dict[str, Any] = bench_doc(
        "cuda plugin session 7b: Matmul.execute host time (direct path vs general), stencil SpMV variants",
        "plugins/cuda_kernels/benchmarks/bench_s7b.py", sys.argv[1:], args.commit, bw,
        ["host: thr = N calls back to back, one synchronize, wall / N, best of 5 (seconds)",
        "stencil: kernel_s = 20 calls in one CUDA graph, replayed, median of 10, / 20; thr_s as host; "
        "call_s = median per-call CUDA events"])
    path = Path(args.out) / f"{args.prefix}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    for case in args.cases.split(","):
        print(f"== {case}", flush=True)
        if case == "host":
            doc["host"] = guard(case_host)
        elif case == "stencil":
            doc["stencil"] = case_stencil(args.m, bw, {"csr": tuple(args.csr.split(",")), "dia": tuple(args.dia.split(","))})
        doc["wall_seconds"] = time.perf_counter() - t0
        path.write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {path} in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

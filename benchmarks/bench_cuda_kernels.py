"""The cuda backend's kernels (plugins/cuda_kernels) side by side with torch, CuPy and dense
cuBLAS, in one run on one GPU.

    python benchmarks/bench_cuda_kernels.py --out DIR [--fit PATH] [--quick]

Cases:

- ``stencil``: SpMV on the 3-D 7-point stencil of 114^3 = 1.48M rows (the GPU suite's matrix),
  float64 and float32: this backend's CSR (int32 and int64, vector and load-balanced kernels),
  DIA and ELL through ``plan.apply`` (every CSR and DIA kernel variant) and ``Matmul.execute``, against torch CSR ``mv``,
  sparsetorch's torch and auto choices, and CuPy CSR/DIA ``A @ x``.
- ``lowsparsity``: MACKO's set-up, 8192 x 8192 at 50 % and 10 % density, float16 / bfloat16 /
  float32: bit-packed DELTA(4) (and DELTA(8) at 10 %; the default "packed" kernel and the earlier
  "groups" one), this backend's CSR, against dense cuBLAS GEMV and GEMM (k = 8) and torch CSR.
- ``nm``: NM(2,4) at 8192 x 8192 (a random 2:4 pattern), float16 / bfloat16, against dense GEMV.
- ``skewed``: 1M rows of 4 entries plus 4 rows of 200k: vector against load-balanced CSR and torch.
- ``sddmm``: the backward's value gradient on the stencil (k = 1 and 8) against torch gathers.
- ``host``: per-call host time of ``plan.apply`` and of ``Matmul.execute`` on a tiny matrix.

Each row: the median of per-call CUDA-event timings (``call_s``, what a caller sees) and the
kernel's device time (``kernel_s``: 20 calls captured in one CUDA graph, replayed, divided by
20), the error against a float64 reference, the bytes the format must move and the floor (bytes
/ copy bandwidth measured in this run). ``--fit PATH`` writes the cost model's measurements
(per-family efficiencies, host time, rows) for sparsetorch_cuda/cost_h200.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gpu"))

import torch  # noqa: E402

import sparsetorch as st  # noqa: E402
from sparsetorch.format import CSR, DELTA, DIA, ELL  # noqa: E402

from common import copy_bandwidth, guard, peer, stencil3d_csr, time_cuda  # noqa: E402

GRAPH_CALLS = 20


def graph_time(fn: Callable[[], Any], reps: int = 10, before: Callable[[], Any] | None = None) -> float:
    """Device seconds of one ``fn()``: GRAPH_CALLS calls captured in a CUDA graph, replayed; ``before`` (if given)
    is queued ahead of each timed replay, outside the timed events (gpu/s14/clock_probe.py: work that keeps the
    SM clock up)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(GRAPH_CALLS):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3 / GRAPH_CALLS)
    del g
    return statistics.median(times)


def cold_copies(nbytes: float) -> int:
    """How many copies of an operand of ``nbytes`` hold three times the GPU's L2 (2 to GRAPH_CALLS): timed
    cycling through them, no call finds its operand in L2 from the call before (session 14: the H200's L2 is
    60 MB, so an 8192^2 matrix at 10 % or a 4096^2 fp16 weight stayed in it between the calls of one graph)."""
    l2 = int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 50 << 20))
    return min(GRAPH_CALLS, max(2, -(-3 * l2 // max(int(nbytes), 1))))


def cycle(fns: list[Callable[[], Any]]) -> Callable[[], Any]:
    """One callable that runs ``fns[0]``, ``fns[1]``, ... in turn, one per call."""
    state = {"i": 0}

    def fn() -> Any:
        f = fns[state["i"] % len(fns)]
        state["i"] += 1
        return f()

    return fn


def cold_graph_time(fns: list[Callable[[], Any]], reps: int = 10) -> float:
    """:func:`graph_time` of calls cycling through ``fns`` (each on its own copy of the operands; each run once
    first, outside the capture, so plans record their launches there)."""
    for f in fns:
        f()
    return graph_time(cycle(fns), reps)


class Table:
    def __init__(self, bw: float, reps: int) -> None:
        self.bw, self.reps, self.rows = bw, reps, []

    def record(self, case: str, impl: str, fn: Callable[[], Any], result: Callable[[], torch.Tensor] | None,
               ref: torch.Tensor | None, nbytes: float, *, family: str | None = None, graph: bool = True,
               cold: Callable[[], Callable[[], Any]] | None = None, **extra: Any) -> dict:
        """One row; ``cold``: a factory of ``fn`` on fresh copies of its operands, for the ``kernel_cold_s`` column
        (:func:`cold_graph_time` over :func:`cold_copies` of them)."""

        def measure() -> dict:
            err = None
            if result is not None and ref is not None:
                y = result().double().reshape(ref.shape)
                err = float(torch.linalg.vector_norm(y - ref) / torch.linalg.vector_norm(ref))
            t = time_cuda(fn, reps=self.reps)
            kt = guard(lambda: {"k": graph_time(fn)}).get("k") if graph else None
            floor = nbytes / self.bw
            out = {"call_s": t["median_s"], "kernel_s": kt, "rel_err": err, "bytes": nbytes, "floor_s": floor,
                   "fraction_of_floor": floor / (kt or t["median_s"])}
            if cold is not None and graph:
                r = cold_copies(nbytes)
                got = guard(lambda: {"k": cold_graph_time([fn] + [cold() for _ in range(r - 1)])})
                out["kernel_cold_s"], out["cold_copies"] = got.get("k"), r
            return out

        row = {"case": case, "impl": impl, "family": family, **extra, **guard(measure)}
        self.rows.append(row)
        if "call_s" in row:
            kt = row["kernel_s"]
            kc = row.get("kernel_cold_s")
            print(f"{case:12s} {impl:58s} call {row['call_s'] * 1e6:8.1f} us  kernel "
                  f"{(kt * 1e6 if kt else float('nan')):8.1f} us{f' (cold {kc * 1e6:.1f})' if kc else ''}  "
                  f"floor {row['floor_s'] * 1e6:7.1f} us "
                  f"({row['fraction_of_floor']:.2f})  err {row['rel_err'] if row['rel_err'] is not None else float('nan'):.1e}",
                  flush=True)
        else:
            print(f"{case:12s} {impl:58s} {row.get('error')}", flush=True)
        return row


def _fresh_product(W: torch.Tensor, X: torch.Tensor) -> Callable[[], torch.Tensor]:
    """``W @ X`` on new copies of both (a cold-column copy, Table.record)."""
    W2, X2 = W.clone(), X.clone()
    return lambda: W2 @ X2


def _plan(A, variant=None):
    from sparsetorch_cuda.plan import CudaSpmmPlan

    p = CudaSpmmPlan(A, variant=variant)
    p.set_values(A.values)
    return p


def _csr_bytes(n, m, nnz, vs, isz, k=1):
    return k * (nnz * (vs + isz) + (m + 1) * isz) + (m + n) * k * vs


def case_stencil(tab: Table, m: int) -> None:
    from sparsetorch_cuda.cost import traffic

    n = m ** 3
    (crow, col, v64), (dia64, offsets) = stencil3d_csr(m)
    nnz = int(col.numel())
    cp, _ = peer("cupy")
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.float64, torch.float32):
        name = str(dtype).replace("torch.", "")
        vs = torch.empty((), dtype=dtype).element_size()
        x = torch.randn(n, dtype=torch.float64, device="cuda", generator=g).to(dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = torch.sparse_csr_tensor(crow, col, v64, (n, n)) @ x.double()
        A64 = st.SparseTensor(CSR, (n, n), [None, crow], [None, col], v64.to(dtype), check=False)
        mats = {"CSR int64": A64, "CSR int32": A64.convert(CSR, index_dtype=torch.int32), "DIA": A64.convert(DIA),
                "ELL": A64.convert(ELL)}
        x2 = x[:, None]
        case = f"stencil {name}"
        for label, A in mats.items():
            kind = label.split()[0].lower()
            isz = 4 if "int32" in label else 8
            variants = {"csr": ("stream", "stream4", "vector", "sell"), "dia": ("rows2", "rows1", "p1", "p2", "p4", "classic")}.get(kind, (None,))
            default = _plan(A).variant if kind in ("csr", "dia") else None
            for variant in variants:
                p = _plan(A, variant)
                # only what the plan runs by default feeds the cost model's fit
                if kind == "csr":
                    fam = f"csr_{variant}" if variant == default else None
                elif kind == "dia":
                    fam = "dia" if variant == default else None
                else:
                    fam = "ell"
                nb = traffic(kind, m=n, n=n, nnz=int(A.nse), k=1, vs=vs, isz=isz, slots=int(A.values.shape[-1]))
                tab.record(case, f"cuda plan.apply {label}" + (f" [{variant}]" if variant else ""), lambda p=p: p.apply(x2),
                           lambda p=p: p.apply(x2), ref, nb, family=fam, dtype=name, format=label)
            for backend in (("cuda", "torch", None) if label in ("CSR int32", "DIA") else ("cuda",)):
                got = guard(lambda A=A, backend=backend: {"mm": st.Matmul(A, x, backend=backend)})
                if "mm" not in got:
                    tab.rows.append({"case": case, "impl": f"Matmul {label} [{backend}]", **got})
                    continue
                mm = got["mm"]
                table = mm.plan()
                chosen = f"{table.chosen.backend}/{table.chosen.method}" if table.chosen else None
                nb = traffic(kind, m=n, n=n, nnz=int(A.nse), k=1, vs=vs, isz=isz, slots=int(A.values.shape[-1]))
                tab.record(case, f"sparsetorch Matmul.execute {label} [{backend or 'auto'}]", mm.execute, mm.execute, ref, nb,
                           graph=False, dtype=name, format=label, choice=chosen)
        # peers
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t32 = torch.sparse_csr_tensor(crow.to(torch.int32), col.to(torch.int32), v64.to(dtype), (n, n))
        tab.record(case, "torch CSR int32 mv", lambda: torch.mv(t32, x), lambda: torch.mv(t32, x), ref,
                   _csr_bytes(n, n, nnz, vs, 4), graph=True, dtype=name, format="CSR int32")
        if cp is not None:
            import cupyx.scipy.sparse as csp

            xc = cp.from_dlpack(x)
            C = csp.csr_matrix((cp.from_dlpack(v64.to(dtype)), cp.from_dlpack(col.to(torch.int32)), cp.from_dlpack(crow.to(torch.int32))),
                               shape=(n, n))
            Dc = csp.dia_matrix((cp.from_dlpack(dia64.to(dtype)), cp.from_dlpack(offsets.to(torch.int32))), shape=(n, n))
            tab.record(case, "cupy CSR int32 A @ x", lambda: C @ xc, lambda: torch.from_dlpack(C @ xc), ref,
                       _csr_bytes(n, n, nnz, vs, 4), graph=False, dtype=name, format="CSR int32")
            tab.record(case, "cupy DIA A @ x", lambda: Dc @ xc, lambda: torch.from_dlpack(Dc @ xc), ref,
                       7 * n * vs + 2 * n * vs, graph=False, dtype=name, format="DIA")
        del mats, A64
        torch.cuda.empty_cache()


def _random_mask(m: int, n: int, density: float, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.rand(m, n, device="cuda", generator=g) < density


def _nm_mask(m: int, n: int, seed: int) -> torch.Tensor:
    """A random 2:4 pattern: 2 of every 4 consecutive columns of a row."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    score = torch.rand(m, n // 4, 4, device="cuda", generator=g)
    keep = torch.zeros(m, n // 4, 4, dtype=torch.bool, device="cuda")
    keep.scatter_(-1, score.topk(2, dim=-1).indices, True)
    return keep.reshape(m, n)


def case_nm(tab: Table, size: int, dtypes, ks=(1,)) -> None:
    """NM(2,4) at 8192^2 (50 % density by construction) against dense cuBLAS GEMV."""
    from sparsetorch.format import NM

    from sparsetorch_cuda.cost import traffic

    g = torch.Generator(device="cuda").manual_seed(5)
    mask = _nm_mask(size, size, 6)
    W64 = torch.randn(size, size, device="cuda", dtype=torch.float64, generator=g) * mask
    for dtype in dtypes:
        name = str(dtype).replace("torch.", "")
        vs = torch.empty((), dtype=dtype).element_size()
        W = W64.to(dtype)
        case = f"{size}^2 2:4 {name}"
        S = st.SparseTensor.from_dense(W, mask=mask)
        A = S.convert(NM(2, 4), index_dtype=torch.int32)
        default = _plan(A).variant
        for k in ks:
            X = torch.randn(size, k, device="cuda", dtype=torch.float64, generator=g).to(dtype)
            ref = W.double() @ X.double()
            tab.record(case, f"dense cuBLAS {'GEMV' if k == 1 else 'GEMM'} k={k}", lambda X=X, W=W: W @ X, lambda X=X, W=W: W @ X,
                       ref, size * size * vs + 2 * size * k * vs, dtype=name, k=k, density=0.5)
            nb = traffic("nm", m=size, n=size, nnz=int(A.nse), k=k, vs=vs, isz=4, slots=int(A.values.shape[-1]), bits=2)
            from sparsetorch_cuda.layout import NM_VARIANTS

            for variant in NM_VARIANTS:
                p = _plan(A, variant)
                tab.record(case, f"cuda plan.apply NM(2,4) [{variant}] k={k}", lambda p=p, X=X: p.apply(X), lambda p=p, X=X: p.apply(X),
                           ref, nb, family="nm" if k == 1 and variant == default else None, dtype=name, k=k, density=0.5,
                           format="NM(2,4)", variant=variant, default=variant == default)
        del A, p, S, W
        torch.cuda.empty_cache()


def case_lowsparsity(tab: Table, size: int, dtypes, ks=(1, 8)) -> None:
    from sparsetorch_cuda.cost import csr16_applies, traffic

    g = torch.Generator(device="cuda").manual_seed(1)
    for density in (0.5, 0.1):
        mask = _random_mask(size, size, density, 2)
        W64 = torch.randn(size, size, device="cuda", dtype=torch.float64, generator=g) * mask
        for dtype in dtypes:
            name = str(dtype).replace("torch.", "")
            vs = torch.empty((), dtype=dtype).element_size()
            W = W64.to(dtype)
            case = f"{size}^2 {int(density * 100)}% {name}"
            for k in ks:
                X = torch.randn(size, k, device="cuda", dtype=torch.float64, generator=g).to(dtype)
                ref = W.double() @ X.double()
                tab.record(case, f"dense cuBLAS {'GEMV' if k == 1 else 'GEMM'} k={k}", lambda X=X: W @ X, lambda X=X: W @ X, ref,
                           size * size * vs + 2 * size * k * vs, dtype=name, k=k, density=density,
                           cold=lambda W=W, X=X: _fresh_product(W, X))
                S = st.SparseTensor.from_dense(W, mask=mask)
                fmts = [("DELTA(4)", DELTA(4))] + ([("DELTA(8)", DELTA(8))] if density < 0.3 else []) + [("CSR int32", CSR)]
                extra = [("DELTA(4) [packed2]", DELTA(4)), ("DELTA(4) [groups]", DELTA(4))]
                for label, fmt in fmts + extra:
                    A = S.convert(fmt, index_dtype=torch.int32)
                    p = _plan(A, label.split("[")[1][:-1] if "[" in label else None)
                    kind = p.kind
                    # half-precision CSR of one right-hand side runs the plan's csr16 kernel (uint16 columns)
                    c16 = csr16_applies(kind, dtype, size, size, int(A.nse), k)
                    nb = traffic(kind, m=size, n=size, nnz=int(A.nse), k=k, vs=vs, isz=4, bits=getattr(p, "bits", None),
                                 variant="csr16" if c16 else "vector")
                    fam = {"delta": "delta", "csr": "csr_vector"}[kind] if not (kind == "csr" and k >= 16) else "csr_cols"
                    fam = "csr16" if c16 else fam
                    if "[" in label:
                        fam = None  # a variant for comparison, not what the plan runs by default
                    var = label.split("[")[1][:-1] if "[" in label else None

                    def fresh(A=A, X=X, var=var):  # the plan on copies of the matrix and X (the cold column)
                        q, X2 = _plan(A.clone(), var), X.clone()
                        return lambda: q.apply(X2)

                    tab.record(case, f"cuda plan.apply {label} k={k}", lambda p=p, X=X: p.apply(X), lambda p=p, X=X: p.apply(X),
                               ref, nb, family=fam, dtype=name, k=k, density=density, format=label,
                               stored=int(A.nse), padding=int(A.nse) - int(mask.sum()), cold=fresh if fam else None)
                    del A, p
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    got = guard(lambda: {"t": W.to_sparse_csr()})
                if "t" in got:
                    T = got["t"]
                    tab.record(case, f"torch CSR {'mv' if k == 1 else 'mm'} k={k}", lambda T=T, X=X: T @ X, lambda T=T, X=X: T @ X, ref,
                               _csr_bytes(size, size, int(mask.sum()), vs, 8, k), dtype=name, k=k, density=density)
                    del T
                else:
                    tab.rows.append({"case": case, "impl": f"torch CSR k={k}", **got})
                del S
            W = None
            torch.cuda.empty_cache()
        del W64, mask


def case_skewed(tab: Table, rows: int, long_len: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(3)
    n = rows
    lengths = torch.full((rows,), 4, dtype=torch.int64, device="cuda")
    lengths[torch.randperm(rows, device="cuda", generator=g)[:4]] = long_len
    crow = torch.zeros(rows + 1, dtype=torch.int64, device="cuda")
    crow[1:] = torch.cumsum(lengths, 0)
    nnz = int(crow[-1])
    # sorted, distinct columns per row: row r, entry t -> (r * 7919 + t * stride) mod n, then sorted
    r = torch.repeat_interleave(torch.arange(rows, device="cuda"), lengths)
    t = torch.arange(nnz, device="cuda") - crow[:-1][r]
    stride = torch.where(lengths[r] > 4, 1, n // 8)
    col = (r * 7919 + t * stride) % n
    col = torch.sort(col + r * n)[0] - r * n
    vals = torch.randn(nnz, dtype=torch.float64, device="cuda", generator=g).float()
    A = st.SparseTensor(CSR, (rows, n), [None, crow.to(torch.int32)], [None, col.to(torch.int32)], vals)
    x = torch.randn(n, 1, device="cuda", generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        T = torch.sparse_csr_tensor(crow.to(torch.int32), col.to(torch.int32), vals, (rows, n))
        ref = torch.sparse_csr_tensor(crow, col, vals.double(), (rows, n)) @ x.double()
    nb = _csr_bytes(n, rows, nnz, 4, 4)
    default = _plan(A).variant
    for variant in ("vector", "balanced"):
        p = _plan(A, variant)
        tab.record("skewed f32", f"cuda plan.apply CSR int32 [{variant}]", lambda p=p: p.apply(x), lambda p=p: p.apply(x), ref, nb,
                   family=f"csr_{variant}" if variant == default else None, dtype="float32", chosen_by_default=default)
    tab.record("skewed f32", "torch CSR int32 mv", lambda: T @ x, lambda: T @ x, ref, nb, dtype="float32")


def case_sddmm(tab: Table, m: int) -> None:
    n = m ** 3
    (crow, col, v64), _ = stencil3d_csr(m)
    nnz = int(col.numel())
    A = st.SparseTensor(CSR, (n, n), [None, crow.to(torch.int32)], [None, col.to(torch.int32)], v64)
    p = _plan(A)
    rows = torch.repeat_interleave(torch.arange(n, device="cuda"), crow.diff())
    g = torch.Generator(device="cuda").manual_seed(4)
    for k in (1, 8):
        P = torch.randn(n, k, dtype=torch.float64, device="cuda", generator=g)
        Q = torch.randn(n, k, dtype=torch.float64, device="cuda", generator=g)
        ref = (P[rows] * Q[col]).sum(-1)
        nb = nnz * 8 + (n + 1) * 4 + nnz * 4 + 2 * n * k * 8
        tab.record("sddmm f64", f"cuda plan.sddmm CSR int32 k={k}", lambda P=P, Q=Q: p.sddmm(P, Q), lambda P=P, Q=Q: p.sddmm(P, Q),
                   ref, nb, dtype="float64", k=k)
        tab.record("sddmm f64", f"torch gathers (P[rows] * Q[cols]).sum k={k}", lambda P=P, Q=Q: (P[rows] * Q[col]).sum(-1),
                   lambda P=P, Q=Q: (P[rows] * Q[col]).sum(-1), ref, nb, dtype="float64", k=k)


def case_host(tab: Table) -> dict:
    n = 1000
    D = torch.diag(torch.full((n,), 2.0, device="cuda")) + torch.diag(torch.ones(n - 1, device="cuda"), 1)
    A = st.SparseTensor.from_dense(D).convert(CSR, index_dtype=torch.int32)
    x = torch.ones(n, device="cuda")
    p = _plan(A)
    x2 = x[:, None]
    ref = (D.double() @ x.double())
    a = tab.record("host", "cuda plan.apply tiny CSR", lambda: p.apply(x2), lambda: p.apply(x2), ref, 0.0, dtype="float32")
    mm = st.Matmul(A, x, backend="cuda")
    mm.plan()
    b = tab.record("host", "sparsetorch Matmul.execute tiny CSR [cuda]", mm.execute, mm.execute, ref, 0.0, graph=False, dtype="float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        T = D.to_sparse_csr()
    c = tab.record("host", "torch CSR mv tiny", lambda: T @ x, lambda: T @ x, ref, 0.0, dtype="float32")
    return {"plan_apply_host_s": a.get("call_s", 0) - (a.get("kernel_s") or 0),
            "matmul_execute_s": b.get("call_s"), "torch_mv_s": c.get("call_s")}


def fit(rows: list[dict], bw: float, host: float) -> dict:
    use = [r for r in rows if r.get("family") and r.get("kernel_s") and r.get("bytes") and (r.get("rel_err") or 0) < 0.05]
    effs: dict[str, list[float]] = {}
    for r in use:
        effs.setdefault(r["family"], []).append(r["bytes"] / (r["kernel_s"] * bw))
    return {"efficiency": {f: statistics.median(v) for f, v in effs.items()}, "host_s": host,
            "copy_bandwidth_bytes_per_s": bw,
            "rows": [{k: r[k] for k in ("case", "impl", "family", "bytes", "kernel_s", "call_s")} for r in use]}


def versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda (torch)": torch.version.cuda,
           "sparsetorch": st.__version__}
    for mod in ("sparsetorch_cuda", "cupy", "cuda.bindings"):
        out[mod] = peer(mod)[1]
    try:
        from sparsetorch_cuda.compile import nvrtc_version

        out["nvrtc"] = ".".join(map(str, nvrtc_version()))
    except Exception as exc:  # noqa: BLE001
        out["nvrtc"] = f"? ({exc})"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--prefix", default="cuda_kernels_h200")
    ap.add_argument("--fit", default=None, help="also write the cost model's measurements (cost_h200.json) here")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cases", default="host,stencil,lowsparsity,nm,skewed,sddmm")
    ap.add_argument("--ks", default="1,8", help="right-hand-side counts of the low-sparsity case")
    ap.add_argument("--low-dtypes", default="float16,bfloat16,float32", help="value types of the low-sparsity case")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw['bytes_per_s'] / 1e12:.2f} TB/s", flush=True)
    tab = Table(bw["bytes_per_s"], args.reps)
    p = torch.cuda.get_device_properties(0)
    doc: dict[str, Any] = {"bench": "cuda_kernels", "command": " ".join(["python", "benchmarks/bench_cuda_kernels.py", *sys.argv[1:]]),
                           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                           "machine": {"gpu": torch.cuda.get_device_name(0), "compute_capability": f"{p.major}.{p.minor}",
                                       "sm_count": p.multi_processor_count, "platform": platform.platform()},
                           "versions": versions(), "copy_bandwidth": bw, "quick": args.quick,
                           "notes": ["call_s: median of per-call CUDA-event timings (host time counts when the GPU waits)",
                                     f"kernel_s: {GRAPH_CALLS} calls captured in one CUDA graph, replayed, median / {GRAPH_CALLS}",
                                     "floor_s: bytes the format must move / copy bandwidth of this run; fraction_of_floor = "
                                     "floor / kernel_s (call_s where no graph)"]}
    cases = args.cases.split(",")
    host = {}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{args.prefix}.json"
    for case in cases:
        t = time.perf_counter()
        print(f"== {case}", flush=True)
        if case == "host":
            host = guard(lambda: case_host(tab))
        elif case == "stencil":
            guard(lambda: case_stencil(tab, 40 if args.quick else 114) or {})
        elif case == "lowsparsity":
            ks = tuple(int(v) for v in args.ks.split(","))
            low = tuple(getattr(torch, d) for d in args.low_dtypes.split(","))
            guard(lambda: case_lowsparsity(tab, 1024 if args.quick else 8192, low, ks) or {})
        elif case == "nm":
            guard(lambda: case_nm(tab, 1024 if args.quick else 8192, (torch.float16, torch.bfloat16)) or {})
        elif case == "skewed":
            guard(lambda: case_skewed(tab, 20_000 if args.quick else 1_000_000, 5_000 if args.quick else 200_000) or {})
        elif case == "sddmm":
            guard(lambda: case_sddmm(tab, 40 if args.quick else 114) or {})
        print(f"   ({time.perf_counter() - t:.1f} s)", flush=True)
        doc["host"], doc["rows"] = host, tab.rows
        doc["wall_seconds"] = time.perf_counter() - t0
        path.write_text(json.dumps(doc, indent=1, default=str))
        torch.cuda.empty_cache()
    if args.fit:
        h = host.get("plan_apply_host_s") or 12e-6
        fitted = fit(tab.rows, bw["bytes_per_s"], max(h, 1e-6))
        fitted.update({"machine": doc["machine"], "versions": doc["versions"], "command": doc["command"], "date": doc["date"]})
        Path(args.fit).write_text(json.dumps(fitted, indent=1, default=str))
        print(f"wrote {args.fit}: efficiency {fitted['efficiency']}, host {fitted['host_s'] * 1e6:.1f} us", flush=True)
    print(f"wrote {path} in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

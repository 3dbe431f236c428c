"""Case 1: SpMV on the 3-D 7-point stencil of 114^3 = 1,481,544 rows (atmosmodl's shape).

Implementations, each timed by per-call CUDA events (median), checked against a float64
reference product, and compared with its format's bytes floor (bytes moved / measured copy
bandwidth): sparsetorch ``Matmul`` (plan once, ``execute`` per call) in CSR int32/int64, COO,
DIA and ELL with the auto choice and each backend pinned (torch, cupy, and the native kernels
plugin ``cuda`` when installed), plus the one-shot ``st.matmul``;
torch CSR (int32 and int64) and COO ``mv``; CuPy CSR/COO/DIA ``A @ x``; nvmath-python UST
``Matmul`` on CSR/COO/DIA with and without codegen; dense cuBLAS where the matrix fits.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

import sparsetorch as st
from sparsetorch.format import COO, CSR, DIA, ELL

from common import guard, peer, stencil3d_csr, time_cuda, time_cuda_stream

__all__ = ["run"]


def _bytes(kind: str, n: int, nnz: int, vs: int, isz: int, ndiag: int = 7, width: int = 7) -> int:
    vec = 2 * n * vs  # x read once, y written once
    if kind == "csr":
        return nnz * (vs + isz) + (n + 1) * isz + vec
    if kind == "coo":
        return nnz * (vs + 2 * isz) + vec
    if kind == "dia":
        return ndiag * n * vs + ndiag * 8 + vec
    if kind == "ell":
        return n * width * (vs + isz) + vec
    if kind == "dense":
        return n * n * vs + vec
    raise ValueError(kind)


def run(ctx: dict, *, m: int = 114, dtypes=(torch.float64, torch.float32), reps: int = 30) -> dict:
    bw = ctx["bandwidth"]["bytes_per_s"]
    n = m ** 3
    (crow, col, v64), (dia64, offsets) = stencil3d_csr(m)
    nnz = int(col.numel())
    out: dict[str, Any] = {"matrix": {"grid": f"{m}^3", "rows": n, "nnz": nnz, "diagonals": int(offsets.numel()),
                                      "note": "7-point Laplacian, 6 on the diagonal, -1 off it (atmosmodl's shape: same rows, "
                                              "same 7-diagonal pattern)"},
                           "reps": reps, "results": {}}
    cp, cp_ver = peer("cupy")
    nv, nv_ver = peer("nvmath")
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in dtypes:
        name = str(dtype).replace("torch.", "")
        vs = torch.empty((), dtype=dtype).element_size()
        vals, dia = v64.to(dtype), dia64.to(dtype)
        x = torch.randn(n, dtype=torch.float64, device="cuda", generator=g).to(dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = torch.sparse_csr_tensor(crow, col, v64, (n, n)) @ x.double()
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        rows: list[dict] = []

        def record(impl: str, family: str, fmt: str, nbytes: int, fn: Callable[[], Any], result: Callable[[], torch.Tensor],
                   **extra: Any) -> None:
            def measure() -> dict:
                y = result()
                err = float(torch.linalg.vector_norm(y.double() - ref) / torch.linalg.vector_norm(ref))
                t = time_cuda(fn, reps=reps)
                b2b = time_cuda_stream(fn)
                floor = nbytes / bw
                return {"median_s": t["median_s"], "min_s": t["min_s"], "back_to_back_s": b2b["median_s"],
                        "rel_err": err, "correct": err < tol, "bytes": nbytes, "floor_s": floor,
                        "fraction_of_floor": floor / t["median_s"], **extra}

            row = {"impl": impl, "family": family, "format": fmt, **guard(measure)}
            rows.append(row)
            msg = (f"{name:8s} {impl:44s} {row['median_s'] * 1e6:9.1f} us  b2b {row['back_to_back_s'] * 1e6:7.1f} us  "
                   f"floor {row['floor_s'] * 1e6:6.1f} us  ({row['fraction_of_floor']:.2f})  err {row['rel_err']:.1e}"
                   ) if "median_s" in row else f"{name:8s} {impl:44s} {row['error']}"
            print(msg, flush=True)

        # sparsetorch ------------------------------------------------------------------------------
        A64 = st.SparseTensor(CSR, (n, n), [None, crow], [None, col], vals, check=False)
        mats = {"CSR int64": (A64, _bytes("csr", n, nnz, vs, 8))}
        conv = {"CSR int32": (lambda: A64.convert(CSR, index_dtype=torch.int32), _bytes("csr", n, nnz, vs, 4)),
                "COO": (lambda: A64.convert(COO), _bytes("coo", n, nnz, vs, 8)),
                "DIA": (lambda: A64.convert(DIA), _bytes("dia", n, nnz, vs, 8)),
                "ELL": (lambda: A64.convert(ELL), _bytes("ell", n, nnz, vs, 8))}
        for label, (make, nb) in conv.items():
            got = guard(lambda make=make: {"A": make()})
            if "A" in got:
                mats[label] = (got["A"], nb)
            else:
                rows.append({"impl": f"sparsetorch {label}", "family": "sparsetorch", "format": label, **got})
        for label, (A, nb) in mats.items():
            for backend in (None, "torch", "cupy", "cuda"):
                def plan(A=A, backend=backend):
                    mm = st.Matmul(A, x, backend=backend)
                    table = mm.plan()
                    return mm, table

                got = guard(lambda plan=plan: {"mm": plan()})
                tag = f"sparsetorch Matmul {label} [{backend or 'auto'}]"
                if "mm" not in got:
                    rows.append({"impl": tag, "family": "sparsetorch", "format": label, **got})
                    continue
                mm, table = got["mm"]
                chosen = table.chosen
                record(tag, "sparsetorch", label, nb, mm.execute, mm.execute,
                       choice=f"{chosen.backend}/{chosen.method}" if chosen else None)
                if backend is not None and "median_s" in rows[-1]:
                    # The backend's plan alone (what the core calls after its per-call checks).
                    plan, x2 = mm._state.plan, x[:, None]
                    # the core's execute path may bind values without storing them in the plan (cuda)
                    plan.set_values(A.values)
                    record(f"sparsetorch {backend} plan.apply {label}", "sparsetorch", label, nb,
                           lambda plan=plan: plan.apply(x2), lambda plan=plan: plan.apply(x2)[:, 0],
                           note="the plan's apply() without the core's per-call work (autograd Function, values check)")
        A32 = mats.get("CSR int32", (A64, 0))[0]
        record("sparsetorch st.matmul CSR int32 [auto, one-shot]", "sparsetorch", "CSR int32",
               _bytes("csr", n, nnz, vs, 4), lambda: st.matmul(A32, x), lambda: st.matmul(A32, x))
        del mats

        # torch ------------------------------------------------------------------------------------
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t64 = torch.sparse_csr_tensor(crow, col, vals, (n, n))
            t32 = torch.sparse_csr_tensor(crow.to(torch.int32), col.to(torch.int32), vals, (n, n))
            rows_i = torch.repeat_interleave(torch.arange(n, device="cuda"), crow[1:] - crow[:-1])
            tcoo = torch.sparse_coo_tensor(torch.stack([rows_i, col]), vals, (n, n)).coalesce()
        for impl, T, fmt, nb in (("torch CSR int32 mv", t32, "CSR int32", _bytes("csr", n, nnz, vs, 4)),
                                 ("torch CSR int64 mv", t64, "CSR int64", _bytes("csr", n, nnz, vs, 8)),
                                 ("torch COO mv (coalesced)", tcoo, "COO int64", _bytes("coo", n, nnz, vs, 8))):
            record(impl, "torch", fmt, nb, lambda T=T: torch.mv(T, x), lambda T=T: torch.mv(T, x))

        # CuPy --------------------------------------------------------------------------------------
        cupy_mats: dict[str, Any] = {}
        if cp is None:
            rows.append({"impl": "cupy", "family": "cupy", "format": "-", "skipped": cp_ver})
        else:
            import cupyx.scipy.sparse as csp

            xc = cp.from_dlpack(x)
            cupy_mats["CSR"] = csp.csr_matrix((cp.from_dlpack(vals), cp.from_dlpack(col.to(torch.int32)),
                                               cp.from_dlpack(crow.to(torch.int32))), shape=(n, n))
            cupy_mats["COO"] = cupy_mats["CSR"].tocoo()
            cupy_mats["COO"].sum_duplicates()  # canonical COO (nvmath's UST takes only coalesced COO)
            cupy_mats["DIA"] = csp.dia_matrix((cp.from_dlpack(dia), cp.from_dlpack(offsets.to(torch.int32))), shape=(n, n))
            for fmt, M in cupy_mats.items():
                kind = fmt.lower()
                nb = _bytes(kind, n, nnz, vs, 4)
                record(f"cupy {fmt} A @ x", "cupy", f"{fmt} int32" if fmt != "DIA" else "DIA", nb,
                       lambda M=M: M @ xc, lambda M=M: torch.from_dlpack(M @ xc))

        # nvmath-python UST ------------------------------------------------------------------------------
        if nv is None or cp is None:
            rows.append({"impl": "nvmath UST Matmul", "family": "nvmath", "format": "-",
                         "skipped": nv_ver if nv is None else "needs cupy for its operands"})
        else:
            from nvmath.sparse.ust import Tensor as UST

            xc = cp.from_dlpack(x)
            for fmt, M in cupy_mats.items():
                for codegen in (False, True):
                    kind = fmt.lower()
                    nb = _bytes(kind, n, nnz, vs, 4)
                    c = cp.zeros(n, dtype=xc.dtype)

                    def build(M=M, c=c, codegen=codegen):
                        mm = nv.sparse.Matmul(UST.from_package(M), UST.from_package(xc), UST.from_package(c),
                                              options={"codegen": codegen})
                        mm.plan()
                        return mm

                    got = guard(lambda build=build: {"mm": build()})
                    tag = f"nvmath UST Matmul {fmt} codegen={codegen}"
                    if "mm" not in got:
                        rows.append({"impl": tag, "family": "nvmath", "format": fmt, **got})
                        print(f"{name:8s} {tag:44s} {got['error']}", flush=True)
                        continue
                    mm = got["mm"]

                    def once(mm=mm, c=c):
                        c.fill(0)
                        mm.execute()
                        return torch.from_dlpack(c)

                    record(tag, "nvmath", f"{fmt} int32" if fmt != "DIA" else "DIA", nb, mm.execute, once,
                           note="c += A @ b accumulates across timed calls (in-place UST form); values checked once from c = 0")

        # dense cuBLAS -------------------------------------------------------------------------------------
        need = n * n * vs
        free, total = torch.cuda.mem_get_info()
        if need < 0.8 * free:
            Dm = torch.sparse_csr_tensor(crow, col, vals, (n, n)).to_dense()
            record("dense cuBLAS gemv", "dense", "dense", _bytes("dense", n, nnz, vs, 0), lambda: Dm @ x, lambda: Dm @ x)
            del Dm
        else:
            rows.append({"impl": "dense cuBLAS gemv", "family": "dense", "format": "dense",
                         "skipped": f"does not fit: the dense matrix needs {need / 1e12:.1f} TB, the GPU has "
                                    f"{total / 1e9:.0f} GB ({free / 1e9:.0f} GB free)"})
        out["results"][name] = {"csr_int32_floor_s": _bytes("csr", n, nnz, vs, 4) / bw,
                                "dia_floor_s": _bytes("dia", n, nnz, vs, 4) / bw, "rows": rows}
        del cupy_mats
        torch.cuda.empty_cache()
    return out

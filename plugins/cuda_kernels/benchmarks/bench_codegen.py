"""Generated kernels (sparsetorch_cuda.codegen) against the hand-written ones, the CSR-from-the-
pattern path and torch, side by side in one run.

    python plugins/cuda_kernels/benchmarks/bench_codegen.py --out DIR [--m 114] [--reps 50]

Matrix: the 3-D 7-point stencil on an m^3 grid (m = 114: 1.48M rows, 10.3M entries), stored in
CSR, DIA, ELL (hand-written kernels) and COO, CSC, DIA_J, DCSR, BSR(2,2) (no kernel of their own:
today through a CSR made once from the pattern). Each row: seconds per ``plan.apply`` (CUDA events
around ``reps`` back-to-back calls, after a warm-up; includes the host's launch work, which
overlaps the GPU at these sizes), the bytes the format stores plus X and Y over the measured copy
bandwidth (``floor_s``), and ratios to the default plan of the same format. Writes
``DIR/cuda_codegen_h200_s6.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import torch  # noqa: E402

import sparsetorch as st  # noqa: E402
from sparsetorch.format import BSR, COO, CSC, CSR, DCSR, DIA, DIA_J, ELL  # noqa: E402

from common import copy_bandwidth, stencil3d_csr  # noqa: E402

from sparsetorch_cuda import codegen  # noqa: E402
from sparsetorch_cuda.plan import CudaSpmmPlan  # noqa: E402


def _stored_bytes(A: st.SparseTensor) -> int:
    bufs = [b for b in (*A.pos_buffers, *A.crd_buffers, A.values) if b is not None]
    return int(sum(b.numel() * b.element_size() for b in bufs))


def _row(rows: list, case: str, fmt: str, impl: str, fn, A, X, ref, floor_bw: float, reps: int, extra=None) -> float:
    try:
        Y = fn()
        torch.cuda.synchronize()
        err = float(torch.linalg.vector_norm(Y.double() - ref) / torch.linalg.vector_norm(ref)) if ref is not None else None
        s = codegen.timed(fn, reps)
    except Exception as exc:  # noqa: BLE001 - a failing row is recorded, the run goes on
        rows.append({"case": case, "format": fmt, "impl": impl, "error": f"{type(exc).__name__}: {exc}"[:400]})
        print(f"{case:26s} {fmt:9s} {impl:34s} ERROR {exc}"[:200], flush=True)
        return float("nan")
    nbytes = _stored_bytes(A) + (X.numel() + Y.numel()) * X.element_size()
    row = {"case": case, "format": fmt, "impl": impl, "seconds": s, "rel_err": err, "bytes": nbytes,
           "floor_s": nbytes / floor_bw, "fraction_of_floor": (nbytes / floor_bw) / s, **(extra or {})}
    rows.append(row)
    print(f"{case:26s} {fmt:9s} {impl:34s} {s * 1e6:9.1f} us  floor {row['floor_s'] * 1e6:7.1f} us  err {err}", flush=True)
    return s


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--m", type=int, default=114)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--cases", default="stencil", help="stencil and/or longrows (comma separated)")
    args = ap.parse_args()
    bw = copy_bandwidth()["bytes_per_s"]
    rows: list = []
    cases = args.cases.split(",")
    if "longrows" in cases:
        _longrows(rows, bw, args.reps)
    if "stencil" not in cases:
        return _write(args, bw, rows, "cuda_codegen_h200_s6_longrows.json")
    formats = {"CSR": CSR, "DIA": DIA, "ELL": ELL, "COO": COO, "CSC": CSC, "DIA_J": DIA_J, "DCSR": DCSR, "BSR(2,2)": BSR(2, 2)}
    for dtype, ks in ((torch.float64, (1,)), (torch.float32, (1, 8))):
        (crow, col, vals), _ = stencil3d_csr(args.m, dtype)
        n = crow.numel() - 1
        base = st.SparseTensor(CSR, (n, n), [None, crow.to(torch.int32)], [None, col.to(torch.int32)], vals)
        dense_ref = torch.sparse_csr_tensor(crow, col, vals.double(), (n, n))
        for name, fmt in formats.items():
            A = base if fmt == CSR else base.convert(fmt, index_dtype=torch.int32, max_fill=1e9)
            for k in ks:
                case = f"stencil{args.m} {str(dtype)[6:]} k={k}"
                X = torch.randn(n, k, dtype=dtype, device="cuda")
                ref = (dense_ref @ X.double())
                default = CudaSpmmPlan(A)
                default.set_values(A.values)
                t0 = _row(rows, case, name, f"default plan [{default.kind}]", lambda p=default, X=X: p.apply(X), A, X, ref,
                          bw, args.reps, {"kind": default.kind, "variant": getattr(default, "variant", None)})
                gen_best = float("inf")
                an = codegen.analyse(fmt)
                for v in codegen.variants(an):
                    g = CudaSpmmPlan(A, kernel="generated", variant=v)
                    g.set_values(A.values)
                    s = _row(rows, case, name, f"generated {an.strategy}/{v}", lambda p=g, X=X: p.apply(X), A, X, ref, bw,
                             args.reps, {"kind": "generated", "strategy": an.strategy, "variant": v})
                    gen_best = min(gen_best, s)
                if len(codegen.variants(an)) > 1:
                    g = CudaSpmmPlan(A, kernel="generated", autotune=True)
                    g.set_values(A.values)
                    _row(rows, case, name, "generated autotune", lambda p=g, X=X: p.apply(X), A, X, ref, bw, args.reps,
                         {"kind": "generated", "strategy": an.strategy})
                    rows[-1]["choice"] = dict(g.gen.choice)
                    rows[-1]["timings"] = {str(kk): vv for kk, vv in g.gen.timings.items()}
                rows.append({"case": case, "format": name, "summary": True, "generated_best_over_default": gen_best / t0})
                if name == "CSR":
                    tcsr = torch.sparse_csr_tensor(crow.to(torch.int32), col.to(torch.int32), vals, (n, n))
                    _row(rows, case, name, "torch CSR @", lambda X=X: tcsr @ X, A, X, ref, bw, args.reps)
                    for sr, kw in (("min_plus", {"semiring": "min_plus"}),
                                   ("plus_times + prolog/epilog", {"prolog": "x * x", "epilog": "x > 0 ? x : 0"})):
                        gp = codegen.GeneratedSpmm(A, **kw)
                        _row(rows, case, name, f"generated {sr}", lambda p=gp, X=X: p.apply(X), A, X, None, bw, args.reps)
            del A
        torch.cuda.empty_cache()
    return _write(args, bw, rows, "cuda_codegen_h200_s6.json")


def _longrows(rows: list, bw: float, reps: int) -> None:
    """A random 16384^2 matrix with 1 % density (about 164 entries per row), float32, k = 1 and
    4: where a warp per row pays (the stencil's 7 entries per row leave most lanes idle)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    n = 16384
    D = torch.rand(n, n, device="cuda", generator=g)
    D = torch.where(D < 0.01, torch.rand(n, n, device="cuda", generator=g) - 0.5, torch.zeros((), device="cuda"))
    for name, fmt in (("CSR", CSR), ("DIA_J", None)):
        if fmt is None:  # 64 diagonals of a banded matrix: a generated rows format with long rows
            i = torch.arange(n, device="cuda")[:, None]
            j = torch.arange(n, device="cuda")[None, :]
            band = ((j - i).abs() < 32).to(torch.float32) * (torch.rand(n, n, device="cuda", generator=g) - 0.5)
            A = st.SparseTensor.from_dense(band, DIA_J, index_dtype=torch.int32)
            ref_dense = band.double()
        else:
            A = st.SparseTensor.from_dense(D, fmt, index_dtype=torch.int32)
            ref_dense = D.double()
        for k in (1, 4):
            case = f"random16384 1% float32 k={k}" if name == "CSR" else f"band16384 63 diagonals float32 k={k}"
            X = torch.randn(n, k, device="cuda")
            ref = ref_dense @ X.double()
            default = CudaSpmmPlan(A)
            default.set_values(A.values)
            _row(rows, case, name, f"default plan [{default.kind}]", lambda p=default, X=X: p.apply(X), A, X, ref, bw, reps,
                 {"kind": default.kind})
            for v in ("thread", "warp"):
                gp = CudaSpmmPlan(A, kernel="generated", variant=v)
                gp.set_values(A.values)
                _row(rows, case, name, f"generated rows/{v}", lambda p=gp, X=X: p.apply(X), A, X, ref, bw, reps)
            gp = CudaSpmmPlan(A, kernel="generated", autotune=True)
            gp.set_values(A.values)
            _row(rows, case, name, "generated autotune", lambda p=gp, X=X: p.apply(X), A, X, ref, bw, reps)
            rows[-1]["choice"] = dict(gp.gen.choice)
        del A, ref_dense
    del D
    torch.cuda.empty_cache()


def _write(args, bw: float, rows: list, filename: str) -> int:
    try:
        nvrtc = ".".join(map(str, codegen._compile.nvrtc_version()))
    except Exception:  # noqa: BLE001
        nvrtc = None
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001
        smi = None
    out = {"what": "generated kernels (codegen.py) vs hand-written / CSR-from-pattern plans vs torch, per plan.apply",
           "command": "python plugins/cuda_kernels/benchmarks/bench_codegen.py " + " ".join(sys.argv[1:]),
           "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": {"gpu": torch.cuda.get_device_name(), "nvidia_smi": smi, "host": platform.node(),
                       "python": platform.python_version()},
           "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "nvrtc": nvrtc, "sparsetorch": st.__version__},
           "copy_bandwidth_bytes_per_s": bw, "reps": args.reps, "rows": rows}
    path = Path(args.out) / filename
    path.write_text(json.dumps(out, indent=1))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

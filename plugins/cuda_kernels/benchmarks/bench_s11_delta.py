"""Session 11 (s11d): the DELTA(4) "tc8p" (programmatic dependent launch) and "tq" kernels (kernels/delta.cu:
tc8's work per step, the values and gap words brought through a cp.async ring in shared memory) against
the "tc" default, dense cuBLAS GEMV and CSR, one run.

    python plugins/cuda_kernels/benchmarks/bench_s11_delta.py --out DIR [--size 8192] [--dtypes float16,bfloat16]
        [--variants default,tc8,tc8p,tq3,...] [--rounds 2] [--densities 0.5,0.1,0.3]

The matrices are bench_s10_delta's (same generator, seed and order: 8192 x 8192 random patterns at 50 %,
10 % and 30 %, fp16 and bf16), one right-hand side. Kernel time as bench_s10_delta measures it
(bench_cuda_kernels.graph_time): 20 calls of ``plan.apply(x)`` captured in one CUDA graph, replayed, median
of 10 replays, divided by 20; the dense row is ``W @ x`` (cuBLAS GEMV) timed the same way. Each case
times its rows ``--rounds`` times in turn (GEMV, every variant, CSR; then again), so the spread between
rounds is in the JSON. Relative errors against a float64 product of the same rounded inputs. The "p"
variants' launches in the graph are programmatic dependent launches (each waits for the one before it
to finish before it reads X or the values or writes Y; its row-pointer reads and block start overlap the
previous kernel's end): that is how the plan launches them, and the graph keeps it.

``--cold`` (session 14): each row is timed on enough copies of its operands (the matrix, its plan's own
arrays, X) that together they hold at least three times the GPU's L2 (H200: 50 MB), the graph's 20 calls
cycling through the copies, so no call finds its matrix in L2 from the call before. Without it a matrix that
fits L2 (DELTA(4) at 10 %: ~20 MB) is re-read from L2 by every call after the first while the dense GEMV's
134 MB is not: the warm ratios flatter the small formats. A layer of a model sees its weight cold.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import bench_s10_delta as S10  # noqa: E402
import bench_s9_delta as S9  # noqa: E402
from bench_s9_delta import B, copy_bandwidth  # noqa: E402

import sparsetorch as st  # noqa: E402
from sparsetorch.format import CSR, DELTA  # noqa: E402

VARIANTS = ["default", "tc8", "tc8p", "tq3", "tq4", "tq3p", "tq4p", "tq6p", "tq3p3", "tq4p3"]


class _Tab:
    """Collects the dense rows bench_s10_delta.matrices records (its ``tab.record`` calls)."""

    def __init__(self) -> None:
        self.dense: list[tuple] = []

    def record(self, case, impl, fn, result, ref, nbytes, **extra) -> None:
        self.dense.append((case, impl, fn, nbytes, extra))


def main() -> int:
    from sparsetorch_cuda.plan import CudaSpmmPlan

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--densities", default="0.5,0.1,0.3")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-csr", action="store_true")
    ap.add_argument("--name", default="cuda_delta_h200_s11d.json")
    ap.add_argument("--cold", action="store_true", help="time each row on copies cycling past the L2 (see above)")
    a = ap.parse_args()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw['bytes_per_s'] / 1e12:.2f} TB/s", flush=True)
    dtypes = [getattr(torch, d) for d in a.dtypes.split(",")]
    densities = tuple(float(d) for d in a.densities.split(","))
    variants = a.variants.split(",")
    vers = B.versions()
    rows: list[dict] = []

    def save() -> None:
        out = {"benchmark": "bench_s11_delta", "command": " ".join(["python", *sys.argv]),
               "date": datetime.now(timezone.utc).isoformat(), "machine": platform.node(),
               "gpu": torch.cuda.get_device_name(0), "copy_bandwidth": bw, "versions": vers,
               "kernel_time": "20 calls captured in a CUDA graph, replayed, median of 10 replays (per round)"
               + (": cold, each row on copies of its operands holding 3 L2s, cycled" if a.cold else ": warm (same operands)"),
               "cold": a.cold, "l2_bytes": l2,
               "rows": rows}
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / a.name).write_text(json.dumps(out, indent=1, default=str))

    tab = _Tab()
    l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20))

    def copies(nbytes: float) -> int:
        """B.cold_copies with --cold, else 1."""
        return B.cold_copies(nbytes) if a.cold else 1

    cycle = B.cycle
    for case, _density, _dtype, vs, W, mask, x, ref, extra in S10.matrices(tab, a.size, dtypes, densities):
        _, dimpl, dfn, dbytes, _ = tab.dense[-1]
        S = st.SparseTensor.from_dense(W, mask=mask)
        A = S.convert(DELTA(4), index_dtype=torch.int32)
        nse = int(A.nse)
        if a.cold:  # the dense row on its own copies of W and x
            Ws = [W] + [W.clone() for _ in range(copies(dbytes) - 1)]
            xs = [x.clone() for _ in Ws]
            dfn = cycle([lambda W=Wc, x=xc: W @ x for Wc, xc in zip(Ws, xs)])
        impls: list[tuple[str, object, float]] = [(dimpl, dfn, dbytes)]
        dbytes4 = S9._delta_bytes(a.size, a.size, nse, vs, 4)
        for v in variants:
            try:
                fns = []
                for i in range(copies(dbytes4)):
                    Ai = A if i == 0 else A.clone()
                    p = CudaSpmmPlan(Ai, variant=None if v == "default" else v)
                    p.set_values(Ai.values)
                    xi = x if i == 0 else x.clone()
                    fns.append(lambda p=p, xi=xi: p.apply(xi))
                    fns[-1]()  # each copy's first call (its recorded launch) outside the graph capture
                label = f"DELTA(4) [{p.variant}{' default' if v == 'default' else ''}]"
                impls.append((label, fns[0] if len(fns) == 1 else cycle(fns), dbytes4))
            except Exception as exc:  # noqa: BLE001 - a failing row is recorded, the run goes on
                rows.append({"case": case, "impl": f"DELTA(4) [{v}]", "error": repr(exc), **extra})
        if not a.no_csr:
            C = S.convert(CSR, index_dtype=torch.int32)
            cb = B._csr_bytes(a.size, a.size, int(C.nse), vs, 4)
            fns = []
            for i in range(copies(cb)):
                Ci = C if i == 0 else C.clone()
                pc = CudaSpmmPlan(Ci)
                pc.set_values(Ci.values)
                xi = x if i == 0 else x.clone()
                fns.append(lambda p=pc, xi=xi: p.apply(xi))
                fns[-1]()
            impls.append((f"CSR int32 [{pc.variant}]", fns[0] if len(fns) == 1 else cycle(fns), cb))
        times: dict[str, list[float]] = {}
        errs: dict[str, float | None] = {}
        for rnd in range(a.rounds):
            for label, fn, _nb in impls:
                try:
                    if label not in errs:
                        y = fn().double().reshape(ref.shape)
                        errs[label] = float(torch.linalg.vector_norm(y - ref) / torch.linalg.vector_norm(ref))
                    times.setdefault(label, []).append(B.graph_time(fn))
                except Exception as exc:  # noqa: BLE001
                    errs[label] = None
                    rows.append({"case": case, "impl": label, "error": repr(exc), "round": rnd, **extra})
        for label, _fn, nb in impls:
            ts = times.get(label)
            if not ts:
                continue
            kt = statistics.median(ts)
            rows.append({"case": case, "impl": label, "kernel_s": kt, "kernel_s_rounds": ts, "rel_err": errs.get(label),
                         "bytes": nb, "floor_s": nb / bw["bytes_per_s"], "stored": nse, "padding": nse - int(mask.sum()),
                         **extra})
        del impls, A, S, W
        torch.cuda.empty_cache()
        save()
    save()
    gemv = {r["case"]: r.get("kernel_s") for r in rows if r["impl"].startswith("dense")}
    for r in rows:
        k = r.get("kernel_s")
        d = gemv.get(r["case"])
        sp = f"{d / k:5.2f}x" if k and d else "     "
        rs = " ".join(f"{t * 1e6:.1f}" for t in r.get("kernel_s_rounds", []))
        e = r.get("rel_err")
        print(f"{r['case']:<20} {r['impl']:<28} {k * 1e6 if k else float('nan'):6.1f} us {sp} [{rs}] "
              f"err {e if e is None else f'{e:.1e}'} {r.get('error', '')}"[:160])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

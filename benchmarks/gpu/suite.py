"""The GPU benchmark suite: sparsetorch against its peers on one GPU, in one call.

    python benchmarks/gpu/suite.py                          # every case (under 9 minutes on an H200)
    python benchmarks/gpu/suite.py --cases spmv,cg_1m       # some of them
    python benchmarks/gpu/suite.py --quick                  # small sizes: a smoke test of the suite itself

Writes ``benchmarks/results/gpu_suite.json`` (machine, versions, command, copy bandwidth, every
case's rows), ``gpu_suite.md`` (the tables) and, when matplotlib is importable, ``gpu_spmv.png``
and ``gpu_cg.png``. Peers that are not installed (CuPy, nvmath-python, torch-sla) are recorded as
"not installed" and their rows skipped. A failing row records its error; the suite goes on.

Adding a case: write ``run(ctx, **sizes) -> dict`` in a module here and add it to ``CASES``
(with its quick sizes); ``report.py`` renders rows that have ``impl`` and numeric fields.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import cg  # noqa: E402
import direct  # noqa: E402
import loop  # noqa: E402
import report  # noqa: E402
import spmv  # noqa: E402
from common import copy_bandwidth, guard, peer  # noqa: E402

#: name -> (function, full-size keyword arguments, quick keyword arguments)
CASES = {
    "spmv": (spmv.run, {}, {"m": 40, "reps": 10}),
    "cg_1m": (cg.run_1m, {}, {"m": 100, "reps": 1}),
    "cg_64m": (cg.run_64m, {}, {"m": 300, "iters": 20}),
    "backward_1m": (cg.run_backward, {}, {"m": 100, "iters": 100}),
    "direct_1m": (direct.run_direct_1m, {}, {"m": 100, "repeats": 2}),
    "loop_1m": (loop.run_loop_1m, {}, {"m": 100, "steps": 12}),
}


def run_cuda_kernels(ctx: dict, *, m: int = 114, size: int = 8192, reps: int = 30) -> dict:
    """The cuda backend's kernels (plugins/cuda_kernels) beside torch, CuPy and dense cuBLAS:
    the stencil SpMV, the low-sparsity fp16/bf16/fp32 SpMV and the 2:4 fp16/bf16 SpMV of
    benchmarks/bench_cuda_kernels.py."""
    sys.path.insert(0, str(HERE.parent))
    import bench_cuda_kernels as bench

    tab = bench.Table(ctx["bandwidth"]["bytes_per_s"], reps)
    host = bench.case_host(tab)
    bench.case_stencil(tab, m)
    bench.case_lowsparsity(tab, size, (torch.float16, torch.bfloat16, torch.float32))
    bench.case_nm(tab, size, (torch.float16, torch.bfloat16))
    return {"host": host, "rows": tab.rows}


CASES["cuda_kernels"] = (run_cuda_kernels, {}, {"m": 40, "size": 1024, "reps": 10})


def run_cg_1g(ctx: dict, *, m: int = 34700, iters: int = 100) -> dict:
    """CG at 1.2e9 unknowns (2-D Poisson 34700^2 in DIA: values only, no index arrays), float64, a
    fixed number of iterations: the cuda backend's fused CG through its plan and through
    ``st.solve``, with peak memory, bytes per unknown and time per iteration over its bytes floor
    (``plugins/cuda_kernels/benchmarks/bench_cg_s6.py``'s ``case_big``)."""
    sys.path.insert(0, str(HERE.parent.parent / "plugins" / "cuda_kernels" / "benchmarks"))
    import bench_cg_s6 as big

    out: dict = {}
    big.case_big(out, m, iters, ctx["bandwidth"]["bytes_per_s"], True)
    return out["big"]


CASES["cg_1g"] = (run_cg_1g, {}, {"m": 1000, "iters": 20})


def register_cupy_backend() -> str:
    """Load the cupy backend: through its entry point when installed, else registered in-process
    from the source tree (``plugins/cupy_backend`` on PYTHONPATH)."""
    from sparsetorch.dispatch import get_backends

    backends = get_backends()
    if "cupy" not in backends.names:
        mod, why = peer("sparsetorch_cupy.plugin")
        if mod is not None:
            backends.register(mod, "cupy")
    return ", ".join(backends.names) + ("" if not backends.broken else f"; broken: {[b.name for b in backends.broken]}")


def versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda (torch)": torch.version.cuda}
    import numpy

    out["numpy"] = numpy.__version__
    import sparsetorch

    out["sparsetorch"] = sparsetorch.__version__
    for mod in ("sparsetorch_cupy", "cupy", "nvmath", "torch_sla", "scipy", "matplotlib"):
        out[mod] = peer(mod)[1]
    cp, _ = peer("cupy")
    if cp is not None:
        out["cuda runtime (cupy)"] = cp.cuda.runtime.runtimeGetVersion()
        out["cusparse"] = guard(lambda: {"v": __import__("cupyx.cusparse", fromlist=["getVersion"]).getVersion()}).get("v")
    return out


def machine() -> dict:
    p = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(0), "compute_capability": f"{p.major}.{p.minor}",
            "gpu_memory_bytes": p.total_memory, "sm_count": p.multi_processor_count, "platform": platform.platform(),
            "cpu_count": os.cpu_count()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {', '.join(CASES)}")
    ap.add_argument("--quick", action="store_true", help="small sizes (checks the suite, not the machine)")
    ap.add_argument("--out", default=str(HERE.parent / "results"), help="directory for gpu_suite.{json,md} and PNGs")
    ap.add_argument("--prefix", default="gpu_suite", help="file name stem of the JSON and markdown")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("the GPU suite needs CUDA", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc_backends = register_cupy_backend()
    ctx = {"bandwidth": copy_bandwidth()}
    print(f"copy bandwidth {ctx['bandwidth']['bytes_per_s'] / 1e12:.2f} TB/s", flush=True)
    doc = {"suite": "gpu", "command": " ".join(["python", "benchmarks/gpu/suite.py", *sys.argv[1:]]),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(), "versions": versions(),
           "quick": args.quick, "copy_bandwidth": ctx["bandwidth"],
           "notes": ["timings: median of per-call CUDA-event timings (SpMV) or of wall-clock solves with a synchronization "
                     "(CG), after warm-up",
                     "bytes floor = bytes the format must move (values, indices, x read once, y written once) / the copy "
                     "bandwidth measured in this run; fraction_of_floor = floor / measured time",
                     "memory cases (cg_64m, backward_1m): CuPy allocates through torch's caching allocator there, so "
                     "torch.cuda.max_memory_allocated counts it; timing cases use CuPy's own pool",
                     f"sparsetorch backends: {doc_backends}"],
           "cases": {}}
    json_path, md_path = out_dir / f"{args.prefix}.json", out_dir / f"{args.prefix}.md"
    for name in [c for c in args.cases.split(",") if c]:
        fn, full, quick = CASES[name]
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        res = guard(lambda fn=fn, kw=(quick if args.quick else full): fn(ctx, **kw))
        res["case_seconds"] = time.perf_counter() - t0
        doc["cases"][name] = res
        doc["wall_seconds"] = time.perf_counter() - t_start
        json_path.write_text(json.dumps(doc, indent=1, default=str))  # after every case: partial results survive
        torch.cuda.empty_cache()
    md_path.write_text(report.markdown(doc))
    pngs = report.plots(doc, out_dir)
    print(f"wrote {json_path}, {md_path}" + (f", {', '.join(str(p) for p in pngs)}" if pngs else
                                             " (no PNG: matplotlib is not importable)"), flush=True)
    print(f"suite wall time {time.perf_counter() - t_start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

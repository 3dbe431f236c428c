"""LLM-sized sparse linear layers on a GPU, half precision: dense nn.Linear vs SparseLinear vs torch.

Issue 17, item 5, the GPU part (``benchmarks/bench_llm.py`` is the CPU part). The 4096 x 4096 and
4096 -> 11008 layers pruned by magnitude to 50 %, 90 %, 99 % (CSR) and to 2:4 (NM(2, 4)), batch 1
and 64, float16 and bfloat16, forward and forward+backward, side by side in one run on the same
pruned weight:

- ``dense``: ``nn.functional.linear`` with the pruned weight as a dense matrix (cuBLAS);
- ``sparsetorch``: ``SparseLinear`` (its planned product per batch size: on a CUDA device the
  capable backends timed once and the fastest kept, recorded with the candidates' times from
  ``SparseLinear.plans()``, beside what one-shot dispatch would pick);
- ``torch CSR``: ``torch.sparse.mm`` with the weight as a torch CSR tensor (forward only);
- ``torch 2:4``: ``torch.sparse.to_sparse_semi_structured`` (cuSPARSELt/CUTLASS), 2:4 rows only,
  where this torch build runs it (forward only);
- ``nvmath TorchUST``: nvmath-python's injection tensor (``TorchUST.from_torch`` of the weight as a
  torch CSR tensor with int32 indices, as ``reformat_model``'s user function would make it) in
  ``F.linear``, where nvmath-python is installed and runs the case (forward only: UST's injection is
  inference-only).

Each implementation is timed three ways, medians of CUDA-event timings: ``eager`` (one call as
Python code makes it: host overhead included), ``graph`` (the call captured once in a CUDA graph
and replayed: the GPU time plus the replay's own launch latency, about 10 us on the H200 host)
and ``graph20`` (20 calls captured in one graph, the replay's time over 20: the per-call GPU
time, kernels and the gaps between them, as a layer inside a captured model sees it). An
implementation that cannot be captured says why. ``graph20cold`` (dense and sparsetorch, session 14):
``graph20`` with the 20 calls cycling through copies of the layer (weight, plan, input) that together
hold at least three times the GPU's L2 (H200: 50 MB), so no call finds its weight in L2 from the call
before, as in a model whose other layers' weights pass through L2 in between. At 4096 x 4096 the
dense fp16 weight (33.5 MB) and the sparse ones fit in L2: ``graph20`` re-reads them from it.
``compiled_s`` / ``forward_backward_compiled_s`` (dense and sparsetorch, unless ``--no-compile``): the
forward, and forward + backward, through ``torch.compile(..., fullgraph=True)`` (default inductor
mode), timed as ``eager`` (one call as Python makes it, host overhead included);
``compiled_reduce_overhead_s``: the forward compiled with ``mode="reduce-overhead"`` (inductor's CUDA
graphs: the host work of a call is a graph replay); a case that does not compile records why.
Outputs are checked against a float32 product of the same half-precision operands.

    python benchmarks/bench_llm_gpu.py                       # writes benchmarks/results/llm_h200.json
    python benchmarks/bench_llm_gpu.py --quick --out /tmp/llm_gpu.json
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

import sparsetorch as st

from bench_llm import RULES  # the same pruning rules as the CPU part (this script's folder is on sys.path)

HERE = Path(__file__).resolve().parent
#: calls captured in one graph for the ``graph20`` column (the per-call GPU time of a layer inside a
#: larger captured model: kernels and the gaps between them, not the replay's launch latency)
GRAPH_CALLS = 20


def _events(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` between CUDA events, after warm-ups."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(ts)


def _graph(fn, repeats: int, calls: int = 1):
    """Seconds per call of ``fn`` captured ``calls`` times in one CUDA graph and replayed (the
    replay's time over ``calls``), or the reason it could not be captured."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(calls):
                fn()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - recorded in the results
        torch.cuda.synchronize()
        return f"not capturable: {type(exc).__name__}: {str(exc)[:160]}"
    return _events(g.replay, repeats) / calls


def _cold(fns, repeats: int):
    """``_graph`` of ``GRAPH_CALLS`` calls cycling through ``fns`` (each on its own copy of the operands)."""
    from bench_cuda_kernels import cycle  # noqa: PLC0415 - the shared helper (this script's folder)

    with torch.no_grad():
        for f in fns:  # each copy's first call (plans, recorded launches) outside the capture
            f()
        return _graph(cycle(fns), repeats, GRAPH_CALLS)


def _copies(nbytes: float) -> int:
    """Copies of an operand of ``nbytes`` that hold three L2s (bench_cuda_kernels.cold_copies)."""
    from bench_cuda_kernels import cold_copies  # noqa: PLC0415

    return cold_copies(nbytes)


def _us(v) -> float:
    return v * 1e6 if isinstance(v, float) else float("nan")


def _row(fn, ref, repeats: int, backward=None) -> dict:
    with torch.no_grad():
        y = fn()
        err = float((y.float() - ref).abs().max() / ref.abs().max())
        out = {"max_rel_error_vs_float32": err, "eager_s": _events(fn, repeats), "graph_s": _graph(fn, repeats),
               f"graph{GRAPH_CALLS}_s": _graph(fn, repeats, GRAPH_CALLS)}
    if backward is not None:
        out["forward_backward_eager_s"] = _events(backward, repeats)
    return out


def _compiled(fn, repeats: int, *, grad: bool = False, mode: str | None = None):
    """Seconds per call of ``torch.compile(fn, fullgraph=True, mode=mode)`` (eager timing: host overhead
    included), or why it did not compile. ``grad``: ``fn`` returns a scalar and the timed step is its
    backward too (``fn`` is expected to clear the gradients it accumulates)."""
    torch._dynamo.reset()  # each case compiles afresh (no recompile limit across cases)
    try:
        cf = torch.compile(fn, fullgraph=True, mode=mode)
        if grad:
            return _events(lambda: cf().backward(), repeats)
        with torch.no_grad():
            return _events(cf, repeats)
    except Exception as exc:  # noqa: BLE001 - recorded in the results
        torch.cuda.synchronize()
        return f"not compiled: {type(exc).__name__}: {str(exc)[:200]}"


def _torch_ust(W: torch.Tensor, b: torch.Tensor, x: torch.Tensor, ref: torch.Tensor, repeats: int) -> dict | None:
    """nvmath-python's ``TorchUST`` of ``W`` (CSR, int32 indices) in ``F.linear``; None where nvmath is absent."""
    try:
        from nvmath.sparse.ust.interfaces.torch_interface import TorchUST  # noqa: PLC0415
    except Exception:  # noqa: BLE001 - not installed here
        return None
    try:
        csr = W.to_sparse_csr()
        csr32 = torch.sparse_csr_tensor(csr.crow_indices().int(), csr.col_indices().int(), csr.values(), csr.shape)
        Wu = TorchUST.from_torch(csr32)
        return _row(lambda: torch.nn.functional.linear(x, Wu, b), ref, repeats)
    except Exception as exc:  # noqa: BLE001 - recorded in the results
        torch.cuda.synchronize()
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def _case(dense: nn.Linear, layer: st.nn.SparseLinear, batch: int, dtype, repeats: int, rule: str,
          backward: bool = True, compiled: bool = True) -> dict:
    dev = layer.values.device
    W = layer.to_dense().detach()
    b = layer.bias.detach()
    x = torch.randn(batch, dense.in_features, device=dev, generator=torch.Generator(device=dev).manual_seed(batch)).to(dtype)
    ref = x.float() @ W.float().T + b.float()
    Wg = W.clone().requires_grad_(True)
    bg = b.clone().requires_grad_(True)
    xx = x.clone().requires_grad_(True)

    def dense_step():
        Wg.grad = bg.grad = xx.grad = None
        torch.nn.functional.linear(xx, Wg, bg).sum().backward()

    def ours_step():
        layer.zero_grad(set_to_none=True)
        xx.grad = None
        layer(xx).sum().backward()

    out = {"dense": _row(lambda: torch.nn.functional.linear(x, W, b), ref, repeats, dense_step if backward else None)}
    rd = _copies(W.numel() * W.element_size())
    cw = [(W.clone(), b.clone(), x.clone()) for _ in range(rd)]
    out["dense"][f"graph{GRAPH_CALLS}cold_s"] = _cold([lambda c=c: torch.nn.functional.linear(c[2], c[0], c[1]) for c in cw],
                                                      repeats)
    out["dense"]["cold_copies"] = rd
    del cw
    if compiled:
        out["dense"]["compiled_s"] = _compiled(lambda: torch.nn.functional.linear(x, W, b), repeats)
        out["dense"]["compiled_reduce_overhead_s"] = _compiled(lambda: torch.nn.functional.linear(x, W, b), repeats,
                                                               mode="reduce-overhead")
        if backward:
            def dense_loss():
                Wg.grad = bg.grad = xx.grad = None
                return torch.nn.functional.linear(xx, Wg, bg).sum()

            out["dense"]["forward_backward_compiled_s"] = _compiled(dense_loss, repeats, grad=True)
    try:
        out["sparsetorch"] = _row(lambda: layer(x), ref, repeats, ours_step if backward else None)
        # the sparse values alone: fewer bytes than the layer holds, so at least as many copies as needed
        rs = _copies(layer.density * W.numel() * W.element_size())
        cl = [(copy.deepcopy(layer), x.clone()) for _ in range(rs)]
        out["sparsetorch"][f"graph{GRAPH_CALLS}cold_s"] = _cold([lambda c=c: c[0](c[1]) for c in cl], repeats)
        out["sparsetorch"]["cold_copies"] = rs
        del cl
        if compiled:
            out["sparsetorch"]["compiled_s"] = _compiled(lambda: layer(x), repeats)
            out["sparsetorch"]["compiled_reduce_overhead_s"] = _compiled(lambda: layer(x), repeats, mode="reduce-overhead")
            if backward:
                def ours_loss():
                    layer.zero_grad(set_to_none=True)
                    xx.grad = None
                    return layer(xx).sum()

                out["sparsetorch"]["forward_backward_compiled_s"] = _compiled(ours_loss, repeats, grad=True)
        # the plan the layer runs for this batch size (SparseLinear.plans(): on a CUDA device
        # chosen by timing the capable backends; what one-shot dispatch would pick is recorded too)
        plan = next((p for p in layer.plans() if p["batch"] == batch), None)
        if plan is not None:
            out["sparsetorch"]["backend"] = plan["plan"]
            out["sparsetorch"]["plan"] = plan
        table = st.explain("matmul", layer.weight, x.mT.contiguous())
        out["sparsetorch"]["one_shot_dispatch"] = f"{table.chosen.backend}/{table.chosen.method}"
    except Exception as exc:  # noqa: BLE001
        out["sparsetorch"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            Wcsr = W.to_sparse_csr()
            out["torch CSR"] = _row(lambda: torch.sparse.mm(Wcsr, x.mT).mT + b, ref, repeats)
        except Exception as exc:  # noqa: BLE001
            out["torch CSR"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        if rule == "2:4":
            try:
                from torch.sparse import to_sparse_semi_structured  # noqa: PLC0415
                Wss = to_sparse_semi_structured(W)
                xp = x if batch >= 8 else torch.nn.functional.pad(x, (0, 0, 0, 8 - batch))  # needs >= 8 rows
                out["torch 2:4"] = _row(lambda: torch.nn.functional.linear(xp, Wss, b)[:batch], ref, repeats)
            except Exception as exc:  # noqa: BLE001
                out["torch 2:4"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        ust = _torch_ust(W, b, x, ref, repeats)
        if ust is not None:
            out["nvmath TorchUST"] = ust
    return out


def _version_of(module: str) -> str | None:
    try:
        from importlib.metadata import version  # noqa: PLC0415

        return version({"nvmath": "nvmath-python"}.get(module, module))
    except Exception:  # noqa: BLE001 - not installed
        return None


def _write(args, results: list) -> None:
    doc = {
        "benchmark": "LLM-sized sparse linear layers, GPU, half precision (issue 17 item 5, GPU part)",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join([Path(os.path.relpath(sys.argv[0], HERE.parent)).as_posix()] + sys.argv[1:]),
        "commit": args.commit,
        "machine": {"platform": platform.platform(), "gpu": torch.cuda.get_device_name(0)},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "sparsetorch": st.__version__,
                     "backends": sorted(i.name for i in st.registry().info()), "nvmath": _version_of("nvmath")},
        "notes": ("speed-ups are dense time / implementation time; 'eager' includes host overhead (one Python call), "
                  "'graph' is the call captured in a CUDA graph and replayed (GPU time + the replay's launch latency), "
                  f"'graph{GRAPH_CALLS}' is {GRAPH_CALLS} calls captured in one graph, per call (GPU time, kernels and gaps); "
                  "medians of CUDA events; sparsetorch's 'plan' is the layer's own (SparseLinear.plans()), "
                  "'one_shot_dispatch' what st.matmul's dispatch would pick; 'compiled_s' / 'forward_backward_compiled_s' "
                  "time torch.compile(fullgraph=True) of the forward / forward+backward as 'eager' does; "
                  "'nvmath TorchUST' is nvmath-python's injection tensor (CSR, int32) in F.linear"),
        "results": results,
    }
    try:
        from sparsetorch_cuda import _mma  # noqa: PLC0415

        doc["cuda_csr16_kernel"] = {"kernel": _mma.CSR16_KERNEL_DEFAULT, "auto": list(_mma.CSR16_AUTO),
                                    "threads": _mma.CSR16_XV_THREADS,
                                    "threads_by_kernel": dict(_mma.CSR16_XV_THREADS_BY),
                                    "flags_by_kernel": dict(_mma.CSR16_FLAGS_BY)}
    except ImportError:
        pass
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x4096,4096x11008")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--sparsities", default=",".join(RULES))
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--no-backward", action="store_true", help="forward only (no forward+backward column)")
    ap.add_argument("--no-compile", action="store_true", help="no torch.compile columns")
    ap.add_argument("--quick", action="store_true", help="1024-wide layers, 10 repeats")
    ap.add_argument("--out", default=str(HERE / "results" / "llm_h200.json"))
    ap.add_argument("--commit", default="", help="the commit measured (recorded in the results)")
    ap.add_argument("--csr16", default="", help="the cuda plugin's batch-1 half-precision CSR kernel for this run "
                    "(sparsetorch_cuda._mma.CSR16_KERNEL_DEFAULT, e.g. auto, x12, x12a, xs1; default: the plugin's)")
    ap.add_argument("--csr16-flags", default="", help="that kernel's flags for this run (sparsetorch_cuda._mma.CSR16_FLAGS_BY "
                    "of the kernel auto picks first, e.g. 14 for x12a: kernels/mma.cu XV_*; default: the plugin's)")
    args = ap.parse_args()
    if args.csr16_flags:
        from sparsetorch_cuda import _mma  # noqa: PLC0415 - only where the cuda plugin is installed

        for name in (args.csr16 or _mma.CSR16_KERNEL_DEFAULT, *_mma.CSR16_AUTO):
            _mma.CSR16_FLAGS_BY[name] = int(args.csr16_flags)
    if args.csr16:
        from sparsetorch_cuda import _mma  # noqa: PLC0415 - only where the cuda plugin is installed

        _mma.CSR16_KERNEL_DEFAULT = args.csr16
    if not torch.cuda.is_available():
        raise SystemExit("bench_llm_gpu needs a CUDA device (the CPU part is bench_llm.py)")
    if args.quick:
        args.shapes, args.repeats = "1024x1024,1024x2752", 10
    dev = torch.device("cuda")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    results = []
    for n_in, n_out in shapes:
        torch.manual_seed(0)
        base = nn.Linear(n_in, n_out)
        by_name = {r.replace(" ", ""): r for r in RULES}  # "90%" or "90 %"
        for rule in [by_name[s.strip().replace(" ", "")] for s in args.sparsities.split(",")]:
            for dname in args.dtypes.split(","):
                dtype = getattr(torch, dname)
                dense = nn.Linear(n_in, n_out).to(dev, dtype)
                with torch.no_grad():
                    dense.weight.copy_(base.weight)
                    dense.bias.copy_(base.bias)
                layer = st.nn.SparseLinear(RULES[rule]()("layer", dense), dense.bias.detach())
                for batch in [int(v) for v in args.batches.split(",")]:
                    case = _case(dense, layer, batch, dtype, args.repeats, rule, backward=not args.no_backward,
                                 compiled=not args.no_compile)
                    row = {"in_features": n_in, "out_features": n_out, "sparsity": rule, "dtype": dname, "batch": batch,
                           "format": layer.weight.format.name, "density": round(layer.density, 6), **case}
                    results.append(row)
                    _write(args, results)  # after every case: a run cut short keeps what it measured
                    d = case["dense"]
                    parts = []
                    for name in ("sparsetorch", "torch CSR", "torch 2:4", "nvmath TorchUST"):
                        r = case.get(name)
                        if r is None:
                            continue
                        if "error" in r:
                            parts.append(f"{name}: {r['error'][:60]}")
                            continue
                        gtxt = []
                        for col in ("graph_s", f"graph{GRAPH_CALLS}_s", f"graph{GRAPH_CALLS}cold_s", "compiled_s",
                                    "forward_backward_eager_s", "forward_backward_compiled_s", "compiled_reduce_overhead_s"):
                            g, gd = r.get(col), d.get(col)
                            gtxt.append(f"{gd / g:5.2f}x" if isinstance(g, float) and isinstance(gd, float) else "  n/c")
                        parts.append(f"{name} eager {d['eager_s'] / r['eager_s']:5.2f}x graph {gtxt[0]} graph{GRAPH_CALLS} {gtxt[1]}"
                                     f" cold {gtxt[2]} compiled {gtxt[3]} (reduce-overhead {gtxt[6]}) fwd+bwd {gtxt[4]}"
                                     f" compiled {gtxt[5]}")
                    print(f"{n_in}x{n_out} {rule:>5s} {dname:8s} b={batch:<3d} dense eager {d['eager_s'] * 1e6:7.1f} us "
                          f"graph {d['graph_s'] * 1e6 if isinstance(d['graph_s'], float) else float('nan'):7.1f} us "
                          f"graph{GRAPH_CALLS} {_us(d[f'graph{GRAPH_CALLS}_s']):7.1f} us "
                          f"cold {_us(d.get(f'graph{GRAPH_CALLS}cold_s')):7.1f} us | "
                          + " | ".join(parts) + f" [{case['sparsetorch'].get('backend', '?')}]", flush=True)
                del layer, dense
    _write(args, results)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

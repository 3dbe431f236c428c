"""Shared pieces of the GPU suite: CUDA-event timing, the copy-bandwidth ceiling, problem
builders, peer imports that degrade to "not installed", and CuPy on torch's allocator."""

from __future__ import annotations

import contextlib
import importlib
import statistics
import time
import traceback
from typing import Any, Callable, Iterator

import torch

__all__ = ["time_cuda", "time_cuda_stream", "thr", "bench_doc", "copy_bandwidth", "stencil3d_csr", "poisson2d_csr", "peer", "cupy_on_torch_allocator",
           "guard", "mib"]


def thr(fn: Callable[[], Any], calls: int = 200, reps: int = 5) -> float:
    """Seconds per call of ``calls`` calls back to back (one synchronize at the end), best of
    ``reps``: host-bound throughput, the way the core calibrates its launch unit."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def bench_doc(bench: str, script: str, argv: list, commit: str, bandwidth: float, notes: list) -> dict:
    """The header of a benchmark's JSON: what ran (``bench``, the command line of ``script`` with
    ``argv``, the commit), when, on what machine and versions, the copy bandwidth of the run."""
    import platform  # noqa: PLC0415
    from datetime import datetime, timezone  # noqa: PLC0415

    return {"bench": bench, "command": " ".join(["python", script, *argv]), "commit": commit,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {"gpu": torch.cuda.get_device_name(0), "platform": platform.platform()},
            "versions": {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda},
            "copy_bandwidth_bytes_per_s": bandwidth, "notes": notes}


def time_cuda(fn: Callable[[], Any], *, reps: int = 30, warmup: int = 3) -> dict:
    """Median of ``reps`` per-call CUDA-event timings on the current stream, after ``warmup``
    calls. Each call is bracketed by its own events, so host overhead counts whenever the GPU
    waits for the host (what a caller sees)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends)]
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "reps": reps}


def time_cuda_stream(fn: Callable[[], Any], *, calls: int = 100, reps: int = 5) -> dict:
    """Seconds per call of ``calls`` calls back to back on the current stream, timed by one pair
    of CUDA events around them (median of ``reps`` batches): the throughput of a loop that calls
    ``fn`` repeatedly, max(host time, device time) per call. Per-call events (:func:`time_cuda`)
    add two event records of host time to every call, which decides the figure once a kernel is
    shorter than the host work around it."""
    fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(calls):
            fn()
        e.record()
        torch.cuda.synchronize()
        per.append(s.elapsed_time(e) * 1e-3 / calls)
    return {"median_s": statistics.median(per), "min_s": min(per), "calls": calls, "reps": reps}


def copy_bandwidth(nbytes: int = 1 << 30, reps: int = 20) -> dict:
    """Device copy bandwidth (bytes read + written per second), median of ``reps`` copies."""
    buf = {"x": torch.empty(nbytes // 8, dtype=torch.float64, device="cuda").fill_(1.0)}
    buf["y"] = torch.empty_like(buf["x"])
    t = time_cuda(lambda: buf["y"].copy_(buf["x"]), reps=reps, warmup=3)
    bw = 2 * buf["x"].numel() * 8 / t["median_s"]
    buf.clear()
    torch.cuda.empty_cache()
    return {"bytes_per_s": bw, "buffer_bytes": nbytes, "median_s": t["median_s"], "how": "torch copy_ of a 1 GiB float64 buffer, read + write"}


def _csr_from_neighbors(cols: torch.Tensor, valid: torch.Tensor, vals: torch.Tensor, n: int):
    """CSR from per-row candidate columns (ascending), a validity mask and values."""
    counts = valid.sum(1)
    crow = torch.zeros(n + 1, dtype=torch.int64, device=cols.device)
    crow[1:] = torch.cumsum(counts, 0)
    return crow, cols[valid], vals[valid]


def stencil3d_csr(m: int, dtype=torch.float64, device="cuda"):
    """7-point Laplacian on an m^3 grid (the shape of SuiteSparse atmosmodl for m = 114):
    ``(crow, col, values)`` int64 CSR with sorted columns, and the DIA diagonals (CuPy layout)."""
    n = m ** 3
    k = torch.arange(n, device=device)
    z, y, x = k // (m * m), (k // m) % m, k % m
    offs = [(-m * m, z > 0), (-m, y > 0), (-1, x > 0), (0, torch.ones_like(k, dtype=torch.bool)),
            (1, x < m - 1), (m, y < m - 1), (m * m, z < m - 1)]
    cols = torch.stack([k + o for o, _ in offs], 1)
    valid = torch.stack([v for _, v in offs], 1)
    vals = torch.where(cols == k[:, None], 6.0, -1.0).to(dtype)
    crow, col, v = _csr_from_neighbors(cols, valid, vals, n)
    # DIA-J (SciPy/CuPy layout): data[d, j] = A[j - off_d, j]
    dia = torch.stack([torch.where(_valid_dia(o, k, m), -1.0 if o else 6.0, 0.0).to(dtype) for o, _ in offs])
    offsets = torch.tensor([-o for o, _ in offs][::-1], device=device)  # column - row offsets, ascending
    return (crow, col, v), (dia.flip(0).contiguous(), offsets)


def _valid_dia(o: int, j: torch.Tensor, m: int) -> torch.Tensor:
    """Whether A[j + o, j] is a stencil neighbour (row i = j + o couples to column j)."""
    i = j + o
    n = m ** 3
    inside = (i >= 0) & (i < n)
    ic = i.clamp(0, n - 1)
    d = (ic // (m * m) - j // (m * m)).abs() + ((ic // m) % m - (j // m) % m).abs() + (ic % m - j % m).abs()
    return inside & ((d == 1) | (o == 0))


def poisson2d_csr(m: int, dtype=torch.float64, device="cuda"):
    """5-point Laplacian on an m^2 grid (4 on the diagonal): int64 CSR ``(crow, col, values)``."""
    n = m * m
    k = torch.arange(n, device=device)
    r, c = k // m, k % m
    cols = torch.stack([k - m, k - 1, k, k + 1, k + m], 1)
    valid = torch.stack([r > 0, c > 0, torch.ones_like(k, dtype=torch.bool), c < m - 1, r < m - 1], 1)
    vals = torch.where(cols == k[:, None], 4.0, -1.0).to(dtype)
    out = _csr_from_neighbors(cols, valid, vals, n)
    del cols, valid, vals, k, r, c
    return out


def peer(module: str) -> tuple[Any, str]:
    """(module or None, version or "not installed: <why>")."""
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a missing or broken peer is recorded, not fatal
        return None, f"not installed ({type(exc).__name__}: {exc})"
    version = getattr(mod, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as _v

            version = _v(module.replace("_", "-"))
        except Exception:  # noqa: BLE001
            version = "?"
    return mod, str(version)


@contextlib.contextmanager
def cupy_on_torch_allocator() -> Iterator[bool]:
    """Inside: CuPy's device allocations go through torch's caching allocator, so one pool serves
    both and ``torch.cuda.max_memory_allocated`` counts CuPy's memory too (the memory cases use
    it). Each CuPy allocation then costs a Python call, so the timing cases run without it."""
    try:
        import cupy as cp
    except ImportError:
        yield False
        return

    def alloc(size: int):
        t = torch.empty(max(size, 1), dtype=torch.uint8, device="cuda")
        return cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(t.data_ptr(), size, t), 0)

    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    cp.cuda.set_allocator(alloc)
    try:
        yield True
    finally:
        cp.cuda.set_allocator(pool.malloc)


def guard(fn: Callable[[], dict]) -> dict:
    """Run one measurement; an exception becomes ``{"error": ...}`` (the suite goes on)."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=4)[-1500:]}


def mib(b: float) -> float:
    return b / 2**20

"""Machine rates for the cost models, measured once per machine and device.

A cost estimate is ``bytes / bandwidth + flops / flop_rate + launches * launch_overhead``. The
three rates are measured by a short calibration (about 0.3 s on a CPU, less on a GPU): a large
copy (bandwidth), a dense matrix product (flop rate) and a tiny kernel (launch overhead). The
result is cached on disk under the user cache directory (``$XDG_CACHE_HOME/sparsetorch`` or
``~/.cache/sparsetorch``), keyed by device name, torch version and thread count;
``sparsetorch calibrate`` or :func:`calibrate` re-runs it. ``SPARSETORCH_CALIBRATION=defaults``
skips measuring and uses conservative built-in rates (CI sets it for determinism).

CPUs use the built-in rates unless ``SPARSETORCH_CALIBRATION=measure``: the CPU cost models of
the torch, SciPy and Eigen backends were fitted against them (their docs say so), and a measured
dense-GEMM peak and copy rate are far above what sparse kernels reach. Measured on the 2-core
reference VM (2-D Poisson 64² and 256², 1 thread): with the built-in rates Eigen's direct
estimates were within 0.9-1.3x of the measured times and auto picked the fastest method; with
measured rates (65 Gflop/s, 40-97 GB/s) they were 5-30x too low and auto picked CG with
incomplete Cholesky, 5x slower than the Cholesky factorization it passed over. GPUs are measured
(the GPU models were fitted on measured rates).
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

__all__ = ["Rates", "rates", "calibrate", "cache_path"]


@dataclass(frozen=True)
class Rates:
    """Measured throughput of one device."""

    device: str
    bandwidth: float  # bytes / s, read + write
    flops: float  # flop / s, dense float64 (float32 on GPU counts the same order)
    launch: float  # s per kernel launch / op dispatch
    measured: bool = True

    def seconds(self, *, bytes: float = 0.0, flops: float = 0.0, launches: float = 0.0) -> float:
        return bytes / self.bandwidth + flops / self.flops + launches * self.launch


_DEFAULTS = {
    "cpu": Rates("cpu", bandwidth=5e9, flops=2e10, launch=5e-6, measured=False),
    "cuda": Rates("cuda", bandwidth=2e12, flops=2e13, launch=8e-6, measured=False),
}
_memo: dict[str, Rates] = {}


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sparsetorch" / "calibration.json"


def _device_key(device: torch.device) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
    return f"{device.type}|{name}|torch {torch.__version__}|threads {torch.get_num_threads()}"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best(fn, device: torch.device, reps: int = 5) -> float:
    fn()
    _sync(device)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


def _measure(device: torch.device) -> Rates:
    # float64 elements: 64 MiB on a CPU (it was 8 MiB, cache-resident: 97 vs 40 GB/s here), 128 MiB on a GPU
    big = 1 << (23 if device.type == "cpu" else 24)
    x = torch.empty(big, dtype=torch.float64, device=device).fill_(1.0)
    y = torch.empty_like(x)
    bw = 2 * x.numel() * 8 / _best(lambda: y.copy_(x), device)
    n = 384 if device.type == "cpu" else 4096
    a = torch.randn(n, n, dtype=torch.float64, device=device)
    fl = 2 * n**3 / _best(lambda: a @ a, device, reps=3)
    t = torch.ones(8, device=device)
    launch = _best(lambda: [t.add_(1) for _ in range(100)], device) / 100
    return Rates(device.type, bandwidth=bw, flops=fl, launch=launch, measured=True)


def calibrate(device: torch.device | str = "cpu", *, save: bool = True) -> Rates:
    """Measure ``device`` now (and store the result in the on-disk cache)."""
    device = torch.device(device)
    r = _measure(device)
    key = _device_key(device)
    _memo[key] = r
    if save:
        path = cache_path()
        try:
            data = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError):
            data = {}
        data[key] = asdict(r)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=1))
        except OSError:
            pass  # a read-only home is fine: we keep the in-memory value
    return r


def rates(device: torch.device | str = "cpu") -> Rates:
    """The rates of ``device``: memoised, else from the disk cache, else measured once."""
    device = torch.device(device)
    mode = os.environ.get("SPARSETORCH_CALIBRATION", "").lower()
    if mode == "defaults" or (device.type == "cpu" and mode not in ("measure", "measured")):
        return _DEFAULTS.get(device.type, _DEFAULTS["cpu"])
    key = _device_key(device)
    r = _memo.get(key)
    if r is not None:
        return r
    path = cache_path()
    try:
        stored = json.loads(path.read_text()).get(key) if path.exists() else None
    except (OSError, ValueError):
        stored = None
    if stored:
        r = Rates(**stored)
        _memo[key] = r
        return r
    return calibrate(device)

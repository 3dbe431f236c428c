"""Cost model of the cuda backend, fitted to its own measurements.

One product costs ``bytes / (bandwidth * efficiency[family]) + host`` seconds:

- ``bytes`` is what the kernel must move (:func:`traffic`): the stored matrix once per column
  of X it streams (the vector kernels re-read it per column; ``csr_cols`` once), X read once, Y
  written once. DELTA(b) counts b bits per stored gap instead of an index word.
- ``bandwidth`` is the device's measured copy bandwidth (``sparsetorch.backend.rates``), times
  :func:`bandwidth_scale`: the efficiencies are fractions of a 1 GiB copy's bandwidth, and the
  core's calibration (a 128 MiB copy, best of 5) reads lower on the same GPU (H200: 3.49 against
  4.25 TB/s in one run), so measured rates are scaled by the ratio of the two in the fitting run.
- ``efficiency[family]`` (csr_vector, csr_balanced, csr_cols, dia, ell, delta) is the fraction of
  that bandwidth the kernel family reached on the H200, the median over the rows of
  ``cost_h200.json`` (written by ``benchmarks/bench_cuda_kernels.py --fit``), with
  :data:`DEFAULT_EFFICIENCY` until a measurement exists.
- ``host`` is the per-call host time of ``plan.apply`` measured there (allocation of Y, the
  stream query, the launch; CPU time per call of many calls back to back, the way the core's
  calibration measures its launch unit), stored as ``host_launches``, a multiple of the launch
  unit measured in the same run, and priced at ``rates.launch`` of the machine at hand, so it is
  on the scale of the torch and cupy backends' ``launches * rates.launch``; plus one value
  gather for formats that go through the generic CSR.

Formats without a kernel of their own pay the pattern's CSR construction (a sort of the
entries) once, as ``setup``.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

import torch

from sparsetorch.backend import Rates, Request

__all__ = ["traffic", "spmm_cost", "csr_variant", "family", "efficiency", "measurements", "DEFAULT_EFFICIENCY", "bandwidth_scale",
           "host_seconds",
           "HOST_SECONDS", "predict"]

MEASUREMENTS = Path(__file__).resolve().parent / "cost_h200.json"
#: used for a family until cost_h200.json has rows of it
DEFAULT_EFFICIENCY = {"csr_vector": 0.6, "csr_balanced": 0.45, "csr_cols": 0.3, "csr_stream": 0.7, "dia": 0.75, "ell": 0.55,
                      "delta": 0.5, "nm": 0.6, "bsr": 0.5}
#: host time of one plan.apply (seconds) until measured
HOST_SECONDS = 12e-6
#: the 32-bit kernels run below this many entries, rows and columns (plan.INT_LIMIT)
INT_LIMIT = 2**31 - 1024
#: a row longer than this many times the mean (and than SKEW_MIN_ROW) sends CSR to the balanced kernel
SKEW_FACTOR = 32
SKEW_MIN_ROW = 4096


@functools.lru_cache(maxsize=1)
def measurements() -> dict:
    """The committed H200 measurements (empty when the file is absent)."""
    try:
        return json.loads(MEASUREMENTS.read_text())
    except (OSError, ValueError):
        return {}


def efficiency(fam: str) -> float:
    fitted = measurements().get("efficiency", {})
    return float(fitted.get(fam, DEFAULT_EFFICIENCY[fam]))


def bandwidth_scale(rates: Rates | None = None) -> float:
    """Copy bandwidth of the fitting run over the core's calibrated bandwidth in that run (1 for
    built-in, unmeasured rates or when the file lacks either)."""
    data = measurements()
    fit_bw = data.get("copy_bandwidth_bytes_per_s")
    run_bw = (data.get("rates") or {}).get("bandwidth")
    if rates is None or not rates.measured or not fit_bw or not run_bw:
        return 1.0
    return float(fit_bw) / float(run_bw)


def host_seconds(rates: Rates | None = None) -> float:
    """Host seconds of one ``plan.apply``: the fitted launch units at ``rates.launch`` when both
    are known, else the measured seconds (else :data:`HOST_SECONDS`)."""
    data = measurements()
    units = data.get("host_launches")
    if units is not None and rates is not None:
        return float(units) * rates.launch
    return float(data.get("host_s", HOST_SECONDS))


def csr_variant(m: int, nnz: int, max_row: int) -> str:
    """"balanced" for skewed rows (one row far longer than the mean), the stream kernel for short
    rows (mean <= STREAM_MEAN, longest <= STREAM_MAX_ROW: plan.STREAM_DEFAULT, "streamcs"), else
    "vector"."""
    from .plan import STREAM_DEFAULT, STREAM_MAX_ROW, STREAM_MEAN  # noqa: PLC0415

    mean = nnz / max(m, 1)
    if max_row > max(SKEW_MIN_ROW, SKEW_FACTOR * mean):
        return "balanced"
    return STREAM_DEFAULT if mean <= STREAM_MEAN and max_row <= STREAM_MAX_ROW else "vector"


def family(kind: str, k: int, variant: str = "vector") -> str:
    if kind in ("csr", "generic"):
        if variant == "balanced":
            return "csr_balanced"
        if k >= 16:
            return "csr_cols"
        return "csr_stream" if variant.startswith("stream") else "csr_vector"
    return kind


def traffic(kind: str, *, m: int, n: int, nnz: int, k: int, vs: int, isz: int, slots: int | None = None,
            bits: int | None = None, variant: str = "vector", block: int = 1) -> float:
    """Bytes one product moves (see the module docstring)."""
    vectors = (m + n) * k * vs
    slots = nnz if slots is None else slots
    fam = family(kind, k, variant)
    passes = 1 if fam == "csr_cols" else k
    if kind in ("csr", "generic"):
        mat = nnz * (vs + isz) + (m + 1) * isz
    elif kind == "dia":
        mat = slots * vs
    elif kind == "ell":
        mat = slots * (vs + isz) + 4 * m
    elif kind == "delta":
        mat = nnz * vs + nnz * (bits or 8) / 8 + (m + 1) * isz
    elif kind == "nm":  # slots: values + packed in-group positions (bits each)
        mat = slots * vs + slots * (bits or 2) / 8
    elif kind == "bsr":  # slots = blocks * bh * bw values (block = bh * bw); one index per block
        mat = slots * vs + slots / max(block, 1) * isz + (m + 1) * isz
    else:
        raise ValueError(kind)
    return passes * mat + vectors


def predict(fam: str, nbytes: float, bandwidth: float, host: float | None = None) -> float:
    """Seconds of one product of ``nbytes`` in kernel family ``fam``."""
    return nbytes / (bandwidth * efficiency(fam)) + (host_seconds() if host is None else host)


def _kind_of(request: Request) -> tuple[str, int | None, int]:
    """(kind, bits per stored index: DELTA gap or N:M position, BSR block size)."""
    from .plan import _nm_pos_bits, bsr_params, delta_bits, native_kind, nm_params  # noqa: PLC0415 - plan imports torch only

    fmt = request.A.format
    kind = native_kind(fmt)
    if kind == "nm":
        return kind, _nm_pos_bits(nm_params(fmt)[1]), 1
    if kind == "bsr":
        bh, bw = bsr_params(fmt)
        return kind, None, bh * bw
    return kind, delta_bits(fmt), 1


def spmm_cost(rates: Rates, request: Request) -> tuple[float, int, float, str]:
    """(seconds, peak extra bytes, setup seconds, kind) of one product with the request's columns."""
    A = request.A
    m, n = int(A.shape[-2]), int(A.shape[-1])
    vs = torch.empty((), dtype=A.dtype).element_size()
    idt = A.format.index_dtype if A.format is not None else None
    isz = 4 if idt == torch.int32 else 8
    batch = max(1, math.prod(A.batch_shape))
    k = max(1, request.rhs_columns // batch)
    nse = int(A.nse or 0)
    kind, bits, block = _kind_of(request)
    narrowed = kind == "csr" and isz == 8 and max(nse, m, n) < INT_LIMIT  # the plan keeps int32 copies
    if kind == "generic":
        isz = 4 if max(nse, m, n) < 2**31 - 1 else 8
    elif narrowed:
        isz = 4
    nbytes = traffic(kind, m=m, n=n, nnz=nse, k=k, vs=vs, isz=isz, slots=nse, bits=bits, block=block)
    from .plan import STREAM_MEAN  # noqa: PLC0415

    variant = "stream" if kind in ("csr", "generic") and nse / max(m, 1) <= STREAM_MEAN else "vector"
    bw = rates.bandwidth * bandwidth_scale(rates)
    seconds = batch * predict(family(kind, k, variant), nbytes, bw, host_seconds(rates))
    peak = m * k * vs * batch
    setup = 0.0
    if kind == "generic":
        gather = nse * (2 * vs + 8) * batch
        seconds += rates.seconds(bytes=gather, launches=1)
        setup = rates.seconds(bytes=20 * 8 * nse, launches=20)  # the sort of the entries, once per pattern
        peak += nse * (vs + isz + 8)
    elif kind in ("delta", "nm"):
        peak += int(nse * (bits or 8) / 8) + 16
    elif kind == "ell":
        peak += 4 * m
    if narrowed:
        peak += 4 * (nse + m + 1)
    return seconds + setup, int(peak), setup, kind


def describe(kind: str, bits: Any = None) -> str:
    return {"csr": "CSR kernels (vector / load balanced)", "dia": "DIA kernel (no index traffic)",
            "ell": "ELL kernel", "delta": f"DELTA({bits}) bit-packed kernel (gaps packed once per pattern)",
            "nm": "N:M kernel (in-group positions packed once per pattern)", "bsr": "BSR kernel (a lane group per row)",
            "generic": "CSR kernels on a CSR made from the pattern once (one value gather per new value set)"}[kind]

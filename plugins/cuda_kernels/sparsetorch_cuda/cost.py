"""Cost model of the cuda backend, fitted to its own measurements.

One product costs ``bytes / (bandwidth * efficiency[family]) + host`` seconds:

- ``bytes`` is what the kernel must move (:func:`traffic`): the stored matrix once per column
  of X it streams (the vector kernels re-read it per column; ``csr_cols`` once), X read once, Y
  written once. DELTA(b) counts b bits per stored gap instead of an index word.
- ``bandwidth`` is the device's measured copy bandwidth (``sparsetorch.backend.rates``), times
  :func:`bandwidth_scale`: the efficiencies are fractions of a 1 GiB copy's bandwidth, and the
  core's calibration (a 128 MiB copy, best of 5) reads lower on the same GPU (H200: 3.49 against
  4.25 TB/s in one run), so measured rates are scaled by the ratio of the two in the fitting run.
- ``efficiency[family]`` (csr_vector, csr_balanced, csr_cols, csr16, dia, ell, delta, nm) is the fraction of
  that bandwidth the kernel family reached on the H200, the median over the rows of
  ``cost_h200.json`` (written by ``benchmarks/bench_cuda_kernels.py --fit``), with
  :data:`DEFAULT_EFFICIENCY` until a measurement exists.
- ``host`` is the per-call host time of ``plan.apply`` measured there (allocation of Y, the
  stream query, the launch; CPU time per call of many calls back to back, the way the core's
  calibration measures its launch unit), stored as ``host_launches``, a multiple of the launch
  unit measured in the same run, and priced at ``rates.launch`` of the machine at hand, so it is
  on the scale of the torch and cupy backends' ``launches * rates.launch``; plus one value
  gather for formats that go through the generic CSR.

The tensor-core SpMM (half-precision X of 8 or more columns, CSR and N:M 2:4) is priced by
:func:`mma_seconds` instead: a least-squares model in the dense area, the entries and the slots,
fitted to the rows of ``cost_h200.json["mma"]`` (its time follows the per-tile work, not bytes).

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
           "host_seconds", "mma_applies", "csr16_applies", "mma_seconds", "fit_mma",
           "HOST_SECONDS", "predict", "generated_seconds", "generated_traffic", "prefer_generated", "GENERATED_EFFICIENCY"]

MEASUREMENTS = Path(__file__).resolve().parent / "cost_h200.json"
#: used for a family until cost_h200.json has rows of it
DEFAULT_EFFICIENCY = {"csr_vector": 0.6, "csr_balanced": 0.45, "csr_cols": 0.3, "csr_stream": 0.7, "dia": 0.75, "ell": 0.55,
                      "delta": 0.5, "nm": 0.6, "bsr": 0.5, "csr16": 0.4}
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
    from .layout import STREAM_DEFAULT, STREAM_MAX_ROW, STREAM_MEAN  # noqa: PLC0415

    mean = nnz / max(m, 1)
    if max_row > max(SKEW_MIN_ROW, SKEW_FACTOR * mean):
        return "balanced"
    return STREAM_DEFAULT if mean <= STREAM_MEAN and max_row <= STREAM_MAX_ROW else "vector"


def family(kind: str, k: int, variant: str = "vector") -> str:
    if kind in ("csr", "generic"):
        if variant == "balanced":
            return "csr_balanced"
        if variant == "csr16":
            return "csr16"
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
    if kind in ("csr", "generic") and variant == "csr16":  # uint16 columns, int32 row pointers
        mat = nnz * (vs + 2) + (m + 1) * 4
    elif kind in ("csr", "generic"):
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


#: tensor-core SpMM (kernels/mma.cu) until cost_h200.json has its fit: seconds per element of the
#: dense (m x n) area per 64 columns of X, per stored CSR entry, per N:M 2:4 slot, and per launch
MMA_DEFAULT = {"area_s": 1.5e-12, "entry_s": 8e-12, "slot_s": 1e-12, "fixed_s": 5e-6}
#: the plan's rules (plan.MMA_MIN_K, CSR16_MIN_MEAN, MMA_MAX_TILES x 8)
MMA_MIN_K = 8
CSR16_MIN_MEAN = 32
MMA_MAX_COLUMN_TILES = 512


def csr16_applies(kind: str, dtype: torch.dtype, m: int, n: int, nnz: int, k: int) -> bool:
    """Whether the plan runs a product of one right-hand side with its half-precision CSR kernel
    (uint16 columns: ``traffic(..., variant="csr16")``, family "csr16"): long rows (a mean of at
    least CSR16_MIN_MEAN) where the tensor-core layout applies."""
    return (kind in ("csr", "generic") and k == 1 and dtype in (torch.float16, torch.bfloat16)
            and nnz >= CSR16_MIN_MEAN * max(m, 1) and mma_applies(kind, dtype, m, n, nnz, MMA_MIN_K))


def mma_applies(kind: str, dtype: torch.dtype, m: int, n: int, nnz: int, k: int, nm: tuple[int, int] | None = None) -> bool:
    """Whether the plan runs the tensor-core SpMM for this product (plan.CudaSpmmPlan._mma_ok,
    without the device checks: a half-precision X of MMA_MIN_K or more columns, n % 8 == 0 and
    n < 65535; CSR (or a CSR made from the pattern) with at most MMA_MAX_COLUMN_TILES column
    tiles, or N:M 2:4)."""
    if dtype not in (torch.float16, torch.bfloat16) or k < MMA_MIN_K or n % 8 or n >= 65535 or not m:
        return False
    if max(nnz, m, n, m * k, n * k) >= INT_LIMIT:
        return False
    if kind == "nm":
        return nm == (2, 4)
    return kind in ("csr", "generic") and -(-n // 64) <= MMA_MAX_COLUMN_TILES


def mma_terms(kind: str, m: int, n: int, nnz: int, k: int) -> tuple[float, float, float, float]:
    """The regressors of the tensor-core kernel's time: (dense area x 64-column blocks of X,
    CSR entries, N:M slots, 1)."""
    blocks = -(-k // 64)
    return (float(m) * n * blocks, float(nnz) * blocks if kind != "nm" else 0.0, float(nnz) * blocks if kind == "nm" else 0.0, 1.0)


def mma_coefficients() -> dict:
    return {**MMA_DEFAULT, **measurements().get("mma", {}).get("coefficients", {})}


def mma_seconds(kind: str, m: int, n: int, nnz: int, k: int) -> float:
    """Kernel seconds of the tensor-core SpMM: a linear model in :func:`mma_terms` fitted to the
    H200 rows of cost_h200.json["mma"] (least squares; :func:`fit_mma`). The kernel is bound by
    its per-tile work (stage, barriers, products; benchmarks/results/cuda_kernels_h200_s5_ablation.json),
    not by bytes, hence a model in the dense area and the entries rather than in bytes."""
    c = mma_coefficients()
    a, e, s_, one = mma_terms(kind, m, n, nnz, k)
    return max(c["area_s"] * a + c["entry_s"] * e + c["slot_s"] * s_ + c["fixed_s"] * one, 1e-6)


def fit_mma(rows: list[dict]) -> dict:
    """Least-squares coefficients of :func:`mma_seconds` from rows with kind, m, n, nnz, k and
    kernel_s (normal equations, relative error weighting: each row divided by its time)."""
    names = ("area_s", "entry_s", "slot_s", "fixed_s")
    X = [[v / r["kernel_s"] for v in mma_terms(r["kind"], r["m"], r["n"], r["nnz"], r["k"])] for r in rows]
    y = [1.0 for _ in rows]
    p = len(names)
    used = [j for j in range(p) if any(x[j] for x in X)]
    A = [[sum(x[i] * x[j] for x in X) for j in used] for i in used]
    b = [sum(x[i] * yy for x, yy in zip(X, y)) for i in used]
    # solve A c = b (Gaussian elimination, partial pivoting; a handful of unknowns)
    q = len(used)
    M = [A[i][:] + [b[i]] for i in range(q)]
    for c_ in range(q):
        piv = max(range(c_, q), key=lambda r_: abs(M[r_][c_]))
        M[c_], M[piv] = M[piv], M[c_]
        for r_ in range(q):
            if r_ != c_ and M[c_][c_]:
                f = M[r_][c_] / M[c_][c_]
                M[r_] = [a_ - f * b_ for a_, b_ in zip(M[r_], M[c_])]
    sol = {names[used[i]]: M[i][q] / M[i][i] for i in range(q)}
    return {n_: float(sol.get(n_, 0.0)) for n_ in names}


def predict(fam: str, nbytes: float, bandwidth: float, host: float | None = None) -> float:
    """Seconds of one product of ``nbytes`` in kernel family ``fam``."""
    return nbytes / (bandwidth * efficiency(fam)) + (host_seconds() if host is None else host)


def _kind_of(request: Request) -> tuple[str, int | None, int]:
    """(kind, bits per stored index: DELTA gap or N:M position, BSR block size)."""
    from .layout import _nm_pos_bits, bsr_params, delta_bits, native_kind, nm_params  # noqa: PLC0415 - layout imports torch only

    fmt = request.A.format
    kind = native_kind(fmt)
    if kind == "nm":
        return kind, _nm_pos_bits(nm_params(fmt)[1]), 1
    if kind == "bsr":
        bh, bw = bsr_params(fmt)
        return kind, None, bh * bw
    return kind, delta_bits(fmt), 1


def _slots_in_row_order(fmt: Any) -> bool:
    """Whether a format's value slots hold its entries in row-major order, one slot per entry
    (a sorted COO: every level ordered, level k is dimension k): the CSR the plan makes from its
    pattern then takes the values as they lie, no gather per value set (``_build_generic`` checks
    the order once per pattern; this is the format-level promise the estimate relies on)."""
    return fmt is not None and fmt.ndim == 2 and not fmt.num_batch_levels and fmt.is_identity and fmt.is_ordered


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
    if kind == "generic" and A.format is not None and batch == 1 and prefer_generated(A.format, (m, n), nse, k, A.dtype, rates,
                                                                                        gather=True):
        seconds, _ = generated_seconds(rates, A.format, (m, n), nse, k, A.dtype)
        return seconds, int(m * k * 4 + 2 * m * k * vs), 0.0, "generated"
    # the plan keeps int32 copies of int64 CSR indices and ELL columns that fit
    narrowed = kind in ("csr", "ell") and isz == 8 and max(nse, m, n) < INT_LIMIT
    if kind == "generic":
        isz = 4 if max(nse, m, n) < 2**31 - 1 else 8
    elif narrowed:
        isz = 4
    from .layout import STREAM_MEAN, nm_params  # noqa: PLC0415

    variant = "stream" if kind in ("csr", "generic") and nse / max(m, 1) <= STREAM_MEAN else "vector"
    if csr16_applies(kind, A.dtype, m, n, nse, k):
        variant = "csr16"  # the plan's batch-1 kernel for long half-precision rows
    nbytes = traffic(kind, m=m, n=n, nnz=nse, k=k, vs=vs, isz=isz, slots=nse, bits=bits, block=block, variant=variant)
    bw = rates.bandwidth * bandwidth_scale(rates)
    if batch == 1 and mma_applies(kind, A.dtype, m, n, nse, k, nm_params(A.format) if kind == "nm" else None):
        seconds = mma_seconds(kind, m, n, nse, k) + host_seconds(rates)
    else:
        seconds = batch * predict(family(kind, k, variant), nbytes, bw, host_seconds(rates))
    peak = m * k * vs * batch
    setup = 0.0
    if kind == "generic":
        if not _slots_in_row_order(A.format):  # else the CSR made from the pattern reads A's values as they lie
            gather = nse * (2 * vs + 8) * batch
            seconds += rates.seconds(bytes=gather, launches=1)
        setup = rates.seconds(bytes=20 * 8 * nse, launches=20)  # the sort of the entries, once per pattern
        peak += nse * (vs + isz + 8)
    elif kind in ("delta", "nm"):
        peak += int(nse * (bits or 8) / 8) + 16
    elif kind == "ell":
        peak += 4 * m
    if narrowed:
        peak += 4 * (nse + m + 1) if kind == "csr" else 4 * nse
    return seconds + setup, int(peak), setup, kind


#: kernels generated from the format (codegen.py): fraction of the copy bandwidth per strategy, from
#: benchmarks/results/cuda_codegen_h200_s6.json (114^3 stencil, k = 1; bytes as generated_traffic
#: counts them): rows 0.66 (CSR 0.66, DIA_J 0.69 in float64), cols 0.5 (CSC), scatter 0.4 (COO).
#: A strategy set to None is never chosen by the cost model (kernel="generated" still runs it).
GENERATED_EFFICIENCY: dict[str, float | None] = {"rows": 0.66, "cols": 0.5, "scatter": 0.4}
DEFAULT_GENERATED = {"rows": 0.45, "cols": 0.15, "scatter": 0.1}
#: copy bandwidth used where no calibrated rates are given (H200, bytes/s)
_NOMINAL_BANDWIDTH = 4.2e12


def generated_traffic(fmt: Any, m: int, n: int, slots: int, k: int, vs: int, isz: int) -> float:
    """Bytes of one generated product: every value slot (and an index word per slot when the last
    level stores coordinates) once per column of X (the kernels walk the levels per column), X
    read and Y written once; the atomic strategies also initialise and finalise an accumulator."""
    from .codegen import analyse  # noqa: PLC0415 - codegen imports torch and sparsetorch only

    an = analyse(fmt)
    extra = 2 * m * k * max(vs, 4) if an.atomics else 0
    per_slot = vs + (isz if fmt.levels[-1].format.has_crd else 0)
    return k * slots * per_slot + (m + n) * k * vs + extra


def generated_seconds(rates: Rates | None, fmt: Any, shape: tuple[int, int], slots: int, k: int, dtype: torch.dtype,
                      isz: int = 4) -> tuple[float, bool]:
    """(seconds, measured) of one product through the generated kernel."""
    from .codegen import analyse  # noqa: PLC0415

    an = analyse(fmt)
    eff = GENERATED_EFFICIENCY.get(an.strategy)
    measured = eff is not None
    vs = torch.empty((), dtype=dtype).element_size()
    nbytes = generated_traffic(fmt, shape[0], shape[1], slots, k, vs, isz)
    launches = 1 if an.strategy == "rows" else 3
    bw = rates.bandwidth * bandwidth_scale(rates) if rates is not None else _NOMINAL_BANDWIDTH
    return nbytes / (bw * (eff if measured else DEFAULT_GENERATED[an.strategy])) + launches * host_seconds(rates), measured


def prefer_generated(fmt: Any, shape: tuple[int, int], slots: int, k: int = 1, dtype: torch.dtype = torch.float32,
                     rates: Rates | None = None, gather: bool = False) -> bool:
    """Whether a format without a kernel of its own runs the generated kernel rather than the CSR
    made from its pattern: float32 / float64 only (half types keep the tensor-core path), where the
    generated strategy's efficiency is measured and its product is cheaper than the CSR kernel's
    (plus the value gather, ``gather=True``, when every product brings new values)."""
    if dtype not in (torch.float32, torch.float64):
        return False
    try:
        from .codegen import analyse  # noqa: PLC0415

        an = analyse(fmt)
    except Exception:  # noqa: BLE001 - a format codegen does not take: the CSR path
        return False
    if GENERATED_EFFICIENCY.get(an.strategy) is None:
        return False
    m, n = shape
    vs = torch.empty((), dtype=dtype).element_size()
    gen, _ = generated_seconds(rates, fmt, shape, slots, k, dtype)
    bw = rates.bandwidth * bandwidth_scale(rates) if rates is not None else _NOMINAL_BANDWIDTH
    variant = "stream" if slots / max(m, 1) <= 16 else "vector"
    csr = predict(family("generic", k, variant), traffic("generic", m=m, n=n, nnz=slots, k=k, vs=vs, isz=4, variant=variant),
                  bw, host_seconds(rates))
    if gather:
        csr += slots * (2 * vs + 8) / bw + host_seconds(rates)
    return gen < csr


def describe(kind: str, bits: Any = None) -> str:
    return {"csr": "CSR kernels (vector / load balanced)", "dia": "DIA kernel (no index traffic)",
            "ell": "ELL kernel", "delta": f"DELTA({bits}) bit-packed kernel (gaps packed once per pattern)",
            "nm": "N:M kernel (in-group positions packed once per pattern)", "bsr": "BSR kernel (a lane group per row)",
            "generic": "CSR kernels on a CSR made from the pattern once (one value gather per new value set)",
            "generated": "a kernel generated from the format's levels (codegen.py; storage read as it is)"}[kind]

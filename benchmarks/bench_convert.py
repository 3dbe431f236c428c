"""Format conversion on the CPU: sparsetorch vs SciPy, side by side in one run.

A random ~1M-nonzero 20000 x 20000 float64 matrix, a banded one of the same size (for DIA) and,
for N:M, a 2000 x 1000 matrix with exactly 2 nonzeros in every 4-column strip (1M nonzeros; N:M
stores 2 slots per strip of every row, so a 20000 x 20000 N:M tensor would hold 200M slots) are
converted CSR -> format and format -> CSR. For each case the median of several repeats of a *fresh* conversion is timed
(time.perf_counter; torch's thread count left as it is): every repeat wraps the source buffers
in a new SparseTensor, so the per-pattern conversion cache that sparsetorch keeps on a tensor
does not help. The cached, values-only re-conversion (what a training loop pays once the pattern
is known) is reported separately as ``ours_cached_s``.

SciPy's own conversions are timed where SciPy has the format (tocoo, tocsc, tobsr, todia and
back with tocsr); SciPy has no ELL, DELTA or N:M: its columns are null there. Every result is
checked once against SciPy's buffers or by converting back to the original CSR.

SciPy's ``tobsr`` leaves the blocks of a block row in first-seen order (not canonical); ours are
sorted, as the format declares: ``scipy_canonical_median_s`` times ``tobsr`` + ``sort_indices``,
the same result as ours, beside it. Our conversions and SciPy's are timed alternately, call by
call (A/B), so that load from other work on the machine falls on both alike. The fill guard is
lifted (``max_fill=inf``): BSR(4,4) of the random matrix stores 15.7 slots per nonzero.

    python benchmarks/bench_convert.py                 # writes benchmarks/results/convert_cpu.json
    python benchmarks/bench_convert.py --n 4000 --repeats 3 --out /tmp/x.json   # a quick look
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import scipy
import scipy.sparse as sp
import torch

import sparsetorch
from sparsetorch import SparseTensor
from sparsetorch.format import BSR, COO, CSC, CSR, DELTA, DIA, DIA_J, ELL, NM

HERE = Path(__file__).resolve().parent


def random_matrix(n: int, nnz: int, seed: int) -> sp.csr_array:
    """n x n, about ``nnz`` nonzeros at uniform random places."""
    rng = np.random.default_rng(seed)
    lin = np.unique(rng.integers(0, n * n, size=nnz, dtype=np.int64))
    rows, cols = lin // n, lin % n
    vals = rng.standard_normal(rows.size)
    vals[vals == 0] = 1.0
    m = sp.csr_array((vals, (rows, cols)), shape=(n, n))
    m.sort_indices()
    return m


def nm_matrix(rows: int, cols: int, seed: int) -> sp.csr_array:
    """rows x cols with exactly 2 nonzeros at random places in every strip of 4 columns."""
    rng = np.random.default_rng(seed)
    strips = cols // 4
    pick = np.argsort(rng.random((rows, strips, 4)), axis=2)[:, :, :2]
    pick.sort(axis=2)
    c = (np.arange(strips)[None, :, None] * 4 + pick).reshape(rows, -1)
    r = np.repeat(np.arange(rows), c.shape[1])
    vals = rng.standard_normal(r.size)
    vals[vals == 0] = 1.0
    m = sp.csr_array((vals, (r, c.reshape(-1))), shape=(rows, cols))
    m.sort_indices()
    return m


def banded_matrix(n: int, nnz: int, seed: int) -> sp.csr_array:
    """n x n with ``nnz / n`` full diagonals around the main one."""
    rng = np.random.default_rng(seed)
    half = max(1, nnz // n // 2)
    offsets = np.arange(-half, half)
    data = rng.standard_normal((offsets.size, n))
    data[data == 0] = 1.0
    m = sp.dia_array((data, offsets), shape=(n, n)).tocsr()
    m.sort_indices()
    return m


def as_tensor(m: sp.csr_array) -> SparseTensor:
    """Wrap SciPy's CSR buffers (zero-copy, in the index dtype SciPy chose for them)."""
    return SparseTensor(CSR, m.shape, [None, torch.from_numpy(m.indptr)], [None, torch.from_numpy(m.indices)],
                        torch.from_numpy(m.data), check=False)


def fresh(t: SparseTensor) -> SparseTensor:
    """The same buffers in a new tensor object: no cached conversion plans."""
    return SparseTensor(t.format, t.shape, t.pos_buffers, t.crd_buffers, t.values, check=False)


SPREAD: dict[int, float] = {}


def median_time(fn, repeats: int) -> float:
    """Median of ``repeats`` timed calls after one warm-up call; the minimum goes to SPREAD."""
    fn()  # warm-up (first-call costs, allocator)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    SPREAD[id(fn)] = min(times)
    return med


def timed(fn, repeats: int) -> tuple[float, float]:
    """(median, min) seconds."""
    med = median_time(fn, repeats)
    return med, SPREAD.pop(id(fn))


def paired(fns: list, repeats: int) -> list[tuple[float, float] | tuple[None, None]]:
    """(median, min) seconds of each function (None: skipped), timed alternately: one call of
    each in turn, ``repeats`` rounds, after one warm-up call of each."""
    live = [f for f in fns if f is not None]
    for f in live:
        f()
    times: dict[int, list[float]] = {id(f): [] for f in live}
    for _ in range(repeats):
        for f in live:
            t0 = time.perf_counter()
            f()
            times[id(f)].append(time.perf_counter() - t0)
    return [(statistics.median(times[id(f)]), min(times[id(f)])) if f is not None else (None, None) for f in fns]


def same_matrix(t: SparseTensor, m: sp.csr_array) -> bool:
    """``t`` (CSR) holds the matrix ``m``: the same entries, plus possibly stored zeros (the padding
    of the intermediate format is kept as explicit zeros unless drop_zeros=True)."""
    got = sp.csr_array((t.values.numpy(), t.crd(1).numpy(), t.pos(1).numpy()), shape=m.shape)
    diff = got - m
    diff.eliminate_zeros()
    return got.nnz >= m.nnz and diff.nnz == 0


def check_against_scipy(name: str, ours: SparseTensor, ref) -> bool:
    """Our buffers equal SciPy's for the formats SciPy has."""
    if ref is None:
        return True
    if name == "COO":
        return (np.array_equal(ours.crd(0).numpy(), ref.row) and np.array_equal(ours.crd(1).numpy(), ref.col)
                and np.array_equal(ours.values.numpy(), ref.data))
    if name == "CSC":
        ref.sort_indices()
        return (np.array_equal(ours.pos(1).numpy(), ref.indptr) and np.array_equal(ours.crd(1).numpy(), ref.indices)
                and np.array_equal(ours.values.numpy(), ref.data))
    if name.startswith("BSR"):
        ref.sort_indices()
        bh, bw = ref.blocksize
        return (np.array_equal(ours.pos(1).numpy(), ref.indptr) and np.array_equal(ours.crd(1).numpy(), ref.indices)
                and np.array_equal(ours.values.numpy().reshape(-1, bh, bw), ref.data))
    if name == "DIA_J":  # SciPy's dia layout: one slot per column on each diagonal
        w = ref.data.shape[1]
        vals = ours.values.numpy().reshape(len(ref.offsets), -1)
        order = np.argsort(ref.offsets)
        return (np.array_equal(ours.crd(0).numpy(), ref.offsets[order])
                and np.array_equal(vals[:, :w], ref.data[order]) and not vals[:, w:].any())
    if name == "DIA":  # indexed by row: same diagonals as SciPy's, other slot order
        return np.array_equal(ours.crd(0).numpy(), np.sort(ref.offsets))
    raise AssertionError(name)


INF = float("inf")


def sort_indices(x):
    """SciPy's matrix with its indices sorted in place (the canonical layout), returned."""
    x.sort_indices()
    return x


CASES = [
    # (name, our format, matrix, scipy to-format, scipy back to CSR)
    ("COO", COO, "random", lambda m: m.tocoo(), lambda x: x.tocsr()),
    ("CSC", CSC, "random", lambda m: m.tocsc(), lambda x: x.tocsr()),
    ("BSR(2,2)", BSR(2, 2), "random", lambda m: m.tobsr(blocksize=(2, 2)), lambda x: x.tocsr()),
    ("BSR(4,4)", BSR(4, 4), "random", lambda m: m.tobsr(blocksize=(4, 4)), lambda x: x.tocsr()),
    ("ELL", ELL, "random", None, None),
    ("DELTA(4)", DELTA(4), "random", None, None),
    ("DELTA(8)", DELTA(8), "random", None, None),
    ("NM(2,4)", NM(2, 4), "nm", None, None),
    ("DIA", DIA, "banded", lambda m: m.todia(), lambda x: x.tocsr()),
    ("DIA_J", DIA_J, "banded", lambda m: m.todia(), lambda x: x.tocsr()),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="matrix side (default 20000)")
    ap.add_argument("--nnz", type=int, default=1_000_000, help="target nonzeros (default 1e6)")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement (median)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1,
                    help="for the cases with a SciPy peer, repeat the alternating measurement this many times and "
                         "report the range of the per-round ratios (ratio_rounds; the main figures are the first round's)")
    ap.add_argument("--only", nargs="*", default=None, help="format names to run (e.g. 'BSR(2,2)' 'BSR(4,4)'); default all")
    ap.add_argument("--out", default=str(HERE / "results" / "convert_cpu.json"))
    args = ap.parse_args(argv)

    load_before = os.getloadavg()
    mats = {"random": random_matrix(args.n, args.nnz, args.seed), "banded": banded_matrix(args.n, args.nnz, args.seed + 1),
            "nm": nm_matrix(max(4, 2 * args.nnz // (args.n // 20)), args.n // 20, args.seed + 2)}
    tensors = {k: as_tensor(m) for k, m in mats.items()}
    results = []
    header = f"{'case':<16}{'nnz':>9}{'ours s':>10}{'scipy s':>10}{'ratio':>8}{'cached s':>10}  ok"
    print(f"sparsetorch {sparsetorch.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"scipy {scipy.__version__}; {args.n}x{args.n}, medians of {args.repeats}")
    print(header)
    print("-" * len(header))
    only = None if args.only is None else set(args.only)
    for name, fmt, which, sp_to, sp_back in CASES:
        if only is not None and name not in only:
            continue
        m, t = mats[which], tensors[which]
        # Correctness once: our conversion vs SciPy's buffers, and the way back is the original.
        # (Each conversion runs on a fresh wrapper: `t` itself never caches a plan, which would keep
        # every target's buffers alive for the whole run.)
        ours = fresh(t).convert(fmt, max_fill=INF)
        ref = sp_to(m) if sp_to else None
        back = fresh(ours).convert(CSR)
        ok = check_against_scipy(name, ours, ref) and same_matrix(back, m)
        for direction in ("to", "back"):
            canon = None
            if direction == "to":
                keep = fresh(t)  # its first call caches the plan on it
                if name.startswith("BSR"):
                    canon = lambda: sort_indices(sp_to(m))  # noqa: E731
                (ours_s, ours_min), (scipy_s, scipy_min), (canon_s, _), (cached, _) = paired(
                    [lambda: fresh(t).convert(fmt, max_fill=INF), (lambda: sp_to(m)) if sp_to else None, canon,
                     lambda: keep.convert(fmt, max_fill=INF)], args.repeats)
                label = f"CSR->{name}"
            else:
                keep = fresh(ours)
                (ours_s, ours_min), (scipy_s, scipy_min), (canon_s, _), (cached, _) = paired(
                    [lambda: fresh(ours).convert(CSR), (lambda: sp_back(ref)) if sp_back else None, None,
                     lambda: keep.convert(CSR)], args.repeats)
                label = f"{name}->CSR"
            ratio = ours_s / scipy_s if scipy_s else None
            rounds = []  # per-round (ours / SciPy, ours / SciPy canonical), alternating as above
            if scipy_s:
                rounds.append([ratio, ours_s / canon_s if canon_s else None])
                for _ in range(args.rounds - 1):
                    fns = ([lambda: fresh(t).convert(fmt, max_fill=INF), lambda: sp_to(m), canon] if direction == "to"
                           else [lambda: fresh(ours).convert(CSR), lambda: sp_back(ref), None])
                    (o, _), (sc, _), (cn, _) = paired(fns, args.repeats)
                    rounds.append([o / sc, o / cn if cn else None])
            results.append({
                "case": label, "matrix": which, "shape": list(m.shape), "nnz": int(m.nnz),
                "stored_slots_in_format": int(ours.nse),
                "ours_median_s": ours_s, "scipy_median_s": scipy_s, "ratio_ours_over_scipy": ratio,
                "ours_min_s": ours_min, "scipy_min_s": scipy_min,
                "scipy_canonical_median_s": canon_s,
                "ratio_ours_over_scipy_canonical": ours_s / canon_s if canon_s else None,
                "ours_cached_s": cached,
                "ratio_rounds": rounds or None,
                "ratio_range": [min(r[0] for r in rounds), max(r[0] for r in rounds)] if rounds else None,
                "ratio_canonical_range": ([min(r[1] for r in rounds), max(r[1] for r in rounds)]
                                          if rounds and rounds[0][1] is not None else None),
                "scipy_method": None if sp_to is None else (
                    {"COO": "tocoo", "CSC": "tocsc", "DIA": "todia", "DIA_J": "todia"}.get(name, "tobsr")
                    if direction == "to" else "tocsr"),
                "verified": bool(ok),
            })
            keep = None  # free the cached plan before the next format
            r = results[-1]
            print(f"{label:<16}{r['nnz']:>9}{ours_s:>10.4f}{(scipy_s if scipy_s else float('nan')):>10.4f}"
                  f"{(ratio if ratio else float('nan')):>8.2f}{cached:>10.4f}  {'yes' if ok else 'NO'}")
        ours = back = ref = None
        gc.collect()

    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    doc = {
        "benchmark": "format conversion, CPU: sparsetorch vs SciPy",
        "note": ("Timings are on 2 shared CPU cores (a small, shared virtual machine): absolute seconds are "
                 "noisy and slow, compare the ratios (ours / SciPy) measured side by side in this one run. "
                 "The load average before/after (machine) shows the other work sharing the cores during the run. "
                 "ours_median_s is a fresh conversion (no cached plan); ours_cached_s re-converts a tensor "
                 "whose conversion plan is cached (values only). SciPy has no ELL, DELTA or N:M: null there."),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "processor": platform.processor(),
                    "cpu_model": cpu_model, "torch_threads": torch.get_num_threads(),
                    "load_average_1_5_15min_before": [round(x, 2) for x in load_before],
                    "load_average_1_5_15min_after": [round(x, 2) for x in os.getloadavg()]},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
                     "scipy": scipy.__version__, "sparsetorch": sparsetorch.__version__},
        "command": " ".join(([f"PYTHONPATH={os.environ['PYTHONPATH']}"] if os.environ.get("PYTHONPATH") else [])
                            + [Path(sys.executable).name, *sys.argv]),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "parameters": {"n": args.n, "nnz_target": args.nnz, "repeats": args.repeats, "seed": args.seed,
                       "dtype": "float64", "index_dtype": {k: str(m.indices.dtype) for k, m in mats.items()},
                       "statistic": ("median of repeats after one warm-up call; ours, SciPy's, SciPy's canonical and "
                                     "ours cached timed alternately, one call of each per round"),
                       "max_fill": "inf", "rounds": args.rounds, "only": args.only},
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if all(r["verified"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

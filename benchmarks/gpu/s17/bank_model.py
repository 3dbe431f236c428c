"""Session 17: a model of the shared-memory bank conflicts of the DELTA(4) "tc" kernels' X gathers (no GPU).

A row of 8192 columns at density p is stored as DELTA(4) does (a padding entry wherever a gap exceeds 15);
each step of a warp takes 256 stored entries, lane l the unit of entries 8 l .. 8 l + 7, and gather j reads
X (fp16) at the column of entry 8 l + j in every lane at once. A gather costs as many shared-memory wavefronts
as the most distinct 4-byte words any one bank is asked for. Printed: the mean over rows and gathers for X
stored plainly and with a few skewed / swizzled layouts.

    python benchmarks/gpu/s17/bank_model.py
"""

from __future__ import annotations

import numpy as np

LAYOUTS = ("plain", "skew64", "skew128", "skew256x2", "xor", "xor2")


def row_columns(rng: np.random.Generator, n: int, p: float) -> np.ndarray:
    """The stored columns of one row: the nonzeros and DELTA(4)'s padding entries."""
    out, prev = [], -1
    for c in np.flatnonzero(rng.random(n) < p):
        while c - prev - 1 > 15:  # a gap of 16 or more: a padding entry 16 columns on
            prev += 16
            out.append(prev)
        out.append(c)
        prev = c
    return np.array(out)


def words(c: np.ndarray, kind: str) -> np.ndarray:
    """The 4-byte word of shared memory holding X[c] in layout ``kind``."""
    w = c // 2
    if kind == "plain":
        return w
    if kind == "skew64":
        return w + c // 64
    if kind == "skew128":
        return w + c // 128
    if kind == "skew256x2":
        return w + 2 * (c // 256)
    if kind == "xor":
        return (w // 32) * 32 + ((w % 32) ^ ((w // 32) % 32))
    return (w // 32) * 32 + ((w % 32) ^ (((w // 32) * 8) % 32))  # xor2


def wavefronts(wds: np.ndarray) -> int:
    banks = wds % 32
    return max(len(np.unique(wds[banks == b])) for b in np.unique(banks))


def main() -> None:
    rng = np.random.default_rng(0)
    for p in (0.5, 0.3, 0.1):
        got: dict[str, list[int]] = {k: [] for k in LAYOUTS}
        for _ in range(40):
            cols = row_columns(rng, 8192, p)
            for s0 in range(0, len(cols) - 256, 256):
                step = cols[s0:s0 + 256].reshape(32, 8)
                for j in range(8):
                    for k in LAYOUTS:
                        got[k].append(wavefronts(words(step[:, j], k)))
        print(f"density {p}: " + ", ".join(f"{k} {np.mean(v):.2f}" for k, v in got.items()))


if __name__ == "__main__":
    main()

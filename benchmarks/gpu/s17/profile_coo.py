"""Session 17: where the host time of a GPU CSR -> COO goes (cProfile of prewrapped conversions, the
tensor's conversion cache emptied before each), by the short path (construct.FAST_DIRECT) and the
general steps, 20000^2 with 1M entries as in benchmarks/bench_convert_gpu.py. Prints the tables."""

from __future__ import annotations

import cProfile
import io
import pstats
import sys

import torch

import sparsetorch as st
from sparsetorch.format import COO, CSR
from sparsetorch.tensor import construct


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 1
    g = torch.Generator().manual_seed(0)
    n, nnz = 20000, 1_000_000
    dev = torch.device("cuda")
    A = st.SparseTensor.from_coo(torch.randn(nnz, generator=g, dtype=torch.float64).to(dev),
                                 torch.randint(0, n, (nnz,), generator=g).to(dev),
                                 torch.randint(0, n, (nnz,), generator=g).to(dev), shape=(n, n), format=CSR)
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    for fast in (True, False):
        construct.FAST_DIRECT = fast

        def run():
            for _ in range(calls):
                A.clear_cache()
                A.convert(COO)
            torch.cuda.synchronize()

        run()
        prof = cProfile.Profile()
        prof.enable()
        run()
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(22)
        print(f"== FAST_DIRECT={fast}, {calls} calls")
        print(buf.getvalue()[-6000:])
    construct.FAST_DIRECT = True
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Session 11 (H2) diagnostics of spmm_cc on 4096^2 at 10 %, k = 64, float16: the launch the op picks (clusters
ncl, the driver's resident-cluster count, registers), and graph20 times against ncl and the flags (15: the empty
skeleton). Prints only."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_s5 import graph_time  # noqa: E402
from bench_s11_cc import _csr, _layer  # noqa: E402
from sparsetorch_cuda import _spmm_cc, launch  # noqa: E402

W, b = _layer(4096, 4096, torch.float16, 0.1, 8192)
_, rp, col, vals = _csr(W)
x = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
cu = launch._driver()
print("dense", round(graph_time(lambda: torch.nn.functional.linear(x, W, b), 15) * 1e6, 2))
for fmt, C in (("dense", 8), ("z", 8)):
    op = _spmm_cc.CcSpmm(rp, col, vals, (4096, 4096), clusters=C, fmt=fmt)
    kern, grid, threads, smem, ncl = op._launch_args(64)
    err, regs = cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, kern._fn)
    err2, lmem = cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, kern._fn)
    print(fmt, C, "grid", grid, "threads", threads, "smem", smem, "ncl", ncl, "regs", regs, "local", lmem, flush=True)
    out = torch.empty(64, 4096, dtype=torch.float16, device="cuda")
    for n_cl in (None, 8, 16, 30):
        row = []
        for flags in (0, 15, 8, 4):
            op.ncl, op.flags = n_cl, flags
            row.append(round(graph_time(lambda: op(x, b, out=out), 15) * 1e6, 2))
        print(f"  ncl={n_cl}: flags 0 / 15 / 8 / 4 us {row}", flush=True)

"""Half-precision SparseLinear on the GPU: forward and forward+backward vs dense nn.Linear (issue 17; writes the rows of half_gpu.json to argv[1])."""
import json
import sys
import time

import torch
from sparsetorch.nn import SparseLinear

def bench(fn, reps=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps

out = []
torch.manual_seed(0)
for dtype in (torch.float16, torch.bfloat16):
    lin = torch.nn.Linear(4096, 4096).to("cuda", dtype)
    for keep in (0.1, 0.01):
        for backend in ("torch", None):
            layer = SparseLinear.from_linear(lin, mask=torch.rand(4096, 4096, device="cuda") < keep, backend=backend)
            for batch in (1, 64):
                x = torch.randn(batch, 4096, device="cuda", dtype=dtype, requires_grad=True)
                def call(m, x=x):
                    return lambda: m(x)

                def fb(m, x=x):
                    return lambda: m(x).sum().backward()

                with torch.no_grad():
                    tf, td = bench(call(layer)), bench(call(lin))
                tfb, tdb = bench(fb(layer)), bench(fb(lin))
                ref = (x.detach().double() @ layer.to_dense().detach().double().T + layer.bias.detach().double())
                err = (layer(x).detach().double() - ref).abs().max().item()
                out.append(dict(dtype=str(dtype), kept=keep, backend=backend or "dispatch", batch=batch,
                                fwd_us=tf * 1e6, dense_fwd_us=td * 1e6, fwdbwd_us=tfb * 1e6, dense_fwdbwd_us=tdb * 1e6,
                                max_abs_err_vs_fp64=err))
                print(out[-1], flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)

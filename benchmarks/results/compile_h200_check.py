"""SparseLinear compiled with inductor, fullgraph, on CUDA in fp16/bf16: agreement with eager and timings."""
import json
import sys
import time

import torch
import torch._dynamo as dynamo

import sparsetorch as st
from sparsetorch.format import NM
from sparsetorch.nn import SparseLinear


def bench(fn, reps=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e6


rows = []
torch.manual_seed(0)
for dtype in (torch.float16,):
    lin = torch.nn.Linear(4096, 4096).to("cuda", dtype)
    for name, kw in (("csr_10pct", dict(mask=torch.rand(4096, 4096, device="cuda") < 0.1)), ("nm24", dict(format=NM(2, 4)))):
        if name == "nm24":
            g = lin.weight.detach().abs().reshape(4096, 1024, 4)
            kw["mask"] = torch.zeros_like(g, dtype=torch.bool).scatter_(-1, g.topk(2, -1).indices, True).reshape(4096, 4096)
        layer = SparseLinear.from_linear(lin, backend="torch", **kw)
        layer.apply(st.nn.prepare_compile)
        dynamo.reset()
        comp = torch.compile(layer, fullgraph=True)
        for batch in (1, 64):
            x = torch.randn(batch, 4096, device="cuda", dtype=dtype)
            with torch.no_grad():
                ye, yc = layer(x), comp(x)
                ref = x.double() @ layer.to_dense().double().T + layer.bias.double()
                row = dict(dtype=str(dtype), weight=name, batch=batch, eager_us=bench(lambda: layer(x)),
                           compiled_us=bench(lambda: comp(x)), dense_us=bench(lambda: lin(x)),
                           err_eager=(ye.double() - ref).abs().max().item(), err_compiled=(yc.double() - ref).abs().max().item(),
                           graph_breaks=dynamo.explain(layer)(x).graph_break_count)
            rows.append(row)
            print(row, flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)

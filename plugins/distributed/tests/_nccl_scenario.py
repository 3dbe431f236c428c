"""What the one NCCL rank runs (test_distributed_nccl.py): the matrix and vectors on the GPU."""

from __future__ import annotations

import torch

import sparsetorch_distributed as sd
from sparsetorch_distributed.problems import poisson2d_rows

M = 12


def run(comm):
    dev = torch.device("cuda", torch.cuda.current_device())
    N = M * M
    ids = torch.arange(N)
    r, c, _ = poisson2d_rows(M, ids)
    v = (torch.where(r == c, 4.0, -1.0).to(torch.float64) + 0.01 * torch.sin((r * c % 7).to(torch.float64)) * (r == c))
    v = v.to(dev).requires_grad_(True)
    A = sd.DSparseTensor.from_local_rows(r.to(dev), c.to(dev), v, (N, N), comm=comm)
    b = torch.sin(1.0 + ids.to(torch.float64)).to(dev).requires_grad_(True)
    w = torch.cos(ids.to(torch.float64)).to(dev)
    x, info = sd.solve(A, b, method="cg", rtol=1e-13, return_info=True)
    sd.dot(w, x, comm).backward()
    return dict(backend=comm.backend, device=str(x.device), r=r, c=c, v=v.detach().cpu(), x=x.detach().cpu(),
                gb=b.grad.cpu(), gv=v.grad.cpu(), converged=bool(info.converged))

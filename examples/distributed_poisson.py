"""Distributed 2-D Poisson: each rank assembles its own rows, solves, backpropagates into kappa,
and ends with the operator's smallest eigenvalues (distributed eigsh).

    torchrun --nproc-per-node 2 examples/distributed_poisson.py --grid 64

-div(kappa grad u) = 1 on an m x m grid (Dirichlet boundary), kappa one value per unknown, owned by
the rank owning that row. The matrix values need kappa of the neighbouring unknowns too: they come
through the matrix's own halo plan (sparsetorch_distributed.halo_exchange, differentiable), so the
gradient of the loss reaches every rank's kappa, halo contributions summed back to their owners.
No rank ever holds the global matrix or a global vector.
"""

from __future__ import annotations

import argparse
import time

import torch

import sparsetorch_distributed as sd
from sparsetorch_distributed.problems import coefficient_values, poisson2d_rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", type=int, default=48, help="grid side (N = m^2 unknowns)")
    ap.add_argument("--steps", type=int, default=3, help="gradient steps on kappa")
    args = ap.parse_args()
    comm = sd.init()
    dev = comm.device
    m, N = args.grid, args.grid * args.grid
    off = sd.contiguous_offsets(N, comm.size)
    ids = torch.arange(off[comm.rank], off[comm.rank + 1])
    rows, cols, nbnd = poisson2d_rows(m, ids)
    # the pattern (and its halo plan) once; values follow kappa below
    A = sd.DSparseTensor.from_local_rows(rows.to(dev), cols.to(dev), torch.ones(rows.numel(), dtype=torch.float64, device=dev),
                                         (N, N), comm=comm)
    p = A.pattern
    xg, yg = (ids // m).double() / m, (ids % m).double() / m
    target_kappa = (1.0 + 0.5 * torch.sin(2 * torch.pi * xg) * torch.sin(2 * torch.pi * yg)).to(dev)
    theta = torch.zeros(ids.numel(), dtype=torch.float64, device=dev, requires_grad=True)   # kappa = exp(theta)
    f = torch.ones(ids.numel(), dtype=torch.float64, device=dev)

    def forward(kappa):
        k_ext = torch.cat([kappa, sd.halo_exchange(kappa, p.halo)])       # owned, then halo columns
        vals = coefficient_values(p.row, p.col, k_ext[p.row], k_ext[p.col], nbnd.to(dev), p.row, p.n_local)
        return sd.solve(A.with_values(vals), f, return_info=True)

    with torch.no_grad():
        u_obs, _ = forward(target_kappa)
    opt = torch.optim.Adam([theta], lr=0.1)
    for step in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        u, info = forward(torch.exp(theta))
        misfit = u - u_obs
        loss = sd.dot(misfit, misfit, comm) / sd.dot(u_obs, u_obs, comm)
        loss.backward()                       # adjoint: one distributed solve with A^T
        gnorm = sd.norm(theta.grad, comm)
        opt.step()
        if comm.rank == 0:
            print(f"step {step}: relative misfit {loss.item():.3e}, |grad| {gnorm.item():.3e}, {info.method}+"
                  f"{info.preconditioner} {info.iterations} iterations, residual {info.residual:.2e}, "
                  f"{time.perf_counter() - t0:.2f} s on {comm.size} rank(s)")
    # the smallest eigenvalues of the final operator (distributed block Lanczos; w is replicated)
    with torch.no_grad():
        k_ext = torch.cat([torch.exp(theta), sd.halo_exchange(torch.exp(theta), p.halo)])
        vals = coefficient_values(p.row, p.col, k_ext[p.row], k_ext[p.col], nbnd.to(dev), p.row, p.n_local)
        w, V, einfo = sd.eigsh(A.with_values(vals), 3, which="SA", return_info=True)
    if comm.rank == 0:
        print(f"smallest eigenvalues {[round(x, 6) for x in w.tolist()]} ({einfo.matvecs} products, residual "
              f"{einfo.residual:.1e})")
        print(f"halo per rank 0: {A.halo_volume()}, rows owned: {A.n_local} of {N}")


if __name__ == "__main__":
    main()

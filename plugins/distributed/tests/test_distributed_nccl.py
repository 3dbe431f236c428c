"""The NCCL path with one rank on a GPU (the lent H200): a CG solve and its gradients on CUDA
tensors against dense float64 on the CPU. Skips without CUDA or NCCL."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and torch.distributed.is_available()
                                     and torch.distributed.is_nccl_available()), reason="needs CUDA and NCCL")


def test_one_nccl_rank_solves_and_differentiates_on_the_gpu():
    from sparsetorch_distributed.launch import run_local

    env = {"PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    (out,) = run_local(1, "_nccl_scenario:run", (), timeout=170, env=env, backend="nccl", collective_timeout=30)
    assert out["backend"] == "nccl" and out["device"].startswith("cuda") and out["converged"]
    N = out["x"].numel()
    A = torch.zeros(N, N, dtype=torch.float64)
    A[out["r"], out["c"]] = out["v"]
    ids = torch.arange(N, dtype=torch.float64)
    b, w = torch.sin(1.0 + ids), torch.cos(ids)
    x = torch.linalg.solve(A, b)
    lam = torch.linalg.solve(A.T, w)
    assert float((out["x"] - x).abs().max() / x.abs().max()) < 1e-10
    assert float((out["gb"] - lam).abs().max() / lam.abs().max()) < 1e-10
    G = -torch.outer(lam, x)[out["r"], out["c"]]
    assert float((out["gv"] - G).abs().max() / G.abs().max()) < 1e-10

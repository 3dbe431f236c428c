"""The cuda backend through the conformance kit (sparsetorch.testing) on CUDA: matmul / A @ X /
X @ A / Matmul / norm in every listed format, value batches, gradients (gradcheck and the dense
oracle), against dense float64 oracles. Without a GPU every case skips."""

from __future__ import annotations

import torch

from sparsetorch.format import BSR, COO, CSC, CSR, DELTA, DIA, ELL
from sparsetorch.testing import MatmulConformance

import sparsetorch_cuda.plugin as plugin

from _cuda_helpers import gpu

pytestmark = gpu


class CudaBackend:
    backend = "cuda"
    methods = ()
    devices = ("cuda",)
    dtypes = (torch.float64, torch.float32)
    formats = (CSR, CSC, COO, BSR(2, 2), DIA, ELL, DELTA(4))
    supports_complex = False
    supports_batch = True
    supports_multiple_rhs = True
    supports_grad = True

    plugin = plugin  # registered in-process when not installed (the kit's loading hook)


class TestCudaMatmul(CudaBackend, MatmulConformance):
    pass

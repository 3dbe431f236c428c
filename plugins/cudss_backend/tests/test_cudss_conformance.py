"""The cudss backend through the conformance kit (sparsetorch.testing) on CUDA: LU, Cholesky and
LDL^T in every input format and dtype against dense float64 oracles, value batches (cuDSS
uniform batch), complex, gradients (gradcheck, dense autograd, second derivatives, torch.func),
Solver and the plan cache, and the error contract (singular, indefinite, bad input). Without
CUDA and libcudss every case skips."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st

from sparsetorch.format import BSR, COO, CSC, CSR, DIA, ELL
from sparsetorch.testing import ErrorConformance, SolveConformance

import sparsetorch_cudss.plugin as plugin

from _cudss_helpers import gpu

pytestmark = gpu


class CudssBackend:
    backend = "cudss"
    methods = plugin.METHODS
    devices = ("cuda",)
    dtypes = (torch.float64, torch.float32)
    complex_dtypes = (torch.complex128, torch.complex64)
    formats = (CSR, CSC, COO, BSR(2, 2), DIA, ELL)
    supports_complex = True
    supports_batch = True
    supports_multiple_rhs = True
    supports_grad = True
    direct_methods = frozenset(plugin.METHODS)
    symmetric_only_methods = {"cholesky": "spd", "ldlt": "symmetric"}

    plugin = plugin  # registered in-process when not installed (the kit's loading hook)


class TestCudssSolve(CudssBackend, SolveConformance):
    pass


class TestCudssErrors(CudssBackend, ErrorConformance):
    def test_device_mismatch(self):
        """A on the CPU and b on CUDA, and the other way round (the kit's version puts both on the
        backend's device)."""
        from sparsetorch.testing.problems import make_problem

        p = make_problem("spd", (4, 3), dtype=torch.float64, device="cpu")
        for A, b in ((p.A, p.rhs().cuda()), (p.A.cuda(), p.rhs())):
            with pytest.raises(st.InputError, match=r"cpu.*cuda|cuda.*cpu"):
                st.solve(A, b, backend=self.backend, method="lu")

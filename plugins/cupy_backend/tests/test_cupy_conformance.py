"""The cupy backend through the conformance kit (sparsetorch.testing) on CUDA: every method in
every input format and dtype against dense float64 oracles, value batches, complex, gradients
(gradcheck, dense autograd, second derivatives for QR, torch.func), Solver and the plan cache,
matmul/Matmul/norm, and the error contract. Without CUDA and CuPy every case skips."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st

from sparsetorch.format import BSR, COO, CSC, CSR, DIA, ELL
from sparsetorch.testing import EigshConformance, ErrorConformance, MatmulConformance, SolveConformance

import sparsetorch_cupy.plugin as plugin

from _cupy_helpers import gpu

pytestmark = gpu


class CupyBackend:
    backend = "cupy"
    methods = plugin.SOLVE_METHODS
    devices = ("cuda",)
    dtypes = (torch.float64, torch.float32)
    complex_dtypes = (torch.complex128, torch.complex64)
    formats = (CSR, CSC, COO, BSR(2, 2), DIA, ELL)
    supports_complex = True
    supports_batch = True
    supports_multiple_rhs = True
    supports_grad = True
    direct_methods = frozenset({"qr"})
    symmetric_only_methods = {"cg": "spd", "minres": "symmetric"}

    plugin = plugin  # registered in-process when not installed (the kit's loading hook)


class TestCupySolve(CupyBackend, SolveConformance):
    pass


class TestCupyMatmul(CupyBackend, MatmulConformance):
    pass


class TestCupyErrors(CupyBackend, ErrorConformance):
    def test_device_mismatch(self):
        """The kit's version builds A on the backend's base device (here CUDA) and b on CUDA too,
        so nothing mismatches for a CUDA-only backend: put A on the CPU and b on CUDA, and the
        other way round, explicitly."""
        from sparsetorch.testing.problems import make_problem

        p = make_problem("spd", (4, 3), dtype=torch.float64, device="cpu")
        for A, b in ((p.A, p.rhs().cuda()), (p.A.cuda(), p.rhs())):
            with pytest.raises(st.InputError, match=r"cpu.*cuda|cuda.*cpu"):
                st.solve(A, b, backend=self.backend, method="cg")
            with pytest.raises(st.InputError, match=r"cpu.*cuda|cuda.*cpu"):
                st.matmul(A, b, backend=self.backend)


# Added after the last H200 run of 2026-11-29 (the core's eigsh dispatch and this kit landed
# meanwhile): not yet run on a GPU. The Lanczos plan itself is checked in test_cupy_gpu.py.
class TestCupyLanczosEigsh(CupyBackend, EigshConformance):
    dtypes = (torch.float64,)
    complex_dtypes = (torch.complex128,)
    formats = (CSR, CSC, COO)
    eigsh_methods = ("lanczos",)
    eigsh_which = ("LA", "SA", "LM")
    supports_sigma = False  # cupyx's eigsh has no shift-invert: declined with the reason
    supports_generalized = False  # nor a mass matrix M

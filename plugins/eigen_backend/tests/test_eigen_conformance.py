"""The eigen backend through the conformance kits (sparsetorch.testing): every solve method in every
input format and dtype against dense float64 oracles, value batches, complex, gradients (gradcheck,
dense autograd, second derivatives for the direct methods, torch.func), Solver and the plan cache,
the error contract, and slogdet (LogdetConformance, when this core has it: its matrices are
random non-symmetric, so the method is lu; cholesky and ldlt are tested in test_eigen_direct.py)."""

from __future__ import annotations

import pytest
import torch

from sparsetorch.format import BSR, COO, CSC, CSR, DIA, ELL
from sparsetorch.testing import ErrorConformance, SolveConformance

try:  # the slogdet kit came with the core's logdet op
    from sparsetorch.testing import LogdetConformance
except ImportError:  # pragma: no cover - an older core
    LogdetConformance = None

import sparsetorch_eigen.plugin as plugin


class EigenBackend:
    backend = "eigen"
    methods = ("cholesky", "ldlt", "lu", "qr", "cg", "bicgstab")
    devices = ("cpu",)
    dtypes = (torch.float64, torch.float32)
    complex_dtypes = (torch.complex128, torch.complex64)
    formats = (CSR, CSC, COO, BSR(2, 2), DIA, ELL)
    supports_complex = True
    supports_batch = True
    supports_multiple_rhs = True
    supports_grad = True
    symmetric_only_methods = {"cg": "spd", "cholesky": "spd", "ldlt": "symmetric"}

    plugin = plugin  # registered in-process when not installed (the kit's loading hook)


class TestEigenSolve(EigenBackend, SolveConformance):
    def test_solve_identity_rhs(self, method, device):
        if method == "bicgstab":
            # Eigen's BiCGSTAB does not restart after a breakdown: on this random pattern the unit
            # vector e_4 gives rho = 0 at iteration 3 (NaN). Pinned, it raises NotConvergedError
            # (status breakdown) as it should; unpinned, dispatch falls back to a direct method.
            pytest.skip("Eigen's BiCGSTAB has no breakdown restart (e_4 on the random pattern breaks down)")
        super().test_solve_identity_rhs(method, device)


class TestEigenErrors(EigenBackend, ErrorConformance):
    pass


if LogdetConformance is not None:

    class TestEigenLogdet(EigenBackend, LogdetConformance):
        logdet_methods = ("lu",)

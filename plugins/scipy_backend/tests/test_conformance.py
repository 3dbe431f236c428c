"""The scipy backend through the conformance kit (sparsetorch.testing): every method in every
input format and dtype against dense float64 oracles, value batches, complex, gradients
(gradcheck, dense autograd, second derivatives for LU, torch.func), Solver and the plan cache,
matmul/Matmul/norm, and the error contract."""

from __future__ import annotations

import torch

from sparsetorch.format import BSR, COO, CSC, CSR, DIA, ELL
from sparsetorch.testing import ErrorConformance, MatmulConformance, SolveConformance

import sparsetorch_scipy.plugin as plugin


class ScipyBackend:
    backend = "scipy"
    methods = ("lu", "cg", "bicgstab", "gmres", "lgmres", "gcrotmk", "minres", "tfqmr", "amg")
    devices = ("cpu",)
    dtypes = (torch.float64, torch.float32)
    complex_dtypes = (torch.complex128, torch.complex64)
    formats = (CSR, CSC, COO, BSR(2, 2), DIA, ELL)
    supports_complex = True
    supports_batch = True
    supports_multiple_rhs = True
    supports_grad = True
    # AMG (as the solver) needs SPD like CG; the rest as in the kit's defaults.
    symmetric_only_methods = {"cg": "spd", "minres": "symmetric", "amg": "spd"}
    # maxiter counts restart cycles / outer iterations of restart inner steps there
    restarted_methods = frozenset({"gmres", "lgmres", "gcrotmk"})

    plugin = plugin  # registered in-process when not installed (the kit's loading hook)


class TestScipySolve(ScipyBackend, SolveConformance):
    pass


class TestScipyMatmul(ScipyBackend, MatmulConformance):
    pass


class TestScipyErrors(ScipyBackend, ErrorConformance):
    pass

"""The scipy backend's eigsh / eigs / slogdet plans through the core's conformance kits
(sparsetorch.testing: dense float64 oracles, gradcheck through a symmetric parametrization)."""

from __future__ import annotations

import pytest
import torch

from sparsetorch.backend import get_backends, reset_backends
from sparsetorch.format import COO, CSC, CSR
from sparsetorch.testing import EigsConformance, EigshConformance, LogdetConformance

import sparsetorch_scipy.plugin as plugin


class _Scipy:
    backend = "scipy"
    devices = ("cpu",)
    dtypes = (torch.float64,)
    complex_dtypes = (torch.complex128,)
    formats = (CSR, CSC, COO)
    supports_complex = True
    supports_batch = True
    supports_grad = True
    supports_generalized = True

    @pytest.fixture(autouse=True)
    def conformance_backend(self):
        backends = get_backends()
        if self.backend not in backends.names:
            backends.register(plugin, self.backend)
        yield
        reset_backends()


class TestScipyArpackEigsh(_Scipy, EigshConformance):
    eigsh_methods = ("arpack",)
    eigsh_which = ("LA", "SA", "LM", "SM")
    supports_sigma = True


class TestScipyLobpcgEigsh(_Scipy, EigshConformance):
    eigsh_methods = ("lobpcg",)
    eigsh_which = ("LA", "SA")
    supports_sigma = False  # LOBPCG has no shift-invert: declined, with the reason (test_spectral_logdet.py)


class TestScipyEigs(_Scipy, EigsConformance):
    eigs_methods = ("arpack",)


class TestScipyLogdet(_Scipy, LogdetConformance):
    logdet_methods = ("lu",)

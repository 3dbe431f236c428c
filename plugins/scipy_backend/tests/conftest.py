"""Shared fixtures of the scipy backend's tests.

The tests run from a source checkout without installing anything
(``PYTHONPATH=core:plugins/scipy_backend``): when the distribution is not installed, the
``scipy_backend`` fixture registers ``sparsetorch_scipy.plugin`` in-process under the name
"scipy" (the same validation as the entry point) and resets the backends afterwards.
"""

from __future__ import annotations

import pytest
import torch

from sparsetorch.testing.plugin_install import loaded_backend

import sparsetorch_scipy.plugin as plugin


@pytest.fixture
def scipy_backend():
    """The loaded "scipy" backend's BackendInfo (entry point if installed, else registered here)."""
    yield from loaded_backend(plugin, "scipy")


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """The matrices here are tiny: one intra-op thread avoids thread start-up costs that dominate
    on small, busy machines (as the core's tests do)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _deterministic_rates(monkeypatch):
    """Fixed calibration rates: cost estimates (and so auto-dispatch) do not depend on the machine."""
    monkeypatch.setenv("SPARSETORCH_CALIBRATION", "defaults")

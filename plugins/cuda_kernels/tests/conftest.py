"""Shared fixtures of the cuda backend's tests.

Tests that need a GPU carry the ``gpu`` marker of ``_cuda_helpers`` and skip cleanly without a
device or without cuda.bindings (CI has neither): there only the metadata tests (offers,
declines, costs, the entry point) and the host compile test (NVRTC alone) run.
"""

from __future__ import annotations

import pytest

from sparsetorch.testing.plugin_install import loaded_backend

import sparsetorch_cuda.plugin as plugin


@pytest.fixture
def cuda_backend():
    """The loaded "cuda" backend's BackendInfo (entry point if installed, else registered here)."""
    yield from loaded_backend(plugin, "cuda")


@pytest.fixture(autouse=True)
def _deterministic_rates(monkeypatch):
    """Fixed calibration rates: cost estimates (and so auto-dispatch) do not depend on the machine."""
    monkeypatch.setenv("SPARSETORCH_CALIBRATION", "defaults")

"""Shared fixtures of the cupy backend's tests.

The tests run from a source checkout without installing anything
(``PYTHONPATH=core:plugins/cupy_backend``). Tests that need a GPU and CuPy carry the ``gpu``
marker of ``_cupy_helpers`` and skip cleanly without them (CI has neither): only the metadata tests (offers,
declines, costs, the entry point) run there.
"""

from __future__ import annotations

import pytest

from sparsetorch.testing.plugin_install import loaded_backend

import sparsetorch_cupy.plugin as plugin


@pytest.fixture
def cupy_backend():
    """The loaded "cupy" backend's BackendInfo (entry point if installed, else registered here)."""
    yield from loaded_backend(plugin, "cupy")


@pytest.fixture(autouse=True)
def _deterministic_rates(monkeypatch):
    """Fixed calibration rates: cost estimates (and so auto-dispatch) do not depend on the machine."""
    monkeypatch.setenv("SPARSETORCH_CALIBRATION", "defaults")

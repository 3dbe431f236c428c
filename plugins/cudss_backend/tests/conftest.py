"""Shared fixtures of the cudss backend's tests.

They run from a source checkout without installing anything
(``PYTHONPATH=core:plugins/cudss_backend``). Tests that need a GPU and libcudss carry the ``gpu``
marker of ``_cudss_helpers`` and skip cleanly without them (CI has neither): the metadata tests
(offers, declines, costs, library lookup, the entry point) run there.
"""

from __future__ import annotations

import pytest

from sparsetorch.testing.plugin_install import loaded_backend

import sparsetorch_cudss.plugin as plugin


@pytest.fixture
def cudss_backend():
    """The loaded "cudss" backend's BackendInfo (entry point if installed, else registered here)."""
    yield from loaded_backend(plugin, "cudss")


@pytest.fixture(autouse=True)
def _deterministic_rates(monkeypatch):
    """Fixed calibration rates: cost estimates (and so auto-dispatch) do not depend on the machine."""
    monkeypatch.setenv("SPARSETORCH_CALIBRATION", "defaults")

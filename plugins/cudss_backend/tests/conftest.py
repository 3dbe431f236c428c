"""Shared fixtures of the cudss backend's tests.

They run from a source checkout without installing anything
(``PYTHONPATH=core:plugins/cudss_backend``). Tests that need a GPU and libcudss carry the ``gpu``
marker of ``_cudss_helpers`` and skip cleanly without them (CI has neither): the metadata tests
(offers, declines, costs, library lookup, the entry point) run there.
"""

from __future__ import annotations

import pytest

from sparsetorch.dispatch import get_backends, reset_backends

import sparsetorch_cudss.plugin as plugin


def ensure_registered() -> None:
    backends = get_backends()
    if "cudss" not in backends.names:
        backends.register(plugin, "cudss")
    broken = [b for b in backends.broken if b.name == "cudss"]
    assert not broken, broken


@pytest.fixture
def cudss_backend():
    """The loaded "cudss" backend's BackendInfo (entry point if installed, else registered here)."""
    ensure_registered()
    yield get_backends().info("cudss")
    reset_backends()


@pytest.fixture(autouse=True)
def _deterministic_rates(monkeypatch):
    """Fixed calibration rates: cost estimates (and so auto-dispatch) do not depend on the machine."""
    monkeypatch.setenv("SPARSETORCH_CALIBRATION", "defaults")

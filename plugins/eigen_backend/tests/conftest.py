"""Shared fixtures of the eigen backend's tests.

The plugin is normally installed (``pip install ./plugins/eigen_backend``: the entry point
registers "eigen"); when only the compiled extension sits in the source tree (a development
build, PYTHONPATH=core:plugins/eigen_backend), the fixtures register ``sparsetorch_eigen.plugin``
in-process under the same name.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from sparsetorch.testing.plugin_install import loaded_backend


def _built() -> bool:
    try:
        return importlib.util.find_spec("sparsetorch_eigen._eigen") is not None
    except ImportError:  # sparsetorch_eigen itself is not importable
        return False


# Without the compiled extension (plugin not installed, no in-place build) there is nothing to test.
collect_ignore_glob = [] if _built() else ["test_*.py"]

if _built():
    import sparsetorch_eigen.plugin as plugin


@pytest.fixture
def eigen_backend():
    """The loaded "eigen" backend's BackendInfo (entry point if installed, else registered here)."""
    yield from loaded_backend(plugin, "eigen")


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """Tiny matrices: one intra-op thread for torch avoids start-up costs on small, busy machines."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _deterministic_rates(monkeypatch):
    """Fixed calibration rates: cost estimates (and so auto-dispatch) do not depend on the machine."""
    monkeypatch.setenv("SPARSETORCH_CALIBRATION", "defaults")

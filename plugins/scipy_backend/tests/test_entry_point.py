"""The entry point: ``pip install`` the distribution into a temporary directory (offline, no build
isolation, as the core's tests/test_plugins.py does for the template) and check, in a fresh
interpreter, that sparsetorch finds the backend "scipy" through ``importlib.metadata``, lazily and
without importing SciPy until a plan is built."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sparsetorch.testing.plugin_install import fresh_env, install_plugin, run_fresh

PLUGIN = Path(__file__).resolve().parents[1]
CORE = PLUGIN.parents[1] / "core"

_SCRIPT = r"""
import json, sys
import sparsetorch
reg = sparsetorch.registry()
info = reg.info("scipy")
out = {"names": reg.names, "broken": [b.name for b in reg.broken], "distribution": info.distribution,
       "version": info.version, "scipy_after_load": "scipy" in sys.modules}
import torch
from sparsetorch.testing.problems import poisson2d
A = poisson2d(8)
x, i = sparsetorch.solve(A, torch.ones(64, dtype=torch.float64), return_info=True)
out["auto"] = [i.backend, i.method]
x, i = sparsetorch.solve(A, torch.ones(64, dtype=torch.float64), backend="scipy", method="lu", return_info=True)
out["pinned"] = [i.backend, i.method, i.residual]
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    return install_plugin(PLUGIN, tmp_path_factory, "sparsetorch_scipy", "scipy = sparsetorch_scipy.plugin")


def test_entry_point_is_found_and_used(installed) -> None:
    # other installed plugins (eigen, cupy) would compete for the auto pick
    out = run_fresh(installed, CORE, _SCRIPT, SPARSETORCH_PLUGINS="scipy")
    assert "scipy" in out["names"] and out["broken"] == []
    assert out["distribution"] == "sparsetorch-scipy" and out["version"] == "0.1.0"
    assert not out["scipy_after_load"]  # loading the backend imports no SciPy
    assert out["pinned"][:2] == ["scipy", "lu"] and out["pinned"][2] < 1e-12
    assert out["auto"][0] in ("scipy", "torch")


def test_disabled_by_environment(installed) -> None:
    env = fresh_env(installed, CORE, SPARSETORCH_DISABLE_PLUGINS="scipy")
    code = "import sparsetorch; print(sparsetorch.registry().names)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=True)
    assert "scipy" not in proc.stdout

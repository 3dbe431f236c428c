"""The entry point: ``pip install`` the distribution into a temporary directory (offline, no build
isolation) and check, in a fresh interpreter, that sparsetorch finds the backend "cudss" through
``importlib.metadata``, loads it without loading libcudss or building a plan, and that it answers
CPU tensors with a decline (so CPU dispatch is unchanged), and that the kill switch removes it."""

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
import sparsetorch, torch
reg = sparsetorch.registry()
info = reg.info("cudss")
out = {"names": reg.names, "broken": [b.name for b in reg.broken], "distribution": info.distribution,
       "version": info.version, "lib_loaded": "sparsetorch_cudss.plan" in sys.modules}
from sparsetorch.testing.problems import poisson2d
A = poisson2d(6)
x, i = sparsetorch.solve(A, torch.ones(36, dtype=torch.float64), return_info=True)
out["auto_cpu"] = [i.backend, i.method]
rows = [r for r in sparsetorch.explain("solve", A, torch.ones(36, dtype=torch.float64)).rows if r.backend == "cudss"]
out["cudss_rows"] = [[r.method, r.offer is None, r.reason] for r in rows]
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    return install_plugin(PLUGIN, tmp_path_factory, "sparsetorch_cudss", "cudss = sparsetorch_cudss.plugin")


def test_entry_point_is_found_and_declines_cpu(installed) -> None:
    out = run_fresh(installed, CORE, _SCRIPT)
    assert "cudss" in out["names"] and out["broken"] == []
    assert out["distribution"] == "sparsetorch-cudss" and out["version"] == "0.1.0"
    assert not out["lib_loaded"]
    assert out["auto_cpu"][0] != "cudss"
    assert out["cudss_rows"] and all(declined and reason for _, declined, reason in out["cudss_rows"])


def test_disabled_by_environment(installed) -> None:
    code = "import sparsetorch; print(sparsetorch.registry().names)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=fresh_env(installed, CORE, SPARSETORCH_DISABLE_PLUGINS="cudss"), check=True)
    assert "cudss" not in proc.stdout

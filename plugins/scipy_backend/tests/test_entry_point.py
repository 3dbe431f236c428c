"""The entry point: ``pip install`` the distribution into a temporary directory (offline, no build
isolation, as the core's tests/test_plugins.py does for the template) and check, in a fresh
interpreter, that sparsetorch finds the backend "scipy" through ``importlib.metadata``, lazily and
without importing SciPy until a plan is built."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
    base = tmp_path_factory.mktemp("scipy_plugin")
    src, target = base / "src", base / "site"
    shutil.copytree(PLUGIN, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache",
                                                               "tests", "benchmarks"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--quiet", "--target", str(target), str(src)],
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout}\n{proc.stderr}"
    (dist,) = target.glob("sparsetorch_scipy-*.dist-info")
    assert "scipy = sparsetorch_scipy.plugin" in (dist / "entry_points.txt").read_text()
    return target


def test_entry_point_is_found_and_used(installed) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARSETORCH_")}
    env["PYTHONPATH"] = os.pathsep.join([str(installed), str(CORE)])
    env["SPARSETORCH_CALIBRATION"] = "defaults"
    env["SPARSETORCH_PLUGINS"] = "scipy"  # other installed plugins (eigen, cupy) would compete for the auto pick
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120, env=env,
                          cwd=str(installed.parent), check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT "):])
    assert "scipy" in out["names"] and out["broken"] == []
    assert out["distribution"] == "sparsetorch-scipy" and out["version"] == "0.1.0"
    assert not out["scipy_after_load"]  # loading the backend imports no SciPy
    assert out["pinned"][:2] == ["scipy", "lu"] and out["pinned"][2] < 1e-12
    assert out["auto"][0] in ("scipy", "torch")


def test_disabled_by_environment(installed) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARSETORCH_")}
    env.update(PYTHONPATH=os.pathsep.join([str(installed), str(CORE)]), SPARSETORCH_DISABLE_PLUGINS="scipy")
    code = "import sparsetorch; print(sparsetorch.registry().names)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=True)
    assert "scipy" not in proc.stdout

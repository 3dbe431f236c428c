"""Testing a plugin's packaging: install its distribution into a temporary directory (offline,
no build isolation) and run code in a fresh interpreter that sees only that directory and the
core, as a user's environment would after ``pip install``.

::

    from sparsetorch.testing.plugin_install import install_plugin, run_fresh

    @pytest.fixture(scope="module")
    def installed(tmp_path_factory):
        return install_plugin(PLUGIN_DIR, tmp_path_factory, "sparsetorch_cudss", "cudss = sparsetorch_cudss.plugin")

    def test_found(installed):
        out = run_fresh(installed, CORE_DIR, SCRIPT)   # the JSON the script printed after "RESULT "
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["install_plugin", "fresh_env", "run_fresh", "loaded_backend"]


def install_plugin(plugin_dir: Path, tmp_path_factory: Any, module: str, entry_point: str) -> Path:
    """``pip install --target`` a copy of ``plugin_dir`` (its tests and build outputs left out);
    checks that the ``sparsetorch.backends`` entry point line ``entry_point`` was written.
    Returns the target directory."""
    base = tmp_path_factory.mktemp(f"{module}_install")
    src, target = base / "src", base / "site"
    shutil.copytree(plugin_dir, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache",
                                                                   "tests", "benchmarks"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--quiet", "--target", str(target), str(src)],
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout}\n{proc.stderr}"
    (dist,) = target.glob(f"{module}-*.dist-info")
    assert entry_point in (dist / "entry_points.txt").read_text()
    return target


def fresh_env(installed: Path, core: Path, **extra: str) -> dict:
    """The environment of a fresh interpreter: no SPARSETORCH_* settings of this process, the
    installed directory and the core on PYTHONPATH, default calibration rates."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARSETORCH_")}
    env["PYTHONPATH"] = os.pathsep.join([str(installed), str(core)])
    env["SPARSETORCH_CALIBRATION"] = "defaults"
    env.update(extra)
    return env


def run_fresh(installed: Path, core: Path, script: str, **extra: str) -> Any:
    """Run ``script`` in a fresh interpreter; returns the JSON it printed after ``RESULT ``."""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=fresh_env(installed, core, **extra), cwd=str(installed.parent), check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT "):])


def loaded_backend(plugin: Any, name: str):
    """For a pytest fixture (``yield from loaded_backend(plugin, "cudss")``): the backend ``name``
    loaded through its entry point when installed, else ``plugin`` (its hook module) registered
    here; fails if it loaded broken; yields its BackendInfo and resets the backends afterwards."""
    from ..dispatch import get_backends, reset_backends  # noqa: PLC0415

    backends = get_backends()
    if name not in backends.names:
        backends.register(plugin, name)
    broken = [b for b in backends.broken if b.name == name]
    assert not broken, broken
    yield get_backends().info(name)
    reset_backends()

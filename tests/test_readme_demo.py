"""The README's tour runs as written, and `sparsetorch demo` passes its own checks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_readme_tour_runs():
    pytest.importorskip("scipy")
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python block"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102 - our own README
    A = namespace["A"]
    assert A.shape == (2, 2) and A.nse == 4  # the two (1, 1) triplets were summed
    assert A.to_dense()[1, 1].item() == 6.0


def test_demo_passes_its_checks():
    pytest.importorskip("scipy")
    out = subprocess.run([sys.executable, "-m", "sparsetorch", "demo"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "All checks passed" in out.stdout
    assert "FAILED" not in out.stdout

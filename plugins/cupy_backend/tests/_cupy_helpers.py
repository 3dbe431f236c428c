"""Helpers the cupy backend's tests share (a unique module name: test directories share sys.path)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

HAVE_CUPY = importlib.util.find_spec("cupy") is not None
HAVE_CUDA = torch.cuda.is_available()
#: Skip marker for tests that run CuPy on a GPU (CI has neither: they skip with this reason).
gpu = pytest.mark.skipif(not (HAVE_CUPY and HAVE_CUDA),
                         reason=f"needs CUDA and CuPy (cuda available: {HAVE_CUDA}, cupy installed: {HAVE_CUPY})")

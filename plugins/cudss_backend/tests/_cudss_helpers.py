"""Helpers the cudss backend's tests share (a unique module name: test directories share sys.path)."""

from __future__ import annotations

import pytest
import torch

from sparsetorch_cudss import _lib

HAVE_CUDA = torch.cuda.is_available()
LIB_PATH, LIB_HOW = _lib.find_library()
HAVE_CUDSS = LIB_PATH is not None
#: Skip marker for tests that run cuDSS on a GPU (CI has neither: they skip with this reason).
gpu = pytest.mark.skipif(not (HAVE_CUDA and HAVE_CUDSS),
                         reason=f"needs CUDA and libcudss (cuda available: {HAVE_CUDA}, cuDSS: {LIB_PATH or LIB_HOW})")

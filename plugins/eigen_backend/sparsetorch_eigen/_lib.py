"""Loading the compiled extension once, with the thread setting from the environment."""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from sparsetorch import BackendError, InputError, SparseTorchError

__all__ = ["lib", "suffix", "Direct", "Iterative", "call"]

_SUFFIX = {torch.float32: "f32", torch.float64: "f64", torch.complex64: "c64", torch.complex128: "c128"}


@functools.lru_cache(maxsize=None)
def lib() -> Any:
    try:
        from . import _eigen
    except ImportError as exc:  # pragma: no cover - a broken install
        raise BackendError(
            f"eigen: the compiled extension sparsetorch_eigen._eigen could not be loaded ({exc}); reinstall with "
            f"pip install ./plugins/eigen_backend (needs a C++17 compiler)"
        ) from exc
    threads = os.environ.get("SPARSETORCH_EIGEN_THREADS")
    if threads:
        try:
            n = int(threads)
        except ValueError:
            n = 0
        if n < 1:
            raise BackendError(f"SPARSETORCH_EIGEN_THREADS={threads!r} is not a positive integer")
        _eigen.set_num_threads(n)
    return _eigen


def suffix(dtype: torch.dtype) -> str:
    return _SUFFIX[dtype]


def call(fn: Any, *args: Any, **kw: Any) -> Any:
    """Run one extension call; C++ errors become the library's (argument checks: InputError;
    anything else Eigen or the binding raised: BackendError). MemoryError and Python exceptions
    raised by user callbacks pass through unchanged."""
    try:
        return fn(*args, **kw)
    except (SparseTorchError, MemoryError, KeyboardInterrupt):
        raise
    except lib().InvalidArgument as exc:
        raise InputError(f"eigen: {exc}") from exc
    except RuntimeError as exc:
        if type(exc) is RuntimeError:  # what pybind11 makes of a std::exception
            raise BackendError(f"eigen: the extension failed: {exc}") from exc
        raise


def Direct(dtype: torch.dtype, *args: Any, **kw: Any) -> Any:
    return call(getattr(lib(), "Direct_" + suffix(dtype)), *args, **kw)


def Iterative(dtype: torch.dtype, *args: Any, **kw: Any) -> Any:
    return call(getattr(lib(), "Iterative_" + suffix(dtype)), *args, **kw)

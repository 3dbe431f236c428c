"""sparsetorch-eigen: Eigen's sparse solvers as a sparsetorch backend (CPU).

Importing this package loads nothing heavy; the compiled extension (``_eigen``) is loaded when a
plan is built or a function below is called.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "set_num_threads", "get_num_threads", "eigen_version"]


def _ext():
    from ._lib import lib

    return lib()


def set_num_threads(n: int) -> None:
    """Threads of Eigen's OpenMP kernels: the row-major (CSR) products ``A x`` inside the iterative
    solvers (cg, bicgstab, lsqr). The direct solvers are single-threaded in Eigen. The default is
    OpenMP's (``OMP_NUM_THREADS`` or the core count); ``SPARSETORCH_EIGEN_THREADS`` sets it at load."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"set_num_threads needs a positive int, got {n!r}")
    _ext().set_num_threads(n)


def get_num_threads() -> int:
    """The thread count Eigen's kernels use now."""
    return int(_ext().get_num_threads())


def eigen_version() -> str:
    """The Eigen version the extension was compiled against."""
    return str(_ext().eigen_version)

"""``SparseTensor.from_file``: Matrix Market (``.mtx``, through SciPy) and FROSTT (``.tns``) files."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import InputError
from ..format import COO_ND

__all__ = ["from_file"]


def from_file(filename: str | Path):
    """A COO SparseTensor from ``filename`` (duplicates summed)."""
    from .sparse_tensor import SparseTensor  # noqa: PLC0415 - the class being built

    path = Path(filename)
    suffix = path.suffix.lower()
    if suffix not in (".mtx", ".tns"):
        raise InputError(f"from_file reads Matrix Market (.mtx) and FROSTT (.tns) files; {str(filename)!r} is neither")
    if not path.is_file():
        raise InputError(f"from_file: no such file {str(filename)!r}")
    if suffix == ".mtx":
        try:
            import scipy.io  # noqa: PLC0415 - optional dependency
            import scipy.sparse  # noqa: PLC0415
        except ImportError:
            raise InputError("from_file needs SciPy for Matrix Market files (pip install scipy)") from None
        try:
            got = scipy.io.mmread(str(path))
        except (ValueError, OSError) as e:
            raise InputError(f"from_file: {str(filename)!r} is not a readable Matrix Market file ({e})") from None
        # a dense 'array' file is read as an ndarray (its zeros dropped); 'integer' values become float64 (an
        # integer dtype is not a value type the products and solves take; session 28: SuiteSparse's arrow.mtx)
        m = scipy.sparse.coo_array(got) if not scipy.sparse.issparse(got) else got.tocoo()
        data = m.data
        if data.dtype.kind in "iub":
            data = data.astype("float64")
        values = torch.as_tensor(data)
        rows, cols = torch.as_tensor(m.row, dtype=torch.int64), torch.as_tensor(m.col, dtype=torch.int64)
        return SparseTensor.from_coo(values, rows, cols, shape=m.shape, format=COO_ND(2))
    lines = [ln.split() for ln in path.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise InputError(f"from_file: {str(filename)!r} holds no entries")
    width = len(lines[0])
    if width < 2 or any(len(ln) != width for ln in lines):
        raise InputError(f"from_file: {str(filename)!r} is not FROSTT text (one line per entry: 1-based indices, then a value)")
    try:
        idx = torch.tensor([[int(v) for v in ln[:-1]] for ln in lines], dtype=torch.int64).T - 1
        values = torch.tensor([float(ln[-1]) for ln in lines], dtype=torch.float64)
    except ValueError as e:
        raise InputError(f"from_file: {str(filename)!r} has a line that is not indices and a value ({e})") from None
    if bool((idx < 0).any()):
        raise InputError(f"from_file: {str(filename)!r} has an index below 1 (FROSTT indices are 1-based)")
    shape = tuple(int(v) + 1 for v in idx.max(dim=1).values)
    return SparseTensor.from_coo(values, idx, shape=shape, format=COO_ND(len(shape)))

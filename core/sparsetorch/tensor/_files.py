"""``SparseTensor.from_file`` / ``to_file``: Matrix Market (``.mtx``, through SciPy) and FROSTT (``.tns``) files."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import InputError
from ..format import COO_ND

__all__ = ["from_file", "to_file"]


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


def to_file(t, filename: str | Path, *, symmetry: str | None = None, precision: int | None = None) -> None:
    """Write ``t`` to ``filename``: a matrix as Matrix Market (``.mtx``, SciPy's ``mmwrite``: coordinate
    format, ``symmetry`` "general" / "symmetric" / "hermitian" / "skew-symmetric" or None to let SciPy
    detect it, ``precision`` significant digits, default full round-trip precision of the dtype), any order as
    FROSTT (``.tns``: 1-based indices then the value, one line per stored entry, repeats summed). Values are
    written from the CPU; the tensor is not modified. Read back with :func:`from_file`."""
    path = Path(filename)
    suffix = path.suffix.lower()
    if suffix not in (".mtx", ".tns"):
        raise InputError(f"to_file writes Matrix Market (.mtx) and FROSTT (.tns) files; {str(filename)!r} is neither")
    if t.batch_shape:
        raise InputError(f"to_file writes one tensor; this one has a value batch of shape {tuple(t.batch_shape)} "
                         f"(write each member, t[i])")
    if suffix == ".mtx":
        if len(t.format_shape) != 2:
            raise InputError(f"to_file: Matrix Market holds matrices; this tensor has shape {tuple(t.shape)} (use .tns)")
        try:
            import scipy.io  # noqa: PLC0415 - optional dependency
            import scipy.sparse  # noqa: PLC0415
        except ImportError:
            raise InputError("to_file needs SciPy for Matrix Market files (pip install scipy)") from None
        coords, slots = t.entries()
        vals = t.values.detach().index_select(-1, slots).cpu()
        if vals.dtype in (torch.float16, torch.bfloat16):
            vals = vals.float()
        m = scipy.sparse.coo_array((vals.numpy(), (coords[0].cpu().numpy(), coords[1].cpu().numpy())),
                                   shape=tuple(t.format_shape))
        m.sum_duplicates()
        if precision is None:
            precision = 17 if vals.dtype in (torch.float64, torch.complex128) else 9
        scipy.io.mmwrite(str(path), m, symmetry=symmetry, precision=precision)
        return
    coords, slots = t.entries()
    vals = t.values.detach().index_select(-1, slots).cpu()
    if vals.is_complex():
        raise InputError("to_file: FROSTT (.tns) holds real values; write complex tensors as .mtx (matrices)")
    keys = torch.stack([c.cpu().to(torch.int64) for c in coords])
    uniq, inv = torch.unique(keys, dim=1, return_inverse=True)
    summed = vals.to(torch.float64).new_zeros(uniq.shape[1]).index_add_(0, inv, vals.to(torch.float64))
    with path.open("w") as f:
        for j in range(uniq.shape[1]):
            f.write(" ".join(str(int(i) + 1) for i in uniq[:, j]) + f" {float(summed[j])!r}\n")

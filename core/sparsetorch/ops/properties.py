"""Cheap structural property detection that feeds method choice.

- ``symmetric`` / ``hermitian``: A equals its (conjugate) transpose, entry by entry, to a
  relative tolerance of 1e-12 (pattern-dependent work is cached per pattern).
- ``spd``: symmetric, positive real diagonal, and weakly diagonally dominant by rows
  (Gershgorin: every eigenvalue is then >= 0; 2-D/3-D Poisson and most FEM mass/stiffness
  matrices pass). Matrices that are SPD without being dominant are not detected: pass
  ``properties="spd"``.
- ``nonsymmetric`` otherwise.

User tags (``properties=`` in ``solve``) are trusted and skip detection.
"""

from __future__ import annotations

import torch

from ..errors import InputError
from ..format import CSR
from ..tensor import SparseTensor
from ..tensor.construct import conversion

__all__ = ["detect", "normalize_tags", "KNOWN_TAGS"]

KNOWN_TAGS = frozenset({"spd", "symmetric", "hermitian", "nonsymmetric", "general"})


def normalize_tags(properties) -> frozenset[str] | None:
    if properties is None:
        return None
    tags = {properties} if isinstance(properties, str) else set(properties)
    bad = tags - KNOWN_TAGS
    if bad:
        raise InputError(f"unknown properties {sorted(bad)}; known: {sorted(KNOWN_TAGS)}")
    if "spd" in tags:
        tags |= {"symmetric", "hermitian"}
    if "general" in tags:
        tags = (tags - {"general"}) | {"nonsymmetric"}
    return frozenset(tags)


def detect(A: SparseTensor) -> frozenset[str]:
    """Properties of a square matrix (for a value batch: those all members share).

    Recomputed on every call (O(nnz) on the cached conversion maps): a cache keyed on the values'
    identity would miss writes torch does not track (NumPy views, DLPack, ``.data``).
    """
    return _detect(A)


def _detect(A: SparseTensor) -> frozenset[str]:
    n = A.format_shape[0]
    values = A.values.detach()
    csr = conversion(A, CSR, A.index_dtype)
    v = csr.apply(A.detach()).values
    At = A.detach().T
    tconv = conversion(At, CSR, A.index_dtype)
    t = tconv.apply(At)
    same_pattern = torch.equal(t.pos(1), csr.pos[1]) and torch.equal(t.crd(1), csr.crd[1])
    if not same_pattern:
        # Patterns differ; still symmetric if the extra entries are zeros. Compare densely for small n.
        if n > 2048:
            return frozenset({"nonsymmetric"})
        d = A.detach().to_dense()
        sym = bool(torch.allclose(d, d.transpose(-2, -1).conj(), rtol=1e-12, atol=0))
    else:
        tv = t.values.conj() if t.values.is_complex() else t.values
        scale = v.abs().amax().clamp_min(torch.finfo(v.real.dtype if v.is_complex() else v.dtype).tiny)
        sym = bool(((v - tv).abs() <= 1e-12 * scale).all())
    if not sym:
        return frozenset({"nonsymmetric"})
    tags = {"symmetric", "hermitian"} if A.dtype.is_complex else {"symmetric"}
    coords, slot = A.entries()
    rows = coords[0]
    on = rows == coords[1]
    vals = values[..., slot]
    diag = vals.new_zeros(*vals.shape[:-1], n).index_add(-1, rows[on], vals[..., on])
    off = vals.abs().masked_fill(on, 0)
    offsum = off.new_zeros(*off.shape[:-1], n).index_add(-1, rows, off)
    dre = diag.real if diag.is_complex() else diag
    if bool((dre > 0).all()) and bool((dre >= offsum * (1 - 1e-12)).all()):
        if not diag.is_complex() or bool((diag.imag.abs() <= 1e-12 * dre.abs()).all()):
            tags.add("spd")
    return frozenset(tags)

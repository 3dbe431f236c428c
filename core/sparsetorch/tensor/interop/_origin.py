"""Which package a tensor came from, so ``to_package()`` without a package hands it back there.

nvmath-python's UST returns a tensor to the package it was made from (``Tensor.from_package(x)
.to_package()`` is ``x``'s kind again). Here every buffer is a torch tensor, so the origin is
recorded when :func:`~sparsetorch.from_package` wraps another package's object, keyed by the
buffer that identifies the pattern (the first index buffer; the values for a dense format).
Tensors that share it (``with_values``, ``detach``, ``T``/``permute`` views) share the origin;
tensors built in torch, and new buffers (``convert``, ``clone``, ``.to()``), have origin "torch".
The record holds a weak reference: it goes when the buffer does.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..sparse_tensor import SparseTensor

__all__ = ["record_origin", "origin_package", "origin_options", "carry_origin"]

#: id(buffer) -> (weak reference to the buffer, package name, to_package options that give the
#: object's own kind back, e.g. {"kind": "matrix"} for a scipy csr_matrix)
_ORIGIN: dict[int, tuple[weakref.ref, str, dict]] = {}


def _key_buffer(t: "SparseTensor") -> torch.Tensor:
    index = t._index
    return index[0] if index else t._values


def record_origin(t: "SparseTensor", package: str, options: dict | None = None) -> None:
    """Note that ``t`` (and every tensor sharing its pattern buffer) came from ``package``."""
    if package == "torch":
        return
    buf = _key_buffer(t)
    key = id(buf)
    _ORIGIN[key] = (weakref.ref(buf, lambda _ref, key=key: _ORIGIN.pop(key, None)), package, dict(options or {}))


def _lookup(t: "SparseTensor") -> tuple[str, dict]:
    buf = _key_buffer(t)
    got = _ORIGIN.get(id(buf))
    if got is None or got[0]() is not buf:
        return "torch", {}
    return got[1], got[2]


def origin_package(t: "SparseTensor") -> str:
    """The package ``t`` was wrapped from ("torch", "scipy", "numpy", "cupy"); "torch" for
    tensors built here."""
    return _lookup(t)[0]


def origin_options(t: "SparseTensor") -> dict:
    """The ``to_package`` options that give the origin's own kind back (a copy)."""
    return dict(_lookup(t)[1])


def carry_origin(src: "SparseTensor", dst: "SparseTensor") -> "SparseTensor":
    """``dst`` (made from ``src`` with new values: ``with_values``, ``detach``) with ``src``'s origin where the
    origin is keyed by the values (a dense format, no index buffer), as sparse formats share it through their
    index buffers (a NumPy array's ``detach()`` handed back a torch tensor; session 26's sweep). Returns ``dst``."""
    if not dst._index and dst._values is not src._values:
        package, options = _lookup(src)
        if package != "torch":
            record_origin(dst, package, options)
    return dst

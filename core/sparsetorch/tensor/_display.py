"""Helpers of ``SparseTensor``: format names, ``.to()`` arguments, the repr's value preview."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..format import TensorFormat

if TYPE_CHECKING:
    from .sparse_tensor import SparseTensor

__all__ = ["sparse_repr"]


def _known_name(fmt: TensorFormat) -> str | None:
    from ..format import named_formats

    for known in named_formats().values():
        if known == fmt:
            return known.name
    return None


def _parse_to(args: tuple, kwargs: dict) -> tuple[torch.device | None, torch.dtype | None, bool]:
    """Read ``.to()``'s arguments: a device, a dtype, both, or a tensor to match."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    non_blocking = bool(kwargs.pop("non_blocking", False))
    kwargs.pop("copy", None)
    if kwargs:
        raise TypeError(f"SparseTensor.to() got unexpected keyword arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, (torch.device, str, int)):
            device = a
        elif isinstance(a, torch.Tensor) or hasattr(a, "index_dtype"):  # a tensor or a SparseTensor
            device, dtype = a.device, a.dtype
        else:
            raise TypeError(f"SparseTensor.to() takes a device, a dtype or a tensor, got {a!r}")
    if isinstance(device, int):
        device = torch.device("cuda", device)
    return (torch.device(device) if device is not None else None), dtype, non_blocking


def _preview(t: torch.Tensor, n: int = 8) -> str:
    flat = t.detach().reshape(-1)
    body = ", ".join(_fmt_scalar(x) for x in flat[:n].tolist())
    more = f", ... ({flat.numel()} in all)" if flat.numel() > n else ""
    shape = f" shape={tuple(t.shape)}" if t.dim() != 1 else ""
    return f"[{body}{more}]{shape}"


def _fmt_scalar(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def sparse_repr(self: "SparseTensor") -> str:
    """The repr of a SparseTensor: its facts (and the package it came from), then a preview of
    every buffer."""
    from .interop._origin import origin_package  # noqa: PLC0415 - interop imports the tensor module

    name = f"{self._format.name} " if self._format.name else ""
    head = (
        f"SparseTensor(shape={tuple(self._shape)}, format={name}'{self._format}', nse={self.nse}, "
        f"dtype={str(self.dtype).replace('torch.', '')}, index_dtype={str(self.index_dtype).replace('torch.', '')}, "
        f"device={self.device}, package={origin_package(self)}"
    )
    if self.requires_grad:
        head += ", requires_grad=True"
    lines = [head + ","]
    with torch.no_grad():
        for k in range(self._format.num_levels):
            for nm, b in (("pos", self._pos[k]), ("crd", self._crd[k])):
                if b is not None:
                    lines.append(f"  {nm}[{k}]={_preview(b)},")
        lines.append(f"  values={_preview(self._values)})")
    return "\n".join(lines)

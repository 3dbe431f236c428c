"""Pattern identity: :class:`PatternKey` (the very index buffers: cheap, exact) and
:func:`fingerprint` (the numbers in them: survives fresh buffers), and :func:`is_plain`."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..format import TensorFormat

__all__ = ["PatternKey", "buffer_id", "fingerprint", "is_plain"]


@dataclass(frozen=True)
class PatternKey:
    """Cheap identity of a sparsity pattern: format, shape, index dtype, device and the identity
    (address, extent, strides, version counter) of every index buffer. Equal keys mean the very
    same index buffers, unmodified since (torch bumps a tensor's version on in-place writes).
    ``alive()`` tells whether the buffers still exist (a cache should drop entries that are not).
    """

    format: TensorFormat
    shape: tuple[int, ...]
    index_dtype: torch.dtype
    device: torch.device
    buffers: tuple[tuple, ...]
    _refs: tuple = field(default=(), compare=False, hash=False, repr=False)

    def alive(self) -> bool:
        return all(r() is not None for r in self._refs)


def version_of(t: torch.Tensor) -> int:
    """``t._version``, or -1 for an inference-mode tensor, which keeps no version counter (reading it raised
    in every cache key made of one: ``st.solve`` under ``torch.inference_mode()`` failed). In-place writes
    to such tensors are not seen by version: what caches by version also compares content where it must."""
    try:
        return t._version
    except RuntimeError:
        return -1


def buffer_id(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), version_of(t))


def is_plain(t: torch.Tensor) -> bool:
    """False for tensors made inside a torch.func transform (they have no storage of their own
    and must not be cached beyond the transform)."""
    try:
        t.data_ptr()
    except RuntimeError:
        return False
    return True


def vmapped(t: torch.Tensor) -> bool:
    """Whether ``t`` is batched by ``torch.func.vmap`` (under any grad-tracking layers)."""
    if is_plain(t):
        return False
    f = torch._C._functorch
    while f.is_gradtrackingtensor(t):
        t = f.get_unwrapped(t)
    return bool(f.is_batchedtensor(t))


def fingerprint(fmt: TensorFormat, shape: tuple[int, ...], index_dtype: torch.dtype, device: torch.device,
                bufs: Sequence[torch.Tensor]) -> tuple | None:
    """The content identity of a pattern's index buffers (see ``SparseTensor.pattern_fingerprint``)."""
    if not all(is_plain(b) for b in bufs):
        return None
    try:
        if device.type == "cpu":
            h = hashlib.blake2b(digest_size=16)
            for b in bufs:
                h.update(b"|%d|" % b.numel())
                h.update(b.contiguous().numpy().tobytes() if b.numel() else b"")
            digest: Any = h.hexdigest()
        else:
            sums = []
            for b in bufs:
                v = b.reshape(-1).to(torch.int64)
                w = torch.arange(1, v.numel() + 1, device=v.device, dtype=torch.int64) * 0x9E3779B1
                sums.append(torch.stack([v.sum(), (v * w).sum()]))
            digest = tuple(torch.cat(sums).tolist()) if sums else ()
    except RuntimeError:
        return None  # inside a torch.func transform the buffers may be wrapped: not readable
    return (str(fmt), tuple(shape), index_dtype, device.type, digest)

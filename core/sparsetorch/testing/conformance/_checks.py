"""Checks the suites share: value-slot masks, snapshots for "never modified", a test loss."""

from __future__ import annotations

import torch

from ...tensor import SparseTensor

__all__ = ["slots_on_pattern", "snapshot", "assert_unchanged", "transpose_slots", "loss"]


def slots_on_pattern(A: SparseTensor) -> torch.Tensor:
    """Boolean mask over A's (linearized) value slots: True where a slot holds a matrix entry."""
    _, slot = A.entries()
    mask = torch.zeros(A.values.shape[-1], dtype=torch.bool, device=A.device)
    mask[slot] = True
    return mask


def snapshot(*objs) -> list:
    """Clones of every tensor (values and index buffers of sparse ones) for "never modified" checks."""
    out = []
    for o in objs:
        if isinstance(o, SparseTensor):
            out.append(("sparse", o.values.detach().clone(), [None if b is None else b.clone() for b in o.pos_buffers],
                        [None if b is None else b.clone() for b in o.crd_buffers]))
        else:
            out.append(("dense", o.detach().clone()))
    return out


def assert_unchanged(before: list, *objs, what: str) -> None:
    for snap, o in zip(before, objs):
        if snap[0] == "sparse":
            assert torch.equal(o.values.detach(), snap[1]), f"{what}: A's values were modified"
            for k, (a, b) in enumerate(zip(o.pos_buffers, snap[2])):
                assert (a is None and b is None) or torch.equal(a, b), f"{what}: A's pos[{k}] was modified"
            for k, (a, b) in enumerate(zip(o.crd_buffers, snap[3])):
                assert (a is None and b is None) or torch.equal(a, b), f"{what}: A's crd[{k}] was modified"
        else:
            assert torch.equal(o.detach(), snap[1]), f"{what}: an input tensor was modified"


def transpose_slots(A: SparseTensor) -> torch.Tensor:
    """For each value slot, the slot holding the transposed entry (padding slots map to
    themselves). A's pattern must be structurally symmetric."""
    coords, slot = A.entries()
    n = A.format_shape[1]
    lin = coords[0] * n + coords[1]
    order = torch.argsort(lin)
    lin_t = coords[1] * n + coords[0]
    at = torch.searchsorted(lin[order], lin_t)
    if not bool(torch.equal(lin[order][at.clamp(max=lin.numel() - 1)], lin_t)):
        raise ValueError("the pattern is not structurally symmetric")
    perm = torch.arange(A.values.shape[-1], device=A.device)
    perm[slot] = slot[order[at]]
    return perm


def loss(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A real scalar with a non-trivial cotangent: <w, x> plus |x|^2."""
    return (x * w).real.sum() + (x.abs() ** 2).sum()

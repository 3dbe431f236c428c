"""Exchange plans: who sends which local rows to whom, and the autograd Functions over them.

An :class:`ExchangePlan` is pattern-level state (built once, cached with the pattern): for each
peer the local indices to send (``sends``) and the slice of the receive buffer its rows land in
(``recvs``). Moving data forward is a gather + non-blocking sends/receives; its transpose sends
what arrived back and sums it into the senders' rows (``index_add``). The halo exchange of a
SpMV and the migration of rows to a new partition are both such plans.

Data travel as 2-D ``(rows, m)`` blocks (batch and right-hand-side columns flattened into ``m``),
so one transfer per peer carries every column.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .comm import Comm

__all__ = ["ExchangePlan", "HaloExchange", "halo_exchange", "as_rows", "from_rows"]


@dataclass
class ExchangePlan:
    comm: Comm
    n_send_rows: int                                   # rows of the source block (local rows)
    n_recv: int                                        # rows of the receive buffer
    sends: list[tuple[int, torch.Tensor]]              # (peer, local indices), on the data device
    recvs: list[tuple[int, int, int]]                  # (peer, start, stop) in the receive buffer

    @property
    def volume(self) -> tuple[int, int]:
        """(rows sent, rows received) per exchanged column."""
        return sum(int(i.numel()) for _, i in self.sends), self.n_recv

    @property
    def neighbours(self) -> list[int]:
        return sorted({p for p, _ in self.sends} | {p for p, _, _ in self.recvs})

    def to(self, device: torch.device) -> "ExchangePlan":
        return ExchangePlan(self.comm, self.n_send_rows, self.n_recv, [(p, i.to(device)) for p, i in self.sends], self.recvs)

    # forward: source rows -> receive buffer --------------------------------------------------------
    def start(self, X: torch.Tensor):
        """Post the transfers of ``X`` ``(n_send_rows, m)``; returns a handle for :meth:`finish`."""
        m = X.shape[1]
        out = X.new_empty(self.n_recv, m)
        bufs = [(p, X.index_select(0, idx)) for p, idx in self.sends]
        recvs = [(p, out[a:b]) for p, a, b in self.recvs]
        return self.comm.exchange_start(bufs, recvs), out, bufs

    def finish(self, handle) -> torch.Tensor:
        works, out, _bufs = handle  # _bufs kept alive until the sends completed
        self.comm.exchange_wait(works)
        return out

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return self.finish(self.start(X))

    # transpose: receive-buffer contributions -> summed into the source rows -----------------------
    def start_reverse(self, G: torch.Tensor):
        m = G.shape[1]
        sends = [(p, G[a:b].contiguous()) for p, a, b in self.recvs]
        bufs = [(p, idx, G.new_empty(idx.numel(), m)) for p, idx in self.sends]
        works = self.comm.exchange_start(sends, [(p, buf) for p, _, buf in bufs])
        return works, bufs, sends

    def finish_reverse(self, handle, into: torch.Tensor) -> torch.Tensor:
        works, bufs, _sends = handle
        self.comm.exchange_wait(works)
        for _p, idx, buf in bufs:
            into.index_add_(0, idx, buf)
        return into

    def reverse(self, G: torch.Tensor) -> torch.Tensor:
        out = G.new_zeros(self.n_send_rows, G.shape[1])
        return self.finish_reverse(self.start_reverse(G), out)


def as_rows(X: torch.Tensor, n: int) -> tuple[torch.Tensor, tuple]:
    """``X`` of shape ``(n,)``, ``(n, k)`` or ``(*batch, n, k)`` as an ``(n, m)`` block, and how to undo it."""
    if X.dim() == 1:
        return X.reshape(n, 1), ("vec",)
    if X.dim() == 2:
        return X, ("mat",)
    lead = tuple(X.shape[:-2])
    k = X.shape[-1]
    # the column count spelled out: reshape(n, -1) raised on a rank with no rows (n = 0; outside sweep)
    return X.movedim(-2, 0).reshape(n, math.prod(lead) * k), ("batch", lead, k)


def from_rows(Y: torch.Tensor, how: tuple) -> torch.Tensor:
    if how[0] == "vec":
        return Y.reshape(-1)
    if how[0] == "mat":
        return Y
    _, lead, k = how
    return Y.reshape(Y.shape[0], *lead, k).movedim(0, -2)


class HaloExchange(torch.autograd.Function):
    """``halo = HaloExchange.apply(x_owned, plan)``: forward copies owned rows into neighbours'
    halos; backward sends halo gradients back to their owners and sums them there."""

    @staticmethod
    def forward(ctx, X: torch.Tensor, plan: ExchangePlan) -> torch.Tensor:
        ctx.plan = plan
        X2, how = as_rows(X.detach(), plan.n_send_rows)
        ctx.how = how
        return from_rows(plan.forward(X2.contiguous()), how)

    @staticmethod
    def backward(ctx, G: torch.Tensor):
        plan = ctx.plan
        G2, _ = as_rows(G.contiguous(), plan.n_recv)
        return from_rows(plan.reverse(G2.contiguous()), ctx.how), None


def halo_exchange(X: torch.Tensor, plan: ExchangePlan) -> torch.Tensor:
    """Differentiable exchange (see :class:`HaloExchange`)."""
    return HaloExchange.apply(X, plan)

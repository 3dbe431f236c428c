"""Who owns a global row: contiguous offsets, or a distributed directory for general partitions.

Contiguous ownership is ``p + 1`` offsets (every rank holds them). A general partition (a graph
partitioner's, or rows as a mesh code numbers them) is never gathered: global ids are looked up in
a *directory* spread over the ranks, rank ``g // ceil(N / p)`` answering for id ``g`` (the
"assumed partition" of hypre), built by one all-to-all and queried by two. Each rank's share is
O(N / p) and lives only while a pattern is being built.
"""

from __future__ import annotations

import torch

import sparsetorch as st

from .comm import Comm

__all__ = ["RowMap"]


class RowMap:
    """The rows this rank owns, in local order, and lookups of anyone's rows."""

    def __init__(self, comm: Comm, n: int, *, offsets: list[int] | None = None, owned: torch.Tensor | None = None) -> None:
        self.comm, self.n = comm, int(n)
        self.offsets = offsets
        self.owned = owned  # global ids of the local rows (general partitions only), on the CPU
        if offsets is not None:
            self.start, self.stop = offsets[comm.rank], offsets[comm.rank + 1]
            self.n_local = self.stop - self.start
        else:
            assert owned is not None
            self.start = self.stop = None
            self.n_local = int(owned.numel())
            self._sorted, self._order = torch.sort(owned)

    @property
    def contiguous(self) -> bool:
        return self.offsets is not None

    def owned_ids(self) -> torch.Tensor:
        """Global ids of this rank's rows in local order (O(n_local))."""
        if self.contiguous:
            return torch.arange(self.start, self.stop, dtype=torch.int64)
        return self.owned

    def local_of_mine(self, gids: torch.Tensor) -> torch.Tensor:
        """Local index of global ids this rank owns; -1 where it does not own them."""
        if self.contiguous:
            inside = (gids >= self.start) & (gids < self.stop)
            return torch.where(inside, gids - self.start, torch.full_like(gids, -1))
        if self.n_local == 0:
            return torch.full_like(gids, -1)
        srt, order = self._sorted, self._order
        if srt.device != gids.device:        # the map lives on the CPU; entries may be on a GPU
            srt, order = srt.to(gids.device), order.to(gids.device)
        pos = torch.searchsorted(srt, gids.contiguous()).clamp(max=self.n_local - 1)
        hit = srt[pos] == gids
        return torch.where(hit, order[pos], torch.full_like(gids, -1))

    # Lookups (collective for general partitions) ----------------------------------------------
    def lookup(self, gids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(owner rank, owner's local index) of each global id. Collective when not contiguous:
        every rank must call it (with its own ids, possibly none)."""
        gids = gids.to(torch.int64).cpu()
        if self.contiguous:
            off = torch.tensor(self.offsets, dtype=torch.int64)
            owner = torch.bucketize(gids, off[1:], right=True)
            return owner, gids - off[owner]
        comm, p = self.comm, self.comm.size
        block = -(-self.n // p) if self.n else 1
        error = None
        # 1. register: (gid, local) pairs to their directory ranks
        mine = self.owned
        dest = mine // block
        order = torch.argsort(dest, stable=True)
        counts = torch.bincount(dest, minlength=p).tolist()
        pairs = torch.stack([mine[order], order], 1).reshape(-1)
        chunks = list(torch.split(pairs, [2 * c for c in counts]))
        got = comm.alltoallv(chunks)
        lo = comm.rank * block
        size = max(0, min(self.n, lo + block) - lo)
        owner_of = torch.full((size,), -1, dtype=torch.int64)
        local_of = torch.full((size,), -1, dtype=torch.int64)
        for r, chunk in enumerate(got):
            chunk = chunk.cpu().reshape(-1, 2)
            if chunk.numel() == 0:
                continue
            g = chunk[:, 0] - lo
            if bool((owner_of[g] >= 0).any()) or torch.unique(g).numel() != g.numel():
                dup = int(g[(owner_of[g] >= 0)][0] + lo) if bool((owner_of[g] >= 0).any()) else int(g[0] + lo)
                error = st.InputError(f"row {dup} is owned by more than one rank (rank {r} and another); every row "
                                      f"must have exactly one owner")
            owner_of[g] = r
            local_of[g] = chunk[:, 1]
        comm.agree(error, "building the row directory")
        # 2. query
        qdest = gids // block
        qorder = torch.argsort(qdest, stable=True)
        qcounts = torch.bincount(qdest, minlength=p).tolist()
        asked = comm.alltoallv(list(torch.split(gids[qorder], qcounts)))
        answers = []
        for r, q in enumerate(asked):
            q = q.cpu() - lo
            o, l = owner_of[q], local_of[q]
            if error is None and bool((o < 0).any()):
                error = st.InputError(f"row {int(q[o < 0][0] + lo)} is referenced (as a column) by rank {r} but owned by "
                                      f"no rank; the owned rows must cover 0..{self.n - 1}")
            answers.append(torch.stack([o, l], 1).reshape(-1))
        back = comm.alltoallv(answers)
        comm.agree(error, "looking up row owners")
        flat = torch.cat([b.cpu() for b in back]).reshape(-1, 2) if gids.numel() else torch.zeros(0, 2, dtype=torch.int64)
        owner = torch.empty_like(gids)
        local = torch.empty_like(gids)
        owner[qorder] = flat[:, 0]
        local[qorder] = flat[:, 1]
        return owner, local

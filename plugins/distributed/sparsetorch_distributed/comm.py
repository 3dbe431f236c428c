"""The communicator: ranks, the device collectives run on, reductions, agreement, point-to-point.

Everything distributed in this package goes through one :class:`Comm`, so the same code runs on
gloo (CPU tensors) and NCCL (CUDA tensors of the current device): small control tensors (flags,
signatures) are made on :attr:`Comm.device`, which is ``cuda:<current>`` for NCCL and the CPU
otherwise.

Failure protocol (``agree``): every rank contributes an error flag to one ``all_reduce(MAX)``. When any
flag is set, the ranks exchange (class code, message) with ``all_gather_object`` and every rank raises the
class of the lowest failing rank, its message prefixed with that rank (and followed by the other failing
ranks' messages), so a bad input on one rank is the same named error everywhere, and nobody is left
waiting in a collective the failing rank never entered. Entry points check their per-rank input inside
``with comm.checked(what, same=...)`` (one helper for all of them): the local checks, then that one
all_reduce, which also carries the integers every rank must share (``same``); an operation's local
setup runs inside ``with comm.agreement(what)``. Collectives and transfers inherit the process group's
timeout; :func:`init` sets 60 s by default. A transfer that fails (a peer died, the timeout passed) raises
:class:`~sparsetorch_distributed.errors.CommTimeoutError` on the ranks that see it.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import struct
from typing import Iterator, Sequence

import torch
import torch.distributed as dist

import sparsetorch as st

from .errors import CommTimeoutError, DistributedError, MismatchError, class_of, code_of

__all__ = ["Comm", "Check", "init", "get_comm", "free_port", "DEFAULT_TIMEOUT", "FLOAT_SLOTS"]

DEFAULT_TIMEOUT = datetime.timedelta(seconds=60)

#: how many non-negative floats a ``checked(..., floats=True)`` block carries to their maximum over the ranks
FLOAT_SLOTS = 8
_FLOAT_NAMES = tuple(f"float max {i}" for i in range(FLOAT_SLOTS))

_DTYPE_CODES = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.float64: 4,
                torch.complex64: 5, torch.complex128: 6}


def dtype_code(dtype: torch.dtype) -> int:
    return _DTYPE_CODES.get(dtype, 99)


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1 (for tests and single-host launches)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init(backend: str | None = None, *, timeout: datetime.timedelta | float | None = None,
         rank: int | None = None, world_size: int | None = None, init_method: str | None = None) -> "Comm":
    """Initialize the default process group if needed (torchrun's environment, or the arguments)
    and return the :class:`Comm` over it. ``backend`` defaults to NCCL when CUDA is available and
    ``LOCAL_RANK`` names a GPU, else gloo; ``timeout`` (seconds or a timedelta) defaults to 60 s."""
    if isinstance(timeout, (int, float)):
        timeout = datetime.timedelta(seconds=float(timeout))
    timeout = timeout or DEFAULT_TIMEOUT
    if not dist.is_available():
        raise DistributedError("torch.distributed is not available in this torch build")
    if not dist.is_initialized():
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
        kw = {}
        if rank is not None:
            kw["rank"] = rank
        if world_size is not None:
            kw["world_size"] = world_size
        dist.init_process_group(backend=backend, init_method=init_method, timeout=timeout, **kw)
    return Comm(timeout=timeout)


def get_comm(comm: "Comm | None" = None) -> "Comm":
    if comm is not None:
        if not isinstance(comm, Comm):
            raise st.InputError(f"comm must be a sparsetorch_distributed.Comm, got {type(comm).__name__}")
        return comm
    return Comm()


class Comm:
    """A process group seen from one rank (the default group unless ``group`` is given)."""

    def __init__(self, group: dist.ProcessGroup | None = None, *, timeout: datetime.timedelta | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise st.InputError(
                "torch.distributed is not initialized: launch with torchrun and call "
                "sparsetorch_distributed.init() (or torch.distributed.init_process_group) first"
            )
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))
        self.timeout = timeout or DEFAULT_TIMEOUT
        if self.backend == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")

    def __repr__(self) -> str:
        return f"Comm(rank={self.rank}, size={self.size}, backend={self.backend!r})"

    def global_rank(self, r: int) -> int:
        return r if self.group is None else dist.get_global_rank(self.group, r)

    # Reductions --------------------------------------------------------------------------------
    def allreduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """All-reduce ``t`` in place (sum/max/min) and return it; a no-op on one rank."""
        if self.size == 1:
            return t
        red = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
        moved = t if t.device == self.device else t.to(self.device)
        try:
            dist.all_reduce(moved, op=red, group=self.group)
        except RuntimeError as exc:
            raise CommTimeoutError(f"rank {self.rank}: all_reduce failed ({_short(exc)}); a peer died or "
                                   f"did not enter the collective within {self.timeout}") from exc
        if moved is not t:
            t.copy_(moved)
        return t

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Broadcast ``t`` from rank ``src`` (in place; returned); a no-op on one rank."""
        if self.size == 1:
            return t
        moved = t if t.device == self.device else t.to(self.device)
        try:
            dist.broadcast(moved, src=self.global_rank(src), group=self.group)
        except RuntimeError as exc:
            raise CommTimeoutError(f"rank {self.rank}: broadcast failed ({_short(exc)}); a peer died or did not enter "
                                   f"the collective within {self.timeout}") from exc
        if moved is not t:
            t.copy_(moved)
        return t

    def allgather_object(self, obj) -> list:
        if self.size == 1:
            return [obj]
        out: list = [None] * self.size
        try:
            dist.all_gather_object(out, obj, group=self.group)
        except RuntimeError as exc:
            raise CommTimeoutError(f"rank {self.rank}: all_gather_object failed ({_short(exc)})") from exc
        return out

    def allgather_rows(self, t: torch.Tensor, counts: Sequence[int] | None = None) -> list[torch.Tensor]:
        """Every rank's ``t`` (the same dtype and trailing shape on every rank, any number of rows, zero included),
        in rank order, on ``t``'s device. ``counts``: every rank's row count when the caller knows them (else one
        all_reduce finds them); the rows travel padded to the largest count in one ``all_gather``. Not
        differentiable. Collective."""
        if self.size == 1:
            return [t.clone()]
        if counts is None:
            c = torch.zeros(self.size, dtype=torch.int64, device=self.device)
            c[self.rank] = t.shape[0]
            counts = self.allreduce(c, "sum").tolist()
        counts = [int(c) for c in counts]
        top = max(counts)
        if top == 0:
            return [t.new_zeros((0, *t.shape[1:])) for _ in range(self.size)]
        buf = torch.zeros((top, *t.shape[1:]), dtype=t.dtype, device=self.device)
        buf[:t.shape[0]] = t.to(self.device)
        out = [torch.empty_like(buf) for _ in range(self.size)]
        try:
            dist.all_gather(out, buf, group=self.group)
        except RuntimeError as exc:
            raise CommTimeoutError(f"rank {self.rank}: all_gather failed ({_short(exc)}); a peer died or did not "
                                   f"enter the collective within {self.timeout}") from exc
        return [o[:c].to(t.device) for o, c in zip(out, counts)]

    def max_int(self, values: Sequence[int]) -> list[int]:
        t = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        return [int(v) for v in self.allreduce(t, "max").tolist()]

    def sum_int(self, values: Sequence[int]) -> list[int]:
        t = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        return [int(v) for v in self.allreduce(t, "sum").tolist()]

    # Agreement ---------------------------------------------------------------------------------
    def agree(self, error: BaseException | None, what: str, fields: dict[str, int] | None = None,
              shown: dict | None = None, flags: dict[str, int] | None = None) -> dict[str, int]:
        """Every rank calls this with its local error (or None); raises on all ranks if any failed.

        ``fields``: integers every rank must share (the same names on every rank), compared in the
        same all_reduce as the error flag; when no rank failed and one differs, every rank raises
        :class:`MismatchError` (see :meth:`check_same`). ``flags``: integers reduced by MAX in the same
        all_reduce (the same names on every rank; "does any rank ..."), returned by name. One all_reduce of
        ``1 + 2 len(fields) + len(flags)`` integers when every rank passes (nothing on one rank)."""
        names = list(fields or {})
        vals = [int((fields or {})[k]) for k in names]
        fnames = list(flags or {})
        fvals = [int((flags or {})[k]) for k in fnames]
        out = self.max_int([1 if error is not None else 0] + vals + [-v for v in vals] + fvals)
        if out[0]:
            self._raise_agreed(error, what)
        hi, lo = out[1:1 + len(names)], [-v for v in out[1 + len(names):1 + 2 * len(names)]]
        maxed = dict(zip(fnames, out[1 + 2 * len(names):]))
        bad = [name for name, a, b in zip(names, hi, lo) if a != b]
        if bad:
            shown = dict(shown or {})
            if "dtype" in bad and "dtype" not in shown:
                # the code compared, shown as the dtype's name (a mismatch printed "rank 0=4, rank 1=3")
                names_of = {code: str(dt).replace("torch.", "") for dt, code in _DTYPE_CODES.items()}
                shown["dtype"] = names_of.get(int((fields or {})["dtype"]), "another dtype")
            everyone = self.allgather_object({k: shown.get(k, (fields or {})[k]) for k in bad})
            detail = "; ".join(f"{k}: " + ", ".join(f"rank {r}={e[k]}" for r, e in enumerate(everyone)) for k in bad)
            raise MismatchError(f"{what}: the ranks disagree on {', '.join(bad)} ({detail}); every rank must pass the "
                                f"same value")
        return maxed

    def _raise_agreed(self, error: BaseException | None, what: str) -> None:
        """Some rank flagged an error: every rank raises the lowest failing rank's class and message."""
        mine = None if error is None else (code_of(error), f"{type(error).__name__}: {error}")
        everyone = self.allgather_object(mine)
        failed = [r for r, e in enumerate(everyone) if e is not None]
        first = failed[0]
        code, message = everyone[first]
        cls = class_of(code)
        text = f"{what} failed on rank {first} (failing ranks: {failed}): {message}"
        # the other failing ranks' own messages (their lengths, their rows...), so that every rank sees each cause
        others = [f"rank {r}: {everyone[r][1][:300]}" for r in failed[1:6]]
        if others:
            text += " | also " + " | ".join(others) + (f" | ... {len(failed) - 6} more" if len(failed) > 6 else "")
        exc = cls(text)
        if error is not None and type(error) is cls:
            raise exc from error
        raise exc

    @contextlib.contextmanager
    def checked(self, what: str, same: Sequence[str] = (), flags: Sequence[str] = (),
                floats: bool = False) -> Iterator["Check"]:
        """The per-rank input checks of a collective entry point, agreed before its first collective::

            with comm.checked("DSparseTensor.with_values", same=("batch size",)) as chk:
                if values.shape[-1] != n:
                    raise st.InputError(f"... rank {comm.rank} ... expected {n}, got {values.shape[-1]} ...")
                chk.same({"batch size": values.shape[0]})

        On leaving, every rank contributes its error flag and the ``same`` integers to ONE
        ``all_reduce(MAX)`` (nothing on one rank). When any rank failed, every rank raises the class of the
        lowest failing rank with its message, naming the failing ranks (:meth:`agree`); so a rank whose own
        input is wrong does not raise alone, leaving the others in the operation's next collective until
        the timeout. When no rank failed and a ``same`` field differs: :class:`MismatchError` on every rank.
        ``flags``: integers set by :meth:`Check.flag` (0 where a rank did not) and reduced by MAX in that same
        all_reduce; after the block, :attr:`Check.maxed` holds them (what an operation must know of every
        rank, such as whether any records gradients, at no extra collective). ``floats``: room for
        :data:`FLOAT_SLOTS` non-negative floats (:meth:`Check.floats`) reduced alike (the scale maxima of a
        solve, at no extra collective). An exception that is not a
        sparsetorch error (a TypeError from an argument of the wrong kind) counts as bad input: ``InputError``
        naming the rank, chained to the original. A :class:`CommTimeoutError` propagates unchanged. Collective: every rank enters and leaves it."""
        chk = Check(same, tuple(flags) + (_FLOAT_NAMES if floats else ()))
        error: BaseException | None = None
        try:
            yield chk
        except CommTimeoutError:
            raise
        except st.SparseTorchError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - bad input on this rank: agreed below, raised on every rank
            error = st.InputError(f"{what}: rank {self.rank}'s input raised {type(exc).__name__}: {exc}")
            error.__cause__ = exc
        if error is None and chk.missing():
            error = DistributedError(f"{what}: internal: rank {self.rank} did not set {chk.missing()}")
        chk.maxed = self.agree(error, what, chk.fields, chk.shown, chk.flags)

    @contextlib.contextmanager
    def agreement(self, what: str) -> Iterator[None]:
        """``with comm.agreement("solve setup"): <local work>``: local errors become agreed errors.

        Collective: every rank must enter and leave it. Errors raised by the agreement itself
        (a dead peer) propagate unchanged."""
        error: BaseException | None = None
        try:
            yield
        except CommTimeoutError:
            raise
        except Exception as exc:  # noqa: BLE001 - turned into the same error on every rank below
            error = exc
        self.agree(error, what)

    def check_same(self, what: str, fields: dict[str, int], shown: dict | None = None) -> None:
        """Raise :class:`MismatchError` on every rank when an integer field differs between ranks
        (``shown``: what the message prints for a field, where its integer is a code); one all_reduce."""
        if self.size == 1:
            return
        self.agree(None, what, fields, shown)

    # Point to point ----------------------------------------------------------------------------
    def exchange_start(self, sends: Sequence[tuple[int, torch.Tensor]], recvs: Sequence[tuple[int, torch.Tensor]]):
        """Post non-blocking sends and receives (peer ranks in this group); returns the works."""
        if not sends and not recvs:
            return []
        ops = [dist.P2POp(dist.irecv, buf, self.global_rank(peer), self.group) for peer, buf in recvs]
        ops += [dist.P2POp(dist.isend, buf, self.global_rank(peer), self.group) for peer, buf in sends]
        try:
            return dist.batch_isend_irecv(ops)
        except RuntimeError as exc:
            raise CommTimeoutError(f"rank {self.rank}: posting halo transfers failed ({_short(exc)})") from exc

    def exchange_wait(self, works) -> None:
        try:
            for w in works:
                w.wait()
        except RuntimeError as exc:
            raise CommTimeoutError(f"rank {self.rank}: a halo transfer did not complete ({_short(exc)}); a neighbour "
                                   f"died or stopped within {self.timeout}") from exc

    def alltoallv(self, chunks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Send ``chunks[r]`` (1-D, one dtype on every rank) to rank ``r``; returns what each rank sent here.

        Two steps: the lengths by one all_gather-free exchange of counts, then the payloads by
        point-to-point transfers (empty ones skipped)."""
        if len(chunks) != self.size:
            raise st.InputError(f"alltoallv needs {self.size} chunks, got {len(chunks)}")
        dtype = chunks[0].dtype
        chunks = [c.to(self.device).contiguous() for c in chunks]
        if self.size == 1:
            return [chunks[0].clone()]
        counts = torch.zeros(self.size, self.size, dtype=torch.int64, device=self.device)
        counts[self.rank] = torch.tensor([c.numel() for c in chunks], dtype=torch.int64, device=self.device)
        self.allreduce(counts, "sum")
        incoming = counts[:, self.rank].tolist()
        out = [torch.empty(int(incoming[r]), dtype=dtype, device=self.device) for r in range(self.size)]
        out[self.rank] = chunks[self.rank].clone()
        sends = [(r, chunks[r]) for r in range(self.size) if r != self.rank and chunks[r].numel()]
        recvs = [(r, out[r]) for r in range(self.size) if r != self.rank and out[r].numel()]
        self.exchange_wait(self.exchange_start(sends, recvs))
        return out


class Check:
    """What one rank found inside :meth:`Comm.checked`: the integers every rank must share."""

    def __init__(self, names: Sequence[str], flags: Sequence[str] = ()) -> None:
        self.fields: dict[str, int] = dict.fromkeys(names, 0)
        self.shown: dict[str, object] = {}
        self._set: set[str] = set()
        self.flags: dict[str, int] = dict.fromkeys(flags, 0)
        #: after the ``checked`` block: each flag's maximum over the ranks
        self.maxed: dict[str, int] = {}

    def same(self, fields: dict[str, int], shown: dict | None = None) -> None:
        """Set fields declared in ``checked(..., same=...)`` (``shown``: what a mismatch message prints)."""
        unknown = set(fields) - set(self.fields)
        if unknown:
            raise DistributedError(f"internal: fields {sorted(unknown)} were not declared in checked(same=...)")
        self.fields.update({k: int(v) for k, v in fields.items()})
        self.shown.update(shown or {})
        self._set.update(fields)

    def flag(self, flags: dict[str, int]) -> None:
        """Set flags declared in ``checked(..., flags=...)``; their maximum over the ranks is :attr:`maxed`."""
        unknown = set(flags) - set(self.flags)
        if unknown:
            raise DistributedError(f"internal: flags {sorted(unknown)} were not declared in checked(flags=...)")
        self.flags.update({k: int(v) for k, v in flags.items()})

    def floats(self, values: Sequence[float]) -> bool:
        """Non-negative floats (at most :data:`FLOAT_SLOTS`; ``checked(..., floats=True)``) whose maxima over the
        ranks :meth:`maxed_floats` returns after the block: each travels as the int64 of its IEEE bits, which
        orders non-negative floats as their values (exact, in the agreement's MAX all_reduce). Returns False and
        carries nothing when there are more: the caller reduces them itself (a decision every rank takes alike
        once the agreement passed, when the count depends only on agreed fields)."""
        values = list(values)
        if len(values) > FLOAT_SLOTS:
            return False
        self.flag({name: struct.unpack("<q", struct.pack("<d", float(v) + 0.0))[0]
                   for name, v in zip(_FLOAT_NAMES, values)})
        return True

    def maxed_floats(self, count: int) -> list[float]:
        """The first ``count`` floats of :meth:`floats`, each the maximum over the ranks (after the block)."""
        return [struct.unpack("<d", struct.pack("<q", self.maxed[name]))[0] for name in _FLOAT_NAMES[:count]]

    def missing(self) -> list[str]:
        return [k for k in self.fields if k not in self._set]


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]

"""The plugin contract: the hooks a sparsetorch backend implements.

A backend is any object (usually a module) with functions marked ``@sparsetorch.hookimpl``,
published under the entry-point group ``sparsetorch.backends``::

    [project.entry-points."sparsetorch.backends"]
    mybackend = "sparsetorch_mybackend.plugin"

The two stages of capability (STYLE.md, rule 5): :func:`sparsetorch_backend_info` is the cheap
static declaration; :func:`sparsetorch_offers` is the exact answer for one request. Each hook is
called on each backend separately; an exception raised by a backend becomes a decline carrying
the exception text and never breaks dispatch.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import pluggy

from .records import BackendInfo, Decline, Offer, Request

PROJECT = "sparsetorch"
hookspec = pluggy.HookspecMarker(PROJECT)

__all__ = ["PROJECT", "hookspec", "sparsetorch_backend_info", "sparsetorch_offers", "sparsetorch_conversion_kernels",
           "CONVERSION_KERNELS"]


@hookspec(firstresult=False)
def sparsetorch_backend_info() -> BackendInfo:  # type: ignore[empty-body]
    """Describe this backend: name, version, devices, dtypes, ops and methods, native formats,
    optional dependencies that are missing (and why), and a tie-break priority.

    Called once per process when the backend is loaded. Must not import heavy optional
    dependencies just to answer; report them in ``missing`` instead when absent.
    """


@hookspec(firstresult=False)
def sparsetorch_offers(request: Request) -> Sequence[Offer | Decline]:  # type: ignore[empty-body]
    """Answer one concrete request with offers and declines.

    Return one :class:`Offer` per method this backend can run for ``request`` (with the cost
    estimate and a plan factory) and a :class:`Decline` with a reason for each method it cannot
    (or one decline for the whole request). Return an empty sequence only when the op is not
    one this backend declared. Respect ``request.options['method']`` when given: offering other
    methods is allowed (the dispatcher filters), declining it must say why.
    """


#: The conversion steps a backend may run in compiled code (:func:`sparsetorch_conversion_kernels`),
#: by name, with the device they run on and their contract. The core checks the inputs before it
#: calls one (a kernel never sees a buffer that was not validated) and runs its own code when no
#: backend has the kernel or the kernel declines (returns None / False).
CONVERSION_KERNELS: Mapping[str, str] = {
    # CSR -> COO on a GPU: the row of each entry
    "csr_rows": (
        "cuda: fn(ptr, out) -> bool. ptr: (m + 1,) int32 or int64, contiguous, validated (ptr[0] == 0, "
        "non-decreasing, ptr[m] == out.numel()); out: (nnz,) of ptr's dtype on ptr's device. Writes "
        "out[e] = i for ptr[i] <= e < ptr[i + 1], on torch's current stream (capturable), and returns True; "
        "False to decline (nothing written)."
    ),
    # CSR -> BSR on the CPU, blocks sorted by block column within each block row
    "csr_to_bsr": (
        "cpu: fn(bh, bw, m, n, ptr, col, vals, max_blocks, want_slots) -> tuple | int | None. ptr: (m + 1,) "
        "and col: (nnz,) contiguous NumPy arrays of one dtype (int32 or int64), validated, the columns of "
        "each row strictly increasing; m % bh == 0 and n % bw == 0; vals: a contiguous 1-D NumPy array of "
        "nnz values (moved as raw bytes, any itemsize of 2, 4, 8 or 16) or None. Returns None to decline, "
        "the number of blocks (an int) when it exceeds max_blocks (>= 0; nothing allocated), else "
        "(bp, bj, data, slots): bp (m // bh + 1,) and bj (nblocks,) int64, the block columns of each block "
        "row increasing; data (nblocks * bh * bw,) in vals' dtype, zero where no entry lies (None without "
        "vals); slots (nnz,) int64, entry e's place in data (block * bh * bw + (row % bh) * bw + col % bw), "
        "or None unless want_slots."
    ),
}


@hookspec(firstresult=False)
def sparsetorch_conversion_kernels() -> Mapping[str, Callable]:  # type: ignore[empty-body]
    """The compiled conversion steps this backend offers: ``{name: function}`` with names from
    :data:`CONVERSION_KERNELS` (each name's contract is there). Optional; called once per set of
    loaded backends, so it must be cheap and must not launch work. Where several backends offer
    one name, the one of higher :attr:`BackendInfo.priority` (then name order) is used. A kernel
    that raises is reported once (``sparsetorch.info``) and not called again in that process.
    """

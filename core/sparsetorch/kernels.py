"""User kernels for one format: :func:`register_kernel` turns a product function into a backend.

nvmath-python's UST attaches custom code to one tensor (``Tensor.set_kernel`` / ``run_kernel``,
an elementwise transformation; :meth:`sparsetorch.SparseTensor.set_kernel` has that meaning
here). What users of a new format also want is their own *product* kernel for it, chosen by
the library wherever a product on that format runs (``st.matmul``, ``A @ x``, ``Matmul``,
``SparseLinear``, ``SparseWeight`` and their backward passes). In sparsetorch that is a backend
plugin, and :func:`register_kernel` writes the plugin for you::

    import sparsetorch as st
    import sparsetorch.kernels

    def dia_matmul(A, X):              # A: a SparseTensor in DIA, X: (n, k) -> (m, k)
        ...

    handle = sparsetorch.kernels.register_kernel(st.format.DIA, dia_matmul)
    y = A @ x                          # dispatch picks "kernel-DIA" for DIA tensors
    handle.remove()                    # or use it as a context manager

The registered backend goes through the public plugin registration
(``sparsetorch.backend.get_backends().register``), so ``sparsetorch.explain("matmul", A, x)``
lists it with its estimate, ``backend="kernel-DIA"`` pins it, and it answers only requests whose
A is in exactly its format (other formats get a decline saying so). Gradients need no work of
yours: the values' gradient is the core's sampled product (SDDMM), and the input's gradient is
the adjoint product ``A^H @ G``, computed by ``adjoint=`` when you give one and otherwise by a
format-independent scatter over ``A.entries()`` (correct for every format, not fast).
``examples/user_kernel.py`` is a complete example.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ._markers import hookimpl
from .backend import BackendInfo, Decline, Offer, Request, get_backends, itemsize, rates
from .errors import InputError
from .format import TensorFormat
from .tensor import SparseTensor

__all__ = ["register_kernel", "registered_kernels", "KernelHandle", "reference_adjoint"]

#: a product kernel: (A, X) -> A @ X, X of shape (*batch, n, k), the result (*batch, m, k)
Kernel = Callable[[SparseTensor, torch.Tensor], torch.Tensor]
#: a cost model: the request -> estimated seconds of one call
CostFn = Callable[[Request], float]

_LOCK = threading.Lock()
_REGISTERED: dict[str, "KernelHandle"] = {}


def reference_adjoint(A: SparseTensor, X: torch.Tensor) -> torch.Tensor:
    """``A^H @ X`` for any format, by a scatter over the stored entries (``A.entries()``):
    ``Y[..., j, :] += conj(a_ij) X[..., i, :]``. ``X`` has shape ``(*batch, m, k)``; the result
    ``(*batch, n, k)``. What a kernel registered without ``adjoint=`` uses in the backward pass."""
    coords, slots = A.entries()
    rows, cols = coords[-2], coords[-1]
    vals = A.values[..., slots].conj()
    Y = X.new_zeros(*X.shape[:-2], A.format_shape[-1], X.shape[-1])
    return Y.index_add_(-2, cols, vals.unsqueeze(-1) * X[..., rows, :])


@dataclass(eq=False)
class KernelHandle:
    """A registered kernel: its backend :attr:`name`, :meth:`remove` to unregister it (also as
    a context manager: ``with register_kernel(...):``)."""

    name: str
    format: TensorFormat
    kernel: Kernel
    adjoint: Kernel | None
    dtypes: tuple[torch.dtype, ...]
    devices: tuple[str, ...]
    cost: float | CostFn | None
    batched: bool
    description: str

    # the two hooks (docs/backend-authors.md): this object is the plugin ---------------------------
    @hookimpl
    def sparsetorch_backend_info(self) -> BackendInfo:
        return BackendInfo(name=self.name, version="user", description=self.description, devices=self.devices,
                           dtypes=self.dtypes, ops={"matmul": ("spmm",)}, formats=(self.format,))

    @hookimpl
    def sparsetorch_offers(self, request: Request) -> list[Offer | Decline]:
        if request.op != "matmul":
            return []
        A = request.A
        fname = self.format.name or str(self.format)
        if A.kind != "sparse" or A.format is None:
            return [Decline(self.name, f"takes one SparseTensor as A, got a {A.kind} operand")]
        if A.format.replace(index_dtype=None) != self.format.replace(index_dtype=None):
            got = A.format.name or str(A.format)
            return [Decline(self.name, f"is a kernel for format {fname} only; A is {got} "
                                       f"(convert it with A.convert({fname}) to use it)")]
        if A.dtype not in self.dtypes:
            names = ", ".join(str(d).replace("torch.", "") for d in self.dtypes)
            return [Decline(self.name, f"runs dtypes {names}; A is {str(A.dtype).replace('torch.', '')} "
                                       f"(register the kernel with dtypes=... to widen it)")]
        if A.device.type not in self.devices:
            return [Decline(self.name, f"runs on {', '.join(self.devices)}; A is on {A.device} "
                                       f"(register the kernel with devices=... to widen it)")]
        if A.batch_shape and not self.batched:
            return [Decline(self.name, f"takes matrices without a value batch; A has batch {tuple(A.batch_shape)} "
                                       f"(register the kernel with batched=True if it handles (*batch, n, k) operands)")]
        seconds, notes = self._estimate(request)
        return [Offer(self.name, "spmm", seconds, 0, self._build, notes=notes)]

    def _estimate(self, request: Request) -> tuple[float, str]:
        if callable(self.cost):
            return float(self.cost(request)), "user kernel; cost from its cost model"
        if self.cost is not None:
            return float(self.cost), "user kernel; cost given at registration"
        A = request.A
        m = A.shape[-2]
        k = request.rhs_columns
        nse = A.nse or 0
        v = itemsize(A.dtype)
        isize = 4 if A.format is not None and A.format.index_dtype == torch.int32 else 8
        traffic = nse * (v + isize) + nse * k * v + m * k * v
        secs = rates(A.device).seconds(bytes=traffic, flops=2 * nse * k, launches=1)
        return secs, "user kernel on its own format (no conversion); estimate: one pass over the stored slots"

    def _build(self, A: SparseTensor, request: Request) -> "_KernelPlan":
        return _KernelPlan(self, A)

    # lifetime -------------------------------------------------------------------------------------
    def remove(self) -> None:
        """Unregister the kernel (dispatch stops offering it; cached plans of it are dropped)."""
        with _LOCK:
            if _REGISTERED.get(self.name) is self:
                del _REGISTERED[self.name]
                get_backends().unregister(self.name)

    def is_active(self) -> bool:
        """Whether the kernel is still registered and loaded."""
        return _REGISTERED.get(self.name) is self and self.name in get_backends().names

    def __enter__(self) -> "KernelHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


class _KernelPlan:
    """The matmul plan of a user kernel (the MatmulPlan protocol): values swapped in by pointer."""

    method = "spmm"
    preconditioner = None
    reload_cheap = True

    def __init__(self, handle: KernelHandle, A: SparseTensor) -> None:
        self.backend = handle.name
        self._handle = handle
        self._A = A

    def set_values(self, values: torch.Tensor) -> None:
        self._A = self._A.with_values(values)

    def apply(self, X: torch.Tensor, *, adjoint: bool = False) -> torch.Tensor:
        h = self._handle
        if adjoint:
            return h.adjoint(self._A, X) if h.adjoint is not None else reference_adjoint(self._A, X)
        return h.kernel(self._A, X)


_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def register_kernel(format: TensorFormat | str, kernel: Kernel, *, adjoint: Kernel | None = None, name: str | None = None,
                    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float64),
                    devices: Sequence[str] = ("cpu", "cuda"), cost: float | CostFn | None = None,
                    batched: bool = False) -> KernelHandle:
    """Register ``kernel`` as the product ``A @ X`` for tensors in ``format``; returns its handle.

    Args:
        format: the one format the kernel reads (a TensorFormat or its DSL string). Requests
            on any other format are declined with a reason, so the kernel only ever sees
            tensors in this format (any index dtype).
        kernel: ``kernel(A, X) -> Y`` with ``A`` a SparseTensor in ``format`` (read its
            buffers with ``A.pos(k)``, ``A.crd(k)``, ``A.values``), ``X`` of shape ``(n, k)``
            (``(*batch, n, k)`` with ``batched=True``) and ``Y`` of shape ``(m, k)`` in X's dtype
            and device. Called without autograd (inputs detached, under ``torch.no_grad()``);
            the core checks what it returns (shape, dtype, device).
        adjoint: ``adjoint(A, G) -> A^H @ G`` for the backward pass (and ``A.mT @ x``); default
            :func:`reference_adjoint`.
        name: the backend name (default ``"kernel-<format name>"``): what ``backend=``,
            ``explain`` and ``sparsetorch info`` show.
        dtypes, devices: what the kernel runs; other requests are declined with a reason.
        cost: seconds per call for dispatch to compare with the other backends: a number, a
            function of the :class:`~sparsetorch.Request`, or None for the roofline of one
            pass over the stored slots on the machine's calibrated rates (the torch backend's own
            model, less the format conversion it needs for formats other than CSR: dispatch
            then prefers the kernel on its format). Pin it with ``backend=name`` regardless.
        batched: whether the kernel takes a value batch (A with batch dims, X ``(*batch, n, k)``).

    Raises :class:`~sparsetorch.InputError` for a bad argument or a name already taken. The
    backend lives until :meth:`KernelHandle.remove` (or ``sparsetorch.backend.reset_backends()``,
    which reloads the installed backends only).
    """
    if isinstance(format, str):
        format = TensorFormat.parse(format)
    if not isinstance(format, TensorFormat):
        raise InputError(f"register_kernel: format must be a TensorFormat or its DSL string, got {type(format).__name__}")
    if format.ndim != 2:
        raise InputError(f"register_kernel: product kernels are for matrix formats (2 dimensions); {format} has {format.ndim}")
    if not callable(kernel) or (adjoint is not None and not callable(adjoint)):
        raise InputError("register_kernel: kernel (and adjoint, when given) must be callables (A, X) -> Y")
    if cost is not None and not callable(cost) and not (isinstance(cost, (int, float)) and cost >= 0):
        raise InputError(f"register_kernel: cost must be seconds >= 0, a function of the request, or None; got {cost!r}")
    label = format.name or "custom"
    name = name or "kernel-" + re.sub(r"[^A-Za-z0-9_-]+", "_", label).strip("_")
    if not _NAME.match(name):
        raise InputError(f"register_kernel: name {name!r} may use letters, digits, '-' and '_' only")
    dt = tuple(dtypes)
    if not dt or not all(isinstance(d, torch.dtype) for d in dt):
        raise InputError(f"register_kernel: dtypes must be torch dtypes, got {dtypes!r}")
    dev = tuple(str(d) for d in devices)
    handle = KernelHandle(name=name, format=format.replace(index_dtype=None), kernel=kernel, adjoint=adjoint,
                          dtypes=dt, devices=dev, cost=cost, batched=bool(batched),
                          description=f"user kernel {getattr(kernel, '__name__', 'kernel')} for format {label}")
    with _LOCK:
        backends = get_backends()
        if name in backends.names or name in _REGISTERED:
            raise InputError(f"register_kernel: a backend named {name!r} is already loaded; pass name=... or remove "
                             f"the other first (its handle's .remove())")
        backends.register(handle, name)
        if name not in backends.names:
            why = next((b.error for b in backends.broken if b.name == name), "unknown")
            raise InputError(f"register_kernel: the backend {name!r} did not load: {why}")
        _REGISTERED[name] = handle
    return handle


def registered_kernels() -> list[KernelHandle]:
    """The kernels registered with :func:`register_kernel` and still loaded."""
    return [h for h in list(_REGISTERED.values()) if h.is_active()]

"""Loading the compiled modules and launching their kernels on torch's current stream.

Modules are loaded with ``cuLibraryLoadData`` (context-independent libraries, CUDA 12+): a kernel
handle from ``cuLibraryGetKernel`` launches in the context of the stream it is given, which is
torch's current stream on the tensors' device, so the launches order with torch's own work
without a synchronization and are captured by ``torch.cuda.graph`` like any torch kernel.

A :class:`Kernel` keeps its argument block: every kernel parameter is 8 bytes wide (pointers and
64-bit integers, see kernels/common.cuh), the values live in one ``uint64`` array and the
``void**`` the driver wants is a second array of their addresses, made once. A launch writes the
values and calls ``cuLaunchKernel`` with the address: no per-call packing.

Programmatic dependent launch (PDL, sm_90+): a kernel whose ``pdl`` is set (:func:`allow_pdl`, per
kernel, by the module that knows it) is launched by :class:`Prepared` and :class:`Bound` (and by
``Kernel.__call__`` when asked, ``pdl=True``) through ``cuLaunchKernelEx`` with the attribute
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``: it may start before the kernel ahead of
it in the stream has finished (once that kernel's blocks have all run
``griddepcontrol.launch_dependents`` or exited), and ``griddepcontrol.wait`` in it waits for that
kernel's completion and the visibility of its writes (PTX ISA, griddepcontrol). Only a kernel that
runs ``griddepcontrol.wait`` before it reads anything an earlier kernel may write (X, the values,
the bias) and before it writes anything may be opted in; before its wait it may read only buffers
no kernel still in flight writes (a plan's own pattern copies, made before the plan's first launch,
which is made without PDL). A launch without the attribute (every torch kernel) still waits for
everything before it, so a kernel that triggers its dependents early can only let PDL kernels,
which wait, start early. CUDA-graph capture records the programmatic edge.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import numpy as np
import torch

from . import compile as _compile

__all__ = ["Kernel", "kernel", "resident_blocks", "arch_of", "LaunchError", "dtype_name", "Prepared", "PreparedSeq",
           "Bound", "recording", "raw_stream",
           "allow_pdl", "PDL"]

#: whether kernels opted in to programmatic dependent launch (:func:`allow_pdl`) are launched with it
#: (read when a Prepared / Bound is made and at each ``Kernel.__call__(pdl=True)``)
PDL = True

_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64"}
_INDEX = {torch.int32: "int32", torch.int64: "int64"}


class LaunchError(RuntimeError):
    """The driver refused to load a module or launch a kernel."""


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPES[dtype]


@functools.lru_cache(maxsize=None)
def _driver() -> Any:
    from cuda.bindings import driver  # noqa: PLC0415

    (err,) = driver.cuInit(0)
    _ok(driver, err, "cuInit")
    return driver


def _ok(cu: Any, err: Any, what: str) -> None:
    if int(err) != 0:
        try:
            _, name = cu.cuGetErrorName(err)
            name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # noqa: BLE001 - only for the message
            name = str(err)
        raise LaunchError(f"{what} failed: {name} ({int(err)})")


@functools.lru_cache(maxsize=None)
def arch_of(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


@functools.lru_cache(maxsize=None)
def _library(source: str, value: str, index: str, arch: str) -> Any:
    cu = _driver()
    data = _compile.cubin(source, value, index, arch)
    err, lib = cu.cuLibraryLoadData(data, [], [], 0, [], [], 0)
    _ok(cu, err, f"cuLibraryLoadData({source} {value}/{index}/{arch})")
    return lib


@functools.lru_cache(maxsize=64)
def _stream(ptr: int) -> Any:
    return _driver().CUstream(ptr)


_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def raw_stream(device: int | None) -> int:
    """The handle of torch's current stream on ``device`` (what ``torch.cuda.current_stream(device)
    .cuda_stream`` gives, without making a Stream object: about a microsecond less per launch)."""
    if _raw is not None and device is not None:
        return int(_raw(device))
    return int(torch.cuda.current_stream(device).cuda_stream)


class _Recorder(threading.local):
    calls: list | None = None
    #: record without launching (``recording(dry=True)``)
    dry: bool = False


_REC = _Recorder()


class recording:
    """``with recording() as calls:`` collects every launch made inside (the launches still run) as
    ``(kernel, grid, block, args, shared)``: how a plan learns the one launch a call makes, to
    replay it with new X and Y pointers (:class:`Prepared`). ``dry=True``: the launches are only
    recorded, not made (how :meth:`~.plan.CudaSpmmPlan.bind` learns a launch without running it)."""

    def __init__(self, dry: bool = False) -> None:
        self.dry = dry

    def __enter__(self) -> list:
        self.calls: list = []
        self._outer = (_REC.calls, _REC.dry)
        _REC.calls, _REC.dry = self.calls, self.dry
        return self.calls

    def __exit__(self, *exc: Any) -> None:
        _REC.calls, _REC.dry = self._outer


def allow_pdl(kern: "Kernel", device_index: int) -> "Kernel":
    """Opt ``kern`` in to programmatic dependent launch on sm_90 and later (see the module docstring
    for what the kernel must do); returns it."""
    if int(arch_of(device_index)[3:]) >= 90:
        kern.pdl = True
    return kern


def _launch_config(cu: Any, fn: Any, grid: tuple[int, int], block: int, shared: int, pdl: bool) -> Any:
    """A ``CUlaunchConfig`` for ``cuLaunchKernelEx`` (the stream is set per call), with the
    programmatic-stream-serialization attribute when ``pdl``."""
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = int(grid[0]), int(grid[1]), 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = int(block), 1, 1
    cfg.sharedMemBytes = int(shared)
    if pdl:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        cfg.attrs = [attr]
        cfg.numAttrs = 1
    else:
        cfg.numAttrs = 0
    return cfg


class Kernel:
    """One kernel of one module, with its argument block. ``pdl``: whether launches of it may use
    programmatic dependent launch (:func:`allow_pdl`)."""

    pdl: bool = False

    def __init__(self, source: str, name: str, value: str, index: str, arch: str, nargs: int) -> None:
        self._bind(_library(source, value, index, arch), name, nargs)

    def _bind(self, lib: Any, name: str, nargs: int) -> None:
        """Take kernel ``name`` of the loaded library ``lib`` and make its argument block of ``nargs``
        8-byte slots (also for modules compiled elsewhere: krylov.py, codegen.py, _spmm_cc.py)."""
        cu = _driver()
        err, k = cu.cuLibraryGetKernel(lib, name.encode())
        _ok(cu, err, f"cuLibraryGetKernel({name})")
        self.name = name
        self._fn = cu.CUfunction(int(k))
        self._cu = cu
        self._args = np.zeros(nargs, dtype=np.uint64)
        base = self._args.ctypes.data
        self._ptrs = np.array([base + 8 * i for i in range(nargs)], dtype=np.uint64)
        self._addr = int(self._ptrs.ctypes.data)
        self._nargs = nargs
        self._lock = threading.Lock()
        #: the last launch's stream: (raw handle, its CUstream), made once per stream (-1: none yet)
        self._st: tuple[int, Any] = (-1, None)

    def __call__(self, grid: tuple[int, int], block: int, args: tuple[int, ...], *, shared: int = 0,
                 device: int | None = None, pdl: bool = False) -> None:
        """Launch on ``grid`` (x, y) blocks of ``block`` threads, on torch's current stream; with
        programmatic dependent launch when ``pdl`` and the kernel is opted in (:attr:`pdl`). A plan's
        first launch of a pattern (this call, recorded) is made without it: what its pattern buffers
        were written by has then finished before any later launch of them starts."""
        if len(args) != self._nargs:
            raise LaunchError(f"{self.name} takes {self._nargs} arguments, got {len(args)}")
        gx, gy = int(grid[0]), int(grid[1])
        if gx == 0 or gy == 0:
            return
        raw = raw_stream(device)
        st = self._st
        if st[0] != raw:
            st = self._st = (raw, _stream(raw))
        stream = st[1]
        if _REC.calls is not None:
            _REC.calls.append((self, (gx, gy), block, tuple(int(v) for v in args), shared))
            if _REC.dry:
                return
        with self._lock:
            a = self._args
            for i, v in enumerate(args):
                a[i] = v
            if pdl and self.pdl and PDL:
                cfg = _launch_config(self._cu, self._fn, (gx, gy), block, shared, True)
                cfg.hStream = stream
                (err,) = self._cu.cuLaunchKernelEx(cfg, self._fn, self._addr, 0)
            else:
                (err,) = self._cu.cuLaunchKernel(self._fn, gx, gy, 1, block, 1, 1, shared, stream, self._addr, 0)
        if int(err) != 0:
            _ok(self._cu, err, f"cuLaunchKernel({self.name}, grid=({gx},{gy}), block={block})")


class Prepared:
    """One recorded launch of a kernel with its own argument block, of which two slots (the X and Y
    pointers) change per call: a call writes those two and launches, on torch's current stream.
    Plans keep one per (columns of X, X's alignment) for their common call (plan.py). A kernel opted
    in to programmatic dependent launch (``kern.pdl``, :data:`PDL`) is launched with it
    (``cuLaunchKernelEx``; the config is made once, its stream set per call)."""

    __slots__ = ("_kern", "_fn", "_cu", "_gx", "_gy", "_block", "_shared", "_args", "_ptrs", "_addr", "_xi", "_yi",
                 "_device", "_lock", "_cfg", "pdl")

    def __init__(self, kern: Kernel, grid: tuple[int, int], block: int, args: tuple[int, ...], shared: int, xi: int, yi: int,
                 device: int) -> None:
        self._kern, self._fn, self._cu = kern, kern._fn, kern._cu
        self._gx, self._gy = int(grid[0]), int(grid[1])
        self._block, self._shared = int(block), int(shared)
        self._args = np.array([v & 0xFFFFFFFFFFFFFFFF for v in args], dtype=np.uint64)
        self._ptrs = np.array([self._args.ctypes.data + 8 * i for i in range(len(args))], dtype=np.uint64)
        self._addr = int(self._ptrs.ctypes.data)
        self._xi, self._yi, self._device = xi, yi, device
        self._lock = threading.Lock()
        self.pdl = bool(kern.pdl and PDL)
        self._cfg = _launch_config(self._cu, self._fn, grid, block, shared, True) if self.pdl else None

    def set_pdl(self, on: bool) -> None:
        """Launch with programmatic dependent launch (where the kernel allows it) or not."""
        self.pdl = bool(on and self._kern.pdl)
        self._cfg = _launch_config(self._cu, self._fn, (self._gx, self._gy), self._block, self._shared, True) if self.pdl else None

    def __call__(self, xptr: int, yptr: int) -> None:
        stream = _stream(raw_stream(self._device))
        with self._lock:
            a = self._args
            a[self._xi] = xptr
            a[self._yi] = yptr
            cfg = self._cfg
            if cfg is not None:
                cfg.hStream = stream
                (err,) = self._cu.cuLaunchKernelEx(cfg, self._fn, self._addr, 0)
            else:
                (err,) = self._cu.cuLaunchKernel(self._fn, self._gx, self._gy, 1, self._block, 1, 1, self._shared, stream,
                                                 self._addr, 0)
        if int(err) != 0:
            _ok(self._cu, err, f"cuLaunchKernel({self._kern.name})")


class PreparedSeq:
    """Recorded launches replayed in order on torch's current stream, each a :class:`Prepared` with the same
    X and Y pointers written into it (a plan's tensor-core product and its non-finite fix-up, _mma.py).
    ``pdl`` / ``set_pdl`` are the first launch's (the ones after it launch plainly)."""

    __slots__ = ("_parts",)

    def __init__(self, parts: "list[Prepared]") -> None:
        self._parts = tuple(parts)

    @property
    def pdl(self) -> bool:
        return self._parts[0].pdl

    def set_pdl(self, on: bool) -> None:
        self._parts[0].set_pdl(on)

    def __call__(self, xptr: int, yptr: int) -> None:
        for part in self._parts:
            part(xptr, yptr)


class Bound:
    """One recorded launch bound to a values tensor: ``bound(X, Y)`` writes the X and Y pointers
    into its own argument block and launches on torch's current stream, reading the values where
    they lie. The per-call work is a few attribute reads and integer compares, two stores and
    ``cuLaunchKernel``: no dictionary lookup, no allocation, no torch op. It returns False, and
    launches nothing, when a call cannot reuse the recording: X not contiguous or aligned
    otherwise than when it was recorded (a kernel may pick 16-byte loads by X's alignment), Y
    not 16-byte aligned, or the values tensor moved to another address (``.data`` swapped).
    The caller checks shapes, dtypes and devices once, when it binds (``CudaSpmmPlan.bind``);
    ``owner`` (the plan, whose index buffers the recorded arguments point to) is kept alive. A kernel
    opted in to programmatic dependent launch (``kern.pdl``, :data:`PDL`) is launched with it from
    the second call on (the recording was dry: the first call is the pattern's first launch), through
    cuda.bindings' ``cuLaunchKernelEx`` whatever :data:`BOUND_LAUNCH` says."""

    __slots__ = ("name", "values", "owner", "_vp", "_xalign", "_fn", "_cu", "_gx", "_gy", "_block", "_shared", "_args", "_ptrs",
                 "_addr", "_xi", "_yi", "_xp", "_yp", "_device", "_lock", "_rawfn", "_stream", "_success", "_ct", "_cfg",
                 "_calls", "pdl", "_launch")

    def __init__(self, kern: Kernel, grid: tuple[int, int], block: int, args: tuple[int, ...], shared: int, xi: int,
                 yi: int, device: int, values: torch.Tensor, xalign: int, owner: Any = None) -> None:
        self.name = kern.name
        self.owner = owner  # what holds the other buffers the arguments point to (the plan): kept alive
        self.values, self._vp, self._xalign = values, values.data_ptr(), xalign
        self._fn, self._cu = kern._fn, kern._cu
        self._gx, self._gy = int(grid[0]), int(grid[1])
        self._block, self._shared = int(block), int(shared)
        self._args = np.array([v & 0xFFFFFFFFFFFFFFFF for v in args], dtype=np.uint64)
        self._ptrs = np.array([self._args.ctypes.data + 8 * i for i in range(len(args))], dtype=np.uint64)
        self._addr = int(self._ptrs.ctypes.data)
        self._xi, self._yi, self._device = xi, yi, device
        self._xp, self._yp = int(self._args[xi]), int(self._args[yi])  # what the block holds now
        self._lock = threading.Lock()
        self._rawfn = _raw if _raw is not None else (lambda d: torch.cuda.current_stream(d).cuda_stream)
        # of the last call's stream: (raw handle, the launch's whole argument tuple for it (cuda.bindings' or
        # ctypes'), the CUstream); made once per stream, so a call reads one attribute for all of them
        self._stream: tuple[int, Any, Any] = (-1, None, None)  # -1: no stream yet (0 is the legacy default stream)
        self._launch = self._cu.cuLaunchKernel
        self._success = getattr(getattr(self._cu, "CUresult", None), "CUDA_SUCCESS", None)
        self.pdl = bool(kern.pdl and PDL)
        self._ct = _ctypes_launch() if BOUND_LAUNCH == "ctypes" and not self.pdl else None
        self._cfg = _launch_config(self._cu, self._fn, grid, block, shared, True) if self.pdl else None
        self._calls = 0

    def _for_stream(self, raw: int) -> tuple[int, Any, Any]:
        stream = _stream(int(raw))
        if self._ct is None:
            return (raw, (self._fn, self._gx, self._gy, 1, self._block, 1, 1, self._shared, stream, self._addr, 0), stream)
        import ctypes  # noqa: PLC0415 - with the ctypes launch only

        u, p = ctypes.c_uint, ctypes.c_void_p
        return (raw, (p(int(self._fn)), u(self._gx), u(self._gy), u(1), u(self._block), u(1), u(1), u(self._shared),
                      p(int(raw)), p(self._addr), None), stream)

    def __call__(self, X: torch.Tensor, Y: torch.Tensor) -> bool:
        xp = X.data_ptr()
        yp = Y.data_ptr()
        if (xp & 15) != self._xalign or yp & 15 or self.values.data_ptr() != self._vp or not X.is_contiguous():
            return False
        raw = self._rawfn(self._device)
        st = self._stream
        if st[0] != raw:
            st = self._stream = self._for_stream(raw)
        lock = self._lock
        lock.acquire()  # acquire / release: half the cost of ``with`` on CPython 3.11 (0.10 against 0.23 us)
        try:
            if xp != self._xp:  # the same b call after call: nothing to write
                self._args[self._xi] = xp
                self._xp = xp
            if yp != self._yp:
                self._args[self._yi] = yp
                self._yp = yp
            if self._ct is not None:
                err = self._ct(*st[1])
            elif self._cfg is None:
                (err,) = self._launch(*st[1])
            elif self._calls:
                self._cfg.hStream = st[2]
                (err,) = self._cu.cuLaunchKernelEx(self._cfg, self._fn, self._addr, 0)
            else:  # the recording was dry: the first call is the pattern's first launch, without PDL
                self._calls = 1
                (err,) = self._launch(*st[1])
        finally:
            lock.release()
        if err is not self._success and int(err) != 0:
            _ok(self._cu, self._cu.CUresult(int(err)), f"cuLaunchKernel({self.name})")
        return True


#: how a :class:`Bound` launches: "bindings" (cuda.bindings' cuLaunchKernel) or "ctypes" (the
#: driver's cuLaunchKernel called through ctypes, its arguments made as ctypes objects once per
#: stream); read when a Bound is made
BOUND_LAUNCH = "bindings"


@functools.lru_cache(maxsize=1)
def _ctypes_launch() -> Any:
    import ctypes  # noqa: PLC0415

    _driver()  # cuInit
    f = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
    f.restype = ctypes.c_int
    return f


@functools.lru_cache(maxsize=None)  # per kernel object: kernel() hands out one per (source, name, types, device)
def clusters_resident(kern: "Kernel", device: int, threads: int, smem: int, size: int) -> int:
    """Clusters of ``size`` blocks of ``kern`` resident at once on ``device`` (the driver's occupancy
    calculator after the kernel's shared-memory opt-in; SMs / size where it fails), at least 1."""
    from ._mma import _allow_smem  # noqa: PLC0415
    from .layout import _sm_count  # noqa: PLC0415

    _allow_smem(kern, device, smem)
    sms = _sm_count(device)
    return max(1, resident_blocks(kern, threads, smem, size, sms, (sms // size) * size) // size)


def resident_blocks(kern: "Kernel", threads: int, smem: int, cluster: int, sms: int, fallback: int) -> int:
    """Blocks of ``kern`` (``threads`` per block, ``smem`` bytes of dynamic shared memory, clusters of
    ``cluster`` blocks) resident on the whole GPU (``sms`` multiprocessors) at once, by the driver's
    occupancy calculator: blocks per SM x SMs, or clusters that fit x ``cluster``; ``fallback`` where
    the calculator fails (an estimate for choosing a launch shape: a real launch error still
    surfaces at the launch)."""
    try:
        cu = _driver()
        fn = cu.CUfunction(int(kern._fn))
        if cluster == 1:
            err, per_sm = cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, threads, smem)
            return int(per_sm) * sms if int(err) == 0 and int(per_sm) > 0 else fallback
        conf = cu.CUlaunchConfig()
        conf.gridDimX, conf.gridDimY, conf.gridDimZ = cluster * sms, 1, 1
        conf.blockDimX, conf.blockDimY, conf.blockDimZ = threads, 1, 1
        conf.sharedMemBytes = smem
        conf.numAttrs = 0
        err, clusters = cu.cuOccupancyMaxActiveClusters(fn, conf)
        return int(clusters) * cluster if int(err) == 0 and int(clusters) > 0 else fallback
    except Exception:  # noqa: BLE001 - an estimate only; the launch itself reports real errors
        return fallback


@functools.lru_cache(maxsize=None)
def kernel(source: str, name: str, dtype: torch.dtype, index_dtype: torch.dtype, device_index: int, nargs: int) -> Kernel:
    """The kernel ``name`` of ``source`` for these types on this device (loaded once per process)."""
    return Kernel(source, name, _DTYPES[dtype], _INDEX[index_dtype], arch_of(device_index), nargs)

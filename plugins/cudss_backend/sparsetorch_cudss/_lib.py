"""A thin ctypes layer over libcudss (cuDSS 0.8 and 1.0; the nvidia-cudss-cu12/-cu13 wheels).

Why our own layer and not nvmath-python's bindings: nvmath-python 1.0 is built against cuDSS
0.8 (its DirectSolver refuses any other version) and loads ``libcudss.so.0`` only, while the
current release, cuDSS 1.0, ships ``libcudss.so.1`` in both wheel families. The C API the plugin
needs (about twenty functions, all returning a status) is the same in 0.8 and 1.0 apart from the
``cudssDataType_t`` -> ``cudaDataType_t`` rename, whose numeric values did not change; what 1.0
adds that matters here (``CUDSS_CONFIG_SOLVE_MODE``: transposed solves) is checked by version.
The enum values below are those of the public headers (cudss_data_types.h, identical in 0.8 and
1.0 for everything used here).

Finding the library (:func:`find_library`), without loading it:

1. ``SPARSETORCH_CUDSS_LIBRARY``: a path to ``libcudss.so.*`` (or a directory holding it);
2. the wheels: ``nvidia/cu13/lib``, ``nvidia/cu12/lib`` (cuDSS >= 0.7) and ``nvidia/cudss/lib``
   (older wheels) under every ``nvidia`` package directory on ``sys.path``; the wheel matching
   ``torch.version.cuda`` first, ``libcudss.so.1`` before ``libcudss.so.0``;
3. the system loader path (``libcudss.so.1``, ``libcudss.so.0``, ``libcudss.so``).

cuDSS needs cuBLAS of the same CUDA major version (``libcublas.so.12`` / ``.13``); a CUDA build of
torch has loaded it already. If not, it is loaded from the same wheel directory first.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

__all__ = [
    "find_library", "load", "Library", "CudssError", "LibraryNotFound", "Phase", "Config", "Data", "MatrixType",
    "View", "DType", "Layout", "Base", "SolveMode", "REORDERING", "PIVOT_TYPE",
]

ENV = "SPARSETORCH_CUDSS_LIBRARY"
_SONAMES = ("libcudss.so.1", "libcudss.so.0")


# --- enums (cudss_data_types.h, cuDSS 0.8 / 1.0) -------------------------------------------------
class Phase:
    ANALYSIS = 1 | 2  # REORDERING | SYMBOLIC_FACTORIZATION
    FACTORIZATION = 1 << 2
    REFACTORIZATION = 1 << 3
    SOLVE = (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9)


class Config:
    REORDERING_ALG = 0
    FACTORIZATION_ALG = 1
    SOLVE_ALG = 2
    MATCHING_ALG = 3
    SOLVE_MODE = 4
    IR_N_STEPS = 5
    IR_TOL = 6
    PIVOT_TYPE = 7
    PIVOT_THRESHOLD = 8
    PIVOT_EPSILON = 9
    MAX_LU_NNZ = 10
    HYBRID_MEMORY_MODE = 11
    HYBRID_DEVICE_MEMORY_LIMIT = 12
    USE_CUDA_REGISTER_MEMORY = 13
    HOST_NTHREADS = 14
    HYBRID_EXECUTE_MODE = 15
    PIVOT_EPSILON_ALG = 16
    ND_NLEVELS = 17
    UBATCH_SIZE = 18
    UBATCH_INDEX = 19
    USE_SUPERPANELS = 20
    DEVICE_COUNT = 21
    DEVICE_INDICES = 22
    SCHUR_MODE = 23
    DETERMINISTIC_MODE = 24


#: value types of the configuration parameters the plugin sets (everything else is int32)
CONFIG_CTYPE = {Config.IR_TOL: ctypes.c_double, Config.PIVOT_THRESHOLD: ctypes.c_double,
                Config.PIVOT_EPSILON: ctypes.c_double, Config.MAX_LU_NNZ: ctypes.c_int64,
                Config.HYBRID_DEVICE_MEMORY_LIMIT: ctypes.c_int64}


class Data:
    INFO = 0
    LU_NNZ = 1
    NPIVOTS = 2
    INERTIA = 3
    PERM_REORDER_ROW = 4
    PERM_REORDER_COL = 5
    DIAG = 8
    HYBRID_DEVICE_MEMORY_MIN = 10
    MEMORY_ESTIMATES = 13


class MatrixType:
    GENERAL, SYMMETRIC, HERMITIAN, SPD, HPD = 0, 1, 2, 3, 4


class View:
    FULL, LOWER, UPPER = 0, 1, 2


class DType:  # cudaDataType_t values (library_types.h)
    R_32F, R_64F, C_32F, C_64F, R_32I, R_64I = 0, 1, 4, 5, 10, 24


class Layout:
    COL_MAJOR, ROW_MAJOR = 0, 1


class Base:
    ZERO, ONE = 0, 1


class SolveMode:  # cuDSS >= 1.0
    NORMAL, TRANSPOSE, CONJUGATE_TRANSPOSE = 0, 1, 2


#: the backend_options keys the plan reads (plan.py), declared in the plugin's BackendInfo
BACKEND_OPTIONS = ("host_threads", "refactorization", "reordering", "pivot_type", "pivot_threshold", "pivot_epsilon", "ir_steps", "hybrid_memory",
                   "hybrid_device_memory_limit", "deterministic", "residual_check", "nd_nlevels")

REORDERING = {"default": 0, "btf_colamd": 1, "colamd": 2, "amd": 3, "nested_dissection": 4, "none": 5}
PIVOT_TYPE = {"auto": 0, "none": 1, "global_col": 2, "global_row": 3, "diagonal": 4, "local_block": 5,
              "bunch_kaufman": 6}

_STATUS = {0: "SUCCESS", 1: "NOT_INITIALIZED", 2: "ALLOC_FAILED", 3: "INVALID_VALUE", 4: "NOT_SUPPORTED",
           5: "EXECUTION_FAILED", 6: "INTERNAL_ERROR", 7: "IR_FAILED"}


class LibraryNotFound(ImportError):
    """libcudss could not be found or loaded (the message says where it looked and what to install)."""


class CudssError(RuntimeError):
    """A cuDSS call returned a status other than CUDSS_STATUS_SUCCESS."""

    def __init__(self, function: str, status: int) -> None:
        self.function, self.status = function, int(status)
        name = _STATUS.get(self.status, "unknown status")
        hint = ""
        if self.status == 2:
            hint = (": the GPU ran out of memory; pass backend_options={'hybrid_memory': True} (factors in host "
                    "memory) or use an iterative method")
        super().__init__(f"{function} failed with CUDSS_STATUS_{name} ({self.status}){hint}")


# --- finding the library ----------------------------------------------------------------------------
def _torch_cuda_major() -> str | None:
    torch = sys.modules.get("torch")
    version = getattr(getattr(torch, "version", None), "cuda", None) if torch is not None else None
    return version.split(".")[0] if version else None


def _wheel_dirs() -> list[str]:
    """Candidate lib directories of the nvidia-cudss wheels, the torch-matching CUDA major first."""
    roots: list[str] = []
    for entry in sys.path:
        base = os.path.join(entry or ".", "nvidia")
        if os.path.isdir(base) and base not in roots:
            roots.append(base)
    major = _torch_cuda_major()
    order = ["cu13", "cu12"]
    if major == "12":
        order.reverse()
    dirs = []
    for root in roots:
        for sub in (*order, "cudss"):
            d = os.path.join(root, sub, "lib")
            if os.path.isdir(d):
                dirs.append(d)
    return dirs


def _in_dir(d: str) -> str | None:
    for so in _SONAMES:
        p = os.path.join(d, so)
        if os.path.isfile(p):
            return p
    hits = sorted(glob.glob(os.path.join(d, "libcudss.so*")))
    hits = [h for h in hits if "commlayer" not in h and "mtlayer" not in h]
    return hits[0] if hits else None


@functools.lru_cache(maxsize=None)
def find_library() -> tuple[str | None, str]:
    """``(path or soname, how it was found)``, or ``(None, where it looked)``; loads nothing."""
    env = os.environ.get(ENV)
    if env:
        p = _in_dir(env) if os.path.isdir(env) else (env if os.path.isfile(env) else None)
        if p is None:
            return None, f"{ENV}={env!r} names no libcudss.so file"
        return p, f"{ENV}"
    dirs = _wheel_dirs()
    for d in dirs:
        p = _in_dir(d)
        if p is not None:
            return p, "wheel"
    for so in _SONAMES:  # the system loader path
        for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
            if d and os.path.isfile(os.path.join(d, so)):
                return os.path.join(d, so), "LD_LIBRARY_PATH"
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/local/cuda/lib64", "/usr/lib64"):
        p = _in_dir(d) if os.path.isdir(d) else None
        if p is not None:
            return p, "system"
    looked = ", ".join(dirs) if dirs else "no nvidia/*/lib directory on sys.path"
    return None, f"looked in {looked}, LD_LIBRARY_PATH and the system library directories"


# --- loading -----------------------------------------------------------------------------------------
_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_INT = ctypes.c_int
_SIZE = ctypes.c_size_t

_SIGNATURES: dict[str, tuple] = {
    "cudssCreate": (ctypes.POINTER(_P),),
    "cudssDestroy": (_P,),
    "cudssSetStream": (_P, _P),
    "cudssGetProperty": (_INT, ctypes.POINTER(_INT)),
    "cudssConfigCreate": (ctypes.POINTER(_P),),
    "cudssConfigDestroy": (_P,),
    "cudssConfigSet": (_P, _INT, _P, _SIZE),
    "cudssConfigGet": (_P, _INT, _P, _SIZE, ctypes.POINTER(_SIZE)),
    "cudssDataCreate": (_P, ctypes.POINTER(_P)),
    "cudssDataDestroy": (_P, _P),
    "cudssDataGet": (_P, _P, _INT, _P, _SIZE, ctypes.POINTER(_SIZE)),
    "cudssDataSet": (_P, _P, _INT, _P, _SIZE),
    "cudssExecute": (_P, _INT, _P, _P, _P, _P, _P),
    "cudssMatrixCreateDn": (ctypes.POINTER(_P), _I64, _I64, _I64, _P, _INT, _INT),
    "cudssMatrixCreateCsr": (ctypes.POINTER(_P), _I64, _I64, _I64, _P, _P, _P, _P, _INT, _INT, _INT, _INT, _INT, _INT),
    "cudssMatrixCreateBatchDn": (ctypes.POINTER(_P), _I64, _P, _P, _P, _P, _INT, _INT, _INT),
    "cudssMatrixCreateBatchCsr": (ctypes.POINTER(_P), _I64, _P, _P, _P, _P, _P, _P, _P, _INT, _INT, _INT, _INT, _INT, _INT),
    "cudssMatrixDestroy": (_P,),
    "cudssMatrixSetValues": (_P, _P),
    "cudssMatrixSetCsrPointers": (_P, _P, _P, _P, _P),
    "cudssMatrixSetBatchValues": (_P, _P),
    "cudssSetThreadingLayer": (_P, ctypes.c_char_p),
}


@dataclass(frozen=True)
class Library:
    """The loaded library: ``call(name, *args)`` raises :class:`CudssError` on a bad status."""

    path: str
    version: tuple[int, int, int]
    cdll: Any

    @property
    def threading_layer(self) -> str | None:
        """cuDSS's OpenMP threading layer shipped next to the library (multithreaded host phases:
        the reordering of the analysis), or None."""
        d = os.path.dirname(self.path)
        hits = sorted(glob.glob(os.path.join(d, "libcudss_mtlayer_gomp.so*"))) if d else []
        return hits[0] if hits and getattr(self.cdll, "cudssSetThreadingLayer", None) is not None else None

    @property
    def transposed_solve(self) -> bool:
        """cuDSS >= 1.0 solves with A^T / A^H from the same factors (CUDSS_CONFIG_SOLVE_MODE)."""
        return self.version >= (1, 0, 0)

    def call(self, name: str, *args: Any) -> None:
        status = getattr(self.cdll, name)(*args)
        if status != 0:
            raise CudssError(name, status)


_lock = threading.Lock()


def _preload_cublas(lib_dir: str, major: str | None) -> None:
    names = [f"libcublas.so.{major}"] if major else ["libcublas.so.13", "libcublas.so.12"]
    for name in names:
        for d in (lib_dir, os.path.join(os.path.dirname(os.path.dirname(lib_dir)), "cublas", "lib")):
            p = os.path.join(d, name)
            if os.path.isfile(p):
                for dep in ("libcublasLt" + name[len("libcublas"):],):
                    q = os.path.join(d, dep)
                    if os.path.isfile(q):
                        ctypes.CDLL(q, mode=ctypes.RTLD_GLOBAL)
                ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
                return


@functools.lru_cache(maxsize=None)
def load() -> Library:
    """Load libcudss (once per process). Raises :class:`LibraryNotFound` with what to do."""
    with _lock:
        path, how = find_library()
        if path is None:
            raise LibraryNotFound(
                f"cuDSS library not found ({how}): pip install 'sparsetorch-cudss[cu13]' or 'sparsetorch-cudss[cu12]' "
                f"(nvidia-cudss-cu13 / -cu12, matching torch.version.cuda), or set {ENV} to libcudss.so")
        try:
            cdll = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as first:
            try:  # cuBLAS not loaded yet (torch without CUDA, or a different install): from the wheel dir
                _preload_cublas(os.path.dirname(path), _torch_cuda_major())
                cdll = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                raise LibraryNotFound(f"cuDSS library at {path} ({how}) could not be loaded: {first}") from first
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(cdll, name, None)
            if fn is None:
                if name in ("cudssMatrixSetBatchValues", "cudssSetThreadingLayer"):
                    continue
                raise LibraryNotFound(f"{path} has no {name}: not a cuDSS >= 0.8 library")
            fn.argtypes = list(argtypes)
            fn.restype = ctypes.c_int
        parts = []
        for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            v = ctypes.c_int(0)
            status = cdll.cudssGetProperty(prop, ctypes.byref(v))
            parts.append(v.value if status == 0 else 0)
        version = (parts[0], parts[1], parts[2])
        if version < (0, 8, 0):
            raise LibraryNotFound(f"{path} is cuDSS {'.'.join(map(str, version))}; sparsetorch-cudss needs cuDSS >= 0.8 "
                                  f"(pip install -U nvidia-cudss-cu13)")
        return Library(path, version, cdll)


def pointer_array(ptrs: list[int]) -> Any:
    """A host array of device pointers (``void* const*``)."""
    return (ctypes.c_void_p * len(ptrs))(*ptrs)

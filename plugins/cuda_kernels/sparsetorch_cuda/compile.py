"""Run-time compilation of the kernel sources with NVRTC (``cuda.bindings.nvrtc``), cached.

A module is one kernel source (``kernels/<name>.cu`` after ``kernels/common.cuh``) compiled for
one value type, one index type and one GPU architecture. Its cubin is kept

- in memory, per process (:data:`_MEMORY`), and
- on disk, under ``$SPARSETORCH_CUDA_CACHE`` (default ``$XDG_CACHE_HOME/sparsetorch/cuda_kernels``,
  ``~/.cache/...`` without XDG), in a file named by the key, so a second process compiles nothing.

The key is ``(sha256 of the source text, the NVRTC options and NVRTC's version; value type;
index type; architecture)``: editing a kernel, changing an option or upgrading NVRTC makes a new
file, never a stale hit. Files are written to a temporary name and renamed, so two processes
compiling the same module at once cannot leave a torn file.

Compilation needs only NVRTC (the ``nvidia-cuda-nvrtc`` wheel), not a driver or a GPU: CI
compiles every source this way (tests/test_compile_host.py).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

__all__ = ["SOURCES", "PARTIAL_SOURCES", "VAL_KINDS", "IDX_KINDS", "CompileError", "ModuleKey", "source_text", "module_key", "cubin", "cached",
           "compile_cubin", "compile_text", "cache_dir", "nvrtc_version", "nvrtc_missing", "prewarm"]

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
#: the kernel sources (file stems under kernels/), each compiled as one module
SOURCES = ("spmv", "sddmm", "fast", "structured", "mma", "delta", "spmm_sp", "spmm_bm", "spmm_cc")
#: value type name -> VAL_KIND (see kernels/common.cuh)
VAL_KINDS = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3}
#: index type name -> IDX_KIND
IDX_KINDS = {"int32": 0, "int64": 1}
#: sources compiled for some value / index types only (their kernels exist for those): name -> (values, indices).
#: They share everything else with SOURCES (text, options, keys, the memory and disk caches, prewarm, loading by
#: launch.kernel); prewarm and the host compile test cover them for their own types
PARTIAL_SOURCES = {"spmm_wd": (("float16", "bfloat16"), ("int32",)), "spmm_pb": (("float16", "bfloat16"), ("int32",)),
                   "spmm_rs": (("float16", "bfloat16"), ("int32",)),
                   "krylov": (("float32", "float64"), ("int32", "int64"))}
_OPTIONS = ("-std=c++17", "-default-device", "--fmad=true")

_MEMORY: dict["ModuleKey", bytes] = {}
_LOCK = threading.Lock()
#: counts, for tests and the benchmark: NVRTC compilations, disk hits, memory hits
STATS = {"compiled": 0, "disk": 0, "memory": 0}


class CompileError(RuntimeError):
    """NVRTC rejected a kernel source; the message carries its log."""


@dataclass(frozen=True)
class ModuleKey:
    source_hash: str
    value: str
    index: str
    arch: str

    @property
    def filename(self) -> str:
        return f"{self.source_hash[:24]}-{self.value}-{self.index}-{self.arch}.cubin"


def nvrtc_missing() -> str | None:
    """Why NVRTC cannot be used here (None when it can)."""
    try:
        from cuda.bindings import nvrtc  # noqa: PLC0415
    except Exception as exc:  # noqa: BLE001 - reported as a reason, never raised
        return f"cuda.bindings is not importable ({type(exc).__name__}: {exc}): pip install cuda-bindings nvidia-cuda-nvrtc"
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # noqa: BLE001 - the library itself did not load
        return f"libnvrtc did not load ({type(exc).__name__}: {exc}): pip install nvidia-cuda-nvrtc"
    if int(err) != 0:
        return f"nvrtcVersion failed ({err})"
    return None


def nvrtc_version() -> tuple[int, int]:
    from cuda.bindings import nvrtc  # noqa: PLC0415

    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return int(major), int(minor)


def source_text(name: str) -> str:
    """The full text NVRTC compiles for source ``name``: the prelude, then the kernels."""
    if name not in SOURCES and name not in PARTIAL_SOURCES:
        raise KeyError(f"unknown kernel source {name!r}; known: {SOURCES + tuple(PARTIAL_SOURCES)}")
    common = (KERNEL_DIR / "common.cuh").read_text()
    body = (KERNEL_DIR / f"{name}.cu").read_text()
    return f"{common}\n#line 1 \"{name}.cu\"\n{body}"


def _options(value: str, index: str, arch: str) -> list[str]:
    return [*_OPTIONS, f"--gpu-architecture={arch}", f"-DVAL_KIND={VAL_KINDS[value]}", f"-DIDX_KIND={IDX_KINDS[index]}"]


def module_key(name: str, value: str, index: str, arch: str) -> ModuleKey:
    if value not in VAL_KINDS or index not in IDX_KINDS:
        raise KeyError(f"no kernels for value type {value!r} / index type {index!r}; have {tuple(VAL_KINDS)} x {tuple(IDX_KINDS)}")
    h = hashlib.sha256()
    h.update(source_text(name).encode())
    h.update(repr((_OPTIONS, nvrtc_version())).encode())
    return ModuleKey(h.hexdigest(), value, index, arch)


def cache_dir() -> Path:
    env = os.environ.get("SPARSETORCH_CUDA_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sparsetorch" / "cuda_kernels"


def _check(err, what: str) -> None:
    if int(err) != 0:
        raise CompileError(f"{what} failed: {err}")


def compile_text(text: str, filename: str, value: str, index: str, arch: str, what: str | None = None) -> bytes:
    """Compile CUDA C++ ``text`` (named ``filename`` in NVRTC's messages) with NVRTC for this
    value type, index type and architecture (no cache) and return the cubin. Needs NVRTC only
    (no driver, no GPU). ``what`` names the source in the error (default ``filename``)."""
    from cuda.bindings import nvrtc  # noqa: PLC0415

    err, prog = nvrtc.nvrtcCreateProgram(text.encode(), filename.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in _options(value, index, arch)]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if int(err) != 0:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise CompileError(f"NVRTC could not compile {what or filename} for {value}/{index}/{arch}: {err}\n"
                               f"{log.decode(errors='replace').rstrip(chr(0))}")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        buf = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, buf)
        _check(err, "nvrtcGetCUBIN")
        return bytes(buf)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_cubin(name: str, value: str, index: str, arch: str) -> bytes:
    """Compile source ``name`` with NVRTC (no cache) and return the cubin."""
    return compile_text(source_text(name), f"{name}.cu", value, index, arch)


def cubin(name: str, value: str, index: str, arch: str) -> bytes:
    """The cubin of (source, value type, index type, arch): memory, else disk, else NVRTC."""
    key = module_key(name, value, index, arch)
    return cached(key, key.filename, lambda: compile_cubin(name, value, index, arch))


def cached(key: Any, filename: str, build: Callable[[], bytes]) -> bytes:
    """A module's cubin from the memory cache (``key``), else the disk cache (``filename`` under
    :func:`cache_dir`), else ``build()`` (NVRTC), stored in both: the one cache every module of this
    plugin goes through (named sources, generated ones, standalone kernels)."""
    got = _MEMORY.get(key)
    if got is not None:
        STATS["memory"] += 1
        return got
    with _LOCK:
        got = _MEMORY.get(key)
        if got is not None:
            STATS["memory"] += 1
            return got
        path = cache_dir() / filename
        try:
            got = path.read_bytes()
            STATS["disk"] += 1
        except OSError:
            got = None
        if not got:
            got = build()
            STATS["compiled"] += 1
            _store(path, got)
        _MEMORY[key] = got
        return got


def _store(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically; a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".cubin")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass


def clear_memory() -> None:
    """Forget the in-memory modules (tests of the disk cache)."""
    with _LOCK:
        _MEMORY.clear()


def prewarm(arch: str, sources=None, values=None, indices=None, workers: int | None = None) -> int:
    """Compile every (source, value type, index type) module for ``arch`` into the disk cache, in
    parallel processes (NVRTC only: no GPU needed), so that later processes load them from disk.
    Returns the number of modules. Used by the device scripts before their tests and benchmarks;
    also what a deployment can run once after installing."""
    import concurrent.futures as cf  # noqa: PLC0415

    def types(s: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return PARTIAL_SOURCES.get(s, (tuple(VAL_KINDS), tuple(IDX_KINDS)))

    jobs = [(s, v, i) for s in (sources or SOURCES) for v in (values or types(s)[0]) for i in (indices or types(s)[1])]
    for s, v, i in jobs:
        if (s not in SOURCES and s not in PARTIAL_SOURCES) or v not in types(s)[0] or i not in types(s)[1]:
            raise ValueError(f"prewarm: unknown module ({s}, {v}, {i}); sources {SOURCES} (every value {tuple(VAL_KINDS)} "
                             f"and index {tuple(IDX_KINDS)}), and {PARTIAL_SOURCES} (their own types)")
    if not jobs:
        return 0
    with cf.ProcessPoolExecutor(max(1, min(workers or (os.cpu_count() or 1), len(jobs)))) as ex:
        list(ex.map(cubin, *zip(*[(s, v, i, arch) for s, v, i in jobs])))
    return len(jobs)


def main(argv: list[str] | None = None) -> int:
    """``python -m sparsetorch_cuda.compile [--arch sm_90] [--sources fast,spmv] [--values ...] [--indices ...]``:
    :func:`prewarm` (the architecture of GPU 0 when ``--arch`` is not given)."""
    import argparse  # noqa: PLC0415
    import time  # noqa: PLC0415

    ap = argparse.ArgumentParser(description="compile the cuda plugin's kernel modules into the disk cache")
    ap.add_argument("--arch", default=None, help="e.g. sm_90 (default: GPU 0's)")
    ap.add_argument("--sources", default="all", help=f"comma-separated subset of {','.join(SOURCES + tuple(PARTIAL_SOURCES))}, or all "
                                                        f"(all: {','.join(SOURCES)})")
    ap.add_argument("--values", default="all", help=f"comma-separated subset of {','.join(VAL_KINDS)}, or all")
    ap.add_argument("--indices", default="all", help=f"comma-separated subset of {','.join(IDX_KINDS)}, or all")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args(argv)
    arch = args.arch
    if arch is None:
        from .launch import arch_of  # noqa: PLC0415 - needs torch and a GPU

        arch = arch_of(0)

    def pick(text: str) -> list[str] | None:
        return None if text == "all" else [t for t in text.split(",") if t]

    t0 = time.time()
    count = prewarm(arch, pick(args.sources), pick(args.values), pick(args.indices), args.workers)
    print(f"compiled {count} modules for {arch} in {time.time() - t0:.1f} s (cache {cache_dir()})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Kernels generated from the format DSL: ``Y = A X`` for any valid 2-D level composition.

:func:`emit` walks a :class:`~sparsetorch.format.TensorFormat`'s levels and writes CUDA C++ that
visits every stored entry of ``A`` the way the storage engine (``sparsetorch.tensor._levels``)
lays it out: a DENSE / BATCH / RANGE level is a loop over its extent (position ``p * size +
key - low``), COMPRESSED the segment ``[pos[p], pos[p+1])``, LOOSE_COMPRESSED ``[pos[2p],
pos[2p+1])``, SINGLETON one coordinate per parent, DELTA(b) a segment of gaps decoded by a
running sum (``col += gap + 1``), STRUCTURED(n) ``n`` slots per strip; block (``i // c``,
``i % c``) and diagonal (``j - i`` with a RANGE level) expressions are recovered at the leaf
(:attr:`TensorFormat.recovery`) and entries outside the shape (padding of diagonals, edge blocks,
N:M strips) are skipped. The entries visited are exactly those ``A.coordinates()`` returns.

How the work is split (:func:`analyse`):

- **rows** (no atomics): when the row ``i`` can be *located* from a thread's row index -- every
  level the row is recovered from is dense-like (DENSE / RANGE on ``i``, ``i // c``, ``i % c``,
  or a RANGE on ``j`` whose key follows from a diagonal level and the row) -- one thread per
  (row, column of X) walks the other levels and accumulates in a register (CSR-like, ELL, DELTA,
  N:M, BSR, DIA, DIA_J, DENSE_COL ...). Variant ``warp``: a warp per row, the lanes split the
  first level that is walked (a warp prefix sum decodes DELTA gaps), then a warp reduction with
  the semiring's add.
- **cols** (atomics): the same with the column located (CSC, BSC): a thread per column, each
  product combined into its output row atomically.
- **scatter**: otherwise (COO, DCSC, DCSR, ...), a thread per position of the first level;
  atomics unless the first level is a unique compressed row level (DCSR), whose positions own
  distinct rows.

Semirings: ``"plus_times"`` (default), ``"min_plus"``, ``"max_times"``, ``"or_and"`` or a dict
``{"add": ..., "mul": ..., "identity": ...}`` of CUDA source (an expression in ``a`` and ``b``,
or a full ``__device__`` definition of ``acc_t add(acc_t a, acc_t b)`` / ``mul``; ``identity``
an expression). ``prolog`` (each value of A), ``prolog_x`` (each element of X) and ``epilog``
(each output) are an expression in ``x`` or a full definition of ``acc_t prolog(acc_t)`` /
``prolog_x`` / ``epilog``. ``acc_t`` (alias ``CTP``, nvmath-python's spelling) is float32 for
float16 / bfloat16 / float32 values and float64 for float64.

Modules are compiled by NVRTC through :mod:`.compile`'s cache (memory and disk, keyed by the
generated text's hash, value type, index type and architecture).
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from sparsetorch import InputError
from sparsetorch.format import Add, Dimension, FloorDiv, LevelFormat, Mod, Sub, TensorFormat

from . import compile as _compile

__all__ = ["Analysis", "analyse", "emit", "Semiring", "as_semiring", "SEMIRINGS", "GeneratedSpmm", "generated_spmm",
           "compile_source", "VARIANTS", "BLOCK"]

BLOCK = 256
_GRID_Y = 65535
#: kernel variants per strategy
VARIANTS = {"rows": ("thread", "warp"), "cols": ("thread",), "scatter": ("thread",)}
#: mean stored entries per row from which the row strategy's default is a warp per row
WARP_FROM = 12


# Semirings and elementwise functions -----------------------------------------------------------

@dataclass(frozen=True)
class Semiring:
    """``add``/``mul``: CUDA definitions of ``acc_t add(acc_t, acc_t)`` / ``mul``; ``identity``: an
    expression (the add's neutral element); ``atomic``: "add" (atomicAdd) or "cas" (a compare and
    swap loop with ``add``)."""

    name: str
    add: str
    mul: str
    identity: str
    atomic: str = "cas"


def _binary(name: str, src: str) -> str:
    if "{" in src:
        return src
    return f"__device__ __forceinline__ acc_t {name}(acc_t a, acc_t b) {{ return ({src}); }}"


def _unary(name: str, src: str | None) -> str:
    if src is None:
        return f"__device__ __forceinline__ acc_t {name}(acc_t x) {{ return x; }}"
    if "{" in src:
        return src
    return f"__device__ __forceinline__ acc_t {name}(acc_t x) {{ return ({src}); }}"


SEMIRINGS = {
    "plus_times": Semiring("plus_times", _binary("add", "a + b"), _binary("mul", "a * b"), "(acc_t)0", "add"),
    "min_plus": Semiring("min_plus", _binary("add", "b < a ? b : a"), _binary("mul", "a + b"), "ACC_INF"),
    "max_times": Semiring("max_times", _binary("add", "b > a ? b : a"), _binary("mul", "a * b"), "-ACC_INF"),
    "or_and": Semiring("or_and", _binary("add", "(a != (acc_t)0 || b != (acc_t)0) ? (acc_t)1 : (acc_t)0"),
                       _binary("mul", "(a != (acc_t)0 && b != (acc_t)0) ? (acc_t)1 : (acc_t)0"), "(acc_t)0"),
}
_ALIASES = {"plus-times": "plus_times", "min-plus": "min_plus", "max-times": "max_times", "or-and": "or_and",
            "boolean": "or_and", "tropical": "min_plus"}


def as_semiring(spec: str | Mapping[str, str] | Semiring | None) -> Semiring:
    """The :class:`Semiring` of a name, a dict ``{"add", "mul", "identity"[, "atomic"]}`` or itself."""
    if spec is None:
        return SEMIRINGS["plus_times"]
    if isinstance(spec, Semiring):
        return spec
    if isinstance(spec, str):
        key = _ALIASES.get(spec, spec)
        if key not in SEMIRINGS:
            raise InputError(f"unknown semiring {spec!r}; known: {sorted(SEMIRINGS)}, or a dict of CUDA source "
                             f"{{'add': 'a + b', 'mul': 'a * b', 'identity': '0'}}")
        return SEMIRINGS[key]
    if isinstance(spec, Mapping):
        missing = [k for k in ("add", "mul", "identity") if not isinstance(spec.get(k), str)]
        if missing:
            raise InputError(f"a user semiring needs CUDA source strings for 'add', 'mul' and 'identity'; missing {missing}")
        atomic = spec.get("atomic", "cas")
        if atomic not in ("add", "cas"):
            raise InputError(f"semiring 'atomic' must be 'add' (atomicAdd is its add) or 'cas', got {atomic!r}")
        h = hashlib.sha256(repr(sorted(spec.items())).encode()).hexdigest()[:8]
        return Semiring(f"user_{h}", _binary("add", spec["add"]), _binary("mul", spec["mul"]), f"({spec['identity']})",
                        atomic)
    raise InputError(f"semiring must be a name, a dict of CUDA source or a Semiring, got {type(spec).__name__}")


# Analysis of a format -------------------------------------------------------------------------

@dataclass
class Analysis:
    """How the generated kernel walks a format: ``strategy`` ("rows", "cols", "scatter"), the
    levels whose key is computed rather than walked (``located``: level -> C expression), and
    whether scatter writes are exclusive (no atomics)."""

    fmt: TensorFormat
    strategy: str
    located: dict[int, str] = field(default_factory=dict)
    exclusive: bool = False

    @property
    def atomics(self) -> bool:
        return self.strategy == "cols" or (self.strategy == "scatter" and not self.exclusive)


def _dense_like(lv) -> bool:
    return lv.format in (LevelFormat.DENSE, LevelFormat.BATCH, LevelFormat.RANGE)


def _locate(fmt: TensorFormat, pin: Dimension) -> dict[int, str] | None:
    """Levels whose key follows from ``r`` (the pinned dimension's value), or None when the pinned
    dimension cannot be recovered from located levels alone."""
    located: dict[int, str] = {}
    for k, lv in enumerate(fmt.levels):
        if not _dense_like(lv):
            continue
        e = lv.expr
        if isinstance(e, Dimension) and e == pin:
            located[k] = "r"
        elif isinstance(e, FloorDiv) and e.dim == pin:
            located[k] = f"(r / {e.c})"
        elif isinstance(e, Mod) and e.dim == pin:
            located[k] = f"(r % {e.c})"
        elif isinstance(e, Dimension) and lv.format is LevelFormat.RANGE:
            # a RANGE on the other dimension: its key follows from the diagonal level and r
            for d, dl in enumerate(fmt.levels[:k]):
                de = dl.expr
                if not isinstance(de, (Add, Sub)) or {de.a.name, de.b.name} != {pin.name, e.name}:
                    continue
                if isinstance(de, Sub):
                    located[k] = f"(l{d} + r)" if de.a == e else f"(r - l{d})"
                else:
                    located[k] = f"(l{d} - r)"
                break
    idx = [d.name for d in fmt.dims].index(pin.name)
    rec = fmt.recovery[idx]
    if rec.kind == "plain":
        ok = rec.a in located
    elif rec.kind == "block":
        ok = rec.a in located and rec.b in located
    else:  # recovered from a diagonal and its range level: pinned when the range level is located
        ok = rec.b in located
    return located if ok else None


def analyse(fmt: TensorFormat) -> Analysis:
    """The strategy of the generated kernel for ``fmt`` (a 2-D format without BATCH levels)."""
    if not isinstance(fmt, TensorFormat):
        raise InputError(f"codegen needs a TensorFormat, got {type(fmt).__name__}")
    if fmt.ndim != 2 or fmt.num_batch_levels:
        raise InputError(f"codegen generates matrix products: needs 2 dimensions and no BATCH level, got {fmt}")
    i, j = fmt.dims
    loc = _locate(fmt, i)
    if loc is not None:
        return Analysis(fmt, "rows", loc)
    loc = _locate(fmt, j)
    if loc is not None:
        return Analysis(fmt, "cols", loc)
    l0 = fmt.levels[0]
    rec_i = fmt.recovery[0]
    exclusive = (l0.format in (LevelFormat.COMPRESSED, LevelFormat.LOOSE_COMPRESSED) and l0.type.unique
                 and isinstance(l0.expr, Dimension) and l0.expr == i and rec_i.kind == "plain" and rec_i.a == 0)
    return Analysis(fmt, "scatter", {}, exclusive)


# Emission ---------------------------------------------------------------------------------------

_PRELUDE = r"""
#if VAL_KIND == 3
#define ACC_INF __longlong_as_double(0x7ff0000000000000LL)
#else
#define ACC_INF __int_as_float(0x7f800000)
#endif
typedef acc_t CTP;
"""

_ATOMIC = r"""
__device__ __forceinline__ void atomic_combine(acc_t* p, acc_t v) {
#if SR_ATOMIC_ADD
  atomicAdd(p, v);
#elif VAL_KIND == 3
  unsigned long long* a = (unsigned long long*)p;
  unsigned long long old = *a, assumed;
  do {
    assumed = old;
    unsigned long long nv = (unsigned long long)__double_as_longlong(add(__longlong_as_double((long long)assumed), v));
    if (nv == assumed) break;
    old = atomicCAS(a, assumed, nv);
  } while (assumed != old);
#else
  unsigned* a = (unsigned*)p;
  unsigned old = *a, assumed;
  do {
    assumed = old;
    unsigned nv = __float_as_uint(add(__uint_as_float(assumed), v));
    if (nv == assumed) break;
    old = atomicCAS(a, assumed, nv);
  } while (assumed != old);
#endif
}
"""


def _params(nlev: int) -> str:
    ps = ["i64 m", "i64 n", "i64 k", "i64 nunits", "i64 u0"]
    ps += [f"i64 lo{q}, i64 sz{q}" for q in range(nlev)]
    ps += [f"const idx_t* __restrict__ pos{q}, const idx_t* __restrict__ crd{q}" for q in range(nlev)]
    ps += ["const val_t* __restrict__ val", "const val_t* __restrict__ x", "void* __restrict__ out"]
    return ", ".join(ps)


def nargs(fmt: TensorFormat) -> int:
    return 5 + 4 * fmt.num_levels + 3


def _recover(fmt: TensorFormat) -> list[str]:
    out = []
    for name, rec in zip(("gi", "gj"), fmt.recovery):
        a, b = f"l{rec.a}", f"l{rec.b}"
        expr = {"plain": a, "block": f"{a} * {rec.c} + {b}", "sub_left": f"{a} + {b}", "sub_right": f"{b} - {a}",
                "add": f"{a} - {b}"}[rec.kind]
        out.append(f"i64 {name} = {expr};")
    return out


class _Emitter:
    def __init__(self, an: Analysis, variant: str) -> None:
        self.an = an
        self.fmt = an.fmt
        self.variant = variant
        self.split = None  # the level whose loop the lanes of a warp split
        if variant == "warp":
            self.split = next((q for q in range(self.fmt.num_levels) if q not in an.located), None)
        self.lines: list[str] = []
        self.depth = 1

    def w(self, s: str) -> None:
        self.lines.append("  " * self.depth + s)

    def open(self, s: str) -> None:
        self.w(s + " {")
        self.depth += 1

    def close(self, n: int = 1) -> None:
        for _ in range(n):
            self.depth -= 1
            self.w("}")

    def leaf(self, last: int) -> None:
        for s in _recover(self.fmt):
            self.w(s)
        st = self.an.strategy
        if st == "rows":
            self.open("if (gj >= 0 && gj < n)")
        elif st == "cols":
            self.open("if (gi >= 0 && gi < m)")
        else:
            self.open("if (gi >= 0 && gi < m && gj >= 0 && gj < n)")
        self.w(f"acc_t t = mul(prolog(ld(RO(val + p{last}))), prolog_x(ld(RO(x + gj * k + c))));")
        if st == "rows" or self.an.exclusive:
            self.w("s = add(s, t);")
        else:
            self.w("atomic_combine(acc + gi * k + c, t);")
        self.close()

    def level(self, q: int) -> int:
        """Open level ``q``'s loop (or computed key); returns how many blocks to close."""
        lv = self.fmt.levels[q]
        f = lv.format
        par = f"p{q - 1}" if q else "(i64)0"
        lanes = q == self.split
        start, step = ("lane", "32") if lanes else ("0", "1")
        if q in self.an.located:
            self.w(f"i64 l{q} = {self.an.located[q]};")
            self.open(f"if (l{q} >= lo{q} && l{q} < lo{q} + sz{q})")
            self.w(f"i64 p{q} = {par} * sz{q} + (l{q} - lo{q});")
            return 1
        if q == 0 and self.an.strategy == "scatter":  # the unit is a position of level 0
            if _dense_like(lv):
                self.w("i64 l0 = lo0 + u; i64 p0 = u;")
            elif f in (LevelFormat.COMPRESSED, LevelFormat.LOOSE_COMPRESSED):
                self.w("i64 p0 = u0 + u; i64 l0 = (i64)RO(crd0 + p0);")
            else:
                raise InputError(f"codegen: a {f.name} first level cannot be split into units ({self.fmt})")
            return 0
        if _dense_like(lv):
            self.open(f"for (i64 t{q} = {start}; t{q} < sz{q}; t{q} += {step})")
            self.w(f"i64 l{q} = lo{q} + t{q}; i64 p{q} = {par} * sz{q} + t{q};")
            return 1
        if f is LevelFormat.SINGLETON:
            self.w(f"i64 p{q} = {par}; i64 l{q} = (i64)RO(crd{q} + p{q});")
            return 0
        if f is LevelFormat.STRUCTURED:
            n_ = lv.type.parameter
            self.open(f"for (int t{q} = {start}; t{q} < {n_}; t{q} += {step})")
            self.w(f"i64 p{q} = {par} * {n_} + t{q}; i64 l{q} = (i64)RO(crd{q} + p{q});")
            return 1
        if f is LevelFormat.LOOSE_COMPRESSED:
            self.w(f"i64 b{q} = (i64)RO(pos{q} + 2 * {par}), e{q} = (i64)RO(pos{q} + 2 * {par} + 1);")
        else:
            self.w(f"i64 b{q} = (i64)RO(pos{q} + {par}), e{q} = (i64)RO(pos{q} + {par} + 1);")
        if f is LevelFormat.DELTA:
            if lanes:  # chunks of 32 gaps: a warp inclusive scan of gap + 1 gives each lane its column
                self.w(f"i64 run{q} = -1;")
                self.open(f"for (i64 base{q} = b{q}; base{q} < e{q}; base{q} += 32)")
                self.w(f"i64 p{q} = base{q} + lane;")
                self.w(f"i64 g{q} = p{q} < e{q} ? (i64)RO(crd{q} + p{q}) + 1 : 0;")
                self.open("for (int o = 1; o < 32; o <<= 1)")
                self.w(f"i64 v = __shfl_up_sync(0xffffffffu, g{q}, o);")
                self.w(f"if (lane >= o) g{q} += v;")
                self.close()
                self.w(f"i64 l{q} = run{q} + g{q};")
                self.w(f"run{q} += __shfl_sync(0xffffffffu, g{q}, 31);")
                self.open(f"if (p{q} < e{q})")
                return 2
            self.w(f"i64 l{q} = -1;")
            self.open(f"for (i64 p{q} = b{q}; p{q} < e{q}; ++p{q})")
            self.w(f"l{q} += (i64)RO(crd{q} + p{q}) + 1;")
            return 1
        self.open(f"for (i64 p{q} = b{q} + {start}; p{q} < e{q}; p{q} += {step})")
        self.w(f"i64 l{q} = (i64)RO(crd{q} + p{q});")
        return 1

    def walk(self) -> None:
        opened = 0
        for q in range(self.fmt.num_levels):
            opened += self.level(q)
        self.leaf(self.fmt.num_levels - 1)
        self.close(opened)


def _kernel(an: Analysis, variant: str) -> str:
    fmt = an.fmt
    em = _Emitter(an, variant)
    name = f"gen_{an.strategy}" + ("_warp" if variant == "warp" else "")
    head = f'extern "C" __global__ void {name}({_params(fmt.num_levels)}) {{'
    pre: list[str] = []
    if an.strategy == "rows" and variant == "warp":
        pre += ["i64 r = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;", "int lane = threadIdx.x & 31;",
                "if (r >= m) return;  // whole warps leave together", "val_t* y = (val_t*)out;"]
    elif an.strategy == "rows":
        pre += ["i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;", "if (r >= m) return;", "val_t* y = (val_t*)out;"]
    elif an.strategy == "cols":
        pre += ["i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;", "if (r >= n) return;", "acc_t* acc = (acc_t*)out;"]
    else:
        pre += ["i64 u = (i64)blockIdx.x * blockDim.x + threadIdx.x;", "if (u >= nunits) return;"]
        pre += ["val_t* y = (val_t*)out;"] if an.exclusive else ["acc_t* acc = (acc_t*)out;"]
    em.lines = ["  " + s for s in pre]
    em.open("for (i64 c = blockIdx.y; c < k; c += gridDim.y)")
    owned = an.strategy == "rows" or an.exclusive
    if owned:
        em.w("acc_t s = identity();")
    em.walk()
    if an.strategy == "rows" and variant == "warp":
        em.open("for (int o = 16; o > 0; o >>= 1)")
        em.w("s = add(s, __shfl_down_sync(0xffffffffu, s, o));")
        em.close()
        em.w("if (lane == 0) y[r * k + c] = st(epilog(s));")
    elif an.strategy == "rows":
        em.w("y[r * k + c] = st(epilog(s));")
    elif an.exclusive:
        em.w("y[l0 * k + c] = st(epilog(s));")
    em.close()
    return "\n".join([head, *em.lines, "}"])


_SUPPORT = r"""
extern "C" __global__ void gen_fill_acc(i64 total, acc_t* __restrict__ acc) {
  i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (t < total) acc[t] = identity();
}
extern "C" __global__ void gen_fill_y(i64 total, val_t* __restrict__ y) {
  i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (t < total) y[t] = st(epilog(identity()));
}
extern "C" __global__ void gen_finalize(i64 total, const acc_t* __restrict__ acc, val_t* __restrict__ y) {
  i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (t < total) y[t] = st(epilog(acc[t]));
}
"""


def variants(an: Analysis) -> tuple[str, ...]:
    return VARIANTS[an.strategy]


def emit(fmt: TensorFormat, *, semiring: str | Mapping[str, str] | Semiring | None = None, prolog: str | None = None,
         prolog_x: str | None = None, epilog: str | None = None) -> str:
    """The CUDA source (without kernels/common.cuh, which :func:`full_source` puts first) of the
    generated SpMM kernels for ``fmt``: one per variant of its strategy, and the fill / finalize
    kernels."""
    an = analyse(fmt)
    sr = as_semiring(semiring)
    parts = [f"// generated by sparsetorch_cuda.codegen for {fmt} (strategy {an.strategy}, semiring {sr.name})",
             _PRELUDE, f"#define SR_ATOMIC_ADD {1 if sr.atomic == 'add' else 0}", sr.add, sr.mul,
             f"__device__ __forceinline__ acc_t identity() {{ return {sr.identity}; }}",
             _unary("prolog", prolog), _unary("prolog_x", prolog_x), _unary("epilog", epilog), _ATOMIC, _SUPPORT]
    parts += [_kernel(an, v) for v in variants(an)]
    return "\n".join(parts) + "\n"


def full_source(body: str) -> str:
    common = (_compile.KERNEL_DIR / "common.cuh").read_text()
    return f"{common}\n#line 1 \"generated.cu\"\n{body}"


# Compilation, through compile.py's cache ------------------------------------------------------

def module_key(text: str, value: str, index: str, arch: str) -> _compile.ModuleKey:
    h = hashlib.sha256()
    h.update(text.encode())
    h.update(repr((_compile._OPTIONS, _compile.nvrtc_version(), "generated")).encode())
    return _compile.ModuleKey(h.hexdigest(), value, index, arch)


def compile_source(text: str, value: str, index: str, arch: str) -> bytes:
    """Compile a full generated source with NVRTC (no cache) and return the cubin."""
    return _compile.compile_text(text, "generated.cu", value, index, arch, what="a generated kernel")


def cubin(text: str, value: str, index: str, arch: str) -> bytes:
    """The cubin of a generated source: compile.py's memory cache, else its disk cache, else NVRTC."""
    key = module_key(text, value, index, arch)
    return _compile.cached(key, key.filename, lambda: compile_source(text, value, index, arch))


_LIBS: dict[_compile.ModuleKey, Any] = {}
_LIB_LOCK = threading.Lock()


def _kernels(text: str, value: str, index: str, arch: str, names: tuple[str, ...], nargs_main: int) -> dict[str, Any]:
    from . import launch  # noqa: PLC0415

    key = module_key(text, value, index, arch)
    with _LIB_LOCK:
        lib = _LIBS.get(key)
        if lib is None:
            cu = launch._driver()
            err, lib = cu.cuLibraryLoadData(cubin(text, value, index, arch), [], [], 0, [], [], 0)
            launch._ok(cu, err, "cuLibraryLoadData(generated)")
            _LIBS[key] = lib
    out = {}
    for name in names:
        out[name] = _GenKernel(lib, name, nargs_main if name.startswith(("gen_rows", "gen_cols", "gen_scatter")) else
                               (3 if name == "gen_finalize" else 2))
    return out


def _gen_kernel_class():
    from .launch import Kernel  # noqa: PLC0415

    class GenKernel(Kernel):
        """A kernel of a generated module (launch.Kernel, loaded from a library handle)."""

        def __init__(self, lib: Any, name: str, nargs: int) -> None:  # noqa: D107 - see the class
            self._bind(lib, name, nargs)

    return GenKernel


def _GenKernel(lib: Any, name: str, n: int) -> Any:
    global _GEN_CLS
    if _GEN_CLS is None:
        _GEN_CLS = _gen_kernel_class()
    return _GEN_CLS(lib, name, n)


_GEN_CLS: Any = None


# The plan ---------------------------------------------------------------------------------------

_VAL = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64"}
_IDX = {torch.int32: "int32", torch.int64: "int64"}


class GeneratedSpmm:
    """``Y = A X`` on ``A``'s pattern with a kernel generated from its format (pattern work once).

    ``semiring``, ``prolog``, ``prolog_x``, ``epilog``: see the module docstring. ``variant``:
    "thread" or "warp" (row strategy only; None: by the mean row length, or timed with
    ``autotune=True``: each variant run on the first call for each number of columns of X,
    timed with CUDA events, the fastest remembered in :attr:`choice`). Values are read where
    they lie (``set_values`` for a new value set on the same pattern). Launches go on torch's
    current stream; a plan with ``autotune`` synchronizes on its first call per column count,
    so run that call outside a CUDA graph capture."""

    def __init__(self, A: Any, *, semiring: str | Mapping[str, str] | Semiring | None = None, prolog: str | None = None,
                 prolog_x: str | None = None, epilog: str | None = None, autotune: bool = False,
                 variant: str | None = None) -> None:
        fmt = A.format
        self.analysis = analyse(fmt)
        if A.device.type != "cuda":
            raise InputError(f"generated kernels run on CUDA tensors; A is on {A.device}")
        if A.dtype not in _VAL:
            raise InputError(f"generated kernels take float16, bfloat16, float32, float64; A is {A.dtype}")
        A.ensure_valid()
        self.shape = (int(A.format_shape[0]), int(A.format_shape[1]))
        self.dtype, self.device = A.dtype, A.device
        self.dev_index = A.device.index if A.device.index is not None else torch.cuda.current_device()
        self.semiring = as_semiring(semiring)
        self.body = emit(fmt, semiring=self.semiring, prolog=prolog, prolog_x=prolog_x, epilog=epilog)
        self.source = full_source(self.body)
        bufs = [b for b in (*A.pos_buffers, *A.crd_buffers) if b is not None]
        idx = bufs[0].dtype if bufs else torch.int32
        if any(b.dtype != idx for b in bufs):
            idx = torch.int64
        self.idx = idx
        self._pos = [b.to(idx).contiguous() if b is not None else None for b in A.pos_buffers]
        self._crd = [b.to(idx).contiguous() if b is not None else None for b in A.crd_buffers]
        self.extents = fmt.level_extents(self.shape)
        m, n = self.shape
        an = self.analysis
        if an.strategy == "rows":
            self.nunits, self.u0 = m, 0
        elif an.strategy == "cols":
            self.nunits, self.u0 = n, 0
        else:
            l0 = fmt.levels[0]
            if _dense_like(l0):
                self.nunits, self.u0 = self.extents[0][1] - self.extents[0][0], 0
            else:
                p = self._pos[0]
                lo, hi = (int(v) for v in p[:2].tolist())
                self.nunits, self.u0 = max(hi - lo, 0), lo
        self.slots = int(A.values.shape[-1])
        self.nnz = self.slots
        self.names = tuple(_kernel_name(an, v) for v in variants(an)) + ("gen_fill_acc", "gen_fill_y", "gen_finalize")
        self._k = _kernels(self.source, _VAL[self.dtype], _IDX[idx], _arch(self.dev_index), self.names, nargs(fmt))
        self.autotune = autotune
        if variant is not None and variant not in variants(an):
            raise InputError(f"generated kernel for {fmt} ({an.strategy}) has variants {variants(an)}, not {variant!r}")
        self.variant = variant
        #: the variant chosen per number of columns of X (autotune)
        self.choice: dict[int, str] = {}
        #: timings of the autotune runs, seconds per variant, per number of columns
        self.timings: dict[int, dict[str, float]] = {}
        self._values = A.values.detach()
        self._static = self._static_args()

    def _static_args(self) -> list[int]:
        lv: list[int] = []
        for lo, hi in self.extents:
            lv += [lo & 0xFFFFFFFFFFFFFFFF, hi - lo]
        ptrs: list[int] = []
        for p, c in zip(self._pos, self._crd):
            ptrs += [p.data_ptr() if p is not None else 0, c.data_ptr() if c is not None else 0]
        return lv + ptrs

    def set_values(self, values: torch.Tensor) -> None:
        if values.shape[-1] != self.slots or values.dtype != self.dtype or values.device != self.device:
            raise InputError(f"generated: values of shape {tuple(values.shape)}, {values.dtype}; this plan takes "
                             f"(*batch, {self.slots}) {self.dtype} on {self.device}")
        self._values = values.detach()

    def default_variant(self) -> str:
        """"warp" for rows of WARP_FROM or more slots on average whose first walked level is the
        last one (the values of a row contiguous: CSR-like, DELTA); else "thread" (DIA_J, BSR and
        the stencil's short rows measured faster so: benchmarks/results/cuda_codegen_h200_s6*.json)."""
        an = self.analysis
        if an.strategy != "rows":
            return "thread"
        first = next((q for q in range(an.fmt.num_levels) if q not in an.located), None)
        m = max(self.shape[0], 1)
        return "warp" if first == an.fmt.num_levels - 1 and self.nnz / m >= WARP_FROM else "thread"

    def run(self, v: torch.Tensor, x: torch.Tensor, y: torch.Tensor, k: int, variant: str | None = None) -> None:
        """One product into ``y`` (m, k) from values ``v`` (slots,) and ``x`` (n, k), contiguous."""
        m, n = self.shape
        an = self.analysis
        variant = variant or self.variant or self.choice.get(k) or self.default_variant()
        gy = min(k, _GRID_Y)
        dev = self.dev_index
        name = _kernel_name(an, variant)
        head = [m, n, k, self.nunits, self.u0 & 0xFFFFFFFFFFFFFFFF]
        total = m * k
        fill = -(-total // BLOCK)
        if an.strategy == "rows":
            threads = m * (32 if variant == "warp" else 1)
            self._k[name]((-(-threads // BLOCK), gy), BLOCK, (*head, *self._static, v.data_ptr(), x.data_ptr(), y.data_ptr()),
                          device=dev)
            return
        if an.exclusive:
            self._k["gen_fill_y"]((fill, 1), BLOCK, (total, y.data_ptr()), device=dev)
            self._k[name]((-(-self.nunits // BLOCK), gy), BLOCK, (*head, *self._static, v.data_ptr(), x.data_ptr(),
                                                                 y.data_ptr()), device=dev)
            return
        acc_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        acc = y if acc_dtype == self.dtype else torch.empty((m, k), dtype=acc_dtype, device=self.device)
        self._k["gen_fill_acc"]((fill, 1), BLOCK, (total, acc.data_ptr()), device=dev)
        self._k[name]((-(-self.nunits // BLOCK), gy), BLOCK, (*head, *self._static, v.data_ptr(), x.data_ptr(), acc.data_ptr()),
                      device=dev)
        self._k["gen_finalize"]((fill, 1), BLOCK, (total, acc.data_ptr(), y.data_ptr()), device=dev)

    def _tune(self, v: torch.Tensor, x: torch.Tensor, y: torch.Tensor, k: int) -> None:
        cands = variants(self.analysis)
        times: dict[str, float] = {}
        for cand in cands:
            self.run(v, x, y, k, cand)  # warm-up
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            reps = 5
            start.record()
            for _ in range(reps):
                self.run(v, x, y, k, cand)
            end.record()
            end.synchronize()
            times[cand] = start.elapsed_time(end) / 1e3 / reps
        best = min(times, key=times.__getitem__)
        self.timings[k] = times
        self.choice[k] = best
        self.run(v, x, y, k, best)

    def product(self, v: torch.Tensor, x: torch.Tensor, y: torch.Tensor, k: int) -> None:
        """:meth:`run` with the remembered (or, with ``autotune``, the newly timed) variant."""
        if self.autotune and self.variant is None and k not in self.choice and len(variants(self.analysis)) > 1:
            self._tune(v, x, y, k)
        else:
            self.run(v, x, y, k)

    def apply(self, X: torch.Tensor) -> torch.Tensor:
        """``A X`` (semiring, prolog and epilog applied) for ``X`` of shape ``(n, k)`` or ``(n,)``;
        values with a batch dimension give ``(*batch, m, k)``."""
        m, n = self.shape
        vec = X.dim() == 1
        Xm = X.unsqueeze(-1) if vec else X
        if Xm.dim() != 2 or Xm.shape[0] != n or Xm.dtype != self.dtype or Xm.device != self.device:
            raise InputError(f"generated: X must be ({n},) or ({n}, k) {self.dtype} on {self.device}; got "
                             f"{tuple(X.shape)} {X.dtype} on {X.device}")
        Xm = Xm.contiguous()
        k = int(Xm.shape[1])
        vals = self._values
        vb = vals.reshape(-1, self.slots)
        Y = torch.empty((vb.shape[0], m, k), dtype=self.dtype, device=self.device)
        for b in range(vb.shape[0]):
            self.product(vb[b].contiguous(), Xm, Y[b], k)
        Y = Y.reshape(*vals.shape[:-1], m, k)
        return Y.squeeze(-1) if vec else Y

    __call__ = apply

    def __repr__(self) -> str:
        return (f"GeneratedSpmm({self.analysis.fmt}, {self.analysis.strategy}, shape={self.shape}, {self.dtype}, "
                f"semiring={self.semiring.name})")


def _kernel_name(an: Analysis, variant: str) -> str:
    return f"gen_{an.strategy}" + ("_warp" if variant == "warp" else "")


def _arch(index: int) -> str:
    from .launch import arch_of  # noqa: PLC0415

    return arch_of(index)


_PLANS: dict[tuple, GeneratedSpmm] = {}


def generated_spmm(A: Any, X: torch.Tensor, *, semiring: str | Mapping[str, str] | Semiring | None = None,
                   prolog: str | None = None, prolog_x: str | None = None, epilog: str | None = None,
                   autotune: bool = False, variant: str | None = None) -> torch.Tensor:
    """``Y = A X`` through a kernel generated from ``A``'s format (see the module docstring).

    The plan is kept per (pattern, options) in a small cache, so a second call on the same
    pattern does no pattern work and, with ``autotune=True``, times nothing again."""
    sr = as_semiring(semiring)
    try:
        pk = A.pattern_key
    except Exception:  # noqa: BLE001 - no key: no cache
        pk = None
    key = (pk, A.dtype, sr, prolog, prolog_x, epilog, autotune, variant) if pk is not None else None
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = GeneratedSpmm(A, semiring=sr, prolog=prolog, prolog_x=prolog_x, epilog=epilog, autotune=autotune,
                             variant=variant)
        if key is not None:
            if len(_PLANS) >= 32:
                _PLANS.clear()
            _PLANS[key] = plan
    plan.set_values(A.values)
    return plan.apply(X)


def timed(fn: Any, reps: int = 20) -> float:
    """Seconds per call of ``fn`` (CUDA events, after one warm-up), for benchmarks."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


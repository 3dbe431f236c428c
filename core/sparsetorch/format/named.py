"""Named formats: the familiar layouts written in the DSL.

Constants for the fixed ones (``CSR``, ``COO``, ...), factories for the parameterised ones
(``BSR(2, 3)``, ``DELTA(4)``, ``NM(2, 4)``, ``batched(CSR)``). Each is an ordinary
:class:`TensorFormat`; the name is a label only.
"""

from __future__ import annotations

from .expr import Dimension
from .level import LevelFormat, LevelProperty
from .tensor_format import TensorFormat

__all__ = [
    "COO", "CSR", "CSC", "DCSR", "DCSC", "DIA", "DIA_J", "ELL", "DENSE", "DENSE_COL",
    "BSR", "BSC", "DELTA", "NM", "COO_ND", "DENSE_ND", "batched", "BATCHED_CSR", "BATCHED_CSC",
    "named_formats",
]

_D, _B, _C, _L, _S, _R = (LevelFormat.DENSE, LevelFormat.BATCH, LevelFormat.COMPRESSED,
                          LevelFormat.LOOSE_COMPRESSED, LevelFormat.SINGLETON, LevelFormat.RANGE)
i, j = Dimension("i"), Dimension("j")

COO = TensorFormat([i, j], {i: (_C, LevelProperty.NONUNIQUE), j: _S}, name="COO")
CSR = TensorFormat([i, j], {i: _D, j: _C}, name="CSR")
CSC = TensorFormat([i, j], {j: _D, i: _C}, name="CSC")
DCSR = TensorFormat([i, j], {i: _C, j: _C}, name="DCSR")
DCSC = TensorFormat([i, j], {j: _C, i: _C}, name="DCSC")
#: Diagonals indexed by row (each stored diagonal holds ``nrows`` slots).
DIA = TensorFormat([i, j], {j - i: _C, i: _R}, name="DIA")
#: Diagonals indexed by column: SciPy's and CuPy's ``dia`` layout (``ncols`` slots per diagonal).
DIA_J = TensorFormat([i, j], {j - i: _C, j: _R}, name="DIA_J")
#: ELLPACK: every row padded to the longest row's length.
ELL = TensorFormat([i, j], {i: _D, j: _L}, name="ELL")
DENSE = TensorFormat([i, j], {i: _D, j: _D}, name="DENSE")
DENSE_COL = TensorFormat([i, j], {j: _D, i: _D}, name="DENSE_COL")


def BSR(bh: int, bw: int) -> TensorFormat:
    """Block sparse rows with dense ``bh x bw`` blocks, row-major inside a block."""
    return TensorFormat([i, j], {i // bh: _D, j // bw: _C, i % bh: _D, j % bw: _D}, name=f"BSR({bh},{bw})")


def BSC(bh: int, bw: int) -> TensorFormat:
    """Block sparse columns with dense ``bh x bw`` blocks, row-major inside a block (torch's BSC)."""
    return TensorFormat([i, j], {j // bw: _D, i // bh: _C, i % bh: _D, j % bw: _D}, name=f"BSC({bh},{bw})")


def DELTA(bits: int) -> TensorFormat:
    """CSR whose column indices are stored as gaps of at most ``bits`` bits (MACKO-style)."""
    return TensorFormat([i, j], {i: _D, j: (LevelFormat.DELTA, bits)}, name=f"DELTA({bits})")


def NM(n: int, m: int) -> TensorFormat:
    """N:M structured sparsity along rows: at most ``n`` nonzeros in every ``m`` consecutive columns."""
    return TensorFormat([i, j], {i: _D, j // m: _D, j % m: (LevelFormat.STRUCTURED, n)}, name=f"NM({n},{m})")


def COO_ND(ndim: int) -> TensorFormat:
    """Coordinate format of any order: first level compressed(nonunique), then singletons."""
    if not isinstance(ndim, int) or isinstance(ndim, bool) or ndim < 1:
        from ..errors import FormatError  # noqa: PLC0415 - the error path only

        raise FormatError(f"COO_ND needs at least one dimension, got ndim={ndim!r}")
    dims = [Dimension(f"d{k}") for k in range(ndim)]
    levels = {dims[0]: (_C, LevelProperty.NONUNIQUE)}
    for d in dims[1:-1]:
        levels[d] = (_S, LevelProperty.NONUNIQUE)
    if ndim > 1:
        levels[dims[-1]] = _S
    return TensorFormat(dims, levels, name=f"COO{ndim}")


def DENSE_ND(ndim: int) -> TensorFormat:
    """Row-major dense of any order."""
    dims = [Dimension(f"d{k}") for k in range(ndim)]
    return TensorFormat(dims, {d: _D for d in dims}, name=f"DENSE{ndim}")


def batched(fmt: TensorFormat, nbatch: int = 1) -> TensorFormat:
    """``fmt`` with ``nbatch`` leading BATCH dimensions (torch's batched CSR/CSC/BSR layout)."""
    taken = {d.name for d in fmt.dims}
    bdims: list[Dimension] = []
    for k in range(nbatch):
        name = "b" if nbatch == 1 else f"b{k}"
        while name in taken:
            name = "_" + name
        bdims.append(Dimension(name))
    levels = [(b, _B) for b in bdims] + [(lv.expr, lv.type) for lv in fmt.levels]
    label = f"Batched{fmt.name}" if fmt.name else None
    return TensorFormat(bdims + list(fmt.dims), levels, index_dtype=fmt.index_dtype, name=label)


BATCHED_CSR = batched(CSR)
BATCHED_CSC = batched(CSC)


def named_formats() -> dict[str, TensorFormat]:
    """The fixed named formats plus a representative of each family (for tests and docs)."""
    return {
        "COO": COO, "CSR": CSR, "CSC": CSC, "DCSR": DCSR, "DCSC": DCSC, "DIA": DIA, "DIA_J": DIA_J,
        "ELL": ELL, "DENSE": DENSE, "DENSE_COL": DENSE_COL, "BSR(2,3)": BSR(2, 3), "BSC(3,2)": BSC(3, 2),
        "DELTA(2)": DELTA(2), "DELTA(4)": DELTA(4), "NM(2,4)": NM(2, 4),
    }


_FAMILIES = {"BSR": (BSR, 2), "BSC": (BSC, 2), "DELTA": (DELTA, 1), "NM": (NM, 2), "COO": (COO_ND, 1),
             "DENSE": (DENSE_ND, 1)}


def format_named(text: str) -> TensorFormat | None:
    """The named format ``text`` spells ("CSR", "csc", "BSR(2, 2)", "DELTA(4)", "NM(2,4)", "COO(3)"), or None
    when it is not a name (a DSL string, say)."""
    key = text.strip().upper().replace(" ", "")
    fixed = {"COO": COO, "CSR": CSR, "CSC": CSC, "DCSR": DCSR, "DCSC": DCSC, "DIA": DIA, "DIA_J": DIA_J, "ELL": ELL,
             "DENSE": DENSE, "DENSE_COL": DENSE_COL}
    if key in fixed:
        return fixed[key]
    head, paren, rest = key.partition("(")
    if not paren or not rest.endswith(")") or head not in _FAMILIES:
        return None
    make, arity = _FAMILIES[head]
    parts = rest[:-1].split(",")
    if len(parts) != arity or not all(p.isdigit() for p in parts):
        from ..errors import FormatError  # noqa: PLC0415 - the error path only

        raise FormatError(f"format name {text!r}: {head} takes {arity} positive integer"
                          f"{'s' if arity > 1 else ''}, as in {head}({', '.join(['2'] * arity)})")
    return make(*(int(p) for p in parts))

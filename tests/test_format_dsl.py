"""The format DSL: object API (UST spelling), string form, named formats, identity, pickling.

Every expectation is written out by hand (the level structure a format must have) or is a
round-trip property over randomly generated valid formats.
"""

from __future__ import annotations

import copy
import keyword
import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sparsetorch import FormatError
from sparsetorch.format import (
    BATCHED_CSC, BATCHED_CSR, BSC, BSR, COO, COO_ND, CSC, CSR, DCSC, DCSR, DELTA, DENSE, DENSE_COL,
    DENSE_ND, DIA, DIA_J, ELL, NM, Dimension, FloorDiv, LevelFormat, LevelProperty, LevelType,
    TensorFormat, batched, named_formats,
)

D, B, C, L, S, R = (LevelFormat.DENSE, LevelFormat.BATCH, LevelFormat.COMPRESSED,
                    LevelFormat.LOOSE_COMPRESSED, LevelFormat.SINGLETON, LevelFormat.RANGE)
parse = TensorFormat.parse


def structure(fmt: TensorFormat) -> list[tuple[str, str]]:
    """(expression, level type) per level, as text: a description independent of __eq__."""
    return [(str(lv.expr), str(lv.type)) for lv in fmt.levels]


# --------------------------------------------------------------------------------------------
# The UST object API, exactly as nvmath-python spells it
# --------------------------------------------------------------------------------------------

def test_ust_object_api_csc_and_delta():
    i, j = Dimension("i"), Dimension("j")
    csc = TensorFormat([i, j], {j: LevelFormat.DENSE, i: LevelFormat.COMPRESSED})
    assert csc == CSC
    assert structure(csc) == [("j", "dense"), ("i", "compressed")]
    delta2 = TensorFormat([i, j], {i: LevelFormat.DENSE, j: (LevelFormat.DELTA, 2)})
    assert delta2 == DELTA(2)
    assert delta2 != DELTA(3)
    assert structure(delta2) == [("i", "dense"), ("j", "delta(2)")]
    assert delta2.levels[1].type.parameter == 2


def test_ust_dimension_name_keyword_spelling():
    assert Dimension(dimension_name="i") == Dimension("i")
    assert Dimension("i").name == "i"
    with pytest.raises(FormatError, match="two names"):
        Dimension("i", dimension_name="j")


def test_ust_object_api_coo_bsr_dia_nm_batched():
    i, j, b = Dimension("i"), Dimension("j"), Dimension("b")
    coo = TensorFormat([i, j], {i: (LevelFormat.COMPRESSED, LevelProperty.NONUNIQUE), j: LevelFormat.SINGLETON})
    assert coo == COO
    assert coo.levels[0].type.unique is False and coo.levels[0].type.ordered is True
    bsr = TensorFormat([i, j], {i // 2: D, j // 3: C, i % 2: D, j % 3: D})
    assert bsr == BSR(2, 3)
    # The UST documentation writes block indices with "/": read as floor division.
    assert TensorFormat([i, j], {i / 2: D, j / 3: C, i % 2: D, j % 3: D}) == BSR(2, 3)
    assert i / 2 == i // 2 == FloorDiv(i, 2)
    assert TensorFormat([i, j], {j - i: C, i: R}) == DIA
    assert TensorFormat([i, j], {j - i: C, j: R}) == DIA_J
    assert TensorFormat([i, j], {i: D, j // 4: D, j % 4: (LevelFormat.STRUCTURED, 2)}) == NM(2, 4)
    assert TensorFormat([b, i, j], {b: B, i: D, j: C}) == BATCHED_CSR == batched(CSR)
    # A sequence of (expr, spec) pairs works like a dict; LevelType instances are accepted.
    assert TensorFormat([i, j], [(i, LevelType(D)), (j, LevelType(C))]) == CSR


def test_level_spec_spellings_and_properties():
    i, j = Dimension("i"), Dimension("j")
    f = TensorFormat([i, j], {i: D, j: (C, LevelProperty.NONUNIQUE, LevelProperty.UNORDERED)})
    assert f.levels[1].type == LevelType(C, None, unique=False, ordered=False)
    assert str(f.levels[1].type) == "compressed(nonunique, unordered)"
    g = TensorFormat([i, j], {i: D, j: (C, LevelProperty.UNIQUE, LevelProperty.ORDERED)})
    assert g == CSR  # the default properties, spelled out
    nm = TensorFormat([i, j], {i: D, j // 4: D, j % 4: (LevelFormat.STRUCTURED, 2, LevelProperty.ORDERED)})
    assert nm == NM(2, 4)


# --------------------------------------------------------------------------------------------
# The issue's example strings
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "text, expected",
    [
        ("(i, j) -> (i : compressed(nonunique), j : singleton)", COO),
        ("(i, j) -> (i // 2 : dense, j // 3 : compressed, i % 2 : dense, j % 3 : dense)", BSR(2, 3)),
        ("(i, j) -> (j - i : compressed, i : range)", DIA),
        ("(i, j) -> (i : dense, j : delta(4))", DELTA(4)),
        ("(b, i, j) -> (b : batch, i : dense, j : compressed)", BATCHED_CSR),
    ],
)
def test_issue_example_strings(text, expected):
    f = parse(text)
    assert f == expected
    assert hash(f) == hash(expected)
    assert str(f) == text  # these are already in canonical form


def test_parse_is_whitespace_insensitive_and_accepts_slash():
    assert parse("(i,j)->(i:dense,j:compressed)") == CSR
    assert parse("  ( i ,  j )  ->  ( j : dense , i : compressed )  ") == CSC
    assert parse("(i, j) -> (i / 2 : dense, j / 3 : compressed, i % 2 : dense, j % 3 : dense)") == BSR(2, 3)
    assert parse("(i, j) -> (i : dense, j : COMPRESSED(NONUNIQUE))").levels[1].type.unique is False
    # Dimension names may coincide with level type names.
    assert parse("(dense, range) -> (dense : dense, range : compressed)") == CSR


# --------------------------------------------------------------------------------------------
# Named formats: exact level structure and string form
# --------------------------------------------------------------------------------------------

NAMED_STRUCTURE = {
    "COO": [("i", "compressed(nonunique)"), ("j", "singleton")],
    "CSR": [("i", "dense"), ("j", "compressed")],
    "CSC": [("j", "dense"), ("i", "compressed")],
    "DCSR": [("i", "compressed"), ("j", "compressed")],
    "DCSC": [("j", "compressed"), ("i", "compressed")],
    "DIA": [("j - i", "compressed"), ("i", "range")],
    "DIA_J": [("j - i", "compressed"), ("j", "range")],
    "ELL": [("i", "dense"), ("j", "loose_compressed")],
    "DENSE": [("i", "dense"), ("j", "dense")],
    "DENSE_COL": [("j", "dense"), ("i", "dense")],
    "BSR(2,3)": [("i // 2", "dense"), ("j // 3", "compressed"), ("i % 2", "dense"), ("j % 3", "dense")],
    "BSC(3,2)": [("j // 2", "dense"), ("i // 3", "compressed"), ("i % 3", "dense"), ("j % 2", "dense")],
    "DELTA(2)": [("i", "dense"), ("j", "delta(2)")],
    "DELTA(4)": [("i", "dense"), ("j", "delta(4)")],
    "NM(2,4)": [("i", "dense"), ("j // 4", "dense"), ("j % 4", "structured(2)")],
}


def test_named_formats_table_is_complete():
    assert set(named_formats()) == set(NAMED_STRUCTURE)


@pytest.mark.parametrize("name", sorted(NAMED_STRUCTURE))
def test_named_format_structure_and_round_trip(name):
    f = named_formats()[name]
    assert structure(f) == NAMED_STRUCTURE[name]
    assert f.ndim == 2
    assert [d.name for d in f.dims] == ["i", "j"]
    text = str(f)
    assert text == "(i, j) -> (" + ", ".join(f"{e} : {t}" for e, t in NAMED_STRUCTURE[name]) + ")"
    g = parse(text)
    assert g == f and hash(g) == hash(f) and str(g) == text
    assert f.name  # named formats carry their label
    assert g.name is None  # ...which is not part of the identity


def test_named_constants_and_factories_agree():
    nf = named_formats()
    for name, obj in [("COO", COO), ("CSR", CSR), ("CSC", CSC), ("DCSR", DCSR), ("DCSC", DCSC), ("DIA", DIA),
                      ("DIA_J", DIA_J), ("ELL", ELL), ("DENSE", DENSE), ("DENSE_COL", DENSE_COL)]:
        assert nf[name] is obj or nf[name] == obj
    assert nf["BSR(2,3)"] == BSR(2, 3) and nf["BSC(3,2)"] == BSC(3, 2)
    assert nf["NM(2,4)"] == NM(2, 4) and nf["DELTA(4)"] == DELTA(4)


def test_all_named_formats_are_distinct():
    fmts = list(named_formats().values()) + [BSR(3, 2), BSC(2, 3), BSR(2, 2), NM(1, 4), NM(2, 8), DELTA(3)]
    assert len(set(fmts)) == len(fmts)
    for a in fmts:
        for b in fmts:
            assert (a == b) == (a is b)


def test_block_formats_of_other_sizes():
    assert structure(BSR(1, 1)) == [("i // 1", "dense"), ("j // 1", "compressed"), ("i % 1", "dense"), ("j % 1", "dense")]
    assert structure(BSC(2, 5)) == [("j // 5", "dense"), ("i // 2", "compressed"), ("i % 2", "dense"), ("j % 5", "dense")]
    assert BSR(2, 3) != BSR(3, 2) and BSR(2, 2) != BSC(2, 2)
    assert structure(NM(1, 1)) == [("i", "dense"), ("j // 1", "dense"), ("j % 1", "structured(1)")]
    assert structure(NM(3, 8)) == [("i", "dense"), ("j // 8", "dense"), ("j % 8", "structured(3)")]
    assert structure(DELTA(1)) == [("i", "dense"), ("j", "delta(1)")]
    assert structure(DELTA(31)) == [("i", "dense"), ("j", "delta(31)")]


@pytest.mark.parametrize("ndim", [1, 2, 3, 4])
def test_coo_nd_and_dense_nd(ndim):
    coo = COO_ND(ndim)
    dense = DENSE_ND(ndim)
    names = [f"d{k}" for k in range(ndim)]
    if ndim == 1:
        assert structure(coo) == [("d0", "compressed(nonunique)")]
    else:
        expected = [("d0", "compressed(nonunique)")] + [(n, "singleton(nonunique)") for n in names[1:-1]]
        expected.append((names[-1], "singleton"))
        assert structure(coo) == expected
    assert structure(dense) == [(n, "dense") for n in names]
    assert coo.ndim == dense.ndim == ndim
    assert dense.is_dense and not coo.is_dense
    for f in (coo, dense):
        assert parse(str(f)) == f
    assert COO_ND(2) == COO and DENSE_ND(2) == DENSE


def test_batched_variants():
    assert str(BATCHED_CSR) == "(b, i, j) -> (b : batch, i : dense, j : compressed)"
    assert str(BATCHED_CSC) == "(b, i, j) -> (b : batch, j : dense, i : compressed)"
    assert BATCHED_CSC == batched(CSC)
    two = batched(CSR, 2)
    assert str(two) == "(b0, b1, i, j) -> (b0 : batch, b1 : batch, i : dense, j : compressed)"
    assert two.num_batch_levels == 2 and BATCHED_CSR.num_batch_levels == 1 and CSR.num_batch_levels == 0
    assert batched(BSR(2, 3)) == parse(
        "(b, i, j) -> (b : batch, i // 2 : dense, j // 3 : compressed, i % 2 : dense, j % 3 : dense)")
    assert batched(COO) == parse("(b, i, j) -> (b : batch, i : compressed(nonunique), j : singleton)")
    assert batched(ELL).ndim == 3
    for f in list(named_formats().values()):
        bf = batched(f)
        assert bf.ndim == 3 and bf.num_batch_levels == 1
        assert structure(bf)[1:] == structure(f)
        assert parse(str(bf)) == bf
    # A format that already uses the name "b": the batch dimension gets a fresh name.
    other = parse("(b, c) -> (b : dense, c : compressed)")
    bo = batched(other)
    assert len({d.name for d in bo.dims}) == 3
    assert bo == BATCHED_CSR
    assert batched(CSR).name == "BatchedCSR"
    assert batched(CSR, 0) == CSR


def test_derived_facts():
    assert BSR(2, 3).level_sizes((5, 7)) == [3, 3, 2, 3]
    assert BSC(3, 2).level_sizes((5, 7)) == [4, 2, 3, 2]
    assert DIA.level_extents((4, 8)) == [(-3, 8), (0, 4)]
    assert DIA_J.level_extents((4, 8)) == [(-3, 8), (0, 8)]
    assert NM(2, 4).level_sizes((3, 10)) == [3, 3, 4]
    assert parse("(i, j) -> (i + j : compressed, j : range)").level_extents((3, 5)) == [(0, 7), (0, 5)]
    assert CSR.num_levels == 2 and BSR(2, 2).num_levels == 4
    assert DENSE.is_dense and DENSE_COL.is_dense and not CSR.is_dense
    with pytest.raises(FormatError, match="2 dimensions"):
        CSR.level_sizes((3, 4, 5))
    # Recovery: how each dimension comes back from the level coordinates.
    rec = BSR(2, 3).recovery
    assert (rec[0].kind, rec[0].a, rec[0].b, rec[0].c) == ("block", 0, 2, 2)
    assert (rec[1].kind, rec[1].a, rec[1].b, rec[1].c) == ("block", 1, 3, 3)
    assert [r.kind for r in DIA.recovery] == ["plain", "sub_left"]
    assert [r.kind for r in DIA_J.recovery] == ["sub_right", "plain"]


# --------------------------------------------------------------------------------------------
# Identity: structural equality, hashing, dict keys, labels
# --------------------------------------------------------------------------------------------

def test_structural_identity_ignores_names_and_labels():
    renamed = parse("(r, c) -> (r : dense, c : compressed)")
    assert renamed == CSR and hash(renamed) == hash(CSR)
    # Dimensions are matched by position, not by name.
    swapped_names = parse("(j, i) -> (j : dense, i : compressed)")
    assert swapped_names == CSR
    assert parse("(j, i) -> (i : dense, j : compressed)") == CSC
    assert parse("(x, y) -> (y - x : compressed, x : range)") == DIA
    labelled = CSR.replace(name="my csr", index_dtype=torch.int32)
    assert labelled == CSR and hash(labelled) == hash(CSR)
    assert labelled.name == "my csr" and labelled.index_dtype is torch.int32
    assert CSR.index_dtype is None
    assert TensorFormat.parse(str(CSR), index_dtype="int64").index_dtype is torch.int64
    p, q = Dimension("p"), Dimension("q")
    assert CSR.with_dims([p, q]) == CSR and [d.name for d in CSR.with_dims([p, q]).dims] == ["p", "q"]


def test_formats_as_dict_keys():
    table = {CSR: "csr", CSC: "csc", BSR(2, 3): "bsr23", DIA: "dia", COO: "coo"}
    assert table[parse("(a, b) -> (a : dense, b : compressed)")] == "csr"
    assert table[parse("(a, b) -> (b : dense, a : compressed)")] == "csc"
    assert table[BSR(2, 3).replace(name=None)] == "bsr23"
    assert table[parse("(u, v) -> (v - u : compressed, u : range)")] == "dia"
    assert BSR(3, 2) not in table and DIA_J not in table
    assert len({CSR, parse(str(CSR)), CSR.replace(index_dtype=torch.int32)}) == 1


@pytest.mark.parametrize(
    "a, b",
    [
        ("(i, j) -> (i : dense, j : compressed)", "(i, j) -> (j : dense, i : compressed)"),
        ("(i, j) -> (i : compressed, j : compressed)", "(i, j) -> (j : compressed, i : compressed)"),
        ("(i, j) -> (i : dense, j : compressed)", "(i, j) -> (i : dense, j : compressed(unordered))"),
        ("(i, j) -> (i : dense, j : compressed)", "(i, j) -> (i : dense, j : compressed(nonunique))"),
        ("(i, j) -> (i : dense, j : compressed)", "(i, j) -> (i : dense, j : loose_compressed)"),
        ("(i, j) -> (i : compressed(nonunique), j : singleton)",
         "(i, j) -> (i : compressed(nonunique), j : singleton(nonunique))"),
        ("(i, j) -> (j - i : compressed, i : range)", "(i, j) -> (i - j : compressed, i : range)"),
        ("(i, j) -> (j - i : compressed, i : range)", "(i, j) -> (i + j : compressed, i : range)"),
        ("(i, j) -> (i // 2 : dense, j : compressed, i % 2 : dense)",
         "(i, j) -> (i // 3 : dense, j : compressed, i % 3 : dense)"),
        ("(i, j) -> (i : dense, j : delta(2))", "(i, j) -> (i : dense, j : delta(3))"),
        ("(i, j, k) -> (i : dense, j : dense, k : dense)", "(i, j, k) -> (i : dense, k : dense, j : dense)"),
        ("(i) -> (i : dense)", "(i, j) -> (i : dense, j : dense)"),
    ],
)
def test_different_layouts_are_not_equal(a, b):
    fa, fb = parse(a), parse(b)
    assert fa != fb
    assert fa == parse(a) and fb == parse(b)
    assert len({fa, fb}) == 2


def test_format_not_equal_to_other_types():
    assert CSR != str(CSR)
    assert CSR != None  # noqa: E711
    assert Dimension("i") != "i"


# --------------------------------------------------------------------------------------------
# Immutability and pickling
# --------------------------------------------------------------------------------------------

def test_formats_are_immutable():
    f = BSR(2, 3)
    for attr, value in [("levels", ()), ("dims", ()), ("name", "x"), ("index_dtype", torch.int32), ("new", 1)]:
        with pytest.raises(AttributeError):
            setattr(f, attr, value)
    with pytest.raises(AttributeError):
        f.levels[0].type.unique = False
    with pytest.raises(AttributeError):
        f.levels[0].expr = Dimension("k")
    with pytest.raises(AttributeError):
        f.levels[0].expr.c = 5
    with pytest.raises(AttributeError):
        Dimension("i").name = "k"
    assert isinstance(f.levels, tuple) and isinstance(f.dims, tuple)
    assert f == BSR(2, 3) and str(f) == str(BSR(2, 3))


ALL_FOR_PICKLE = list(named_formats().values()) + [
    BATCHED_CSR, batched(BSR(2, 2), 2), COO_ND(3), DENSE_ND(1), NM(1, 1),
    CSR.replace(index_dtype=torch.int32, name="csr32"),
    parse("(x, y) -> (x + y : compressed(unordered), y : range)"),
]


@pytest.mark.parametrize("fmt", ALL_FOR_PICKLE, ids=str)
def test_format_pickle_and_copy_round_trip(fmt):
    for proto in range(2, pickle.HIGHEST_PROTOCOL + 1):
        g = pickle.loads(pickle.dumps(fmt, protocol=proto))
        assert g == fmt and hash(g) == hash(fmt) and str(g) == str(fmt)
        assert g.name == fmt.name and g.index_dtype == fmt.index_dtype
    assert copy.copy(fmt) == fmt and copy.deepcopy(fmt) == fmt


def test_dimension_and_expression_pickle_round_trip():
    # Dimensions and level expressions are values too (multiprocessing, caches pickle them).
    i, j = Dimension("i"), Dimension("j")
    for obj in [i, i // 2, i % 3, j - i, i + j]:
        assert pickle.loads(pickle.dumps(obj)) == obj
        assert copy.deepcopy(obj) == obj


def test_unicode_dimension_names_round_trip():
    # Dimension accepts any Python identifier, so str(fmt) must parse back (and pickle) for them too.
    a, b = Dimension("α"), Dimension("β")
    f = TensorFormat([a, b], {a: D, b: C})
    assert parse(str(f)) == f == CSR
    assert pickle.loads(pickle.dumps(f)) == f


# --------------------------------------------------------------------------------------------
# Random valid formats: parse(str(f)) == f
# --------------------------------------------------------------------------------------------

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,4}", fullmatch=True).filter(lambda s: not keyword.iskeyword(s))


def _props(draw, fmt: LevelFormat) -> LevelType:
    return LevelType(fmt, None, unique=draw(st.booleans()), ordered=draw(st.booleans()))


@st.composite
def valid_formats(draw):
    """A random valid format: random dimension names and order, optional leading batch levels,
    plain / block (i // c, i % c) / diagonal (a - b or a + b, with a later range) mappings,
    interleaved at random, and level types chosen among those the rules allow at each place
    (singleton only after a nonunique or singleton level, delta(bits) last on a plain dimension,
    structured(n <= m) last on an 'i % m' level)."""
    ndim = draw(st.integers(1, 4))
    names = draw(st.lists(NAMES, min_size=ndim, max_size=ndim, unique=True))
    dims = [Dimension(n) for n in names]
    perm = draw(st.permutations(range(ndim)))
    nbatch = draw(st.integers(0, ndim - 1))
    batch = [dims[p] for p in perm[:nbatch]]
    rest = [dims[p] for p in perm[nbatch:]]
    seqs = []
    k = 0
    while k < len(rest):
        kinds = ["plain", "block", "diag"] if k + 1 < len(rest) else ["plain", "block"]
        kind = draw(st.sampled_from(kinds))
        if kind == "plain":
            seqs.append([(rest[k], "plain")])
            k += 1
        elif kind == "block":
            c = draw(st.integers(1, 6))
            seqs.append([(rest[k] // c, "div"), (rest[k] % c, "mod")])
            k += 1
        else:
            a, b = rest[k], rest[k + 1]
            expr = a - b if draw(st.booleans()) else a + b
            seqs.append([(expr, "diag"), (draw(st.sampled_from([a, b])), "range")])
            k += 2
    pending = [list(s) for s in seqs]
    order = []
    while any(pending):
        idx = draw(st.sampled_from([n for n, s in enumerate(pending) if s]))
        order.append(pending[idx].pop(0))
    levels = [(b, LevelType(B)) for b in batch]
    for n, (expr, role) in enumerate(order):
        prev = levels[-1][1] if levels else None
        last = n == len(order) - 1
        if role == "range":
            t = LevelType(R)
        elif role == "diag":
            t = _props(draw, draw(st.sampled_from([C, L])))
        else:
            options = ["dense", "compressed", "loose_compressed"]
            if prev is not None and (prev.format is S or not prev.unique):
                options.append("singleton")
            if last and role == "plain":
                options.append("delta")
            if last and role == "mod":
                options.append("structured")
            choice = draw(st.sampled_from(options))
            if choice == "dense":
                t = LevelType(D)
            elif choice == "compressed":
                t = _props(draw, C)
            elif choice == "loose_compressed":
                t = _props(draw, L)
            elif choice == "singleton":
                t = _props(draw, S)
            elif choice == "delta":
                t = LevelType(LevelFormat.DELTA, draw(st.integers(1, 31)))
            else:
                t = LevelType(LevelFormat.STRUCTURED, draw(st.integers(1, expr.c)))
        levels.append((expr, t))
    return TensorFormat(dims, levels)


@given(valid_formats())
def test_random_formats_round_trip_through_text(f):
    text = str(f)
    g = parse(text)
    assert g == f
    assert hash(g) == hash(f)
    assert str(g) == text
    assert structure(g) == structure(f)
    assert [d.name for d in g.dims] == [d.name for d in f.dims]
    # Renaming every dimension changes nothing structural.
    fresh = [Dimension(f"z{k}") for k in range(f.ndim)]
    assert f.with_dims(fresh) == f
    # Compact spelling (no spaces) parses to the same format.
    assert parse(text.replace(" ", "")) == f
    assert pickle.loads(pickle.dumps(f)) == f


@given(valid_formats(), valid_formats())
def test_random_formats_equal_iff_same_text_up_to_names(f, g):
    def canon(x):
        names = {d.name: f"d{k}" for k, d in enumerate(x.dims)}
        return str(x.with_dims([Dimension(names[d.name]) for d in x.dims]))
    assert (f == g) == (canon(f) == canon(g))
    if f == g:
        assert hash(f) == hash(g)

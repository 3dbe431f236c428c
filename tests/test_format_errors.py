"""Every rule of the format DSL has an error that names the problem.

Syntax errors are FormatParseError with the offset of the offending character and a caret
line under it; layout-rule violations are FormatError naming the level and the rule, raised
the same way from the string form and from the object API.
"""

from __future__ import annotations

import re

import pytest

from sparsetorch import FormatError, FormatParseError, SparseTorchError
from sparsetorch.format import Dimension, LevelFormat, LevelProperty, LevelType, TensorFormat

parse = TensorFormat.parse
D, B, C, S, R = LevelFormat.DENSE, LevelFormat.BATCH, LevelFormat.COMPRESSED, LevelFormat.SINGLETON, LevelFormat.RANGE
i, j, k, b = Dimension("i"), Dimension("j"), Dimension("k"), Dimension("b")


def _check_caret(err: FormatParseError, text: str, offset: int) -> None:
    assert err.offset == offset, (err.offset, offset, str(err))
    assert err.text == text
    lines = str(err).split("\n")
    assert lines[-2] == "  " + text
    assert lines[-1] == "  " + " " * offset + "^"
    assert f"at position {offset}" in lines[0]


# --------------------------------------------------------------------------------------------
# Syntax errors: FormatParseError with offset and caret
# --------------------------------------------------------------------------------------------

# (text, the substring whose first character the caret must point at (its `occurrence`-th match),
#  regex the message must match)
SYNTAX = [
    ("(i, j) -> (i : dense, j : compresed)", "compresed", 1, r"unknown level type 'compresed'.*known: dense, batch, compressed"),
    ("(i, j) -> (i dense, j : compressed)", "dense", 1, r"expected ':' between a level expression and its level type, got 'dense'"),
    ("(i, j) -> (i : dense j : compressed)", "j :", 1, r"expected ',' or '\)' in the level list, got 'j'"),
    ("(i, j) -> (i : dense, k : compressed)", "k", 1, r"unknown dimension 'k'; declared: i, j"),
    ("(i, i) -> (i : dense)", "i", 2, r"dimension 'i' is declared twice"),
    ("(i, j) (i : dense, j : compressed)", "(i :", 1, r"expected '->'"),
    ("i, j -> (i : dense, j : compressed)", "i", 1, r"expected '\(' to open the dimension list"),
    ("(i, j) -> (i : dense, j : compressed) x", "x", 1, r"expected end of text, got 'x'"),
    ("(i, j) -> (i : dense, j : compressed)!", "!", 1, r"unexpected character '!'"),
    ("(i, j) -> (i : dense, j : delta)", "delta", 1, r"delta needs an integer argument, e.g. delta\(4\)"),
    ("(i, j) -> (i : dense, j : delta(0))", "delta", 1, r"DELTA bits must be in 1..31, got 0"),
    ("(i, j) -> (i : dense, j : delta(32))", "delta", 1, r"DELTA bits must be in 1..31, got 32"),
    ("(i, j) -> (i : dense, j : delta(2, 3))", "3", 1, r"takes no \(further\) integer argument"),
    ("(i, j) -> (i : dense, j : compressed(2))", "2", 1, r"compressed takes no \(further\) integer argument"),
    ("(i, j) -> (i : dense(nonunique), j : compressed)", "dense", 1, r"a DENSE level is always unique and ordered"),
    ("(i, j) -> (i : dense(unordered), j : compressed)", "dense", 1, r"a DENSE level is always unique and ordered"),
    ("(i, j) -> (j - i : compressed, i : range(nonunique))", "range", 1, r"a RANGE level is always unique and ordered"),
    ("(b, i, j) -> (b : batch(unordered), i : dense, j : compressed)", "batch", 1, r"a BATCH level is always unique"),
    ("(i, j) -> (i : dense, j : compressed(unique, nonunique))", "compressed", 1, r"cannot be both unique and nonunique"),
    ("(i, j) -> (i : dense, j : compressed(ordered, unordered))", "compressed", 1, r"cannot be both ordered and unordered"),
    ("(i, j) -> (i : dense, j : delta(2, nonunique))", "delta", 1, r"a DELTA level must be unique and ordered"),
    ("(i, j) -> (i : dense, j // 2 : dense, j % 2 : structured(1, unordered))", "structured", 1,
     r"a STRUCTURED level must be unique and ordered"),
    ("(i, j) -> (i : dense, j : compressed(sorted))", "sorted", 1, r"expected an integer or a property \(unique, nonunique, ordered, unordered\)"),
    ("(i, j) -> (i // 0 : dense, j : compressed, i % 0 : dense)", "0", 1, r"the constant after '//' must be positive"),
    ("(i, j) -> (i // x : dense, j : compressed)", "x", 1, r"a positive integer after '//'"),
    ("(i, j) -> (i : , j : compressed)", ", j", 2, r"expected a level type"),
    ("(i, j) -> ()", ")", 2, r"expected a dimension name"),
    ("", None, 0, r"expected '\(' to open the dimension list.*got end of text"),
    ("(i, j) -> (i : dense, j : compressed", None, 0, r"expected ',' or '\)' in the level list, got end of text"),
]


@pytest.mark.parametrize("text, token, occurrence, message", SYNTAX, ids=[s[0] or "<empty>" for s in SYNTAX])
def test_syntax_errors_have_offset_and_caret(text, token, occurrence, message):
    with pytest.raises(FormatParseError) as info:
        parse(text)
    err = info.value
    assert isinstance(err, FormatError) and isinstance(err, ValueError) and isinstance(err, SparseTorchError)
    assert re.search(message, err.reason), err.reason
    if token is None:
        offset = len(text.rstrip())
    else:
        offset = -1
        for _ in range(occurrence):
            offset = text.index(token, offset + 1)
    _check_caret(err, text, offset)


def test_parse_rejects_non_strings():
    with pytest.raises(FormatError, match="format string is expected, got int"):
        parse(3)


# --------------------------------------------------------------------------------------------
# Layout rules: FormatError naming the level and the rule, from text and from objects
# --------------------------------------------------------------------------------------------

# (rule, text, the same format as objects (a thunk), regex for the message)
RULES = [
    ("unpaired i // c", "(i, j) -> (i // 2 : dense, j : compressed)",
     lambda: TensorFormat([i, j], {i // 2: D, j: C}),
     r"level 0 \(i // 2 : dense\): 'i // 2' must be paired with exactly one 'i % 2' level"),
    ("unpaired i % c", "(i, j) -> (i : dense, j % 2 : compressed)",
     lambda: TensorFormat([i, j], {i: D, j % 2: C}),
     r"'j % 2' must be paired with exactly one 'j // 2' level"),
    ("mismatched constants", "(i, j) -> (i // 2 : dense, j : compressed, i % 3 : dense)",
     lambda: TensorFormat([i, j], {i // 2: D, j: C, i % 3: D}),
     r"'i // 2' must be paired with exactly one 'i % 2' level"),
    ("mod before div", "(i, j) -> (i % 2 : dense, j : compressed, i // 2 : dense)",
     lambda: TensorFormat([i, j], {i % 2: D, j: C, i // 2: D}),
     r"'i // 2' must come before its 'i % 2' level"),
    ("diagonal without range", "(i, j) -> (j - i : compressed, i : dense)",
     lambda: TensorFormat([i, j], {j - i: C, i: D}),
     r"'j - i' needs exactly one later RANGE level on j or i"),
    ("diagonal with two ranges", "(i, j) -> (j - i : compressed, i : range, j : range)",
     lambda: TensorFormat([i, j], {j - i: C, i: R, j: R}),
     r"'j - i' needs exactly one later RANGE level"),
    ("range before its diagonal", "(i, j) -> (i : range, j - i : compressed)",
     lambda: TensorFormat([i, j], {i: R, j - i: C}),
     r"a RANGE level needs an earlier diagonal level"),
    ("range without diagonal", "(i, j) -> (j : compressed, i : range)",
     lambda: TensorFormat([i, j], {j: C, i: R}),
     r"level 1 \(i : range\): a RANGE level needs an earlier diagonal level \('j - i' or 'i \+ j'\) using i"),
    ("range on an expression", "(i, j) -> (j - i : compressed, i % 2 : range)",
     lambda: TensorFormat([i, j], {j - i: C, i % 2: R}),
     r"a RANGE level is indexed by a plain dimension"),
    ("diagonal not compressed", "(i, j) -> (j - i : dense, i : range)",
     lambda: TensorFormat([i, j], {j - i: D, i: R}),
     r"a diagonal level \(j - i\) must be compressed"),
    ("diagonal of one dimension", "(i, j) -> (i - i : compressed, i : range, j : dense)",
     lambda: TensorFormat([i, j], {i - i: C, i: R, j: D}),
     r"a diagonal expression needs two different dimensions"),
    ("singleton first", "(i, j) -> (i : singleton, j : compressed)",
     lambda: TensorFormat([i, j], {i: S, j: C}),
     r"level 0 \(i : singleton\): a SINGLETON level must follow a nonunique compressed level or another singleton"),
    ("singleton after a unique level", "(i, j) -> (i : compressed, j : singleton)",
     lambda: TensorFormat([i, j], {i: C, j: S}),
     r"level 1 \(j : singleton\): a SINGLETON level must follow a nonunique"),
    ("singleton after dense", "(i, j) -> (i : dense, j : singleton)",
     lambda: TensorFormat([i, j], {i: D, j: S}),
     r"a SINGLETON level must follow a nonunique"),
    ("dimension mapped twice", "(i, j) -> (i : dense, j : compressed, i : compressed)",
     lambda: TensorFormat([i, j], [(i, D), (j, C), (i, C)]),
     r"dimension 'i' is mapped twice \(again by level 2 \(i : compressed\)\)"),
    ("dimension mapped twice by a block", "(i, j) -> (i : dense, j : compressed, i // 2 : dense, i % 2 : dense)",
     lambda: TensorFormat([i, j], [(i, D), (j, C), (i // 2, D), (i % 2, D)]),
     r"dimension 'i' is mapped twice"),
    ("dimension mapped twice by a diagonal", "(i, j) -> (j - i : compressed, i : range, j : dense)",
     lambda: TensorFormat([i, j], {j - i: C, i: R, j: D}),
     r"dimension 'j' is mapped twice"),
    ("unmapped dimension", "(i, j) -> (i : dense)",
     lambda: TensorFormat([i, j], {i: D}),
     r"dimension\(s\) \['j'\] are not mapped to any level"),
    ("batch not first", "(b, i, j) -> (i : dense, b : batch, j : compressed)",
     lambda: TensorFormat([b, i, j], {i: D, b: B, j: C}),
     r"level 1 \(b : batch\): BATCH levels must come first"),
    ("batch on an expression", "(b, i, j) -> (b // 2 : batch, b % 2 : dense, i : dense, j : compressed)",
     lambda: TensorFormat([b, i, j], {b // 2: B, b % 2: D, i: D, j: C}),
     r"a BATCH level is indexed by a plain dimension"),
    ("batch only", "(b) -> (b : batch)",
     lambda: TensorFormat([b], {b: B}),
     r"a format cannot consist of BATCH levels only"),
    ("delta not last", "(i, j) -> (j : delta(2), i : dense)",
     lambda: TensorFormat([i, j], {j: (LevelFormat.DELTA, 2), i: D}),
     r"level 0 \(j : delta\(2\)\): a DELTA level must be the last level"),
    ("delta on an expression", "(i, j) -> (j : dense, i // 2 : dense, i % 2 : delta(2))",
     lambda: TensorFormat([i, j], {j: D, i // 2: D, i % 2: (LevelFormat.DELTA, 2)}),
     r"a DELTA level is indexed by a plain dimension"),
    ("structured not last", "(i, j) -> (j // 4 : dense, j % 4 : structured(2), i : dense)",
     lambda: TensorFormat([i, j], {j // 4: D, j % 4: (LevelFormat.STRUCTURED, 2), i: D}),
     r"a STRUCTURED level must be the last level"),
    ("structured n > m", "(i, j) -> (i : dense, j // 2 : dense, j % 2 : structured(3))",
     lambda: TensorFormat([i, j], {i: D, j // 2: D, j % 2: (LevelFormat.STRUCTURED, 3)}),
     r"STRUCTURED\(n\) with n=3 > m=2"),
    ("structured on a plain dimension", "(i, j) -> (i : dense, j : structured(2))",
     lambda: TensorFormat([i, j], {i: D, j: (LevelFormat.STRUCTURED, 2)}),
     r"a STRUCTURED\(n\) level is indexed by 'j % m'"),
    ("no levels", None, lambda: TensorFormat([i, j], {}), r"a format needs at least one level"),
    ("no dimensions", None, lambda: TensorFormat([], {i: D}), r"a format needs at least one dimension"),
    ("repeated dimension names", None, lambda: TensorFormat([i, Dimension("i")], {i: D}),
     r"dimension names must be unique, repeated: \['i'\]"),
    ("undeclared dimension (objects)", None, lambda: TensorFormat([i, j], {i: D, j: C, k: D}),
     r"level 2 \(k : dense\) uses dimension 'k', which is not declared in \['i', 'j'\]"),
]


@pytest.mark.parametrize("rule, text, build, message", RULES, ids=[r[0] for r in RULES])
def test_layout_rule_errors(rule, text, build, message):
    with pytest.raises(FormatError) as info:
        build()
    assert re.search(message, str(info.value)), str(info.value)
    if text is not None:
        with pytest.raises(FormatError) as info2:
            parse(text)
        assert re.search(message, str(info2.value)), str(info2.value)


# --------------------------------------------------------------------------------------------
# Object-API level specs and expressions
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "spec, message",
    [
        ((LevelFormat.DELTA,), r"DELTA needs an int parameter, e.g. \(LevelFormat.DELTA, 4\)"),
        (LevelFormat.DELTA, r"DELTA needs an int parameter"),
        ((LevelFormat.DELTA, 0), r"DELTA bits must be in 1..31, got 0"),
        ((LevelFormat.DELTA, 32), r"DELTA bits must be in 1..31, got 32"),
        ((LevelFormat.DELTA, 2.0), r"expected an int parameter or LevelProperty values, got 2.0"),
        ((LevelFormat.DELTA, True), r"expected an int parameter or LevelProperty values, got True"),
        ((LevelFormat.DELTA, 2, 3), r"expected an int parameter or LevelProperty values, got 3"),
        ((LevelFormat.DENSE, 2), r"DENSE takes no parameter, got 2"),
        ((LevelFormat.DENSE, LevelProperty.NONUNIQUE), r"a DENSE level is always unique and ordered"),
        ((LevelFormat.RANGE, LevelProperty.UNORDERED), r"a RANGE level is always unique and ordered"),
        ((LevelFormat.COMPRESSED, LevelProperty.UNIQUE, LevelProperty.NONUNIQUE), r"cannot be both unique and nonunique"),
        ((LevelFormat.COMPRESSED, LevelProperty.ORDERED, LevelProperty.UNORDERED), r"cannot be both ordered and unordered"),
        ((LevelFormat.DELTA, 2, LevelProperty.NONUNIQUE), r"a DELTA level must be unique and ordered"),
        ("compressed", r"level spec must be a LevelFormat, a tuple"),
        ((), r"level spec must be a LevelFormat"),
        (("compressed", 2), r"level spec must be a LevelFormat"),
    ],
    ids=str,
)
def test_bad_level_specs(spec, message):
    with pytest.raises(FormatError, match=message):
        TensorFormat([i, j], {i: D, j: spec})


def test_bad_level_types_directly():
    with pytest.raises(FormatError, match="STRUCTURED\\(n\\) needs n >= 1, got 0"):
        LevelType(LevelFormat.STRUCTURED, 0)
    with pytest.raises(FormatError, match="level format must be a LevelFormat"):
        LevelType("dense")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: i // 0, r"the constant of '//' must be a positive int, got 0"),
        (lambda: i % -2, r"the constant of '%' must be a positive int, got -2"),
        (lambda: i // 2.0, r"the constant of '//' must be a positive int, got 2.0"),
        (lambda: i // True, r"the constant of '//' must be a positive int, got True"),
        (lambda: i + (j - i), r"operator '\+' applies to plain dimensions only"),
        (lambda: Dimension("1x"), r"Dimension name must be a Python identifier"),
        (lambda: Dimension("for"), r"Dimension name must be a Python identifier"),
        (lambda: Dimension(""), r"Dimension name must be a Python identifier"),
        (lambda: Dimension(3), r"Dimension name must be a Python identifier"),
        (lambda: Dimension(), r"Dimension name must be a Python identifier"),
        (lambda: TensorFormat(["i", "j"], {i: D, j: C}), r"dims must be Dimension objects, got 'i'"),
        (lambda: TensorFormat([i, j], {"i": D, j: C}), r"level expression must be a dimension or i//c"),
        (lambda: TensorFormat([i, j], [(i, D, 1), (j, C)]), r"each level must be an \(expression, level spec\) pair"),
        (lambda: TensorFormat([i, j], {i: D, j: C}, index_dtype="float32"), r"index_dtype must be torch.int32, torch.int64 or None"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_bad_expressions_and_arguments(make, message):
    with pytest.raises(FormatError, match=message):
        make()


def test_expressions_do_not_nest():
    # Only plain dimensions carry the operators; a nested expression is refused either by Python
    # (no operator on an expression) or by the DSL (an expression as the right operand).
    for make in (lambda: (i // 2) // 2, lambda: (i % 2) % 2, lambda: (j - i) + k, lambda: i - (j + k)):
        with pytest.raises((TypeError, FormatError)):
            make()


def test_errors_name_the_level_position_and_text():
    # Several levels of the same type: the message says which one.
    with pytest.raises(FormatError) as info:
        parse("(i, j, k) -> (i : dense, j : compressed, k // 2 : dense)")
    assert "level 2 (k // 2 : dense)" in str(info.value)


def test_coo_nd_of_no_dimension_and_huge_block_constants_are_named():
    import torch

    import sparsetorch as st
    from sparsetorch.errors import FormatError, FormatParseError
    from sparsetorch.format import COO_ND

    with pytest.raises(FormatError, match="at least one dimension"):
        COO_ND(0)
    with pytest.raises(FormatParseError, match="past 2\\^62"):
        st.SparseTensor.from_dense(torch.eye(3, dtype=torch.float64),
                                   "(i, j) -> (i // 99999999999999999999 : dense, j : compressed, "
                                   "i % 99999999999999999999 : dense)")

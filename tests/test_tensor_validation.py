"""Validation of hand-built buffers: each defect raises ValidationError naming the buffer, the
bad value and its place; check=False skips the content checks (not the cheap structural ones).
"""

from __future__ import annotations

import re

import pytest
import torch

from sparsetorch import SparseTensor, SparseTorchError, ValidationError
from sparsetorch.format import BSR, COO, CSR, DELTA, DIA, ELL, NM, TensorFormat, batched

pytestmark = pytest.mark.usefixtures("single_thread")


def L(*x, dtype=torch.int64):
    return torch.tensor(x, dtype=dtype)


def V(n, dtype=torch.float64):
    return torch.arange(1, n + 1, dtype=dtype)


def VB(*shape):
    return torch.ones(shape, dtype=torch.float64)


def _content(fmt, shape, pos, crd, values):
    return (fmt, shape, pos, crd, values)


# (name, (format, shape, pos, crd, values), regexes the message must match (all of them))
# Content defects: found with check=True, skipped with check=False.
CONTENT = [
    ("negative pos start", _content(CSR, (3, 4), [None, L(-1, 1, 2, 3)], [None, L(0, 1, 2)], V(3)),
     [r"pos\[1\]\[0\] must be 0", r"got -1"]),
    ("pos start not zero", _content(CSR, (3, 4), [None, L(1, 1, 2, 3)], [None, L(0, 1, 2)], V(3)),
     [r"pos\[1\]\[0\] must be 0", r"got 1"]),
    ("decreasing pos", _content(CSR, (3, 4), [None, L(0, 2, 1, 3)], [None, L(0, 1, 2)], V(3)),
     [r"pos\[1\] must be non-decreasing", r"pos\[1\]\[1\] = 2 > pos\[1\]\[2\] = 1"]),
    ("crd out of range", _content(CSR, (3, 4), [None, L(0, 1, 2, 3)], [None, L(0, 4, 2)], V(3)),
     [r"crd\[1\]\[1\] = 4 is out of range", r"\[0, 4\)"]),
    ("negative crd", _content(CSR, (3, 4), [None, L(0, 1, 2, 3)], [None, L(0, -1, 2)], V(3)),
     [r"crd\[1\]\[1\] = -1 is out of range"]),
    ("unsorted crd in an ordered level", _content(CSR, (3, 4), [None, L(0, 2, 2, 3)], [None, L(3, 1, 2)], V(3)),
     [r"crd\[1\] must be strictly increasing within each segment", r"entries 0 and 1 are \(3,\) then \(1,\)"]),
    ("duplicates in a unique level", _content(CSR, (3, 4), [None, L(0, 2, 2, 3)], [None, L(1, 1, 2)], V(3)),
     [r"crd\[1\]", r"\(1,\) then \(1,\)"]),
    ("duplicates in an unordered unique level",
     _content(TensorFormat.parse("(i, j) -> (i : dense, j : compressed(unordered))"), (3, 4),
              [None, L(0, 3, 3, 3)], [None, L(2, 0, 2)], V(3)),
     [r"crd\[1\] repeat the coordinate \(2,\)", r"unique"]),
    ("unsorted rows in COO", _content(COO, (3, 4), [L(0, 3), None], [L(2, 0, 1), L(0, 0, 0)], V(3)),
     [r"crd\[0\], crd\[1\]", r"\(2, 0\) then \(0, 0\)"]),
    ("duplicate pairs in COO", _content(COO, (3, 4), [L(0, 3), None], [L(0, 0, 1), L(1, 1, 0)], V(3)),
     [r"crd\[0\], crd\[1\]", r"\(0, 1\) then \(0, 1\)"]),
    ("out-of-range diagonal", _content(DIA, (3, 4), [L(0, 1), None], [L(4), None], V(3)),
     [r"crd\[0\]\[0\] = 4 is out of range", r"\[-2, 4\)"]),
    ("unsorted diagonals", _content(DIA, (3, 4), [L(0, 2), None], [L(1, 0), None], V(6)),
     [r"crd\[0\] must be strictly increasing", r"\(1,\) then \(0,\)"]),
    ("ELL segment overlapping", _content(ELL, (2, 4), [None, L(0, 2, 1, 3)], [None, L(0, 1, 2)], V(3)),
     [r"pos\[1\] segment 1 = \[1, 3\) is invalid"]),
    ("ELL segment past crd", _content(ELL, (2, 4), [None, L(0, 2, 2, 5)], [None, L(0, 1, 2)], V(3)),
     [r"pos\[1\] segment 1 = \[2, 5\) is invalid", r"length 3"]),
    ("N:M offset out of range", _content(NM(2, 4), (1, 4), [None, None, None], [None, None, L(0, 4)], V(2)),
     [r"crd\[2\]\[1\] = 4 is out of range", r"\[0, 4\)"]),
    ("N:M offsets unsorted", _content(NM(2, 4), (1, 4), [None, None, None], [None, None, L(3, 1)], V(2)),
     [r"crd\[2\] must be strictly increasing", r"\(3,\) then \(1,\)"]),
    ("N:M offsets repeated", _content(NM(2, 4), (1, 4), [None, None, None], [None, None, L(1, 1)], V(2)),
     [r"crd\[2\]", r"\(1,\) then \(1,\)"]),
    ("DELTA gap too wide", _content(DELTA(2), (1, 8), [None, L(0, 1)], [None, L(4)], V(1)),
     [r"crd\[1\]\[0\] = 4 is out of range", r"gap", r"\[0, 4\)"]),
    ("BSR block column out of range", _content(BSR(2, 2), (4, 4), [None, L(0, 1, 1), None, None],
                                               [None, L(2), None, None], V(4)),
     [r"crd\[1\]\[0\] = 2 is out of range", r"\[0, 2\)"]),
    ("batched: pos decreasing", _content(batched(CSR), (2, 3, 4), [None, None, L(0, 2, 1, 2, 0, 0, 2, 2).reshape(2, 4)],
                                         [None, None, L(1, 3, 1, 2).reshape(2, 2)], VB(2, 2)),
     [r"pos\[2\]", r"must be non-decreasing"]),
    ("batched: crd out of range", _content(batched(CSR), (2, 3, 4), [None, None, L(0, 1, 1, 2, 0, 0, 2, 2).reshape(2, 4)],
                                           [None, None, L(1, 3, 1, 7).reshape(2, 2)], VB(2, 2)),
     [r"crd\[2\]", r"= 7 is out of range"]),
    ("batched: unsorted", _content(batched(CSR), (2, 3, 4), [None, None, L(0, 1, 1, 2, 0, 0, 2, 2).reshape(2, 4)],
                                   [None, None, L(1, 3, 2, 1).reshape(2, 2)], VB(2, 2)),
     [r"crd\[2\] must be strictly increasing"]),
]


@pytest.mark.parametrize("name, case, patterns", CONTENT, ids=[c[0] for c in CONTENT])
def test_content_defects_are_named(name, case, patterns):
    fmt, shape, pos, crd, values = case
    snapshot = [None if b is None else b.clone() for b in (*pos, *crd)]
    with pytest.raises(ValidationError) as info:
        SparseTensor(fmt, shape, pos, crd, values)
    msg = str(info.value)
    for p in patterns:
        assert re.search(p, msg), f"{p!r} not in: {msg}"
    assert isinstance(info.value, SparseTorchError) and isinstance(info.value, ValueError)
    # check=False: the content checks are skipped and the buffers are wrapped as given.
    t = SparseTensor(fmt, shape, pos, crd, values, check=False)
    assert t.values is values
    for a, b in zip((*t.pos_buffers, *t.crd_buffers), (*pos, *crd)):
        assert a is b
    for a, b in zip((*pos, *crd), snapshot):
        assert (a is None and b is None) or torch.equal(a, b)


# Structural defects: caught with or without check (they would make the tensor unusable).
STRUCTURAL = [
    ("pos[-1] != len(crd)", _content(CSR, (3, 4), [None, L(0, 1, 2, 4)], [None, L(0, 1, 2)], V(3)),
     [r"pos\[1\]\[-1\] = 4 must equal the length of crd\[1\] = 3"]),
    ("pos of the wrong length", _content(CSR, (3, 4), [None, L(0, 1, 3)], [None, L(0, 1, 2)], V(3)),
     [r"pos\[1\] must have 4 entries \(parents \+ 1\)", r"got shape \(3,\)"]),
    ("float index dtype", _content(CSR, (3, 4), [None, torch.tensor([0.0, 1, 2, 3])], [None, L(0, 1, 2)], V(3)),
     [r"pos\[1\] has dtype torch.float32", r"torch.int32 or torch.int64"]),
    ("int16 index dtype", _content(CSR, (3, 4), [None, L(0, 1, 2, 3)], [None, L(0, 1, 2, dtype=torch.int16)], V(3)),
     [r"crd\[1\] has dtype torch.int16"]),
    ("mixed index dtypes", _content(CSR, (3, 4), [None, L(0, 1, 2, 3, dtype=torch.int32)], [None, L(0, 1, 2)], V(3)),
     [r"index buffers mix dtypes", r"torch.int32", r"torch.int64"]),
    ("wrong values length", _content(CSR, (3, 4), [None, L(0, 1, 2, 3)], [None, L(0, 1, 2)], V(4)),
     [r"values must have 3 entries in its last dimension", r"got shape \(4,\)"]),
    ("integer values", _content(CSR, (3, 4), [None, L(0, 1, 2, 3)], [None, L(0, 1, 2)], torch.ones(3, dtype=torch.int64)),
     [r"values have dtype torch.int64", r"floating point or complex"]),
    ("bool values", _content(CSR, (3, 4), [None, L(0, 1, 2, 3)], [None, L(0, 1, 2)], torch.ones(3, dtype=torch.bool)),
     [r"values have dtype torch.bool"]),
    ("missing pos", _content(CSR, (3, 4), [None, None], [None, L(0, 1, 2)], V(3)),
     [r"pos\[1\] is missing: level 1 \(j : compressed\) stores a pos buffer"]),
    ("unexpected pos", _content(CSR, (3, 4), [L(0), L(0, 1, 2, 3)], [None, L(0, 1, 2)], V(3)),
     [r"pos\[0\] must be None: level 0 \(i : dense\) stores no pos buffer"]),
    ("too few buffers", _content(CSR, (3, 4), [L(0, 1, 2, 3)], [L(0, 1, 2)], V(3)),
     [r"has 2 levels; got 1 pos and 1 crd buffers"]),
    ("index buffer not a tensor", _content(CSR, (3, 4), [None, [0, 1, 2, 3]], [None, L(0, 1, 2)], V(3)),
     [r"pos\[1\] must be a torch.Tensor, got list"]),
    ("2-D crd", _content(CSR, (3, 4), [None, L(0, 1, 2, 3)], [None, L(0, 1, 2).reshape(1, 3)], V(3)),
     [r"crd\[1\] must be 1-D, got shape \(1, 3\)"]),
    ("singleton of the wrong length", _content(COO, (3, 4), [L(0, 3), None], [L(0, 0, 1), L(1, 0)], V(3)),
     [r"crd\[1\] must have one entry per parent \(3\)", r"got 2"]),
    ("N:M crd of the wrong length", _content(NM(2, 4), (1, 4), [None, None, None], [None, None, L(1)], V(2)),
     [r"crd\[2\] must have 2 entries per strip", r"got 1"]),
    ("ELL pos of the wrong length", _content(ELL, (2, 4), [None, L(0, 1, 1)], [None, L(0, 1)], V(2)),
     [r"pos\[1\] must hold 4 entries \(lo, hi per parent\)"]),
    ("negative shape", _content(CSR, (-1, 4), [None, L(0)], [None, L()], V(0)),
     [r"shape must be non-negative, got \(-1, 4\)"]),
    ("shape of too few dims", _content(CSR, (4,), [None, L(0, 0, 0, 0, 0)], [None, L()], V(0)),
     [r"shape \(4,\) has fewer dimensions than format"]),
    ("values not a tensor", _content(CSR, (3, 4), [None, L(0, 1, 2, 3)], [None, L(0, 1, 2)], [1.0, 2.0, 3.0]),
     [r"values must be a torch.Tensor, got list"]),
    ("batched: pos without the batch axis", _content(batched(CSR), (2, 3, 4), [None, None, L(0, 1, 1, 2)],
                                                     [None, None, L(1, 3)], VB(2, 2)),
     [r"pos\[2\] must have shape \(2,\) \+ \(n,\) for batch format", r"got \(4,\)"]),
    ("batched: crd of the wrong batch shape", _content(batched(CSR), (2, 3, 4),
                                                       [None, None, L(0, 1, 1, 2, 0, 0, 2, 2).reshape(2, 4)],
                                                       [None, None, L(1, 3, 1)], VB(2, 2)),
     [r"crd\[2\] must have shape \(2,\) \+ \(n,\)", r"got \(3,\)"]),
    ("batched: values of the wrong batch shape", _content(batched(CSR), (2, 3, 4),
                                                          [None, None, L(0, 1, 1, 2, 0, 0, 2, 2).reshape(2, 4)],
                                                          [None, None, L(1, 3, 1, 2).reshape(2, 2)], VB(3, 2)),
     [r"values must have batch dims \(2,\)", r"got \(3, 2\)"]),
    ("shared batch does not match values", _content(CSR, (5, 3, 4), [None, L(0, 1, 2, 3)], [None, L(0, 1, 2)], VB(4, 3)),
     [r"shape \(5, 3, 4\) has batch \(5,\) but values have leading dims \(4,\)"]),
]


@pytest.mark.parametrize("name, case, patterns", STRUCTURAL, ids=[c[0] for c in STRUCTURAL])
@pytest.mark.parametrize("check", [True, False])
def test_structural_defects_are_named(name, case, patterns, check):
    fmt, shape, pos, crd, values = case
    with pytest.raises(ValidationError) as info:
        SparseTensor(fmt, shape, pos, crd, values, check=check)
    msg = str(info.value)
    for p in patterns:
        assert re.search(p, msg), f"{p!r} not in: {msg}"


def test_valid_buffers_pass_and_check_false_agrees():
    good = [
        (CSR, (3, 4), [None, L(0, 1, 1, 3)], [None, L(2, 0, 3)], V(3)),
        (COO, (3, 4), [L(0, 3), None], [L(0, 2, 2), L(2, 0, 3)], V(3)),
        (DIA, (3, 4), [L(0, 2), None], [L(-1, 1), None], V(6)),
        (ELL, (2, 4), [None, L(0, 2, 2, 3)], [None, L(1, 3, 0, 0)], V(4)),
        (NM(2, 4), (1, 4), [None, None, None], [None, None, L(1, 3)], V(2)),
        (DELTA(2), (1, 8), [None, L(0, 3)], [None, L(0, 3, 2)], V(3)),
        (batched(CSR), (2, 3, 4), [None, None, L(0, 1, 1, 2, 0, 0, 2, 2).reshape(2, 4)],
         [None, None, L(1, 3, 1, 2).reshape(2, 2)], VB(2, 2)),
    ]
    for fmt, shape, pos, crd, values in good:
        a = SparseTensor(fmt, shape, pos, crd, values)
        b = SparseTensor(fmt, shape, pos, crd, values, check=False)
        assert torch.equal(a.to_dense(), b.to_dense())
    delta = SparseTensor(DELTA(2), (1, 8), [None, L(0, 3)], [None, L(0, 3, 2)], V(3))
    assert delta.to_dense().tolist() == [[1.0, 0, 0, 0, 2.0, 0, 0, 3.0]]


# --------------------------------------------------------------------------------------------
# Defects the validator must also catch
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "crd, what",
    [(L(3, 1, 0, 0), r"\(3,\) then \(1,\)"), (L(1, 1, 0, 0), r"\(1,\)")],
    ids=["unsorted", "duplicate"],
)
def test_ell_segments_are_checked_for_order_and_uniqueness(crd, what):
    """ELL's loose_compressed level is unique and ordered like CSR's compressed level."""
    with pytest.raises(ValidationError) as info:
        SparseTensor(ELL, (2, 4), [None, L(0, 2, 2, 3)], [None, crd], V(4))
    msg = str(info.value)
    assert "crd[1]" in msg and re.search(what, msg), msg


def test_delta_columns_past_the_shape_are_refused():
    """Gaps [3, 3] decode to columns 3 and 7 of a 4-column row: column 7 does not exist."""
    with pytest.raises(ValidationError) as info:
        SparseTensor(DELTA(2), (2, 4), [None, L(0, 2, 2)], [None, L(3, 3)], V(2))
    msg = str(info.value)
    assert "crd[1]" in msg and "7" in msg, msg


def test_delta31_with_int32_indices_validates():
    """bits=31 is allowed and int32 buffers can hold every gap up to 2**31 - 1."""
    pos = L(0, 1, 2, dtype=torch.int32)
    crd = L(2, 1, dtype=torch.int32)
    t = SparseTensor(DELTA(31), (2, 4), [None, pos], [None, crd], V(2))
    assert t.to_dense().tolist() == [[0, 0, 1.0, 0], [0, 2.0, 0, 0]]


def test_coo_singleton_out_of_range_is_reported_as_out_of_range():
    with pytest.raises(ValidationError) as info:
        SparseTensor(COO, (3, 4), [L(0, 3), None], [L(0, 0, 1), L(1, 5, 0)], V(3))
    msg = str(info.value)
    assert re.search(r"crd\[1\]\[1\] = 5 is out of range", msg), msg


def test_batched_errors_name_the_place_in_the_batched_buffer():
    """A defect in batch 1 of a (2, n) buffer is reported at its place there, with the values
    actually stored (not the offsets of an internal linearized copy)."""
    pos = L(0, 1, 1, 2, 0, 2, 1, 2).reshape(2, 4)  # batch 1 decreases: 2 > 1
    with pytest.raises(ValidationError) as info:
        SparseTensor(batched(CSR), (2, 3, 4), [None, None, pos], [None, None, L(1, 3, 1, 2).reshape(2, 2)], VB(2, 2))
    msg = str(info.value)
    assert re.search(r"= 2 > .* = 1", msg), msg
    crd = L(1, 3, 2, 9).reshape(2, 2)
    with pytest.raises(ValidationError) as info:
        SparseTensor(batched(CSR), (2, 3, 4), [None, None, L(0, 1, 1, 2, 0, 1, 1, 2).reshape(2, 4)],
                     [None, None, crd], VB(2, 2))
    msg = str(info.value)
    assert "= 9" in msg and ("[1, 1]" in msg or "[1][1]" in msg or "batch 1" in msg), msg


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_buffers_on_different_devices():
    with pytest.raises(ValidationError, match=r"crd\[1\] is on cuda.* but values are on cpu"):
        SparseTensor(CSR, (3, 4), [None, L(0, 1, 2, 3)], [None, L(0, 1, 2).cuda()], V(3))
    with pytest.raises(ValidationError, match=r"pos\[1\] is on cpu but values are on cuda"):
        SparseTensor(CSR, (3, 4), [None, L(0, 1, 2, 3)], [None, L(0, 1, 2).cuda()], V(3).cuda())
    t = SparseTensor(CSR, (3, 4), [None, L(0, 1, 2, 3).cuda()], [None, L(0, 1, 2).cuda()], V(3).cuda())
    with pytest.raises(ValidationError, match="new values are on cpu"):
        t.with_values(V(3))


def test_check_false_wraps_without_reading_contents():
    # A pattern that would fail every content check is wrapped as given; nothing is copied.
    pos, crd = L(0, 3, 1, 3), L(9, 9, -4)
    t = SparseTensor(CSR, (3, 4), [None, pos], [None, crd], V(3), check=False)
    assert t.pos(1) is pos and t.crd(1) is crd and t.nse == 3

"""The option records: one frozen, validated record per op family, and it is what plugins receive
(``request.options``); the public functions keep their keyword arguments."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.dispatch.options import (
    CallOptions, LogdetOptions, LstsqOptions, MatmulOptions, SolveOptions, SpectralOptions, defaults,
)
from sparsetorch.dispatch.plan import with_options
from sparsetorch.errors import InputError
from sparsetorch.testing.problems import poisson2d


@pytest.fixture
def A():
    return poisson2d(6, 6)


def test_each_op_hands_plugins_its_record(A):
    n = A.shape[0]
    b = torch.ones(n, dtype=A.dtype)
    cases = {
        "solve": (st.explain("solve", A, b), SolveOptions),
        "matmul": (st.explain("matmul", A, b), MatmulOptions),
        "eigsh": (st.explain("eigsh", A, 2, which="LA"), SpectralOptions),
        "eigs": (st.explain("eigs", A, 2), SpectralOptions),
        "lstsq": (st.explain("lstsq", A, b), LstsqOptions),
        "logdet": (st.explain("logdet", A), LogdetOptions),
    }
    for op, (table, cls) in cases.items():
        opts = table.request.options
        assert type(opts) is cls, (op, type(opts))
        with pytest.raises(Exception):
            opts.k = 3  # frozen
    solve = cases["solve"][0].request.options
    assert solve.rtol == 1e-10 and solve.get("rtol") == 1e-10  # the contract's default, resolved once
    spectral = cases["eigsh"][0].request.options
    assert (spectral.k, spectral.which, spectral.tol, spectral.generalized) == (2, "LA", 0.0, False)
    lst = cases["lstsq"][0].request.options
    assert lst.atol == lst.btol == 1e-10 and lst.conlim == 1e8


def test_records_validate_once_with_the_fix_in_the_message():
    with pytest.raises(InputError, match="k must be a positive int"):
        SpectralOptions(k=0)
    with pytest.raises(InputError, match="tol must be a non-negative number"):
        SpectralOptions(tol=-1.0)
    with pytest.raises(InputError, match="backend must be a name"):
        MatmulOptions(backend=3)
    with pytest.raises(InputError, match="method must be a name"):
        LogdetOptions(method=1.5)
    with pytest.raises(InputError, match="damp must be a finite number"):
        LstsqOptions(damp=-1.0)
    with pytest.raises(InputError, match="atol and btol are both 0"):
        LstsqOptions(atol=0.0, btol=0.0)
    with pytest.raises(InputError, match="conlim must be a positive number"):
        LstsqOptions(conlim=0)
    with pytest.raises(InputError, match="rtol and atol must be non-negative"):
        CallOptions(rtol=-1.0)


def test_the_public_functions_keep_their_keywords(A):
    n = A.shape[0]
    b = A.to_dense() @ torch.ones(n, dtype=A.dtype)
    x = st.lstsq(A, b, atol=1e-12, btol=1e-12)
    assert torch.allclose(A.to_dense() @ x, b, atol=1e-8)
    with pytest.raises(InputError, match="damp must be a finite number"):
        st.lstsq(A, b, damp=-1.0)
    w, _ = st.eigsh(A, 2, which="LA")
    ref = torch.linalg.eigvalsh(A.to_dense())[-2:]
    assert torch.allclose(w, ref, atol=1e-8)
    assert torch.allclose(st.matmul(A, b), A.to_dense() @ b)
    assert torch.allclose(st.logdet(A), torch.logdet(A.to_dense()))


def test_records_read_as_mappings_and_defaults_live_in_one_place():
    rec = SpectralOptions(k=3)
    assert rec["k"] == 3 and rec.get("which") == "LM" and rec.get("nope", 7) == 7 and "sigma" in rec
    assert dict(rec)["k"] == 3 and set(rec) == set(defaults(SpectralOptions))
    with pytest.raises(KeyError):
        rec["nope"]
    from sparsetorch.ops.lstsq import LSTSQ_DEFAULTS
    from sparsetorch.ops.solve import SOLVE_DEFAULTS

    assert SOLVE_DEFAULTS == defaults(SolveOptions)
    assert set(LSTSQ_DEFAULTS) == set(defaults(LstsqOptions)) - {"repeat"}


def test_core_changes_keep_the_record_type(A):
    table = st.explain("eigsh", A, 2)
    req = with_options(table.request, backend="torch", method="dense")
    assert type(req.options) is SpectralOptions
    assert (req.options.backend, req.options.method, req.options.k) == ("torch", "dense", 2)
    assert table.request.options.backend is None  # the original is untouched
    with pytest.raises(TypeError, match="no fields"):
        table.request.options.trusted_replace(nope=1)

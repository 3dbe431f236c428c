"""Matrix Market files of every header (session 28's sweep: an 'integer' file such as SuiteSparse's arrow.mtx
raised a ValidationError about int64 values; an 'array' file an AttributeError), and from_dense taking the
format's index-dtype preference. Reference: scipy.io.mmread."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
import torch

import sparsetorch as st
from sparsetorch.format import CSR, TensorFormat


@pytest.mark.parametrize("kind", ["integer", "real", "complex", "pattern", "array"])
def test_from_file_reads_every_matrix_market_kind(tmp_path, kind):
    rng = np.random.default_rng(0)
    D = (rng.random((7, 5)) < 0.4) * rng.integers(1, 9, (7, 5))
    path = tmp_path / "m.mtx"
    if kind == "array":
        scipy.io.mmwrite(str(path), D.astype(float))
    else:
        M = sp.coo_array(D.astype({"integer": np.int64, "real": float, "complex": complex, "pattern": float}[kind]))
        scipy.io.mmwrite(str(path), M, field=kind)
    A = st.SparseTensor.from_file(path)
    ref = scipy.io.mmread(str(path))
    ref = ref.toarray() if sp.issparse(ref) else np.asarray(ref)
    assert A.dtype in (torch.float64, torch.complex128)
    np.testing.assert_array_equal(A.to_dense().numpy(), ref.astype(A.to_dense().numpy().dtype))


def test_from_file_names_a_malformed_file(tmp_path):
    path = tmp_path / "bad.mtx"
    path.write_text("%%MatrixMarket matrix coordinate real general\n3 3 2\n1 1 1.0\n")
    with pytest.raises(st.InputError, match="not a readable Matrix Market file"):
        st.SparseTensor.from_file(path)


def test_from_dense_takes_the_formats_index_dtype():
    csr32 = TensorFormat.parse("(i, j) -> (i : dense, j : compressed)", index_dtype=torch.int32)
    A = st.SparseTensor.from_dense(torch.eye(3, dtype=torch.float64), csr32)
    assert A.index_dtype == torch.int32
    assert st.SparseTensor.from_dense(torch.eye(3, dtype=torch.float64), CSR).index_dtype == torch.int64
    assert st.SparseTensor.from_dense(torch.eye(3, dtype=torch.float64), csr32, index_dtype=torch.int64).index_dtype \
        == torch.int64

"""Sparse layers for PyTorch models: :class:`SparseLinear`, :func:`reformat_model`, pruners.

A :class:`SparseLinear` holds its weight as a :class:`~sparsetorch.SparseTensor` in any format of
the DSL: the pattern is fixed (index buffers, moved by ``.to()``, saved in the ``state_dict``),
the stored values are the trainable ``nn.Parameter``. Its forward pass is ``x @ W^T + b`` through
:func:`sparsetorch.matmul` (dispatch, a cached product plan, gradients for the values and ``x``).

:func:`reformat_model` replaces ``nn.Linear`` layers of a model in place, by a function that
decides per layer: return ``None`` to keep it, a ``SparseTensor`` (the new weight) or a module.
:func:`magnitude` and :func:`n_m` are such functions (unstructured magnitude pruning, N:M
structured pruning stored in the ``NM(n, m)`` format)::

    import sparsetorch as st
    st.nn.reformat_model(model, st.nn.magnitude(0.9))          # keep the largest 10 % per layer
    st.nn.reformat_model(model, st.nn.n_m(2, 4), only=lambda name, m: name.startswith("mlp"))
"""


from .linear import SparseLinear
from .prune import LayerFn, density, magnitude, n_m, prepare_compile, reformat_model
from .weight import SparseWeight

__all__ = ["SparseLinear", "SparseWeight", "reformat_model", "magnitude", "n_m", "density", "prepare_compile", "LayerFn"]

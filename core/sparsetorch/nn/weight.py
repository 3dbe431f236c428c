"""`SparseWeight`: a ``torch.Tensor`` standing for a SparseTensor in code written for dense weights.

``__torch_function__`` routes the operations of :data:`_HANDLERS` through sparsetorch (products
through dispatch and cached plans, elementwise operations that keep the pattern on the stored
values); anything else raises an error naming the operation (``.to_dense()`` first).
"""

from __future__ import annotations

import copy

import contextlib
from typing import Any

import torch

from .._after_import import after_import
from ..errors import InputError
from ..tensor import SparseTensor
from ..tensor._compiling import compiling
from ..ops.matmul import matmul
from .linear import amp_matmul, autocast_dtype, rows_times_transpose

__all__ = ["SparseWeight"]


class SparseWeight(torch.Tensor):
    """A ``torch.Tensor`` that stands for a SparseTensor in torch code written for dense weights.

    It is a wrapper without dense storage; ``__torch_function__`` runs these through sparsetorch
    (dispatch, cached plans, gradients into the SparseTensor's values), everything else raises
    an error naming the operation (use ``.to_dense()`` for it), since a silent densification of a
    large sparse weight would be a memory surprise:

    - products: ``torch.matmul``/``@`` (either side), ``mm``, ``mv``, ``nn.functional.linear``
      (as the weight), ``addmm``/``addmv`` (``beta * input + alpha * product``, the sparse
      operand being ``mat1``/``mat2``/``mat``; ``input`` of the product's dtype, as torch
      requires), ``dot`` (1-D); under ``torch.autocast`` each in the dtype torch's autocast
      lists give the dense op on that device (``mv``/``addmv`` stay float32 on the CPU);
    - 3-D weights (a SparseTensor with one value-batch dimension: ``B`` matrices sharing a
      pattern): ``bmm``, ``baddbmm`` and ``matmul`` against ``(B, n, k)``/``(B, k, m)`` operands;
    - views: ``.t()``/``.T``/``.mT`` (``.t()``/``.T`` of a 1-D weight is itself, as in torch;
      ``.mT``/``transpose(-2, -1)`` for 3-D);
    - metadata: ``shape``, ``dtype``, ``device``, ``dim()``, ``size()``, ``numel()``/``nelement()``
      (of the dense shape, as torch's sparse tensors), ``element_size()``/``itemsize`` (of a
      stored value);
    - values: ``mul_(s)`` scales the stored values in place (``s`` a number or a 0-d tensor;
      under ``torch.no_grad()`` when the values are a leaf that requires grad, as for a dense
      weight); ``zeros_like``/``ones_like`` give a SparseWeight on the same pattern whose stored
      entries are 0 / 1 (the zero matrix / the pattern's indicator, not a dense all-ones
      matrix), with ``dtype=``, ``device=`` and ``requires_grad=`` honoured;
    - elementwise operations that keep the pattern, each a new SparseWeight on the same pattern
      (shared index buffers) whose stored values are the result, differentiable in the values:
      ``W * s``/``s * W``/``torch.mul``/``W.mul`` and ``W / s``/``torch.div`` by a number or a
      0-d tensor, ``-W``/``torch.neg``, ``W.to(dtype)``/``W.to(device)``/``.double()``/
      ``.float()``/``.half()``/``.bfloat16()``/``.cpu()`` (``copy=True`` copies where nothing
      changes), ``W.detach()``/``W.data`` (values detached), ``W.clone()``/``torch.clone`` (index
      buffers and values copied);
    - serialization: ``torch.save``/``pickle`` store the SparseTensor (``torch.load(...,
      weights_only=True)`` loads it back, validating every buffer), ``copy.deepcopy`` copies
      it, and ``W.copy_(src)`` (what ``Module.load_state_dict`` calls for a SparseWeight buffer)
      writes ``src``'s values in place: ``src`` a SparseWeight on the same pattern
      (:meth:`SparseTensor.copy_`'s checks; its values cast to W's dtype), or a dense tensor of W's shape that is zero off
      W's pattern (a dense checkpoint of a pruned model; a nonzero off the pattern raises).

        W = st.nn.SparseWeight(A)              # A: a SparseTensor (m, n), values may require grad
        y = torch.nn.functional.linear(x, W)   # x @ A^T through sparsetorch
        y = torch.addmm(b, x, W.t())           # b + x @ A^T
    """

    _A: SparseTensor

    @staticmethod
    def __new__(cls, A: SparseTensor) -> "SparseWeight":
        if type(A).__name__ == "TracedTranspose":  # A.T inside a compiled region: a stand-in, not a SparseTensor
            raise InputError("SparseWeight: W.t() / W.T / W.mT / W.transpose inside a torch.compile region is not "
                             "supported (the transposed view cannot be traced); transpose outside the compiled "
                             "function, or write X @ W (docs/compile.md, 'Not under compile')")
        if (not isinstance(A, SparseTensor) or len(A.format_shape) not in (1, 2) or len(A.batch_shape) > 1
                or (A.batch_shape and len(A.format_shape) != 2)):
            raise InputError(f"SparseWeight needs a 1-D or 2-D SparseTensor, or a 2-D one with one value-batch "
                             f"dimension (a 3-D weight), got "
                             f"{type(A).__name__ if not isinstance(A, SparseTensor) else tuple(A.shape)}")
        t = torch.Tensor._make_wrapper_subclass(cls, tuple(A.shape), dtype=A.dtype, device=A.device,
                                                requires_grad=False)
        t._A = A
        return t

    @property
    def sparse(self) -> SparseTensor:
        """The SparseTensor this tensor stands for."""
        return self._A

    def to_dense(self, *args, **kwargs) -> torch.Tensor:  # noqa: D102 - torch's name
        return self._A.to_dense()

    def __reduce_ex__(self, protocol):  # noqa: D105 - pickle / torch.save: the SparseTensor, rebuilt
        return (_rebuild_sparse_weight, (self._A,))

    def __deepcopy__(self, memo):  # noqa: D105
        if id(self) in memo:
            return memo[id(self)]
        # the SparseTensor through the memo: a weight built on a module's Parameter keeps reading the
        # copy's Parameter (a clone of its own made the copied module untrainable; session 21's sweep)
        out = SparseWeight(copy.deepcopy(self._A, memo))
        memo[id(self)] = out
        return out

    # Product methods in Python (the same handlers as __torch_function__'s): under torch.compile
    # dynamo sees a SparseWeight as a plain object, and traces a Python method where it cannot
    # trace torch's C method.
    def mv(self, vec):  # noqa: D102 - torch's name
        return _mv(self, vec)

    def mm(self, mat2):  # noqa: D102
        return _mm(self, mat2)

    def matmul(self, other):  # noqa: D102
        return _matmul(self, other)

    def dim(self) -> int:  # noqa: D102
        return len(self._A.shape)

    def __repr__(self, *, tensor_contents=None) -> str:  # noqa: D105
        A = self._A
        return f"SparseWeight(shape={tuple(A.shape)}, format={A.format.name or A.format}, nse={A.nse}, dtype={A.dtype})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # dynamo hands ``W @ x`` over as ``Tensor.__rmatmul__(x, W)``, and its lookup of that key in
        # the table misses under torch.compile: compared by identity first
        handler = _rmatmul if func is torch.Tensor.__rmatmul__ else _HANDLERS.get(func)
        if handler is None:
            name = getattr(func, "__name__", str(func))
            if name in ("__get__", "__set__") or name.startswith("_"):  # attribute plumbing (shape, dtype, ...)
                with torch._C.DisableTorchFunctionSubclass():
                    return func(*args, **kwargs)
            if name in ("requires_grad_", "retain_grad", "grad", "requires_grad", "register_hook"):
                raise InputError(f"SparseWeight does not implement {name}: its trainable tensor is W.sparse.values "
                                 f"(set requires_grad / hooks on it, read its .grad; nn.Parameter(W.sparse.values) "
                                 f"makes it a module's parameter), not a dense copy")
            raise InputError(f"SparseWeight does not implement {name}: it runs matmul/@, mm, mv, linear, addmm, addmv, "
                             f"dot, bmm, baddbmm, t/T/mT/transpose(-2, -1), mul_, zeros_like, ones_like, mul/div by a "
                             f"scalar, neg, to, detach/data, clone, copy_, numel/nelement and element_size through "
                             f"sparsetorch; call .to_dense() first for other operations")
        return handler(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # reached only by operations __torch_function__ let through (attribute plumbing aside,
        # none should get here): the wrapper has no dense storage to run them on
        raise InputError(f"SparseWeight does not implement {func}: use .to_dense() first")


def _ndim(t: torch.Tensor) -> int:
    """``t.dim()``, for a SparseWeight from its SparseTensor (what torch.compile can trace)."""
    return len(t._A.shape) if isinstance(t, SparseWeight) else t.dim()


def _dense_operand(x: object, what: str) -> torch.Tensor:
    if isinstance(x, SparseWeight) or not isinstance(x, torch.Tensor):
        raise InputError(f"SparseWeight.{what}: the other operand must be a dense torch.Tensor, got {type(x).__name__}")
    return x


#: the products autocast runs in its lower precision, as torch's autocast op lists have them per device
#: type: on the CPU ``mv``/``addmv`` (and ``dot``) stay in the operands' dtype, on CUDA (and the other
#: devices, whose lists follow CUDA's) ``mv``/``addmv`` are cast too; ``dot`` is on neither list
_AMP_OPS_CPU = frozenset({"matmul", "mm", "addmm", "linear", "bmm", "baddbmm"})
_AMP_OPS = _AMP_OPS_CPU | {"mv", "addmv"}


def _amp(what: str, device_type: str) -> bool:
    """Whether autocast (where it is on) casts the operands of torch's ``what`` on ``device_type``."""
    return what in (_AMP_OPS_CPU if device_type == "cpu" else _AMP_OPS)


def _left(W: SparseWeight, X: torch.Tensor, what: str) -> torch.Tensor:
    """``W @ X`` for X of shape (n,) or (n, k)."""
    X = _dense_operand(X, what)
    if X.dim() not in (1, 2) or len(W._A.format_shape) != 2 or W._A.batch_shape:
        raise InputError(f"SparseWeight.{what}: needs a 2-D sparse matrix and a 1-D or 2-D dense operand, got "
                         f"{tuple(W.shape)} and {tuple(X.shape)}")
    dev = X.device.type
    if _amp(what, dev) or not torch.is_autocast_enabled(dev):
        return amp_matmul(W._A, X)
    # an op autocast leaves alone on this device (torch.mv under CPU autocast stays float32): the product in
    # the operands' own dtype, with autocast off inside it so the backends' dense ops are not cast either
    with torch.autocast(dev, enabled=False):
        return matmul(W._A, X)


def _right(X: torch.Tensor, W: SparseWeight, what: str) -> torch.Tensor:
    """``X @ W`` = ``(W^T @ X^T)^T`` for X of shape (..., m)."""
    X = _dense_operand(X, what)
    if len(W._A.format_shape) != 2 or W._A.batch_shape or X.shape[-1] != W.shape[0]:
        raise InputError(f"SparseWeight.{what}: shapes {tuple(X.shape)} @ {tuple(W.shape)} do not match (a 2-D "
                         f"sparse weight on the right of a (..., {W.shape[0]}) operand)")
    if compiling():  # the SparseTensor's own operator: no transposed view in the graph
        A = W._A
        dt = autocast_dtype(X.device.type, X.dtype, A.dtype)
        if dt is None:
            return X @ A
        with torch.autocast(X.device.type, enabled=False):  # as amp_matmul: both operands in autocast's dtype
            return X.to(dt) @ (A if A.dtype == dt else A.with_values(A.values.to(dt)))
    return rows_times_transpose(X, W._A.T)


def _matmul(a, b, *, out=None):
    if out is not None:
        raise InputError("SparseWeight: out= is not supported")
    if isinstance(a, SparseWeight):
        if a._A.format_shape and len(a._A.format_shape) == 1:
            return _dot(a, b)
        if a._A.batch_shape:
            return _bmm(a, b)
        if isinstance(b, torch.Tensor) and not isinstance(b, SparseWeight) and b.dim() >= 3 and \
                len(a._A.format_shape) == 2 and b.shape[-2] == a.shape[1]:
            # torch.matmul broadcasts a 2-D matrix over a batched right operand (..., n, k), as st.matmul does
            return amp_matmul(a._A, b)
        return _left(a, b, "matmul")
    if isinstance(b, SparseWeight) and b._A.batch_shape:
        return _bmm(a, b)
    if isinstance(b, SparseWeight) and len(b._A.format_shape) == 1:
        return _dot(b, a)  # dense 1-D @ sparse 1-D: the dot product, as torch.matmul of two vectors
    return _right(a, b, "matmul")


def _mv(a, b, *, out=None):
    """``torch.mv``: a 2-D weight times a 1-D vector only (torch refuses other ranks: "vector + matrix @ vector")."""
    _no_out(out, "mv")
    if not isinstance(a, SparseWeight) or isinstance(b, SparseWeight):
        raise InputError("SparseWeight.mv: the SparseWeight must be the matrix (first) operand")
    if not isinstance(b, torch.Tensor) or b.dim() != 1:
        raise InputError(f"SparseWeight.mv: needs a 1-D vector, got "
                         f"{tuple(b.shape) if isinstance(b, torch.Tensor) else type(b).__name__} (torch.mv's rule; "
                         f"use @ or mm for a matrix)")
    return _left(a, b, "mv")


def _mm(a, b, *, out=None):
    """``torch.mm``: two 2-D operands only, as torch (a vector or a batch is matmul's business)."""
    _no_out(out, "mm")
    for t in (a, b):
        nd = _ndim(t) if isinstance(t, torch.Tensor) else -1
        if nd != 2 or (isinstance(t, SparseWeight) and t._A.batch_shape):
            raise InputError(f"SparseWeight.mm: needs two 2-D matrices (torch.mm's rule), got an operand of shape "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}; use @ / matmul "
                             f"for vectors and batches")
    return _matmul(a, b)


def _rmatmul(a, b):
    """``Tensor.__rmatmul__(a, b)``, which is ``b @ a`` (the SparseWeight on either side)."""
    return _matmul(b, a)


def _linear(x, weight, bias=None):
    if not isinstance(weight, SparseWeight):
        raise InputError("SparseWeight: linear with a SparseWeight input and a dense weight is not supported")
    if len(weight._A.format_shape) != 2 or not isinstance(x, torch.Tensor) or x.shape[-1] != weight.shape[1]:
        raise InputError(f"SparseWeight.linear: input {tuple(getattr(x, 'shape', ()))} does not end with "
                         f"in_features={weight.shape[-1]}")
    y = rows_times_transpose(x, weight._A)
    if bias is None:
        return y
    if not isinstance(bias, torch.Tensor) or isinstance(bias, SparseWeight):
        raise InputError(f"SparseWeight.linear: bias must be a dense torch.Tensor, got {type(bias).__name__}")
    try:
        fits = torch.broadcast_shapes(tuple(y.shape), tuple(bias.shape)) == tuple(y.shape)
    except RuntimeError:
        fits = False
    if not fits:  # F.linear adds the bias to the output without changing its shape
        raise InputError(f"SparseWeight.linear: a bias of shape {tuple(bias.shape)} does not broadcast to the output "
                         f"{tuple(y.shape)} (out_features={weight.shape[0]})")
    if bias.dtype != y.dtype and bias.dim():
        # under autocast F.linear casts a (non-float64) bias with the product (a float32 bias made a bfloat16
        # product float32; session 21's sweep); otherwise it refuses a bias of another dtype, as here (a float64
        # bias made the product float64; session 26's sweep). A 0-d bias adds without promoting, as in torch.
        if not (bias.is_floating_point() and bias.dtype != torch.float64 and y.is_floating_point()
                and torch.is_autocast_enabled(y.device.type)):
            raise InputError(f"SparseWeight.linear: the bias is {bias.dtype} and the product {y.dtype} (F.linear "
                             f"takes one dtype); cast the bias")
        bias = bias.to(y.dtype)
    return y + bias


def _dot(a, b, *, out=None):
    if isinstance(b, SparseWeight):
        a, b = b, a
    A = a._A
    x = _dense_operand(b, "dot")
    if len(A.format_shape) != 1 or x.dim() != 1 or x.shape[0] != A.shape[0]:
        raise InputError(f"SparseWeight.dot: needs two 1-D operands of one length, got {tuple(a.shape)} and {tuple(x.shape)}")
    coords, vals = A.coordinates()
    return (vals * x[coords[0]]).sum()


def _transposed(W, *args):
    if len(W._A.format_shape) == 1:  # torch: t()/T of a 1-D tensor is the tensor itself
        return W
    return SparseWeight(W._A.T)


def _mT(W):
    if len(W._A.format_shape) == 1:
        raise InputError("SparseWeight.mT needs a matrix (2-D or 3-D), got a 1-D weight; use .t() or .T")
    return SparseWeight(W._A.T)


def _transpose(W, dim0: int, dim1: int):
    if not isinstance(W, SparseWeight):
        raise InputError("SparseWeight: transpose of a dense tensor with a SparseWeight argument is not supported")
    nd = _ndim(W)
    if nd == 1 and dim0 in (0, -1) and dim1 in (0, -1):
        return W
    if sorted((dim0 % nd, dim1 % nd)) != [nd - 2, nd - 1]:
        raise InputError(f"SparseWeight.transpose swaps the two matrix dimensions ({nd - 2}, {nd - 1}) only, "
                         f"got ({dim0}, {dim1}); the value batch keeps its place")
    return SparseWeight(W._A.T)


def _t_strict(W):
    if _ndim(W) == 3:
        raise InputError("SparseWeight.t() takes a 1-D or 2-D weight (as torch.t does); use .mT for a 3-D weight")
    return _transposed(W)


def _scaled(alpha, beta, product: torch.Tensor, input: torch.Tensor | None, what: str) -> torch.Tensor:
    """``beta * input + alpha * product``; ``beta == 0`` ignores ``input``'s values (NaN included), as
    torch. ``input`` has the product's dtype, as torch's ``what`` requires (beta 0 or not), except that
    under autocast, for an op on its device's list, a floating input other than float64 is cast to the
    autocast dtype with the operands (as autocast casts it)."""
    out = product if alpha == 1 else alpha * product
    if input is None:
        return out
    if isinstance(input, SparseWeight):
        raise InputError(f"SparseWeight.{what}: the added input must be dense (adding a sparse weight to a dense "
                         f"product would densify it); call .to_dense() first")
    if not isinstance(input, torch.Tensor):
        raise InputError(f"SparseWeight.{what}: the added input must be a tensor, got {type(input).__name__}")
    if input.dtype != out.dtype:
        dev = input.device.type
        if (_amp(what, dev) and input.is_floating_point() and input.dtype != torch.float64
                and autocast_dtype(dev, input.dtype) == out.dtype):
            input = input.to(out.dtype)  # autocast casts addmm's input too
        else:
            # torch refuses the mix rather than promote (a float64 input made the product float64; session 28's sweep)
            raise InputError(f"SparseWeight.{what}: the added input is {input.dtype} and the product {out.dtype} "
                             f"(torch.{what} takes one dtype); cast the input")
    if not isinstance(beta, torch.Tensor) and beta == 0:
        return out
    return out + (input if (not isinstance(beta, torch.Tensor) and beta == 1) else beta * input)


def _no_out(out, what: str) -> None:
    if out is not None:
        raise InputError(f"SparseWeight.{what}: out= is not supported (the result is a new tensor)")


def _addmm(input, mat1, mat2, *, beta=1, alpha=1, out=None):
    _no_out(out, "addmm")
    if isinstance(mat1, SparseWeight) == isinstance(mat2, SparseWeight):
        raise InputError("SparseWeight.addmm: exactly one of mat1, mat2 may be sparse")
    if _ndim(mat1) != 2 or _ndim(mat2) != 2:
        raise InputError(f"SparseWeight.addmm: mat1 and mat2 must be 2-D, got {tuple(mat1.shape)} and {tuple(mat2.shape)}")
    prod = _left(mat1, mat2, "addmm") if isinstance(mat1, SparseWeight) else _right(mat1, mat2, "addmm")
    return _scaled(alpha, beta, prod, input, "addmm")


def _addmv(input, mat, vec, *, beta=1, alpha=1, out=None):
    _no_out(out, "addmv")
    if not isinstance(mat, SparseWeight) or _ndim(mat) != 2:
        raise InputError("SparseWeight.addmv: mat must be the 2-D SparseWeight and vec a dense 1-D tensor")
    if not isinstance(vec, torch.Tensor) or vec.dim() != 1:
        raise InputError(f"SparseWeight.addmv: vec must be a 1-D dense tensor, got {tuple(getattr(vec, 'shape', ()))}")
    return _scaled(alpha, beta, _left(mat, vec, "addmv"), input, "addmv")


def _bmm(a, b, *, out=None):
    """``(B, m, n) @ (B, n, k)`` with the sparse operand on either side (a value batch of B
    matrices on one pattern); the dense operand's batch must be B (no broadcasting)."""
    _no_out(out, "bmm")
    if isinstance(a, SparseWeight) == isinstance(b, SparseWeight):
        raise InputError("SparseWeight.bmm: exactly one operand may be sparse")
    W, X = (a, b) if isinstance(a, SparseWeight) else (b, a)
    X = _dense_operand(X, "bmm")
    A = W._A
    if not A.batch_shape or X.dim() != 3 or X.shape[0] != A.batch_shape[0]:
        raise InputError(f"SparseWeight.bmm: needs a 3-D sparse weight (B, m, n) and a 3-D dense operand with the "
                         f"same B, got {tuple(a.shape)} and {tuple(b.shape)}")
    if W is a:
        if X.shape[1] != A.shape[-1]:
            raise InputError(f"SparseWeight.bmm: shapes {tuple(a.shape)} @ {tuple(b.shape)} do not match")
        return amp_matmul(A, X)
    if X.shape[2] != A.shape[-2]:
        raise InputError(f"SparseWeight.bmm: shapes {tuple(a.shape)} @ {tuple(b.shape)} do not match")
    return amp_matmul(A.T, X.mT).mT  # X W = (W^T X^T)^T, per batch member


def _baddbmm(input, batch1, batch2, *, beta=1, alpha=1, out=None):
    _no_out(out, "baddbmm")
    return _scaled(alpha, beta, _bmm(batch1, batch2), input, "baddbmm")


def _mul_(W, other):
    if not isinstance(W, SparseWeight):
        raise InputError("SparseWeight: mul_ into a dense tensor by a SparseWeight is not supported")
    if isinstance(other, torch.Tensor) and (isinstance(other, SparseWeight) or other.dim() != 0):
        raise InputError(f"SparseWeight.mul_ scales by a number or a 0-d tensor (which keeps the pattern), got "
                         f"a tensor of shape {tuple(other.shape)}")
    if not isinstance(other, (int, float, complex, torch.Tensor)) or isinstance(other, bool):
        raise InputError(f"SparseWeight.mul_ scales by a number or a 0-d tensor, got {type(other).__name__}")
    W._A.values.mul_(other)  # padding slots hold zeros and stay zero
    return W


def _like(fill: float):
    def like(W, *, dtype=None, layout=None, device=None, requires_grad=False, memory_format=None, pin_memory=None):
        what = "zeros_like" if fill == 0 else "ones_like"
        if not isinstance(W, SparseWeight):
            raise InputError(f"SparseWeight: {what} got a {type(W).__name__}")
        if layout not in (None, torch.strided) or pin_memory:
            raise InputError(f"SparseWeight.{what}: layout/pin_memory are not supported; use .to_dense() for a dense result")
        A = W._A.detach()
        if device is not None:
            A = A.to(device)
        vals = torch.zeros_like(A.values, dtype=dtype)
        if fill != 0:
            _, slot = A.entries()  # the stored entries inside the shape; padding stays zero
            vals[..., slot] = fill
        return SparseWeight(A.with_values(vals.requires_grad_(requires_grad)))
    return like


# Elementwise operations that keep the pattern ------------------------------------------------------
def _scalar(other: object, what: str) -> object:
    if isinstance(other, torch.Tensor) and (isinstance(other, SparseWeight) or other.dim() != 0):
        raise InputError(f"SparseWeight.{what} takes a number or a 0-d tensor (which keeps the pattern), got a tensor "
                         f"of shape {tuple(other.shape)}; call .to_dense() first for an elementwise product")
    if isinstance(other, bool) or not isinstance(other, (int, float, complex, torch.Tensor)):
        raise InputError(f"SparseWeight.{what} takes a number or a 0-d tensor, got {type(other).__name__}")
    return other


def _on_values(W: "SparseWeight", values: torch.Tensor) -> "SparseWeight":
    return SparseWeight(W._A.with_values(values))


def _mul(a, b, *, out=None):
    _no_out(out, "mul")
    W, s = (a, b) if isinstance(a, SparseWeight) else (b, a)
    if isinstance(s, SparseWeight):
        raise InputError("SparseWeight.mul of two sparse weights is not supported (one operand must be a scalar)")
    return _on_values(W, W._A.values * _scalar(s, "mul"))


def _div(a, b, *, rounding_mode=None, out=None):
    _no_out(out, "div")
    if not isinstance(a, SparseWeight):
        raise InputError("SparseWeight: a number divided by a SparseWeight would divide by its zeros; only W / s "
                         "(a scalar divisor) keeps the pattern")
    if rounding_mode is not None:
        raise InputError(f"SparseWeight.div: rounding_mode={rounding_mode!r} is not supported (floating values only)")
    return _on_values(a, a._A.values / _scalar(b, "div"))


def _neg(W, *, out=None):
    _no_out(out, "neg")
    return _on_values(W, -W._A.values)


def _to(W, *args, **kwargs):
    kwargs.pop("memory_format", None)
    copy = bool(kwargs.pop("copy", False))
    if len(args) >= 3 and isinstance(args[-1], bool) and isinstance(args[-2], bool):
        copy = copy or args[-1]  # Tensor.to(dtype, non_blocking, copy) / to(device, dtype, non_blocking, copy)
    # nn.Module._apply calls t.to(device, None, non_blocking) for a buffer that keeps its dtype
    args = tuple(a for a in args if a is not None and not isinstance(a, bool))
    kwargs = {k: v for k, v in kwargs.items() if v is not None and k != "non_blocking"}
    A = W._A.to(*args, **kwargs) if args or kwargs else W._A
    if A is W._A:
        # nothing to convert: W itself, or with copy=True a new weight, as torch returns a new tensor then (W
        # itself came back, and writing the "copy" wrote W; session 28's sweep)
        return SparseWeight(A.clone()) if copy else W
    return SparseWeight(A)


def _cast(dtype: torch.dtype):
    def cast(W, memory_format=None):
        return _to(W, dtype)
    return cast


def _detach(W):
    return SparseWeight(W._A.detach())


def _numel(W) -> int:
    n = 1
    for d in W._A.shape:
        n *= int(d)
    return n


def _clone(W, *, memory_format=None):
    return SparseWeight(W._A.clone())


def _copy_(W, src, non_blocking: bool = False):
    """``W.copy_(src)`` in place: ``src`` a SparseWeight on W's pattern, or a dense tensor of W's
    shape that is zero off the pattern (its entries on the pattern become the stored values)."""
    if not isinstance(W, SparseWeight):
        raise InputError("SparseWeight: copy_ of a SparseWeight into a dense tensor is not supported; "
                         "use dense.copy_(W.to_dense())")
    A = W._A
    if isinstance(src, SparseWeight):
        # cast as torch's copy_ does (load_state_dict of a bfloat16 checkpoint into a float32 module raised; session
        # 28's sweep); the pattern and everything else are SparseTensor.copy_'s checks
        A.copy_(src._A if src._A.dtype == A.dtype else src._A.to(A.dtype))
        return W
    if not isinstance(src, torch.Tensor):
        raise InputError(f"SparseWeight.copy_ takes a SparseWeight or a dense tensor, got {type(src).__name__}")
    if tuple(src.shape) != tuple(A.shape):
        raise InputError(f"SparseWeight.copy_: the source has shape {tuple(src.shape)}, the weight {tuple(A.shape)}")
    if src.layout != torch.strided:
        src = src.to_dense()
    src = src.to(device=A.device, dtype=A.dtype)
    coords, slots = A.entries()
    nb = len(A.batch_shape)
    on_pattern = src[(Ellipsis, *coords)] if nb else src[tuple(coords)]
    off = src.clone()
    if nb:
        off[(Ellipsis, *coords)] = 0
    else:
        off[tuple(coords)] = 0
    if bool((off != 0).any()):
        at = [int(v) for v in (off != 0).nonzero()[0]]
        raise InputError(f"SparseWeight.copy_: the dense source has a nonzero at {tuple(at)}, off the weight's "
                         f"sparsity pattern ({int((off != 0).sum())} such entries); copying would lose them. Prune "
                         f"the source to the pattern first, or build a new weight (SparseTensor.from_dense)")
    values = A.values
    with torch.no_grad() if values.requires_grad and values.is_leaf else contextlib.nullcontext():
        values[..., slots] = on_pattern
    return W


def _rebuild_sparse_weight(A: SparseTensor) -> "SparseWeight":
    """Unpickling of a :class:`SparseWeight` (``torch.load(weights_only=True)`` included)."""
    if not isinstance(A, SparseTensor):
        raise InputError(f"a pickled SparseWeight holds a SparseTensor, got {type(A).__name__}")
    return SparseWeight(A)


torch.serialization.add_safe_globals([_rebuild_sparse_weight])



_HANDLERS: dict = {
    torch.matmul: _matmul,
    torch.Tensor.matmul: _matmul,
    torch.Tensor.__matmul__: _matmul,
    torch.Tensor.__rmatmul__: _rmatmul,
    torch.mm: _mm,
    torch.Tensor.mm: _mm,
    torch.mv: _mv,
    torch.Tensor.mv: _mv,
    torch.nn.functional.linear: _linear,
    torch.dot: _dot,
    torch.Tensor.dot: _dot,
    torch.t: _t_strict,
    torch.Tensor.t: _t_strict,
    # metadata read from the SparseTensor: its values may require grad (the wrapper never does: it is not in the
    # graph), and a module's .double() / .to(device) converts the Parameter the values are, not the wrapper's
    # creation-time fields (session 26's sweep: W.requires_grad was False, W.dtype float32 after net.double())
    torch.Tensor.requires_grad.__get__: lambda W: W._A.values.requires_grad,
    torch.Tensor.dtype.__get__: lambda W: W._A.dtype,
    torch.Tensor.device.__get__: lambda W: W._A.device,
    torch.Tensor.T.__get__: _t_strict,
    torch.Tensor.mT.__get__: _mT,
    torch.transpose: _transpose,
    torch.Tensor.transpose: _transpose,
    torch.addmm: _addmm,
    torch.Tensor.addmm: _addmm,
    torch.addmv: _addmv,
    torch.Tensor.addmv: _addmv,
    torch.bmm: _bmm,
    torch.Tensor.bmm: _bmm,
    torch.baddbmm: _baddbmm,
    torch.Tensor.baddbmm: _baddbmm,
    torch.Tensor.mul_: _mul_,
    torch.Tensor.dim: lambda W: len(W.shape),
    torch.Tensor.size: lambda W, dim=None: W.shape if dim is None else W.shape[dim],
    # sizes as torch's sparse tensors report them: numel of the dense shape, the element size of the values' dtype
    torch.Tensor.numel: _numel,
    torch.Tensor.nelement: _numel,
    torch.numel: _numel,
    torch.Tensor.element_size: lambda W: W._A.values.element_size(),
    # W.data: W detached, as for a dense tensor (it reached aten.detach and raised a confusing error)
    torch.Tensor.data.__get__: _detach,
    torch.zeros_like: _like(0.0),
    torch.ones_like: _like(1.0),
    torch.mul: _mul,
    torch.multiply: _mul,
    torch.Tensor.mul: _mul,
    torch.Tensor.multiply: _mul,
    torch.Tensor.__mul__: _mul,
    torch.Tensor.__rmul__: _mul,
    torch.div: _div,
    torch.divide: _div,
    torch.true_divide: _div,
    torch.Tensor.div: _div,
    torch.Tensor.divide: _div,
    torch.Tensor.__truediv__: _div,
    torch.Tensor.__rtruediv__: lambda W, other: _div(other, W),
    torch.neg: _neg,
    torch.negative: _neg,
    torch.Tensor.neg: _neg,
    torch.Tensor.negative: _neg,
    torch.Tensor.__neg__: _neg,
    torch.Tensor.to: _to,
    # what nn.Module._apply asks of a buffer before .to(...) / .double() / .half() (a module holding a
    # SparseWeight buffer raised on model.to("cpu"); session 21's sweep)
    torch.Tensor.is_floating_point: lambda W: W._A.dtype.is_floating_point,
    torch.is_floating_point: lambda W: W._A.dtype.is_floating_point,
    torch.Tensor.is_complex: lambda W: W._A.dtype.is_complex,
    torch.is_complex: lambda W: W._A.dtype.is_complex,
    torch.Tensor.cuda: lambda W, device=None, non_blocking=False, memory_format=None: _to(
        W, torch.device("cuda") if device is None else torch.device("cuda", device) if isinstance(device, int) else device),
    torch.Tensor.cpu: lambda W, memory_format=None: _to(W, "cpu"),
    torch.Tensor.double: _cast(torch.float64),
    torch.Tensor.float: _cast(torch.float32),
    torch.Tensor.half: _cast(torch.float16),
    torch.Tensor.bfloat16: _cast(torch.bfloat16),
    **({torch.Tensor.itemsize.__get__: lambda W: W._A.values.element_size()}
       if hasattr(torch.Tensor, "itemsize") else {}),
    torch.detach: _detach,
    torch.Tensor.detach: _detach,
    torch.clone: _clone,
    torch.Tensor.clone: _clone,
    torch.Tensor.copy_: _copy_,
}


def _skip_frames(eval_frame: Any) -> None:
    """Keep dynamo from compiling ``SparseWeight.__torch_function__`` as a frame of its own (it still inlines
    it into the frames it traces: the products compile with ``fullgraph=True``). A user frame that falls back
    to eager (``W / 2``: a graph break on the subclass) called it from eager code, dynamo compiled that call
    with the first operation's handler as a constant, and replayed it for the next operation of another kind
    without a guard on ``func``: ``(W / 2) * 3`` compiled to ``W / 6``, ``(W * 2) / 4`` to ``8 W`` (session
    26's sweep). Skipped, each such call runs eagerly with its own ``func``; the handlers it calls may still
    be compiled, each on its own code. ``skip_code`` is dynamo's own switch (a private module: where it is
    missing, nothing changes); applied when dynamo loads (``_after_import``)."""
    skip = getattr(eval_frame, "skip_code", None)
    if callable(skip):
        skip(SparseWeight.__dict__["__torch_function__"].__func__.__code__)


after_import("torch._dynamo.eval_frame", _skip_frames)

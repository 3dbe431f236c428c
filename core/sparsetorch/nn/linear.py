"""`SparseLinear`: ``y = x @ W^T + b`` with a sparse weight whose stored values are the parameter.

A layer keeps one planned product per batch size (:meth:`SparseLinear.plans` lists them). A call
that records no gradient runs that plan's ``set_values`` and ``apply`` directly (no dispatch, no
autograd Function); a call that does goes through the product's autograd Function on the same
plan. On a CUDA device the plan for a batch size is chosen by timing every capable backend's
product once (GPU time, :data:`LAYER_TUNE_CUDA`), since the cost models' per-call host estimates
differ by backend (measured on the H200: dispatch with the layer's 1000-call amortization picked
the torch backend for a 2:4 weight at 64 us per call where the cuda kernels plugin takes 8 us),
and a CSR pattern with int64 indices is planned on an int32 copy of them.

Under ``torch.autocast`` the layer runs as ``nn.Linear`` does: the input, the stored values and
the bias cast to the autocast dtype (bfloat16 on CPU by default), the product in that dtype with
float32 accumulation, the output in that dtype; float64 layers are left alone, as autocast does.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch import nn
from torch.autograd import forward_ad as _forward_ad

from ..autograd.matmul import MatmulHandle, matmul_function
from ..dispatch.options import MatmulOptions
from ..dispatch.plan import PlanState, obtain_plan, plan_for
from ..errors import BackendError, InputError, SparseTorchError
from ..format import CSR, TensorFormat
from ..ops.matmul import autocast_dtype, matmul, matmul_request
from ..tensor import SparseTensor
from ..tensor._compiling import compiling
from ..tensor.pattern import is_plain, version_of, vmapped

#: whether a torch.func transform (vmap, grad, jacrev, ...) is active (the layer's planned product then steps aside)
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None) or (lambda: False)
#: the state of torch.jit.trace's recording (None when not tracing)
_jit_tracing = torch._C._get_tracing_state

#: calls a layer's product is priced over when its plan is chosen (a layer is called once per
#: step or token: one-time setups such as a conversion or a kernel's packing are spread over them)
LAYER_REPEAT = 1000
#: planned products kept per layer (one per batch size seen, most recent first)
LAYER_HANDLES = 8
#: held while a layer's planned products are added or evicted (a miss only: a call that finds its plan
#: takes no lock), so that threads sharing a layer do not evict the same plan twice
_HANDLES_LOCK = threading.Lock()
#: on a CUDA device, when dispatch finds more than one capable backend and none is pinned, a
#: layer's plan for a batch size is chosen by timing each candidate's product on the GPU (once,
#: at the first call with that batch size; see :meth:`SparseLinear.plans`); False: dispatch's
#: cost models choose, as on the CPU
LAYER_TUNE_CUDA = True
#: products timed per candidate when tuning (after one warm-up call)
TUNE_REPEATS = 20

__all__ = ["SparseLinear", "rows_times_transpose", "amp_matmul", "autocast_dtype", "LAYER_TUNE_CUDA"]


class SparseLinear(nn.Module):
    """``y = x @ W^T + b`` with a sparse ``W`` of shape ``(out_features, in_features)``.

    Args:
        weight: the weight as a 2-D SparseTensor (any format); its pattern is kept, its values
            become the trainable parameter ``values`` (a copy: the argument is not modified).
        bias: ``(out_features,)`` or None; copied into a parameter.
        backend: pin the product's backend (default: dispatch by cost).
    """

    def __init__(self, weight: SparseTensor, bias: torch.Tensor | None = None, *, backend: str | None = None) -> None:
        super().__init__()
        if not isinstance(weight, SparseTensor) or len(weight.format_shape) != 2 or weight.batch_shape:
            got = (type(weight).__name__ if not isinstance(weight, SparseTensor)
                   else f"format shape {weight.format_shape}, batch {tuple(weight.batch_shape)}")
            raise InputError(f"SparseLinear: weight must be a 2-D SparseTensor (out_features, in_features) "
                             f"without a value batch, got {got}")
        out_features, in_features = (int(s) for s in weight.format_shape)
        if bias is not None:
            if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (out_features,):
                raise InputError(f"SparseLinear: bias must have shape ({out_features},) (out_features), got "
                                 f"{tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__}")
            if bias.dtype != weight.dtype or bias.device != weight.device:
                raise InputError(f"SparseLinear: bias ({bias.dtype}, {bias.device}) must match the weight "
                                 f"({weight.dtype}, {weight.device})")
        self.in_features, self.out_features = in_features, out_features
        self.backend = backend
        self._format: TensorFormat = weight.format
        w = weight.detach()
        for k in range(len(w.format.levels)):
            p, c = w.pos(k), w.crd(k)
            self.register_buffer(f"pos{k}", None if p is None else p.clone())
            self.register_buffer(f"crd{k}", None if c is None else c.clone())
        self.values = nn.Parameter(w.values.clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        self.weight  # noqa: B018 - the pattern object, built now: a compiled region reads it without building

    def __setattr__(self, name: str, value) -> None:  # type: ignore[no-untyped-def]
        super().__setattr__(name, value)
        if name == "values" or (name[:3] in ("pos", "crd") and name[3:].isdigit()):
            # an index buffer or the values replaced (load_state_dict(assign=True), a direct assignment): the
            # pattern object a compiled region reads is rebuilt now (it kept the old pattern: a silent wrong
            # product, session 22's sweep); during __init__ the buffers are not all there yet
            if self.__dict__.pop("_pattern", None) is not None and not compiling():
                self.weight  # noqa: B018

    # The weight's format travels with the state dict ("_extra_state"): CSR and CSC layers of a square weight have
    # index buffers of the same names and shapes that mean different things, and a CSC checkpoint loaded into a CSR
    # layer multiplied by W^T without a word (session 32's sweep).
    def get_extra_state(self) -> dict:
        return {"format": str(self._format)}

    def set_extra_state(self, state) -> None:  # type: ignore[no-untyped-def]
        pass  # checked before anything is loaded (_load_from_state_dict)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,  # type: ignore[no-untyped-def]
                              unexpected_keys, error_msgs) -> None:
        key = prefix + "_extra_state"
        saved = state_dict.get(key)
        got = saved.get("format") if isinstance(saved, dict) else None
        if got is not None and got != str(self._format):
            error_msgs.append(f"SparseLinear ({prefix or 'the module'}): the checkpoint's weight is stored in the format "
                              f"{got}, this layer's in {self._format}; their index buffers mean different things (a CSC "
                              f"weight read as CSR is W^T). Nothing of this layer was loaded: build it in the "
                              f"checkpoint's format, or load the checkpoint into such a layer and convert its weight")
            return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if key not in state_dict and key in missing_keys:
            missing_keys.remove(key)  # a checkpoint written before the format was recorded: nothing to compare

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def]
        out = super()._apply(fn, recurse)
        self.__dict__.pop("_pattern", None)  # buffers moved or cast: the pattern object is rebuilt now, eagerly
        self.weight  # noqa: B018
        return out

    @property
    def weight(self) -> SparseTensor:
        """The weight with the current values (differentiable in ``values``). It shares one
        pattern object across calls, so what sparsetorch derives from the pattern (entry lists,
        conversion maps, plans) is computed once, until ``.to()`` moves the index buffers."""
        cached = self.__dict__.get("_pattern")
        if cached is not None and compiling():
            # under torch.compile: the pattern object built eagerly (at construction and after every .to()),
            # whose buffer identities a traced graph cannot compare (fullgraph failed on reading .weight)
            return cached[1].with_values(self.values)
        n = len(self._format.levels)
        pos = [getattr(self, f"pos{k}") for k in range(n)]
        crd = [getattr(self, f"crd{k}") for k in range(n)]
        if not all(b is None or is_plain(b) for b in pos + crd):
            # index buffers inside a torch.func transform (functional_call given buffers)
            if any(b is not None and vmapped(b) for b in pos + crd):
                raise InputError(
                    "SparseLinear under torch.func.vmap: its index buffers (pos*/crd*) are mapped, which would make a "
                    "pattern per member (stack_module_state stacks buffers too); map the values (and bias) only, with "
                    "one layer's buffers unmapped: vmap(f, in_dims=(0, None, 0))(params, dict(base.named_buffers()), x)")
            return SparseTensor(self._format, (self.out_features, self.in_features), pos, crd, self.values,
                                check=False)
        key = tuple(None if b is None else (b.data_ptr(), b.device, b.dtype) for b in pos + crd)
        if cached is None or cached[0] != key or cached[1].values.dtype != self.values.dtype:
            source = SparseTensor(self._format, (self.out_features, self.in_features), pos, crd,
                                  self.values.detach(), check=False)
            self.__dict__["_pattern"] = cached = (key, source)
        return cached[1].with_values(self.values)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, format: TensorFormat = CSR, mask: torch.Tensor | None = None,
                    backend: str | None = None) -> "SparseLinear":
        """From an ``nn.Linear``: its weight's nonzeros (or the entries where ``mask``) in ``format``."""
        if not isinstance(linear, nn.Linear):
            raise InputError(f"SparseLinear.from_linear needs an nn.Linear, got {type(linear).__name__}")
        W = SparseTensor.from_dense(linear.weight.detach(), format=format, mask=mask)
        return cls(W, None if linear.bias is None else linear.bias.detach(), backend=backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.in_features:
            raise InputError(f"SparseLinear: input must end with in_features={self.in_features}, got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.layout != torch.strided:
            raise InputError(f"SparseLinear: the input must be a dense (strided) tensor, got layout {x.layout}; "
                             f"call x.to_dense() first")
        if x.device != self.values.device:
            raise InputError(f"SparseLinear: the input is on {x.device} and the layer on {self.values.device}; move "
                             f"one of them (layer.to(x.device) or x.to({str(self.values.device)!r}))")
        if compiling():
            y = self._traced_product(x)
        else:
            y = self._planned_product(x)      # the bias included
            if y is not None:
                return y
            y = rows_times_transpose(x, self.weight, self.backend)
        if self.bias is None:
            return y
        # under autocast the product is in the autocast dtype, and so is the bias (as nn.Linear's)
        return y + (self.bias if self.bias.dtype == y.dtype or autocast_dtype(x.device.type, y.dtype) is None
                    else self.bias.to(y.dtype))

    def __getstate__(self) -> dict:
        # planned products hold backend plans (not copyable, not picklable): a copy plans again
        state = dict(super().__getstate__())
        state.pop("_handles", None)
        return state

    def _index_names(self) -> tuple[str, ...]:
        names = self.__dict__.get("_index_buffer_names")
        if names is None:
            n = len(self._format.levels)
            names = self.__dict__["_index_buffer_names"] = tuple(f"pos{i}" for i in range(n)) + tuple(f"crd{i}" for i in range(n))
        return names

    def _planned_product(self, x: torch.Tensor) -> torch.Tensor | None:
        """``x @ W^T + b`` through a product plan this layer keeps (per batch size, on the current
        index buffers and dtype), so a call is the plan's apply and not a one-shot dispatch; None
        where the general path must run (autocast, a dtype or device that differs from the
        weight's: it casts or raises with the message).

        Without a gradient to record (``torch.no_grad``, ``inference_mode``, or neither the values
        nor ``x`` requiring one) the call is the plan's ``set_values`` and ``apply`` alone, with
        no autograd Function around them: a GPU forward at batch 1 is then two kernels (the
        product, the bias) and a few microseconds of host code besides the plan's own."""
        params = self._parameters
        values = params["values"]
        dev = x.device
        if (x.dtype != values.dtype or x.layout != torch.strided or dev != values.device
                or autocast_dtype(dev.type, values.dtype, x.dtype) is not None):
            return None
        if _transforms_active() or _forward_ad._current_level >= 0 or _jit_tracing() is not None:
            # torch.func transforms (vmap over stacked values in model ensembling, grad, jacrev) and forward-mode AD:
            # a plan binds the values' memory, which a batched / wrapped tensor has none of (set_values raised
            # "Sparse CSR tensors do not have is_contiguous", or with a plan made eagerly "Cannot access data pointer
            # of Tensor that doesn't have storage"; session 29's sweep), and the direct call records no tangent (a
            # dual values tensor gave a product without one). The general product handles them, as A @ x does;
            # under torch.jit.trace too, whose recording cannot follow the plan (matmul's plain torch ops instead).
            return None
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        k = x2.shape[0]
        if k == 0:
            return None
        bufs = self._buffers                  # the index buffers as .to() / load_state_dict left them
        key = (tuple([(b.data_ptr(), version_of(b)) for b in (bufs[name] for name in self._index_names()) if b is not None]),
               values.dtype, dev, k, self.backend)
        handles: dict = self.__dict__.setdefault("_handles", {})
        lp = handles.get(key)
        if lp is None:
            lp = self._plan_for_batch(x2)
            with _HANDLES_LOCK:  # the oldest plan out and this one in, one thread at a time (two threads
                # evicting the same oldest key raised KeyError out of forward; session 28's sweep)
                if key not in handles and len(handles) >= LAYER_HANDLES:
                    handles.pop(next(iter(handles)))
                handles[key] = lp
        bias = params.get("bias") if "bias" in params else self.bias
        if torch.is_grad_enabled() and (values.requires_grad or x.requires_grad):
            y = matmul_function(values, x2.mT, lp.handle).mT.reshape(*x.shape[:-1], self.out_features)
            return y if bias is None else y + bias
        state = lp.state
        plan = state.plan
        with state.lock:
            if plan is None:                  # built lazily by the first load
                state._load(values)
                plan = state.plan
            try:  # a product plan reloads its values on every call (in-place writes are seen)
                plan.set_values(values)
                # a plan that takes the bias (the cuda plugin's) adds it in its own kernel
                fuse = bias is not None and getattr(plan, "accepts_bias", False) and bias.dtype == values.dtype
                Y = plan.apply(x2.mT, bias=bias) if fuse else plan.apply(x2.mT)
            except SparseTorchError:
                raise
            except Exception as exc:  # noqa: BLE001 - re-raised with the plugin named, as MatmulHandle.run does
                raise BackendError(f"{state.label} failed in the layer's product: {type(exc).__name__}: {exc}",
                                   label=state.label, phase="apply") from exc
        y = Y.view(*x.shape[:-1], self.out_features) if k == 1 else Y.mT.reshape(*x.shape[:-1], self.out_features)
        return y if bias is None or fuse else y + bias

    def _plan_for_batch(self, x2: torch.Tensor) -> "_LayerPlan":
        """The planned product for inputs like ``x2`` (``(k, in_features)``): dispatch's choice,
        or on a CUDA device the fastest candidate measured (:data:`LAYER_TUNE_CUDA`)."""
        W = self._kernel_weight()
        Xn = x2.mT
        request = matmul_request(W, Xn, MatmulOptions(backend=self.backend, repeat=LAYER_REPEAT))
        tune = (LAYER_TUNE_CUDA and self.backend is None and x2.device.type == "cuda"
                and not torch.cuda.is_current_stream_capturing())
        state, offer, table = obtain_plan("matmul", W, request, cache=not tune)
        candidates = [r.offer for r in table.rows if r.offer is not None]
        label = f"{offer.backend}/{offer.method}"
        if not tune or len(candidates) < 2:
            return _LayerPlan(state, MatmulHandle(state, W), label, W)
        values = self.values.detach()
        timed: list[tuple[float, float, str, PlanState]] = []
        notes: dict[str, dict] = {}
        for cand in candidates:
            name = f"{cand.backend}/{cand.method}"
            st_ = state if cand is offer else plan_for("matmul", W, request, cand, cache=False)
            try:
                gpu, host = _time_product(st_, values, Xn, self.out_features)
            except Exception as exc:  # noqa: BLE001 - a candidate that fails is not chosen (recorded)
                notes[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                continue
            notes[name] = {"gpu_s": gpu, "host_s": host, "estimate_s": cand.seconds}
            timed.append((gpu, host, name, st_))
        if not timed:                         # every candidate failed: dispatch's choice raises as usual
            return _LayerPlan(state, MatmulHandle(state, W), label, W)
        gpu, host, name, best = min(timed, key=lambda t: (t[0], t[1]))
        return _LayerPlan(best, MatmulHandle(best, W), name, W, {"dispatch": label, "candidates": notes})

    def _kernel_weight(self) -> SparseTensor:
        """The weight the product plans are made for: the layer's own, except that on a CUDA
        device a CSR pattern with int64 indices is planned on an int32 copy of its index
        buffers (the same entries in the same order, so the stored values are used as they are;
        a batch-1 product reads value and index once per entry: 6 bytes instead of 10 in
        half precision)."""
        W = self.weight.detach()
        if (W.device.type != "cuda" or self._format != CSR or W.index_dtype != torch.int64
                or max(W.values.numel(), self.out_features, self.in_features) >= 2**31 - 1):
            return W
        rowptr, col = W.pos(1), W.crd(1)
        return SparseTensor(CSR, (self.out_features, self.in_features), [None, rowptr.to(torch.int32)],
                            [None, col.to(torch.int32)], W.values, check=False)

    def plans(self) -> list[dict]:
        """The planned products this layer holds, one per batch size seen: the batch size, the
        backend/method that runs it and, where it was chosen by timing on a CUDA device, what
        dispatch would have picked and each candidate's measured GPU and host seconds per call."""
        out = []
        with _HANDLES_LOCK:
            held = list(self.__dict__.get("_handles", {}).items())
        for key, lp in held:
            out.append({"batch": key[3], "dtype": str(key[1]).replace("torch.", ""), "device": str(key[2]),
                        "plan": lp.label, "index_dtype": str(lp.weight.index_dtype).replace("torch.", ""),
                        **lp.tuning})
        return out

    # torch.compile ------------------------------------------------------------------------------
    def prepare_compile(self) -> "SparseLinear":
        """Nothing to prepare any more (kept so that code written for sessions before it keeps
        working): a compiled forward takes the weight in its own format. Returns ``self``.

        Under ``torch.compile`` the forward pass is the ``sparsetorch::spmm`` custom op of
        :mod:`sparsetorch.autograd.compiled` (a fake kernel and an autograd formula, so
        ``fullgraph=True`` traces it with no graph break); at run time its kernel runs the product
        dispatch plans for the weight's format, dtype and device (the plan cache shared with eager
        calls: on a GPU the cuda plugin's kernels, half precision included)."""
        return self

    def _traced_product(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W^T`` through the custom op (the compiled path; see :meth:`prepare_compile`)."""
        from ..autograd.compiled import _spec, spmm  # noqa: PLC0415 - the compiled path only

        # the op takes the buffers themselves (no SparseTensor is put together in the traced code)
        bufs = [getattr(self, name) for name in self._index_names()]
        vals = self.values
        lead = x.shape[:-1]
        dt = autocast_dtype(x.device.type, vals.dtype, x.dtype)
        if dt is not None:  # as autocast runs nn.Linear: both operands in its dtype
            vals, x = vals.to(dt), x.to(dt)
        X = x.reshape(-1, self.in_features).mT
        with torch.autocast(x.device.type, enabled=False) if dt is not None else contextlib.nullcontext():
            y = spmm(_spec(self._format), [self.out_features, self.in_features], [b is not None for b in bufs],
                     [b for b in bufs if b is not None], vals, X, False, self.backend)
        return y.mT.reshape(*lead, self.out_features)

    def to_dense(self) -> torch.Tensor:
        """The weight as a dense ``(out_features, in_features)`` tensor (differentiable)."""
        return self.weight.to_dense()

    @property
    def density(self) -> float:
        return self.values.numel() / max(1, self.in_features * self.out_features)

    def extra_repr(self) -> str:
        name = self._format.name or str(self._format)
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"format={name}, stored={self.values.numel()} ({self.density:.1%})")


class _LayerPlan:
    """One planned product of a layer: the plan's state (for the direct call), the autograd
    handle on it (for calls that record a gradient), the weight it was planned on, its label
    and, where it was chosen by timing, the measurements."""

    __slots__ = ("state", "handle", "label", "weight", "tuning")

    def __init__(self, state: PlanState, handle: MatmulHandle, label: str, weight: SparseTensor,
                 tuning: dict | None = None) -> None:
        self.state, self.handle, self.label, self.weight = state, handle, label, weight
        self.tuning = tuning or {}


def _time_product(state: PlanState, values: torch.Tensor, Xn: torch.Tensor, rows: int) -> tuple[float, float]:
    """(GPU seconds, host seconds) per call of ``state``'s product as the layer runs it (values
    loaded, then apply), medians of :data:`TUNE_REPEATS` calls after a warm-up that builds the
    plan. The GPU time is taken with the host ahead of the device (a short device-side sleep
    first), so it is the kernels' time alone; the host time is the enqueueing."""
    import time  # noqa: PLC0415

    def call() -> torch.Tensor:
        with state.lock:
            state._load(values)
            return state.plan.apply(Xn)

    with torch.no_grad():
        Y = call()
        if not isinstance(Y, torch.Tensor) or tuple(Y.shape) != (rows, Xn.shape[-1]) or Y.dtype != Xn.dtype:
            raise RuntimeError(f"{state.label}: apply returned {type(Y).__name__} {tuple(getattr(Y, 'shape', ()))}")
        torch.cuda.synchronize(Xn.device)
        t0 = time.perf_counter()
        for _ in range(TUNE_REPEATS):
            call()
        host = (time.perf_counter() - t0) / TUNE_REPEATS
        torch.cuda.synchronize(Xn.device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is not None:  # keep the device busy while the host enqueues (about 1.5x its time)
            sleep(int(min(2e7, 1.5 * host * TUNE_REPEATS * 2e9)))
        start.record()
        for _ in range(TUNE_REPEATS):
            call()
        end.record()
        end.synchronize()
    return start.elapsed_time(end) * 1e-3 / TUNE_REPEATS, host


def rows_times_transpose(x: torch.Tensor, A: SparseTensor, backend: str | None = None) -> torch.Tensor:
    """``x @ A^T`` for ``x`` of shape ``(..., n)`` and ``A`` of shape ``(m, n)``: one product whose
    columns are the rows of ``x`` (a layer's batch)."""
    lead = x.shape[:-1]
    y = amp_matmul(A, x.reshape(-1, x.shape[-1]).mT, backend=backend).mT
    return y.reshape(*lead, A.shape[0])


def amp_matmul(A: SparseTensor, X: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """``matmul(A, X)``, under autocast as autocast runs a dense product: both operands cast to
    the autocast dtype (differentiably), the product itself with autocast off so the backends
    see plain half-precision operands (and accumulate in float32, as the torch backend does)."""
    dt = autocast_dtype(X.device.type, A.dtype, X.dtype)
    if dt is None:
        return matmul(A, X, backend=backend)
    with torch.autocast(X.device.type, enabled=False):
        return matmul(A if A.dtype == dt else A.with_values(A.values.to(dt)), X.to(dt), backend=backend)

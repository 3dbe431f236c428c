"""A planned product (``Matmul(...).plan(); .execute()``), a product over vmapped values, and the backward of a
product whose dispatch-chosen backend fails (build, set_values, apply, bind, the bound launch, the adjoint apply)
are answered by the torch backend with one warning naming the failure, as the one-shot ``st.matmul`` is
(tests/test_matmul_fallback.py); a Matmul keeps the torch plan, so later calls do not try the failed plugin
again. A pinned backend's failure and errors about the operands are raised. References: dense products in
float64."""

from __future__ import annotations

import warnings

import pytest
import torch

import sparsetorch
from sparsetorch.dispatch.records import BackendInfo, Offer

from test_plugins import backends  # noqa: F401 - the fixture

_MESSAGES = {
    "build": "NVRTC: the kernel does not compile for this device",
    "set_values": "could not upload the values",
    "apply": "launch failed",
    "adjoint": "the adjoint launch failed",
    "bind": "cannot record the launch",
    "bound": "the recorded launch failed",
}


class _Plan:
    """A correct dense product, except in the phases named in ``fail`` (each call logged)."""

    backend, method, preconditioner = "flaky", "spmm", None

    def __init__(self, A: sparsetorch.SparseTensor, fail: set, log: list) -> None:
        self.A, self.fail, self.log, self.values = A, fail, log, None
        self._step("build")

    def _step(self, phase: str) -> None:
        self.log.append(phase)
        if phase in self.fail:
            raise RuntimeError(_MESSAGES[phase])

    def _dense(self, values: torch.Tensor) -> torch.Tensor:
        return self.A.with_values(values).to_dense()

    def set_values(self, values: torch.Tensor) -> None:
        self._step("set_values")
        self.values = values

    def apply(self, X: torch.Tensor, *, adjoint: bool = False) -> torch.Tensor:
        self._step("adjoint" if adjoint else "apply")
        D = self._dense(self.values)
        return (D.mT.conj() if adjoint else D) @ X


class _BindablePlan(_Plan):
    def bind(self, values: torch.Tensor, X: torch.Tensor):
        self._step("bind")

        def bound(X: torch.Tensor, Y: torch.Tensor) -> bool:
            self._step("bound")
            Y.copy_(self._dense(values) @ X)
            return True

        return bound


class _Flaky:
    """A backend that dispatch prefers for every float64 CPU product; its plans fail in ``fail``."""

    def __init__(self, *fail: str, bindable: bool = False, plan: type | None = None) -> None:
        self.fail, self.plan = set(fail), plan or (_BindablePlan if bindable else _Plan)
        self.log: list[str] = []

    @sparsetorch.hookimpl
    def sparsetorch_backend_info(self) -> BackendInfo:
        return BackendInfo(name="flaky", version="0", description="test double", devices=("cpu",),
                           dtypes=(torch.float64,), ops={"matmul": ("spmm",)}, priority=100)

    @sparsetorch.hookimpl
    def sparsetorch_offers(self, request):
        if request.op != "matmul":
            return []
        return [Offer("flaky", "spmm", 1e-12, 0, lambda A, req: self.plan(A, self.fail, self.log), notes="test double")]


def _operands(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(30, 20, generator=g, dtype=torch.float64) * (torch.rand(30, 20, generator=g) < 0.3)
    return sparsetorch.SparseTensor.from_dense(D), D, torch.randn(20, 3, generator=g, dtype=torch.float64)


def _warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, sparsetorch.SparseTorchWarning)]


# (phase, operands): "plain" A @ X; "into_c" c := A @ X (beta=0, the bound launch writes c); "scaled"
# c := 2 A @ X + 0.5 c (no bound launch: alpha != 1)
_CASES = [(p, o) for p in ("build", "set_values", "apply") for o in ("plain", "into_c", "scaled")] + \
         [(p, o) for p in ("bind", "bound") for o in ("plain", "into_c")]


@pytest.mark.parametrize("explicit_plan", [True, False], ids=["plan", "execute-plans"])
@pytest.mark.parametrize(("phase", "operands"), _CASES)
def test_a_failing_chosen_backend_of_a_matmul_falls_back_once_and_for_good(backends, phase, operands,  # noqa: F811
                                                                           explicit_plan):
    plugin = _Flaky(phase, bindable=phase in ("bind", "bound"))
    backends.register(plugin, "flaky")
    A, D, X = _operands()
    c0 = torch.randn(30, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    c = None if operands == "plain" else c0.clone()
    kw = {"beta": 0.0} if operands == "into_c" else {"alpha": 2.0, "beta": 0.5} if operands == "scaled" else {}

    def ref(D, X, c_before):
        return 2 * D @ X + 0.5 * c_before if operands == "scaled" else D @ X

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        mm = sparsetorch.Matmul(A, X, c, **kw)
        if explicit_plan:
            mm.plan()
        y = mm.execute()
        torch.testing.assert_close(y, ref(D, X, c0), rtol=1e-12, atol=1e-12)
        if c is not None:
            assert y is c  # written in place (once: scaled adds 0.5 c0 once)
        tried = list(plugin.log)
        assert tried[-1] == phase, tried
        # later calls: the torch plan, no warning, the plugin not asked again
        c_before = None if c is None else c.clone()
        torch.testing.assert_close(mm.execute(), ref(D, X, c_before), rtol=1e-12, atol=1e-12)
        X2 = -3 * X
        mm.reset_operands(b=X2)
        c_before = None if c is None else c.clone()
        torch.testing.assert_close(mm.execute(), ref(D, X2, c_before), rtol=1e-12, atol=1e-12)
        # another pattern: planned anew, on torch (dispatch still chooses the failed backend)
        A3, D3, _ = _operands(seed=3)
        mm.reset_operands(a=A3)
        c_before = None if c is None else c.clone()
        torch.testing.assert_close(mm.execute(), ref(D3, X2, c_before), rtol=1e-12, atol=1e-12)
    assert plugin.log == tried, "the failed backend was tried again"
    (msg,) = _warnings(rec)
    (where,) = [w.filename for w in rec if issubclass(w.category, sparsetorch.SparseTorchWarning)]
    assert where == __file__, "the warning points at the caller's plan() / execute()"
    assert msg.startswith("Matmul: flaky/spmm failed in ") and _MESSAGES[phase] in msg, msg
    assert "answered by the torch backend" in msg and "RuntimeError" in msg
    # the table plan() returns is the torch backend's
    assert mm.plan().chosen.backend == "torch"
    assert plugin.log == tried


def test_pinned_backends_and_errors_about_the_operands_are_raised(backends):  # noqa: F811
    plugin = _Flaky("apply")
    backends.register(plugin, "flaky")
    A, D, X = _operands()
    # pinned: the plugin's failure is raised, not answered by torch (as st.matmul(backend=) does)
    mm = sparsetorch.Matmul(A, X, backend="flaky")
    mm.plan()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(sparsetorch.BackendError, match="flaky/spmm failed in apply: RuntimeError: launch failed"):
            mm.execute()
        with pytest.raises(sparsetorch.BackendError, match="flaky/spmm failed in apply"):
            mm.execute()  # and again: it never fell back
    # a pinned bound launch's failure: BackendError naming the plugin (was the plugin's own RuntimeError)
    bindable = _Flaky("bound", bindable=True)
    backends.register(bindable, "flaky2")
    mm = sparsetorch.Matmul(A, X, backend="flaky2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(sparsetorch.BackendError, match="flaky2/spmm failed in the bound launch: RuntimeError: "
                                                           "the recorded launch failed"):
            mm.execute()
    # unpinned, the same plugin falls back; then A's index buffers written out of range: the ValidationError
    # of the operands is raised (never answered by a fallback)
    backends.unregister("flaky2")
    A2 = A.clone()
    mm = sparsetorch.Matmul(A2, X)
    with pytest.warns(sparsetorch.SparseTorchWarning, match="flaky/spmm failed in apply"):
        torch.testing.assert_close(mm.execute(), D @ X, rtol=1e-12, atol=1e-12)
    A2.crd_buffers[-1][0] = 1000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(sparsetorch.ValidationError):
            mm.execute()


class _UserError(_Plan):
    def apply(self, X, *, adjoint=False):
        raise sparsetorch.InputError("the right-hand side is not what this plugin takes")


def test_only_a_plugins_failure_falls_back_not_a_sparsetorch_error_it_raises(backends):  # noqa: F811
    """An error of sparsetorch's own types that is not a BackendError comes out as it is (as in st.matmul);
    next to it, the failure of a plan's build falls back (which it did not)."""
    backends.register(_Flaky(plan=_UserError), "flaky")
    A, D, X = _operands()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(sparsetorch.InputError, match="not what this plugin takes"):
            sparsetorch.Matmul(A, X).execute()
    backends.unregister("flaky")
    backends.register(_Flaky("build"), "flaky")
    with pytest.warns(sparsetorch.SparseTorchWarning, match="failed in build: RuntimeError: NVRTC"):
        y = sparsetorch.Matmul(A, X).execute()
    torch.testing.assert_close(y, D @ X, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["Matmul", "matmul"])
def test_a_failing_adjoint_falls_back_in_the_backward(backends, kind):  # noqa: F811
    """The forward by the plugin, its adjoint product (dX = A^H dY) failing: the backward is answered by torch,
    with a warning; a Matmul's later backward passes do not try the plugin's adjoint again."""
    plugin = _Flaky("adjoint")
    backends.register(plugin, "flaky")
    A, D, X = _operands()
    v = A.values.detach().clone().requires_grad_(True)
    Xg = X.clone().requires_grad_(True)
    Av = A.with_values(v)
    mm = sparsetorch.Matmul(Av, Xg) if kind == "Matmul" else None

    def product():
        return mm.execute() if mm is not None else sparsetorch.matmul(Av, Xg)

    W = torch.randn(30, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        y = product()
        assert not _warnings(rec), "the forward is the plugin's"
        (y * W).sum().backward()
    (msg,) = _warnings(rec)
    assert "flaky/spmm failed in apply" in msg and "the adjoint launch failed" in msg, msg
    Dg = D.clone().requires_grad_(True)
    Xr = X.clone().requires_grad_(True)
    (Dg @ Xr * W).sum().backward()
    torch.testing.assert_close(Xg.grad, Xr.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(v.grad, Dg.grad[D != 0], rtol=1e-12, atol=1e-12)
    assert plugin.log.count("adjoint") == 1
    if mm is not None:
        Xg.grad = v.grad = None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            (mm.execute() * W).sum().backward()
        torch.testing.assert_close(Xg.grad, Xr.grad, rtol=1e-12, atol=1e-12)
        assert plugin.log.count("adjoint") == 1, "the plugin's adjoint was tried again"


@pytest.mark.parametrize("phase", ["build", "set_values", "apply"])
def test_a_product_over_vmapped_values_falls_back(backends, phase):  # noqa: F811
    backends.register(_Flaky(phase), "flaky")
    A, D, X = _operands()
    scales = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    V = scales[:, None] * A.values.detach()
    with pytest.warns(sparsetorch.SparseTorchWarning, match=f"flaky/spmm failed in {phase}.*answered by the torch"):
        Y = torch.func.vmap(lambda v: sparsetorch.matmul(A.with_values(v), X))(V)
    torch.testing.assert_close(Y, torch.stack([s * D @ X for s in scales]), rtol=1e-12, atol=1e-12)


def test_the_backward_of_a_product_over_vmapped_values_falls_back(backends):  # noqa: F811
    """vmap over A's values of a gradient in X, the plugin's adjoint failing: answered by torch (one warning:
    the members after the first take the torch plan at once)."""
    plugin = _Flaky("adjoint")
    backends.register(plugin, "flaky")
    A, D, X = _operands()
    scales = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    V = scales[:, None] * A.values.detach()

    def grad_in_x(v):
        return torch.func.grad(lambda x: (sparsetorch.matmul(A.with_values(v), x) ** 2).sum())(X)

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        G = torch.func.vmap(grad_in_x)(V)
    (msg,) = _warnings(rec)
    assert "flaky/spmm failed in apply" in msg and "the adjoint launch failed" in msg, msg
    ref = torch.stack([2 * (s * D).T @ ((s * D) @ X) for s in scales])
    torch.testing.assert_close(G, ref, rtol=1e-12, atol=1e-12)
    assert plugin.log.count("adjoint") == 1


# --- the one-shot product's remembered launch (session 28: bind / the bound launch were unguarded there) ----------
@pytest.mark.parametrize("phase", ["bind", "bound"])
@pytest.mark.parametrize("pinned", [False, True], ids=["chosen", "pinned"])
def test_repeated_one_shot_products_survive_a_failing_bind_or_bound_launch(backends, phase, pinned):  # noqa: F811
    plugin = _Flaky(phase, bindable=True)
    backends.register(plugin, "flaky")
    A, D, X = _operands()
    for _ in range(5):  # the second call remembers the launch (bind), the third takes it (bound)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            y = sparsetorch.matmul(A, X, backend="flaky" if pinned else None)
        torch.testing.assert_close(y, D @ X, rtol=1e-12, atol=1e-12)
    assert phase in plugin.log  # the failing step was reached, and the plan's apply answered each call
    assert plugin.log.count("apply") >= 4


class _SddmmFailingPlan(_Plan):
    """A correct product whose own SDDMM (the values' gradient) fails, or returns the wrong shape."""

    bad_shape = False

    def sddmm(self, P: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
        self.log.append("sddmm")
        if self.bad_shape:
            return torch.zeros(3, dtype=P.dtype)
        raise RuntimeError("the sampled product failed")


class _SddmmBadShapePlan(_SddmmFailingPlan):
    bad_shape = True


@pytest.mark.parametrize("plan", [_SddmmFailingPlan, _SddmmBadShapePlan], ids=["raises", "bad-shape"])
@pytest.mark.parametrize("how", ["one-shot", "matmul"])
def test_a_failing_plugin_sddmm_in_the_backward_falls_back_to_the_core(backends, plan, how):  # noqa: F811
    plugin = _Flaky(plan=plan)
    backends.register(plugin, "flaky")
    A, D, X = _operands()
    W = torch.randn(30, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    rows, cols = A.coordinates()[0]
    ref = (W @ X.T)[rows, cols]  # d/dvalues of sum(W * (A X))
    values = A.values.detach().clone().requires_grad_(True)
    Av = A.with_values(values)
    mm = sparsetorch.Matmul(Av, X) if how == "matmul" else None
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(2):
            values.grad = None
            y = mm.execute() if mm is not None else sparsetorch.matmul(Av, X)
            (y * W).sum().backward()
            torch.testing.assert_close(values.grad, ref, rtol=1e-12, atol=1e-12)
    notes = [m for m in _warnings(rec) if "sddmm" in m]
    assert notes and "flaky" in notes[0], _warnings(rec)
    if how == "matmul":  # the Matmul keeps its handle: the plugin's sddmm is not asked again
        assert plugin.log.count("sddmm") == 1 and len(notes) == 1


def test_a_pinned_plugin_failing_sddmm_is_raised(backends):  # noqa: F811
    backends.register(_Flaky(plan=_SddmmFailingPlan), "flaky")
    A, D, X = _operands()
    values = A.values.detach().clone().requires_grad_(True)
    y = sparsetorch.matmul(A.with_values(values), X, backend="flaky")
    with pytest.raises(sparsetorch.BackendError, match="sampled product failed"):
        y.sum().backward()

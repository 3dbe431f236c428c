"""The conformance kit: one suite of parity tests that every backend's tests subclass.

A backend's test module pins the backend and states what it can do; the kit does the rest::

    import torch
    from sparsetorch.format import COO, CSR
    from sparsetorch.testing import ErrorConformance, MatmulConformance, SolveConformance

    class MyBackend:
        backend = "mine"                      # pinned with backend="mine" in every call
        methods = ("lu", "gmres")             # solve methods to test (names from records.METHODS)
        devices = ("cpu", "cuda")             # CUDA cases skip on machines without a GPU
        dtypes = (torch.float64,)
        formats = (CSR, COO)
        supports_complex = False              # complex tests skip, with this reason

    class TestMySolve(MyBackend, SolveConformance): ...
    class TestMyMatmul(MyBackend, MatmulConformance): ...
    class TestMyErrors(MyBackend, ErrorConformance): ...

Every answer is checked against a dense double-precision oracle (``torch.linalg.solve``, dense
``@``, dense autograd), every gradient with ``torch.autograd.gradcheck`` as well. Each parity test
is written once here and runs against every backend, errors included (STYLE.md rules 11, 12).

Parametrization comes from the class attributes (``pytest_generate_tests`` below): a test that
takes ``method`` runs for each of ``methods``; ``direct_method``/``iterative_method``/
``constrained_method`` run for the matching subset; ``fmt``, ``dtype``, ``complex_dtype`` and
``device`` run for ``formats``, ``dtypes``, ``complex_dtypes`` and ``devices``. A capability flag
set to False skips its group with ``pytest.skip`` and the reason; an empty subset gives one
skipped case that says why. The base classes have no ``Test`` prefix, so pytest collects them
only through a subclass.

What is checked:

- :class:`SolveConformance`: ``solve`` in every format and dtype, B of shape ``(n,)``, ``(n, k)``
  and ``B = I``, value batches, complex; a method's requirement (``symmetric_only_methods``) is
  declined with its reason; gradients by ``gradcheck``/``gradgradcheck`` and against dense
  autograd (on the pattern only), ``torch.func.grad`` and ``vmap`` over B; ``Solver``
  (plan / factorize / update_values / solve); the plan cache (new values reuse the plan and are
  always seen, another pattern never does).
- :class:`MatmulConformance`: ``matmul``, ``A @ x``, ``x @ A`` and the UST ``Matmul`` form
  (``c`` updated in place) in every format, value batches, complex, gradients, ``norm``.
- :class:`ErrorConformance`: each bad input raises the library's named error with a message
  that names the problem (shapes, dtypes, NaN/Inf, singular, indefinite, maxiter, zero
  tolerances, unknown method), and no input is ever modified.

A backend that may run from a source checkout (its entry point not installed) sets ``plugin``
to its hook module: the kit registers it under ``backend`` when it is not loaded, and resets the
loaded backends afterwards. Anything more special overrides the autouse ``conformance_backend``
fixture (same name).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, ClassVar, Mapping

import pytest
import torch

import sparsetorch as st
from ..dispatch.manager import get_backends
from ..format import BSR, COO, CSC, CSR, DIA, TensorFormat
from ..tensor import SparseTensor
from .problems import Problem, make_problem, oracle_dtype, random_rectangular

__all__ = ["ConformanceBase", "SolveConformance", "MatmulConformance", "ErrorConformance", "DIRECT_METHODS", "REQUIREMENT_WORDS"]

#: Methods that factorize (everything else iterates and gets a tolerance).
DIRECT_METHODS = frozenset({"lu", "cholesky", "ldlt", "qr", "dense"})

#: What a decline must say for each requirement (case-insensitive), beside the method's name.
REQUIREMENT_WORDS = {"spd": "symmetric positive definite", "symmetric": "symmetric"}


def _name(x: Any) -> str:
    if isinstance(x, torch.dtype):
        return str(x).replace("torch.", "")
    if isinstance(x, TensorFormat):
        return x.name or str(x)
    return str(x)


class ConformanceBase:
    """Class attributes a backend's test class sets, and the helpers the suites share."""

    #: The backend under test (every call pins it with ``backend=``).
    backend: ClassVar[str] = ""
    #: Its hook module, registered in-process when the entry point is not installed (or None).
    plugin: ClassVar[Any] = None
    #: Solve methods to test (from ``sparsetorch.dispatch.records.METHODS``).
    methods: ClassVar[tuple[str, ...]] = ()
    #: Devices to run on ("cpu", "cuda", "cuda:1", ...); absent devices skip.
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    #: Real dtypes to run the value tests in.
    dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float64, torch.float32)
    #: Complex dtypes, used when ``supports_complex``.
    complex_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.complex128, torch.complex64)
    #: Input formats every value test is repeated in.
    formats: ClassVar[tuple[TensorFormat, ...]] = (CSR, CSC, COO, BSR(2, 2), DIA)
    #: Capability flags: False skips the group, with the flag's name as the reason.
    supports_complex: ClassVar[bool] = True
    supports_batch: ClassVar[bool] = True  # value batches sharing one pattern
    supports_multiple_rhs: ClassVar[bool] = True  # B of shape (n, k)
    supports_grad: ClassVar[bool] = True
    #: What each method requires of A ("spd" or "symmetric"); methods not listed take any square A.
    symmetric_only_methods: ClassVar[Mapping[str, str]] = {"cg": "spd", "minres": "symmetric", "cholesky": "spd", "ldlt": "symmetric"}
    #: Methods that factorize; the others are iterative (tolerances, maxiter, non-convergence).
    direct_methods: ClassVar[frozenset[str]] = DIRECT_METHODS
    #: Iterative methods whose ``maxiter`` counts restart cycles (the kit passes ``restart=`` too).
    restarted_methods: ClassVar[frozenset[str]] = frozenset({"gmres", "lgmres"})
    #: Solver tolerance passed as ``rtol=`` per dtype.
    rtol: ClassVar[Mapping[torch.dtype, float]] = {
        torch.float64: 1e-10, torch.float32: 1e-5, torch.complex128: 1e-10, torch.complex64: 1e-5,
    }
    #: Accepted relative error ``||x - x_ref|| / ||x_ref||`` against the dense oracle, per dtype.
    check_rtol: ClassVar[Mapping[torch.dtype, float]] = {
        torch.float64: 1e-7, torch.float32: 2e-3, torch.complex128: 1e-7, torch.complex64: 2e-3,
    }
    #: gradcheck tolerances (float64, solver rtol 1e-12): iterative methods get a relaxed atol.
    gradcheck_atol: ClassVar[Mapping[str, float]] = {"direct": 1e-7, "iterative": 1e-5}
    #: Grid of the value tests (n = nx * ny; keep n <= 200) and of the gradient tests (n ~ 12).
    grid: ClassVar[tuple[int, int]] = (6, 5)
    grad_grid: ClassVar[tuple[int, int]] = (4, 3)

    # Parametrization --------------------------------------------------------------------------
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Parametrize the kit's axes from this class's attributes."""
        ms = tuple(self.methods)
        axes: dict[str, tuple[list, str]] = {
            "method": (list(ms), "no methods listed in `methods`"),
            "direct_method": ([m for m in ms if self._is_direct(m)], "no direct method in `methods`"),
            "iterative_method": ([m for m in ms if not self._is_direct(m)], "no iterative method in `methods`"),
            "constrained_method": ([m for m in ms if m in self.symmetric_only_methods],
                                   "no method in `methods` has a requirement in `symmetric_only_methods`"),
            "general_direct_method": ([m for m in ms if self._is_direct(m) and self.requirement(m) != "spd"],
                                      "no direct method without an SPD requirement in `methods`"),
            "spd_method": ([m for m in ms if self.requirement(m) == "spd"], "no method requiring SPD in `methods`"),
            "fmt": (list(self.formats), "no formats listed in `formats`"),
            "dtype": (list(self.dtypes), "no dtypes listed in `dtypes`"),
            "complex_dtype": (list(self.complex_dtypes), "no dtypes listed in `complex_dtypes`"),
            "device": (list(self.devices), "no devices listed in `devices`"),
        }
        for argname, (values, why) in axes.items():
            if argname not in metafunc.fixturenames:
                continue
            if not values:
                metafunc.parametrize(argname, [pytest.param(None, marks=pytest.mark.skip(reason=f"{self.backend}: {why}"))], ids=["none"])
                continue
            params = []
            for v in values:
                marks = ()
                if argname == "device":
                    marks = _device_marks(v)
                params.append(pytest.param(v, marks=marks, id=_name(v)))
            metafunc.parametrize(argname, params)

    # Fixtures ---------------------------------------------------------------------------------
    @pytest.fixture(autouse=True)
    def conformance_backend(self):
        """Registers ``plugin`` when ``backend`` is not loaded (and resets afterwards); fails
        clearly when neither is there. Calibration uses the built-in rates for determinism."""
        if not self.backend:
            pytest.fail(f"{type(self).__name__} must set `backend` (the backend name to pin)")
        backends = get_backends()
        registered = False
        if self.backend not in backends.names and self.plugin is not None:
            backends.register(self.plugin, self.backend)
            registered = True
        if self.backend not in backends.names:
            broken = {b.name: b.error for b in backends.broken}
            pytest.fail(
                f"backend {self.backend!r} is not loaded (loaded: {backends.names}"
                + (f"; {self.backend} failed to load: {broken[self.backend]}" if self.backend in broken else "")
                + "): install its plugin, set `plugin` to its hook module, or override the `conformance_backend` fixture"
            )
        yield
        if registered:
            from ..dispatch import reset_backends  # noqa: PLC0415

            reset_backends()

    @pytest.fixture(autouse=True)
    def _conformance_calibration(self, monkeypatch):
        monkeypatch.setenv("SPARSETORCH_CALIBRATION", "defaults")

    # Helpers ----------------------------------------------------------------------------------
    def _is_direct(self, method: str) -> bool:
        return method in self.direct_methods

    def requirement(self, method: str) -> str:
        """"spd", "symmetric" or "general": what ``method`` needs of A."""
        return self.symmetric_only_methods.get(method, "general")

    def need(self, flag: str) -> None:
        """Skip unless the capability ``flag`` is set."""
        if not getattr(self, flag):
            pytest.skip(f"{self.backend}: {flag}=False")

    def problem(self, method: str | None, *, kind: str | None = None, fmt: TensorFormat = CSR,
                dtype: torch.dtype = torch.float64, device: str = "cpu", grid: tuple[int, int] | None = None,
                variant: str | None = None) -> Problem:
        """A problem whose structure suits ``method`` (or of ``kind``)."""
        kind = kind or self.requirement(method)
        return make_problem(kind, grid or self.grid, format=fmt, dtype=dtype, device=device, variant=variant)

    def solve(self, A: SparseTensor, B: torch.Tensor, method: str | None, **kw: Any):
        kw.setdefault("rtol", self.rtol[A.dtype])
        return st.solve(A, B, backend=self.backend, method=method, **kw)

    def assert_close(self, got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str, *, scale: float = 1.0) -> None:
        """Relative error (2-norm over everything) within ``check_rtol[dtype] * scale``."""
        assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
        got = got.detach().to(device=ref.device, dtype=ref.dtype)
        err = float(torch.linalg.vector_norm(got - ref.detach()))
        size = float(torch.linalg.vector_norm(ref.detach()))
        tol = self.check_rtol[dtype] * scale
        assert err <= tol * max(size, 1e-300), (
            f"{self.backend}: {what}: relative error {err / max(size, 1e-300):.3e} > {tol:.1e} (dtype {_name(dtype)})"
        )

    def grad_atol(self, method: str) -> float:
        return self.gradcheck_atol["direct" if self._is_direct(method) else "iterative"]

    def need_grad(self) -> None:
        """Skip unless gradients are supported and float64 (gradcheck's dtype) is among ``dtypes``."""
        self.need("supports_grad")
        if torch.float64 not in self.dtypes:
            pytest.skip(f"{self.backend}: gradient checks run in float64, which is not in dtypes")

    @property
    def base_dtype(self) -> torch.dtype:
        """The dtype of tests that are not about dtypes: float64 if listed, else the first one."""
        return torch.float64 if torch.float64 in self.dtypes else self.dtypes[0]

    @property
    def base_device(self) -> str:
        """The device of tests that are not about devices: the first available one of ``devices``."""
        for d in self.devices:
            if not _device_marks(d) or not _device_marks(d)[0].args[0]:
                return d
        pytest.skip(f"{self.backend}: none of {self.devices} is available")


def _device_marks(device: str):
    dev = torch.device(device)
    if dev.type == "cuda":
        ok = torch.cuda.is_available() and (dev.index is None or dev.index < torch.cuda.device_count())
        return (pytest.mark.skipif(not ok, reason=f"{device} is not available"),)
    if dev.type == "mps":
        ok = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
        return (pytest.mark.skipif(not ok, reason="mps is not available"),)
    return ()


def _slots_on_pattern(A: SparseTensor) -> torch.Tensor:
    """Boolean mask over A's (linearized) value slots: True where a slot holds a matrix entry."""
    _, slot = A.entries()
    mask = torch.zeros(A.values.shape[-1], dtype=torch.bool, device=A.device)
    mask[slot] = True
    return mask


def _snapshot(*objs) -> list:
    """Clones of every tensor (values and index buffers of sparse ones) for "never modified" checks."""
    out = []
    for o in objs:
        if isinstance(o, SparseTensor):
            out.append(("sparse", o.values.detach().clone(), [None if b is None else b.clone() for b in o.pos_buffers],
                        [None if b is None else b.clone() for b in o.crd_buffers]))
        else:
            out.append(("dense", o.detach().clone()))
    return out


def _assert_unchanged(before: list, *objs, what: str) -> None:
    for snap, o in zip(before, objs):
        if snap[0] == "sparse":
            assert torch.equal(o.values.detach(), snap[1]), f"{what}: A's values were modified"
            for k, (a, b) in enumerate(zip(o.pos_buffers, snap[2])):
                assert (a is None and b is None) or torch.equal(a, b), f"{what}: A's pos[{k}] was modified"
            for k, (a, b) in enumerate(zip(o.crd_buffers, snap[3])):
                assert (a is None and b is None) or torch.equal(a, b), f"{what}: A's crd[{k}] was modified"
        else:
            assert torch.equal(o.detach(), snap[1]), f"{what}: an input tensor was modified"


def _transpose_slots(A: SparseTensor) -> torch.Tensor:
    """For each value slot, the slot holding the transposed entry (padding slots map to
    themselves). A's pattern must be structurally symmetric."""
    coords, slot = A.entries()
    n = A.format_shape[1]
    lin = coords[0] * n + coords[1]
    order = torch.argsort(lin)
    lin_t = coords[1] * n + coords[0]
    at = torch.searchsorted(lin[order], lin_t)
    if not bool(torch.equal(lin[order][at.clamp(max=lin.numel() - 1)], lin_t)):
        raise ValueError("the pattern is not structurally symmetric")
    perm = torch.arange(A.values.shape[-1], device=A.device)
    perm[slot] = slot[order[at]]
    return perm


def _loss(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A real scalar with a non-trivial cotangent: <w, x> plus |x|^2."""
    return (x * w).real.sum() + (x.abs() ** 2).sum()


# ================================================================================================
# solve
# ================================================================================================


class SolveConformance(ConformanceBase):
    """``solve`` and ``Solver`` against dense oracles: values, batches, gradients, plans, cache."""

    # Values -------------------------------------------------------------------------------------
    def test_solve_matches_dense(self, method, fmt, dtype, device):
        p = self.problem(method, fmt=fmt, dtype=dtype, device=device)
        b = p.rhs()
        x, info = self.solve(p.A, b, method, return_info=True)
        assert (info.backend, info.method) == (self.backend, method), f"dispatch chose {info.backend}/{info.method}"
        assert x.dtype == dtype and x.device == b.device and x.shape == b.shape
        self.assert_close(x, p.solution(b), dtype, f"solve {method} {p.name} in {_name(fmt)}")

    def test_solve_multiple_rhs(self, method, dtype, device):
        self.need("supports_multiple_rhs")
        p = self.problem(method, dtype=dtype, device=device, variant="random")
        B = p.rhs(3)
        X = self.solve(p.A, B, method)
        assert X.shape == B.shape
        self.assert_close(X, p.solution(B), dtype, f"solve {method} with B (n, 3)")
        # Each column as its own solve gives the same columns.
        for j in range(B.shape[-1]):
            self.assert_close(X[:, j], p.solution(B[:, j]), dtype, f"column {j}")

    def test_solve_identity_rhs(self, method, device):
        """B = I: sparse right-hand sides (the cotangents of a Jacobian, ``jacrev``, are unit
        vectors) on a random-pattern matrix; every column must be solved, whatever its support."""
        self.need("supports_multiple_rhs")
        dtype = self.base_dtype
        p = self.problem(method, dtype=dtype, device=device, grid=self.grad_grid, variant="random")
        eye = torch.eye(p.n, dtype=dtype, device=device)
        X = self.solve(p.A, eye, method)
        self.assert_close(X, torch.linalg.inv(p.dense), dtype, f"solve {method} {p.name} with B = I")

    def test_solve_value_batch(self, method, dtype, device):
        self.need("supports_batch")
        p = self.problem(method, dtype=dtype, device=device)
        Ab = p.value_batch(3)
        b = p.rhs(batch=(3,))
        x = self.solve(Ab, b, method)
        self.assert_close(x, p.solution(b, Ab), dtype, f"solve {method} on a value batch, b (3, n)")
        if self.supports_multiple_rhs:
            B = p.rhs(2, batch=(3,))
            X = self.solve(Ab, B, method)
            self.assert_close(X, p.solution(B, Ab), dtype, f"solve {method} on a value batch, B (3, n, 2)")

    def test_solve_complex(self, method, complex_dtype, device):
        self.need("supports_complex")
        p = self.problem(method, dtype=complex_dtype, device=device)
        b = p.rhs()
        x = self.solve(p.A, b, method)
        assert x.dtype == complex_dtype
        self.assert_close(x, p.solution(b), complex_dtype, f"solve {method} {p.name}")
        if self.supports_multiple_rhs:
            B = p.rhs(2)
            self.assert_close(self.solve(p.A, B, method), p.solution(B), complex_dtype, f"solve {method} {p.name}, B (n, 2)")

    # Requirements -------------------------------------------------------------------------------
    def test_method_requirement_respected(self, constrained_method, device):
        """A method that needs SPD/symmetric A, pinned on a non-symmetric A, is declined with the
        reason (NoBackendError naming the method and what it needs), never run."""
        method = constrained_method
        need = self.requirement(method)
        p = self.problem(None, kind="general", dtype=self.base_dtype, device=device)
        with pytest.raises(st.NoBackendError) as info:
            self.solve(p.A, p.rhs(), method)
        msg = str(info.value)
        words = REQUIREMENT_WORDS[need]
        assert method.lower() in msg.lower() and words in msg.lower(), (
            f"the NoBackendError for {method} on a non-symmetric matrix must name {method!r} and say "
            f"{words!r}; got:\n{msg}"
        )
        table = info.value.table
        rows = [r for r in table.declines if r.backend == self.backend and r.method == method]
        assert rows, f"no decline row for {self.backend}/{method} in the explain table:\n{table}"
        assert any(words in r.reason.lower() for r in rows), f"decline reasons for {method}: {[r.reason for r in rows]}"

    # Gradients ----------------------------------------------------------------------------------
    def _grad_problem(self, method: str, fmt: TensorFormat = CSR, device: str = "cpu") -> Problem:
        return self.problem(method, fmt=fmt, dtype=torch.float64, device=device, grid=self.grad_grid)

    def _grad_function(self, A: SparseTensor, method: str):
        """(values, b) -> solve(A.with_values(values), b). For methods that need a symmetric A the
        values are symmetrized first, ``(v + v^T) / 2`` on the pattern, so that gradcheck's
        one-entry perturbations stay inside the method's domain (Cholesky reads one triangle),
        and the structure is passed as ``properties=`` (a perturbed Laplacian is SPD but no
        longer diagonally dominant, which is what detection looks for)."""
        need = self.requirement(method)
        if need == "general":
            return lambda values, rhs: self.solve(A.with_values(values), rhs, method, rtol=1e-12)
        perm = _transpose_slots(A)
        return lambda values, rhs: self.solve(A.with_values((values + values[..., perm]) / 2), rhs, method, rtol=1e-12,
                                              properties=need)

    def test_gradcheck(self, method, device):
        """gradcheck in float64 of (values, b) -> solve(A.with_values(values), b)."""
        self.need_grad()
        p = self._grad_problem(method, device=device)
        v = p.A.values.detach().clone().requires_grad_()
        b = p.rhs().requires_grad_()
        f = self._grad_function(p.A, method)
        assert torch.autograd.gradcheck(f, (v, b), atol=self.grad_atol(method), rtol=1e-3)

    def test_gradient_matches_dense_oracle(self, method, fmt, device):
        """Gradients w.r.t. values live on the pattern (padding slots get 0) and match dense autograd."""
        self.need_grad()
        p = self._grad_problem(method, fmt=fmt, device=device)
        A = p.A
        g = torch.Generator().manual_seed(7)
        w = torch.randn(p.n, generator=g, dtype=torch.float64).to(device)
        v = A.values.detach().clone().requires_grad_()
        b = p.rhs().requires_grad_()
        x = self.solve(A.with_values(v), b, method, rtol=1e-12)
        gv, gb = torch.autograd.grad(_loss(x, w), (v, b))
        vd = A.values.detach().clone().requires_grad_()
        bd = b.detach().clone().requires_grad_()
        xd = torch.linalg.solve(A.with_values(vd).to_dense(), bd)
        gvd, gbd = torch.autograd.grad(_loss(xd, w), (vd, bd))
        assert gv.shape == v.shape, f"dL/dvalues has shape {tuple(gv.shape)}, values {tuple(v.shape)}"
        on = _slots_on_pattern(A)
        assert torch.all(gv[..., ~on] == 0), "dL/dvalues is nonzero on padding slots (off the pattern)"
        self.assert_close(gb, gbd, torch.float64, f"dL/db ({method}, {_name(fmt)})", scale=10)
        self.assert_close(gv, gvd, torch.float64, f"dL/dvalues ({method}, {_name(fmt)})", scale=10)

    def test_gradient_complex_matches_dense_oracle(self, method, device):
        self.need("supports_complex")
        self.need("supports_grad")
        if torch.complex128 not in self.complex_dtypes:
            pytest.skip(f"{self.backend}: complex gradient checks run in complex128, which is not in complex_dtypes")
        p = self.problem(method, dtype=torch.complex128, device=device, grid=self.grad_grid)
        A = p.A
        w = p.rhs(seed=11)
        v = A.values.detach().clone().requires_grad_()
        b = p.rhs().requires_grad_()
        x = self.solve(A.with_values(v), b, method, rtol=1e-12)
        gv, gb = torch.autograd.grad(_loss(x, w), (v, b))
        vd = A.values.detach().clone().requires_grad_()
        bd = b.detach().clone().requires_grad_()
        xd = torch.linalg.solve(A.with_values(vd).to_dense(), bd)
        gvd, gbd = torch.autograd.grad(_loss(xd, w), (vd, bd))
        self.assert_close(gb, gbd, torch.complex128, f"dL/db ({method}, complex)", scale=10)
        self.assert_close(gv, gvd, torch.complex128, f"dL/dvalues ({method}, complex)", scale=10)

    def test_gradient_value_batch(self, method, device):
        self.need_grad()
        self.need("supports_batch")
        p = self._grad_problem(method, device=device)
        Ab = p.value_batch(2)
        v = Ab.values.detach().clone().requires_grad_()
        b = p.rhs(batch=(2,)).requires_grad_()
        w = p.rhs(batch=(2,), seed=5)
        x = self.solve(Ab.with_values(v), b, method, rtol=1e-12)
        gv, gb = torch.autograd.grad(_loss(x, w), (v, b))
        vd = v.detach().clone().requires_grad_()
        bd = b.detach().clone().requires_grad_()
        xd = torch.linalg.solve(Ab.with_values(vd).to_dense(), bd.unsqueeze(-1)).squeeze(-1)
        gvd, gbd = torch.autograd.grad(_loss(xd, w), (vd, bd))
        self.assert_close(gb, gbd, torch.float64, f"dL/db on a value batch ({method})", scale=10)
        self.assert_close(gv, gvd, torch.float64, f"dL/dvalues on a value batch ({method})", scale=10)

    def test_gradgradcheck(self, direct_method, device):
        """Second derivatives (create_graph through the adjoint solve) by gradgradcheck."""
        self.need_grad()
        method = direct_method
        p = self._grad_problem(method, device=device)
        v = p.A.values.detach().clone().requires_grad_()
        b = p.rhs().requires_grad_()
        f = self._grad_function(p.A, method)
        assert torch.autograd.gradgradcheck(f, (v, b), atol=1e-6, rtol=1e-3)

    def test_second_derivatives_match_dense_oracle(self, direct_method, device):
        """A Hessian-vector product through create_graph=True matches dense autograd."""
        self.need_grad()
        method = direct_method
        p = self._grad_problem(method, device=device)
        A = p.A
        g = torch.Generator().manual_seed(3)
        w = torch.randn(p.n, generator=g, dtype=torch.float64).to(device)
        uv = torch.randn(A.values.shape, generator=g, dtype=torch.float64).to(device) * _slots_on_pattern(A)
        ub = torch.randn(p.n, generator=g, dtype=torch.float64).to(device)

        def hvp(solver):
            v = A.values.detach().clone().requires_grad_()
            b = p.rhs().requires_grad_()
            x = solver(v, b)
            gv, gb = torch.autograd.grad(_loss(x, w), (v, b), create_graph=True)
            return torch.autograd.grad((gv * uv).sum() + (gb * ub).sum(), (v, b))

        got = hvp(lambda v, b: self.solve(A.with_values(v), b, method, rtol=1e-12))
        ref = hvp(lambda v, b: torch.linalg.solve(A.with_values(v).to_dense(), b))
        self.assert_close(got[0], ref[0], torch.float64, f"Hessian-vector product, values part ({method})", scale=10)
        self.assert_close(got[1], ref[1], torch.float64, f"Hessian-vector product, b part ({method})", scale=10)

    def test_func_grad_over_rhs(self, method, device):
        self.need_grad()
        p = self._grad_problem(method, device=device)
        b = p.rhs()
        got = torch.func.grad(lambda rhs: (self.solve(p.A, rhs, method, rtol=1e-12) ** 2).sum())(b)
        dense = p.dense
        ref = torch.func.grad(lambda rhs: (torch.linalg.solve(dense, rhs) ** 2).sum())(b)
        self.assert_close(got, ref, torch.float64, f"torch.func.grad over b ({method})", scale=10)

    def test_vmap_over_rhs_matches_loop(self, method, device):
        dtype = self.base_dtype
        p = self.problem(method, dtype=dtype, device=device, grid=self.grad_grid)
        B = p.rhs(batch=(4,))  # (4, n): vmap maps over the leading dimension
        got = torch.func.vmap(lambda rhs: self.solve(p.A, rhs, method))(B)
        loop = torch.stack([self.solve(p.A, B[i], method) for i in range(B.shape[0])])
        assert got.shape == loop.shape
        self.assert_close(got, loop, dtype, f"vmap over right-hand sides vs a loop ({method})")
        self.assert_close(got, p.solution(B.T).T, dtype, f"vmap over right-hand sides vs dense ({method})")

    # Solver (plan / factorize / update_values / solve) ----------------------------------------------
    def test_solver_matches_fresh_solves(self, method, dtype, device):
        p = self.problem(method, dtype=dtype, device=device)
        A = p.A
        b = p.rhs()
        v2 = p.value_batch(2).values[1].clone()  # new values on the same pattern, same structure
        with st.Solver(A, backend=self.backend, method=method, rtol=self.rtol[dtype]) as s:
            table = s.plan()
            assert table.chosen is not None and (table.chosen.backend, table.chosen.method) == (self.backend, method)
            assert (s.backend, s.method) == (self.backend, method)
            s.factorize()
            x1 = s.solve(b)
            self.assert_close(x1, p.solution(b), dtype, f"Solver({method}).solve")
            self.assert_close(x1, self.solve(A, b, method), dtype, f"Solver({method}) vs solve()")
            if self.supports_multiple_rhs:
                B = p.rhs(2)
                self.assert_close(s.solve(B), p.solution(B), dtype, f"Solver({method}).solve with B (n, 2)")
            s.update_values(v2)
            x2 = s.solve(b)
            A2 = A.with_values(v2)
            self.assert_close(x2, p.solution(b, A2), dtype, f"Solver({method}) after update_values")
            self.assert_close(x2, self.solve(A2, b, method), dtype, f"Solver({method}) after update_values vs solve()")
            s.update_values(A.values)
            self.assert_close(s.solve(b), x1, dtype, f"Solver({method}) back to the first values")

    def test_solver_reports_plan_reuse(self, method, device):
        p = self.problem(method, dtype=self.base_dtype, device=device)
        with st.Solver(p.A, backend=self.backend, method=method, rtol=self.rtol[self.base_dtype]) as s:
            s.plan()
            s.factorize()
            s.solve(p.rhs())
            s.update_values(p.A.values * 2)
            x, info = s.solve(p.rhs(), return_info=True)
        assert (info.backend, info.method) == (self.backend, method)
        assert info.plan_reused, "a Solver's solve after update_values reused its plan, but info.plan_reused is False"

    # Plan cache ---------------------------------------------------------------------------------
    def test_plan_cache_reused_for_new_values(self, method, device):
        p = self.problem(method, dtype=self.base_dtype, device=device)
        A, b = p.A, p.rhs()
        x1, i1 = self.solve(A, b, method, return_info=True)
        hits = st.plan_cache().hits
        A2 = A.with_values(p.value_batch(2).values[1].clone())
        x2, i2 = self.solve(A2, b, method, return_info=True)
        assert st.plan_cache().hits > hits, "a second solve on the same pattern did not hit the plan cache"
        assert i2.plan_reused and not i1.plan_reused
        self.assert_close(x2, p.solution(b, A2), self.base_dtype, f"solve {method} with new values on a cached plan")
        # And back: the cached plan must not keep the second values.
        self.assert_close(self.solve(A, b, method), x1, self.base_dtype, f"solve {method} back on the first values")

    def test_plan_cache_not_reused_for_other_pattern(self, method, device):
        p = self.problem(method, dtype=self.base_dtype, device=device)
        A, b = p.A, p.rhs()
        self.solve(A, b, method)
        # The same matrix with its unknowns renumbered: same shape and nnz, another pattern.
        perm = torch.randperm(p.n, generator=torch.Generator().manual_seed(2)).to(device)
        dense = p.dense[perm][:, perm]
        B = SparseTensor.from_dense(dense.to(A.dtype), A.format)
        assert B.nse == A.nse and tuple(B.shape) == tuple(A.shape)
        misses = st.plan_cache().misses
        x, info = self.solve(B, b, method, return_info=True)
        assert not info.plan_reused, "a plan was reused for a different sparsity pattern"
        assert st.plan_cache().misses > misses
        self.assert_close(x, torch.linalg.solve(dense, b.to(dense.dtype)), self.base_dtype, f"solve {method} on the other pattern")

    @pytest.mark.parametrize("change", ["with_values", "in_place", "numpy_view"])
    def test_value_changes_always_seen(self, method, change, device):
        """Whatever way A's values change between two solves, the second solve sees them."""
        if change == "numpy_view" and torch.device(device).type != "cpu":
            pytest.skip("NumPy views exist for CPU tensors only")
        p = self.problem(method, dtype=self.base_dtype, device=device)
        A, b = p.A.with_values(p.A.values.detach().clone()), p.rhs()
        self.solve(A, b, method)
        if change == "with_values":
            A = A.with_values(A.values * 2)
        elif change == "in_place":
            A.values.mul_(2)  # bumps the tensor's version counter
        else:
            A.values.numpy()[...] *= 2  # a write torch cannot see (NumPy, DLPack, gradcheck's .data)
        x = self.solve(A, b, method)
        self.assert_close(x, p.solution(b, A), self.base_dtype, f"solve {method} after values changed ({change})")

    @pytest.mark.parametrize("change", ["in_place", "numpy_view"])
    def test_structure_change_seen_by_method_choice(self, change, device):
        """An SPD matrix made non-symmetric between two solves (method left to dispatch): the
        second solve is right, or refused with NoBackendError, never silently wrong (a method
        chosen for the old structure, e.g. Cholesky reading one triangle)."""
        if change == "numpy_view" and torch.device(device).type != "cpu":
            pytest.skip("NumPy views exist for CPU tensors only")
        dtype = self.base_dtype
        p = self.problem(None, kind="spd", dtype=dtype, device=device, grid=self.grad_grid)
        A, b = p.A.with_values(p.A.values.detach().clone()), p.rhs()
        self.solve(A, b, None)
        coords, slot = A.entries()
        k = int(slot[coords[0] != coords[1]][0])  # an off-diagonal entry
        if change == "in_place":
            A.values[k] = 3.0
        else:
            A.values.numpy()[k] = 3.0
        try:
            x = self.solve(A, b, None)
        except st.NoBackendError:
            return  # this backend has no method for a general matrix: refusing is right
        self.assert_close(x, p.solution(b, A), dtype, f"auto-chosen method after A lost its symmetry ({change})")


# ================================================================================================
# matmul, Matmul, norm
# ================================================================================================


class MatmulConformance(ConformanceBase):
    """Sparse @ dense in every input format (``matmul``, ``A @ X``, ``X @ A``, ``Matmul``), its
    gradients, and ``norm``, against dense oracles."""

    #: Shape of the (rectangular) test matrix.
    matmul_shape: ClassVar[tuple[int, int]] = (10, 14)

    def _matrix(self, fmt: TensorFormat, dtype: torch.dtype, device: str, seed: int = 0) -> SparseTensor:
        m, n = self.matmul_shape
        return random_rectangular(m, n, format=fmt, dtype=dtype, device=device, seed=seed)

    @staticmethod
    def _randn(*shape: int, dtype: torch.dtype, device: str, seed: int = 1) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return torch.randn(shape, generator=g, dtype=oracle_dtype(dtype)).to(dtype=dtype, device=device)

    def matmul(self, A: SparseTensor, X: torch.Tensor) -> torch.Tensor:
        return st.matmul(A, X, backend=self.backend)

    def test_matmul_matches_dense(self, fmt, dtype, device):
        A = self._matrix(fmt, dtype, device)
        D = A.to_dense().to(oracle_dtype(dtype))
        m, n = self.matmul_shape
        x = self._randn(n, dtype=dtype, device=device)
        table = st.explain("matmul", A, x, backend=self.backend)
        assert table.chosen is not None and table.chosen.backend == self.backend
        self.assert_close(self.matmul(A, x), D @ x.to(D.dtype), dtype, f"matmul(A, x) in {_name(fmt)}")
        self.assert_close(A @ x, D @ x.to(D.dtype), dtype, f"A @ x in {_name(fmt)}")
        y = self._randn(m, dtype=dtype, device=device, seed=2)
        self.assert_close(y @ A, y.to(D.dtype) @ D, dtype, f"y @ A in {_name(fmt)}")
        if self.supports_multiple_rhs:
            X = self._randn(n, 3, dtype=dtype, device=device)
            self.assert_close(self.matmul(A, X), D @ X.to(D.dtype), dtype, f"matmul(A, X (n, 3)) in {_name(fmt)}")
            self.assert_close(A @ X, D @ X.to(D.dtype), dtype, f"A @ X in {_name(fmt)}")
            Y = self._randn(2, m, dtype=dtype, device=device, seed=3)
            self.assert_close(Y @ A, Y.to(D.dtype) @ D, dtype, f"Y (2, m) @ A in {_name(fmt)}")

    def test_matmul_value_batch(self, fmt, dtype, device):
        self.need("supports_batch")
        A = self._matrix(fmt, dtype, device)
        Ab = A.with_values(torch.stack([A.values, 2 * A.values + 1]))
        D = Ab.to_dense().to(oracle_dtype(dtype))
        n = self.matmul_shape[1]
        x = self._randn(2, n, dtype=dtype, device=device)
        self.assert_close(self.matmul(Ab, x), (D @ x.to(D.dtype).unsqueeze(-1)).squeeze(-1), dtype, f"batched A @ x in {_name(fmt)}")
        if self.supports_multiple_rhs:
            X = self._randn(2, n, 3, dtype=dtype, device=device)
            self.assert_close(self.matmul(Ab, X), D @ X.to(D.dtype), dtype, f"batched A @ X in {_name(fmt)}")

    def test_matmul_complex(self, fmt, complex_dtype, device):
        self.need("supports_complex")
        A = self._matrix(fmt, complex_dtype, device)
        D = A.to_dense().to(torch.complex128)
        n = self.matmul_shape[1]
        X = self._randn(n, 2, dtype=complex_dtype, device=device)
        self.assert_close(self.matmul(A, X), D @ X.to(D.dtype), complex_dtype, f"complex A @ X in {_name(fmt)}")
        y = self._randn(self.matmul_shape[0], dtype=complex_dtype, device=device, seed=4)
        self.assert_close(y @ A, y.to(D.dtype) @ D, complex_dtype, f"complex y @ A in {_name(fmt)}")

    def test_Matmul_updates_c_in_place(self, fmt, dtype, device):
        """UST form: ``with Matmul(a, b, c, beta=1.0) as mm: mm.plan(); mm.execute()`` sets c := a @ b + c."""
        A = self._matrix(fmt, dtype, device)
        D = A.to_dense().to(oracle_dtype(dtype))
        m, n = self.matmul_shape
        k = 3 if self.supports_multiple_rhs else None
        shape_b = (n, k) if k else (n,)
        shape_c = (m, k) if k else (m,)
        b = self._randn(*shape_b, dtype=dtype, device=device)
        c = self._randn(*shape_c, dtype=dtype, device=device, seed=5)
        c0 = c.clone()
        ref = D @ b.to(D.dtype)
        with st.Matmul(A, b, c, beta=1.0, backend=self.backend) as mm:
            table = mm.plan()
            assert table.chosen is not None and table.chosen.backend == self.backend
            out = mm.execute()
            assert out is c, "Matmul.execute must return c, updated in place"
            self.assert_close(c, ref + c0.to(D.dtype), dtype, f"Matmul beta=1 in {_name(fmt)}")
            mm.execute()  # again: accumulates
            self.assert_close(c, 2 * ref + c0.to(D.dtype), dtype, f"Matmul executed twice in {_name(fmt)}")
            b2 = self._randn(*shape_b, dtype=dtype, device=device, seed=6)
            c.copy_(c0)
            mm.reset_operands(b=b2, alpha=2.0, beta=0.5)
            mm.execute()
            self.assert_close(c, 2 * (D @ b2.to(D.dtype)) + 0.5 * c0.to(D.dtype), dtype, f"Matmul alpha=2, beta=0.5 in {_name(fmt)}")
            mm.reset_operands(a=A.with_values(3 * A.values), alpha=1.0, beta=0.0)
            mm.execute()
            self.assert_close(c, 3 * (D @ b2.to(D.dtype)), dtype, f"Matmul with new values in {_name(fmt)}")
        with st.Matmul(A, b, backend=self.backend) as mm:
            mm.plan()
            self.assert_close(mm.execute(), ref, dtype, f"Matmul without c in {_name(fmt)}")

    def test_matmul_gradcheck(self, fmt, device):
        self.need_grad()
        A = self._matrix(fmt, torch.float64, device)
        n = self.matmul_shape[1]
        v = A.values.detach().clone().requires_grad_()
        X = self._randn(n, 2, dtype=torch.float64, device=device).requires_grad_()
        assert torch.autograd.gradcheck(lambda values, x: self.matmul(A.with_values(values), x), (v, X))

    def test_matmul_gradient_matches_dense_oracle(self, fmt, device):
        self.need_grad()
        A = self._matrix(fmt, torch.float64, device)
        m, n = self.matmul_shape
        w = self._randn(m, 2, dtype=torch.float64, device=device, seed=8)
        v = A.values.detach().clone().requires_grad_()
        X = self._randn(n, 2, dtype=torch.float64, device=device).requires_grad_()
        gv, gx = torch.autograd.grad(_loss(self.matmul(A.with_values(v), X), w), (v, X))
        vd = v.detach().clone().requires_grad_()
        Xd = X.detach().clone().requires_grad_()
        gvd, gxd = torch.autograd.grad(_loss(A.with_values(vd).to_dense() @ Xd, w), (vd, Xd))
        assert torch.all(gv[..., ~_slots_on_pattern(A)] == 0), "dL/dvalues is nonzero on padding slots"
        self.assert_close(gx, gxd, torch.float64, f"dL/dX of A @ X in {_name(fmt)}")
        self.assert_close(gv, gvd, torch.float64, f"dL/dvalues of A @ X in {_name(fmt)}")

    def test_matmul_vmap_over_x(self, device):
        dtype = self.base_dtype
        A = self._matrix(CSR, dtype, device)
        n = self.matmul_shape[1]
        Xs = self._randn(4, n, dtype=dtype, device=device)
        got = torch.func.vmap(lambda x: self.matmul(A, x))(Xs)
        D = A.to_dense().to(oracle_dtype(dtype))
        self.assert_close(got, Xs.to(D.dtype) @ D.T, dtype, "vmap of matmul over x")

    @pytest.mark.parametrize("ord", ["fro", 1, math.inf, "max"], ids=["fro", "1", "inf", "max"])
    def test_norm_matches_dense(self, fmt, dtype, device, ord):
        A = self._matrix(fmt, dtype, device)
        D = A.to_dense().to(oracle_dtype(dtype))
        ref = D.abs().amax() if ord == "max" else torch.linalg.matrix_norm(D, ord)
        self.assert_close(st.norm(A, ord).reshape(()), ref, dtype, f"norm(A, {ord!r}) in {_name(fmt)}")
        if self.supports_batch:
            Ab = A.with_values(torch.stack([A.values, -3 * A.values]))
            Db = Ab.to_dense().to(oracle_dtype(dtype))
            refb = Db.abs().amax((-2, -1)) if ord == "max" else torch.linalg.matrix_norm(Db, ord)
            self.assert_close(st.norm(Ab, ord), refb, dtype, f"norm of a value batch, {ord!r}, in {_name(fmt)}")

    def test_matmul_inputs_never_modified(self, fmt, device):
        dtype = self.base_dtype
        A = self._matrix(fmt, dtype, device)
        A = A.with_values(A.values.detach().clone().requires_grad_(self.supports_grad))
        m, n = self.matmul_shape
        X = self._randn(n, 2, dtype=dtype, device=device).requires_grad_(self.supports_grad)
        c = self._randn(m, 2, dtype=dtype, device=device, seed=9)
        before = _snapshot(A, X)
        y = self.matmul(A, X)
        z = X.T @ A.T  # the x @ A form on the transposed view
        if self.supports_grad:
            (y.sum() + z.sum()).backward()
        _assert_unchanged(before, A, X, what=f"matmul in {_name(fmt)}")
        with st.Matmul(A.detach(), X.detach(), c, beta=1.0, backend=self.backend) as mm:
            mm.execute()
        _assert_unchanged(before, A, X, what=f"Matmul in {_name(fmt)} (only c is written)")

    @pytest.mark.parametrize("change", ["with_values", "in_place", "numpy_view"])
    def test_matmul_value_changes_always_seen(self, fmt, change, device):
        if change == "numpy_view" and torch.device(device).type != "cpu":
            pytest.skip("NumPy views exist for CPU tensors only")
        dtype = self.base_dtype
        A = self._matrix(fmt, dtype, device)
        A = A.with_values(A.values.detach().clone())
        X = self._randn(self.matmul_shape[1], 2, dtype=dtype, device=device)
        self.matmul(A, X)
        if change == "with_values":
            A = A.with_values(A.values * 2)
        elif change == "in_place":
            A.values.mul_(2)
        else:
            A.values.numpy()[...] *= 2
        D = A.to_dense().to(oracle_dtype(dtype))
        self.assert_close(self.matmul(A, X), D @ X.to(D.dtype), dtype, f"A @ X after values changed ({change}) in {_name(fmt)}")


# ================================================================================================
# errors
# ================================================================================================


class ErrorConformance(ConformanceBase):
    """Every bad input raises the library's named error, with a message that names the problem,
    whatever the backend; and inputs are never modified."""

    def _spd(self, device: str | None = None) -> Problem:
        return make_problem("spd", (4, 3), dtype=self.base_dtype, device=device or self.base_device)

    def _first_method(self) -> str | None:
        return self.methods[0] if self.methods else None

    def test_non_square_matrix(self, device):
        A = random_rectangular(6, 8, dtype=self.base_dtype, device=device)
        with pytest.raises(st.InputError, match=r"square.*6x8"):
            st.solve(A, torch.ones(6, dtype=self.base_dtype, device=device), backend=self.backend, method=self._first_method())

    def test_rhs_shape_mismatch(self, device):
        p = self._spd(device=device)
        n = p.n
        dt = self.base_dtype
        for bad in (torch.ones(n - 1, dtype=dt, device=device), torch.ones(n + 1, 2, dtype=dt, device=device)):
            with pytest.raises(st.InputError, match=r"shape") as info:
                st.solve(p.A, bad, backend=self.backend, method=self._first_method())
            assert str(tuple(bad.shape)) in str(info.value) and str(n) in str(info.value)
        with pytest.raises(st.InputError, match=r"shape"):
            st.matmul(p.A, torch.ones(n + 2, dtype=dt, device=device), backend=self.backend)

    def test_dtype_mismatch(self, device):
        p = self._spd(device=device)
        other = torch.float32 if p.A.dtype == torch.float64 else torch.float64
        b = p.rhs(dtype=other)
        names = [_name(p.A.dtype), _name(other)]
        pattern = f"{names[0]}.*{names[1]}|{names[1]}.*{names[0]}"
        with pytest.raises(st.InputError, match=pattern):
            st.solve(p.A, b, backend=self.backend, method=self._first_method())
        with pytest.raises(st.InputError, match=pattern):
            st.matmul(p.A, b, backend=self.backend)

    def test_integer_rhs(self, device):
        p = self._spd(device=device)
        b = torch.ones(p.n, dtype=torch.int64, device=device)
        with pytest.raises(st.InputError, match=r"int64"):
            st.solve(p.A, b, backend=self.backend, method=self._first_method())

    def test_device_mismatch(self):
        if not torch.cuda.is_available():
            pytest.skip("needs CUDA to put A and b on different devices")
        p = self._spd()
        b = p.rhs().cuda()
        with pytest.raises(st.InputError, match=r"cpu.*cuda|cuda.*cpu"):
            st.solve(p.A, b, backend=self.backend, method=self._first_method())
        with pytest.raises(st.InputError, match=r"cpu.*cuda|cuda.*cpu"):
            st.matmul(p.A, b, backend=self.backend)

    @pytest.mark.parametrize("where", ["A", "b"])
    @pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
    def test_nonfinite_input_rejected(self, method, where, bad, device):
        p = self.problem(method, dtype=self.base_dtype, device=device, grid=(4, 3))
        A, b = p.A, p.rhs()
        if where == "A":
            vals = A.values.detach().clone()
            vals[1] = bad
            A = A.with_values(vals)
        else:
            b = b.clone()
            b[2] = bad
        with pytest.raises(st.InputError) as info:
            self.solve(A, b, method)
        msg = str(info.value)
        assert ("NaN" in msg or "Inf" in msg) and "check_finite=False" in msg, msg
        assert ("A's values" in msg) if where == "A" else ("right-hand side" in msg), msg

    @pytest.mark.parametrize("where", ["A", "b"])
    def test_check_finite_false_skips_the_check(self, method, where, device):
        """With check_finite=False the NaN reaches the method: no InputError; the method may
        return non-finite values or stop with its own named error."""
        p = self.problem(method, dtype=self.base_dtype, device=device, grid=(4, 3))
        A, b = p.A, p.rhs()
        if where == "A":
            vals = A.values.detach().clone()
            vals[1] = math.nan
            A = A.with_values(vals)
        else:
            b = b.clone()
            b[2] = math.nan
        try:
            x = self.solve(A, b, method, check_finite=False, on_nonconvergence="ignore")
        except st.InputError as exc:  # pragma: no cover - the failure we test for
            pytest.fail(f"check_finite=False still raised InputError: {exc}")
        except st.SparseTorchError:
            pass  # the method met the NaN itself and said so with a named error
        else:
            assert x.shape == b.shape

    def test_singular_matrix_direct(self, general_direct_method, device):
        """An exactly singular matrix (a zero row and column) with a direct method."""
        method = general_direct_method
        kind = self.requirement(method)
        p = self.problem(method, kind=kind, dtype=self.base_dtype, device=device, grid=(4, 3))
        dense = p.dense.clone()
        dense[3, :] = 0
        dense[:, 3] = 0
        A = SparseTensor.from_dense(dense.to(self.base_dtype), CSR)
        with pytest.raises(st.SingularMatrixError, match=r"singular"):
            self.solve(A, p.rhs(), method)

    def test_indefinite_matrix_with_spd_forced(self, spd_method, device):
        """properties='spd' on a symmetric indefinite matrix: the method finds out and says so."""
        method = spd_method
        p = self.problem(None, kind="symmetric", dtype=self.base_dtype, device=device, grid=(4, 3))
        with pytest.raises(st.IndefiniteMatrixError, match=r"(?i)positive definite"):
            self.solve(p.A, p.rhs(), method, properties="spd")

    @pytest.mark.parametrize("policy", ["raise", "warn", "ignore"])
    def test_maxiter_reached(self, iterative_method, policy, device):
        method = iterative_method
        p = self.problem(method, dtype=self.base_dtype, device=device)
        b = p.rhs()
        kw = dict(maxiter=2, rtol=1e-12, on_nonconvergence=policy)
        if method in self.restarted_methods:
            kw["restart"] = 2  # maxiter counts restart cycles there
        if policy == "raise":
            with pytest.raises(st.NotConvergedError, match=r"maxiter") as info:
                self.solve(p.A, b, method, **kw)
            rec = info.value.info
            assert rec is not None and not rec.converged and rec.status is st.Status.MAX_ITERATIONS, rec
            assert rec.residual > 1e-12
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x, info = self.solve(p.A, b, method, return_info=True, **kw)
        ours = [w for w in caught if issubclass(w.category, st.SparseTorchWarning)]
        if policy == "warn":
            assert any(issubclass(w.category, st.NotConvergedWarning) for w in ours), [str(w.message) for w in caught]
        else:
            assert not ours, [str(w.message) for w in ours]
        assert x.shape == b.shape and torch.isfinite(x).all()
        assert not info.converged and info.status is st.Status.MAX_ITERATIONS, info
        assert info.residual > 1e-12, info

    def test_zero_tolerances(self):
        p = self._spd()
        with pytest.raises(st.InputError, match=r"rtol.*atol"):
            st.solve(p.A, p.rhs(), backend=self.backend, method=self._first_method(), rtol=0, atol=0)

    def test_unknown_method(self):
        p = self._spd()
        with pytest.raises(st.NoBackendError) as info:
            st.solve(p.A, p.rhs(), backend=self.backend, method="no_such_method")
        msg = str(info.value)
        assert "no_such_method" in msg and "Candidates" in msg, msg
        for m in self.methods:
            assert f"{self.backend}/{m}:" in msg, f"the candidate {self.backend}/{m} and its reason are not listed:\n{msg}"
        lines = [ln for ln in msg.splitlines() if ln.strip().startswith(f"- {self.backend}")]
        assert lines and all(ln.split(":", 1)[1].strip() for ln in lines), f"a candidate without a reason:\n{msg}"

    def test_inputs_never_modified(self, method, device):
        p = self.problem(method, dtype=self.base_dtype, device=device, grid=(4, 3))
        A = p.A.with_values(p.A.values.detach().clone().requires_grad_(self.supports_grad))
        b = p.rhs().requires_grad_(self.supports_grad)
        before = _snapshot(A, b)
        x = self.solve(A, b, method)
        if self.supports_grad:
            x.pow(2).sum().backward()
        _assert_unchanged(before, A, b, what=f"solve({method})")
        with st.Solver(A.detach(), backend=self.backend, method=method, rtol=self.rtol[A.dtype]) as s:
            s.solve(b.detach())
            s.update_values(A.values.detach() * 2)
            s.solve(b.detach())
        _assert_unchanged(before, A, b, what=f"Solver({method})")

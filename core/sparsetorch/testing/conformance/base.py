"""The base class of the conformance kit: class attributes, parametrization, fixtures, helpers.

Attributes that repeat what the backend declares in its :class:`~sparsetorch.BackendInfo`
(``methods``, ``devices``, ``dtypes``, ``complex_dtypes``, ``supports_complex``, and the
eigenvalue and determinant methods of :mod:`.spectral`) default to that declaration, read from
the registry (``sparsetorch.registry()``) when the backend is loaded, else from ``plugin``'s
``sparsetorch_backend_info`` hook. A subclass that sets one of them explicitly overrides it.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Generic, Mapping, TypeVar

import pytest
import torch

import sparsetorch as st
from ...backend import DIRECT_METHODS as _RECORD_DIRECT_METHODS
from ...backend import BackendInfo
from ...format import BSR, COO, CSC, CSR, DIA, TensorFormat
from ...tensor import SparseTensor
from ..problems import Problem, make_problem

__all__ = ["ConformanceBase", "DIRECT_METHODS", "REQUIREMENT_WORDS"]

#: Methods that factorize (everything else iterates and gets a tolerance).
DIRECT_METHODS = frozenset(_RECORD_DIRECT_METHODS)

#: What a decline must say for each requirement (case-insensitive), beside the method's name.
REQUIREMENT_WORDS = {"spd": "symmetric positive definite", "symmetric": "symmetric"}


def _name(x: Any) -> str:
    if isinstance(x, torch.dtype):
        return str(x).replace("torch.", "")
    if isinstance(x, TensorFormat):
        return x.name or str(x)
    return str(x)


# Defaults read from the backend's declaration ---------------------------------------------------
T = TypeVar("T")


class from_backend_info(Generic[T]):  # noqa: N801 - a descriptor, named like ``property``
    """A class attribute whose default is what the backend declares in its BackendInfo.

    ``read(info, cls)`` turns the declaration into the attribute's value; ``fallback`` is the
    value while no declaration can be read (at collection time only: the axes that would use
    it fail with the reason instead, see :meth:`ConformanceBase.pytest_generate_tests`). A plain
    value set on a subclass shadows it, as any class attribute does.
    """

    def __init__(self, read: Callable[[BackendInfo, type], T], fallback: T) -> None:
        self.read, self.fallback = read, fallback

    def __get__(self, obj: Any, cls: type | None = None) -> T:
        cls = cls if cls is not None else type(obj)
        info, _ = _backend_info(cls)
        return self.fallback if info is None else self.read(info, cls)


def _backend_info(cls: type) -> tuple[BackendInfo | None, str]:
    """``cls.backend``'s BackendInfo (registry first, then ``cls.plugin``'s hook), or None and why."""
    name = getattr(cls, "backend", "")
    if not name:
        return None, f"{cls.__name__} sets no `backend`"
    backends = st.registry()
    if name in backends.names:
        return backends.info(name), ""
    plugin = getattr(cls, "plugin", None)
    if plugin is None:
        return None, f"backend {name!r} is not loaded and `plugin` is not set"
    hook = getattr(plugin, "sparsetorch_backend_info", None)
    if hook is None:
        return None, f"`plugin` ({plugin!r}) has no sparsetorch_backend_info hook"
    try:
        info = hook()
    except Exception as exc:  # noqa: BLE001 - reported as the reason the axis cannot be built
        return None, f"{name}'s sparsetorch_backend_info raised {type(exc).__name__}: {exc}"
    if not isinstance(info, BackendInfo):
        return None, f"{name}'s sparsetorch_backend_info returned {type(info).__name__}, not a BackendInfo"
    return info, ""


def _dtypes(info: BackendInfo, cls: type, *, complex_: bool) -> tuple[torch.dtype, ...]:
    """The declared dtypes of one kind that the kit has tolerances for, widest first."""
    known = set(cls.rtol) & set(cls.check_rtol)
    chosen = [d for d in info.dtypes if d.is_complex == complex_ and d in known]
    return tuple(sorted(chosen, key=lambda d: -d.itemsize))


def _complex_dtypes(info: BackendInfo, cls: type) -> tuple[torch.dtype, ...]:
    """The declared complex dtypes; with none declared, the kit's two (their cases skip with
    ``supports_complex=False``, a clearer reason than an empty axis)."""
    return _dtypes(info, cls, complex_=True) or (torch.complex128, torch.complex64)


def _is_declared(cls: type, attr: str) -> bool:
    """Whether ``attr`` of ``cls`` is still the BackendInfo default (not set by a subclass)."""
    for k in cls.__mro__:
        if attr in k.__dict__:
            return isinstance(k.__dict__[attr], from_backend_info)
    return False


class _Unresolved:
    """The one value of an axis whose default could not be read; the test fails with ``why``."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return "unresolved"


# The base class -----------------------------------------------------------------------------------
class ConformanceBase:
    """Class attributes a backend's test class sets, and the helpers the suites share."""

    #: The backend under test (every call pins it with ``backend=``).
    backend: ClassVar[str] = ""
    #: Its hook module, registered in-process when the entry point is not installed (or None).
    plugin: ClassVar[Any] = None
    #: Kit tests to skip, ``{test name: reason}``; a name is a test function (``"test_gradcheck"``)
    #: or one case of it (``"test_gradcheck[lu-cpu]"``). Names that are no test of the class fail.
    tests_to_skip: ClassVar[Mapping[str, str]] = {}
    #: Solve methods to test (from ``records.METHODS``); default: the declared ``ops["solve"]``.
    methods: ClassVar[tuple[str, ...]] = from_backend_info(lambda info, cls: info.methods("solve"), ())
    #: Devices to run on ("cpu", "cuda", "cuda:1", ...); absent devices skip. Default: declared.
    devices: ClassVar[tuple[str, ...]] = from_backend_info(lambda info, cls: tuple(info.devices), ("cpu",))
    #: Real dtypes to run the value tests in; default: the declared real dtypes with tolerances here.
    dtypes: ClassVar[tuple[torch.dtype, ...]] = from_backend_info(
        lambda info, cls: _dtypes(info, cls, complex_=False), (torch.float64, torch.float32))
    #: Half-precision dtypes of the product tests (float32 accumulation expected); default: the
    #: declared ones among float16 and bfloat16. Solves in half precision are not part of the kit.
    half_dtypes: ClassVar[tuple[torch.dtype, ...]] = from_backend_info(
        lambda info, cls: tuple(d for d in (torch.float16, torch.bfloat16) if d in info.dtypes), ())
    #: Complex dtypes, used when ``supports_complex``; default: the declared complex dtypes.
    complex_dtypes: ClassVar[tuple[torch.dtype, ...]] = from_backend_info(_complex_dtypes, (torch.complex128, torch.complex64))
    #: Input formats every value test is repeated in. Not read from BackendInfo: its ``formats``
    #: are the ones consumed without a conversion, while every backend must accept all of these.
    formats: ClassVar[tuple[TensorFormat, ...]] = (CSR, CSC, COO, BSR(2, 2), DIA)
    #: Capability flags: False skips the group, with the flag's name as the reason.
    #: ``supports_complex`` defaults to whether a complex dtype is declared.
    supports_complex: ClassVar[bool] = from_backend_info(
        lambda info, cls: any(d.is_complex for d in info.dtypes), True)
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
        # products only (the oracle sees the half-rounded inputs): the output's rounding and a
        # float32 accumulation, a few units of the half dtype's epsilon (4.9e-4, 3.9e-3)
        torch.float16: 4e-3, torch.bfloat16: 3e-2,
    }
    #: gradcheck tolerances (float64, solver rtol 1e-12): iterative methods get a relaxed atol.
    gradcheck_atol: ClassVar[Mapping[str, float]] = {"direct": 1e-7, "iterative": 1e-5}
    #: Grid of the value tests (n = nx * ny; keep n <= 200) and of the gradient tests (n ~ 12).
    grid: ClassVar[tuple[int, int]] = (6, 5)
    grad_grid: ClassVar[tuple[int, int]] = (4, 3)

    # Parametrization --------------------------------------------------------------------------
    def _axes(self) -> dict[str, tuple[list, str, str | None]]:
        """``{argname: (values, why-empty, attribute it comes from)}`` of the kit's axes."""
        ms = tuple(self.methods)
        return {
            "method": (list(ms), "no methods listed in `methods`", "methods"),
            "direct_method": ([m for m in ms if self._is_direct(m)], "no direct method in `methods`", "methods"),
            "iterative_method": ([m for m in ms if not self._is_direct(m)], "no iterative method in `methods`", "methods"),
            "constrained_method": ([m for m in ms if m in self.symmetric_only_methods],
                                   "no method in `methods` has a requirement in `symmetric_only_methods`", "methods"),
            "general_direct_method": ([m for m in ms if self._is_direct(m) and self.requirement(m) != "spd"],
                                      "no direct method without an SPD requirement in `methods`", "methods"),
            "spd_method": ([m for m in ms if self.requirement(m) == "spd"], "no method requiring SPD in `methods`", "methods"),
            "fmt": (list(self.formats), "no formats listed in `formats`", None),
            "dtype": (list(self.dtypes), "no dtypes listed in `dtypes`", "dtypes"),
            "half_dtype": (list(self.half_dtypes), "no half-precision dtype declared (`half_dtypes`)", "half_dtypes"),
            # without complex support its cases skip on the flag, whatever the BackendInfo says
            "complex_dtype": (list(self.complex_dtypes), "no dtypes listed in `complex_dtypes`",
                              "complex_dtypes" if self.supports_complex else None),
            "device": (list(self.devices), "no devices listed in `devices`", "devices"),
        }

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Parametrize the kit's axes from this class's attributes.

        An axis whose attribute defaults to the BackendInfo while no BackendInfo can be read
        gets one case that fails with the reason (never a silent skip)."""
        self._check_tests_to_skip()
        cls = type(self)
        for argname, (values, why, attr) in self._axes().items():
            if argname not in metafunc.fixturenames:
                continue
            why_not = _backend_info(cls)[1] if attr is not None and _is_declared(cls, attr) else ""
            if why_not:
                reason = (f"`{attr}` defaults to what the backend declares, and its BackendInfo cannot be read: "
                          f"{why_not}; install its plugin, set `plugin` to its hook module, or set `{attr}`")
                metafunc.parametrize(argname, [pytest.param(_Unresolved(reason), id="unresolved")])
                continue
            if not values:
                metafunc.parametrize(argname, [pytest.param(None, marks=pytest.mark.skip(reason=f"{self.backend}: {why}"))], ids=["none"])
                continue
            params = []
            for v in values:
                marks = _device_marks(v) if argname == "device" else ()
                params.append(pytest.param(v, marks=marks, id=_name(v)))
            metafunc.parametrize(argname, params)

    def _check_tests_to_skip(self) -> None:
        for key, reason in self.tests_to_skip.items():
            base = key.split("[", 1)[0]
            if not (base.startswith("test") and callable(getattr(type(self), base, None))):
                raise ValueError(f"{type(self).__name__}.tests_to_skip names {key!r}, which is no test of the class")
            if not isinstance(reason, str) or not reason.strip():
                raise ValueError(f"{type(self).__name__}.tests_to_skip[{key!r}] must be a reason (a non-empty string)")

    # Fixtures ---------------------------------------------------------------------------------
    @pytest.fixture(autouse=True)
    def _conformance_case(self, request):
        """Skips what ``tests_to_skip`` names, with its reason; fails a case whose axis could
        not be read from the BackendInfo, with the reason."""
        node = request.node
        for key in (node.name, getattr(node, "originalname", node.name)):
            if key in self.tests_to_skip:
                pytest.skip(f"{self.backend}: {self.tests_to_skip[key]}")
        callspec = getattr(node, "callspec", None)
        for value in (callspec.params.values() if callspec is not None else ()):
            if isinstance(value, _Unresolved):
                pytest.fail(value.why, pytrace=False)

    @pytest.fixture(autouse=True)
    def conformance_backend(self):
        """Registers ``plugin`` when ``backend`` is not loaded (and resets afterwards); fails
        clearly when neither is there. Calibration uses the built-in rates for determinism."""
        if not self.backend:
            pytest.fail(f"{type(self).__name__} must set `backend` (the backend name to pin)")
        backends = st.registry()
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
            from ...dispatch import reset_backends  # noqa: PLC0415

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
    """A skipif for a device this machine lacks (CUDA, MPS, or any ``torch.<type>`` module
    with ``is_available``, e.g. XPU); none for the CPU."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return ()
    if dev.type == "cuda":
        ok = torch.cuda.is_available() and (dev.index is None or dev.index < torch.cuda.device_count())
        return (pytest.mark.skipif(not ok, reason=f"{device} is not available"),)
    if dev.type == "mps":
        ok = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
        return (pytest.mark.skipif(not ok, reason="mps is not available"),)
    available = getattr(getattr(torch, dev.type, None), "is_available", None)
    ok = bool(available()) if callable(available) else False
    return (pytest.mark.skipif(not ok, reason=f"{device} is not available"),)

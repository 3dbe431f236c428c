"""The built-in "torch" backend through the conformance kit (sparsetorch.testing), and the kit's
own flag logic.

The backend is the reference every other backend is compared with, so it runs the whole kit:
every solve method in every input format, real and complex, value batches, gradients, plans,
the plan cache, matmul/Matmul/norm, and the error contract.
"""

from __future__ import annotations

import pytest
import torch

from sparsetorch.format import BSR, COO, CSC, CSR, DIA, ELL
from sparsetorch.testing import ErrorConformance, MatmulConformance, SolveConformance


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """These matrices are tiny: one thread avoids OpenMP/MKL thread contention that makes the
    sparse kernels ~40x slower on small, busy machines (measured on 2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class TorchBackend:
    backend = "torch"
    methods = ("cg", "minres", "bicgstab", "gmres", "lu", "cholesky")
    devices = ("cpu", "cuda")
    dtypes = (torch.float64, torch.float32)
    complex_dtypes = (torch.complex128, torch.complex64)
    formats = (CSR, CSC, COO, BSR(2, 2), DIA, ELL)
    supports_complex = True
    supports_batch = True
    supports_multiple_rhs = True
    supports_grad = True


class TestTorchSolve(TorchBackend, SolveConformance):
    pass


class TestTorchMatmul(TorchBackend, MatmulConformance):
    pass


class TestTorchErrors(TorchBackend, ErrorConformance):
    pass


# The kit's own flag logic ---------------------------------------------------------------------------


class _NoComplex(TorchBackend, SolveConformance, MatmulConformance):
    supports_complex = False


class _Minimal(TorchBackend, SolveConformance, ErrorConformance):
    supports_batch = False
    supports_multiple_rhs = False
    supports_grad = False
    methods = ("lu",)


@pytest.mark.parametrize(
    "cls, test, kwargs, flag",
    [
        (_NoComplex, "test_solve_complex", dict(method="lu", complex_dtype=torch.complex128, device="cpu"), "supports_complex"),
        (_NoComplex, "test_gradient_complex_matches_dense_oracle", dict(method="lu", device="cpu"), "supports_complex"),
        (_NoComplex, "test_matmul_complex", dict(fmt=CSR, complex_dtype=torch.complex128, device="cpu"), "supports_complex"),
        (_Minimal, "test_solve_value_batch", dict(method="lu", dtype=torch.float64, device="cpu"), "supports_batch"),
        (_Minimal, "test_solve_multiple_rhs", dict(method="lu", dtype=torch.float64, device="cpu"), "supports_multiple_rhs"),
        (_Minimal, "test_gradcheck", dict(method="lu", device="cpu"), "supports_grad"),
    ],
)
def test_flag_off_skips_its_group_with_the_reason(cls, test, kwargs, flag):
    with pytest.raises(pytest.skip.Exception, match=f"torch: {flag}=False"):
        getattr(cls(), test)(**kwargs)


def test_flag_on_runs_the_group():
    """The same complex test runs (and passes) where the flag is on."""
    TestTorchSolve().test_solve_complex(method="lu", complex_dtype=torch.complex128, device="cpu")


class _Recorder:
    """A stand-in for pytest's Metafunc that records what the kit parametrizes."""

    def __init__(self, *names):
        self.fixturenames = list(names)
        self.calls = {}
        self.marks = {}

    def parametrize(self, name, params, ids=None):
        self.calls[name] = [p.values[0] for p in params]
        self.marks[name] = [list(p.marks) for p in params]


def test_axes_follow_the_class_attributes():
    rec = _Recorder("method", "direct_method", "iterative_method", "constrained_method", "fmt", "dtype", "device")
    TestTorchSolve().pytest_generate_tests(rec)
    assert rec.calls["method"] == list(TorchBackend.methods)
    assert rec.calls["direct_method"] == ["lu", "cholesky"]
    assert rec.calls["iterative_method"] == ["cg", "minres", "bicgstab", "gmres"]
    assert rec.calls["constrained_method"] == ["cg", "minres", "cholesky"]
    assert rec.calls["fmt"] == list(TorchBackend.formats)
    assert rec.calls["device"] == ["cpu", "cuda"]
    rec = _Recorder("iterative_method")
    _Minimal().pytest_generate_tests(rec)
    assert rec.calls["iterative_method"] == [None]  # one case, skipped with the reason
    assert "no iterative method" in rec.marks["iterative_method"][0][0].kwargs["reason"]


def test_cuda_cases_skip_without_cuda():
    rec = _Recorder("device")
    TestTorchSolve().pytest_generate_tests(rec)
    (cuda_marks,) = [m for v, m in zip(rec.calls["device"], rec.marks["device"]) if v == "cuda"]
    assert [m.name for m in cuda_marks] == ["skipif"]
    assert cuda_marks[0].args[0] == (not torch.cuda.is_available())


# --- the kit's defaults from BackendInfo, and tests_to_skip ------------------------------------------
def test_kit_attributes_default_to_the_backends_declaration():
    import sparsetorch as st

    class Named(SolveConformance):  # not collected: no Test prefix
        backend = "torch"

    info = st.registry().info("torch")
    assert Named.methods == info.methods("solve")
    assert Named.devices == tuple(info.devices)
    assert set(Named.dtypes) <= set(info.dtypes) and torch.float64 in Named.dtypes

    class Overridden(SolveConformance):
        backend = "torch"
        methods = ("lu",)

    assert Overridden.methods == ("lu",)


def test_tests_to_skip_skips_with_its_reason_and_rejects_unknown_names(tmp_path):
    import subprocess
    import sys

    def run(name: str, skip: str) -> str:
        (tmp_path / f"test_{name}.py").write_text(
            "from sparsetorch.testing import SolveConformance\n\n"
            f"class Test{name}(SolveConformance):\n"
            "    backend = 'torch'\n"
            "    methods = ('lu',)\n"
            f"    tests_to_skip = {skip}\n")
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-k",
                               "test_solve_matches_dense", f"test_{name}.py"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
        return done.stdout + done.stderr

    out = run("Skipping", "{'test_solve_matches_dense': 'known difference (test of the kit)'}")
    assert "known difference (test of the kit)" in out and " passed" not in out
    out = run("Typo", "{'test_no_such_test': 'typo'}")
    assert "no test of the class" in out

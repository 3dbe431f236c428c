"""The conformance kit: one suite of parity tests that every backend's tests subclass.

A backend's test module names the backend, and states what its ``BackendInfo`` does not say;
the kit does the rest::

    from sparsetorch.format import COO, CSR
    from sparsetorch.testing import ErrorConformance, MatmulConformance, SolveConformance

    import mine.plugin

    class MyBackend:
        backend = "mine"                      # pinned with backend="mine" in every call
        plugin = mine.plugin                  # registered in-process when not installed
        formats = (CSR, COO)                  # optional: input formats (default: five of them)
        supports_batch = False                # capability flags BackendInfo does not carry
        tests_to_skip = {"test_gradcheck[gmres-cpu]": "why, with an issue link"}

    class TestMySolve(MyBackend, SolveConformance): ...
    class TestMyMatmul(MyBackend, MatmulConformance): ...
    class TestMyErrors(MyBackend, ErrorConformance): ...

What the backend declares is the default of the attributes that repeat it: ``methods`` (its
``ops["solve"]``), ``devices``, ``dtypes`` and ``complex_dtypes`` (its declared dtypes that the
kit has tolerances for), ``supports_complex`` (a complex dtype is declared), and in
:mod:`.spectral` ``eigsh_methods``, ``eigs_methods``, ``logdet_methods``. The declaration is
read from the registry when the backend is loaded, else from ``plugin``'s
``sparsetorch_backend_info`` hook; an axis that needs it when neither is there fails with the
reason. Setting an attribute on the subclass overrides the default (a backend may test fewer
methods than it declares). ``tests_to_skip`` (``{test name or test[case id]: reason}``, as in
conda's solver tests) skips named tests with a reason; a name that is no test of the class fails.

Every answer is checked against a dense double-precision oracle (``torch.linalg.solve``, dense
``@``, dense autograd), every gradient with ``torch.autograd.gradcheck`` as well. Each parity test
is written once here and runs against every backend, errors included (STYLE.md rules 11, 12).

Parametrization comes from the class attributes (``ConformanceBase.pytest_generate_tests``): a
test that takes ``method`` runs for each of ``methods``; ``direct_method``/``iterative_method``/
``constrained_method`` run for the matching subset; ``fmt``, ``dtype``, ``complex_dtype`` and
``device`` run for ``formats``, ``dtypes``, ``complex_dtypes`` and ``devices``. A capability flag
set to False skips its group with ``pytest.skip`` and the reason; an empty subset gives one
skipped case that says why. The base classes have no ``Test`` prefix, so pytest collects them
only through a subclass.

The modules, one suite each:

- :mod:`.base`: :class:`ConformanceBase` (attributes, parametrization, fixtures, helpers).
- :mod:`.solve`: :class:`SolveConformance`: ``solve`` in every format and dtype, B of shape
  ``(n,)``, ``(n, k)`` and ``B = I``, value batches, complex; a method's requirement
  (``symmetric_only_methods``) is declined with its reason; gradients by ``gradcheck``/
  ``gradgradcheck`` and against dense autograd (on the pattern only), ``torch.func.grad`` and
  ``vmap`` over B; ``Solver`` (plan / factorize / update_values / solve); the plan cache (new
  values reuse the plan and are always seen, another pattern never does).
- :mod:`.matmul`: :class:`MatmulConformance`: ``matmul``, ``A @ x``, ``x @ A`` and the UST
  ``Matmul`` form (``c`` updated in place) in every format, value batches, complex, gradients,
  ``norm``.
- :mod:`.errors`: :class:`ErrorConformance`: each bad input raises the library's named error
  with a message that names the problem (shapes, dtypes, NaN/Inf, singular, indefinite,
  maxiter, zero tolerances, unknown method), and no input is ever modified.
- :mod:`.spectral`: :class:`EigshConformance`, :class:`EigsConformance`,
  :class:`LogdetConformance` (eigenvalues and determinants against dense oracles, gradients
  through a symmetric parametrization) and :class:`SymmetricFamily`.

A backend that may run from a source checkout (its entry point not installed) sets ``plugin``
to its hook module: the kit registers it under ``backend`` when it is not loaded, and resets the
loaded backends afterwards. Anything more special overrides the autouse ``conformance_backend``
fixture (same name).
"""

from __future__ import annotations

from .base import DIRECT_METHODS, REQUIREMENT_WORDS, ConformanceBase
from .errors import ErrorConformance
from .matmul import MatmulConformance
from .solve import SolveConformance
from .spectral import EigsConformance, EigshConformance, LogdetConformance, SymmetricFamily

__all__ = [
    "ConformanceBase", "SolveConformance", "MatmulConformance", "ErrorConformance", "EigshConformance",
    "EigsConformance", "LogdetConformance", "SymmetricFamily", "DIRECT_METHODS", "REQUIREMENT_WORDS",
]

"""sparsetorch-scipy: the SciPy (+ PyAMG) backend of sparsetorch, for CPU tensors.

Nothing is imported here on purpose: the core imports ``sparsetorch_scipy.plugin`` through the
``sparsetorch.backends`` entry point on first dispatch, and SciPy/PyAMG are imported only when
a plan is built.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]

"""sparsetorch-example: a minimal out-of-tree sparsetorch backend (dense LU through SciPy).

Nothing is imported here on purpose: the core imports ``sparsetorch_example.plugin`` through the
``sparsetorch.backends`` entry point on first dispatch, and the plan module (which needs SciPy)
only when a plan is built.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]

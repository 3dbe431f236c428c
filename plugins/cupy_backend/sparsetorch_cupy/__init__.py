"""sparsetorch-cupy: the CuPy backend of sparsetorch (entry point ``cupy`` in ``sparsetorch.backends``).

Importing this package imports nothing heavy: CuPy is imported when a plan is built."""

__version__ = "0.1.0"

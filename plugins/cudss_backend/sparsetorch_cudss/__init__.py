"""sparsetorch-cudss: the cuDSS sparse direct solver as a sparsetorch backend (CUDA)."""

__version__ = "0.1.0"

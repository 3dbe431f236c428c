"""sparsetorch-cuda: sparsetorch's native CUDA kernels backend (SpMV/SpMM and SDDMM in CSR, DIA,
ELL and bit-packed DELTA(b), float16/bfloat16/float32/float64, int32/int64 indices), compiled at
run time with NVRTC.

Nothing is imported here on purpose: the core imports ``sparsetorch_cuda.plugin`` through the
``sparsetorch.backends`` entry point on first dispatch; NVRTC and the driver bindings are imported
when a plan is built.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]

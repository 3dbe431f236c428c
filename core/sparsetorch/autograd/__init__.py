"""Adjoint rules, one file per op family: solve, matmul, and the torch.library custom ops."""

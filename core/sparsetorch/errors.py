"""The library's error and warning types.

Every error says what was wrong, with the offending values, and what to do about it.
All derive from :class:`SparseTorchError`, so ``except sparsetorch.SparseTorchError`` catches
anything the library raises on purpose.
"""

from __future__ import annotations

__all__ = [
    "SparseTorchError",
    "FormatError",
    "FormatParseError",
    "ValidationError",
    "ConversionError",
    "InteropError",
    "SparseTorchWarning",
    "InputError",
    "DegenerateEigenvalueError",
    "NotConvergedError",
    "SingularMatrixError",
    "IndefiniteMatrixError",
    "NotSymmetricError",
    "NoBackendError",
    "BackendError",
    "NotConvergedWarning",
    "FallbackWarning",
]


class SparseTorchError(Exception):
    """Base class of every error raised on purpose by sparsetorch."""


class FormatError(SparseTorchError, ValueError):
    """A tensor format (level layout) is invalid, or a format cannot hold the given data."""


class FormatParseError(FormatError):
    """A format string could not be parsed; the message points at the offending character."""

    def __init__(self, text: str, offset: int, message: str) -> None:
        self.text = text
        self.offset = offset
        self.reason = message
        caret = " " * offset + "^"
        super().__init__(f"{message} at position {offset}:\n  {text}\n  {caret}")


class ValidationError(SparseTorchError, ValueError):
    """Storage buffers (positions, coordinates, values) are inconsistent with the format or shape."""


class ConversionError(SparseTorchError, ValueError):
    """A conversion between formats, devices or dtypes cannot be done as asked."""


class InteropError(SparseTorchError, TypeError):
    """An object from another package cannot be wrapped, or a format has no counterpart there."""


class InputError(SparseTorchError, ValueError):
    """Operands of an operation do not fit it: shapes, dtypes, devices, NaN/Inf, integer dtypes."""


class NotConvergedError(SparseTorchError, RuntimeError):
    """An iterative method stopped before reaching the tolerance; ``.info`` holds the record."""

    def __init__(self, message: str, info: object = None) -> None:
        super().__init__(message)
        self.info = info


class SingularMatrixError(SparseTorchError, ValueError):
    """The matrix is singular (to working precision); ``.row`` names where it failed, if known."""

    def __init__(self, message: str, row: int | None = None) -> None:
        super().__init__(message)
        self.row = row


class IndefiniteMatrixError(SparseTorchError, ValueError):
    """A method that needs a symmetric positive definite matrix met one that is not."""


class NotSymmetricError(SparseTorchError, ValueError):
    """A method that needs a symmetric (Hermitian) matrix was given a non-symmetric one."""


class DegenerateEigenvalueError(SparseTorchError, ValueError):
    """Eigenvector gradients asked for at (nearly) repeated eigenvalues, where they do not exist."""


class NoBackendError(SparseTorchError, RuntimeError):
    """No backend can do the request; the message lists every candidate and why it declined."""

    def __init__(self, message: str, table: object = None) -> None:
        super().__init__(message)
        self.table = table


class BackendError(SparseTorchError, RuntimeError):
    """A backend failed while executing a plan it had offered, or returned something unusable.

    ``label`` is "backend/method", ``phase`` one of "build", "set_values", "solve", "apply",
    "result"; the original exception, if any, is the ``__cause__``."""

    def __init__(self, message: str, label: str | None = None, phase: str | None = None) -> None:
        super().__init__(message)
        self.label = label
        self.phase = phase


class SparseTorchWarning(UserWarning):
    """Base class of sparsetorch warnings (filter them with this category)."""


class NotConvergedWarning(SparseTorchWarning):
    """An iterative method stopped early and the caller asked for a warning instead of an error."""


class FallbackWarning(SparseTorchWarning):
    """A slower path was taken than the one asked for; the message says why and how to avoid it."""

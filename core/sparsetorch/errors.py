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


class SparseTorchWarning(UserWarning):
    """Base class of sparsetorch warnings (filter them with this category)."""

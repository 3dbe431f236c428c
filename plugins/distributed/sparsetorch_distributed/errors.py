"""Errors of the distributed plugin, and the table that lets every rank raise the same class.

A failure on one rank is agreed on by all ranks (:func:`sparsetorch_distributed.comm.Comm.agree`):
every rank raises the class the lowest failing rank raised, with that rank's message. Classes
travel between ranks by their position in :data:`AGREED_CLASSES` (most specific first); an
exception of any other class arrives as :class:`DistributedError` naming the original class.
"""

from __future__ import annotations

import sparsetorch as st

__all__ = ["DistributedError", "MismatchError", "CommTimeoutError", "AGREED_CLASSES", "code_of", "class_of"]


class DistributedError(st.SparseTorchError, RuntimeError):
    """A distributed operation failed on some rank (the message names the rank and the cause)."""


class MismatchError(st.InputError):
    """Ranks disagree on something they must share: global shape, dtype, batch, partition, columns of B."""


class CommTimeoutError(DistributedError):
    """A collective or point-to-point transfer did not complete within the communicator's timeout
    (a rank died, hangs, or skipped a collective the others entered)."""


#: Classes that keep their identity across ranks, most specific first (an exception is sent as the
#: first entry it is an instance of).
AGREED_CLASSES: tuple[type[BaseException], ...] = (
    MismatchError, CommTimeoutError, DistributedError,
    st.ValidationError, st.NotSymmetricError, st.DegenerateEigenvalueError, st.IndefiniteMatrixError, st.SingularMatrixError,
    st.NotConvergedError, st.BackendError, st.NoBackendError, st.InputError, st.SparseTorchError,
)


def code_of(exc: BaseException) -> int:
    """1-based position of the first agreed class ``exc`` is an instance of; 0 for any other."""
    for i, cls in enumerate(AGREED_CLASSES):
        if isinstance(exc, cls):
            return i + 1
    return 0


def class_of(code: int) -> type[BaseException]:
    return AGREED_CLASSES[code - 1] if code > 0 else DistributedError

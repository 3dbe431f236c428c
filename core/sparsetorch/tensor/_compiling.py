"""Whether torch.compile (or torch.export) is tracing the calling thread: :func:`compiling`.

``torch.compiler.is_compiling()`` reads one process-wide flag that torch sets for the whole of a
compile session, so while one thread compiles anything (dense code included) it is True in
every other thread too, and eager sparsetorch calls there took the compile-only paths and
failed (a ``TracedTranspose`` handed to a backend; session 28's sweep). :func:`compiling` is
that flag narrowed to the thread doing the tracing:

- under dynamo's trace ``torch.compiler.is_dynamo_compiling()`` is folded to True (and is False
  in eager code: no global state);
- code that runs for real during a compile session, not traced by dynamo (non-strict
  ``torch.export``, ``make_fx`` called by a backend, AOTAutograd running a formula), sees the
  flag set together with something only the tracing thread has: a fake or proxy tensor mode in
  its dispatch-mode stack (thread-local, and carried into autograd's worker threads by torch's
  thread-local state), or dynamo's tracing context (``torch._guards``, a ``threading.local``).

In eager code with no compile anywhere it is one Python call and one attribute read.
"""

from __future__ import annotations

import torch

__all__ = ["compiling"]

_compiler = torch.compiler
_dynamo_tracing = getattr(_compiler, "is_dynamo_compiling", None)
_C = torch._C
_MODE_KEYS = tuple(getattr(getattr(_C, "_TorchDispatchModeKey", None), k, None) for k in ("FAKE", "PROXY", "FUNCTIONAL"))
_get_mode = getattr(_C, "_get_dispatch_mode", None)


def _this_thread_traces() -> bool:
    """Whether this thread is inside a tracing session (asked only while the global flag is on)."""
    if _get_mode is not None:
        for key in _MODE_KEYS:
            if key is not None and _get_mode(key) is not None:
                return True
    guards = getattr(torch, "_guards", None)  # loaded by dynamo / export, which set the flag
    tracing = getattr(guards, "TracingContext", None)
    return tracing is not None and tracing.try_get() is not None


if _dynamo_tracing is not None and hasattr(_compiler, "_is_compiling_flag"):
    def compiling() -> bool:
        """True while torch.compile / torch.export traces the calling thread (see the module)."""
        return _dynamo_tracing() or (_compiler._is_compiling_flag and _this_thread_traces())
elif hasattr(_compiler, "is_compiling"):  # an older torch without the dynamo-only question: its own answer
    compiling = _compiler.is_compiling
else:  # pragma: no cover - torch before torch.compiler.is_compiling
    def compiling() -> bool:
        """False: this torch has no way to say (and no process-wide flag either)."""
        return False

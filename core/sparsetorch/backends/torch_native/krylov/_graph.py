"""CUDA-graph replay of a block of Krylov iterations.

On a GPU one CG iteration on a million unknowns is about 40 us of device work (one SpMV near the
bandwidth floor and a dozen vector kernels) but about ten times that in host work: every torch
operator is a Python call, a dispatch and a kernel launch. Capturing ``check_every`` iterations
once as a CUDA graph and replaying it turns those launches into one ``cudaGraphLaunch`` per
block; the device then runs the kernels back to back.

What a capturable block needs (the solver's part): static buffers for the iterates, updated in
place; no host synchronisation inside a step; operators (the product, the preconditioner) that
are themselves capturable and read their operands from fixed addresses. Only the torch backend's
own plans promise that, so graphs are used when the caller says so (``cuda_graph=True``), never
for an arbitrary user callable (which may synchronise, or count its calls).

The first block of a solve runs eagerly on the capture stream (lazy initialisations: cuSPARSE
and cuBLAS handles, the cuBLAS workspace of that stream), the second is captured and every
later full block replays it. A capture that fails (an operator that synchronises, say) leaves
the solve running eagerly, with a warning; the results are the same either way, only the
launch count differs. ``SPARSETORCH_CUDA_GRAPHS=0`` turns graphs off everywhere.
"""

from __future__ import annotations

import os
import warnings
from typing import Callable

import torch

__all__ = ["graphs_enabled", "BlockGraph"]

# One capture stream per device, kept for the process: cuBLAS keeps a workspace per (handle,
# stream), so a fresh stream per solve would leave a workspace behind each time.
_STREAMS: dict[int, "torch.cuda.Stream"] = {}
#: set when a failed capture could not be cleaned up: no more graphs in this process
_BROKEN = False


def graphs_enabled() -> bool:
    """False when ``SPARSETORCH_CUDA_GRAPHS`` is ``0``/``false``/``no``/``off``."""
    return os.environ.get("SPARSETORCH_CUDA_GRAPHS", "1").strip().lower() not in ("0", "false", "no", "off")


def usable(t: torch.Tensor) -> bool:
    """Whether a block on ``t``'s device may be captured now (a CUDA tensor, graphs on, and no
    capture of the caller's in progress: ours would nest inside it)."""
    return (
        t.is_cuda
        and graphs_enabled()
        and not _BROKEN
        and not torch.cuda.is_current_stream_capturing()
    )


def _stream(device: torch.device) -> "torch.cuda.Stream":
    index = device.index if device.index is not None else torch.cuda.current_device()
    s = _STREAMS.get(index)
    if s is None:
        s = _STREAMS[index] = torch.cuda.Stream(device=index)
    return s


def _recover(device: torch.device, stream: "torch.cuda.Stream") -> None:
    """Undo what a failed capture leaves behind. torch's capture_begin puts the default CUDA
    generator in capture mode and only a completed capture_end takes it out; after a failed
    one, every later random draw on the device raises "Offset increment outside graph capture
    encountered unexpectedly". A capture of one fill that succeeds resets it. If that fails too,
    graphs are turned off for the process."""
    global _BROKEN
    try:
        probe = torch.empty(1, device=device)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            g.capture_begin(capture_error_mode="thread_local")
            probe.fill_(0)
            g.capture_end()
        torch.cuda.current_stream(device).wait_stream(stream)
        del g
    except Exception:  # noqa: BLE001
        _BROKEN = True


class BlockGraph:
    """Runs ``block()`` (k in-place iterations) eagerly once, then captures it and replays.

    ``block`` must only update tensors it owns in place (their addresses are baked into the
    graph); the graph and its private memory pool live as long as this object.
    """

    def __init__(self, block: Callable[[], None], device: torch.device, what: str) -> None:
        self._block = block
        self._device = device
        self._what = what
        self._graph: "torch.cuda.CUDAGraph | None" = None
        self._runs = 0
        self.failed: str | None = None  #: why capturing failed (then every block runs eagerly)

    @property
    def captured(self) -> bool:
        return self._graph is not None

    def __call__(self) -> None:
        if self._graph is not None:
            self._graph.replay()
            return
        if self.failed is not None:
            self._block()
            return
        stream = _stream(self._device)
        current = torch.cuda.current_stream(self._device)
        stream.wait_stream(current)
        if self._runs == 0:
            # Warm-up on the capture stream: handles and workspaces are created outside capture.
            with torch.cuda.stream(stream):
                self._block()
            current.wait_stream(stream)
            self._runs += 1
            return
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(stream):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    self._block()
                finally:
                    graph.capture_end()
        except Exception as exc:  # noqa: BLE001 - any failure means: run eagerly
            current.wait_stream(stream)
            self.failed = f"{type(exc).__name__}: {exc}"
            del graph
            _recover(self._device, stream)
            warnings.warn(
                f"sparsetorch: capturing {self._what} as a CUDA graph failed ({self.failed}); "
                f"running it eagerly (same results, more launches). Set SPARSETORCH_CUDA_GRAPHS=0 "
                f"to skip the attempt",
                RuntimeWarning,
                stacklevel=3,
            )
            # The capture recorded the block without running it: run it now.
            self._block()
            return
        current.wait_stream(stream)
        self._graph = graph
        graph.replay()  # capturing only records: this runs the block

"""The plugin contract: the hooks a sparsetorch backend implements.

A backend is any object (usually a module) with functions marked ``@sparsetorch.hookimpl``,
published under the entry-point group ``sparsetorch.backends``::

    [project.entry-points."sparsetorch.backends"]
    mybackend = "sparsetorch_mybackend.plugin"

The two stages of capability (STYLE.md, rule 5): :func:`sparsetorch_backend_info` is the cheap
static declaration; :func:`sparsetorch_offers` is the exact answer for one request. Each hook is
called on each backend separately; an exception raised by a backend becomes a decline carrying
the exception text and never breaks dispatch.
"""

from __future__ import annotations

from typing import Sequence

import pluggy

from .records import BackendInfo, Decline, Offer, Request

PROJECT = "sparsetorch"
hookspec = pluggy.HookspecMarker(PROJECT)

__all__ = ["PROJECT", "hookspec", "sparsetorch_backend_info", "sparsetorch_offers"]


@hookspec(firstresult=False)
def sparsetorch_backend_info() -> BackendInfo:  # type: ignore[empty-body]
    """Describe this backend: name, version, devices, dtypes, ops and methods, native formats,
    optional dependencies that are missing (and why), and a tie-break priority.

    Called once per process when the backend is loaded. Must not import heavy optional
    dependencies just to answer; report them in ``missing`` instead when absent.
    """


@hookspec(firstresult=False)
def sparsetorch_offers(request: Request) -> Sequence[Offer | Decline]:  # type: ignore[empty-body]
    """Answer one concrete request with offers and declines.

    Return one :class:`Offer` per method this backend can run for ``request`` (with the cost
    estimate and a plan factory) and a :class:`Decline` with a reason for each method it cannot
    (or one decline for the whole request). Return an empty sequence only when the op is not
    one this backend declared. Respect ``request.options['method']`` when given: offering other
    methods is allowed (the dispatcher filters), declining it must say why.
    """

"""Where the backend loader lived before it joined the dispatcher (:mod:`sparsetorch.dispatch.select`);
kept so that imports of the old path keep working."""

from __future__ import annotations

from .select import BUILTINS, ENTRY_POINT_GROUP, Backends, BrokenBackend, get_backends, reset_backends

__all__ = ["Backends", "BrokenBackend", "get_backends", "reset_backends", "ENTRY_POINT_GROUP", "BUILTINS"]

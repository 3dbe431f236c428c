"""The pluggy marker backends use: ``@sparsetorch.hookimpl``."""

import pluggy

hookimpl = pluggy.HookimplMarker("sparsetorch")

__all__ = ["hookimpl"]

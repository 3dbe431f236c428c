"""The plan cache used by the one-shot functions.

Keys are structural: (op, backend, method, the matrix's exact ``pattern_key``, value dtype,
options). A ``pattern_key`` names the very index buffers (address, extent, strides and torch's
version counter), so a different matrix never hits a stale plan; entries whose buffers were
freed are dropped. New *values* on the same pattern hit the plan, which then re-runs only its
numeric phase (``update_values``). Bounded (LRU), inspectable and clearable.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable

__all__ = ["PlanCache", "CacheEntry", "plan_cache"]


@dataclass(frozen=True)
class CacheEntry:
    key: Hashable
    op: str
    backend: str
    method: str
    shape: tuple[int, ...]
    hits: int


class PlanCache:
    """An LRU map from structural keys to plans."""

    def __init__(self, maxsize: int = 64) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[Hashable, list] = OrderedDict()  # key -> [plan, pattern_key, hits, meta, refs]
        self._dead: list[Hashable] = []
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get_or_build(self, key: Hashable, pattern_key: Any, build: Callable[[], Any], meta: tuple) -> tuple[Any, bool]:
        """The cached plan for ``key`` (and True), or a new one from ``build()`` (and False)."""
        with self._lock:
            entry = self._data.get(key)
            if entry is not None and entry[1] is not None and not entry[1].alive():
                # the key's buffers were freed (their addresses may be reused): never a hit
                del self._data[key]
                entry = None
            if entry is not None:
                self._data.move_to_end(key)
                entry[2] += 1
                self.hits += 1
                return entry[0], True
        plan = build()
        with self._lock:
            self._purge()
            self.misses += 1
            if self.maxsize > 0:
                self._data[key] = [plan, pattern_key, 0, meta, self._watch(key, pattern_key)]
                while len(self._data) > self.maxsize:
                    self._data.popitem(last=False)
        return plan, False

    def _watch(self, key: Hashable, pattern_key: Any) -> tuple:
        """Weak references to the pattern's buffers that report ``key`` when one is freed, so a
        plan (and the factors it holds) goes when its matrix goes, at O(1) per plan; they live
        with the entry and report nothing once it is gone."""
        refs = getattr(pattern_key, "_refs", ()) or ()
        dead = self._dead
        out = []
        for r in refs:
            t = r()
            if t is not None:
                # list.append is atomic: the callback may run in any thread, during garbage
                # collection, while this cache's lock is held
                out.append(weakref.ref(t, lambda _r, key=key: dead.append(key)))
        return tuple(out)

    def _purge(self) -> None:
        """Drop the entries whose buffers were freed (reported by their weak references)."""
        dead = self._dead
        while dead:
            k = dead.pop()
            e = self._data.get(k)
            if e is not None and e[1] is not None and not e[1].alive():
                del self._data[k]

    def entries(self) -> list[CacheEntry]:
        with self._lock:
            self._purge()
            return [CacheEntry(k, *e[3][:2], e[3][2], e[3][3], e[2]) for k, e in self._data.items()]

    def __len__(self) -> int:
        with self._lock:
            self._purge()
            return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._dead.clear()
            self.hits = self.misses = 0

    def __repr__(self) -> str:
        return f"PlanCache(size={len(self)}, maxsize={self.maxsize}, hits={self.hits}, misses={self.misses})"


_cache = PlanCache()


def plan_cache() -> PlanCache:
    """The process-wide plan cache (``sparsetorch.plan_cache().clear()``, ``.entries()``, ``.maxsize``)."""
    return _cache

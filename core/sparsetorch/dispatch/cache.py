"""The plan cache used by the one-shot functions.

Keys are structural: (op, backend, method, the matrix's exact ``pattern_key``, value dtype,
options). A ``pattern_key`` names the very index buffers (address, extent, strides and torch's
version counter), so a different matrix never hits a stale plan; entries whose buffers were
freed are dropped. New *values* on the same pattern hit the plan, which then re-runs only its
numeric phase (``update_values``). Bounded (LRU), inspectable and clearable.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Hashable

from .lru import LRU

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

    def __init__(self, maxsize: int = 64, name: str = "plans") -> None:
        #: key -> [plan, pattern_key, hits, meta, refs] (the core's one cache type, with its lock)
        self._lru: LRU[Hashable, list] = LRU(name, maxsize)
        self._lock = self._lru.lock
        self._dead: list[Hashable] = []
        self.hits = 0
        self.misses = 0

    @property
    def maxsize(self) -> int:
        return self._lru.maxsize

    @maxsize.setter
    def maxsize(self, value: int) -> None:
        with self._lock:
            self._lru.maxsize = int(value)
            while len(self._lru) > max(self._lru.maxsize, 0):
                self._lru.pop(next(iter(self._lru)))

    def get_or_build(self, key: Hashable, pattern_key: Any, build: Callable[[], Any], meta: tuple) -> tuple[Any, bool]:
        """The cached plan for ``key`` (and True), or a new one from ``build()`` (and False)."""
        with self._lock:
            entry = self._lru.get(key)
            if entry is not None and entry[1] is not None and not entry[1].alive():
                # the key's buffers were freed (their addresses may be reused): never a hit
                self._lru.pop(key)
                entry = None
            if entry is not None:
                entry[2] += 1
                self.hits += 1
                return entry[0], True
        plan = build()
        with self._lock:
            self._purge()
            self.misses += 1
            if self.maxsize > 0:
                self._lru.put(key, [plan, pattern_key, 0, meta, self._watch(key, pattern_key)])
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
            e = self._lru.peek(k)
            if e is not None and e[1] is not None and not e[1].alive():
                self._lru.pop(k)

    def plan(self, key: Hashable) -> Any:
        """The plan stored under an entry's key (``entries()[i].key``), or None; not a use."""
        with self._lock:
            e = self._lru.peek(key)
            return None if e is None else e[0]

    def entries(self) -> list[CacheEntry]:
        with self._lock:
            self._purge()
            return [CacheEntry(k, *e[3][:2], e[3][2], e[3][3], e[2]) for k, e in self._lru.items()]

    def __len__(self) -> int:
        with self._lock:
            self._purge()
            return len(self._lru)

    def clear(self) -> None:
        with self._lock:
            self._lru.clear()
            self._dead.clear()
            self.hits = self.misses = 0

    def __repr__(self) -> str:
        return f"PlanCache(size={len(self)}, maxsize={self.maxsize}, hits={self.hits}, misses={self.misses})"


_cache = PlanCache()


def plan_cache() -> PlanCache:
    """The process-wide plan cache (``sparsetorch.plan_cache().clear()``, ``.entries()``, ``.maxsize``)."""
    return _cache

"""One cache type for the whole core: a bounded, locked LRU map, registered by name so that
:func:`clear_caches` empties every one of them.

The core remembers things per pattern or per request (plans, dispatch decisions, calls seen,
measurements, Jacobian colorings, Jacobian patterns). Each is an :class:`LRU`: a size bound
(the least recently used entry goes first), a lock (every method is safe to call from several
threads), and a name (``sparsetorch.cache_info()`` lists them, ``sparsetorch.clear_caches()``
empties them). Keys are whatever the owner makes them (hashable tuples); values are never
copied.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Generic, Hashable, Iterator, TypeVar

__all__ = ["LRU", "clear_caches", "cache_info", "register_clearable"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: every LRU alive (weakly held: a cache made by a test or a caller goes when it goes), and
#: other caches' clear functions by name
_caches: "weakref.WeakSet[LRU[Any, Any]]" = weakref.WeakSet()
_clearables: dict[str, Callable[[], None]] = {}
_registry_lock = threading.Lock()


class LRU(Generic[K, V]):
    """A bounded map, least recently used first out, thread safe.

    ``get`` counts as a use (moves the entry to the end); ``peek`` does not. ``maxsize <= 0``
    keeps nothing. Every LRU is known to :func:`clear_caches` (weakly) and listed by ``name``.
    """

    def __init__(self, name: str, maxsize: int) -> None:
        self.name = name
        self.maxsize = int(maxsize)
        self._data: OrderedDict[K, V] = OrderedDict()
        self.lock = threading.RLock()
        self.hits = 0
        self.misses = 0
        with _registry_lock:
            _caches.add(self)

    def get(self, key: K, default: V | None = None) -> V | None:
        with self.lock:
            if key in self._data:
                self._data.move_to_end(key)
                self.hits += 1
                return self._data[key]
            self.misses += 1
            return default

    def peek(self, key: K, default: V | None = None) -> V | None:
        with self.lock:
            return self._data.get(key, default)

    def put(self, key: K, value: V) -> None:
        with self.lock:
            if self.maxsize <= 0:
                return
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def get_or_set(self, key: K, make: Callable[[], V]) -> V:
        """The value for ``key``, made (outside the lock: ``make`` may be slow or re-enter) and
        stored when missing; when two threads make one at once, the first stored wins."""
        got = self.get(key)
        if got is not None:
            return got
        value = make()
        with self.lock:
            if key in self._data:
                return self._data[key]
            self.put(key, value)
        return value

    def pop(self, key: K, default: V | None = None) -> V | None:
        with self.lock:
            return self._data.pop(key, default)

    def items(self) -> list[tuple[K, V]]:
        """A snapshot, oldest first."""
        with self.lock:
            return list(self._data.items())

    def __contains__(self, key: object) -> bool:
        with self.lock:
            return key in self._data

    def __len__(self) -> int:
        with self.lock:
            return len(self._data)

    def __iter__(self) -> Iterator[K]:
        return iter([k for k, _ in self.items()])

    def clear(self) -> None:
        with self.lock:
            self._data.clear()
            self.hits = self.misses = 0

    def __repr__(self) -> str:
        return f"LRU({self.name!r}, size={len(self)}, maxsize={self.maxsize}, hits={self.hits}, misses={self.misses})"


def register_clearable(name: str, clear: Callable[[], None]) -> None:
    """Register a cache that is not an :class:`LRU` (the plan cache) for :func:`clear_caches`."""
    with _registry_lock:
        _clearables[name] = clear


def clear_caches() -> None:
    """Empty every cache of the core: plans, dispatch decisions, calls seen per pattern,
    measurements, colorings, Jacobian patterns. Nothing is wrong afterwards, only slower once."""
    with _registry_lock:
        caches, others = list(_caches), list(_clearables.values())
    for c in caches:
        c.clear()
    for clear in others:
        clear()


def cache_info() -> dict[str, str]:
    """Each cache by name, with its size and bound (caches sharing a name are listed together)."""
    with _registry_lock:
        caches, others = list(_caches), list(_clearables)
    out: dict[str, str] = {}
    for c in sorted(caches, key=lambda c: c.name):
        out[c.name] = f"{out[c.name]}; {c!r}" if c.name in out else repr(c)
    out.update({name: "(clear only)" for name in others})
    return out

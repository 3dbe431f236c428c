"""From a request to a plan: the chosen offer's plan, cached, and the state that makes it shareable.

- :func:`obtain_plan`: what every op calls. It asks :func:`~.select.choose` for the cheapest
  capable offer (re-asking once with ``repeat`` filled in from the calls seen on the pattern when
  some offer has a one-time setup to spread), then :func:`plan_for` returns that offer's plan
  from the plan cache, or builds a new one lazily.
- :class:`PlanState`: a plugin's plan object, the values it holds, and the lock that makes one
  shared plan safe for many callers; :func:`guarded` turns a plugin's own exceptions into
  :class:`~sparsetorch.BackendError` naming the plan and the phase.
- :class:`PlanCache` / :func:`plan_cache`: the process-wide LRU of plans under structural keys
  (op, backend, method, the matrix's exact ``pattern_key``, value dtype, plan options).

Contract level (below autograd and the ops): the ops obtain plans here, the autograd layer's
handles and fallback route use them.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Hashable, Mapping

import torch

from ..errors import BackendError, SparseTorchError
from ..tensor.pattern import is_plain, version_of
from .lru import LRU
from .options import _Record
from .plans import CheapReload, supports
from .records import Offer, Request, make_request
from .select import ExplainTable, choose, get_backends

if TYPE_CHECKING:
    from ..tensor import SparseTensor

__all__ = ["PlanState", "guarded", "make_request", "with_options", "obtain_plan", "plan_for", "call_options", "options_key",
           "expected_calls", "with_expected_calls", "counts_calls", "calls_key", "calls_seen", "count_calls",
           "CALL_OPTIONS", "PlanCache", "CacheEntry", "plan_cache"]


def _token(values: torch.Tensor) -> tuple[Any, ...]:
    return (values.data_ptr(), version_of(values), tuple(values.shape), values.dtype, values.device)


@dataclass
class PlanState:
    """A plan and the values it currently holds.

    Values are recognised by identity and torch's version counter, and, when those match, by
    comparing with a snapshot (O(nnz), far cheaper than a refactorization): writes through
    ``.data`` or a NumPy view keep the version unchanged and must still be seen.

    Plans are shared (the plan cache hands one plan to every call on a pattern), calls are not:
    a caller holds :attr:`lock` from loading its values to the end of its solve or product, so
    another thread can neither swap the values in between nor run the plan concurrently (a plan
    need not be thread safe itself). Per-call options travel as arguments, never on the plan.
    Exceptions a plan raises that are not sparsetorch errors come out as :class:`BackendError`
    naming the backend, method and phase, with the cause chained.
    """

    plan: Any
    token: tuple[Any, ...] | None = None
    reused: bool = False
    snapshot: torch.Tensor | None = None
    factory: Any = None
    #: products: set_values is a pointer swap or a gather, no dearer than the comparison, which
    #: on a GPU would also synchronize with the host on every call: always reload, no snapshot.
    #: A plan may say the same of itself (:class:`~.plans.CheapReload`, ``reload_cheap = True``; Krylov plans:
    #: new values are a pointer swap and a diagonal, and the snapshot would cost an nnz copy).
    reload_always: bool = False
    #: "backend/method", for error messages
    label: str = "plan"
    #: the token (``_token``) of the last values a solve route found well scaled (no
    #: equilibration needed): a Solver's or a cached plan's repeated calls scan the values once
    well_scaled: tuple[Any, ...] | None = None
    lock: Any = field(default_factory=threading.RLock, repr=False, compare=False)
    _cheap_reload: bool = field(default=False, repr=False, compare=False)
    #: how many times values were loaded (set_values ran) and asked for (``_load`` called): what a
    #: memo of something derived from the values compares (``memo``, ``ops/properties.py``)
    loads: int = field(default=0, repr=False, compare=False)
    checks: int = field(default=0, repr=False, compare=False)
    #: quantities derived from the values the plan holds (an infinity norm of A), emptied at every load
    memo: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)
    #: a solve route's equilibration of the last values it scaled: (a copy of those values, r, c, the
    #: scaled values), reused while the call's values equal the copy (fallback.Route._attempt)
    scaled: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)
    #: the values tensor the last set_values got: plans may keep reading its memory (SciPy / Eigen wrap it
    #: without a copy), so equal numbers in another tensor stand for it only while it still holds them
    held: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.plan is not None:  # made around an existing plan
            self._cheap_reload = supports(self.plan, CheapReload)

    def build(self) -> Any:
        """Run the plan factory if it has not run yet (pattern-dependent work)."""
        if self.plan is None:
            with self.lock:
                if self.plan is None:
                    plan = guarded(self.factory, self.label, "build")
                    # capabilities asked once per plan (a Protocol isinstance costs ~20 us)
                    self._cheap_reload = supports(plan, CheapReload)
                    self.plan = plan
                    self.factory = None
        return self.plan

    def load(self, values: torch.Tensor) -> None:
        with self.lock:
            self._load(values)

    def holds(self, values: torch.Tensor) -> bool:
        """Whether the plan holds ``values`` as they are now (identity and version; the caller loaded
        them in this call, under :attr:`lock`, which compared their content): then :attr:`memo` is
        theirs. Always False for plans that reload on every call (no token)."""
        return self.token is not None and is_plain(values) and self.token == _token(values.detach())

    def _load(self, values: torch.Tensor) -> None:
        if self.plan is None:
            self.build()
        self.checks += 1
        v = _detached(values)
        if v.is_conj() or v.is_neg():
            # a conjugate / negative view shares its storage with the values it views: plans read the
            # storage (A @ x was answered for with_values(values.conj()); session 21's sweep)
            v = v.resolve_conj().resolve_neg()
        if self.reload_always or self._cheap_reload:
            # no token: nothing is compared on these plans (every call reloads)
            self.loads += 1
            if self.memo:
                self.memo.clear()
            try:  # what guarded() does, without a closure per call (a product's hot path)
                self.plan.set_values(v)
            except SparseTorchError:
                raise
            except Exception as exc:  # noqa: BLE001 - re-raised with the plugin named
                raise BackendError(f"{self.label} failed in set_values: {type(exc).__name__}: {exc}", label=self.label,
                                   phase="set_values") from exc
            return
        tok = _token(v)
        snap = self.snapshot
        # self.token is None after a set_values that raised: the plan then holds no values at all, whatever
        # the snapshot (of the last good ones) says (a failed factorization, then the earlier values again,
        # raised "solve() before set_values()" on every later call; session 22's sweep)
        if snap is not None and self.token is not None and (
                tok == self.token or (snap.shape == v.shape and snap.dtype == v.dtype and snap.device == v.device)
        ) and torch.equal(snap, v) and self._held_unchanged(v, snap):
            # the values the plan holds: the same tensor unchanged, or another tensor with the same numbers
            # (a route's equilibrated values recomputed per call, a matrix rebuilt from the same data):
            # one comparison instead of a refactorization
            self.token = tok
            return
        self.token = None  # a set_values that raises leaves no values the plan is known to hold
        self.held = None
        self.loads += 1
        self.memo.clear()
        guarded(lambda: self.plan.set_values(v), self.label, "set_values")
        self.token = tok
        self.held = v
        snap = self.snapshot
        if (snap is not None and snap.shape == v.shape and snap.dtype == v.dtype and snap.device == v.device
                and is_plain(snap) and is_plain(v) and not _overlaps(snap, v)
                and (not snap.is_inference() or torch.is_inference_mode_enabled())):
            # Refill the snapshot's buffer: a copy into memory already mapped costs a fraction of a
            # new allocation's first touch (measured 3 vs 13 ms for 5M doubles).
            snap.copy_(v)
        else:  # (a snapshot taken in inference mode cannot be written outside it: a new one)
            self.snapshot = v.clone()


    def _held_unchanged(self, v: torch.Tensor, snap: torch.Tensor) -> bool:
        """Whether the memory the plan was loaded from still holds the snapshot's numbers, given that ``v``
        does: true at once when ``v`` is that memory; else a second comparison. A plan that wrapped the
        values without copying reads that memory, and a caller may have overwritten it since (a cached CG
        plan answered a new matrix with the old tensor's numbers after ``A1.values.mul_(3)``; session 27's
        sweep)."""
        held = self.held
        if held is None:
            return False
        if (held.data_ptr() == v.data_ptr() and held.shape == v.shape and held.stride() == v.stride()
                and held.dtype == v.dtype and held.device == v.device):
            return True
        return held.shape == snap.shape and held.dtype == snap.dtype and torch.equal(snap, held)


#: torch's switch that turns the torch.func transforms off (None on a torch without it)
_NO_TRANSFORMS = getattr(torch._C, "_DisableFuncTorch", None)


def _detached(values: torch.Tensor) -> torch.Tensor:
    """``values`` without autograd history, a plain tensor when ``values`` is one. Inside a torch.func
    transform ``detach()`` returns the transform's wrapper even of a plain tensor (a Solver built outside
    ``torch.func.grad`` and first solving inside it raised "Cannot access data pointer"; session 23)."""
    if not values.requires_grad:
        return values
    if _NO_TRANSFORMS is not None and is_plain(values):
        with _NO_TRANSFORMS():
            return values.detach()
    return values.detach()


def guarded(fn: Callable[[], Any], label: str, phase: str) -> Any:
    """``fn()``, with an exception that is not a sparsetorch error (a plugin bug, a library's own
    error type) turned into :class:`BackendError` naming the plan and phase, cause chained."""
    try:
        return fn()
    except SparseTorchError:
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised with the plugin named
        raise BackendError(f"{label} failed in {phase}: {type(exc).__name__}: {exc}", label=label,
                           phase=phase) from exc


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two plain tensors share storage (a snapshot must never alias the values it guards)."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


# ---------------------------------------------------------------------------------------------
# Obtaining a plan: choose an offer, then its plan from the cache

# Options that change what a plan is (part of the cache key). Tolerances, iteration limits and
# callbacks are per call (CALL_OPTIONS): one plan serves them all.
_PLAN_OPTIONS = ("restart", "block_size", "dense_max")
CALL_OPTIONS = ("rtol", "atol", "maxiter", "check_every", "callback")


def with_options(request: Request, **changes: Any) -> Request:
    """``request`` with some options changed by the core (a pinned backend and method for a
    fallback plan, a filled-in ``repeat``): a record stays a record of the same type."""
    opts = request.options
    new = opts.trusted_replace(**changes) if isinstance(opts, _Record) else {**opts, **changes}
    return replace(request, options=new)


def options_key(offer: Offer, options: Mapping[str, Any]) -> tuple[Any, ...]:
    pre = options.get("preconditioner")
    pre_key = pre if (pre is None or isinstance(pre, str)) else ("callable", id(pre))
    bo = options.get("backend_options") or {}
    return (offer.preconditioner, pre_key, tuple(sorted((k, repr(v)) for k, v in bo.items()))) + tuple(
        (k, options.get(k)) for k in _PLAN_OPTIONS
    )


#: Calls seen per (op, pattern, dtype): how many more a pattern is expected to serve when the
#: caller does not say (``repeat``). Bounded; the oldest patterns are forgotten first.
_CALLS: "LRU[Any, int]" = LRU("calls per pattern", 1024)


def expected_calls(op: str, A: SparseTensor, *, count: bool) -> int:
    """The calls this pattern is expected to serve: as many as seen so far, this one included
    (the past predicts the future: a loop that has solved 20 times on a pattern will likely
    solve 20 more), rounded down to a power of two so that remembered dispatch decisions are
    re-made only log2(calls) times. ``count``: record this call (``explain`` only peeks)."""
    key = calls_key(op, A)
    with _CALLS.lock:
        seen = (_CALLS.peek(key) or 0) + 1
        if count:
            _CALLS.put(key, seen)
    return 1 << (seen.bit_length() - 1)


#: Calls seen in a row on the same values per (op, pattern, dtype): (a weak reference to the values
#: tensor, its version, the count). Bounded like :data:`_CALLS`.
_SAME: "LRU[Any, tuple[Any, int, int]]" = LRU("calls per values", 1024)


def same_values_calls(op: str, A: SparseTensor, *, count: bool) -> int:
    """The calls A's present values are expected to serve: as many as were made in a row on the
    same values tensor (the same object, unchanged: its version), this one included, rounded down
    to a power of two. A plan keeps its factorization while the values stay the same, so a direct
    offer's ``factor`` is spread over these calls. Values rebuilt per call (a new tensor each time,
    even at the same address) count as new values. ``count``: record this call."""
    key = calls_key(op, A)
    v = A.values
    version = version_of(v)
    with _SAME.lock:
        prev = _SAME.peek(key)
        seen = prev[2] + 1 if prev is not None and prev[0]() is v and prev[1] == version else 1
        if count:
            try:
                ref = weakref.ref(v)
            except TypeError:  # not weak-referenceable (a subclass): never counted as the same
                return 1
            _SAME.put(key, (ref, version, seen))
    return 1 << (seen.bit_length() - 1)


def _spreads(table: ExplainTable | None, part: str) -> bool:
    # Without a setup (``part``: "setup" or "factor") to spread there is nothing to count (the table is
    # the same on every call of this request: remembered decisions), and the per-call bookkeeping is skipped.
    return table is None or any(r.offer is not None and getattr(r.offer, part) > 0 for r in table.rows)


def counts_calls(request: Request, table: ExplainTable | None) -> bool:
    """Whether calls of ``request`` are counted per pattern (:func:`expected_calls`): the caller
    gave no ``repeat`` and some offer of ``table`` has a one-time setup to spread."""
    if request.option("repeat") is not None:
        return False
    return _spreads(table, "setup")


def calls_key(op: str, A: SparseTensor) -> tuple[Any, ...]:
    """The key under which :func:`expected_calls` counts the calls of ``op`` on A's pattern."""
    return (op, A.pattern_key, A.dtype)


def calls_seen(key: tuple[Any, ...]) -> int:
    """The calls counted under ``key`` (:func:`calls_key`) so far."""
    return _CALLS.peek(key) or 0


def count_calls(key: tuple[Any, ...], n: int) -> None:
    """Count ``n`` calls under ``key`` made without asking the dispatcher (a one-shot product's
    remembered launch, ``ops/matmul.py``), so that the next call that asks counts on from there."""
    if n > 0:
        with _CALLS.lock:
            _CALLS.put(key, (_CALLS.peek(key) or 0) + n)


def with_expected_calls(op: str, A: SparseTensor, request: Request, table: ExplainTable | None, *,
                        count: bool) -> Request | None:
    """``request`` with the ``repeat`` option filled in from the calls seen on the pattern (when
    the caller gave none) and ``same_values`` from the calls seen in a row on A's present values,
    when some offer has a one-time setup or a factorization to spread (``None``: no change)."""
    if isinstance(request.options, _Record) and "repeat" not in request.options:
        return None  # an op without the option (its offers have no setup to spread)
    out = request
    if counts_calls(request, table):
        repeat = expected_calls(op, A, count=count)
        if repeat > 1:
            out = with_options(out, repeat=repeat)
    if _spreads(table, "factor"):
        same = same_values_calls(op, A, count=count)
        if same > 1:
            out = replace(out, same_values=same)
    return None if out is request else out


def obtain_plan(op: str, A: SparseTensor, request: Request, *, cache: bool = True) -> tuple[PlanState, Offer, ExplainTable]:
    """Choose the cheapest capable backend and return its plan (from the cache when the
    pattern, dtype and options match a previous call)."""
    offer, table = choose(request)
    spread = with_expected_calls(op, A, request, table, count=True)
    if spread is not None:  # some offer has a one-time setup: price it over the expected calls
        request = spread
        offer, table = choose(request)
    return plan_for(op, A, request, offer, cache=cache), offer, table


def plan_for(op: str, A: SparseTensor, request: Request, offer: Offer, *, cache: bool = True) -> PlanState:
    """The plan of ``offer`` for ``A`` (from the plan cache when one was built for the same
    pattern, dtype, symmetry class and plan options)."""
    # Plans capture the pattern only: they get A with zero values; values arrive through
    # set_values. The factory runs lazily, at the first load, which happens inside the autograd
    # Function, where torch.func transforms hand over plain tensors that a plan may keep.
    # (products: a plan is a pointer swap, nothing worth a fingerprint of the pattern)
    content = _content_key(A) if cache and op != "matmul" else None

    def factory() -> Any:
        # one zero broadcast to the values' shape: no nnz-sized buffer for the plan to keep
        # (2.6 GB at 320M entries, measured in the GPU suite's 64M case)
        zeros = torch.zeros((), dtype=A.dtype, device=A.device).expand(A.values.shape)
        # a plan shared by content owns its index buffers: the caller's may be written later; one keyed by
        # the buffers' identity reads them through views of its own (the same memory, other tensor objects),
        # so that when the caller's buffers are freed the entry's weak references fire and the plan goes
        source = (A.detach().clone() if content is not None else _viewing(A.detach())).with_values(zeros)
        return offer.build(source, request)

    label = f"{offer.backend}/{offer.method}"

    def build() -> PlanState:
        return PlanState(None, factory=factory, reload_always=(op == "matmul"), label=label)

    if not cache:
        return build()
    # The symmetry class is part of the key: a plan may rely on it (the torch backend's Krylov
    # plans run adjoint solves with A itself when A = A^H), so values on the same pattern that
    # lose their symmetry get a plan of their own.
    sym = tuple(sorted(request.properties & {"spd", "hermitian", "symmetric"}))
    # Small CPU patterns of solves and the other factoring ops are keyed by content (a matrix
    # rebuilt from the same indices, as an assembly loop or a file re-read does, finds the plan
    # and its analysis); the rest by the identity of their index buffers (dropped with them).
    pattern = A.pattern_key if content is None else content
    # the backends' generation: a backend registered again under the same name (a user kernel,
    # a reloaded plugin) never meets the plans of the one it replaced
    key = (op, offer.backend, offer.method, pattern, A.dtype, tuple(A.batch_shape), sym,
           options_key(offer, request.options), get_backends().generation)
    state, hit = plan_cache().get_or_build(key, None if content is not None else A.pattern_key, build,
                                           (op, offer.backend, offer.method, tuple(A.shape)))
    state.reused = hit
    return state  # type: ignore[no-any-return]


def _viewing(A: "SparseTensor") -> "SparseTensor":
    """``A`` over tensors of its own that share its index buffers' memory (no copy; not views, which hold
    their base) and a derived-data cache of its own: nothing in it references A's buffer objects, which the
    plan cache watches (a plan holding them kept every rebuilt matrix's buffers and factors alive until the
    LRU evicted it: 16 MB a step at 200k entries; session 23's sweep)."""
    from ..tensor.validate import _versions  # noqa: PLC0415

    if A.format.num_batch_levels or not is_plain(A.values) or any(
            b is not None and not is_plain(b) for b in (*A._pos, *A._crd)):
        return A
    A.ensure_valid()  # the buffers' present content is what the new tensors are vouched for at

    def own(b: "torch.Tensor | None") -> "torch.Tensor | None":
        if b is None:
            return None
        return b.new_empty(0).set_(b.untyped_storage(), b.storage_offset(), b.shape, b.stride())

    pos = [own(b) for b in A._pos]
    crd = [own(b) for b in A._crd]
    index = tuple(b for b in (*pos, *crd) if b is not None)
    return type(A)._assembled(A.format, A.format_shape, pos, crd, A.values, index, _versions(index))


#: patterns of at most this many stored entries on the CPU share plans by content
CONTENT_KEYED_NSE = 1 << 17


def _content_key(A: "SparseTensor") -> tuple[Any, ...] | None:
    """``("content", fingerprint)`` for a small CPU pattern whose buffers can be read (their
    128-bit BLAKE2 digest: ``SparseTensor.pattern_fingerprint``), else None. Such plans outlive
    the matrix they were built for (an LRU entry like any other): their factors are small."""
    if A.device.type != "cpu" or (A.nse or 0) > CONTENT_KEYED_NSE:
        return None
    fp = A.pattern_fingerprint
    return None if fp is None else ("content", fp)


def call_options(request: Request) -> dict[str, Any]:
    """The options of a call that may change from call to call on one plan (passed to the
    plan's solve, never stored on it)."""
    return {k: request.options.get(k) for k in CALL_OPTIONS}


# ---------------------------------------------------------------------------------------------
# The plan cache
#
# Keys are structural: (op, backend, method, the matrix's exact ``pattern_key``, value dtype,
# options). A ``pattern_key`` names the very index buffers (address, extent, strides and torch's
# version counter), so a different matrix never hits a stale plan; entries whose buffers were
# freed are dropped. New *values* on the same pattern hit the plan, which then re-runs only its
# numeric phase (``set_values``). Bounded (LRU), inspectable and clearable.


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
        self._lru: LRU[Hashable, list[Any]] = LRU(name, maxsize)
        self._lock = self._lru.lock
        self._dead: list[Hashable] = []
        self.hits = 0
        self.misses = 0
        #: bumped by :meth:`clear` and a smaller :attr:`maxsize`: what holds a plan outside the cache
        #: (a one-shot product's remembered launch) lets it go when this moves
        self.epoch = 0

    @property
    def maxsize(self) -> int:
        return self._lru.maxsize

    @maxsize.setter
    def maxsize(self, value: int) -> None:
        with self._lock:
            self.epoch += 1
            self._lru.maxsize = int(value)
            while len(self._lru) > max(self._lru.maxsize, 0):
                self._lru.pop(next(iter(self._lru)))

    def get_or_build(self, key: Hashable, pattern_key: Any, build: Callable[[], Any], meta: tuple[Any, ...]) -> tuple[Any, bool]:
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

    def _watch(self, key: Hashable, pattern_key: Any) -> tuple[Any, ...]:
        """Weak references to the pattern's buffers that report ``key`` when one is freed, so a
        plan (and the factors it holds) goes when its matrix goes, at O(1) per plan; they live
        with the entry and report nothing once it is gone."""
        refs = getattr(pattern_key, "_refs", ()) or ()
        dead = self._dead
        out: list[Any] = []

        def report(_r: Any, key: Hashable = key) -> None:
            dead.append(key)

        for r in refs:
            t = r()
            if t is not None:
                # list.append is atomic: the callback may run in any thread, during garbage
                # collection, while this cache's lock is held
                out.append(weakref.ref(t, report))
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
            return [CacheEntry(k, e[3][0], e[3][1], e[3][2], e[3][3], e[2]) for k, e in self._lru.items()]

    def __len__(self) -> int:
        with self._lock:
            self._purge()
            return len(self._lru)

    def clear(self) -> None:
        with self._lock:
            self.epoch += 1
            self._lru.clear()
            self._dead.clear()
            self.hits = self.misses = 0

    def count_hits(self, n: int) -> None:
        """Count ``n`` uses of cached plans made without a lookup (a one-shot product's remembered
        launch, counted when it next asks)."""
        with self._lock:
            self.hits += n

    def __repr__(self) -> str:
        return f"PlanCache(size={len(self)}, maxsize={self.maxsize}, hits={self.hits}, misses={self.misses})"


_cache = PlanCache()


def plan_cache() -> PlanCache:
    """The process-wide plan cache (``sparsetorch.plan_cache().clear()``, ``.entries()``, ``.maxsize``)."""
    return _cache

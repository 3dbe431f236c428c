"""sparsetorch from many Python threads at once: wrong answers, internal errors and crashes
(issue 14, item 4 and its "Done when": 8 threads x 1,000 solves, 0 / 0 / 0).

    python benchmarks/bench_threads.py                        # 8 threads x 1000 operations each
    python benchmarks/bench_threads.py --threads 4 --ops 50   # what tests/test_threads.py runs

Every thread runs its own seeded schedule of operations on matrices that share sparsity
patterns with the other threads' (each thread has its own *values* on a shared pattern, so a
plan that kept one call's state for the next would hand a thread another thread's answer):

- one-shot ``solve`` on ``pattern.with_values(own values)``: auto, and pinned (backend, method)
  pairs (torch, scipy, eigen where installed; direct and iterative methods, each thread its own
  ``rtol`` for the iterative ones);
- ``Solver`` objects shared by every thread (fixed values, each thread its own right-hand
  sides; half of them first used from the threads, so planning and factorization race too);
- a ``Solver`` per thread on a shared pattern, switching between the thread's two value sets
  with ``update_values``;
- ``matmul`` (auto, torch, scipy) and ``eigsh`` (auto and pinned methods) on own values;
- on three shared patterns (2-D Poisson: SPD; convection-diffusion: non-symmetric; a random
  non-symmetric one with condition 1e2) and one pattern of the thread's own.

Every answer is checked against a reference computed before the threads start, in the main
thread, with SciPy / NumPy in float64 (``spsolve``, ``A @ x``, dense ``eigvalsh``): a solve is
wrong when its true residual exceeds ``max(10 rtol, 1e-10)`` (1e-10 for direct methods and auto),
a product when it differs from SciPy's by more than 1e-12 relative, eigenvalues by more than 1e-8
relative. A wrong solve is also compared with the other threads' references (is it someone
else's answer?). Every (op, backend, method) combination runs once serially first; one that
fails there is left out of the threaded run and listed (the run is about threads, not about
methods). Exceptions are classified: ``library`` (a ``SparseTorchError``, which should not occur
on these well-conditioned systems) or ``internal`` (anything else: AttributeError, IndexError, ...).
The process itself can die (SIGSEGV): ``tests/test_threads.py`` runs this script in a
subprocess so that a crash is a test failure.

Writes ``benchmarks/results/threads_cpu.json`` (``--out``). Timing is only reported as
operations per second of the whole run (shared 2-core machine: compare, do not quote).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import scipy
import scipy.sparse as sp
import scipy.sparse.linalg as spla

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def rel(path: Path) -> str:
    try:
        return os.path.relpath(Path(path).resolve(), REPO)
    except ValueError:
        return Path(path).name


# --------------------------------------------------------------------------------------------
# the world: patterns, per-thread values, right-hand sides and references
# --------------------------------------------------------------------------------------------

N_VALUE_SETS = 2
N_RHS = 3
DIRECT = {"lu", "cholesky", "ldlt", "qr", "dense"}


def base_patterns():
    from sparsetorch.testing import families as fam

    return {
        "poisson": (fam.poisson(12).matrix, "spd"),                                   # n = 144
        "convdiff": (fam.convection_diffusion(11, 20.0, seed=3).matrix, "general"),   # n = 121
        "random": (fam.random_conditioned(100, 1e2, seed=5).matrix, "general"),       # n = 100
    }


def thread_values(A: sp.csr_matrix, kind: str, t: int, k: int) -> np.ndarray:
    """Values of thread ``t``'s value set ``k`` on ``A``'s pattern: a different, still
    well-conditioned matrix for every (t, k) (SPD stays SPD)."""
    rng = np.random.default_rng(10_000 + 97 * t + k)
    coo = A.tocoo()
    vals = A.data.copy()
    diag = A.indptr[:-1].copy()  # position of each row's diagonal entry in data
    for i in range(A.shape[0]):
        row = A.indices[A.indptr[i]:A.indptr[i + 1]]
        diag[i] = A.indptr[i] + int(np.searchsorted(row, i))
    if kind == "spd":
        vals[diag] += 0.05 + 0.5 * t + 0.1 * k  # shifts the spectrum: distinct, still SPD
    else:
        off = np.ones(vals.size, dtype=bool)
        off[diag] = False
        vals[off] *= 1.0 + 0.02 * rng.uniform(-1, 1, size=int(off.sum()))
        vals[diag] *= 1.0 + 0.1 * t + 0.05 * k
    del coo
    return vals


def own_pattern(t: int):
    from sparsetorch.testing import families as fam

    return fam.poisson(6 + t % 5).matrix  # a pattern of the thread's own (other index buffers)


class World:
    """Everything the threads read: built once in the main thread, read-only afterwards."""

    def __init__(self, n_threads: int, seed: int):
        import torch

        import sparsetorch as st

        self.n_threads = n_threads
        self.patterns = {}  # name -> (pattern SparseTensor, kind, per-thread data)
        base = base_patterns()
        for name, (A, kind) in base.items():
            T = st.SparseTensor.from_package(A.copy())
            per_thread = []
            for t in range(n_threads):
                vs = [thread_values(A, kind, t, k) for k in range(N_VALUE_SETS)]
                per_thread.append(self._systems(A, vs, t, seed))
            shared_vals = thread_values(A, kind, n_threads + 7, 0)
            self.patterns[name] = {"T": T, "kind": kind, "A": A, "threads": per_thread,
                                   "shared": self._systems(A, [shared_vals], 999, seed)}
        self.own = []
        for t in range(n_threads):
            A = own_pattern(t)
            vs = [thread_values(A, "spd", t, k) for k in range(N_VALUE_SETS)]
            self.own.append({"T": st.SparseTensor.from_package(A.copy()), "kind": "spd", "A": A,
                             "threads": {t: self._systems(A, vs, t, seed)}})
        self.torch = torch
        self.st = st

    @staticmethod
    def _systems(A: sp.csr_matrix, value_sets, t: int, seed: int) -> dict:
        rng = np.random.default_rng(seed * 7919 + t)
        n = A.shape[0]
        out = {"values": [], "matrices": [], "rhs": [], "x": [], "eig_top": [], "eig_bottom": []}
        bs = [rng.standard_normal(n) for _ in range(N_RHS)]
        out["rhs"] = bs
        for v in value_sets:
            M = sp.csr_matrix((v, A.indices.copy(), A.indptr.copy()), shape=A.shape)
            out["values"].append(v)
            out["matrices"].append(M)
            out["x"].append([spla.spsolve(M.tocsc(), b) for b in bs])
            if abs(M - M.T).max() == 0:
                ev = np.linalg.eigvalsh(M.toarray())
                out["eig_top"].append(ev[-3:])
                out["eig_bottom"].append(ev[:3])
            else:
                out["eig_top"].append(None)
                out["eig_bottom"].append(None)
        return out


# --------------------------------------------------------------------------------------------
# operations
# --------------------------------------------------------------------------------------------

def combos(world: World) -> list[dict]:
    """Every (op, pattern kind, backend, method) to exercise, from what explain offers."""
    st, torch = world.st, world.torch
    have = set(st.registry().names)
    out = []
    for pname in ("poisson", "convdiff"):
        P = world.patterns[pname]
        T = P["T"].with_values(torch.from_numpy(P["threads"][0]["values"][0]))
        b = torch.from_numpy(P["threads"][0]["rhs"][0])
        table = st.explain("solve", T, b)
        seen = set()
        out.append({"op": "solve", "pattern": pname, "backend": None, "method": None})
        out.append({"op": "solve", "pattern": pname, "backend": None, "method": None, "auto_rtol": True})
        for row in table.offers:
            o = row.offer
            if o.backend not in ("torch", "scipy", "eigen") or o.backend not in have or (o.backend, o.method) in seen:
                continue
            seen.add((o.backend, o.method))
            out.append({"op": "solve", "pattern": pname, "backend": o.backend, "method": o.method})
    for pname in ("random", "own"):
        out.append({"op": "solve", "pattern": pname, "backend": None, "method": None})
        out.append({"op": "solve", "pattern": pname, "backend": None, "method": None, "auto_rtol": True})
    for pname in ("poisson", "convdiff", "random"):
        out.append({"op": "own_solver", "pattern": pname, "backend": None, "method": None})
        out.append({"op": "own_solver", "pattern": pname, "backend": None, "method": None, "auto_rtol": True})
    for be, m in (("torch", "lu"), ("scipy", "lu"), ("eigen", "lu"), ("torch", "cg"), ("eigen", "cholesky")):
        if be in have:
            out.append({"op": "own_solver", "pattern": "poisson", "backend": be, "method": m})
    for be in (None, "torch", "scipy"):
        out.append({"op": "matmul", "pattern": "convdiff", "backend": be, "method": None})
        out.append({"op": "matmul", "pattern": "own", "backend": be, "method": None})
    P = world.patterns["poisson"]
    T = P["T"].with_values(torch.from_numpy(P["threads"][0]["values"][0]))
    out.append({"op": "eigsh", "pattern": "poisson", "backend": None, "method": None})
    for row in st.explain("eigsh", T, 3, which="LA").offers:
        o = row.offer
        if o.backend in ("torch", "scipy"):
            out.append({"op": "eigsh", "pattern": "poisson", "backend": o.backend, "method": o.method})
    return out


def make_shared_solvers(world: World, have: set, only: set | None = None) -> list[dict]:
    """Solvers every thread uses: fixed (shared) values; every other one factorized here, the
    rest planned and factorized by whichever thread comes first."""
    st, torch = world.st, world.torch
    specs = [("poisson", None, None), ("convdiff", None, None), ("poisson", None, "auto rtol"),
             ("convdiff", None, "auto rtol"), ("poisson", "torch", "cholesky"),
             ("poisson", "scipy", "lu"), ("convdiff", "torch", "lu"), ("convdiff", "scipy", "lu"),
             ("poisson", "torch", "cg"), ("convdiff", "torch", "gmres")]
    if "eigen" in have:
        specs += [("poisson", "eigen", "cholesky"), ("convdiff", "eigen", "lu"), ("convdiff", "eigen", "bicgstab")]
    out = []
    for i, (pname, be, m) in enumerate(specs):
        label = f"shared_solver[{pname}:{be or 'auto'}/{m or 'auto'}]"
        if only is not None and label not in only:
            continue
        P = world.patterns[pname]
        A = P["T"].with_values(torch.from_numpy(P["shared"]["values"][0]))
        kw = {}
        if be:
            kw["backend"] = be
        if m and m != "auto rtol":
            kw["method"] = m
        rtol = None
        if m and m not in DIRECT:
            rtol = 1e-9
            kw["rtol"] = rtol
        s = st.Solver(A, **kw)
        if i % 2 == 0:
            s.factorize()
        out.append({"solver": s, "pattern": pname, "backend": be, "method": m, "rtol": rtol, "label": label})
    return out


#: the share of each kind of operation in a thread's schedule (split evenly over its combinations)
SHARE = {"solve": 0.45, "own_solver": 0.2, "shared_solver": 0.15, "matmul": 0.1, "eigsh": 0.1}


def solve_options(c: dict, t: int) -> dict:
    """The keyword options of combination ``c`` in thread ``t``: its pinned backend/method, and
    the thread's own rtol for iterative methods (so that mixed-up per-call options would show)."""
    kw = {}
    if c["backend"]:
        kw["backend"] = c["backend"]
    if c["method"]:
        kw["method"] = c["method"]
    if (c["method"] is not None and c["method"] not in DIRECT) or c.get("auto_rtol"):
        kw["rtol"] = thread_rtol(t)
    return kw


def thread_rtol(t: int) -> float:
    return 10.0 ** -(7 + t % 4)  # 1e-7 .. 1e-10, a different tolerance per thread


def residual(M: sp.csr_matrix, x: np.ndarray, b: np.ndarray) -> float:
    if x.shape != b.shape or not np.all(np.isfinite(x)):
        return float("inf")
    return float(np.linalg.norm(b - M @ x) / np.linalg.norm(b))


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.ops = 0
        self.by_label: dict[str, dict] = {}
        self.wrong: list[dict] = []
        self.internal: list[dict] = []
        self.library: list[dict] = []

    def record(self, label: str, outcome: str, detail: dict | None = None):
        with self.lock:
            self.ops += 1
            d = self.by_label.setdefault(label, {"ok": 0, "wrong": 0, "internal": 0, "library": 0})
            d[outcome] += 1
            if detail is not None:
                lst = {"wrong": self.wrong, "internal": self.internal, "library": self.library}[outcome]
                if len(lst) < 200:
                    lst.append(detail)


def label_of(c: dict) -> str:
    return (f"{c['op']}[{c['pattern']}:{c['backend'] or 'auto'}/{c['method'] or 'auto'}"
            + (" rtol" if c.get("auto_rtol") else "") + "]")


def whose(world: World, pname: str, x: np.ndarray, t: int) -> str | None:
    """Is ``x`` (wrongly returned to thread ``t``) the answer to another thread's system?"""
    if pname not in world.patterns:
        return None
    P = world.patterns[pname]
    systems = [(f"thread {u}", P["threads"][u]) for u in range(world.n_threads)] + [("shared", P["shared"])]
    for who, S in systems:
        for k, xs in enumerate(S["x"]):
            for j, xr in enumerate(xs):
                if who == f"thread {t}":
                    continue
                if np.linalg.norm(x - xr) <= 1e-6 * np.linalg.norm(xr):
                    return f"{who}, value set {k}, rhs {j}"
    return None


def run_op(world: World, t: int, c: dict, rng: np.random.Generator, state: dict, shared: list, tally: Tally):
    st, torch = world.st, world.torch
    op, pname = c["op"], c["pattern"]
    if op != "shared_solver":
        P = world.own[t] if pname == "own" else world.patterns[pname]
        S = P["threads"][t]
    k = int(rng.integers(N_VALUE_SETS))
    j = int(rng.integers(N_RHS))
    label = label_of(c)
    try:
        if op == "solve":
            A = P["T"].with_values(torch.from_numpy(S["values"][k]))
            b = torch.from_numpy(S["rhs"][j])
            kw = solve_options(c, t)
            rtol = kw.get("rtol")
            x = st.solve(A, b, **kw).numpy()
            bound = max(10 * rtol, 1e-10) if rtol else 1e-10
            res = residual(S["matrices"][k], x, S["rhs"][j])
        elif op == "own_solver":
            key = ("own_solver", pname, c["backend"], c["method"])
            entry = state.get(key)
            if entry is None:
                kw = solve_options(c, t)
                A = P["T"].with_values(torch.from_numpy(S["values"][k]))
                entry = state[key] = {"solver": st.Solver(A, **kw), "k": k, "rtol": kw.get("rtol")}
            s = entry["solver"]
            if entry["k"] != k:
                s.update_values(torch.from_numpy(S["values"][k]))
                entry["k"] = k
            x = s.solve(torch.from_numpy(S["rhs"][j])).numpy()
            bound = max(10 * entry["rtol"], 1e-10) if entry["rtol"] else 1e-10
            res = residual(S["matrices"][k], x, S["rhs"][j])
        elif op == "shared_solver":
            sh = shared[int(rng.integers(len(shared)))]
            label = sh["label"]
            SS = world.patterns[sh["pattern"]]["shared"]
            # each thread its own right-hand side: the thread's rhs j on the shared values
            b = world.patterns[sh["pattern"]]["threads"][t]["rhs"][j]
            x = sh["solver"].solve(torch.from_numpy(b)).numpy()
            bound = max(10 * sh["rtol"], 1e-10) if sh["rtol"] else 1e-10
            res = residual(SS["matrices"][0], x, b)
            k = "shared"
        elif op == "matmul":
            A = P["T"].with_values(torch.from_numpy(S["values"][k]))
            v = S["rhs"][j]
            y = st.matmul(A, torch.from_numpy(v), **({"backend": c["backend"]} if c["backend"] else {})).numpy()
            ref = S["matrices"][k] @ v
            res = float(np.linalg.norm(y - ref) / np.linalg.norm(ref)) if y.shape == ref.shape else float("inf")
            bound = 1e-12
        elif op == "eigsh":
            A = P["T"].with_values(torch.from_numpy(S["values"][k]))
            kw = {}
            if c["backend"]:
                kw["backend"] = c["backend"]
            if c["method"]:
                kw["method"] = c["method"]
            w, _ = st.eigsh(A, 3, which="LA", **kw)
            ref = S["eig_top"][k]
            w = np.sort(w.numpy())
            res = float(np.max(np.abs(w - ref)) / np.max(np.abs(ref))) if w.shape == ref.shape else float("inf")
            bound = 1e-8
        else:  # pragma: no cover
            raise ValueError(op)
    except st.SparseTorchError as exc:
        tally.record(label, "library", {"thread": t, "op": label, "type": type(exc).__name__, "message": str(exc)[:400]})
        return
    except Exception as exc:  # noqa: BLE001 - an internal error is what this counts
        tally.record(label, "internal", {"thread": t, "op": label, "type": type(exc).__name__, "message": str(exc)[:400],
                                         "where": traceback.format_exc(limit=-3)[-800:]})
        return
    if res <= bound:
        tally.record(label, "ok")
    else:
        detail = {"thread": t, "op": label, "value_set": k, "rhs": j, "error": res, "bound": bound}
        if op in ("solve", "own_solver"):
            detail["is_answer_of"] = whose(world, pname, x, t)
        tally.record(label, "wrong", detail)


def serial_pass(world: World, cs: list[dict], shared: list) -> tuple[list[dict], list[dict]]:
    """Run every combination once in this thread; keep those that work serially."""
    keep, dropped = [], []
    for c in cs:
        tally = Tally()
        run_op(world, 0, c, np.random.default_rng(0), {}, shared, tally)
        if tally.by_label[label_of(c)]["ok"] == 1:
            keep.append(c)
        else:
            dropped.append({"combo": label_of(c), "why": (tally.wrong + tally.library + tally.internal)[0]})
    keep_shared = set()
    for sh in shared:
        tally = Tally()
        c = {"op": "shared_solver", "pattern": sh["pattern"], "backend": None, "method": None}
        run_op(world, 0, c, np.random.default_rng(0), {}, [sh], tally)
        if tally.by_label[sh["label"]]["ok"] == 1:
            keep_shared.add(sh["label"])
        else:
            dropped.append({"combo": sh["label"], "why": (tally.wrong + tally.library + tally.internal)[0]})
    return keep, dropped, keep_shared


def thread_main(world: World, t: int, cs: list[dict], shared: list, n_ops: int, seed: int, tally: Tally,
                barrier: threading.Barrier):
    rng = np.random.default_rng(seed * 104729 + t)
    state: dict = {}
    choices = list(cs) + ([{"op": "shared_solver", "pattern": "-", "backend": None, "method": None}] if shared else [])
    per_kind: dict[str, int] = {}
    for c in choices:
        per_kind[c["op"]] = per_kind.get(c["op"], 0) + 1
    weights = np.array([SHARE[c["op"]] / per_kind[c["op"]] for c in choices])
    weights /= weights.sum()
    barrier.wait()
    for _ in range(n_ops):
        c = choices[int(rng.choice(len(choices), p=weights))]
        run_op(world, t, c, rng, state, shared, tally)


def run(n_threads: int, n_ops: int, seed: int) -> dict:
    import torch

    world = World(n_threads, seed)
    st = world.st
    have = set(st.registry().names)
    cs = combos(world)
    shared = make_shared_solvers(world, have)
    keep, dropped, keep_shared = serial_pass(world, cs, shared)
    # the serial pass used the shared solvers already: make them afresh so the threads race on
    # planning and factorizing (those that work serially)
    shared = make_shared_solvers(world, have, keep_shared)
    tally = Tally()
    barrier = threading.Barrier(n_threads)
    threads = [threading.Thread(target=thread_main, args=(world, t, keep, shared, n_ops, seed, tally, barrier),
                                name=f"bench-{t}") for t in range(n_threads)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    ops_kind: dict[str, int] = {}
    for label, d in tally.by_label.items():
        kind = label.split("[")[0]
        ops_kind[kind] = ops_kind.get(kind, 0) + sum(d.values())
    return {
        "threads": n_threads, "ops_per_thread": n_ops, "ops": tally.ops, "wall_seconds": wall,
        "ops_per_second": tally.ops / wall if wall else None,
        "wrong": sum(d["wrong"] for d in tally.by_label.values()),
        "internal_errors": sum(d["internal"] for d in tally.by_label.values()),
        "library_errors": sum(d["library"] for d in tally.by_label.values()),
        "ops_by_kind": ops_kind, "by_combination": tally.by_label,
        "combinations": [label_of(c) for c in keep] + [s["label"] for s in shared],
        "dropped_after_serial_pass": dropped, "backends": sorted(have), "torch_threads": torch.get_num_threads(),
        "wrong_examples": tally.wrong[:50], "internal_examples": tally.internal[:50],
        "library_examples": tally.library[:50],
    }


def versions() -> dict:
    import torch

    import sparsetorch as st

    return {"python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__,
            "torch": torch.__version__, "sparsetorch": st.__version__,
            "plugins": {i.name: i.version for i in st.registry().info()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--ops", type=int, default=1000, help="operations per thread")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--out", default=str(HERE / "results" / "threads_cpu.json"))
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.torch_threads)
    result = {
        "benchmark": "threads",
        "command": "python benchmarks/bench_threads.py " + " ".join(sys.argv[1:]),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpu_count": os.cpu_count(),
                    "note": "shared machine; the counts are the result, the rate is only indicative"},
        "versions": versions(),
    }
    result.update(run(args.threads, args.ops, args.seed))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"{result['threads']} threads x {result['ops_per_thread']} ops = {result['ops']} ops in "
          f"{result['wall_seconds']:.1f} s: wrong {result['wrong']}, internal errors {result['internal_errors']}, "
          f"library errors {result['library_errors']}")
    print(f"ops by kind: {result['ops_by_kind']}")
    for label, d in sorted(result["by_combination"].items()):
        if d["wrong"] or d["internal"] or d["library"]:
            print(f"  {label:<48} ok {d['ok']:5d}  wrong {d['wrong']:4d}  internal {d['internal']:4d}  "
                  f"library {d['library']:4d}")
    seen = set()
    for e in result["internal_examples"] + result["library_examples"]:
        key = (e["op"], e["type"], e["message"][:60])
        if key not in seen:
            seen.add(key)
            print(f"  e.g. {e['op']}: {e['type']}: {e['message'][:200]}")
    mixed = [w for w in result["wrong_examples"] if w.get("is_answer_of")]
    if result["wrong"]:
        print(f"  wrong answers that are another system's solution (of the first {len(result['wrong_examples'])}): "
              f"{len(mixed)}")
    if result["dropped_after_serial_pass"]:
        print(f"  left out (failed serially): {[d['combo'] for d in result['dropped_after_serial_pass']]}")
    print(f"wrote {rel(Path(args.out))}")


if __name__ == "__main__":
    main()

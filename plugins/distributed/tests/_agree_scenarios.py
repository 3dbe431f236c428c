"""What each rank runs in test_distributed_agreement.py: bad input on some ranks of a collective entry point.

``run_cases(comm, barrier_dir, timeout_s)`` runs every case of :data:`CASES`, each in a process group of its
own, and returns, per case and rank, ``None``
(the call returned) or ``(class name, message, seconds until it raised)``. Between cases the ranks meet
at a barrier outside the process group (files in ``barrier_dir``): a rank that raised alone waits there,
alive, while the others sit in the collective it never entered, until the process group's timeout, which
is what a user's process that catches the error (or a notebook) sees. So a regression shows as a slow
``CommTimeoutError`` on the good ranks, not as a peer that died.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

import sparsetorch as st
import sparsetorch_distributed as sd
from sparsetorch_distributed.problems import poisson2d_rows

M = 8  # N = 64: 21/21/22 rows on 3 ranks


def _setup(comm):
    N = M * M
    off = sd.contiguous_offsets(N, comm.size)
    ids = torch.arange(off[comm.rank], off[comm.rank + 1])
    r, c, _ = poisson2d_rows(M, ids)
    r, c = r.flip(0), c.flip(0)  # entries not in slot order: values are summed from them (with_entry_values)
    v = torch.where(r == c, 4.0, -1.0).to(torch.float64)
    A = sd.DSparseTensor.from_local_rows(r, c, v, (N, N), comm=comm)
    b = torch.sin(1.0 + ids.to(torch.float64))
    return A, v, b, ids


def _cases(comm, A, v, b):
    """name -> (ranks that pass bad input, the call every rank makes)."""
    last = comm.size - 1
    bad = comm.rank == last
    rg, cg = A.local_coo()
    A2 = sd.DSparseTensor.from_local_rows(rg, cg, A.values.detach() * 2.0, A.pattern.shape, comm=comm)

    def f(u):
        return A @ u - b

    Ag = sd.DSparseTensor.from_local_rows(rg, cg, A.values.detach().clone().requires_grad_(True), A.pattern.shape,
                                          comm=comm)

    def grad_mode(fn):
        # grad mode off on the bad rank only: its op skipped the grad agreement the others entered
        def call():
            with torch.set_grad_enabled(not bad):
                return fn()
        return call

    S = st.SparseTensor.from_dense(torch.eye(M * M, dtype=torch.float64))

    def cb(it, res):
        if comm.rank == 0 and it == 2:
            raise OSError("log file full")

    return {
        # the length of one rank's slots is wrong: the others went on into solve's first all_reduce
        "with_values_length": ([last], lambda: sd.solve(A.with_values(A.values[:-1] if bad else A.values), b)),
        # two ranks wrong, each its own way: both causes reach every rank
        "with_values_two_ranks": ([0, last], lambda: A.with_values(
            torch.cat([A.values, A.values[:1]]) if comm.rank == 0 else A.values[:-2] if bad else A.values) @ b),
        "with_values_dtype": ([last], lambda: A.with_values(A.values.float() if bad else A.values) @ b),
        "with_values_not_a_tensor": ([last], lambda: A.with_values(A.values.tolist() if bad else A.values) @ b),
        # a value batch on one rank only: every later product would run a different number of exchanges there
        "with_values_batch": ([last], lambda: A.with_values(torch.stack([A.values] * 2) if bad else A.values) @ b),
        "with_entry_values_length": ([last], lambda: A.with_entry_values(v[:-1] if bad else v) @ b),
        "with_entry_values_not_a_tensor": ([last], lambda: A.with_entry_values(v.tolist() if bad else v) @ b),
        # these two were agreed already (regression guards)
        "matmul_length": ([last], lambda: A @ (b[:-1] if bad else b)),
        "solve_length": ([last], lambda: sd.solve(A, b[:-1] if bad else b)),
        "list_member": ([last], lambda: sd.DSparseTensorList([A, "A2" if bad else A2])),
        "list_solve_rhs": ([last], lambda: sd.solve(sd.DSparseTensorList([A, A2]), [b] if bad else [b, b])),
        "list_eigsh_v0": ([last], lambda: sd.eigsh(sd.DSparseTensorList([A, A2]), 2, v0=b if bad else None)),
        "dot_not_a_tensor": ([last], lambda: sd.dot(b, b.tolist() if bad else b, comm)),
        "from_local_rows_shape": ([last], lambda: sd.DSparseTensor.from_local_rows(
            rg, cg, A.values.detach(), None if bad else A.pattern.shape, comm=comm)),
        "nonlinear_rtol": ([last], lambda: sd.nonlinear_solve(f, torch.zeros_like(b), rtol="tight" if bad else None,
                                                              comm=comm)),
        "eigsh_degenerate_tol": ([last], lambda: sd.eigsh(A, 2, degenerate_tol="loose" if bad else 1e-8)),
        # src outside the ranks: IndexError (every rank passing None), or 'only rank -1 passes A'
        "scatter_src_out_of_range": ([0, 1, last], lambda: sd.DSparseTensor.scatter(None, src=5, comm=comm)),
        "scatter_src_negative": ([0, 1, last], lambda: sd.DSparseTensor.scatter(S if bad else None, src=-1, comm=comm)),
        "scatter_src_differs": ([], lambda: sd.DSparseTensor.scatter(S if comm.rank == 0 else None,
                                                                        src=1 if bad else 0, comm=comm)),
        # session 32's sweep: the mismatch named the dtype / which by their integer codes ("rank 0=4, rank 1=3")
        "from_local_rows_dtype_differs": ([], lambda: sd.DSparseTensor.from_local_rows(
            rg, cg, A.values.detach().to(torch.float32 if bad else torch.float64), A.pattern.shape, comm=comm)),
        "eigsh_which_differs": ([], lambda: sd.eigsh(A, 2, which="SA" if bad else "LA")),
        "grad_mode_matmul": ([last], grad_mode(lambda: Ag @ b)),
        "grad_mode_solve": ([last], grad_mode(lambda: sd.solve(Ag, b))),
        "grad_mode_eigsh": ([last], grad_mode(lambda: sd.eigsh(Ag, 2))),
        # a callback raising on one rank: the others waited in the next reduction
        "solve_callback": ([0], lambda: sd.solve(A, b, method="cg", preconditioner=None, callback=cb)),
        "solve_callback_block": ([0], lambda: sd.solve(A, torch.stack([b, 2 * b], 1), method="cg", callback=cb)),
    }


def _barrier(directory: str, tag: str, comm, timeout: float = 45.0) -> None:
    """Wait (outside the process group) until every rank has reached ``tag``."""
    d = Path(directory)
    (d / f"{tag}.{comm.rank}").touch()
    deadline = time.monotonic() + timeout
    while not all((d / f"{tag}.{r}").exists() for r in range(comm.size)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {comm.rank}: the other ranks did not reach {tag!r} within {timeout} s")
        time.sleep(0.01)


def run_cases(comm, barrier_dir: str, timeout_s: float, names=None):
    """Every case (or ``names``) in a process group of its own (``timeout_s``), so that a case that leaves a
    rank behind in a collective spoils only itself."""
    import datetime

    import torch.distributed as dist

    out: dict = {}
    for name in names or list(CASES):
        _barrier(barrier_dir, f"start-{name}", comm)
        timeout = datetime.timedelta(seconds=timeout_s)
        cc = sd.Comm(dist.new_group(backend="gloo", timeout=timeout), timeout=timeout)
        A, v, b, ids = _setup(cc)
        bad, fn = _cases(cc, A, v, b)[name]
        out.setdefault("bad", {})[name] = bad
        out["nse"], out["n_in"] = A.nse_local, A.pattern.n_in
        t0 = time.perf_counter()
        try:
            fn()
            out[name] = None
        except Exception as exc:  # noqa: BLE001 - recorded for the parent to compare
            out[name] = (type(exc).__name__, str(exc), time.perf_counter() - t0)
        _barrier(barrier_dir, f"end-{name}", comm)
    # the default group was not touched by the cases; the last case's group still works after its failure
    try:
        x = sd.solve(A, b)
        out["after"] = float(sd.norm(b - A @ x, cc) / sd.norm(b, cc))
    except Exception as exc:  # noqa: BLE001 - reported (a group left broken by a case)
        out["after"] = f"{type(exc).__name__}: {exc}"
    return out


def run_writes(comm, timeout_s: float):
    """Writes into ``A.values`` of a matrix whose values are summed from entries not in slot order: what every
    rank saw (products, or (class, message) of what it raised), in a process group of its own."""
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    cc = sd.Comm(dist.new_group(backend="gloo", timeout=timeout), timeout=timeout)
    A, v, b, ids = _setup(cc)
    out: dict = {"derived": A._entries is not None}

    def attempt(name, fn):
        t0 = time.perf_counter()
        try:
            out[name] = fn()
        except Exception as exc:  # noqa: BLE001 - recorded for the parent to compare
            out[name] = (type(exc).__name__, str(exc), time.perf_counter() - t0)

    y0 = (A @ b).clone()
    out["y0"] = y0
    # 1. a write into the kept sum is used while the entries are unchanged ...
    A.values.mul_(2.0)
    attempt("written", lambda: A @ b)
    # ... and when the entries change (an optimizer step), the next op raises instead of dropping it silently
    v.mul_(1.0)
    attempt("entries_changed", lambda: A @ b)
    attempt("after_error", lambda: A @ b)  # the values are the entries' again
    # 2. entries that require grad: an op recording gradients sums them afresh and would not see the write
    vg = v.clone().requires_grad_(True)
    Ag = A.with_entry_values(vg)
    with torch.no_grad():
        Ag.values.mul_(2.0)
        attempt("written_no_grad", lambda: Ag @ b)
    attempt("grad_op", lambda: sd.solve(Ag, b))
    # 3. only the last rank writes, then the entries change everywhere: every rank raises, naming that rank
    A3 = A.with_entry_values(v.clone())
    A3 @ b
    if cc.rank == cc.size - 1:
        A3.values[0] = 7.0
    A3._entries.add_(0.0)
    attempt("one_rank", lambda: A3 @ b)
    # 4. with_values is local: one rank alone builds a tensor for a look at it, then every rank multiplies
    if cc.rank == 0:
        out["local_diag"] = A.with_values(A.values.abs()).diagonal()
    attempt("after_local", lambda: A @ b)
    # 4b. a wrong with_values on the last rank reaching solve through detach() (nonlinear_solve's Jacobian path)
    #     and is_symmetric: agreed there, not raised on that rank alone
    bad = cc.rank == cc.size - 1
    D = A.with_values(A.values[:-1] if bad else A.values)
    attempt("deferred_detach_solve", lambda: sd.solve(D.detach(), b))
    attempt("deferred_is_symmetric", lambda: sd.is_symmetric(D))
    # 4c. value batches of the same size and another shape: (2, 3) on the last rank, (3, 2) on the others
    vb = A.values.detach().expand(2, 3, -1) if bad else A.values.detach().expand(3, 2, -1)
    attempt("batch_shapes", lambda: A.with_values(vb.contiguous()) @ b)
    # 5. an option of -0.0 (its bits are -2^63: the agreement's negation overflowed)
    attempt("neg_zero", lambda: float(sd.norm(b - A @ sd.solve(A, b, atol=-0.0), cc) / sd.norm(b, cc)))
    return out


#: the cases' names (every rank builds the cases themselves in its own group)
CASES = ["with_values_length", "with_values_two_ranks", "with_values_dtype", "with_values_not_a_tensor", "with_values_batch",
         "with_entry_values_length", "with_entry_values_not_a_tensor", "matmul_length", "solve_length", "list_member",
         "list_solve_rhs", "list_eigsh_v0", "dot_not_a_tensor", "from_local_rows_shape", "nonlinear_rtol",
         "eigsh_degenerate_tol", "scatter_src_out_of_range", "scatter_src_negative",
         "scatter_src_differs", "from_local_rows_dtype_differs", "eigsh_which_differs",
         "grad_mode_matmul", "grad_mode_solve", "grad_mode_eigsh", "solve_callback",
         "solve_callback_block"]


def run_all(comm, barrier_dir: str, timeout_s: float):
    out = {"cases": run_cases(comm, barrier_dir, timeout_s)}
    _barrier(barrier_dir, "writes", comm)
    out["writes"] = run_writes(comm, timeout_s)
    return out

"""Session 30: the everyday DSparseTensor methods a torch-sla user expects, at 2 and 3 gloo ranks.

``A @ x`` / ``A.matvec`` / ``x @ A``, ``A.eigsh``, ``A.nonlinear_solve``, ``A.slogdet`` / ``logdet`` / ``det``
(gathered), ``A * s`` / ``s * A`` / ``A / s`` / ``-A`` / ``A + B`` / ``A - B``, ``A.sum()`` / ``sum(dim)`` /
``mean`` / ``max`` / ``min``, ``A.T`` / ``A.t()``, ``A.to_dense()`` / ``full_tensor()`` / ``to_sparse()``: values
and gradients against the dense float64 / single-process references of the same global matrix, on a contiguous
partition and on a general one where one rank owns no rows; mismatched partitions and patterns raise on every
rank.

Each rank runs :func:`run_all` (launched by ``sparsetorch_distributed.launch.run_local``); a scenario that raises
is recorded as ``{"error": ...}``, and the parent builds the references and compares.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from pathlib import Path

import pytest
import torch

import sparsetorch as st

HERE = Path(__file__).resolve().parent
N = 7
TOL = 1e-12
LAYOUTS = ("contiguous", "general")


# ---------------------------------------------------------------------------------------------------------------
# the global matrices and inputs (shared by the ranks and the parent)
# ---------------------------------------------------------------------------------------------------------------
def dense_matrix() -> torch.Tensor:
    """Nonsymmetric, diagonally dominant with a positive diagonal (so det > 0), with far entries (halo columns)."""
    i = torch.arange(N)
    D = torch.diag(5.0 + 0.1 * i.to(torch.float64))
    D[i[:-1], i[1:]] = -1.0
    D[i[1:], i[:-1]] = -0.5 - 0.05 * i[1:].to(torch.float64)
    D[0, N - 1] = 0.3
    D[N - 1, 0] = -0.7
    D[2, 5] = 0.9
    return D


def other_matrices() -> dict[str, torch.Tensor]:
    """For max / min: every stored entry negative (the max is an implicit zero), and a full matrix (no implicit
    zero) with a tie of the minimum."""
    D = dense_matrix()
    neg = -D.abs()
    full = -1.0 - 0.1 * torch.arange(N * N, dtype=torch.float64).reshape(N, N).remainder(5)
    full[3, 4] = full[6, 1] = -3.0
    return {"neg": neg, "full": full}


def owned_ids(layout: str, rank: int, p: int) -> torch.Tensor:
    if layout == "contiguous":
        import sparsetorch_distributed as sd

        off = sd.contiguous_offsets(N, p)
        return torch.arange(off[rank], off[rank + 1])
    # every row on the first p - 1 ranks, interleaved; the last rank owns none
    if rank == p - 1:
        return torch.zeros(0, dtype=torch.int64)
    return torch.arange(N)[torch.arange(N) % (p - 1) == rank]


def entries(D: torch.Tensor, ids: torch.Tensor):
    """This rank's stored entries of ``D`` (global indices, reversed order: not in slot order)."""
    sub = D[ids]
    r, c = torch.nonzero(sub, as_tuple=True)
    v = sub[r, c]
    return ids[r].flip(0), c.flip(0), v.flip(0)


def vec(ids, k=0):
    return torch.sin(1.0 + (k + 1) * ids.to(torch.float64))


def weights(ids):
    return torch.cos(0.5 + ids.to(torch.float64))


# ---------------------------------------------------------------------------------------------------------------
# what each rank runs
# ---------------------------------------------------------------------------------------------------------------
def _err(f):
    try:
        f()
    except Exception as exc:  # noqa: BLE001 - recorded for the parent
        return (type(exc).__name__, str(exc))
    return None


def _build(comm, D, layout, v=None):
    import sparsetorch_distributed as sd

    ids = owned_ids(layout, comm.rank, comm.size)
    r, c, vv = entries(D, ids)
    owned = None if layout == "contiguous" else ids
    A = sd.DSparseTensor.from_local_rows(r, c, vv if v is None else v, (N, N), owned=owned, comm=comm)
    return A, ids, r, c, vv


def s_api(comm, layout):
    D = dense_matrix()
    A, ids, r, c, v0 = _build(comm, D, layout)
    out: dict = dict(ids=ids, r=r, c=c, owned=A.owned_rows().clone())
    assert torch.equal(out["owned"], ids)
    x = vec(ids)
    X2 = torch.stack([vec(ids, 1), vec(ids, 2)], 0)     # (2, n_local): two row vectors
    # products
    out["y"] = A @ x
    out["y_matvec"] = A.matvec(x)
    out["x_at_A"] = x @ A
    out["X2_at_A"] = X2 @ A
    # torch-sla's D.scatter(global_vec): local_rows; scatter itself refuses a vector with that hint
    xg = vec(torch.arange(N))
    out["local_rows"] = A.local_rows(xg)
    try:
        A.scatter(xg)
        out["scatter_vec"] = "no error"
    except st.InputError as e:
        out["scatter_vec"] = str(e)
    # gathered forms
    out["dense"] = A.to_dense()
    out["full"] = A.full_tensor()
    S = A.to_sparse()
    out["sparse_type"] = type(S).__name__
    out["sparse_dense"] = S.to_dense()
    # reductions
    out["sum"] = A.sum()
    out["sum0"] = A.sum(dim=0)
    out["sum1"] = A.sum(dim=1)
    out["sum_m1"] = A.sum(-1)
    out["mean"] = A.mean()
    out["mean0"] = A.mean(0)
    out["max"] = A.max()
    out["min"] = A.min()
    for name, M in other_matrices().items():
        B, *_ = _build(comm, M, layout)
        out[f"max_{name}"], out[f"min_{name}"] = B.max(), B.min()
    # scalar ops (values)
    s = torch.tensor(2.5, dtype=torch.float64)
    for name, R in (("mul", A * 2.5), ("rmul", 2.5 * A), ("mul_t", A * s), ("rmul_t", s * A), ("div", A / 4.0),
                    ("div_t", A / s), ("neg", -A), ("add", A + A * 3.0), ("sub", A - (-A)), ("int", 3 * A)):
        out["op_" + name] = R.to_dense()
        out["op_" + name + "_y"] = R @ x
        out["op_" + name + "_same"] = R.pattern is A.pattern and torch.equal(R.owned_rows(), A.owned_rows())
    # transpose
    At = A.T
    out["T_dense"] = At.to_dense()
    out["T_y"] = At @ x
    out["T_owned"] = At.owned_rows().clone()
    out["t_y"] = A.t() @ x
    out["TT_dense"] = At.T.to_dense()
    # determinants (gathered)
    sign, logabs = A.slogdet()
    out["slogdet"] = (sign, logabs)
    out["logdet"] = A.logdet()
    out["det"] = A.det()
    # a value batch
    vals = A.values.detach()
    Ab = A.with_values(torch.stack([vals, -2.0 * vals]))
    out["b_dense"] = Ab.to_dense()
    out["b_sum"] = Ab.sum()
    out["b_sum1"] = Ab.sum(1)
    out["b_max"] = Ab.max()
    out["b_min"] = Ab.min()
    out["b_logdet"] = Ab.logdet()
    out["b_slogdet"] = Ab.slogdet()
    out["b_mul"] = (Ab * 0.5).to_dense()
    out["b_T"] = Ab.T.to_dense()
    # under no_grad and inference mode, on a matrix whose entry values require grad
    vg = v0.clone().requires_grad_(True)
    Ag, *_ = _build(comm, D, layout, vg)
    for mode in ("no_grad", "inference"):
        with torch.no_grad() if mode == "no_grad" else torch.inference_mode():
            rec = dict(sum=Ag.sum(), max=Ag.max(), sum0=Ag.sum(0), T=Ag.T.to_dense(), logdet=Ag.logdet(),
                       mul=(2.0 * Ag - Ag).to_dense())
        out["mode_" + mode] = {k: t.clone() for k, t in rec.items()}
    return out


def s_grad(comm, layout):
    """Gradients of each rank's entry values (and of a replicated scalar ``s``) through every differentiable
    method, one loss each (a fresh leaf per loss)."""
    import sparsetorch_distributed as sd

    D = dense_matrix()
    ids = owned_ids(layout, comm.rank, comm.size)
    r, c, v0 = entries(D, ids)
    x = vec(ids)
    w = weights(ids)
    X2 = torch.stack([vec(ids, 1), vec(ids, 2)], 0)

    def leaf():
        v = v0.clone().requires_grad_(True)
        A, *_ = _build(comm, D, layout, v)
        return v, A

    out: dict = dict(ids=ids, r=r, c=c)
    losses = {
        "logdet": lambda A: A.logdet(),
        "slogdet": lambda A: A.slogdet()[1],
        "det": lambda A: A.det(),
        "sum": lambda A: A.sum(),
        "mean": lambda A: A.mean(),
        "sum0": lambda A: sd.dot(w, A.sum(0), comm),
        "sum1": lambda A: sd.dot(w, A.sum(1), comm),
        "max": lambda A: A.max(),
        "min": lambda A: A.min(),
        "T": lambda A: sd.dot(w, A.T @ x, comm),
        "dense": lambda A: (A.to_dense() * torch.arange(N * N, dtype=torch.float64).reshape(N, N).cos()).sum(),
        "sparse": lambda A: (A.to_sparse().to_dense() ** 2).sum(),
        "matvec": lambda A: sd.dot(w, A.matvec(x), comm),
        "rmatmul": lambda A: sd.dot(X2, X2 @ A, comm),
    }
    for name, f in losses.items():
        v, A = leaf()
        loss = f(A)
        loss.backward()
        out["loss_" + name] = loss.detach()
        out["g_" + name] = v.grad
    # max / min where the extreme is an implicit zero (no stored entry gets a gradient) or a tie of stored entries
    for name, M, f in (("max_neg", other_matrices()["neg"], lambda A: A.max()),
                       ("min_full", other_matrices()["full"], lambda A: A.min())):
        rm, cm, vm = entries(M, ids)
        vm = vm.clone().requires_grad_(True)
        Am, *_ = _build(comm, M, layout, vm)
        f(Am).backward()
        out["g_" + name] = (rm, cm, vm.grad)
    # A.nonlinear_solve: the gradient of w . u reaches the matrix values through F's second argument
    v, A = leaf()
    f = vec(ids, 3)
    u = A.nonlinear_solve(lambda u, M, c: M @ u + c * u ** 3 - f, torch.zeros(ids.numel(), dtype=torch.float64), 0.5)
    sd.dot(w, u, comm).backward()
    out["nl_u"], out["g_nl"] = u.detach(), v.grad
    # the scalar ops: C = s A - A / 3 + (-A) * 0.5 + 2 A2 with s a replicated leaf
    v, A = leaf()
    s = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
    C = s * A - A / 3.0 + (-A) * 0.5 + (A * s - A)
    loss = sd.dot(w, C @ x, comm)
    loss.backward()
    out["loss_ops"] = loss.detach()
    out["g_ops"] = v.grad
    out["gs_ops"] = s.grad.detach().clone()
    out["gs_ops_total"] = sd.global_sum(s.grad.detach().clone(), comm)
    return out


def s_solvers(comm, layout):
    """``A.eigsh`` and ``A.nonlinear_solve`` (delegating to the package's functions)."""
    D = dense_matrix()
    Ssym = D + D.T
    A, ids, *_ = _build(comm, Ssym, layout)
    out: dict = dict(ids=ids)
    w, V = A.eigsh(2, which="LA")
    out["eig_w"], out["eig_V"] = w, V
    w2, _ = A.eigsh(k=1, which="SA")
    out["eig_w_sa"] = w2
    B, *_ = _build(comm, D, layout)
    f = vec(ids)

    def F(u, M, c):
        return M @ u + c * u ** 3 - f

    u = B.nonlinear_solve(F, torch.zeros(ids.numel(), dtype=torch.float64), 0.5)
    out["u"] = u.detach()
    return out


def s_errors(comm, layout):
    """Mismatched partitions / patterns for + and -, a non-scalar for *, a bad dim: errors, on every rank."""
    D = dense_matrix()
    A, ids, *_ = _build(comm, D, layout)
    other = "general" if layout == "contiguous" else "contiguous"
    B, *_ = _build(comm, D, other)                 # same matrix, other partition
    D2 = D.clone()
    D2[1, 4] = 2.0                                 # one more stored entry: another pattern
    C, *_ = _build(comm, D2, layout)
    out: dict = {}
    out["partition_add"] = _err(lambda: A + B)
    out["pattern_sub"] = _err(lambda: A - C)
    out["vector_mul"] = _err(lambda: A * torch.ones(3, dtype=torch.float64))
    out["str_mul"] = _err(lambda: A * "x")
    out["add_number"] = _err(lambda: A + 1.0)
    out["bad_dim"] = _err(lambda: A.sum(dim=5))
    out["float32_add"] = _err(lambda: A + A.with_values(A.values.detach().float()))
    # a transpose recorded on some ranks only (its backward communicates): MismatchError on every rank
    vg = A.values.detach().clone().requires_grad_(True)
    Ag = A.with_values(vg)
    with torch.no_grad() if comm.rank == 0 else contextlib.nullcontext():
        out["T_grad_mode"] = _err(lambda: Ag.T)
    out["ok_after"] = float(A.sum())               # the ranks are still in step
    return out


SCENARIOS = {"api": s_api, "grad": s_grad, "solvers": s_solvers, "errors": s_errors}


def run_all(comm):
    import sparsetorch_distributed as sd

    out = {}
    for layout in LAYOUTS:
        for name, fn in SCENARIOS.items():
            sd.pattern_cache_clear()
            try:
                out[(name, layout)] = fn(comm, layout)
            except Exception as exc:  # noqa: BLE001 - recorded for the parent
                out[(name, layout)] = {"error": (type(exc).__name__, str(exc)[:2000]),
                                       "traceback": traceback.format_exc()[-3000:]}
            with contextlib.suppress(Exception):
                comm.allgather_object(name)   # resynchronize after a scenario that failed on some ranks only
    return out


# ---------------------------------------------------------------------------------------------------------------
# the parent: launches and references
# ---------------------------------------------------------------------------------------------------------------
_RUNS: dict = {}


def _scenario(p: int, name: str, layout: str):
    if p not in _RUNS:
        from sparsetorch_distributed.launch import run_local

        env = {"PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
        _RUNS[p] = run_local(p, "test_dsparse_api_s30:run_all", (), timeout=240, env=env, collective_timeout=60)
    outs = [o[(name, layout)] for o in _RUNS[p]]
    for r, o in enumerate(outs):
        if isinstance(o, dict) and "error" in o:
            pytest.fail(f"rank {r} raised in scenario {name}/{layout}: {o['error']}\n{o.get('traceback', '')}")
    return outs


def _glue(parts, ids_list):
    out = torch.full((N,) + tuple(parts[0].shape[1:]), float("nan"), dtype=torch.float64)
    for part, ids in zip(parts, ids_list):
        out[ids] = part.to(torch.float64)
    assert not torch.isnan(out).any()
    return out


def _rel(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _same(a, b) -> bool:
    """Bitwise the same values (NaN equal to NaN)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True)


def _replicated(outs, key):
    """The value every rank holds for ``key``, asserting it is bitwise the same on every rank."""
    first = outs[0][key]
    for r, o in enumerate(outs[1:], 1):
        a, b = o[key], first
        if isinstance(a, tuple):
            assert all(_same(x, y) for x, y in zip(a, b)), (key, r)
        else:
            assert _same(a, b), (key, r, a, b)
    return first


P = pytest.mark.parametrize("p", [2, 3])
L = pytest.mark.parametrize("layout", LAYOUTS)


@P
@L
def test_products_and_gathered_forms(p, layout):
    outs = _scenario(p, "api", layout)
    ids = [o["ids"] for o in outs]
    if layout == "general":
        assert outs[-1]["ids"].numel() == 0          # a rank without rows takes part
    D = dense_matrix()
    x = vec(torch.arange(N))
    X2 = torch.stack([vec(torch.arange(N), 1), vec(torch.arange(N), 2)], 0)
    assert _rel(_glue([o["y"] for o in outs], ids), D @ x) < TOL
    assert _rel(_glue([o["y_matvec"] for o in outs], ids), D @ x) < TOL
    assert _rel(_glue([o["x_at_A"] for o in outs], ids), x @ D) < TOL
    got = _glue([o["X2_at_A"].t() for o in outs], ids).t()
    assert _rel(got, X2 @ D) < TOL
    for key in ("dense", "full", "sparse_dense"):
        assert torch.equal(_replicated(outs, key), D), key
    assert all(o["sparse_type"] == "SparseTensor" for o in outs)
    for o in outs:
        assert torch.equal(o["local_rows"], x[o["ids"]])
        assert "local_rows" in o["scatter_vec"] and f"({N},)" in o["scatter_vec"]


@P
@L
def test_reductions(p, layout):
    outs = _scenario(p, "api", layout)
    ids = [o["ids"] for o in outs]
    D = dense_matrix()
    assert _rel(_replicated(outs, "sum"), D.sum()) < TOL
    assert _rel(_replicated(outs, "mean"), D.mean()) < TOL
    assert float(_replicated(outs, "max")) == float(D.max())
    assert float(_replicated(outs, "min")) == float(D.min())
    assert _rel(_glue([o["sum0"] for o in outs], ids), D.sum(0)) < TOL
    assert _rel(_glue([o["sum1"] for o in outs], ids), D.sum(1)) < TOL
    assert _rel(_glue([o["sum_m1"] for o in outs], ids), D.sum(1)) < TOL
    assert _rel(_glue([o["mean0"] for o in outs], ids), D.mean(0)) < TOL
    for name, M in other_matrices().items():
        assert float(_replicated(outs, "max_" + name)) == float(M.max()), name
        assert float(_replicated(outs, "min_" + name)) == float(M.min()), name
    assert float(_replicated(outs, "max_neg")) == 0.0    # an implicit zero


@P
@L
def test_scalar_ops_and_sums_of_matrices(p, layout):
    outs = _scenario(p, "api", layout)
    ids = [o["ids"] for o in outs]
    D = dense_matrix()
    x = vec(torch.arange(N))
    want = {"mul": 2.5 * D, "rmul": 2.5 * D, "mul_t": 2.5 * D, "rmul_t": 2.5 * D, "div": D / 4.0, "div_t": D / 2.5,
            "neg": -D, "add": 4.0 * D, "sub": 2.0 * D, "int": 3.0 * D}
    for name, M in want.items():
        assert _rel(_replicated(outs, "op_" + name), M) < TOL, name
        assert _rel(_glue([o["op_" + name + "_y"] for o in outs], ids), M @ x) < TOL, name
        assert all(o["op_" + name + "_same"] for o in outs), name   # same pattern and partition


@P
@L
def test_transpose(p, layout):
    outs = _scenario(p, "api", layout)
    ids = [o["ids"] for o in outs]
    D = dense_matrix()
    x = vec(torch.arange(N))
    assert torch.equal(_replicated(outs, "T_dense"), D.T)
    assert torch.equal(_replicated(outs, "TT_dense"), D)
    assert all(torch.equal(o["T_owned"], o["owned"]) for o in outs)     # the same row partition
    assert _rel(_glue([o["T_y"] for o in outs], ids), D.T @ x) < TOL
    assert _rel(_glue([o["t_y"] for o in outs], ids), D.T @ x) < TOL


@P
@L
def test_determinants(p, layout):
    outs = _scenario(p, "api", layout)
    D = dense_matrix()
    sign_ref, logabs_ref = torch.linalg.slogdet(D)
    sign, logabs = _replicated(outs, "slogdet")
    assert float(sign) == float(sign_ref) and _rel(logabs, logabs_ref) < TOL
    assert _rel(_replicated(outs, "logdet"), torch.logdet(D)) < TOL
    assert _rel(_replicated(outs, "det"), torch.det(D)) < TOL
    # the core's own slogdet of the same global matrix (single process)
    S = st.SparseTensor.from_dense(D)
    assert _rel(_replicated(outs, "logdet"), st.logdet(S)) < TOL


@P
@L
def test_without_gradients(p, layout):
    outs = _scenario(p, "api", layout)
    ids = [o["ids"] for o in outs]
    D = dense_matrix()
    for mode in ("no_grad", "inference"):
        recs = [o["mode_" + mode] for o in outs]
        for rec in recs:
            assert not any(t.requires_grad for t in rec.values())
        assert _rel(recs[0]["sum"], D.sum()) < TOL and float(recs[0]["max"]) == float(D.max())
        assert _rel(_glue([rec["sum0"] for rec in recs], ids), D.sum(0)) < TOL
        assert torch.equal(recs[0]["T"], D.T) and _rel(recs[0]["mul"], D) < TOL
        assert _rel(recs[0]["logdet"], torch.logdet(D)) < TOL


@P
@L
def test_value_batch(p, layout):
    outs = _scenario(p, "api", layout)
    ids = [o["ids"] for o in outs]
    D = dense_matrix()
    Db = torch.stack([D, -2.0 * D])
    assert torch.equal(_replicated(outs, "b_dense"), Db)
    assert _rel(_replicated(outs, "b_sum"), Db.sum((-1, -2))) < TOL
    got = torch.stack([_glue([o["b_sum1"][i] for o in outs], ids) for i in range(2)])
    assert _rel(got, Db.sum(-1)) < TOL
    assert torch.equal(_replicated(outs, "b_max"), Db.amax((-1, -2)))
    assert torch.equal(_replicated(outs, "b_min"), Db.amin((-1, -2)))
    ld = _replicated(outs, "b_logdet")    # (N odd: det(-2 D) < 0, so logdet is nan, as torch.logdet's)
    assert _rel(ld[0], torch.logdet(D)) < TOL and torch.isnan(ld[1])
    sign, logabs = _replicated(outs, "b_slogdet")
    sign_ref, logabs_ref = torch.linalg.slogdet(Db)
    assert torch.equal(sign, sign_ref) and _rel(logabs, logabs_ref) < TOL
    assert _rel(_replicated(outs, "b_mul"), 0.5 * Db) < TOL
    assert torch.equal(_replicated(outs, "b_T"), Db.transpose(-1, -2))


def _reference_grads():
    """Single-process gradients of the same losses, on the dense float64 matrix of the same entries."""
    D0 = dense_matrix()
    ids = torch.arange(N)
    x, w = vec(ids), weights(ids)
    X2 = torch.stack([vec(ids, 1), vec(ids, 2)], 0)
    losses = {
        "logdet": lambda Dm: torch.logdet(Dm),
        "slogdet": lambda Dm: torch.linalg.slogdet(Dm)[1],
        "det": lambda Dm: torch.det(Dm),
        "sum": lambda Dm: Dm.sum(),
        "mean": lambda Dm: Dm.mean(),
        "sum0": lambda Dm: (w * Dm.sum(0)).sum(),
        "sum1": lambda Dm: (w * Dm.sum(1)).sum(),
        "max": lambda Dm: Dm.max(),
        "min": lambda Dm: Dm.min(),
        "T": lambda Dm: (w * (Dm.T @ x)).sum(),
        "dense": lambda Dm: (Dm * torch.arange(N * N, dtype=torch.float64).reshape(N, N).cos()).sum(),
        "sparse": lambda Dm: (Dm ** 2).sum(),
        "matvec": lambda Dm: (w * (Dm @ x)).sum(),
        "rmatmul": lambda Dm: (X2 * (X2 @ Dm)).sum(),
    }
    ref = {}
    for name, f in losses.items():
        Dm = D0.clone().requires_grad_(True)
        loss = f(Dm)
        loss.backward()
        ref[name] = (loss.detach(), Dm.grad)
    Dm = D0.clone().requires_grad_(True)
    s = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
    C = s * Dm - Dm / 3.0 + (-Dm) * 0.5 + (Dm * s - Dm)
    loss = (w * (C @ x)).sum()
    loss.backward()
    ref["ops"] = (loss.detach(), Dm.grad, s.grad)
    return ref


@P
@L
def test_gradients_match_single_process(p, layout):
    outs = _scenario(p, "grad", layout)
    ref = _reference_grads()
    for name, (loss_ref, G) in ((k, v[:2]) for k, v in ref.items()):
        loss = _replicated(outs, "loss_" + name)
        assert _rel(loss, loss_ref) < TOL, name
        for o in outs:
            g = o["g_" + name]
            want = G[o["r"], o["c"]]
            if o["r"].numel() == 0:
                assert g is None or g.numel() == 0
                continue
            assert g is not None, (name, "no gradient")
            assert _rel(g, want) < 1e-10 if want.abs().max() > 0 else float(g.abs().max()) == 0.0, name
    for name, M, red in (("max_neg", other_matrices()["neg"], torch.max), ("min_full", other_matrices()["full"], torch.min)):
        Mm = M.clone().requires_grad_(True)
        red(Mm).backward()
        for o in outs:
            rm, cm, g = o["g_" + name]
            if rm.numel():
                assert torch.equal(g, Mm.grad[rm, cm]), name
    assert float(other_matrices()["full"].min()) == -3.0 and float(Mm.grad.max()) == 0.5  # (a tie: half each)
    # nonlinear_solve: J^T lam = w, J = D + 3 c diag(u^2); d(w . u)/dD = -lam u^T
    ids = [o["ids"] for o in outs]
    u = _glue([o["nl_u"] for o in outs], ids)
    D = dense_matrix()
    assert float((D @ u + 0.5 * u ** 3 - vec(torch.arange(N), 3)).abs().max()) < 1e-9
    lam = torch.linalg.solve((D + torch.diag(1.5 * u ** 2)).T, weights(torch.arange(N)))
    Gnl = -torch.outer(lam, u)
    for o in outs:
        if o["r"].numel():
            assert _rel(o["g_nl"], Gnl[o["r"], o["c"]]) < 1e-8
    # the replicated scalar: each rank holds its share, summing to the single-process gradient
    total = _replicated(outs, "gs_ops_total")
    assert _rel(total, ref["ops"][2]) < TOL


@P
@L
def test_eigsh_and_nonlinear_solve_methods(p, layout):
    outs = _scenario(p, "solvers", layout)
    ids = [o["ids"] for o in outs]
    D = dense_matrix()
    Ssym = D + D.T
    ev = torch.linalg.eigvalsh(Ssym)
    assert _rel(_replicated(outs, "eig_w"), ev[-2:]) < 1e-9
    assert _rel(_replicated(outs, "eig_w_sa"), ev[:1]) < 1e-9
    V = _glue([o["eig_V"] for o in outs], ids)
    assert _rel(Ssym @ V, V * ev[-2:]) < 1e-8
    u = _glue([o["u"] for o in outs], ids)
    f = vec(torch.arange(N))
    assert float((D @ u + 0.5 * u ** 3 - f).abs().max()) < 1e-9


@P
@L
def test_errors_are_agreed(p, layout):
    outs = _scenario(p, "errors", layout)
    for key in ("partition_add", "pattern_sub"):
        errs = [o[key] for o in outs]
        assert all(e is not None for e in errs), key
        assert all(e[0] == "MismatchError" for e in errs), errs
        assert all(e == errs[0] for e in errs), errs          # the same message on every rank
        assert "partition or pattern" in errs[0][1]
    for key in ("vector_mul", "str_mul", "add_number"):
        assert all(o[key] is not None and o[key][0] == "TypeError" for o in outs), [o[key] for o in outs]
    errs = [o["bad_dim"] for o in outs]
    assert all(e is not None and e[0] == "InputError" and e == errs[0] for e in errs), errs
    errs = [o["float32_add"] for o in outs]
    assert all(e is not None and e[0] == "InputError" for e in errs), errs
    errs = [o["T_grad_mode"] for o in outs]
    assert all(e is not None and e[0] == "MismatchError" and "grad mode" in e[1] for e in errs), errs
    assert len({o["ok_after"] for o in outs}) == 1

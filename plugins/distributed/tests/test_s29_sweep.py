"""Session 29's sweep (an outside tester), at 1 and 2 gloo ranks.

1. ``solve`` (and ``A @ x``, ``A^T @ x``, ``from_local_rows``) under ``torch.inference_mode()`` raised "Inference
   tensors do not track version counter": the cache keys of the CSR blocks, the transposed blocks, the
   preconditioner and the pattern cache read ``t._version``. Now an inference tensor's key holds no version (as in
   the core): the blocks are views of the values (a write into them, possible only inside inference mode, is seen),
   the copies made of them (transposed blocks, preconditioner, the slot sum of entry values) last one op call, and
   index tensors made in inference mode are not put in the pattern cache. Checked against dense float64, with
   writes made in place inside inference mode between calls, and a gradient outside it afterwards.
5. ``torch.save(A)`` of a DSparseTensor raised "AttributeError: Can't pickle local object '_make.<locals>.fn'":
   now a TypeError saying why (it lives on a process group) and what to save instead (``local_coo()``, ``values``,
   ``owned_rows()``; rebuilt with ``from_local_rows``), checked by saving those and rebuilding.

Each rank runs :func:`run_all` (launched by ``sparsetorch_distributed.launch.run_local``); a scenario that raises
is recorded as ``{"error": ...}``, and the parent builds the float64 references and compares.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import pickle
import traceback
from pathlib import Path

import pytest
import torch

import sparsetorch as st

HERE = Path(__file__).resolve().parent
N = 8
TOL = 1e-10


# ---------------------------------------------------------------------------------------------------------------
# what each rank runs
# ---------------------------------------------------------------------------------------------------------------
def dense_matrix(sym: bool) -> torch.Tensor:
    """A diagonally dominant tridiagonal matrix with two far entries (halo columns at 2 ranks); nonsymmetric unless
    ``sym``."""
    i = torch.arange(N)
    D = torch.diag(torch.full((N,), 5.0, dtype=torch.float64) + 0.1 * i)
    D[i[:-1], i[1:]] = -1.0
    D[i[1:], i[:-1]] = -1.0 if sym else -0.5 - 0.05 * i[1:].to(torch.float64)
    D[0, N - 1] = D[N - 1, 0] = 0.3
    if not sym:
        D[2, 6] = 0.7
    return D


def _rhs(ids: torch.Tensor) -> torch.Tensor:
    return 1.0 + torch.cos(ids.to(torch.float64))


def _ids(comm) -> torch.Tensor:
    import sparsetorch_distributed as sd

    off = sd.contiguous_offsets(N, comm.size)
    return torch.arange(off[comm.rank], off[comm.rank + 1])


def _entries(D: torch.Tensor, ids: torch.Tensor):
    """This rank's entries of ``D``, unsorted and with each diagonal entry split in two (so the matrix keeps them
    as entry values, summed into its slots)."""
    sub = D[ids]
    r, c = torch.nonzero(sub, as_tuple=True)
    v = sub[r, c]
    r = ids[r]
    d = r == c
    perm = torch.arange(r.numel()).flip(0)
    return (torch.cat([r[perm], r[d]]), torch.cat([c[perm], c[d]]),
            torch.cat([torch.where(d, 0.5 * v, v)[perm], 0.5 * v[d]]))


def _plain(t):
    """A normal tensor (an inference tensor's clone made outside inference mode) for the parent."""
    return t.detach().clone() if isinstance(t, torch.Tensor) else t


def s_inference(comm):
    import sparsetorch_distributed as sd

    ids = _ids(comm)
    b = _rhs(ids)
    out: dict = dict(ids=ids)
    for sym in (True, False):
        D = dense_matrix(sym)
        src = st.SparseTensor.from_dense(D) if comm.rank == 0 else None
        rec: dict = {}
        # (a) scattered outside inference mode (the reproducer), (b) scattered inside it
        A_out = sd.DSparseTensor.scatter(src, src=0, comm=comm)
        with torch.inference_mode():
            A_in = sd.DSparseTensor.scatter(src, src=0, comm=comm)
            for tag, A in (("out", A_out), ("in", A_in)):
                rec[f"{tag}_owned"] = A.owned_rows().clone()
                bb = _rhs(A.owned_rows())
                rec[f"{tag}_x"] = sd.solve(A, bb, rtol=1e-13)
                for pre in ("jacobi", "block_jacobi", None):
                    rec[f"{tag}_x_{pre}"] = sd.solve(A, bb, rtol=1e-13, preconditioner=pre)
                rec[f"{tag}_y"] = A @ bb
                rec[f"{tag}_z"] = A.rmatmul(bb)
        out[sym] = {k: _plain(v) for k, v in rec.items()}
    # (c) entries made in inference mode (summed into slots), index tensors too (the pattern cache), a write into
    # the entries inside inference mode between two products, then the same rows / cols written in place and a new
    # matrix on them (a cached pattern would be the old one)
    D = dense_matrix(False)
    r, c, v = _entries(D, ids)
    rec = {}
    with torch.inference_mode():
        ri, ci, vi = r.clone(), c.clone(), v.clone()
        A = sd.DSparseTensor.from_local_rows(ri, ci, vi, (N, N), comm=comm)   # (contiguous rows: ids)
        rec["y1"] = A @ b
        rec["z1"] = A.rmatmul(b)
        rec["x1"] = sd.solve(A, b, rtol=1e-13, preconditioner="block_jacobi")
        vi.mul_(2.0)
        rec["y2"] = A @ b
        rec["z2"] = A.rmatmul(b)
        rec["x2"] = sd.solve(A, b, rtol=1e-13, preconditioner="block_jacobi")
        # move each entry of column c to column N-1-c (row and value unchanged): another matrix on the same tensors
        ci.copy_(N - 1 - ci)
        B = sd.DSparseTensor.from_local_rows(ri, ci, vi, (N, N), comm=comm)
        Bo = sd.DSparseTensor.from_local_rows(ri, ci, vi, (N, N), owned=ids.clone(), comm=comm)  # (given row ids)
        rec["y3"] = B @ b
        rec["y3o"] = Bo @ b
        # (d) slot values made in inference mode, written in place between calls (views see the write; the
        # transposed copies and the preconditioner are made again)
        vs = A.values.clone()
        As = A.with_values(vs)
        rec["y4"] = As @ b
        rec["x4"] = sd.solve(As, b, rtol=1e-13, preconditioner="block_jacobi")
        rec["z4"] = As.rmatmul(b)
        vs.mul_(3.0)
        rec["y5"] = As @ b
        rec["x5"] = sd.solve(As, b, rtol=1e-13, preconditioner="block_jacobi")
        rec["z5"] = As.rmatmul(b)
        # a zero diagonal entry (the Jacobi preconditioner refuses it), then repaired in place: the refusal is not
        # remembered for the repaired values
        d0 = int(A.pattern.diag_slot[0])
        keep = float(vs[d0])
        vs[d0] = 0.0
        rec["pre_singular"] = sd.solve(As, b, rtol=1e-13, preconditioner="jacobi", return_info=True)[1].preconditioner
        vs[d0] = keep
        rec["x6"], info = sd.solve(As, b, rtol=1e-13, preconditioner="jacobi", return_info=True)
        rec["pre_repaired"] = info.preconditioner
    out["entries"] = {k: _plain(t) for k, t in rec.items()}
    out["entries"].update(r=r, c=c, v=v)
    # (e) a matrix used in inference mode first, then with gradients outside it
    vv = v.clone().requires_grad_(True)
    A = sd.DSparseTensor.from_local_rows(r, c, vv, (N, N), owned=ids, comm=comm)
    with torch.inference_mode():
        yi = A @ b
        xi = sd.solve(A, b, rtol=1e-13)
    bg = b.clone().requires_grad_(True)
    x = sd.solve(A, bg, rtol=1e-13)
    y = A @ bg
    w = torch.sin(ids.to(torch.float64) + 1.0)
    sd.global_sum((w * (x + y)).sum(), comm).backward()
    out["grad"] = dict(yi=_plain(yi), xi=_plain(xi), x=x.detach(), y=y.detach(), gv=vv.grad, gb=bg.grad)
    return out


def _err(f):
    try:
        f()
    except Exception as exc:  # noqa: BLE001 - recorded for the parent
        return (type(exc).__name__, str(exc))
    return None


def s_pickle(comm):
    import sparsetorch_distributed as sd

    ids = _ids(comm)
    D = dense_matrix(False)
    r, c, v = _entries(D, ids)
    A = sd.DSparseTensor.from_local_rows(r, c, v, (N, N), owned=ids, comm=comm)
    sd.solve(A, _rhs(ids), rtol=1e-13, preconditioner="block_jacobi")  # (caches a preconditioner's local closure)
    out: dict = {}
    out["save"] = _err(lambda: torch.save(A, io.BytesIO()))
    out["pickle"] = _err(lambda: pickle.dumps(A))
    out["deepcopy"] = _err(lambda: copy.deepcopy(A))
    out["list"] = _err(lambda: torch.save(sd.DSparseTensorList([A, A]), io.BytesIO()))
    # copy.copy still works (with_values' deferred errors are made with it)
    out["copy_ok"] = float((copy.copy(A) @ _rhs(ids) - A @ _rhs(ids)).abs().max())
    # what the message says to save instead, saved and rebuilt
    buf = io.BytesIO()
    rows, cols = A.local_coo()
    torch.save({"rows": rows, "cols": cols, "values": A.values, "owned": A.owned_rows(), "shape": A.pattern.shape}, buf)
    buf.seek(0)
    s = torch.load(buf)
    A2 = sd.DSparseTensor.from_local_rows(s["rows"], s["cols"], s["values"], s["shape"], owned=s["owned"], comm=comm)
    out["y"] = A2 @ _rhs(ids)
    out["ids"] = ids
    return out


SCENARIOS = {"inference": s_inference, "pickle": s_pickle}


def run_all(comm, names=tuple(SCENARIOS)):
    import sparsetorch_distributed as sd

    out = {}
    for name in names:
        sd.pattern_cache_clear()
        try:
            out[name] = SCENARIOS[name](comm)
        except Exception as exc:  # noqa: BLE001 - recorded for the parent
            out[name] = {"error": (type(exc).__name__, str(exc)[:2000]), "traceback": traceback.format_exc()[-3000:]}
        with contextlib.suppress(Exception):
            comm.allgather_object(name)   # resynchronize after a scenario that failed on some ranks only
    return out


# ---------------------------------------------------------------------------------------------------------------
# the parent: launches and references
# ---------------------------------------------------------------------------------------------------------------
_RUNS: dict = {}


def _scenario(p: int, name: str):
    if p not in _RUNS:
        from sparsetorch_distributed.launch import run_local

        env = {"PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
        _RUNS[p] = run_local(p, "test_s29_sweep:run_all", (), timeout=300, env=env, collective_timeout=60)
    outs = [o[name] for o in _RUNS[p]]
    for r, o in enumerate(outs):
        if isinstance(o, dict) and "error" in o:
            pytest.fail(f"rank {r} raised in scenario {name}: {o['error']}\n{o.get('traceback', '')}")
    return outs


def _glue(parts, ids_list):
    out = torch.full((N,), float("nan"), dtype=torch.float64)
    for part, ids in zip(parts, ids_list):
        out[ids] = part.to(torch.float64)
    assert not torch.isnan(out).any()
    return out


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("sym", [True, False], ids=["sym", "nonsym"])
@pytest.mark.parametrize("made", ["out", "in"], ids=["scattered_outside", "scattered_inside"])
def test_solve_and_products_under_inference_mode(p, sym, made):
    outs = _scenario(p, "inference")
    recs = [o[sym] for o in outs]
    owned = [rec[f"{made}_owned"] for rec in recs]
    D = dense_matrix(sym)
    b = _rhs(torch.arange(N))
    x_ref = torch.linalg.solve(D, b)
    for key in ("x", "x_jacobi", "x_block_jacobi", "x_None"):
        assert _rel(_glue([rec[f"{made}_{key}"] for rec in recs], owned), x_ref) < TOL, key
    assert _rel(_glue([rec[f"{made}_y"] for rec in recs], owned), D @ b) < TOL
    assert _rel(_glue([rec[f"{made}_z"] for rec in recs], owned), D.T @ b) < TOL


def _entries_dense(recs, col_map=None):
    Dn = torch.zeros(N, N, dtype=torch.float64)
    for rec in recs:
        c = rec["c"] if col_map is None else col_map(rec["c"])
        Dn.index_put_((rec["r"], c), rec["v"], accumulate=True)
    return Dn


@pytest.mark.parametrize("p", [1, 2])
def test_inference_entries_and_values_written_in_place_are_followed(p):
    """Entry values, index tensors and slot values made in inference mode and written in place inside it between
    calls: every later product, transposed product and (block-Jacobi preconditioned) solve uses the new numbers."""
    outs = _scenario(p, "inference")
    recs = [o["entries"] for o in outs]
    ids = [o["ids"] for o in outs]
    D = _entries_dense(recs)
    assert torch.equal(D, dense_matrix(False))
    b = _rhs(torch.arange(N))
    for k, s in (("1", 1.0), ("2", 2.0), ("4", 2.0), ("5", 6.0)):
        assert _rel(_glue([rec["y" + k] for rec in recs], ids), s * D @ b) < TOL, "y" + k
        assert _rel(_glue([rec["z" + k] for rec in recs], ids), s * D.T @ b) < TOL, "z" + k
        assert _rel(_glue([rec["x" + k] for rec in recs], ids), torch.linalg.solve(s * D, b)) < TOL, "x" + k
    assert all(rec["pre_singular"].startswith("none (jacobi could not be set up") for rec in recs), recs[0]["pre_singular"]
    assert all(rec["pre_repaired"] == "jacobi" for rec in recs), recs[0]["pre_repaired"]
    assert _rel(_glue([rec["x6"] for rec in recs], ids), torch.linalg.solve(6.0 * D, b)) < TOL
    D3 = 2.0 * _entries_dense(recs, lambda c: N - 1 - c)
    assert _rel(_glue([rec["y3"] for rec in recs], ids), D3 @ b) < TOL
    assert _rel(_glue([rec["y3o"] for rec in recs], ids), D3 @ b) < TOL


@pytest.mark.parametrize("p", [1, 2])
def test_gradients_after_inference_mode_use(p):
    outs = _scenario(p, "inference")
    recs = [o["grad"] for o in outs]
    ents = [o["entries"] for o in outs]
    ids = [o["ids"] for o in outs]
    R = torch.cat([e["r"] for e in ents])
    C = torch.cat([e["c"] for e in ents])
    V = torch.cat([e["v"] for e in ents]).clone().requires_grad_(True)
    b = _rhs(torch.arange(N)).requires_grad_(True)
    D = torch.zeros(N, N, dtype=torch.float64).index_put((R, C), V, accumulate=True)
    x, y = torch.linalg.solve(D, b), D @ b
    assert _rel(_glue([r["yi"] for r in recs], ids), y.detach()) < TOL
    assert _rel(_glue([r["xi"] for r in recs], ids), x.detach()) < TOL
    assert _rel(_glue([r["x"] for r in recs], ids), x.detach()) < TOL
    assert _rel(_glue([r["y"] for r in recs], ids), y.detach()) < TOL
    w = torch.sin(torch.arange(N, dtype=torch.float64) + 1.0)
    (w * (x + y)).sum().backward()
    assert _rel(torch.cat([r["gv"] for r in recs]), V.grad) < 1e-9
    assert _rel(_glue([r["gb"] for r in recs], ids), b.grad) < 1e-9


@pytest.mark.parametrize("p", [1, 2])
def test_saving_a_dsparse_tensor_says_what_to_save(p):
    outs = _scenario(p, "pickle")
    for o in outs:
        for key in ("save", "pickle", "deepcopy", "list"):
            assert o[key] is not None, f"{key} did not raise"
            kind, msg = o[key]
            assert kind == "TypeError", (key, kind, msg)
            assert "process group" in msg and "local_coo()" in msg and "from_local_rows" in msg, msg
        assert o["copy_ok"] == 0.0
    ids = [o["ids"] for o in outs]
    D = dense_matrix(False)
    assert _rel(_glue([o["y"] for o in outs], ids), D @ _rhs(torch.arange(N))) < TOL

"""GPU operands: declined by default, offered with the host copies costed when the user allows
transfers (backend_options allow_transfer=True until the core has an option), run through a
TransferPlan. The CUDA cases run where a GPU exists; the rest checks the offers from metadata."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.format import CSR
from sparsetorch.testing.problems import convection_diffusion, poisson2d

from sparsetorch_scipy import plugin
from sparsetorch_scipy._transfer import TransferPlan, transfer_seconds

CUDA = torch.device("cuda")


def _request(device, op="solve", n=400, nse=1920, k=1, **options) -> st.Request:
    A = st.OperandInfo("sparse", (n, n), torch.float64, torch.device(device), CSR, nse)
    B = st.OperandInfo("dense", (n, k), torch.float64, torch.device(device))
    return st.Request(op, (A, B), frozenset({"spd", "symmetric"}), {"rtol": 1e-6, **options})


def test_cuda_declined_unless_transfers_are_allowed() -> None:
    (d,) = plugin.sparsetorch_offers(_request("cuda"))
    assert isinstance(d, st.Decline) and "allow_transfer" in d.reason and "cuda" in d.reason


@pytest.mark.parametrize("op", ["solve", "matmul", "lstsq", "logdet"])
def test_allowed_transfer_offers_cost_the_copies(op) -> None:
    host = {(a.method, a.preconditioner): a for a in plugin.sparsetorch_offers(_request("cpu", op)) if isinstance(a, st.Offer)}
    req = _request("cuda", op, backend_options={"allow_transfer": True})
    moved = {(a.method, a.preconditioner): a for a in plugin.sparsetorch_offers(req) if isinstance(a, st.Offer)}
    assert moved and set(moved) == set(host)
    seconds, nbytes = transfer_seconds(req)
    # values 1920*8 + pattern (1920+401)*8 + B in and X out 2*400*8 bytes
    assert nbytes == 1920 * 8 + (1920 + 401) * 8 + 2 * 400 * 8
    for key, offer in moved.items():
        assert offer.seconds == pytest.approx(host[key].seconds + seconds)
        assert "copies" in offer.notes and offer.bytes == host[key].bytes + int(nbytes)
    slow = _request("cuda", op, backend_options={"allow_transfer": True, "link_bandwidth": 1e6})
    assert transfer_seconds(slow)[0] > 100 * seconds


def test_transfer_plan_wraps_the_host_plan() -> None:
    """On the CPU the copies are no-ops: the wrapper must answer exactly as the plan it wraps."""
    A = convection_diffusion(8)
    req = _request("cpu", n=64, nse=A.nse, backend_options={"allow_transfer": True})
    lu = next(a for a in plugin.sparsetorch_offers(req) if isinstance(a, st.Offer) and a.method == "lu")
    plan = TransferPlan(lu.build, A.detach(), req)
    plan.set_values(A.values)
    B = torch.randn(64, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for adjoint in (False, True):
        X, res = plan.solve(B, adjoint=adjoint)
        D = A.to_dense()
        torch.testing.assert_close(X, torch.linalg.solve(D.mT if adjoint else D, B), rtol=1e-10, atol=1e-12)
    assert (plan.backend, plan.method, plan.factorizations) == ("scipy", "lu", 1)
    assert not hasattr(plan, "inverse_entries")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("method", ["lu", "cg"])
def test_cuda_operands_solved_on_the_host(method) -> None:
    A = poisson2d(12).to(CUDA)
    B = torch.randn(144, 2, dtype=torch.float64, device=CUDA)
    req = st.Request("solve", (st.OperandInfo("sparse", tuple(A.shape), A.dtype, CUDA, A.format, A.nse),
                               st.OperandInfo("dense", tuple(B.shape), B.dtype, CUDA)),
                     frozenset({"spd", "symmetric"}), {"method": method, "rtol": 1e-10,
                                                       "backend_options": {"allow_transfer": True}})
    offer = next(a for a in plugin.sparsetorch_offers(req) if isinstance(a, st.Offer) and a.method == method)
    plan = offer.build(A.detach(), req)
    plan.set_values(A.values)
    X, res = plan.solve(B, options={"rtol": 1e-10, "atol": 0.0})
    assert X.device == B.device and res.converged
    D = A.to_dense()
    torch.testing.assert_close(X, torch.linalg.solve(D, B), rtol=1e-8, atol=1e-10)

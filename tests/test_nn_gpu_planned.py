"""SparseLinear's planned product on a CUDA device: the direct (no-gradient) call, the plan chosen
by timing the candidates, the int32 index copy of a CSR pattern, CUDA-graph capture, and what a
planned layer must still see (values changed in place, gradients). Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import sparsetorch as st

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

RULES = {"90 %": lambda: st.nn.magnitude(0.9), "2:4": lambda: st.nn.n_m(2, 4), "50 %": lambda: st.nn.magnitude(0.5)}


def _layer(rule: str, dtype=torch.float16, n_in: int = 256, n_out: int = 192, seed: int = 0):
    torch.manual_seed(seed)
    lin = nn.Linear(n_in, n_out).to("cuda", dtype)
    return st.nn.SparseLinear(RULES[rule]()("l", lin), lin.bias.detach())


def _ref(layer: st.nn.SparseLinear, x: torch.Tensor) -> torch.Tensor:
    return (x.float() @ layer.to_dense().detach().float().T + layer.bias.detach().float()).to(x.dtype)


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("batch", [1, 5, 64])
def test_no_grad_forward_matches_dense_and_records_its_plan(rule, dtype, batch):
    layer = _layer(rule, dtype)
    x = torch.randn(batch, 256, device="cuda", dtype=dtype)
    tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5}[dtype]
    with torch.no_grad():
        y = layer(x)
        y2 = layer(x)                            # the planned call
    torch.testing.assert_close(y, _ref(layer, x), rtol=tol, atol=tol)
    torch.testing.assert_close(y2, y, rtol=tol, atol=tol)  # some kernels sum in a varying order (atomics)
    plans = layer.plans()
    assert [p["batch"] for p in plans] == [batch]
    if rule != "2:4":                            # CSR: planned on an int32 copy of the index buffers
        assert plans[0]["index_dtype"] == "int32"
    if "candidates" in plans[0]:                 # chosen by timing: the fastest measured GPU time
        timed = {k: v["gpu_s"] for k, v in plans[0]["candidates"].items() if "gpu_s" in v}
        assert plans[0]["plan"] == min(timed, key=timed.get)


def test_cuda_kernels_plugin_runs_batch_one_when_installed():
    if "cuda" not in st.backend.get_backends().names:
        pytest.skip("the cuda kernels plugin is not installed")
    for rule in ("2:4", "90 %"):
        layer = _layer(rule, n_in=1024, n_out=1024)
        with torch.no_grad():
            layer(torch.randn(1, 1024, device="cuda", dtype=torch.float16))
        assert layer.plans()[0]["plan"] == "cuda/spmm", layer.plans()


@pytest.mark.parametrize("rule", ["2:4", "90 %"])
def test_direct_call_sees_values_changed_in_place_and_grad_calls_still_train(rule):
    layer = _layer(rule, torch.float32, seed=1)
    x = torch.randn(3, 256, device="cuda")
    with torch.no_grad():
        layer(x)
        layer.values.mul_(-2.0)
        torch.testing.assert_close(layer(x), _ref(layer, x), rtol=1e-5, atol=1e-5)
        layer.values.data.mul_(0.5)              # a write that torch's version counter does not see
        torch.testing.assert_close(layer(x), _ref(layer, x), rtol=1e-5, atol=1e-5)
    xx = x.clone().requires_grad_(True)
    layer(xx).square().sum().backward()
    Wd = layer.to_dense().detach().clone().requires_grad_(True)
    xd = x.clone().requires_grad_(True)
    (xd @ Wd.T + layer.bias.detach()).square().sum().backward()
    torch.testing.assert_close(xx.grad, xd.grad, rtol=1e-4, atol=1e-4)
    rows, cols = (c.long() for c in layer.weight.detach().entries()[0])
    slots = layer.weight.detach().entries()[1].long()
    torch.testing.assert_close(layer.values.grad[slots], Wd.grad[rows, cols], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rule", ["2:4", "90 %"])
def test_planned_layer_is_captured_by_a_cuda_graph(rule):
    layer = _layer(rule, seed=2)
    x = torch.randn(1, 256, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                layer(x)                          # plans (and tunes) before the capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = layer(x)
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, _ref(layer, x), rtol=2e-3, atol=2e-3)


def test_tuning_can_be_switched_off(monkeypatch):
    monkeypatch.setattr(st.nn.linear, "LAYER_TUNE_CUDA", False)
    layer = _layer("90 %")
    with torch.no_grad():
        layer(torch.randn(1, 256, device="cuda", dtype=torch.float16))
    assert "candidates" not in layer.plans()[0]

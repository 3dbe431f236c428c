"""reformat_model trains: a transformer block (q/k/v/o projections, attention, an MLP; built from
torch modules with random weights) pruned by magnitude (75 %) and by 2:4, trained with AdamW
under bfloat16 autocast on the CPU, against its masked-dense twin.

The twin is the same block with the same initial weights, each nn.Linear computing
``x @ (W * mask)^T + b`` with the mask the pruning rule gives (computed here independently with
topk: per layer for magnitude, per group of 4 inputs for 2:4), the same data, the same optimizer.
Both compute the same function up to bfloat16 rounding, so their loss curves must agree within
that noise: measured against the twin's own bfloat16-vs-float32 difference (the rounding noise
of this training), and in absolute terms. The pattern must not move during training.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sparsetorch as st
from sparsetorch.format import CSR, NM
from sparsetorch.nn import SparseLinear, SparseWeight, magnitude, n_m, reformat_model

pytestmark = pytest.mark.usefixtures("single_thread")

D_MODEL, HEADS, D_FF, SEQ, BATCH = 32, 4, 64, 8, 8
STEPS = 150


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention (q/k/v/o nn.Linear) and a GELU MLP."""

    def __init__(self, d: int = D_MODEL, heads: int = HEADS, d_ff: int = D_FF) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.up, self.down = nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        h = self.ln1(x)
        q, k, v = (p(h).view(B, T, self.heads, D // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, D))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class MaskedLinear(nn.Module):
    """The masked-dense twin of a pruned nn.Linear: the full weight, multiplied by a fixed mask."""

    def __init__(self, linear: nn.Linear, mask: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())
        self.register_buffer("mask", mask.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight * self.mask, self.bias)


def magnitude_mask(W: torch.Tensor, sparsity: float) -> torch.Tensor:
    keep = max(1, int(round((1 - sparsity) * W.numel())))
    mask = torch.zeros(W.numel(), dtype=torch.bool)
    mask[W.abs().flatten().topk(keep).indices] = True
    return mask.reshape(W.shape)


def two_four_mask(W: torch.Tensor) -> torch.Tensor:
    g = W.abs().reshape(W.shape[0], -1, 4)
    return torch.zeros_like(g, dtype=torch.bool).scatter_(-1, g.topk(2, -1).indices, True).reshape(W.shape)


def _data(steps: int, seed: int = 0):
    """Inputs and targets: a fixed random dense teacher block on random sequences."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed + 1)
    teacher = Block()
    xs = torch.randn(steps, BATCH, SEQ, D_MODEL, generator=gen)
    with torch.no_grad():
        ys = torch.stack([teacher(x) for x in xs])
    return xs, ys


def _train(model: nn.Module, xs, ys, *, autocast: bool) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    losses = []
    for x, y in zip(xs, ys):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = F.mse_loss(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _pattern(model: nn.Module) -> dict:
    return {name: [b.clone() for b in m.buffers() if b is not None] for name, m in model.named_modules()
            if isinstance(m, SparseLinear)}


RULES = {
    "magnitude75": (lambda: magnitude(0.75), lambda W: magnitude_mask(W, 0.75), CSR),
    "2:4": (lambda: n_m(2, 4), two_four_mask, NM(2, 4)),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_pruned_block_trains_like_its_masked_dense_twin(rule) -> None:
    make_rule, make_mask, fmt = RULES[rule]
    torch.manual_seed(123)
    dense = Block()
    xs, ys = _data(STEPS)
    masks = {name: make_mask(m.weight.detach()) for name, m in dense.named_modules() if isinstance(m, nn.Linear)}

    sparse = reformat_model(copy.deepcopy(dense), make_rule())
    twin = copy.deepcopy(dense)
    for name, m in list(twin.named_modules()):
        if isinstance(m, nn.Linear):
            setattr(twin, name, MaskedLinear(m, masks[name]))
    twin32 = copy.deepcopy(twin)

    # the pruning rule stored exactly the independently computed masks, in the rule's format
    for name, m in sparse.named_modules():
        if isinstance(m, SparseLinear):
            assert m.weight.format == fmt
            stored = m.weight.with_values(torch.ones_like(m.values)).to_dense() != 0
            assert torch.equal(stored, masks[name]), name
    assert abs(st.nn.density(sparse) - (0.25 if rule == "magnitude75" else 0.5)) < 0.01
    before = _pattern(sparse)

    l_sparse = _train(sparse, xs, ys, autocast=True)
    l_twin = _train(twin, xs, ys, autocast=True)
    l_twin32 = _train(twin32, xs, ys, autocast=False)

    # it trains: the loss falls a lot, the same way for all three
    for curve in (l_sparse, l_twin, l_twin32):
        assert all(math.isfinite(v) for v in curve)
        assert sum(curve[-10:]) / 10 < 0.5 * sum(curve[:10]) / 10
    mean = sum(l_twin) / len(l_twin)
    d_sparse = sum(abs(a - b) for a, b in zip(l_sparse, l_twin)) / len(l_twin) / mean
    d_noise = sum(abs(a - b) for a, b in zip(l_twin32, l_twin)) / len(l_twin) / mean
    worst = max(abs(a - b) / b for a, b in zip(l_sparse, l_twin))
    print(f"{rule}: loss {l_sparse[0]:.4f} -> {l_sparse[-1]:.4f} (twin {l_twin[-1]:.4f}, float32 twin "
          f"{l_twin32[-1]:.4f}); mean |sparse - twin| / loss = {d_sparse:.2e}, bf16 noise (twin vs float32 "
          f"twin) = {d_noise:.2e}, worst step {worst:.2e}")
    assert d_sparse <= max(3 * d_noise, 1e-3), (d_sparse, d_noise)
    assert worst < 0.1
    # the pattern never moved
    after = _pattern(sparse)
    for name in before:
        assert all(torch.equal(a, b) for a, b in zip(before[name], after[name])), name


def test_ust_spelling_func_and_default() -> None:
    """reformat_model(model, func=...) with UST's per-weight rule, and UST's default (all COO)."""
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(2, SEQ, D_MODEL)
    ref = block(x)

    def rule(weight: torch.Tensor):  # UST's documented shape of a rule: inspect, maybe convert
        if weight.shape[0] == D_FF:  # only the MLP's up projection
            return SparseWeight(st.SparseTensor.from_dense(weight))
        return None

    m1 = reformat_model(copy.deepcopy(block), func=rule)
    assert isinstance(m1.up, SparseLinear) and isinstance(m1.q, nn.Linear)
    torch.testing.assert_close(m1(x), ref, rtol=1e-5, atol=1e-5)
    m2 = reformat_model(copy.deepcopy(block))
    assert all(isinstance(getattr(m2, n), SparseLinear) and getattr(m2, n).weight.format.name == "COO"
               for n in ("q", "k", "v", "o", "up", "down"))
    torch.testing.assert_close(m2(x), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(st.InputError, match="not both"):
        reformat_model(block, magnitude(0.5), func=rule)


def test_sparse_linear_under_autocast_matches_nn_linear() -> None:
    torch.manual_seed(1)
    lin = nn.Linear(16, 12)
    mask = two_four_mask(lin.weight.detach())
    sl = SparseLinear.from_linear(lin, format=NM(2, 4), mask=mask)
    ref = nn.Linear(16, 12)
    with torch.no_grad():
        ref.weight.copy_(lin.weight * mask)
        ref.bias.copy_(lin.bias)
    x = torch.randn(5, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, r = sl(x), ref(x)
    assert y.dtype == r.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), r.float(), rtol=2e-2, atol=2e-2)
    y.float().sum().backward()
    r.float().sum().backward()
    coords, slot = sl.weight.entries()
    assert sl.values.grad.dtype == torch.float32  # the parameter keeps its dtype, as nn.Linear's
    torch.testing.assert_close(sl.values.grad[slot], ref.weight.grad[coords[0], coords[1]], rtol=2e-2, atol=2e-2)

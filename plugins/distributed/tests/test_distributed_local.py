"""Single-process parts: partitioners, the plugin's registration, errors without a process group."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
import sparsetorch_distributed as sd
from sparsetorch_distributed.problems import grid_coords, poisson2d_rows


def test_contiguous_offsets():
    assert sd.contiguous_offsets(10, 3) == [0, 3, 6, 10]


def test_rcb_balances_and_cuts_less_than_contiguous_strips():
    m = 16
    ids = torch.arange(m * m)
    owner = sd.rcb_parts(grid_coords(m, ids), 4)
    assert torch.bincount(owner, minlength=4).tolist() == [64, 64, 64, 64]
    r, c, _ = poisson2d_rows(m, ids)
    strips = torch.div(ids, 64, rounding_mode="floor")
    assert sd.edge_cut(r, c, owner) < sd.edge_cut(r, c, strips)


def test_spectral_bisection_balances_and_cuts_few_edges():
    m = 12
    ids = torch.arange(m * m)
    r, c, _ = poisson2d_rows(m, ids)
    owner = sd.spectral_parts(r, c, m * m, 4)
    counts = torch.bincount(owner, minlength=4)
    assert counts.min() == 36 and counts.max() == 36
    # (the 12x12 grid's Fiedler value is double, so the cut direction is arbitrary): no worse than
    # 1.2x the contiguous strips (3 interfaces x 12 x 2 = 72 entries), far below a random split
    strips = torch.div(ids, 36, rounding_mode="floor")
    assert sd.edge_cut(r, c, strips) == 72
    assert sd.edge_cut(r, c, owner) <= 1.2 * 72
    random = torch.randperm(m * m, generator=torch.Generator().manual_seed(0)) % 4
    assert sd.edge_cut(r, c, owner) < 0.5 * sd.edge_cut(r, c, random)


def test_graph_parts_rejects_unknown_method():
    with pytest.raises(st.InputError, match="unknown partition"):
        sd.graph_parts("zigzag", torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), 1, 1)


def test_plugin_registered_without_single_process_ops():
    info = next(b for b in st.registry() if getattr(b, "name", None) == "distributed") \
        if isinstance(st.registry(), list) else None
    from sparsetorch_distributed import plugin

    desc = plugin.sparsetorch_backend_info()
    assert desc.name == "distributed" and dict(desc.ops) == {}
    assert plugin.sparsetorch_offers(None) == []
    del info


def test_comm_without_process_group_names_the_fix():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    with pytest.raises(st.InputError, match="init_process_group|sparsetorch_distributed.init"):
        sd.Comm()

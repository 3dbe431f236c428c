"""The DELTA(b) "chunk" kernels (kernels/delta.cu, one right-hand side; tests/test_compile_host.py
compiles them with NVRTC on the host): on a GPU they match dense float64 references for every b, value type,
unit size, X in shared and in global memory, ragged sizes, empty rows, rows longer than a warp
step, gaps wider than b bits (the format's padding entries), a misaligned X, several right-hand
sides (the "packed" fallback), the plan's replayed launch and the bound ``Matmul.execute``; the
DELTA(4) "tile" kernels (half types) likewise, and their layout (plan-built, checked on the CPU); the
DELTA(4) "tc" kernels (half types, products on the tensor cores; the default there) likewise, also
under CUDA-graph capture; session 11's "tc8p" (PDL) and "tq" kernels (a cp.async ring) likewise, also with
many rows per warp (the ring's stream of steps across rows) and replayed back to back in a CUDA graph."""

from __future__ import annotations

import pytest
import torch

import sparsetorch as st
from sparsetorch.format import DELTA

from sparsetorch_cuda._delta import TQ_VARIANTS, delta_half_default

from _cuda_helpers import TOL, gpu, random_dense, rel_err, to_format, make_plan as _plan, random_x as _x

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
BITS = (1, 2, 4, 8, 16)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("variant", ("chunk8", "chunk16", "chunk8_pf", "chunk16_pf", "chunk8_o3"))
def test_chunk_matches_dense(variant, bits, dtype):
    # ragged sizes; empty rows; dense rows of 1501 entries (several warp steps of 32 units);
    # a sparse part whose gaps overflow b bits (explicit padding entries); X in shared memory
    from sparsetorch_cuda.plan import CudaSpmmPlan

    D = random_dense(203, 1501, 0.05, dtype, seed=bits, long_rows=4, empty_rows=9)
    D[:, 700:720] = 0  # a run of empty columns: padding gaps for every b < 5
    for idx in (torch.int32, torch.int64):
        A = to_format(D, DELTA(bits), dtype, idx)
        plan = _plan(A, variant)
        assert isinstance(plan, CudaSpmmPlan) and plan.kind == "delta" and plan.variant == variant
        for k in (1, 2):  # k = 2: the "packed" fallback
            X = _x(1501, k, dtype, 3 + k).cuda()
            err = rel_err(plan.apply(X), D @ X.double().cpu())
            assert err < TOL[dtype], (idx, k, err)
        X = _x(1501, 1, dtype, 9).cuda()
        assert rel_err(plan.apply(X), D @ X.double().cpu()) < TOL[dtype]  # the replayed launch


@gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.float64), ids=("float16", "float64"))
@pytest.mark.parametrize("bits", (4, 16))
@pytest.mark.parametrize("variant", ("chunk", "chunk_pf"))
def test_chunk_x_in_global_memory(variant, bits, dtype):
    # n = 13000: (n + 32) * sizeof(acc) > 48 KB, so X is read from global memory (columns clamped)
    D = random_dense(40, 13000, 0.2, dtype, seed=11, empty_rows=2)
    A = to_format(D, DELTA(bits), dtype, torch.int32)
    plan = _plan(A, variant)
    assert plan.variant == variant
    X = _x(13000, 1, dtype, 12).cuda()
    assert rel_err(plan.apply(X), D @ X.double().cpu()) < TOL[dtype]


@gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("float16", "bfloat16"))
@pytest.mark.parametrize("variant", (None, "chunk16", "chunk8_o3"))
def test_chunk_low_sparsity_rows_and_misaligned_x(variant, dtype):
    # 50 % and 10 % dense rows (the benchmark's shape, smaller), rows starting at every offset of a
    # unit; an X at an odd address (the fill's scalar path) and a 1-D X through st.matmul
    for dens in (0.5, 0.1):
        D = random_dense(97, 2048 + 5, dens, dtype, seed=int(dens * 10), empty_rows=3)
        A = to_format(D, DELTA(4), dtype, torch.int32)
        plan = _plan(A, variant)
        assert plan.variant == (variant or delta_half_default(A.nse, *A.shape))
        buf = _x(2054, 1, dtype, 21).cuda()
        X = buf[1:]  # 2 bytes past a 16-byte boundary
        assert X.data_ptr() % 16 != 0
        assert rel_err(plan.apply(X), D @ X.double().cpu()) < TOL[dtype]
        b = X[:, 0].contiguous()
        assert rel_err(st.matmul(A, b, backend="cuda"), D @ b.double().cpu()) < TOL[dtype]


@gpu
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=("float32", "float64"))
def test_chunk_bound_execute(dtype):
    # Matmul.execute's bound launch (one launch recorded from _launch_delta; plan.bind takes float32 /
    # float64 only), values written in place, replayed in a CUDA graph
    m, n = 300, 2500
    D = random_dense(m, n, 0.3, dtype, seed=51, empty_rows=4, long_rows=2)
    A = to_format(D, DELTA(4), dtype, torch.int32)
    b = _x(n, 1, dtype, 52)[:, 0].cuda()
    mm = st.Matmul(A, b, backend="cuda")
    mm.plan()
    y0 = mm.execute()
    assert mm._direct is not None
    assert rel_err(y0, D @ b.double().cpu()) < TOL[dtype]
    with torch.no_grad():
        A.values.mul_(-0.5)
    assert rel_err(mm.execute(), -0.5 * D @ b.double().cpu()) < TOL[dtype]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        yg = mm.execute()
    b.mul_(2)
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(yg, -D @ b.double().cpu() * 0.5) < TOL[dtype]


@gpu
def test_chunk_single_row_and_tiny():
    # m = 1 (one warp, grid of one block), a 1 x 1 matrix, an all-zero matrix, rows shorter than a unit
    for m, n, dens in ((1, 5000, 0.5), (1, 1, 1.0), (5, 7, 0.0), (64, 9, 0.6)):
        D = random_dense(m, n, dens, torch.float32, seed=m + n)
        A = to_format(D, DELTA(4), torch.float32, torch.int32)
        plan = _plan(A)
        X = _x(n, 1, torch.float32, 3).cuda()
        assert rel_err(plan.apply(X), D @ X.double().cpu()) < TOL[torch.float32] or not D.any()
        if not D.any():
            assert torch.count_nonzero(plan.apply(X)) == 0


@gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.float32, torch.float64), ids=("float16", "float32", "float64"))
@pytest.mark.parametrize("bits", (4, 8))
@pytest.mark.parametrize("n", (2053, 13000), ids=("x_in_shared", "x_in_global"))
@pytest.mark.parametrize("variant", ("chunk8", "chunk16", "tile", "tile_f", "tc8", "tc16", "tc8p", "tc8pk", "tq3", "tq4p3"))
def test_chunk_inf_and_nan_in_x_stay_out_of_rows_without_them(variant, n, bits, dtype):
    # A unit holds entries of neighbouring rows (a row's first and last unit): those entries read X
    # at columns that are not theirs. With inf / NaN in X at columns no row stores (every third
    # column, and column 0, where X in global memory clamps), every row must stay finite and equal
    # to the product over its own entries; a row that does store such a column must not. DELTA(b)
    # stores explicit zeros where a gap exceeds 2^b - 1: those are the row's own entries (0 * inf
    # is NaN there, as in SciPy for a stored zero), so the rows are taken from the stored pattern.
    D = random_dense(150, n, 0.8, dtype, seed=61 + bits, empty_rows=3, long_rows=2)
    bad = torch.zeros(n, dtype=torch.bool)
    bad[::3] = True
    bad[0] = True
    D[:, bad] = 0
    touched = 7
    D[touched, 3] = 1.0  # one row stores an entry at a bad column
    A = to_format(D, DELTA(bits), dtype, torch.int32)
    # the stored pattern, explicit zeros included: column = running sum of (gap + 1) - 1 in the row
    pos, gaps = A.pos(1).cpu().long(), A.crd(1).cpu().long()
    rows = torch.repeat_interleave(torch.arange(150), pos[1:] - pos[:-1])
    first = torch.cumsum(gaps + 1, 0) - 1
    cols_stored = first - torch.where(pos[:-1] > 0, torch.cat([first.new_zeros(1), first])[pos[:-1]] + 1, 0)[rows]
    hits = torch.zeros(150, dtype=torch.bool)
    hits[rows[bad[cols_stored]]] = True
    assert hits[touched] and int((~hits).sum()) >= 120, int(hits.sum())
    plan = _plan(A, variant)
    assert plan.variant == variant
    X = _x(n, 1, dtype, 62)
    X[bad] = float("inf")
    X[bad.nonzero()[1::2, 0]] = float("nan")
    keep = ~hits
    for cols in (1, 2):  # 2: the "packed" kernel (fast.cu), which had the same edge
        Xk = X.repeat(1, cols)
        Y = plan.apply(Xk.cuda()).double().cpu()
        ref = D @ torch.where(bad[:, None], torch.zeros_like(Xk), Xk).double()
        assert not torch.isfinite(Y[hits]).all(dim=1).any()
        assert rel_err(Y[keep], ref[keep]) < TOL[dtype], cols


def _delta4_words(A):
    """A CPU DELTA(4) tensor's row pointers, gaps and its gaps bit-packed as the plan packs them (entry e's gap:
    bits 4 (e % 8) of word e // 8; uint32 bits in int32), built independently of the plan."""
    rowptr, gaps = A.pos(1).long(), A.crd(1).long()
    nnz = gaps.numel()
    nw = -(-nnz // 8)
    padded = torch.zeros(nw * 8, dtype=torch.int64)
    padded[:nnz] = gaps
    words = (padded.reshape(nw, 8) << (torch.arange(8) * 4)).sum(1)
    return rowptr, gaps, torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def test_unit_bases_are_the_columns_before_each_unit():
    # CPU: unit u's base is the column of entry 8 u - 1 in entry 8 u's row (its dense column, from the dense
    # matrix's nonzero pattern and the format's padding entries), -1 where entry 8 u starts its row; rows shorter
    # than a unit, empty rows, a partial last unit
    from sparsetorch_cuda._delta import unit_bases

    for m, n, dens in ((60, 3000, 0.5), (33, 900, 0.03), (70, 40, 0.3), (4, 5, 0.0)):
        D = random_dense(m, n, dens, torch.float32, seed=m + 1, empty_rows=3 if m > 4 else 0, long_rows=2 if m > 4 else 0)
        A = to_format(D, DELTA(4), torch.float32, torch.int32, device="cpu")
        rowptr, gaps, words = _delta4_words(A)
        nnz, nw = gaps.numel(), -(-gaps.numel() // 8)
        ub = unit_bases(rowptr.int(), words, nnz, m)
        assert ub.dtype == torch.int16 and ub.numel() == nw + 1
        cols, row_of = [], []  # every stored entry's column and row, walked from the gaps
        for r in range(m):
            c = -1
            for e in range(int(rowptr[r]), int(rowptr[r + 1])):
                c += int(gaps[e]) + 1
                cols.append(c)
                row_of.append(r)
        for u in range(nw):
            e0 = 8 * u
            want = cols[e0 - 1] if e0 > 0 and row_of[e0 - 1] == row_of[e0] else -1
            assert int(ub[u]) == want, (m, u)
        if nnz:  # the walked columns are the dense matrix's stored ones (with the padding entries' zeros)
            assert bool((D[torch.tensor(row_of), torch.tensor(cols)] != 0).sum() == int((D != 0).sum()))


def test_tile_layout_decodes_to_the_pattern():
    # CPU: every entry's gap sits in word 32 t + L of its tile t at its step j's nibble; tiles of a row
    # contiguous, toff / tileptr consistent, rows split over warps in order (empty rows, long rows,
    # partial tiles, more warps than rows)
    from sparsetorch_cuda._delta import TILE, tile_layout

    for m, n, dens, warps in ((60, 3000, 0.5, 7), (33, 900, 0.1, 64), (4, 5, 0.0, 3)):
        D = random_dense(m, n, dens, torch.float32, seed=m, empty_rows=3 if m > 4 else 0, long_rows=2 if m > 4 else 0)
        A = to_format(D, DELTA(4), torch.float32, torch.int32, device="cpu")
        rowptr, gaps, words = _delta4_words(A)
        nnz = gaps.numel()
        T = tile_layout(rowptr.int(), words, nnz, m, warps)
        tileptr, toff, tw, wrow = (T[k].long() for k in ("tileptr", "toff", "words", "wrow"))
        tw = tw & 0xFFFFFFFF
        assert int(tileptr[0]) == 0 and int(tileptr[-1]) == T["tiles"] and int(toff[-1]) == nnz
        assert wrow.numel() == warps + 1 and int(wrow[0]) == 0 and int(wrow[-1]) == m and bool((wrow[1:] >= wrow[:-1]).all())
        seen = torch.zeros(nnz, dtype=torch.bool)
        for r in range(m):
            t0, t1 = int(tileptr[r]), int(tileptr[r + 1])
            assert t1 - t0 == -(-int(rowptr[r + 1] - rowptr[r]) // TILE)
            for t in range(t0, t1):
                assert int(toff[t]) == int(rowptr[r]) + TILE * (t - t0) and int(toff[t + 1]) - int(toff[t]) <= TILE
                e = torch.arange(int(toff[t]), int(toff[t + 1]))
                q = e - int(toff[t])
                j, lane = q // 32, q % 32
                shift = torch.where(j < 4, 8 * j, 8 * (j - 4) + 4)
                assert torch.equal((tw[32 * t + lane] >> shift) & 15, gaps[e])
                seen[e] = True
                full = torch.zeros(32, dtype=torch.int64).index_add_(0, lane, 15 << shift)  # nibbles past the end: zero
                assert bool(((tw[32 * t: 32 * t + 32] & ~full) == 0).all())
        assert bool(seen.all())


@gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("float16", "bfloat16"))
@pytest.mark.parametrize("variant", ("tile", "tile_f", "tile_p1"))
def test_tile_matches_dense(variant, dtype):
    # rows of 0 .. several tiles (long rows: 1501 entries; 50 % / 10 % rows; partial tiles), empty
    # rows first and last, more warps than rows, gaps over 15 (padding entries), int32 / int64 row
    # pointers, an X at an odd address, k = 2 (the "packed" fallback), the replayed launch
    for m, n, dens in ((203, 1501, 0.05), (97, 2053, 0.5), (61, 4099, 0.1), (3, 300, 0.9), (1, 9, 1.0)):
        D = random_dense(m, n, dens, dtype, seed=m + n, long_rows=4 if m > 50 else 0, empty_rows=9 if m > 50 else 0)
        if m > 50:
            D[0] = 0
            D[-1] = 0
            D[:, n // 3: n // 3 + 20] = 0  # a run of empty columns: padding entries
        for idx in (torch.int32, torch.int64):
            A = to_format(D, DELTA(4), dtype, idx)
            plan = _plan(A, variant)
            assert plan.variant == variant and plan.tiles is not None
            for k in (1, 2):
                X = _x(n, k, dtype, 3 + k).cuda()
                assert rel_err(plan.apply(X), D @ X.double().cpu()) < TOL[dtype], (m, idx, k)
            buf = _x(n + 1, 1, dtype, 9).cuda()
            X = buf[1:]
            assert X.data_ptr() % 16 != 0
            for _ in range(2):  # the first call records the launch, the second replays it
                assert rel_err(plan.apply(X), D @ X.double().cpu()) < TOL[dtype], (m, idx)


@gpu
def test_tile_falls_back_where_it_does_not_apply():
    # float32 / DELTA(8) / X over 48 KB: the plan keeps the variant name and runs the chunk kernel
    for dtype, bits, n in ((torch.float32, 4, 900), (torch.float16, 8, 900), (torch.float16, 4, 30000)):
        D = random_dense(20, n, 0.3, dtype, seed=n + bits)
        A = to_format(D, DELTA(bits), dtype, torch.int32)
        plan = _plan(A, "tile")
        assert plan.variant == "tile" and plan.tiles is None
        X = _x(n, 1, dtype, 5).cuda()
        assert rel_err(plan.apply(X), D @ X.double().cpu()) < TOL[dtype]


@gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("float16", "bfloat16"))
@pytest.mark.parametrize("variant", (None, "tc", "tc8", "tc16") + TQ_VARIANTS)
def test_tc_matches_dense(variant, dtype):
    # rows of 0 .. many warp steps (long rows of 1501 / 4099 entries; 50 % / 10 % rows; rows shorter than
    # a unit and inside one unit), empty rows first and last, entries in the last columns, gaps over 15
    # (padding entries), int32 / int64 row pointers, an X at an odd address (the copy's scalar path),
    # odd n, k = 2 (the "packed" fallback), the replayed launch
    for m, n, dens in ((203, 1501, 0.05), (97, 2053, 0.5), (61, 4099, 0.1), (300, 37, 0.2), (3, 300, 0.9), (1, 9, 1.0)):
        D = random_dense(m, n, dens, dtype, seed=m + n, long_rows=4 if m > 50 else 0, empty_rows=9 if m > 50 else 0)
        if m > 50:
            D[0] = 0
            D[-1] = 0
            D[:, n // 3: n // 3 + 20] = 0  # a run of empty columns: padding entries
            D[5, -3:] = 1.0  # entries in the last columns
        for idx in (torch.int32, torch.int64):
            A = to_format(D, DELTA(4), dtype, idx)
            plan = _plan(A, variant)
            assert plan.variant == (variant or delta_half_default(A.nse, m, n)) and plan._tc_ok()
            for k in (1, 2):
                X = _x(n, k, dtype, 3 + k).cuda()
                assert rel_err(plan.apply(X), D @ X.double().cpu()) < TOL[dtype], (m, idx, k)
            buf = _x(n + 1, 1, dtype, 9).cuda()
            X = buf[1:]
            assert X.data_ptr() % 16 != 0
            for _ in range(2):  # the first call records the launch, the second replays it
                assert rel_err(plan.apply(X), D @ X.double().cpu()) < TOL[dtype], (m, idx)


@gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("float16", "bfloat16"))
def test_tc_every_row_offset_and_cuda_graph(dtype):
    # rows of 0 .. 70 entries one after the other, so rows start and end at every offset of a unit of 8
    # and 16 and rows share units with up to several neighbours; inf in X at columns no row stores;
    # the product captured in a CUDA graph, X and the values changed in place, replayed
    m, n = 71, 600
    g = torch.Generator().manual_seed(5)
    D = torch.zeros(m, n, dtype=torch.float64)
    for r in range(m):
        cols = torch.randperm(n // 2, generator=g)[:r] * 2  # even columns only
        D[r, cols] = torch.randint(1, 9, (r,), generator=g).double() * torch.where(torch.rand(r, generator=g) < 0.5, -1.0, 1.0) / 4
    for variant in ("tc8", "tc16") + TQ_VARIANTS:
        A = to_format(D, DELTA(4), dtype, torch.int32)
        plan = _plan(A, variant)
        X = _x(n, 1, dtype, 7)
        X[1::2] = float("inf")  # odd columns: no row stores them (the padding entries of DELTA(4) are explicit zeros)
        pos, gaps = A.pos(1).cpu().long(), A.crd(1).cpu().long()
        rows = torch.repeat_interleave(torch.arange(m), pos[1:] - pos[:-1])
        first = torch.cumsum(gaps + 1, 0) - 1
        cols_stored = first - torch.where(pos[:-1] > 0, torch.cat([first.new_zeros(1), first])[pos[:-1]] + 1, 0)[rows]
        hits = torch.zeros(m, dtype=torch.bool)
        hits[rows[cols_stored % 2 == 1]] = True  # rows with a padding entry at an odd column: NaN there
        Xc = X.cuda()
        ref = D @ torch.where(torch.isinf(X), torch.zeros_like(X), X).double()
        Y = plan.apply(Xc).double().cpu()
        assert rel_err(Y[~hits], ref[~hits]) < TOL[dtype], variant
        assert not torch.isfinite(Y[hits]).any()
        Xf = _x(n, 1, dtype, 8).cuda()
        plan.apply(Xf)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            Yg = plan.apply(Xf)
        Xf.mul_(-2)
        assert plan._values.data_ptr() == A.values.data_ptr()  # the plan reads the values where they lie
        A.values.mul_(0.5)
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(Yg, D @ Xf.double().cpu() * 0.5) < TOL[dtype], variant


@gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("float16", "bfloat16"))
@pytest.mark.parametrize("variant", TQ_VARIANTS)
def test_tq_many_rows_per_warp(variant, dtype):
    # more rows than the persistent grid has warps (2 or 3 blocks of 16 warps per SM): each warp's steps run
    # across several rows, the ring's producer ahead of the consumer by rows; rows without entries (aligned
    # and not), rows shorter than a unit sharing units with their neighbours, long rows, padding entries
    # (a run of empty columns), odd n, nnz not a multiple of 8 (a partial last unit); the product replayed
    # three times back to back in one CUDA graph (the "p" kernels' programmatic dependent launches), X
    # changed in place between replays
    from sparsetorch_cuda.layout import _sm_count

    m = 40 * 16 * _sm_count(0) // 3 + 7
    for n, dens in ((333, 0.02), (701, 0.3)):
        D = random_dense(m, n, dens, dtype, seed=n, empty_rows=m // 5, long_rows=9)
        D[:, n // 2: n // 2 + 40] = 0
        D[-1] = 0
        D[-2, -5:] = 1.0
        A = to_format(D, DELTA(4), dtype, torch.int32)
        if A.values.numel() % 8 == 0:  # a partial last unit
            D[-2, 0] = 2.0
            A = to_format(D, DELTA(4), dtype, torch.int32)
        assert A.values.numel() % 8 != 0
        plan = _plan(A, variant)
        assert plan.variant == variant and plan._tc_ok()
        X = _x(n, 1, dtype, 31).cuda()
        for _ in range(2):  # the recording launch, then the prepared one
            assert rel_err(plan.apply(X), D @ X.double().cpu()) < TOL[dtype], (variant, n)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            Y1 = plan.apply(X)
            Y2 = plan.apply(Y1[:n] if m >= n else X)
            Y3 = plan.apply(X)
        X.mul_(-1.5)
        graph.replay()
        torch.cuda.synchronize()
        ref1 = D @ X.double().cpu()
        assert rel_err(Y1, ref1) < TOL[dtype] and rel_err(Y3, ref1) < TOL[dtype], (variant, n)
        assert rel_err(Y2, D @ Y1[:n].double().cpu()) < 2 * TOL[dtype], (variant, n)  # reads the product before it


@gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("float16", "bfloat16"))
@pytest.mark.parametrize("variant", ("tc8pkb", "tc8pkbr", "tc8pkbfr"))
def test_tc_rows_past_the_32nd_of_a_warp(variant, dtype):
    # more than 32 rows per warp of the persistent grid (one block of 32 warps per SM): the "r" variants take a
    # warp's first 32 rows' pointers by shuffles of one read and the rows after them by loads; empty rows, dense
    # rows, padding entries, both int32 and int64 indices
    from sparsetorch_cuda.layout import _sm_count

    m, n = 32 * 33 * _sm_count(0) + 77, 80
    D = random_dense(m, n, 0.05, dtype, seed=11, empty_rows=m // 7, long_rows=3)
    D[-1, -3:] = 1.0
    for idx in (torch.int32, torch.int64):
        A = to_format(D, DELTA(4), dtype, idx)
        plan = _plan(A, variant)
        assert plan.variant == variant and plan._tc_ok()
        X = _x(n, 1, dtype, 3).cuda()
        for _ in range(2):  # the recording launch, then the prepared one
            assert rel_err(plan.apply(X), D @ X.double().cpu()) < TOL[dtype], (variant, idx)


@gpu
def test_tc_falls_back_where_it_does_not_apply():
    # float32 / DELTA(8) / X over 48 KB as 16-bit values: the default is "chunk", an explicit "tc" runs the chunk kernel
    for dtype, bits, n in ((torch.float32, 4, 900), (torch.float16, 8, 900), (torch.bfloat16, 4, 30000)):
        D = random_dense(20, n, 0.3, dtype, seed=n + bits)
        A = to_format(D, DELTA(bits), dtype, torch.int32)
        assert _plan(A).variant == "chunk"
        plan = _plan(A, "tc")
        assert plan.variant == "tc" and not plan._tc_ok()
        X = _x(n, 1, dtype, 5).cuda()
        assert rel_err(plan.apply(X), D @ X.double().cpu()) < TOL[dtype]

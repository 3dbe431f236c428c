"""Kernels generated from the format DSL (sparsetorch_cuda.codegen).

CPU (CI): the generator analyses and emits source for every named format and for random valid
formats, and NVRTC compiles a sample of them on the host (no driver). GPU (skips without one):
every named format and random formats against a dense float64 reference, in float32 / float64 /
float16 with int32 and int64 indices, each variant; each semiring against a NumPy reference over
the stored entries; prolog / epilog; autotune; the module cache; the plan's ``kernel="generated"``
path.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import sparsetorch as st
from sparsetorch import FormatError
from sparsetorch.format import Dimension, LevelFormat, LevelProperty, TensorFormat
from sparsetorch.format.named import named_formats

from sparsetorch_cuda import codegen
from sparsetorch_cuda import compile as c

from _cuda_helpers import TOL, gpu, rel_err

NVRTC_MISSING = c.nvrtc_missing()
needs_nvrtc = pytest.mark.skipif(NVRTC_MISSING is not None, reason=NVRTC_MISSING or "")

NAMED = named_formats()
_i, _j = Dimension("i"), Dimension("j")
_EXPRS = [_i, _j, _i // 2, _i % 2, _j // 2, _j % 2, _i // 3, _i % 3, _j // 3, _j % 3, _j - _i, _i - _j, _i + _j]
_TYPES = [LevelFormat.DENSE, LevelFormat.COMPRESSED, (LevelFormat.COMPRESSED, LevelProperty.NONUNIQUE),
          (LevelFormat.COMPRESSED, LevelProperty.UNORDERED), LevelFormat.LOOSE_COMPRESSED, LevelFormat.SINGLETON,
          LevelFormat.RANGE, (LevelFormat.DELTA, 1), (LevelFormat.DELTA, 3), (LevelFormat.STRUCTURED, 1),
          (LevelFormat.STRUCTURED, 2)]


def random_formats(count: int, seed: int = 0) -> list[TensorFormat]:
    """``count`` distinct valid 2-D formats (rejection sampling over level expressions and types),
    none equal to a named one."""
    rng = random.Random(seed)
    named = set(NAMED.values())
    out: list[TensorFormat] = []
    seen: set[TensorFormat] = set()
    tries = 0
    while len(out) < count and tries < 200000:
        tries += 1
        nlev = rng.choice((2, 2, 3, 3, 4))
        exprs = rng.sample(_EXPRS, nlev)
        levels = [(e, rng.choice(_TYPES)) for e in exprs]
        try:
            f = TensorFormat([_i, _j], levels)
        except FormatError:
            continue
        if f in named or f in seen:
            continue
        seen.add(f)
        out.append(f)
    assert len(out) == count, f"only {len(out)} valid random formats in {tries} tries"
    return out


RANDOM = random_formats(40)
_D, _C, _L, _S, _R = (LevelFormat.DENSE, LevelFormat.COMPRESSED, LevelFormat.LOOSE_COMPRESSED, LevelFormat.SINGLETON,
                      LevelFormat.RANGE)
#: hand-picked compositions the random ones rarely reach: mixed blocks, N:M along columns, blocks of
#: DCSR, COO of blocks, ELL on columns, DIA with loose diagonals, DELTA on columns
EXTRA = [
    TensorFormat([_i, _j], {_i // 2: _D, _j: _C, _i % 2: _D}),
    TensorFormat([_i, _j], {_j // 2: _D, _i: _C, _j % 2: _D}),
    TensorFormat([_i, _j], {_i // 2: _C, _j // 3: _C, _i % 2: _D, _j % 3: _D}),
    TensorFormat([_i, _j], {_i // 2: _D, _j // 3: _C, _j % 3: _D, _i % 2: _D}),
    TensorFormat([_i, _j], {_j: _D, _i // 4: _D, _i % 4: (LevelFormat.STRUCTURED, 2)}),
    TensorFormat([_i, _j], {_i // 2: (_C, LevelProperty.NONUNIQUE), _j // 2: _S, _i % 2: _D, _j % 2: _D}),
    TensorFormat([_i, _j], {_j: _D, _i: _L}),
    TensorFormat([_i, _j], {_j - _i: _L, _i: _R}),
    TensorFormat([_i, _j], {_i + _j: _C, _j: _R}),
    TensorFormat([_i, _j], {_j: _D, _i: (LevelFormat.DELTA, 2)}),
    TensorFormat([_i, _j], {_i: _C, _j: (LevelFormat.DELTA, 1)}),
]


def test_random_formats_cover_every_strategy_and_level():
    strategies = {codegen.analyse(f).strategy for f in RANDOM}
    assert strategies == {"rows", "cols", "scatter"}
    kinds = {lv.format for f in RANDOM for lv in f.levels}
    assert kinds >= {LevelFormat.DENSE, LevelFormat.COMPRESSED, LevelFormat.SINGLETON, LevelFormat.RANGE,
                     LevelFormat.DELTA, LevelFormat.LOOSE_COMPRESSED}


EXPECTED_STRATEGY = {"CSR": "rows", "CSC": "cols", "COO": "scatter", "DCSR": "scatter", "DCSC": "scatter", "DIA": "rows",
                     "DIA_J": "rows", "ELL": "rows", "DENSE": "rows", "DENSE_COL": "rows", "BSR(2,3)": "rows",
                     "BSC(3,2)": "cols", "DELTA(2)": "rows", "DELTA(4)": "rows", "NM(2,4)": "rows"}


@pytest.mark.parametrize("name", list(NAMED))
def test_every_named_format_emits_source(name):
    fmt = NAMED[name]
    an = codegen.analyse(fmt)
    assert an.strategy == EXPECTED_STRATEGY[name]
    assert an.exclusive == (name == "DCSR")
    src = codegen.emit(fmt)
    for v in codegen.variants(an):
        assert f"void {codegen._kernel_name(an, v)}(" in src
    assert ("atomic_combine(acc + " in src) == an.atomics


@pytest.mark.parametrize("k", range(len(RANDOM) + len(EXTRA)))
def test_random_formats_emit_source(k):
    fmt = [*RANDOM, *EXTRA][k]
    src = codegen.emit(fmt, semiring="min_plus", prolog="x * 2", epilog="x + 1")
    an = codegen.analyse(fmt)
    assert f"void gen_{an.strategy}(" in src and "gen_finalize" in src


def test_formats_with_batch_levels_or_three_dims_are_refused():
    from sparsetorch.format.named import BATCHED_CSR, COO_ND

    for f in (BATCHED_CSR, COO_ND(3)):
        with pytest.raises(st.InputError, match="2 dimensions"):
            codegen.analyse(f)


def test_semiring_specs():
    assert codegen.as_semiring(None).name == "plus_times"
    assert codegen.as_semiring("min-plus").name == "min_plus"
    user = codegen.as_semiring({"add": "a > b ? a : b", "mul": "a + b", "identity": "-ACC_INF"})
    assert "acc_t add(acc_t a, acc_t b)" in user.add and user.atomic == "cas"
    with pytest.raises(st.InputError, match="unknown semiring"):
        codegen.as_semiring("plus_plus")
    with pytest.raises(st.InputError, match="identity"):
        codegen.as_semiring({"add": "a + b", "mul": "a * b"})


SAMPLE = ["CSR", "CSC", "COO", "DCSR", "DIA_J", "BSC(3,2)", "DELTA(2)", "NM(2,4)"]


@needs_nvrtc
@pytest.mark.parametrize("value", list(c.VAL_KINDS))
@pytest.mark.parametrize("name", SAMPLE)
def test_named_sample_compiles_on_the_host(name, value):
    for sr in ("plus_times", "min_plus"):
        text = codegen.full_source(codegen.emit(NAMED[name], semiring=sr, prolog="x * x", epilog="x > 0 ? x : 0"))
        cub = codegen.compile_source(text, value, "int64" if name == "COO" else "int32", "sm_90")
        assert cub[:4] == b"\x7fELF"
        an = codegen.analyse(NAMED[name])
        for v in codegen.variants(an):
            assert codegen._kernel_name(an, v).encode() + b"\x00" in cub


@needs_nvrtc
@pytest.mark.parametrize("k", [0, 7, 13, 21, 34])
def test_random_sample_compiles_on_the_host(k):
    text = codegen.full_source(codegen.emit(RANDOM[k], semiring="or_and"))
    assert codegen.compile_source(text, "float32", "int64", "sm_80")[:4] == b"\x7fELF"


@needs_nvrtc
def test_user_functions_compile_and_a_broken_one_reports_the_log():
    text = codegen.full_source(codegen.emit(NAMED["CSC"], semiring={"add": "a + b", "mul": "a * b", "identity": "0"},
                                            epilog="__device__ acc_t epilog(acc_t y) { return y * (acc_t)2; }"))
    assert codegen.compile_source(text, "float64", "int32", "sm_90")[:4] == b"\x7fELF"
    bad = codegen.full_source(codegen.emit(NAMED["CSR"], prolog="no_such_function(x)"))
    with pytest.raises(c.CompileError, match="no_such_function"):
        codegen.compile_source(bad, "float32", "int32", "sm_90")


@needs_nvrtc
def test_generated_modules_go_through_the_compile_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSETORCH_CUDA_CACHE", str(tmp_path))
    c.clear_memory()
    text = codegen.full_source(codegen.emit(NAMED["DCSC"]))
    before = dict(c.STATS)
    first = codegen.cubin(text, "float32", "int32", "sm_90")
    assert c.STATS["compiled"] == before["compiled"] + 1
    assert (tmp_path / codegen.module_key(text, "float32", "int32", "sm_90").filename).read_bytes() == first
    assert codegen.cubin(text, "float32", "int32", "sm_90") is first
    c.clear_memory()
    assert codegen.cubin(text, "float32", "int32", "sm_90") == first
    assert c.STATS["disk"] == before["disk"] + 1 and c.STATS["compiled"] == before["compiled"] + 1
    other = codegen.full_source(codegen.emit(NAMED["DCSC"], semiring="min_plus"))
    assert codegen.module_key(other, "float32", "int32", "sm_90") != codegen.module_key(text, "float32", "int32", "sm_90")


def test_cpu_tensor_is_refused():
    A = st.SparseTensor.from_dense(torch.eye(4))
    with pytest.raises(st.InputError, match="CUDA"):
        codegen.GeneratedSpmm(A)


# Test matrices ----------------------------------------------------------------------------------

def matrix_for(fmt: TensorFormat, m: int, n: int, dtype: torch.dtype, index_dtype: torch.dtype, seed: int = 0,
               density: float = 0.3, device: str = "cpu") -> tuple[st.SparseTensor, torch.Tensor]:
    """A random (m, n) matrix in ``fmt`` and its dense float64 values (the rounded ones). Formats
    with a STRUCTURED level get a matrix with at most one entry per row and column when the
    random one breaks the N:M rule."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(m, n, generator=g) < density
    vals = (torch.rand(m, n, generator=g, dtype=torch.float64) + 0.5) * torch.where(torch.rand(m, n, generator=g) < 0.5, -1.0, 1.0)
    D = (vals * mask).to(dtype).to(torch.float64)
    try:
        A = st.SparseTensor.from_dense(D.to(dtype), fmt, index_dtype=index_dtype, max_fill=1e9)
    except FormatError:
        perm = torch.randperm(n, generator=g)[: min(m, n)]
        D = torch.zeros(m, n, dtype=torch.float64)
        D[torch.arange(min(m, n)), perm] = vals[torch.arange(min(m, n)), perm]
        D = D.to(dtype).to(torch.float64)
        A = st.SparseTensor.from_dense(D.to(dtype), fmt, index_dtype=index_dtype, max_fill=1e9)
    return A.to(device), D


def test_test_matrices_build_in_every_format():
    for fmt in [*NAMED.values(), *RANDOM, *EXTRA]:
        A, D = matrix_for(fmt, 7, 9, torch.float32, torch.int32)
        assert torch.equal(A.to_dense().to(torch.float64), D)


def stored(A: st.SparseTensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows, columns and values of the entries A stores (explicit zeros included, padding not)."""
    coords, slot = A.entries()
    vals = A.values.detach().reshape(-1)[slot.long()].to(torch.float64).cpu().numpy()
    return coords[0].long().cpu().numpy(), coords[1].long().cpu().numpy(), vals


def semiring_reference(A: st.SparseTensor, X: torch.Tensor, name: str) -> np.ndarray:
    rows, cols, a = stored(A)
    x = X.to(torch.float64).cpu().numpy()
    m, k = A.shape[0], x.shape[1]
    if name == "min_plus":
        Y = np.full((m, k), np.inf)
        np.minimum.at(Y, rows, a[:, None] + x[cols])
    elif name == "max_times":
        Y = np.full((m, k), -np.inf)
        np.maximum.at(Y, rows, a[:, None] * x[cols])
    elif name == "or_and":
        Y = np.zeros((m, k))
        np.maximum.at(Y, rows, ((a[:, None] != 0) & (x[cols] != 0)).astype(np.float64))
    elif name == "max_plus_user":
        Y = np.full((m, k), -np.inf)
        np.maximum.at(Y, rows, a[:, None] + x[cols])
    else:
        raise ValueError(name)
    return Y


# GPU ---------------------------------------------------------------------------------------------

GPU_DTYPES = (torch.float32, torch.float64, torch.float16)
_ID = lambda d: str(d).replace("torch.", "")  # noqa: E731


def _x(n, k, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g, dtype=torch.float64).to(dtype).cuda()


def _check(A, D, dtype, k, **kw):
    X = _x(D.shape[1], k, dtype)
    plan = codegen.GeneratedSpmm(A, **kw)
    Y = plan.apply(X)
    ref = D @ X.to(torch.float64).cpu()
    err = rel_err(Y, ref)
    assert err <= TOL[dtype] * 4, f"{A.format}: rel err {err} ({plan})"
    return plan


@gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=_ID)
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64), ids=["i32", "i64"])
@pytest.mark.parametrize("name", list(NAMED))
def test_named_formats_match_dense(name, index_dtype, dtype):
    fmt = NAMED[name]
    A, D = matrix_for(fmt, 67, 53, dtype, index_dtype, seed=3, device="cuda")
    for variant in codegen.variants(codegen.analyse(fmt)):
        for k in (1, 5):
            _check(A, D, dtype, k, variant=variant)


@gpu
@pytest.mark.parametrize("k", range(len(RANDOM)))
def test_random_formats_match_dense(k):
    fmt = RANDOM[k]
    A, D = matrix_for(fmt, 41, 38, torch.float64, torch.int32 if k % 2 else torch.int64, seed=k, device="cuda")
    for variant in codegen.variants(codegen.analyse(fmt)):
        _check(A, D, torch.float64, 1 + k % 3, variant=variant)


@gpu
@pytest.mark.parametrize("k", range(len(EXTRA)))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=_ID)
def test_extra_formats_match_dense(k, dtype):
    fmt = EXTRA[k]
    A, D = matrix_for(fmt, 46, 39, dtype, torch.int32, seed=k, device="cuda")
    for variant in codegen.variants(codegen.analyse(fmt)):
        for cols in (1, 4):
            _check(A, D, dtype, cols, variant=variant)


@gpu
@pytest.mark.parametrize("sr", ["min_plus", "max_times", "or_and", "max_plus_user"])
@pytest.mark.parametrize("name", ["CSR", "CSC", "COO", "DCSR", "DIA", "BSR(2,3)", "DELTA(2)", "ELL"])
def test_semirings_match_numpy(name, sr):
    fmt = NAMED[name]
    A, D = matrix_for(fmt, 45, 37, torch.float32, torch.int32, seed=5, device="cuda")
    X = _x(37, 3, torch.float32)
    if sr == "or_and":
        X = (X > 0.3).to(torch.float32)
    spec = {"add": "a > b ? a : b", "mul": "a + b", "identity": "-ACC_INF"} if sr == "max_plus_user" else sr
    ref = semiring_reference(A, X, sr)
    for variant in codegen.variants(codegen.analyse(fmt)):
        Y = codegen.GeneratedSpmm(A, semiring=spec, variant=variant).apply(X).cpu().numpy().astype(np.float64)
        np.testing.assert_allclose(Y, ref, rtol=1e-6, atol=1e-6, err_msg=f"{name} {sr} {variant}")


@gpu
@pytest.mark.parametrize("name", ["CSR", "CSC", "COO", "DCSR", "DIA_J", "NM(2,4)"])
def test_prolog_and_epilog_are_fused(name):
    A, D = matrix_for(NAMED[name], 50, 44, torch.float64, torch.int64, seed=7, device="cuda")
    X = _x(44, 2, torch.float64)
    ref = torch.relu((D * D) @ (2 * X.cpu())) + 1  # padding and stored zeros square to zero: same as dense
    Y = codegen.generated_spmm(A, X, prolog="x * x", prolog_x="2 * x", epilog="(x > 0 ? x : 0) + 1")
    assert rel_err(Y, ref) < 1e-12


@gpu
def test_autotune_times_the_variants_once_and_remembers():
    A, D = matrix_for(NAMED["DELTA(2)"], 300, 280, torch.float32, torch.int32, seed=9, density=0.2, device="cuda")
    X = _x(280, 1, torch.float32)
    plan = codegen.GeneratedSpmm(A, autotune=True)
    Y = plan.apply(X)
    assert rel_err(Y, D @ X.double().cpu()) < 1e-5
    assert set(plan.timings[1]) == {"thread", "warp"} and plan.choice[1] in ("thread", "warp")
    seen = dict(plan.timings)
    Y2 = plan.apply(X)
    assert plan.timings == seen and torch.equal(Y, Y2)
    X3 = _x(280, 4, torch.float32)
    assert rel_err(plan.apply(X3), D @ X3.double().cpu()) < 1e-5 and 4 in plan.choice


@gpu
def test_second_plan_compiles_nothing():
    A, _ = matrix_for(NAMED["DCSC"], 30, 30, torch.float32, torch.int32, device="cuda")
    codegen.GeneratedSpmm(A, semiring="max_times")
    before = dict(c.STATS)
    codegen.GeneratedSpmm(A, semiring="max_times")
    assert c.STATS["compiled"] == before["compiled"]


@gpu
def test_value_batches_and_vectors():
    A, D = matrix_for(NAMED["CSC"], 20, 24, torch.float64, torch.int32, device="cuda")
    plan = codegen.GeneratedSpmm(A)
    V = torch.stack([A.values, 2 * A.values])
    plan.set_values(V)
    x = _x(24, 1, torch.float64)[:, 0]
    Y = plan.apply(x)
    assert Y.shape == (2, 20)
    assert rel_err(Y[1], 2 * D @ x.cpu()) < 1e-12 and rel_err(Y[0], D @ x.cpu()) < 1e-12


@gpu
@pytest.mark.parametrize("name", ["COO", "CSC", "DIA_J", "BSC(3,2)", "DCSR"])
def test_plan_kernel_generated(name):
    from sparsetorch_cuda.plan import CudaSpmmPlan

    A, D = matrix_for(NAMED[name], 40, 33, torch.float32, torch.int32, seed=2, device="cuda")
    plan = CudaSpmmPlan(A, kernel="generated")
    assert plan.kind == "generated"
    plan.set_values(A.values)
    X = _x(33, 3, torch.float32)
    assert rel_err(plan.apply(X), D @ X.double().cpu()) < 1e-5
    Xt = _x(40, 2, torch.float32)
    assert rel_err(plan.apply(Xt, adjoint=True), D.T @ Xt.double().cpu()) < 1e-5
    P, Q = _x(40, 2, torch.float32), _x(33, 2, torch.float32)
    g = plan.sddmm(P, Q)
    dense_g = (P.double().cpu() @ Q.double().cpu().T)
    rows, cols, _ = stored(A)
    _, slot = A.entries()
    want = torch.zeros(A.values.shape[-1], dtype=torch.float64)
    want[slot.long().cpu()] = dense_g[rows, cols]
    assert rel_err(g, want) < 1e-5
    default = CudaSpmmPlan(A)
    assert default.kind == ("generated" if name == "DIA_J" else "generic")  # the cost model's choice (cost.py)
    assert CudaSpmmPlan(A, kernel="native").kind == "generic"


@gpu
def test_default_plan_picks_generated_only_where_measured_better():
    from sparsetorch_cuda.plan import CudaSpmmPlan

    for dtype, want in ((torch.float64, "generated"), (torch.float16, "generic")):
        A, D = matrix_for(NAMED["DIA_J"], 60, 60, dtype, torch.int32, seed=4, device="cuda")
        plan = CudaSpmmPlan(A)
        assert plan.kind == want
        plan.set_values(A.values)
        X = _x(60, 2, dtype)
        assert rel_err(plan.apply(X), D @ X.double().cpu()) < TOL[dtype] * 4
    A, _ = matrix_for(NAMED["COO"], 60, 60, torch.float64, torch.int32, device="cuda")
    assert CudaSpmmPlan(A).kind == "generic"

"""Every kernel source compiles with NVRTC for every value type, index type and a range of
architectures, on the host (no GPU, no driver: NVRTC alone), and the module cache keys and
stores cubins as documented. Skips cleanly where cuda.bindings / NVRTC are not importable."""

from __future__ import annotations

import pytest

from sparsetorch_cuda import _delta, _spmm_cc
from sparsetorch_cuda import compile as c

MISSING = c.nvrtc_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

#: kernels each source must export (launch.py looks them up by these names)
EXPECTED = {
    "spmv": ["csr_vec1", "csr_vec2", "csr_vec4", "csr_vec8", "csr_vec16", "csr_vec32", "csr_cols", "csr_balanced",
             "dia_rows", "ell_rows", "delta_rows", "delta_rows_smem", "delta_lanes", "delta_lanes_smem", "cast_out",
             "csr_rows"],
    "sddmm": ["csr_sddmm1", "csr_sddmm4", "csr_sddmm32", "dia_sddmm", "ell_sddmm", "delta_sddmm"],
    "fast": ["csr_stream4", "csr_stream8", "csr_v32_2", "csr_v32_4", "csr_v32_8", "csr_v32_16", "csr_v32_32", "dia_fast1",
             "dia_fast2", "dia_p8_1", "dia_p8_2", "dia_p8_4", "dia_p8cs_1", "dia_p8pf_1", "dia_p8na_1", "csr_stream8cs",
             "csr_stream16"]
            + [f"{d}_b{b}{s}" for d in ("delta", "delta2") for b in (1, 2, 4, 8, 16) for s in ("", "_smem")],
    "structured": ["nm24"] + [f"nm24_s{s}" for s in (1, 2, 3, 4)] + ["nm_any", "sell32", "sell32_perm"]
                  + [f"bsr_vec{v}" for v in (1, 2, 4, 8, 16, 32)],
    "mma": ["add_bias"],
    # the DELTA(b) chunk kernels (one right-hand side): U entries per lane and step, X in shared memory or not
    "delta": [f"delta_c{u}_b{b}{s}{p}" for u in (8, 16) for b in (1, 2, 4, 8, 16) for s in ("", "_smem") for p in ("", "_pf")],
    "spmm_sp": [],  # half precision only (EXPECTED_HALF)
    "spmm_bm": [],  # half precision only (EXPECTED_HALF)
    "spmm_cc": [],  # half precision only (EXPECTED_HALF)
}
# session 8: the ELL kernels on the int32 column copy and the DIA variants (plan.ELL_VARIANTS, plan.DIA_EXTRA)
EXPECTED["fast"] += (["dia_v2_1", "dia_v2na_1", "dia_v4na_1", "dia_p8nb_1", "dia_p8nc_1", "dia_p8pd_1", "ell_stream8",
                      "ell_stream8cs"] + [f"ell_{p}{w}" for p in ("p", "pcs") for w in range(1, 9)])
#: kernels of the half types only; the cluster sizes 2..8 for sm_90 and later
EXPECTED_HALF = {"mma": [f"spmm_mma{f}{r}_s1" for f in ("", "24") for r in ("", "_r64")] + ["csr16_xs1", "csr16_xs2", "csr16_xs4"]
                 # session 8's batch-1 kernels (plan.csr16_kernel) and their diagnostic builds
                 + ["csr16_xv", "csr16_xvf", "csr16_x12", "csr16_x12f", "csr16_xva", "csr16_x12a", "csr16_xr", "csr16_xr_d1",
                    "csr16_x12a_d1", "csr16_x12a_d4", "csr16_x12b", "csr16_x12a_d16"]
                 + [f"csr16_xv_d{f}" for f in (1, 2, 4, 8)] + [f"csr16_x12_d{f}" for f in (1, 2, 4)],
                 # session 9: the DELTA(4) tile kernels (consecutive lanes on consecutive entries)
                 "delta": ["delta_t_b4", "delta_t_b4_f", "delta_t_b4_p1"]}
#: kernels of every value type but float64 (the DELTA chunk kernel at three blocks per SM)
EXPECTED_NOT_F64 = {"delta": ["delta_c8_b4_smem_o3", "delta_c8_b4_smem_k1024"]}
EXPECTED_SM90 = {"mma": [f"spmm_mma{f}{r}_s{s}" for f in ("", "24") for r in ("", "_r64") for s in (2, 4, 8)]}
# session 9: the 2:4 sparse-tensor-core SpMM (_spmm_sp.SP_CONFIGS x cluster sizes)
_SP = [f"spmm_sp_r{r}w{w}k{k}" for r, w, k in ((4, 2, 4), (4, 4, 2), (2, 4, 2), (2, 2, 4))]
EXPECTED_HALF["spmm_sp"] = [f"{c}_s1" for c in _SP]
EXPECTED_SM90["spmm_sp"] = [f"{c}_s{s}" for c in _SP for s in (2, 4, 8)]
# session 10: the bitmap tensor-core SpMM (_spmm_bm.BM_SPLITS)
EXPECTED_HALF["spmm_bm"] = ["spmm_bm_s1", "spmm_bm1_s1"]
EXPECTED_SM90["spmm_bm"] = [f"spmm_{v}_s{s}" for v in ("bm", "bm1") for s in (2, 3, 4, 6, 8)]
# session 11: the strip-compacted tensor-core SpMM (_spmm_cc: C K-slices per cluster, 1 or 4 batch tiles; "z" the
# compressed value format; "_abl" the ablation build)
# (session 12: "_o" the one-reduction builds): the names _spmm_cc launches, C = 1 below sm_90
EXPECTED_HALF["spmm_cc"] = [k for k in _spmm_cc.kernel_names() if "_c1_" in k]
EXPECTED_SM90["spmm_cc"] = [k for k in _spmm_cc.kernel_names() if "_c1_" not in k]
# the DELTA(4) "tc" / "tq" kernels of the half types (_delta.TC_VARIANTS, TQ_KERNELS; session 12: tc16pk, tc8pkf, tc16pkf)
EXPECTED_HALF["delta"] += ["delta_tc8_b4", "delta_tc16_b4"] + [v[0] for v in _delta.TQ_KERNELS.values()]


#: (arch, index type) pairs built: sm_90 with both index types, sm_80 with int32 (its own code paths, those below
#: ``__CUDA_ARCH__ >= 900``, do not depend on the index type; the int64 paths are built for sm_90): CI time
ARCH_INDEX = [("sm_80", "int32"), ("sm_90", "int32"), ("sm_90", "int64")]
#: sources the plugin loads with int32 indices only (_mma.py, _spmm_sp.py, _spmm_bm.py, _spmm_cc.py: their patterns are
#: int32 copies), so their int64 builds are never used and are not built here (session 13: CI time)
INT32_ONLY = ("mma", "spmm_sp", "spmm_bm", "spmm_cc")
BUILDS = [(source, value, index, arch) for source in c.SOURCES for value in c.VAL_KINDS for arch, index in ARCH_INDEX
          if not (index == "int64" and source in INT32_ONLY)]


def test_the_int32_only_sources_are_loaded_with_int32():
    # what INT32_ONLY leaves out must be what the plugin never asks for: every kernel() call of those sources
    # passes torch.int32 as its index type (read from the plugin's source text)
    import re
    from pathlib import Path

    pkg = Path(c.__file__).parent
    calls = [m for f in pkg.glob("*.py") for m in re.finditer(r'kernel\(\s*"(\w+)",[^\n]*', f.read_text())]
    ours = [m.group(0) for m in calls if m.group(1) in INT32_ONLY]
    assert ours, "no kernel() calls found for the int32-only sources"
    assert all("torch.int32" in call for call in ours), [call for call in ours if "torch.int32" not in call]
    # every module loads its kernels through launch.kernel (no library loaded elsewhere, which this check would miss)
    assert not [f.name for f in pkg.glob("*.py") if "cuLibraryLoadData" in f.read_text() and f.name not in
                ("launch.py", "codegen.py")]


@pytest.mark.parametrize(("source", "value", "index", "arch"), BUILDS)
def test_every_source_compiles(source, value, index, arch):
    cubin = c.compile_cubin(source, value, index, arch)
    assert cubin[:4] == b"\x7fELF", "NVRTC returned something that is not a cubin (ELF)"
    names = list(EXPECTED[source])
    if value in ("float16", "bfloat16"):
        names += EXPECTED_HALF.get(source, []) + (EXPECTED_SM90.get(source, []) if arch == "sm_90" else [])
    if value != "float64":
        names += EXPECTED_NOT_F64.get(source, [])
    for name in names:
        assert name.encode() + b"\x00" in cubin, f"{source}.cu does not export {name} for {value}/{index}/{arch}"


def test_a_broken_source_reports_the_nvrtc_log(monkeypatch, tmp_path):
    (tmp_path / "common.cuh").write_text((c.KERNEL_DIR / "common.cuh").read_text())
    (tmp_path / "spmv.cu").write_text('extern "C" __global__ void k() { undeclared_thing(); }\n')
    monkeypatch.setattr(c, "KERNEL_DIR", tmp_path)
    with pytest.raises(c.CompileError, match="undeclared_thing"):
        c.compile_cubin("spmv", "float32", "int32", "sm_90")


def test_cache_keys_and_disk_reuse(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSETORCH_CUDA_CACHE", str(tmp_path))
    c.clear_memory()
    keys = {c.module_key("spmv", v, i, a) for v in c.VAL_KINDS for i in c.IDX_KINDS for a in ("sm_80", "sm_90")}
    assert len({k.filename for k in keys}) == len(c.VAL_KINDS) * len(c.IDX_KINDS) * 2
    assert c.module_key("spmv", "float16", "int32", "sm_90").source_hash != c.module_key("sddmm", "float16", "int32", "sm_90").source_hash
    before = dict(c.STATS)
    first = c.cubin("spmv", "float16", "int32", "sm_90")
    assert c.STATS["compiled"] == before["compiled"] + 1
    path = tmp_path / c.module_key("spmv", "float16", "int32", "sm_90").filename
    assert path.read_bytes() == first
    assert c.cubin("spmv", "float16", "int32", "sm_90") is first  # memory hit
    assert c.STATS["memory"] == before["memory"] + 1
    c.clear_memory()
    again = c.cubin("spmv", "float16", "int32", "sm_90")  # a "second process": from disk, no NVRTC
    assert again == first and c.STATS["disk"] == before["disk"] + 1 and c.STATS["compiled"] == before["compiled"] + 1


def test_source_edit_changes_the_key(monkeypatch, tmp_path):
    before = c.module_key("sddmm", "float32", "int64", "sm_90")
    for f in ("common.cuh", *(f"{name}.cu" for name in c.SOURCES)):
        (tmp_path / f).write_text((c.KERNEL_DIR / f).read_text())
    (tmp_path / "sddmm.cu").write_text((tmp_path / "sddmm.cu").read_text() + "\n// edited\n")
    monkeypatch.setattr(c, "KERNEL_DIR", tmp_path)
    assert c.module_key("sddmm", "float32", "int64", "sm_90").source_hash != before.source_hash


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("index", list(c.IDX_KINDS))
@pytest.mark.parametrize("value", ["float32", "float64"])
def test_fused_cg_source_compiles(value, index, arch):
    """kernels/krylov.cu (the fused CG and BiCGStab, compiled by krylov.py for float32 / float64) exports every kernel."""
    from sparsetorch_cuda import krylov

    cubin = krylov.compile_cubin(value, index, arch)
    assert cubin[:4] == b"\x7fELF"
    for name in (*krylov.KERNELS, *krylov.BICGSTAB_KERNELS):
        assert name.encode() + b"\x00" in cubin, f"krylov.cu does not export {name} for {value}/{index}/{arch}"


def test_partial_sources_share_the_keys_and_check_their_types(monkeypatch, tmp_path):
    """spmm_wd / spmm_pb (half types) and krylov (float32 / float64) go through the same text, keys and caches as
    SOURCES; prewarm refuses a type their kernels do not exist for, before compiling anything."""
    monkeypatch.setenv("SPARSETORCH_CUDA_CACHE", str(tmp_path))
    keys = {c.module_key(s, v, i, "sm_90") for s, (vs, ix) in c.PARTIAL_SOURCES.items() for v in vs for i in ix}
    assert len({k.filename for k in keys}) == len(keys)
    for s in c.PARTIAL_SOURCES:
        assert f'#line 1 "{s}.cu"' in c.source_text(s)
    with pytest.raises(ValueError, match="spmm_wd"):
        c.prewarm("sm_90", ["spmm_wd"], ["float32"], ["int32"])
    with pytest.raises(ValueError, match="krylov"):
        c.prewarm("sm_90", ["krylov"], ["float16"], None)
    with pytest.raises(KeyError, match="nope"):
        c.source_text("nope")
    assert not list(tmp_path.iterdir())  # nothing compiled

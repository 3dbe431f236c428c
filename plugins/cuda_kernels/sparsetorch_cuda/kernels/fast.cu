// Bandwidth-tuned SpMV/SpMM kernels (issue 16's measured goals), 32-bit index arithmetic.
//
// The host launches these only when every entry, row and X/Y offset fits in an int (nnz, m * k,
// n * k below 2^31 - 64); otherwise it falls back to spmv.cu's 64-bit kernels. X is (n, k) and
// Y is (m, k), row-major; column c of Y is blockIdx.y (grid-strided), except where noted.
// Index buffers were validated by the host (plan.py) before the first launch.

#define FULL 0xffffffffu

// ---- CSR, 32 consecutive rows per warp ("stream") ------------------------------------------------
// The warp's nonzeros [rowptr[r0], rowptr[r0 + 32]) are read in chunks of 32 * U: every lane
// issues U independent (column, value, X) loads, coalesced across the warp, and parks the
// products in shared memory; then each lane sums the products of its own row's part of the chunk.
// For short rows (a stencil's 7) this keeps U loads per lane in flight, where a VEC-lane group
// per row has one or two. Blocks of CSR_STREAM_BLOCK threads.
#define CSR_STREAM_BLOCK 256
template <int U, bool CS>
__device__ __forceinline__ void csr_stream_body(int m, int k, const idx_t* __restrict__ rowptr, const idx_t* __restrict__ col,
                                                const val_t* __restrict__ val, const val_t* __restrict__ x,
                                                val_t* __restrict__ y) {
  __shared__ acc_t sp_all[CSR_STREAM_BLOCK / 32][32 * U];
  acc_t* sp = sp_all[threadIdx.x >> 5];
  int lane = threadIdx.x & 31;
  int r0 = (blockIdx.x * CSR_STREAM_BLOCK + threadIdx.x) & ~31;
  if (r0 >= m) return;  // whole warps leave together
  int r = r0 + lane;
  int a = (int)RO(rowptr + min(r, m));
  int b = (int)RO(rowptr + min(r + 1, m));
  int start = __shfl_sync(FULL, a, 0), end = __shfl_sync(FULL, b, 31);
  for (int c = blockIdx.y; c < k; c += gridDim.y) {
    acc_t s = 0;
    for (int cs = start; cs < end; cs += 32 * U) {
      acc_t pr[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        int e = cs + u * 32 + lane;
        bool in = e < end;
        int j = in ? (int)(CS ? __ldcs(col + e) : RO(col + e)) : 0;
        acc_t v = in ? ld(CS ? __ldcs(val + e) : RO(val + e)) : (acc_t)0;
        pr[u] = v * ld(RO(x + j * k + c));
      }
#pragma unroll
      for (int u = 0; u < U; ++u) sp[u * 32 + lane] = pr[u];
      __syncwarp();
      int lo = max(a, cs) - cs, hi = min(b, cs + 32 * U) - cs;
      for (int t = lo; t < hi; ++t) s += sp[t];
      __syncwarp();
    }
    if (r < m) y[r * k + c] = st(s);
  }
}

// CS: columns and values (read once) loaded with the evict-first hint, leaving L2 to X
// (csr_stream8cs, "streamcs").
#define CSR_STREAM(NAME, U, CS)                                                                                      \
  extern "C" __global__ void __launch_bounds__(CSR_STREAM_BLOCK) NAME(i64 m, i64 k, const idx_t* rowptr,             \
                                                                    const idx_t* col, const val_t* val,             \
                                                                    const val_t* x, val_t* y) {                      \
    csr_stream_body<U, CS>((int)m, (int)k, rowptr, col, val, x, y);                                                  \
  }
CSR_STREAM(csr_stream4, 4, false)
CSR_STREAM(csr_stream8, 8, false)
CSR_STREAM(csr_stream8cs, 8, true)
CSR_STREAM(csr_stream16, 16, false)

// ---- CSR, VEC lanes per row, 32-bit offsets, all of a lane's loads issued before its FMAs ------
template <int VEC, int UN>
__device__ __forceinline__ void csr_vec32_body(int m, int k, const idx_t* __restrict__ rowptr, const idx_t* __restrict__ col,
                                               const val_t* __restrict__ val, const val_t* __restrict__ x,
                                               val_t* __restrict__ y) {
  int gid = blockIdx.x * blockDim.x + threadIdx.x;
  int row = gid / VEC, lane = gid & (VEC - 1);
  if (row >= m) return;
  int p0 = (int)RO(rowptr + row), p1 = (int)RO(rowptr + row + 1);
  for (int c = blockIdx.y; c < k; c += gridDim.y) {
    acc_t s = 0;
    for (int p = p0 + lane; p < p1; p += VEC * UN) {
      acc_t pr[UN];
#pragma unroll
      for (int u = 0; u < UN; ++u) {
        int e = p + u * VEC;
        bool in = e < p1;
        int j = in ? (int)RO(col + e) : 0;
        acc_t v = in ? ld(RO(val + e)) : (acc_t)0;
        pr[u] = v * ld(RO(x + j * k + c));
      }
#pragma unroll
      for (int u = 0; u < UN; ++u) s += pr[u];
    }
    s = group_sum<VEC>(s);
    if (lane == 0) y[row * k + c] = st(s);
  }
}

#define CSR_VEC32(V, UN)                                                                                         \
  extern "C" __global__ void csr_v32_##V(i64 m, i64 k, const idx_t* rowptr, const idx_t* col, const val_t* val, \
                                         const val_t* x, val_t* y) {                                             \
    csr_vec32_body<V, UN>((int)m, (int)k, rowptr, col, val, x, y);                                               \
  }
CSR_VEC32(2, 4)
CSR_VEC32(4, 2)
CSR_VEC32(8, 2)
CSR_VEC32(16, 2)
CSR_VEC32(32, 2)

// ---- DIA (diagonals indexed by row), ROWS rows per thread, diagonals in batches of 8 ------------
// val[d * m + i] = A[i, i + off[d]]; offsets (int32) staged in shared memory; every batch issues
// its 8 value loads and 8 X loads before the FMAs. Row i of a thread is i0 + r * blockDim.x.
template <int ROWS>
__device__ __forceinline__ void dia_fast_body(int m, int n, int k, int nd, const int* __restrict__ offs,
                                              const val_t* __restrict__ val, const val_t* __restrict__ x,
                                              val_t* __restrict__ y) {
  extern __shared__ int soff[];
  int ndp = (nd + 7) & ~7;
  for (int d = threadIdx.x; d < ndp; d += blockDim.x) soff[d] = d < nd ? RO(offs + d) : 0;
  __syncthreads();
  int i0 = blockIdx.x * blockDim.x * ROWS + threadIdx.x;
  if (i0 >= m) return;
  for (int c = blockIdx.y; c < k; c += gridDim.y) {
    acc_t s[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) s[r] = 0;
    for (int d0 = 0; d0 < nd; d0 += 8) {
      acc_t v[ROWS][8], xv[ROWS][8];
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        int d = d0 + t;
        int o = soff[d];
        const val_t* vp = val + (i64)d * m;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          int i = i0 + r * blockDim.x;
          int j = i + o;
          bool in = d < nd && i < m && (unsigned)j < (unsigned)n;
          v[r][t] = in ? ld(RO(vp + i)) : (acc_t)0;
          xv[r][t] = in ? ld(RO(x + j * k + c)) : (acc_t)0;
        }
      }
#pragma unroll
      for (int t = 0; t < 8; ++t)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) s[r] += v[r][t] * xv[r][t];
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      int i = i0 + r * blockDim.x;
      if (i < m) y[i * k + c] = st(s[r]);
    }
  }
}

#define DIA_FAST(R)                                                                                           \
  extern "C" __global__ void dia_fast##R(i64 m, i64 n, i64 k, i64 nd, const int* offs, const val_t* val,    \
                                         const val_t* x, val_t* y) {                                          \
    dia_fast_body<R>((int)m, (int)n, (int)k, (int)nd, offs, val, x, y);                                       \
  }
DIA_FAST(1)
DIA_FAST(2)

// ---- DIA with at most 8 diagonals, offsets as kernel parameters ------------------------------------
// Same arithmetic as dia_fast, but the offsets arrive in the parameter bank (no global load and no
// barrier before a block's first value load); ROWS rows per thread. CS: the values (read once)
// are loaded and Y stored with the evict-first hint, leaving L2 to X (dia_p8cs_1, "p1cs").
// PF (dia_p8pf_1 "p1pf", dia_p8na_1 "p1na"): the values loaded with a 256-byte L2 prefetch hint
// (a warp's 32 consecutive values of one diagonal are 128 / 256 bytes: the next warp's come with
// them), and for "p1na" without allocating in L1 (read once; L1 keeps X).
template <int PF>
__device__ __forceinline__ val_t ld_val(const val_t* p) {
  val_t v;
#if VAL_KIND == 3
  if (PF == 1) asm("ld.global.nc.L2::256B.f64 %0, [%1];" : "=d"(v) : "l"(p));
  else asm("ld.global.nc.L1::no_allocate.L2::256B.f64 %0, [%1];" : "=d"(v) : "l"(p));
#elif VAL_KIND == 2
  if (PF == 1) asm("ld.global.nc.L2::256B.f32 %0, [%1];" : "=f"(v) : "l"(p));
  else asm("ld.global.nc.L1::no_allocate.L2::256B.f32 %0, [%1];" : "=f"(v) : "l"(p));
#else
  if (PF == 1) asm("ld.global.nc.L2::256B.u16 %0, [%1];" : "=h"(v) : "l"(p));
  else asm("ld.global.nc.L1::no_allocate.L2::256B.u16 %0, [%1];" : "=h"(v) : "l"(p));
#endif
  return v;
}

template <int ROWS, bool CS, int PF = 0>
__device__ __forceinline__ void dia_p8_body(int m, int n, int k, int nd, const int* o, const val_t* __restrict__ val,
                                            const val_t* __restrict__ x, val_t* __restrict__ y) {
  int i0 = blockIdx.x * blockDim.x * ROWS + threadIdx.x;
  if (i0 >= m) return;
  for (int c = blockIdx.y; c < k; c += gridDim.y) {
    acc_t v[ROWS][8], xv[ROWS][8];
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const val_t* vp = val + (i64)t * m;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        int i = i0 + r * blockDim.x;
        int j = i + o[t];
        bool in = t < nd && i < m && (unsigned)j < (unsigned)n;
        if (PF) {  // an asm load may be issued whatever `in` says: it always reads a valid address
          const val_t* q = in ? vp + i : val;
          acc_t lv = ld(ld_val<PF>(q));
          v[r][t] = in ? lv : (acc_t)0;
        } else {
          v[r][t] = in ? ld(CS ? __ldcs(vp + i) : RO(vp + i)) : (acc_t)0;
        }
        xv[r][t] = in ? ld(RO(x + j * k + c)) : (acc_t)0;
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      acc_t s = 0;
#pragma unroll
      for (int t = 0; t < 8; ++t) s += v[r][t] * xv[r][t];
      int i = i0 + r * blockDim.x;
      if (i < m) {
        if (CS) __stcs(y + i * k + c, st(s));
        else y[i * k + c] = st(s);
      }
    }
  }
}

#define DIA_P8(NAME, R, CS, PF)                                                                                  \
  extern "C" __global__ void NAME(i64 m, i64 n, i64 k, i64 nd, i64 o0, i64 o1, i64 o2, i64 o3, i64 o4, i64 o5,     \
                                  i64 o6, i64 o7, const val_t* val, const val_t* x, val_t* y) {                    \
    const int o[8] = {(int)o0, (int)o1, (int)o2, (int)o3, (int)o4, (int)o5, (int)o6, (int)o7};                    \
    dia_p8_body<R, CS, PF>((int)m, (int)n, (int)k, (int)nd, o, val, x, y);                                         \
  }
DIA_P8(dia_p8_1, 1, false, 0)
DIA_P8(dia_p8_2, 2, false, 0)
DIA_P8(dia_p8_4, 4, false, 0)
DIA_P8(dia_p8cs_1, 1, true, 0)
DIA_P8(dia_p8pf_1, 1, false, 1)
DIA_P8(dia_p8na_1, 1, false, 2)
// "p1na" with fewer registers: at most 40 (12 blocks of 128 threads per SM, "p1nb") or 32 (16 blocks, all
// 2048 threads, "p1nc") instead of the 43 the compiler takes (10 blocks)
#define DIA_P8_LB(NAME, MINB)                                                                                     \
  extern "C" __global__ void __launch_bounds__(128, MINB) NAME(i64 m, i64 n, i64 k, i64 nd, i64 o0, i64 o1, i64 o2,  \
                                                               i64 o3, i64 o4, i64 o5, i64 o6, i64 o7,             \
                                                               const val_t* val, const val_t* x, val_t* y) {       \
    const int o[8] = {(int)o0, (int)o1, (int)o2, (int)o3, (int)o4, (int)o5, (int)o6, (int)o7};                    \
    dia_p8_body<1, false, 2>((int)m, (int)n, (int)k, (int)nd, o, val, x, y);                                       \
  }
DIA_P8_LB(dia_p8nb_1, 12)
DIA_P8_LB(dia_p8nc_1, 16)

// "p1pd": "p1na" plus an L2 prefetch of the values `ahead` rows further on: lane l < nd * L of each warp
// (L = 128-byte lines per warp and diagonal) prefetches one line, so later blocks find their values in L2
// (more bytes in flight than the registers of the resident threads hold).
extern "C" __global__ void dia_p8pd_1(i64 m, i64 n, i64 k, i64 nd, i64 o0, i64 o1, i64 o2, i64 o3, i64 o4, i64 o5,
                                      i64 o6, i64 o7, i64 ahead, const val_t* val, const val_t* x, val_t* y) {
  const int o[8] = {(int)o0, (int)o1, (int)o2, (int)o3, (int)o4, (int)o5, (int)o6, (int)o7};
  const int per = (32 * (int)sizeof(val_t) + 127) / 128;  // 128-byte lines per warp and diagonal
  int lane = threadIdx.x & 31;
  if (lane < (int)nd * per) {
    int t = lane / per, part = lane - t * per;
    i64 r = (i64)((blockIdx.x * blockDim.x + threadIdx.x) & ~31) + ahead + part * (128 / (int)sizeof(val_t));
    if (r < m) asm volatile("prefetch.global.L2 [%0];" ::"l"(val + (i64)t * m + r));
  }
  dia_p8_body<1, false, 2>((int)m, (int)n, (int)k, (int)nd, o, val, x, y);
}

// ---- DIA with at most 8 diagonals, 2 consecutive rows per thread ("v2", "v2na") -----------------
// Rows i, i + 1 (i even) of each diagonal are one 8-byte (float32) / 16-byte (float64) value load;
// the host runs these only when m is even and the values and Y are 16-byte aligned, so
// val + t * m + i is aligned for every diagonal t. X is read per row (the offsets are runtime).
// NA: values loaded with L1::no_allocate and the 256-byte L2 prefetch hint (as "p1na"). Entries
// whose column falls outside [0, n) are not part of the matrix: their value slots are loaded (the
// pair is one load) but never used.
#if VAL_KIND == 3
typedef double2 vpair_t;
#elif VAL_KIND == 2
typedef float2 vpair_t;
#else
typedef ushort2 vpair_t;
#endif

template <int NA>
__device__ __forceinline__ vpair_t ld_pair(const val_t* p) {
  vpair_t v;
  if (NA) {
#if VAL_KIND == 3
    asm("ld.global.nc.L1::no_allocate.L2::256B.v2.f64 {%0, %1}, [%2];" : "=d"(v.x), "=d"(v.y) : "l"(p));
#elif VAL_KIND == 2
    asm("ld.global.nc.L1::no_allocate.L2::256B.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p));
#else
    asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u16 {%0, %1}, [%2];" : "=h"(v.x), "=h"(v.y) : "l"(p));
#endif
  } else {
    v = __ldg(reinterpret_cast<const vpair_t*>(p));
  }
  return v;
}

// R (2 or 4) consecutive rows per thread: R / 2 pairs per diagonal (a pair past row m - 1 is skipped;
// m is even, so a pair is whole or absent).
template <int R, int NA>
__device__ __forceinline__ void dia_v2_body(int m, int n, int k, int nd, const int* o, const val_t* __restrict__ val,
                                            const val_t* __restrict__ x, val_t* __restrict__ y) {
  int i0 = R * (blockIdx.x * blockDim.x + threadIdx.x);
  if (i0 >= m) return;
  for (int c = blockIdx.y; c < k; c += gridDim.y) {
    acc_t a[R][8], xv[R][8];
#pragma unroll
    for (int t = 0; t < 8; ++t) {
#pragma unroll
      for (int h = 0; h < R / 2; ++h) {
        int i = i0 + 2 * h;
        bool on = t < nd && i < m;
        const val_t* q = on ? val + (i64)t * m + i : val;  // always a valid, aligned address
        vpair_t pv = ld_pair<NA>(q);
        int j = i + o[t];
        bool in0 = on && (unsigned)j < (unsigned)n, in1 = on && (unsigned)(j + 1) < (unsigned)n;
        a[2 * h][t] = in0 ? ld(pv.x) : (acc_t)0;
        a[2 * h + 1][t] = in1 ? ld(pv.y) : (acc_t)0;
        xv[2 * h][t] = in0 ? ld(RO(x + j * k + c)) : (acc_t)0;
        xv[2 * h + 1][t] = in1 ? ld(RO(x + (j + 1) * k + c)) : (acc_t)0;
      }
    }
#pragma unroll
    for (int h = 0; h < R / 2; ++h) {
      int i = i0 + 2 * h;
      acc_t s0 = 0, s1 = 0;
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        s0 += a[2 * h][t] * xv[2 * h][t];
        s1 += a[2 * h + 1][t] * xv[2 * h + 1][t];
      }
      if (i < m) {
        if (k == 1) {
          vpair_t out;
          out.x = st(s0);
          out.y = st(s1);
          *reinterpret_cast<vpair_t*>(y + i) = out;
        } else {
          y[i * k + c] = st(s0);
          y[(i + 1) * k + c] = st(s1);
        }
      }
    }
  }
}

#define DIA_V2(NAME, R, NA)                                                                                      \
  extern "C" __global__ void NAME(i64 m, i64 n, i64 k, i64 nd, i64 o0, i64 o1, i64 o2, i64 o3, i64 o4, i64 o5,     \
                                  i64 o6, i64 o7, const val_t* val, const val_t* x, val_t* y) {                    \
    const int o[8] = {(int)o0, (int)o1, (int)o2, (int)o3, (int)o4, (int)o5, (int)o6, (int)o7};                    \
    dia_v2_body<R, NA>((int)m, (int)n, (int)k, (int)nd, o, val, x, y);                                             \
  }
DIA_V2(dia_v2_1, 2, 0)
DIA_V2(dia_v2na_1, 2, 1)
DIA_V2(dia_v4na_1, 4, 1)

// ---- session 11 (s11f): DIA with at most 8 diagonals under programmatic dependent launch -----------
// W = 1: griddepcontrol.wait before anything is read or written (the offsets are kernel parameters: a
// thread reads nothing before it), so the plan may launch the kernel with programmatic dependent launch
// (launch.py, allow_pdl): the next grid of a back-to-back chain is launched while this one drains and
// starts reading once this one has finished and its writes are visible. W = 2: also
// griddepcontrol.launch_dependents right after the wait (the next PDL grid may be launched once every
// block of this one has started, i.e. during its last wave; it still waits for this grid's completion).
// On sm_80 builds (no griddepcontrol) these are the plain kernels.
template <int W>
__device__ __forceinline__ void dia_pdl() {
#if __CUDA_ARCH__ >= 900
  if (W >= 1) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (W >= 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// "p1w" / "p1wt" / "p2w": dia_p8_1 / dia_p8_2 after dia_pdl<W>; "p1nbw": p1nb (at most 40 registers,
// 128 threads) after the wait (float64's default kernel).
#define DIA_P8W(NAME, R, CS, PF, W)                                                                              \
  extern "C" __global__ void NAME(i64 m, i64 n, i64 k, i64 nd, i64 o0, i64 o1, i64 o2, i64 o3, i64 o4, i64 o5,     \
                                  i64 o6, i64 o7, const val_t* val, const val_t* x, val_t* y) {                    \
    dia_pdl<W>();                                                                                                  \
    const int o[8] = {(int)o0, (int)o1, (int)o2, (int)o3, (int)o4, (int)o5, (int)o6, (int)o7};                    \
    dia_p8_body<R, CS, PF>((int)m, (int)n, (int)k, (int)nd, o, val, x, y);                                         \
  }
DIA_P8W(dia_p8w_1, 1, false, 0, 1)
DIA_P8W(dia_p8wt_1, 1, false, 0, 2)
DIA_P8W(dia_p8w_2, 2, false, 0, 1)
extern "C" __global__ void __launch_bounds__(128, 12) dia_p8nbw_1(i64 m, i64 n, i64 k, i64 nd, i64 o0, i64 o1, i64 o2,
                                                                  i64 o3, i64 o4, i64 o5, i64 o6, i64 o7,
                                                                  const val_t* val, const val_t* x, val_t* y) {
  dia_pdl<1>();
  const int o[8] = {(int)o0, (int)o1, (int)o2, (int)o3, (int)o4, (int)o5, (int)o6, (int)o7};
  dia_p8_body<1, false, 2>((int)m, (int)n, (int)k, (int)nd, o, val, x, y);
}

// "q" / "qw" / "qwt" / "qwe": one right-hand side (k = 1), V = 16 / sizeof(val_t) consecutive rows per
// thread (4 in float32, 2 in float64, 8 in half types). Each diagonal's V values are one 16-byte load;
// X's V entries x[i0 + o .. i0 + o + V - 1] are taken from the one or two aligned 16-byte vectors that
// hold them (o mod V is the same for every thread: the selection below is uniform), so a thread issues
// 8 + 16 vector loads for V rows instead of p1's 16 scalar loads per row, and Y is one 16-byte store.
// A diagonal whose X window leaves [0, n) for this thread (the matrix edges) reads X per row, masked.
// The host runs these only when k == 1, m % V == 0 and the values, X and Y are 16-byte aligned (so
// val + t * m + i0 and y + i0 are aligned for every diagonal t). E (= 1, "qwe"): the values loaded
// with L1::no_allocate and an L2 evict-first policy (read once), X with the default policy.
union dia_q16 {
  uint4 u;
  val_t e[16 / sizeof(val_t)];
};

template <int E>
__device__ __forceinline__ dia_q16 dia_ldq(const val_t* p, unsigned long long pol) {
  dia_q16 q;
  if (E) {
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(q.u.x), "=r"(q.u.y), "=r"(q.u.z), "=r"(q.u.w) : "l"(p), "l"(pol));
  } else {
    q.u = __ldg(reinterpret_cast<const uint4*>(p));
  }
  return q;
}

template <int W, int E>
__device__ __forceinline__ void dia_q_body(int m, int n, int nd, const int* o, const val_t* __restrict__ val,
                                           const val_t* __restrict__ x, val_t* __restrict__ y) {
  constexpr int V = 16 / (int)sizeof(val_t);
  dia_pdl<W>();
  int i0 = V * (blockIdx.x * blockDim.x + threadIdx.x);
  if (i0 >= m) return;
  unsigned long long pol = 0;
  if (E) asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  dia_q16 a[8], xl[8], xh[8];
  bool fast[8];
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    bool on = t < nd;
    int j = i0 + o[t];
    int b = j & ~(V - 1);  // the aligned vector holding x[j] (j >= 0 where used)
    int sh = j - b;        // o[t] mod V: uniform
    fast[t] = on && j >= 0 && b + (sh ? 2 * V : V) <= n;
    a[t] = dia_ldq<E>(on ? val + (i64)t * m + i0 : val, pol);  // always a valid, aligned address
    xl[t] = dia_ldq<0>(fast[t] ? x + b : x, 0);
    xh[t] = dia_ldq<0>(fast[t] && sh ? x + b + V : x, 0);
  }
  acc_t s[V];
#pragma unroll
  for (int r = 0; r < V; ++r) s[r] = 0;
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    if (t >= nd) break;
    int j = i0 + o[t];
    int sh = j & (V - 1);
    if (fast[t]) {
      acc_t xv[V];
#pragma unroll
      for (int q = 0; q < V; ++q) {
        if (q == sh) {
#pragma unroll
          for (int r = 0; r < V; ++r) xv[r] = ld(q + r < V ? xl[t].e[(q + r) & (V - 1)] : xh[t].e[(q + r) & (V - 1)]);
        }
      }
#pragma unroll
      for (int r = 0; r < V; ++r) s[r] += ld(a[t].e[r]) * xv[r];
    } else {  // an edge: entries whose column leaves [0, n) are not part of the matrix (their slots may hold anything)
#pragma unroll
      for (int r = 0; r < V; ++r)
        if ((unsigned)(j + r) < (unsigned)n) s[r] += ld(a[t].e[r]) * ld(RO(x + j + r));
    }
  }
  dia_q16 out;
#pragma unroll
  for (int r = 0; r < V; ++r) out.e[r] = st(s[r]);
  *reinterpret_cast<uint4*>(y + i0) = out.u;
}

#define DIA_Q(NAME, W, E)                                                                                        \
  extern "C" __global__ void NAME(i64 m, i64 n, i64 k, i64 nd, i64 o0, i64 o1, i64 o2, i64 o3, i64 o4, i64 o5,     \
                                  i64 o6, i64 o7, const val_t* val, const val_t* x, val_t* y) {                    \
    const int o[8] = {(int)o0, (int)o1, (int)o2, (int)o3, (int)o4, (int)o5, (int)o6, (int)o7};                    \
    dia_q_body<W, E>((int)m, (int)n, (int)nd, o, val, x, y);                                                       \
  }
DIA_Q(dia_q_1, 0, 0)
DIA_Q(dia_qw_1, 1, 0)
DIA_Q(dia_qwt_1, 2, 0)
DIA_Q(dia_qwe_1, 1, 1)
// "qwb": "qw" compiled for 4 blocks of 128 threads per SM (at most 128 registers; "qw" takes ~130: 3 blocks)
extern "C" __global__ void __launch_bounds__(128, 4) dia_qwb_1(i64 m, i64 n, i64 k, i64 nd, i64 o0, i64 o1, i64 o2,
                                                               i64 o3, i64 o4, i64 o5, i64 o6, i64 o7,
                                                               const val_t* val, const val_t* x, val_t* y) {
  const int o[8] = {(int)o0, (int)o1, (int)o2, (int)o3, (int)o4, (int)o5, (int)o6, (int)o7};
  dia_q_body<1, 0>((int)m, (int)n, (int)nd, o, val, x, y);
}

// ---- ELL on the plan's int32 column copy (-1 in padding slots) -----------------------------------
// The plan copies ELL columns once per pattern as int32 (when every slot, row and column fits),
// with -1 in each row's unused slots, so the kernels read no per-row counts: a slot with a
// negative column adds nothing (its value is loaded, since it lies in the row's span, but not
// used: padding values may hold anything).
// "p" / "pcs": a thread per row, W (<= 8, compile time) slots, all loads issued before the FMAs;
// CS: columns and values (read once) with the evict-first hint.
template <int W, bool CS>
__device__ __forceinline__ void ell_p_body(int m, int k, const int* __restrict__ col, const val_t* __restrict__ val,
                                           const val_t* __restrict__ x, val_t* __restrict__ y) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= m) return;
  const int* cr = col + r * W;
  const val_t* vr = val + r * W;
  for (int c = blockIdx.y; c < k; c += gridDim.y) {
    int j[W];
    acc_t v[W], xv[W];
#pragma unroll
    for (int t = 0; t < W; ++t) j[t] = CS ? __ldcs(cr + t) : RO(cr + t);
#pragma unroll
    for (int t = 0; t < W; ++t) v[t] = ld(CS ? __ldcs(vr + t) : RO(vr + t));
#pragma unroll
    for (int t = 0; t < W; ++t) xv[t] = j[t] >= 0 ? ld(RO(x + j[t] * k + c)) : (acc_t)0;
    acc_t s = 0;
#pragma unroll
    for (int t = 0; t < W; ++t) s += j[t] >= 0 ? v[t] * xv[t] : (acc_t)0;
    y[r * k + c] = st(s);
  }
}

#define ELL_P(W)                                                                                                   \
  extern "C" __global__ void ell_p##W(i64 m, i64 k, const int* col, const val_t* val, const val_t* x, val_t* y) {  \
    ell_p_body<W, false>((int)m, (int)k, col, val, x, y);                                                          \
  }                                                                                                                \
  extern "C" __global__ void ell_pcs##W(i64 m, i64 k, const int* col, const val_t* val, const val_t* x, val_t* y) { \
    ell_p_body<W, true>((int)m, (int)k, col, val, x, y);                                                           \
  }
ELL_P(1)
ELL_P(2)
ELL_P(3)
ELL_P(4)
ELL_P(5)
ELL_P(6)
ELL_P(7)
ELL_P(8)

// "stream" / "streamcs": 32 consecutive rows per warp, any width: the warp's 32 * width slots
// (contiguous, row-major) read in coalesced chunks of 32 * 8 with 8 independent loads per lane,
// products parked in shared memory and summed per row (csr_stream8 with rows of equal length).
#define ELL_STREAM_U 8
template <bool CS>
__device__ __forceinline__ void ell_stream_body(int m, int k, int width, const int* __restrict__ col,
                                                const val_t* __restrict__ val, const val_t* __restrict__ x,
                                                val_t* __restrict__ y) {
  __shared__ acc_t sp_all[CSR_STREAM_BLOCK / 32][32 * ELL_STREAM_U];
  acc_t* sp = sp_all[threadIdx.x >> 5];
  int lane = threadIdx.x & 31;
  int r0 = (blockIdx.x * CSR_STREAM_BLOCK + threadIdx.x) & ~31;
  if (r0 >= m) return;  // whole warps leave together
  int r = r0 + lane;
  int a = min(r, m) * width, b = min(r + 1, m) * width;
  int start = r0 * width, end = min(r0 + 32, m) * width;
  for (int c = blockIdx.y; c < k; c += gridDim.y) {
    acc_t s = 0;
    for (int cs = start; cs < end; cs += 32 * ELL_STREAM_U) {
      acc_t pr[ELL_STREAM_U];
#pragma unroll
      for (int u = 0; u < ELL_STREAM_U; ++u) {
        int e = cs + u * 32 + lane;
        bool in = e < end;
        int j = in ? (CS ? __ldcs(col + e) : RO(col + e)) : -1;
        acc_t v = in ? ld(CS ? __ldcs(val + e) : RO(val + e)) : (acc_t)0;
        acc_t xv = j >= 0 ? ld(RO(x + j * k + c)) : (acc_t)0;
        pr[u] = j >= 0 ? v * xv : (acc_t)0;
      }
#pragma unroll
      for (int u = 0; u < ELL_STREAM_U; ++u) sp[u * 32 + lane] = pr[u];
      __syncwarp();
      int lo = max(a, cs) - cs, hi = min(b, cs + 32 * ELL_STREAM_U) - cs;
      for (int t = lo; t < hi; ++t) s += sp[t];
      __syncwarp();
    }
    if (r < m) y[r * k + c] = st(s);
  }
}

extern "C" __global__ void __launch_bounds__(CSR_STREAM_BLOCK) ell_stream8(i64 m, i64 k, i64 width, const int* col,
                                                                         const val_t* val, const val_t* x, val_t* y) {
  ell_stream_body<false>((int)m, (int)k, (int)width, col, val, x, y);
}
extern "C" __global__ void __launch_bounds__(CSR_STREAM_BLOCK) ell_stream8cs(i64 m, i64 k, i64 width, const int* col,
                                                                           const val_t* val, const val_t* x, val_t* y) {
  ell_stream_body<true>((int)m, (int)k, (int)width, col, val, x, y);
}

// ---- DELTA(b), bit-packed, b a compile-time constant -----------------------------------------------
// Entry e's gap is the b-bit field at bit e * b of the packed words; column = previous column +
// gap + 1 (previous = -1 before a row's first entry). Group g = entries [8g, 8g + 8): its 8
// values are one 16-byte load (fp16/bf16; 2 or 4 for float32/float64) and its 8 gaps one b-byte
// load (8 * b bits). A warp per row, one group per lane per step (256 entries), the next step's
// group prefetched. Per group: the 8 fields by constant shifts, their advance summed, one warp
// scan of the advances, then 8 gathers of X. Only a row's first and last groups reach outside
// it: there the outside entries get gap 0, value 0 and X read as 0 (their columns land in the
// 8-entry pads either side of X before the row, but on the row's right they are real columns of
// X, whose inf or NaN must not reach the row; shared memory, or X clamped when read from global).
// The host pads the packed words to whole groups plus 4 spare words.
#define DELTA_PAD 8
#define VW (sizeof(val_t) / 2)  // 16-byte words per 8 values: 1 (half types), 2 (float32), 4 (float64)

struct Raw {
  union {
    uint4 q[VW];
    val_t e[8];
  } v;
  unsigned w[4];
};

template <int BITS>
__device__ __forceinline__ void load_group(const unsigned char* __restrict__ gw, const val_t* __restrict__ val, int g, int nnz,
                                           Raw& r) {
  const unsigned char* gp = gw + (i64)g * BITS;
  if (BITS == 1) r.w[0] = RO(gp);
  if (BITS == 2) r.w[0] = RO(reinterpret_cast<const unsigned short*>(gp));
  if (BITS == 4) r.w[0] = RO(reinterpret_cast<const unsigned*>(gp));
  if (BITS == 8) {
    uint2 t = RO(reinterpret_cast<const uint2*>(gp));
    r.w[0] = t.x;
    r.w[1] = t.y;
  }
  if (BITS == 16) {
    uint4 t = RO(reinterpret_cast<const uint4*>(gp));
    r.w[0] = t.x;
    r.w[1] = t.y;
    r.w[2] = t.z;
    r.w[3] = t.w;
  }
  int e0 = g * 8;
  if (e0 + 8 <= nnz) {
    const uint4* vq = reinterpret_cast<const uint4*>(val + e0);
#pragma unroll
    for (int t = 0; t < (int)VW; ++t) r.v.q[t] = RO(vq + t);
  } else {  // the matrix's last, partial group: element loads (never past nnz)
#pragma unroll
    for (int t = 0; t < 8; ++t) r.v.e[t] = e0 + t < nnz ? RO(val + e0 + t) : (val_t)0;
  }
}

__device__ __forceinline__ void unpack8(const Raw& r, acc_t* v) {
#pragma unroll
  for (int t = 0; t < 8; ++t) v[t] = ld(r.v.e[t]);
}

// Gap t (0..7) of a group's raw words.
template <int BITS>
__device__ __forceinline__ unsigned gap_field(const Raw& r, int t) {
  return (r.w[(t * BITS) >> 5] >> ((t * BITS) & 31)) & (BITS >= 32 ? FULL : ((1u << BITS) - 1u));
}

// Entries [s0, s1) of group g belong to the row [p0, p1) (groups g0 .. g1 - 1); the others are
// the neighbouring rows' (only in a row's first and last group).
__device__ __forceinline__ void group_span(int g, int g0, int g1, int p0, int p1, int& s0, int& s1) {
  s0 = g == g0 ? (p0 & 7) : 0;
  s1 = g == g1 - 1 ? p1 - 8 * g : 8;
}

// The measured default ("packed"): one group per lane per step, the next step's group prefetched.
template <int BITS, bool SMEM>
__device__ __forceinline__ void delta_fast_body(int m, int n, int k, int nnz, const idx_t* __restrict__ rowptr,
                                                const unsigned char* __restrict__ gw, const val_t* __restrict__ val,
                                                const val_t* __restrict__ x, val_t* __restrict__ y) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const val_t* xs = x;
  if (SMEM) {
    val_t* sx = reinterpret_cast<val_t*>(smem_raw);
    int tot = (n + 2 * DELTA_PAD) * k;
    for (int t = threadIdx.x; t < tot; t += blockDim.x) {
      int u = t - DELTA_PAD * k;
      sx[t] = (u >= 0 && u < n * k) ? RO(x + u) : (val_t)0;
    }
    __syncthreads();
    xs = sx + DELTA_PAD * k;
  }
  int lane = threadIdx.x & 31;
  int wpb = blockDim.x >> 5;
  for (int row = blockIdx.x * wpb + (threadIdx.x >> 5); row < m; row += gridDim.x * wpb) {
    int p0 = (int)RO(rowptr + row), p1 = (int)RO(rowptr + row + 1);
    int g0 = p0 >> 3, g1 = (p1 + 7) >> 3;
    for (int c = 0; c < k; ++c) {
      acc_t s = 0;
      int base = -1 - (p0 & 7);
      Raw nx;
      if (g0 + lane < g1) load_group<BITS>(gw, val, g0 + lane, nnz, nx);
      for (int gb = g0; gb < g1; gb += 32) {
        int g = gb + lane;
        bool act = g < g1;
        Raw cur = nx;
        if (g + 32 < g1) load_group<BITS>(gw, val, g + 32, nnz, nx);
        unsigned f[8];
        acc_t v[8];
        int tot = 0;
        int s0 = 0, s1 = 8;  // the group's entries that belong to the row: [s0, s1)
        if (act) {
#pragma unroll
          for (int t = 0; t < 8; ++t) f[t] = gap_field<BITS>(cur, t);
          unpack8(cur, v);
          group_span(g, g0, g1, p0, p1, s0, s1);
          if (s0 != 0 || s1 != 8) {
#pragma unroll
            for (int t = 0; t < 8; ++t)
              if (t < s0 || t >= s1) {
                f[t] = 0;
                v[t] = 0;
              }
          }
          tot = 8;
#pragma unroll
          for (int t = 0; t < 8; ++t) tot += (int)f[t];
        }
        int inc = tot;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          int up = __shfl_up_sync(FULL, inc, o);
          if (lane >= o) inc += up;
        }
        if (act) {
          int cc = base + inc - tot;
#pragma unroll
          for (int t = 0; t < 8; ++t) {
            cc += (int)f[t] + 1;
            int ci = SMEM ? cc : min(max(cc, 0), n - 1);
            acc_t xv = ld(xs[ci * k + c]);
            if (t < s0 || t >= s1) xv = (acc_t)0;  // another row's entry: its column is not this row's (0 * inf)
            s += v[t] * xv;
          }
        }
        base += __shfl_sync(FULL, inc, 31);
      }
      s = warp_sum(s);
      if (lane == 0) y[row * k + c] = st(s);
    }
  }
}

// UNR groups per lane per step in two passes (advances, then columns and products, decoding the
// raw words again), X copied with 16-byte loads: the "packed2" variant (UNR = 2). Not yet measured.
template <int BITS, bool SMEM, int UNR>
__device__ __forceinline__ void delta_unr_body(int m, int n, int k, int nnz, const idx_t* __restrict__ rowptr,
                                                const unsigned char* __restrict__ gw, const val_t* __restrict__ val,
                                                const val_t* __restrict__ x, val_t* __restrict__ y) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const val_t* xs = x;
  if (SMEM) {  // X (n * k values) between two pads of DELTA_PAD * k zeros; 16-byte copies when aligned
    val_t* sx = reinterpret_cast<val_t*>(smem_raw);
    val_t* dst = sx + DELTA_PAD * k;
    int nk = n * k;
    const int VPU = 16 / sizeof(val_t);
    int done = 0;
    if ((reinterpret_cast<size_t>(x) & 15) == 0) {
      int nq = nk / VPU;
      const uint4* xq = reinterpret_cast<const uint4*>(x);
      uint4* dq = reinterpret_cast<uint4*>(dst);
      for (int t = threadIdx.x; t < nq; t += blockDim.x) dq[t] = RO(xq + t);
      done = nq * VPU;
    }
    for (int t = done + threadIdx.x; t < nk; t += blockDim.x) dst[t] = RO(x + t);
    for (int t = threadIdx.x; t < DELTA_PAD * k; t += blockDim.x) {
      sx[t] = (val_t)0;
      dst[nk + t] = (val_t)0;
    }
    __syncthreads();
    xs = dst;
  }
  int lane = threadIdx.x & 31;
  int wpb = blockDim.x >> 5;
  for (int row = blockIdx.x * wpb + (threadIdx.x >> 5); row < m; row += gridDim.x * wpb) {
    int p0 = (int)RO(rowptr + row), p1 = (int)RO(rowptr + row + 1);
    int g0 = p0 >> 3, g1 = (p1 + 7) >> 3;
    for (int c = 0; c < k; ++c) {
      acc_t s = 0;
      int base = -1 - (p0 & 7);
      Raw nx[UNR];
#pragma unroll
      for (int u = 0; u < UNR; ++u)
        if (g0 + u * 32 + lane < g1) load_group<BITS>(gw, val, g0 + u * 32 + lane, nnz, nx[u]);
      for (int gb = g0; gb < g1; gb += 32 * UNR) {
        Raw cur[UNR];
#pragma unroll
        for (int u = 0; u < UNR; ++u) cur[u] = nx[u];
#pragma unroll
        for (int u = 0; u < UNR; ++u) {  // the next step's groups, in flight during this one
          int g = gb + 32 * UNR + u * 32 + lane;
          if (g < g1) load_group<BITS>(gw, val, g, nnz, nx[u]);
        }
        // pass 1: each group's column advance (fields outside the row count as gap 0)
        int tot[UNR], inc[UNR], s0[UNR], s1[UNR];
#pragma unroll
        for (int u = 0; u < UNR; ++u) {
          int g = gb + u * 32 + lane;
          tot[u] = 0;
          group_span(g, g0, g1, p0, p1, s0[u], s1[u]);
          if (g < g1) {
            tot[u] = 8;
#pragma unroll
            for (int t = 0; t < 8; ++t) tot[u] += (t >= s0[u] && t < s1[u]) ? (int)gap_field<BITS>(cur[u], t) : 0;
          }
          inc[u] = tot[u];
        }
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
#pragma unroll
          for (int u = 0; u < UNR; ++u) {
            int up = __shfl_up_sync(FULL, inc[u], o);
            if (lane >= o) inc[u] += up;
          }
        }
        // pass 2: the columns and the products (fields and values decoded again from the raw words)
#pragma unroll
        for (int u = 0; u < UNR; ++u) {
          int g = gb + u * 32 + lane;
          if (g < g1) {
            int cc = base + inc[u] - tot[u];
            acc_t v[8];
            unpack8(cur[u], v);
            bool part = s0[u] != 0 || s1[u] != 8;
#pragma unroll
            for (int t = 0; t < 8; ++t) {
              unsigned f = gap_field<BITS>(cur[u], t);
              acc_t vt = v[t];
              bool out = part && (t < s0[u] || t >= s1[u]);  // another row's entry
              if (out) {
                f = 0;
                vt = 0;
              }
              cc += (int)f + 1;
              int ci = SMEM ? cc : min(max(cc, 0), n - 1);
              acc_t xv = ld(xs[ci * k + c]);
              if (out) xv = (acc_t)0;  // its column is not this row's: an inf or NaN there must not reach it
              s += vt * xv;
            }
          }
          base += __shfl_sync(FULL, inc[u], 31);
        }
      }
      s = warp_sum(s);
      if (lane == 0) y[row * k + c] = st(s);
    }
  }
}

// delta_b<B>[_smem]: one group per lane per step (measured); delta2_b<B>[_smem]: two (512 entries
// per step, two-pass decode).
#if VAL_KIND == 3
#define DELTA_MIN_BLOCKS 1  // float64: 8 values are 16 registers; leave them room
#else
#define DELTA_MIN_BLOCKS 2  // 2 x 512 threads per SM (at most 64 registers)
#endif
#define DELTA_KERN2(NAME, B, SMEM)                                                                                     \
  extern "C" __global__ void __launch_bounds__(512, DELTA_MIN_BLOCKS) NAME(i64 m, i64 n, i64 k, i64 nnz,               \
                                                                           const idx_t* rowptr, const unsigned char* gw, \
                                                                           const val_t* val, const val_t* x, val_t* y) { \
    delta_unr_body<B, SMEM, 2>((int)m, (int)n, (int)k, (int)nnz, rowptr, gw, val, x, y);                               \
  }
#define DELTA_KERN1(NAME, B, SMEM)                                                                                     \
  extern "C" __global__ void __launch_bounds__(512) NAME(i64 m, i64 n, i64 k, i64 nnz, const idx_t* rowptr,            \
                                                         const unsigned char* gw, const val_t* val, const val_t* x,    \
                                                         val_t* y) {                                                   \
    delta_fast_body<B, SMEM>((int)m, (int)n, (int)k, (int)nnz, rowptr, gw, val, x, y);                                 \
  }
#define DELTA_FAST(B)                       \
  DELTA_KERN1(delta_b##B, B, false)         \
  DELTA_KERN1(delta_b##B##_smem, B, true)   \
  DELTA_KERN2(delta2_b##B, B, false)        \
  DELTA_KERN2(delta2_b##B##_smem, B, true)
DELTA_FAST(1)
DELTA_FAST(2)
DELTA_FAST(4)
DELTA_FAST(8)
DELTA_FAST(16)

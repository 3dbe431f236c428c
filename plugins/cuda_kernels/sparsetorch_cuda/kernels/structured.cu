// Structured formats: N:M (values + packed in-group positions) and BSR (dense blocks).
// X is (n, k) and Y is (m, k), row-major. Index buffers were validated by the host (plan.py).

#define FULL 0xffffffffu

// ---- N:M, 2:4, one right-hand side: one warp (nm24) or SPLIT warps (nm24_s<SPLIT>) per row ----------
// A row's S = n / 2 value slots; slot s lies in column group s / 2 (4 columns), at the 2-bit
// in-group position packed at bit 2 * (row * S + s) of `pos`. A lane takes chunks of 8 slots
// (16 columns): one 16-byte load of values (half types), one 16-bit load of positions, and the 16
// columns of X as two 16-byte loads (X stays in L1/L2); each slot's X value is picked from the
// window with a byte permute. Two chunks per lane per step, all loads before the FMAs. The SPLIT
// warps of a row take equal ranges of its chunks and add their sums through shared memory, so
// that 8192 rows make enough equal pieces for the SMs (blocks of NM_BLOCK threads, NM_BLOCK / 32
// / SPLIT rows each). The host launches it for n % 16 == 0 and a 16-byte-aligned X;
// float32/float64 gather X per slot.
// The chunks [qa, qe) of one row (vr: its values, pr: its packed positions), two per lane per
// step: the lane's part of the row's sum.
__device__ __forceinline__ acc_t nm24_range(const val_t* __restrict__ vr, const unsigned short* __restrict__ pr,
                                            const val_t* __restrict__ x, int qa, int qe, int lane) {
  acc_t s = 0;
  for (int qb = qa; qb < qe; qb += 64) {
    union {
      uint4 q[sizeof(val_t) / 2];
      val_t e[8];
    } vv[2];
    unsigned pw[2];
#if VAL_KIND <= 1
    uint4 xa[2], xb[2];
#endif
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      int q = qb + u * 32 + lane;
      if (q < qe) {
        const uint4* vq = reinterpret_cast<const uint4*>(vr + 8 * q);
#pragma unroll
        for (int t = 0; t < (int)(sizeof(val_t) / 2); ++t) vv[u].q[t] = RO(vq + t);
        pw[u] = RO(pr + q);
#if VAL_KIND <= 1
        const uint4* xq = reinterpret_cast<const uint4*>(x) + 2 * q;
        xa[u] = RO(xq);
        xb[u] = RO(xq + 1);
#endif
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      int q = qb + u * 32 + lane;
      if (q < qe) {
#if VAL_KIND <= 1
        unsigned r[8] = {xa[u].x, xa[u].y, xa[u].z, xa[u].w, xb[u].x, xb[u].y, xb[u].z, xb[u].w};
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          unsigned p = (pw[u] >> (2 * t)) & 3u;
          unsigned hv = __byte_perm(r[2 * (t >> 1)], r[2 * (t >> 1) + 1], p * 0x22u + 0x10u) & 0xffffu;
          s += ld(vv[u].e[t]) * ld((val_t)hv);
        }
#else
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          int p = (int)((pw[u] >> (2 * t)) & 3u);
          s += ld(vv[u].e[t]) * ld(RO(x + 16 * q + 4 * (t >> 1) + p));
        }
#endif
      }
    }
  }
  return s;
}

// nm24 ("warp"): one warp per row, blocks of 512 threads, rows grid-strided.
extern "C" __global__ void __launch_bounds__(512) nm24(i64 m_, i64 S_, const unsigned short* __restrict__ pos,
                                                       const val_t* __restrict__ val, const val_t* __restrict__ x,
                                                       val_t* __restrict__ y) {
  int m = (int)m_, S = (int)S_;
  int Q = S >> 3;
  int lane = threadIdx.x & 31;
  int wpb = blockDim.x >> 5;
  for (int row = blockIdx.x * wpb + (threadIdx.x >> 5); row < m; row += gridDim.x * wpb) {
    acc_t s = warp_sum(nm24_range(val + (i64)row * S, pos + (i64)row * Q, x, 0, Q, lane));
    if (lane == 0) y[row] = st(s);
  }
}

// nm24_s<SPLIT> ("s1" .. "s4"; "s2" the measured default): blocks of NM_BLOCK threads, SPLIT
// warps per row, each over an equal range of the row's chunks; bias[row] added when bias is not null.
#define NM_BLOCK 384
template <int SPLIT>
__device__ __forceinline__ void nm24_body(int m, int S, const unsigned short* __restrict__ pos, const val_t* __restrict__ val,
                                          const val_t* __restrict__ x, const val_t* __restrict__ bias, val_t* __restrict__ y) {
  __shared__ acc_t part[NM_BLOCK / 32];
  int Q = S >> 3;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int row = blockIdx.x * (NM_BLOCK / 32 / SPLIT) + warp / SPLIT;
  int h = warp % SPLIT;
  acc_t s = 0;
  if (row < m) {
    int qa = (int)((long long)Q * h / SPLIT), qe = (int)((long long)Q * (h + 1) / SPLIT);
    s = nm24_range(val + (i64)row * S, pos + (i64)row * Q, x, qa, qe, lane);
  }
  s = warp_sum(s);
  if (SPLIT == 1) {
    if (lane == 0 && row < m) y[row] = st(s + (bias ? ld(RO(bias + row)) : (acc_t)0));
    return;
  }
  if (lane == 0) part[warp] = s;
  __syncthreads();
  if (lane == 0 && h == 0 && row < m) {
    acc_t tot = 0;
#pragma unroll
    for (int w = 0; w < SPLIT; ++w) tot += part[warp + w];
    y[row] = st(tot + (bias ? ld(RO(bias + row)) : (acc_t)0));
  }
}

#define NM24(SP)                                                                                                       \
  extern "C" __global__ void __launch_bounds__(NM_BLOCK) nm24_s##SP(i64 m, i64 S, const unsigned short* pos,          \
                                                                   const val_t* val, const val_t* x,                  \
                                                                   const val_t* bias, val_t* y) {                     \
    nm24_body<SP>((int)m, (int)S, pos, val, x, bias, y);                                                               \
  }
NM24(1)
NM24(2)
NM24(3)
NM24(4)

// ---- N:M, any N, M (M <= 256), any number of right-hand sides: a warp per row ------------------
// slot s of row `row`: column (s / N) * M + position, the position a PB-bit field at bit
// (row * S + s) * PB of `posw`. Slots of the last group that point past column n - 1 (padding
// when M does not divide n) are skipped.
extern "C" __global__ void nm_any(i64 m, i64 n, i64 k, i64 S, i64 N, i64 M, i64 PB, const unsigned* __restrict__ posw,
                                  const val_t* __restrict__ val, const val_t* __restrict__ x, val_t* __restrict__ y) {
  i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (row >= m) return;
  unsigned mask = (1u << PB) - 1u;
  for (i64 c = blockIdx.y; c < k; c += gridDim.y) {
    acc_t s = 0;
    for (i64 t = lane; t < S; t += 32) {
      i64 slot = row * S + t;
      i64 bit = slot * PB;
      i64 p = (RO(posw + (bit >> 5)) >> (unsigned)(bit & 31)) & mask;
      i64 j = (t / N) * M + p;
      if (j < n) s += ld(RO(val + slot)) * ld(RO(x + j * k + c));  // padding of a last, partial group may point past n
    }
    s = warp_sum(s);
    if (lane == 0) y[row * k + c] = st(s);
  }
}

// ---- BSR (bh x bw blocks, row-major inside a block), VEC lanes per row --------------------------
// Row i lies in block row i / bh at block-row offset ii; its entries are, for every block b of
// that block row, the bw values at ((b * bh + ii) * bw + jj). The lanes of a row run over the
// flat index b * bw + jj, so consecutive lanes read consecutive values of a block's row.
template <int VEC>
__device__ __forceinline__ void bsr_body(i64 m, i64 n, i64 k, i64 bh, i64 bw, const idx_t* __restrict__ bptr,
                                         const idx_t* __restrict__ bcol, const val_t* __restrict__ val,
                                         const val_t* __restrict__ x, val_t* __restrict__ y) {
  i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / VEC;
  int lane = threadIdx.x & (VEC - 1);
  if (row >= m) return;
  i64 br = row / bh, ii = row - br * bh;
  i64 f0 = (i64)RO(bptr + br) * bw, f1 = (i64)RO(bptr + br + 1) * bw;
  for (i64 c = blockIdx.y; c < k; c += gridDim.y) {
    acc_t s = 0;
    for (i64 f = f0 + lane; f < f1; f += VEC) {
      i64 b = f / bw, jj = f - b * bw;
      i64 j = (i64)RO(bcol + b) * bw + jj;
      if (j < n) s += ld(RO(val + (b * bh + ii) * bw + jj)) * ld(RO(x + j * k + c));
    }
    s = group_sum<VEC>(s);
    if (lane == 0) y[row * k + c] = st(s);
  }
}

#define BSR_VEC(V)                                                                                               \
  extern "C" __global__ void bsr_vec##V(i64 m, i64 n, i64 k, i64 bh, i64 bw, const idx_t* bptr, const idx_t* bcol, \
                                        const val_t* val, const val_t* x, val_t* y) {                            \
    bsr_body<V>(m, n, k, bh, bw, bptr, bcol, val, x, y);                                                         \
  }
BSR_VEC(1)
BSR_VEC(2)
BSR_VEC(4)
BSR_VEC(8)
BSR_VEC(16)
BSR_VEC(32)

// ---- SELL-C-sigma, C = 32 (a slice is a warp's rows), built by the plan from a CSR --------------
// Slice s holds 32 consecutive rows of the (window-sorted) row order, padded to the slice's
// longest row; slot (r, t) of the slice lies at slice_ptr[s] + t * 32 + r (column-major inside
// the slice, so a warp's loads of one t are coalesced). Padding slots hold value 0 and column 0.
// With PERM, row position q of the order is matrix row perm[q] (sigma > 1 sorts rows by length
// inside windows of sigma rows so that a slice's rows have similar lengths); without it q is the
// row. A thread per row; its loads are issued four slots at a time.
template <bool PERM>
__device__ __forceinline__ void sell_body(i64 m, i64 k, i64 nslices, const i64* __restrict__ slice_ptr, const int* __restrict__ col,
                                          const val_t* __restrict__ val, const int* __restrict__ perm, const val_t* __restrict__ x,
                                          val_t* __restrict__ y) {
  i64 q = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 s = q >> 5;
  if (s >= nslices || q >= m) return;
  int r = (int)(q & 31);
  i64 base = RO(slice_ptr + s);
  int w = (int)((RO(slice_ptr + s + 1) - base) >> 5);
  i64 row = PERM ? (i64)RO(perm + q) : q;
  const int* cp = col + base + r;
  const val_t* vp = val + base + r;
  for (i64 c = blockIdx.y; c < k; c += gridDim.y) {
    acc_t acc = 0;
    int t = 0;
    for (; t + 4 <= w; t += 4) {
      int j[4];
      acc_t v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        j[u] = RO(cp + (i64)(t + u) * 32);
        v[u] = ld(RO(vp + (i64)(t + u) * 32));
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) acc += v[u] * ld(RO(x + (i64)j[u] * k + c));
    }
    for (; t < w; ++t) acc += ld(RO(vp + (i64)t * 32)) * ld(RO(x + (i64)RO(cp + (i64)t * 32) * k + c));
    y[row * k + c] = st(acc);
  }
}

extern "C" __global__ void sell32(i64 m, i64 k, i64 nslices, const i64* slice_ptr, const int* col, const val_t* val,
                                  const int* perm, const val_t* x, val_t* y) {
  sell_body<false>(m, k, nslices, slice_ptr, col, val, perm, x, y);
}
extern "C" __global__ void sell32_perm(i64 m, i64 k, i64 nslices, const i64* slice_ptr, const int* col, const val_t* val,
                                       const int* perm, const val_t* x, val_t* y) {
  sell_body<true>(m, k, nslices, slice_ptr, col, val, perm, x, y);
}

// Sparse @ dense, Y = A X, for X of shape (n, k) and Y of shape (m, k), both row-major and
// contiguous. One launch per value-batch member. Column c of Y is handled by blockIdx.y = c
// (grid-strided when k exceeds the grid), except in csr_cols, where the lanes of a warp run
// over the columns (many right-hand sides).
//
// The host (plan.py) validates every index buffer before the first launch: row pointers
// non-decreasing from 0 to nnz, columns in [0, n), DIA offsets, ELL counts <= width, DELTA gaps
// decoding to columns < n. Kernels therefore index without further checks, except DIA, whose
// diagonals run off the matrix by construction and are clipped here.

// ---- CSR, VEC lanes per row ---------------------------------------------------------------------
template <int VEC>
__device__ __forceinline__ void csr_vector(i64 m, i64 k, const idx_t* __restrict__ rowptr, const idx_t* __restrict__ col,
                                           const val_t* __restrict__ val, const val_t* __restrict__ x, val_t* __restrict__ y) {
  i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / VEC;
  int lane = threadIdx.x & (VEC - 1);
  if (row >= m) return;  // whole VEC groups leave together (blockDim is a multiple of 32)
  i64 p0 = RO(rowptr + row), p1 = RO(rowptr + row + 1);
  for (i64 c = blockIdx.y; c < k; c += gridDim.y) {
    acc_t s = 0, s2 = 0;
    i64 p = p0 + lane;
    for (; p + VEC < p1; p += 2 * VEC) {  // two independent loads in flight per lane
      idx_t j1 = RO(col + p), j2 = RO(col + p + VEC);
      acc_t v1 = ld(RO(val + p)), v2 = ld(RO(val + p + VEC));
      s += v1 * ld(RO(x + (i64)j1 * k + c));
      s2 += v2 * ld(RO(x + (i64)j2 * k + c));
    }
    if (p < p1) s += ld(RO(val + p)) * ld(RO(x + (i64)RO(col + p) * k + c));
    s = group_sum<VEC>(s + s2);
    if (lane == 0) y[row * k + c] = st(s);
  }
}

#define CSR_VEC(V)                                                                                               \
  extern "C" __global__ void csr_vec##V(i64 m, i64 k, const idx_t* rowptr, const idx_t* col, const val_t* val, \
                                        const val_t* x, val_t* y) {                                              \
    csr_vector<V>(m, k, rowptr, col, val, x, y);                                                                 \
  }
CSR_VEC(1)
CSR_VEC(2)
CSR_VEC(4)
CSR_VEC(8)
CSR_VEC(16)
CSR_VEC(32)

// ---- CSR, one warp per row, lanes over the columns of X (k >= 16) -------------------------------
extern "C" __global__ void csr_cols(i64 m, i64 k, const idx_t* __restrict__ rowptr, const idx_t* __restrict__ col,
                                    const val_t* __restrict__ val, const val_t* __restrict__ x, val_t* __restrict__ y) {
  i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (row >= m) return;
  i64 p0 = RO(rowptr + row), p1 = RO(rowptr + row + 1);
  for (i64 c0 = (i64)blockIdx.y * 32; c0 < k; c0 += (i64)gridDim.y * 32) {
    i64 c = c0 + lane;
    acc_t s = 0;
    if (c < k)
      for (i64 p = p0; p < p1; ++p) s += ld(RO(val + p)) * ld(RO(x + (i64)RO(col + p) * k + c));
    if (c < k) y[row * k + c] = st(s);
  }
}

// ---- CSR, load balanced: each warp takes `chunk` consecutive nonzeros --------------------------
// first_row[w] is the row holding nonzero w * chunk (made once per pattern). In rounds of 32
// nonzeros, each lane finds the row of its nonzero by binary search between the chunk's first
// and last rows, a segmented warp scan sums the products of each row's run of lanes, and the
// last lane of a run adds it to `out` with atomicAdd (rows split between chunks or rounds sum
// correctly). `out` is zeroed by the host and has the accumulator type (float32 for half types).
extern "C" __global__ void csr_balanced(i64 m, i64 k, i64 nnz, i64 chunk, i64 nchunks, const idx_t* __restrict__ rowptr,
                                        const idx_t* __restrict__ col, const val_t* __restrict__ val,
                                        const idx_t* __restrict__ first_row, const val_t* __restrict__ x,
                                        acc_t* __restrict__ out) {
  i64 w = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (w >= nchunks) return;
  i64 cs = w * chunk;
  i64 ce = cs + chunk < nnz ? cs + chunk : nnz;
  i64 r_lo = RO(first_row + w);
  i64 r_hi = w + 1 < nchunks ? (i64)RO(first_row + w + 1) : m - 1;
  for (i64 c = blockIdx.y; c < k; c += gridDim.y) {
    for (i64 base = cs; base < ce; base += 32) {
      i64 p = base + lane;
      bool in = p < ce;
      i64 row = -1;
      acc_t s = 0;
      if (in) {
        i64 lo = r_lo, hi = r_hi;  // largest r in [lo, hi] with rowptr[r] <= p
        while (lo < hi) {
          i64 mid = (lo + hi + 1) >> 1;
          if ((i64)RO(rowptr + mid) <= p) lo = mid;
          else hi = mid - 1;
        }
        row = lo;
        s = ld(RO(val + p)) * ld(RO(x + (i64)RO(col + p) * k + c));
      }
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        acc_t up = __shfl_up_sync(0xffffffffu, s, o);
        i64 up_row = __shfl_up_sync(0xffffffffu, row, o);
        if (lane >= o && up_row == row) s += up;
      }
      i64 next_row = __shfl_down_sync(0xffffffffu, row, 1);
      if (in && (lane == 31 || next_row != row)) atomicAdd(out + row * k + c, s);
    }
  }
}

// ---- DIA (diagonals indexed by row): val[d * m + i] = A[i, i + off[d]] ---------------------------
extern "C" __global__ void dia_rows(i64 m, i64 n, i64 k, i64 ndiag, const i64* __restrict__ offs,
                                    const val_t* __restrict__ val, const val_t* __restrict__ x, val_t* __restrict__ y) {
  extern __shared__ i64 soff[];
  for (i64 d = threadIdx.x; d < ndiag; d += blockDim.x) soff[d] = RO(offs + d);
  __syncthreads();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m) return;
  for (i64 c = blockIdx.y; c < k; c += gridDim.y) {
    acc_t s = 0;
    for (i64 d = 0; d < ndiag; ++d) {
      i64 j = i + soff[d];
      if (j >= 0 && j < n) s += ld(RO(val + d * m + i)) * ld(RO(x + j * k + c));
    }
    y[i * k + c] = st(s);
  }
}

// ---- ELL (rows padded to `width` slots, row-major): cnt[r] slots of row r are stored ------------
extern "C" __global__ void ell_rows(i64 m, i64 k, i64 width, const int* __restrict__ cnt, const idx_t* __restrict__ col,
                                    const val_t* __restrict__ val, const val_t* __restrict__ x, val_t* __restrict__ y) {
  i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= m) return;
  int c_r = RO(cnt + r);
  const idx_t* cr = col + r * width;
  const val_t* vr = val + r * width;
  for (i64 c = blockIdx.y; c < k; c += gridDim.y) {
    acc_t s = 0;
    for (int t = 0; t < c_r; ++t) s += ld(RO(vr + t)) * ld(RO(x + (i64)RO(cr + t) * k + c));
    y[r * k + c] = st(s);
  }
}

// ---- DELTA(b), bit-packed ------------------------------------------------------------------------
// Column of entry e of a row: col = col_prev + gap_e + 1 (col_prev = -1 before the first entry),
// gap_e the b-bit field at bit e * b of `words` (b divides 32, so no field straddles two words).
// A warp per row; lane l takes groups of 8 consecutive entries (global entry index, so the value
// loads are aligned), decodes their gaps, and a warp prefix sum of the per-lane column advance
// gives each lane the column it starts from.
__device__ __forceinline__ unsigned gap_at(const unsigned* __restrict__ words, i64 e, int bits, unsigned mask) {
  i64 bit = e * bits;
  return (RO(words + (bit >> 5)) >> (unsigned)(bit & 31)) & mask;
}

__device__ __forceinline__ void load8(const val_t* __restrict__ val, i64 g, i64 nnz, acc_t* v) {
  i64 e0 = g * 8;
#if VAL_KIND <= 1
  if (e0 + 8 <= nnz) {  // one 16-byte load (the host checks that `val` is 16-byte aligned)
    uint4 q = *reinterpret_cast<const uint4*>(val + e0);
    unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      v[2 * t] = ld((val_t)(w[t] & 0xffffu));
      v[2 * t + 1] = ld((val_t)(w[t] >> 16));
    }
    return;
  }
#endif
#pragma unroll
  for (int t = 0; t < 8; ++t) v[t] = e0 + t < nnz ? ld(RO(val + e0 + t)) : (acc_t)0;
}

__device__ __forceinline__ void delta_row(i64 row, int lane, i64 k, i64 nnz, i64 bits, const idx_t* __restrict__ rowptr,
                                          const unsigned* __restrict__ words, const val_t* __restrict__ val,
                                          const val_t* xs, val_t* __restrict__ y) {
  unsigned mask = bits >= 32 ? 0xffffffffu : ((1u << bits) - 1u);
  i64 p0 = RO(rowptr + row), p1 = RO(rowptr + row + 1);
  i64 g0 = p0 >> 3, g1 = (p1 + 7) >> 3;
  for (i64 c = 0; c < k; ++c) {
    acc_t s = 0;
    i64 base = -1;
    acc_t v[8], vn[8];
    if (g0 + lane < g1) load8(val, g0 + lane, nnz, vn);
    for (i64 gb = g0; gb < g1; gb += 32) {
      i64 g = gb + lane;
#pragma unroll
      for (int t = 0; t < 8; ++t) v[t] = vn[t];
      if (g + 32 < g1) load8(val, g + 32, nnz, vn);  // the next group's values, in flight during this one
      int adv[8];
      int tot = 0;
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        i64 e = g * 8 + t;
        bool in = g < g1 && e >= p0 && e < p1;
        adv[t] = in ? (int)gap_at(words, e, (int)bits, mask) + 1 : 0;
        tot += adv[t];
      }
      int inc = tot;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        int up = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += up;
      }
      if (g < g1) {
        i64 cc = base + (inc - tot);
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          if (adv[t]) {
            cc += adv[t];
            s += v[t] * ld(xs[cc * k + c]);
          }
        }
      }
      base += __shfl_sync(0xffffffffu, inc, 31);
    }
    s = warp_sum(s);
    if (lane == 0) y[row * k + c] = st(s);
  }
}

// One entry per lane instead (consecutive lanes on consecutive entries, so the gathers of X by
// one warp instruction fall on nearby columns), four rounds of 32 per step with four independent
// warp scans in flight.
__device__ __forceinline__ void delta_row_lanes(i64 row, int lane, i64 k, i64 bits, const idx_t* __restrict__ rowptr,
                                                const unsigned* __restrict__ words, const val_t* __restrict__ val,
                                                const val_t* xs, val_t* __restrict__ y) {
  unsigned mask = bits >= 32 ? 0xffffffffu : ((1u << bits) - 1u);
  i64 p0 = RO(rowptr + row), p1 = RO(rowptr + row + 1);
  for (i64 c = 0; c < k; ++c) {
    acc_t s = 0;
    i64 base = -1;
    for (i64 eb = p0; eb < p1; eb += 128) {
      int adv[4], inc[4];
      acc_t v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        i64 e = eb + u * 32 + lane;
        bool in = e < p1;
        adv[u] = in ? (int)gap_at(words, e, (int)bits, mask) + 1 : 0;
        v[u] = in ? ld(RO(val + e)) : (acc_t)0;
        inc[u] = adv[u];
      }
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          int up = __shfl_up_sync(0xffffffffu, inc[u], o);
          if (lane >= o) inc[u] += up;
        }
      }
      i64 start = base;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (adv[u]) s += v[u] * ld(xs[(start + inc[u]) * k + c]);
        start += __shfl_sync(0xffffffffu, inc[u], 31);
      }
      base = start;
    }
    s = warp_sum(s);
    if (lane == 0) y[row * k + c] = st(s);
  }
}

// X (n x k values, at most 48 KB) is copied into shared memory first when SMEM is set.
#define DELTA_KERNEL(NAME, BODY, SMEM)                                                                        \
  extern "C" __global__ void NAME(i64 m, i64 n, i64 k, i64 nnz, i64 bits, const idx_t* __restrict__ rowptr,  \
                                  const unsigned* __restrict__ words, const val_t* __restrict__ val,         \
                                  const val_t* __restrict__ x, val_t* __restrict__ y) {                      \
    extern __shared__ __align__(16) unsigned char smem_raw[];                                                 \
    const val_t* xs = x;                                                                                      \
    if (SMEM) {                                                                                               \
      val_t* sx = reinterpret_cast<val_t*>(smem_raw);                                                         \
      for (i64 t = threadIdx.x; t < n * k; t += blockDim.x) sx[t] = RO(x + t);                                \
      __syncthreads();                                                                                        \
      xs = sx;                                                                                                \
    }                                                                                                         \
    i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;                                              \
    if (row >= m) return;                                                                                     \
    BODY;                                                                                                     \
  }

DELTA_KERNEL(delta_rows, delta_row(row, threadIdx.x & 31, k, nnz, bits, rowptr, words, val, xs, y), false)
DELTA_KERNEL(delta_rows_smem, delta_row(row, threadIdx.x & 31, k, nnz, bits, rowptr, words, val, xs, y), true)
DELTA_KERNEL(delta_lanes, delta_row_lanes(row, threadIdx.x & 31, k, bits, rowptr, words, val, xs, y), false)
DELTA_KERNEL(delta_lanes_smem, delta_row_lanes(row, threadIdx.x & 31, k, bits, rowptr, words, val, xs, y), true)

// ---- cast of the accumulator buffer to the value type (csr_balanced on half types) --------------
extern "C" __global__ void cast_out(i64 count, const acc_t* __restrict__ src, val_t* __restrict__ dst) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) dst[i] = st(src[i]);
}

// ---- CSR -> COO: the row of every entry (convert.py, the core's "csr_rows" conversion step) ------
// A block takes CR_PER_BLOCK consecutive entries, whatever rows they lie in (balanced for any row
// lengths). Warps 0 and 1 find the rows of the block's first and last entry by a 32-way search of
// the pointers (each step one load per lane and a ballot: log32(m) dependent loads instead of
// log2(m)); the pointers of those rows go to shared memory when they fit (CR_ROWS, i.e. unless the
// range holds many empty rows), and each thread finds the row of each of its entries there by a
// binary search (otherwise in the pointers themselves, between the two rows). The stores of `out`
// are coalesced. The pointers are validated by the core (ptr[0] == 0, non-decreasing, ptr[m] == nnz).
#define CR_PER_BLOCK 2048
#define CR_ROWS 2048
#define CR_THREADS 256

// the row of entry e: the first i in [0, m) with ptr[i + 1] > e (one warp, every lane takes part)
__device__ __forceinline__ i64 cr_find(i64 m, const idx_t* __restrict__ ptr, i64 e) {
  const int lane = threadIdx.x & 31;
  i64 lo = 0, hi = m - 1;  // the answer lies in [lo, hi]
  while (hi > lo) {
    const i64 span = hi - lo + 1;
    const i64 step = (span + 31) / 32;        // lane L probes row lo + (L + 1) * step - 1 (the end of its part)
    const i64 r = lo + (i64)(lane + 1) * step - 1;
    const bool past = r >= hi || (i64)RO(ptr + r + 1) > e;  // the answer is at or before r
    const unsigned b = __ballot_sync(0xffffffffu, past);
    const int first = __ffs(b) - 1;          // b != 0: lane 31 probes at or past hi
    const i64 nhi = lo + (i64)(first + 1) * step - 1;
    lo = lo + (i64)first * step;
    hi = nhi < hi ? nhi : hi;
  }
  return lo;
}

extern "C" __global__ void __launch_bounds__(CR_THREADS) csr_rows(i64 m, i64 nnz, const idx_t* __restrict__ ptr, idx_t* __restrict__ out) {
  __shared__ idx_t sp[CR_ROWS + 1];
  __shared__ i64 rows[2];
  const i64 e0 = (i64)blockIdx.x * CR_PER_BLOCK;
  const i64 e1 = e0 + CR_PER_BLOCK < nnz ? e0 + CR_PER_BLOCK : nnz;
  const int warp = threadIdx.x >> 5;
  if (warp < 2) {
    const i64 r = cr_find(m, ptr, warp == 0 ? e0 : e1 - 1);
    if ((threadIdx.x & 31) == 0) rows[warp] = r;
  }
  __syncthreads();
  const i64 r0 = rows[0], nr = rows[1] - r0 + 1;  // the block's entries lie in rows r0 .. r0 + nr - 1
  if (nr <= CR_ROWS) {
    for (i64 t = threadIdx.x; t <= nr; t += CR_THREADS) sp[t] = RO(ptr + r0 + t);
    __syncthreads();
    // the thread's CR_ITEMS entries searched in lockstep (independent loads in flight): for each, the last j with
    // sp[j] <= e (sp[0] <= e0 <= e < sp[nr]); ceil(log2(nr)) halvings of [0, nr - 1], a settled search stays put
    constexpr int CR_ITEMS = CR_PER_BLOCK / CR_THREADS;
    int lo[CR_ITEMS], hi[CR_ITEMS];
#pragma unroll
    for (int i = 0; i < CR_ITEMS; ++i) {
      lo[i] = 0;
      hi[i] = (int)nr - 1;
    }
    for (int w = 1; w < (int)nr; w <<= 1) {
#pragma unroll
      for (int i = 0; i < CR_ITEMS; ++i) {
        const i64 e = e0 + threadIdx.x + i * CR_THREADS;
        const int mid = (lo[i] + hi[i] + 1) >> 1;
        if ((i64)sp[mid] <= e) lo[i] = mid; else hi[i] = mid - 1;
      }
    }
#pragma unroll
    for (int i = 0; i < CR_ITEMS; ++i) {
      const i64 e = e0 + threadIdx.x + i * CR_THREADS;
      if (e < e1) out[e] = (idx_t)(r0 + lo[i]);
    }
  } else {
    for (i64 e = e0 + threadIdx.x; e < e1; e += CR_THREADS) {
      i64 lo = r0, hi = r0 + nr - 1;
      while (lo < hi) {
        const i64 mid = (lo + hi + 1) >> 1;
        if ((i64)RO(ptr + mid) <= e) lo = mid; else hi = mid - 1;
      }
      out[e] = (idx_t)lo;
    }
  }
}

// Sampled dense-dense products on a pattern: out[slot] = sum_c P[row, c] * Q[col, c] for every
// stored entry (row, col) -- the gradient of <dY, A X> with respect to A's values is
// sddmm(P = dY, Q = X). P is (m, k), Q is (n, k), row-major and contiguous; `out` has one value
// per value slot of the format. Padding slots (ELL beyond a row's count, DIA positions off the
// matrix) get zero. Index buffers were validated by the host before the first launch.

__device__ __forceinline__ acc_t dot_rows(const val_t* __restrict__ p, const val_t* __restrict__ q, i64 k) {
  acc_t s = 0;
  for (i64 c = 0; c < k; ++c) s += ld(RO(p + c)) * ld(RO(q + c));
  return s;
}

// CSR: one thread per stored entry; row of entry p from a binary search of rowptr would cost
// log(m) reads, so a VEC-lane group walks one row instead.
template <int VEC>
__device__ __forceinline__ void csr_sddmm_vec(i64 m, i64 k, const idx_t* __restrict__ rowptr, const idx_t* __restrict__ col,
                                              const val_t* __restrict__ P, const val_t* __restrict__ Q, val_t* __restrict__ out) {
  i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / VEC;
  int lane = threadIdx.x & (VEC - 1);
  if (row >= m) return;
  i64 p0 = RO(rowptr + row), p1 = RO(rowptr + row + 1);
  const val_t* prow = P + row * k;
  for (i64 p = p0 + lane; p < p1; p += VEC) out[p] = st(dot_rows(prow, Q + (i64)RO(col + p) * k, k));
}

#define CSR_SDDMM(V)                                                                                             \
  extern "C" __global__ void csr_sddmm##V(i64 m, i64 k, const idx_t* rowptr, const idx_t* col, const val_t* P,  \
                                          const val_t* Q, val_t* out) {                                          \
    csr_sddmm_vec<V>(m, k, rowptr, col, P, Q, out);                                                              \
  }
CSR_SDDMM(1)
CSR_SDDMM(4)
CSR_SDDMM(32)

// DIA by rows: slot d * m + i holds A[i, i + off[d]].
extern "C" __global__ void dia_sddmm(i64 m, i64 n, i64 k, i64 ndiag, const i64* __restrict__ offs, const val_t* __restrict__ P,
                                     const val_t* __restrict__ Q, val_t* __restrict__ out) {
  i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= ndiag * m) return;
  i64 d = t / m, i = t - d * m;
  i64 j = i + RO(offs + d);
  out[t] = (j >= 0 && j < n) ? st(dot_rows(P + i * k, Q + j * k, k)) : st((acc_t)0);
}

// ELL: slot r * width + s, stored when s < cnt[r].
extern "C" __global__ void ell_sddmm(i64 m, i64 k, i64 width, const int* __restrict__ cnt, const idx_t* __restrict__ col,
                                     const val_t* __restrict__ P, const val_t* __restrict__ Q, val_t* __restrict__ out) {
  i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= m * width) return;
  i64 r = t / width, s = t - r * width;
  out[t] = s < RO(cnt + r) ? st(dot_rows(P + r * k, Q + (i64)RO(col + t) * k, k)) : st((acc_t)0);
}

// DELTA(b) bit-packed: a warp per row decodes the columns as delta_rows does (one entry per lane).
extern "C" __global__ void delta_sddmm(i64 m, i64 k, i64 bits, const idx_t* __restrict__ rowptr, const unsigned* __restrict__ words,
                                       const val_t* __restrict__ P, const val_t* __restrict__ Q, val_t* __restrict__ out) {
  i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (row >= m) return;
  unsigned mask = bits >= 32 ? 0xffffffffu : ((1u << bits) - 1u);
  i64 p0 = RO(rowptr + row), p1 = RO(rowptr + row + 1);
  const val_t* prow = P + row * k;
  i64 base = -1;
  for (i64 eb = p0; eb < p1; eb += 32) {
    i64 e = eb + lane;
    int adv = 0;
    if (e < p1) {
      i64 bit = e * bits;
      adv = (int)((RO(words + (bit >> 5)) >> (unsigned)(bit & 31)) & mask) + 1;
    }
    int inc = adv;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      int up = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += up;
    }
    if (e < p1) out[e] = st(dot_rows(prow, Q + (base + inc) * k, k));
    base += __shfl_sync(0xffffffffu, inc, 31);
  }
}

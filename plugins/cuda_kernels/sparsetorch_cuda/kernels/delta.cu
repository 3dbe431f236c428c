// DELTA(b) SpMV for one right-hand side (k = 1): the "chunk" kernels (session 8).
//
// The pattern is the plan's bit-packed gap stream (plan._build_delta: entry e's gap is bits
// [e * B, e * B + B) of the uint32 words, 8-entry groups rounded up to whole words, four spare
// words at the end); rowptr was validated on the host (monotone from 0 to nnz) and every row's
// gaps decode to columns inside [0, n) before any launch.
//
// A warp per row (rows strided over a persistent grid). The row's entries are cut into units of U
// entries aligned to U in the global stream (unit u: entries [u * U, u * U + U)); lane L takes
// unit u0 + 32 * step + L, so a warp step reads 32 * U entries: U values as U * sizeof(val_t) / 16
// 16-byte loads and the unit's U * B gap bits as one load, the next step's unit in flight during
// this one. One warp scan per step of the units' column advances (sum of gap + 1); inside a unit
// the columns are running sums. For B = 4 eight gaps are summed at once: the nibbles of a word are
// split into even / odd bytes and one multiply by 0x01010101 gives the four pair prefix sums (no
// byte exceeds 128), so a column costs a byte extraction and an address add.
//
// X is copied once per block into shared memory as acc_t (float for the half types: no conversion
// per gather) between two pads of DPAD zeros, when it fits (SMEM); otherwise it is read from
// global memory with the column clamped into [0, n). Entries of a unit outside the row (a row's
// first and last unit) count as gap 0 and value 0, so their columns stay inside the pads.
// Accumulation in acc_t (float32 for the half types).

#define FULL 0xffffffffu
#define DPAD 16
#define DELTA_CHUNK_BLOCK 512

template <int U, int B>
struct ChunkUnit {
  static constexpr int NB = U * B / 8;                          // gap bytes per unit
  static constexpr int NW = NB >= 4 ? NB / 4 : 1;               // gap words per unit
  static constexpr int VQ = (U * (int)sizeof(val_t) + 15) / 16;  // 16-byte value loads per unit
  union {
    uint4 q[VQ];
    unsigned u[VQ * 4];
    val_t e[VQ * 16 / sizeof(val_t)];
  } v;
  unsigned w[NW];
};

template <int U, int B>
__device__ __forceinline__ void chunk_load(const unsigned char* __restrict__ gw, const val_t* __restrict__ val, int u, int nnz,
                                           ChunkUnit<U, B>& r) {
  typedef ChunkUnit<U, B> CU;
  const unsigned char* p = gw + (size_t)u * CU::NB;
  if constexpr (CU::NB == 1) {
    r.w[0] = RO(p);
  } else if constexpr (CU::NB == 2) {
    r.w[0] = RO(reinterpret_cast<const unsigned short*>(p));
  } else if constexpr (CU::NB == 4) {
    r.w[0] = RO(reinterpret_cast<const unsigned*>(p));
  } else if constexpr (CU::NB == 8) {
    uint2 a = RO(reinterpret_cast<const uint2*>(p));
    r.w[0] = a.x;
    r.w[1] = a.y;
  } else {
#pragma unroll
    for (int i = 0; i < CU::NB / 16; ++i) {
      uint4 a = RO(reinterpret_cast<const uint4*>(p) + i);
      r.w[4 * i] = a.x;
      r.w[4 * i + 1] = a.y;
      r.w[4 * i + 2] = a.z;
      r.w[4 * i + 3] = a.w;
    }
  }
  int e0 = u * U;
  if (e0 + U <= nnz) {
#pragma unroll
    for (int i = 0; i < CU::VQ; ++i) r.v.q[i] = RO(reinterpret_cast<const uint4*>(val + e0) + i);
  } else {  // the matrix's last, partial unit: element loads (never past nnz)
#pragma unroll
    for (int t = 0; t < U; ++t) r.v.e[t] = e0 + t < nnz ? RO(val + e0 + t) : (val_t)0;
  }
}

// Entries t and t + 1 (t even) of a unit's values as acc_t: the half types from one 32-bit word
// (HADD2.F32 on each half, or two bit moves for bfloat16).
template <int U, int B>
__device__ __forceinline__ void chunk_pair(const ChunkUnit<U, B>& c, int t, acc_t& a, acc_t& b) {
#if VAL_KIND == 0
  asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
      : "=f"(a), "=f"(b)
      : "r"(c.v.u[t >> 1]));
#elif VAL_KIND == 1
  unsigned w = c.v.u[t >> 1];
  a = __uint_as_float(w << 16);
  b = __uint_as_float(w & 0xffff0000u);
#else
  a = ld(c.v.e[t]);
  b = ld(c.v.e[t + 1]);
#endif
}

// A shared-memory load of acc_t at a 32-bit shared address (the address add then folds into one LEA).
__device__ __forceinline__ acc_t chunk_lds(unsigned a) {
  acc_t r;
#if VAL_KIND == 3
  asm volatile("ld.shared.f64 %0, [%1];" : "=d"(r) : "r"(a));
#else
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(r) : "r"(a));
#endif
  return r;
}

// Ask L2 for unit u's values and gap bytes (no register holds them; the lines of 8 lanes' gaps are one request).
template <int U, int B>
__device__ __forceinline__ void chunk_prefetch(const unsigned char* gw, const val_t* val, int u) {
  constexpr unsigned VB = U * sizeof(val_t), NB = ChunkUnit<U, B>::NB;  // bytes per unit
  // one request per 128-byte line: the lane whose unit holds the line's first byte (or every lane, units of 128 or more)
  if (VB >= 128 || ((unsigned)u * VB) % 128u < VB) {
#pragma unroll
    for (unsigned o = 0; o < (VB + 127) / 128; ++o) asm volatile("prefetch.global.L2 [%0];" ::"l"(val + (size_t)u * U + o * 128 / sizeof(val_t)));
  }
  if (NB >= 128 || ((unsigned)u * NB) % 128u < NB) asm volatile("prefetch.global.L2 [%0];" ::"l"(gw + (size_t)u * NB));
}

template <int B>
__device__ __forceinline__ unsigned chunk_field(const unsigned* w, int t) {
  return (w[(t * B) >> 5] >> ((t * B) & 31)) & (B >= 32 ? FULL : ((1u << B) - 1u));
}

template <bool SMEM>
__device__ __forceinline__ acc_t chunk_x(const acc_t* xs, const val_t* __restrict__ x, int c, int n) {
  if (SMEM) return xs[c];
  return ld(RO(x + min(max(c, 0), n - 1)));
}

// NC (benchmarking only, wrong results): B = 4 with X in shared memory, the gathers read
// xs[lane + 64 j + (column >> 7)] instead (conflict-free, same decode): the cost of bank conflicts.
// PF (a variant): each lane also asks L2 to prefetch its unit of the step after next, and at a
// row's start the next row's second step (prefetch.global.L2: no register holds them), so a
// step's loads mostly find their lines in L2.
template <int U, int B, bool SMEM, bool NC = false, bool PF = false>
__device__ __forceinline__ void delta_chunk_body(int m, int n, int nnz, const idx_t* __restrict__ rowptr,
                                                 const unsigned char* __restrict__ gw, const val_t* __restrict__ val,
                                                 const val_t* __restrict__ x, val_t* __restrict__ y) {
  typedef ChunkUnit<U, B> CU;
  constexpr int NP = (B == 4) ? U / 8 : 1;  // B = 4: gap words (8 entries each) per unit
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const acc_t* xs = nullptr;
  // the warp's first row and its first step's units, loaded before X is copied (their latency overlaps the copy)
  int lane = threadIdx.x & 31;
  int stride = gridDim.x * (blockDim.x >> 5);
  int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  int p0 = 0, p1 = 0;
  if (row < m) {
    p0 = (int)RO(rowptr + row);
    p1 = (int)RO(rowptr + row + 1);
  }
  int u0 = p0 / U, u1 = (p1 + U - 1) / U;
  CU nx;
  if (u0 + lane < u1) chunk_load<U, B>(gw, val, u0 + lane, nnz, nx);
  if (SMEM) {  // X as acc_t between two pads of DPAD zeros
    acc_t* sx = reinterpret_cast<acc_t*>(smem_raw);
    acc_t* dst = sx + DPAD;
    const int VPU = 16 / (int)sizeof(val_t);
    int done = 0;
    if ((reinterpret_cast<size_t>(x) & 15) == 0) {
      int nq = n / VPU;
      const uint4* xq = reinterpret_cast<const uint4*>(x);
      for (int t = threadIdx.x; t < nq; t += blockDim.x) {
        union {
          uint4 q;
          val_t e[16 / sizeof(val_t)];
        } a;
        a.q = RO(xq + t);
#pragma unroll
        for (int i = 0; i < VPU; ++i) dst[t * VPU + i] = ld(a.e[i]);
      }
      done = nq * VPU;
    }
    for (int t = done + threadIdx.x; t < n; t += blockDim.x) dst[t] = ld(RO(x + t));
    for (int t = threadIdx.x; t < DPAD; t += blockDim.x) {
      sx[t] = (acc_t)0;
      dst[n + t] = (acc_t)0;
    }
    __syncthreads();
    xs = dst;
  }
  const unsigned xs_u32 = SMEM ? (unsigned)__cvta_generic_to_shared(xs) : 0u;
  while (row < m) {
    // the next row's bounds; its first step's units are loaded during this row's last step
    int nrow = row + stride;
    int q0 = 0, q1 = 0;
    if (nrow < m) {
      q0 = (int)RO(rowptr + nrow);
      q1 = (int)RO(rowptr + nrow + 1);
    }
    int v0 = q0 / U, v1 = (q1 + U - 1) / U;
    if (PF && v0 + 32 + lane < v1) chunk_prefetch<U, B>(gw, val, v0 + 32 + lane);  // the next row's second step
    int base = u0 * U - p0;  // the column "before" the row's first unit: its entries before p0 step by 1
    acc_t s = 0, s2 = 0;  // two sums: shorter FMA chains
    if (u0 >= u1 && v0 + lane < v1) chunk_load<U, B>(gw, val, v0 + lane, nnz, nx);  // an empty row
    for (int ub = u0; ub < u1; ub += 32) {
      int u = ub + lane;
      bool act = u < u1;
      CU cur = nx;
      if (ub + 32 < u1) {
        if (u + 32 < u1) chunk_load<U, B>(gw, val, u + 32, nnz, nx);
        if (PF && u + 64 < u1) chunk_prefetch<U, B>(gw, val, u + 64);
      } else if (v0 + lane < v1) {
        chunk_load<U, B>(gw, val, v0 + lane, nnz, nx);
      }
      int tot = 0;
      unsigned P[NP], E[NP];
      int s0 = 0, s1 = U;  // the unit's entries that belong to the row: [s0, s1)
      if (act) {
        s0 = max(p0 - u * U, 0);
        s1 = min(p1 - u * U, U);
        if (s0 != 0 || s1 != U) {  // a row's first or last unit: the other rows' entries become gap 0, value 0
#pragma unroll
          for (int t = 0; t < U; ++t)
            if (t < s0 || t >= s1) {
              cur.w[(t * B) >> 5] &= ~((B >= 32 ? FULL : ((1u << B) - 1u)) << ((t * B) & 31));
              cur.v.e[t] = (val_t)0;
            }
        }
        if constexpr (B == 4) {
#pragma unroll
          for (int i = 0; i < NP; ++i) {
            unsigned lo = cur.w[i] & 0x0F0F0F0Fu, hi = (cur.w[i] >> 4) & 0x0F0F0F0Fu;
            P[i] = (lo + hi + 0x02020202u) * 0x01010101u;  // byte j: sum of gap + 1 over entries 0 .. 2j + 1
            E[i] = P[i] - hi - 0x01010101u;                 // byte j: the same over entries 0 .. 2j
            tot += (int)(P[i] >> 24);
          }
        } else {
          tot = U;
#pragma unroll
          for (int t = 0; t < U; ++t) tot += (int)chunk_field<B>(cur.w, t);
        }
      }
      int inc = tot;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        int up = __shfl_up_sync(FULL, inc, o);
        if (lane >= o) inc += up;
      }
      if (act) {
        int cs = base + inc - tot - 1;  // entry t's column: cs + (sum of gap + 1 over entries 0 .. t)
        if constexpr (B == 4) {
#pragma unroll
          for (int i = 0; i < NP; ++i) {
            const unsigned xb = xs_u32 + (unsigned)cs * (unsigned)sizeof(acc_t);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              unsigned ce = __byte_perm(E[i], 0, 0x4440 + j), co = __byte_perm(P[i], 0, 0x4440 + j);
              acc_t xe, xo;
              if (NC) {
                xe = xs[lane + 64 * j + (ce >> 7)];
                xo = xs[lane + 64 * j + 32 + (co >> 7)];
              } else if (SMEM) {
                xe = chunk_lds(xb + ce * (unsigned)sizeof(acc_t));
                xo = chunk_lds(xb + co * (unsigned)sizeof(acc_t));
              } else {
                xe = chunk_x<false>(xs, x, cs + (int)ce, n);
                xo = chunk_x<false>(xs, x, cs + (int)co, n);
              }
              // entries outside the row read X at columns of no entry of theirs: their X is zeroed
              // (not only their value), so an inf or NaN there cannot reach this row (0 * inf)
              const int te = 8 * i + 2 * j;
              if (te < s0 || te >= s1) xe = (acc_t)0;
              if (te + 1 < s0 || te + 1 >= s1) xo = (acc_t)0;
              acc_t ve, vo;
              chunk_pair<U, B>(cur, te, ve, vo);
              s += ve * xe;
              s2 += vo * xo;
            }
            cs += (int)(P[i] >> 24);
          }
        } else {
#pragma unroll
          for (int t = 0; t < U; ++t) {
            cs += (int)chunk_field<B>(cur.w, t) + 1;
            acc_t xv = chunk_x<SMEM>(xs, x, cs, n);
            if (t < s0 || t >= s1) xv = (acc_t)0;  // an entry outside the row (see above)
            s += ld(cur.v.e[t]) * xv;
          }
        }
      }
      base += __shfl_sync(FULL, inc, 31);
    }
    s += s2;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(FULL, s, o);
    if (lane == 0) y[row] = st(s);
    row = nrow;
    p0 = q0;
    p1 = q1;
    u0 = v0;
    u1 = v1;
  }
}

// delta_c<U>_b<B>[_smem][_pf]: units of U entries per lane, b = B; "_smem": X in shared memory (the
// host passes (n + 2 * DPAD) * sizeof(acc_t) bytes of dynamic shared memory); "_pf": with the L2
// prefetches (PF above).
#if VAL_KIND == 3
#define DELTA_CHUNK_MIN_BLOCKS 1
#else
#define DELTA_CHUNK_MIN_BLOCKS 2
#endif
#define DELTA_CHUNK1(NAME, U, B, SMEM, ...) DELTA_CHUNK1M(NAME, DELTA_CHUNK_MIN_BLOCKS, U, B, SMEM, __VA_ARGS__)
#define DELTA_CHUNK1M(NAME, MINB, U, B, SMEM, ...)                                                                     \
  extern "C" __global__ void __launch_bounds__(DELTA_CHUNK_BLOCK, MINB)                                                \
      NAME(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned char* gw, const val_t* val, const val_t* x,      \
           val_t* y) {                                                                                                 \
    delta_chunk_body<U, B, SMEM __VA_ARGS__>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y);                         \
  }
#define DELTA_CHUNK(U, B)                                          \
  DELTA_CHUNK1(delta_c##U##_b##B, U, B, false)                     \
  DELTA_CHUNK1(delta_c##U##_b##B##_smem, U, B, true)               \
  DELTA_CHUNK1(delta_c##U##_b##B##_pf, U, B, false, , false, true) \
  DELTA_CHUNK1(delta_c##U##_b##B##_smem_pf, U, B, true, , false, true)
DELTA_CHUNK(8, 1)
DELTA_CHUNK(8, 2)
DELTA_CHUNK(8, 4)
DELTA_CHUNK(8, 8)
DELTA_CHUNK(8, 16)
DELTA_CHUNK(16, 1)
DELTA_CHUNK(16, 2)
DELTA_CHUNK(16, 4)
DELTA_CHUNK(16, 8)
DELTA_CHUNK(16, 16)
// benchmarking only (wrong results): conflict-free gathers, see NC above
DELTA_CHUNK1(delta_c16_b4_smem_nc, 16, 4, true, , true)
DELTA_CHUNK1(delta_c8_b4_smem_nc, 8, 4, true, , true)
// a variant ("chunk8_o3"): three blocks of 512 threads per SM (at most 40 registers), units of 8
#if VAL_KIND != 3
DELTA_CHUNK1M(delta_c8_b4_smem_o3, 3, 8, 4, true)
#endif

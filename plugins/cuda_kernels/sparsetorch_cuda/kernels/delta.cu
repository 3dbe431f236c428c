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

// The products of one unit (lane): entry t's column is cs + (sum of gap + 1 over entries 0 .. t);
// CHK: entries outside [s0, s1) read X as zero (a row's boundary steps only; see the caller).
template <int U, int B, bool SMEM, bool NC, bool CHK>
__device__ __forceinline__ void chunk_gather(const ChunkUnit<U, B>& cur, const unsigned* P, const unsigned* E, int cs, int s0,
                                             int s1, int lane, const acc_t* xs, unsigned xs_u32, const val_t* __restrict__ x,
                                             int n, acc_t& s, acc_t& s2) {
  if constexpr (B == 4) {
    constexpr int NP = U / 8;
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
        const int te = 8 * i + 2 * j;
        if (CHK) {
          if (te < s0 || te >= s1) xe = (acc_t)0;
          if (te + 1 < s0 || te + 1 >= s1) xo = (acc_t)0;
        }
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
      if (CHK && (t < s0 || t >= s1)) xv = (acc_t)0;
      s += ld(cur.v.e[t]) * xv;
    }
  }
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
      // entries outside the row read X at columns of no entry of theirs: their X is zeroed (not only
      // their value), so an inf or NaN there cannot reach this row (0 * inf). With X in shared memory
      // the entries before the row's first entry land in the left pad, so only a row's last step
      // needs the per-entry check; with X in global memory (clamped columns) its first step too.
      const bool chk = (ub + 32 >= u1) || (!SMEM && ub == u0);
      if (act) {
        if (chk)
          chunk_gather<U, B, SMEM, NC, true>(cur, P, E, base + inc - tot - 1, s0, s1, lane, xs, xs_u32, x, n, s, s2);
        else
          chunk_gather<U, B, SMEM, NC, false>(cur, P, E, base + inc - tot - 1, s0, s1, lane, xs, xs_u32, x, n, s, s2);
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
// benchmarking only (session 9, launched directly by profile_s9_delta.py): one block of 1024 threads
// per SM (one copy of X per SM instead of two; the body reads blockDim)
extern "C" __global__ void __launch_bounds__(1024, 1)
    delta_c8_b4_smem_k1024(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned char* gw, const val_t* val, const val_t* x,
                           val_t* y) {
  delta_chunk_body<8, 4, true>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y);
}
#endif

// ------------------------------------------------------------------------------------------------
// DELTA(4), half types, one right-hand side: the "tile" kernels (session 9). Consecutive lanes take
// consecutive entries, so the 32 gathers of a step fall in a narrow window of X (bank conflicts:
// ~1.4 wavefronts per gather at 50 % density with X in shared memory as 16-bit values, against
// ~3.5 when each lane takes 8 consecutive entries).
//
// Layout (built by the plan from the validated pattern, _delta.DeltaMixin._tile_layout): each row's
// entries are cut into tiles of up to 256 (the last one of a row partial), tiles of a row
// contiguous, rows in order. tileptr[r] .. tileptr[r + 1]: row r's tiles; toff[t]: the entry
// index of tile t's first entry (toff[T] = nnz), so tile t holds entries toff[t] .. toff[t + 1];
// the values are read where they lie (no copy). Lane L takes entries 32 j + L (j = 0 .. 7) of a
// tile; their 4-bit gaps are word 32 t + L of tw: entry j's nibble at bits 8 j (j < 4) or
// 8 (j - 4) + 4 (j >= 4), zero for entries past the tile's end. wrow[w] .. wrow[w + 1]: the rows
// of warp w (contiguous; balanced by tiles by the plan; nw = grid * 16 warps).
//
// Columns: column(entry) = column(entry before the tile) + sum of (gap + 1) over the tile's
// entries up to it. Per step j the lanes' prefix sums come from warp scans: the 8 fields of a lane
// (gap + 1 <= 16) are scanned as bytes (Kogge-Stone steps 1, 2, 4: a lane then holds the sum over 8
// lanes, <= 128), then as 16-bit pairs (steps 8, 16: sums <= 512); the scanned fields plus the steps before and the tile's start give
// each entry's byte offset in shared memory (16 bits each, two per register), so an entry costs a
// PRMT (its offset), the LDS, the conversions and the FMA. Entries past a row's end (its last,
// partial tile) are neither loaded nor gathered.
//
// X is copied once per block into shared memory (16-bit values as they are: XF = false; or as float:
// XF = true); the host launches these only when n * sizeof <= 48 KB (so every byte offset fits 16
// bits with room for the partial tile's zero gaps). PD = 2: two tiles' loads in flight.
//
// Measured (session 9, H200, 8192 x 8192, one right-hand side; results/cuda_delta_h200_s9*.json):
// slower than the chunk kernel, so not a default. fp16 50 %: tile 41.7 us, tile_p1 40.1, tile_f
// 45.0 against chunk 31.4; 10 %: 13.5-16.8 against 11.3. The gathers are conflict-free as modelled
// (Nsight Compute: 1.43 shared wavefronts per gather against chunk's 3.6), but a tile issues ~187
// warp instructions per 256 entries (chunk ~150: the 18 shuffles of the scans and their adds, 8
// scalar value loads) at the same low IPC (0.64 per scheduler), with long-scoreboard stalls first.
#if VAL_KIND <= 1
#define TILE_BLOCK 512

struct TileBuf {
  unsigned g;     // the lane's gap word
  unsigned v[8];  // the lane's 8 values (16-bit patterns)
  int cnt;        // the tile's entries (1 .. 256)
};

__device__ __forceinline__ void tile_load(const unsigned* __restrict__ tw, const unsigned short* __restrict__ vb, int t, int off,
                                          int cnt, int lane, TileBuf& b) {
  b.g = RO(tw + (size_t)t * 32 + lane);
  b.cnt = cnt;
  const unsigned short* p = vb + off + lane;
  if (cnt >= 256) {
#pragma unroll
    for (int j = 0; j < 8; ++j) b.v[j] = RO(p + 32 * j);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) b.v[j] = 32 * j + lane < cnt ? (unsigned)RO(p + 32 * j) : 0u;
  }
}

__device__ __forceinline__ float tile_cvt(unsigned h) {
#if VAL_KIND == 0
  float f;
  asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %1;\n\tcvt.f32.f16 %0, l;\n\t}" : "=f"(f) : "r"(h));
  return f;
#else
  return __uint_as_float(h << 16);
#endif
}

template <bool XF>
__device__ __forceinline__ float tile_x(unsigned a) {
  if (XF) {
    float r;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(r) : "r"(a));
    return r;
  } else {
    unsigned short h;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(h) : "r"(a));
    return tile_cvt((unsigned)h);
  }
}

// v += v of the lane o below (in the same segment of 32 - (C >> 8) lanes; none for the first o lanes):
// the shuffle's own predicate guards the add (one instruction fewer than a select).
template <unsigned C>
__device__ __forceinline__ void tile_scan_add(unsigned& v, int o) {
  asm("{\n\t.reg .pred p;\n\t.reg .b32 t;\n\tshfl.sync.up.b32 t|p, %0, %1, %2, -1;\n\t@p add.u32 %0, %0, t;\n\t}"
      : "+r"(v)
      : "r"(o), "n"(C));
}

// One tile's products into s / s2; base: the column before the tile (updated to its last entry's).
template <bool XF, bool PART>
__device__ __forceinline__ void tile_body(const TileBuf& c, int lane, unsigned xs2, int& base, float& s, float& s2) {
  constexpr unsigned SH = XF ? 2 : 1;  // log2 of X's bytes per entry in shared memory
  unsigned ra = (c.g & 0x0F0F0F0Fu) + 0x01010101u, rb = ((c.g >> 4) & 0x0F0F0F0Fu) + 0x01010101u;
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) {  // bytes: steps 0..3 (ra), 4..7 (rb); after o = 4 a lane holds the sum of 8 lanes
    tile_scan_add<0>(ra, o);
    tile_scan_add<0>(rb, o);
  }
  unsigned h[4] = {__byte_perm(ra, 0, 0x5150), __byte_perm(ra, 0, 0x5352), __byte_perm(rb, 0, 0x5150),
                   __byte_perm(rb, 0, 0x5352)};  // steps (2k, 2k + 1) as 16-bit fields
#pragma unroll
  for (int o = 8; o < 32; o <<= 1) {
#pragma unroll
    for (int k = 0; k < 4; ++k) tile_scan_add<0>(h[k], o);
  }
  unsigned a = (unsigned)base;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    unsigned tk = __shfl_sync(FULL, h[k], 31);  // the steps' sums (2k, 2k + 1)
    // byte offsets of steps 2k (low half) and 2k + 1 (high half): X's base + (a + prefix) << SH
    unsigned r = (h[k] << SH) + a * (0x10001u << SH) + xs2 + (tk << (16 + SH));
    a += (tk * 0x10001u) >> 16;
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int j = 2 * k + q;
      unsigned off = __byte_perm(r, 0, q ? 0x4432 : 0x4410);
      if (!PART || 32 * j + lane < c.cnt) {
        float xv = tile_x<XF>(off), vv = tile_cvt(c.v[j]);
        if (q)
          s2 += vv * xv;
        else
          s += vv * xv;
      }
    }
  }
  base = (int)a;
}

template <bool XF, int PD>
__device__ __forceinline__ void delta_tile_body(int m, int n, int nw, const int* __restrict__ tileptr, const int* __restrict__ toff,
                                                const int* __restrict__ wrow, const unsigned* __restrict__ tw,
                                                const val_t* __restrict__ val, const val_t* __restrict__ x, val_t* __restrict__ y) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int lane = threadIdx.x & 31;
  const int w = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const unsigned short* vb = reinterpret_cast<const unsigned short*>(val);
  int r = 0, r1 = 0, t = 0, t1 = 0;
  if (w < nw) {
    r = RO(wrow + w);
    r1 = RO(wrow + w + 1);
    t = RO(tileptr + r);
    t1 = RO(tileptr + r1);
  }
  const int T = RO(tileptr + m);  // tiles in all
  // the first PD tiles' loads before X is copied (their latency overlaps the copy)
  int o[PD + 2];
#pragma unroll
  for (int i = 0; i < PD + 2; ++i) o[i] = RO(toff + min(t + i, T));
  TileBuf A, Bq;
  if (t < t1) tile_load(tw, vb, t, o[0], o[1] - o[0], lane, A);
  if (PD > 1 && t + 1 < t1) tile_load(tw, vb, t + 1, o[1], o[2] - o[1], lane, Bq);
  int on = o[PD], on1 = o[PD + 1];  // toff of the next tile to load and of the one after
  {
    if (XF) {
      float* dst = reinterpret_cast<float*>(smem_raw);
      for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = ld(RO(x + i));
    } else {
      unsigned short* dst = reinterpret_cast<unsigned short*>(smem_raw);
      int done = 0;
      if ((reinterpret_cast<size_t>(x) & 15) == 0) {
        const int nq = n >> 3;
        for (int i = threadIdx.x; i < nq; i += blockDim.x) reinterpret_cast<uint4*>(dst)[i] = RO(reinterpret_cast<const uint4*>(x) + i);
        done = nq << 3;
      }
      for (int i = done + threadIdx.x; i < n; i += blockDim.x) dst[i] = RO(x + i);
    }
    __syncthreads();
  }
  if (w >= nw) return;
  const unsigned xs2 = (unsigned)__cvta_generic_to_shared(smem_raw) * 0x10001u;
  // the current row r (its last tile te - 1); rows without tiles get 0
  int te = r < r1 ? RO(tileptr + r + 1) : t1;
  while (r < r1 && te == t) {
    if (lane == 0) y[r] = st(0.f);
    ++r;
    te = r < r1 ? RO(tileptr + r + 1) : t1;
  }
  int ten = r + 1 < r1 ? RO(tileptr + r + 2) : t1;  // the next row's end
  int base = -1;
  float s = 0.f, s2 = 0.f;
  auto step = [&](TileBuf& buf, int tt) {
    TileBuf cur = buf;
    if (tt + PD < t1) {
      tile_load(tw, vb, tt + PD, on, on1 - on, lane, buf);
      on = on1;
      on1 = RO(toff + min(tt + PD + 2, T));
    }
    if (cur.cnt >= 256)
      tile_body<XF, false>(cur, lane, xs2, base, s, s2);
    else
      tile_body<XF, true>(cur, lane, xs2, base, s, s2);
    if (tt + 1 == te) {  // the row's last tile: its sum, then the next row with tiles
      float v = s + s2;
#pragma unroll
      for (int q = 16; q > 0; q >>= 1) v += __shfl_xor_sync(FULL, v, q);
      if (lane == 0) y[r] = st(v);
      s = s2 = 0.f;
      base = -1;
      int prev = te;
      ++r;
      te = ten;
      while (r < r1 && te == prev) {
        if (lane == 0) y[r] = st(0.f);
        ++r;
        te = r < r1 ? RO(tileptr + r + 1) : t1;
      }
      ten = r + 1 < r1 ? RO(tileptr + r + 2) : t1;
    }
  };
  if (PD > 1) {
    for (; t < t1; t += 2) {
      step(A, t);
      if (t + 1 < t1) step(Bq, t + 1);
    }
  } else {
    for (; t < t1; ++t) step(A, t);
  }
  for (; r < r1; ++r)  // rows after the last tile (none: every row left has no tiles)
    if (lane == 0) y[r] = st(0.f);
}

#define DELTA_TILE(NAME, XF, PD)                                                                                        \
  extern "C" __global__ void __launch_bounds__(TILE_BLOCK, 2)                                                          \
      NAME(i64 m, i64 n, i64 nw, const int* tileptr, const int* toff, const int* wrow, const unsigned* tw, const val_t* val, \
           const val_t* x, val_t* y) {                                                                                 \
    delta_tile_body<XF, PD>((int)m, (int)n, (int)nw, tileptr, toff, wrow, tw, val, x, y);                                \
  }
DELTA_TILE(delta_t_b4, false, 2)
DELTA_TILE(delta_t_b4_f, true, 2)
DELTA_TILE(delta_t_b4_p1, false, 1)
#endif

// ------------------------------------------------------------------------------------------------
// DELTA(4), half types, one right-hand side: the "tc" kernels (session 10). The chunk kernel's
// layout (a warp per row on a persistent grid, units of U = 8 or 16 entries aligned to U in the
// global stream, lane L on unit u0 + 32 * step + L: U values as 16-byte loads, the unit's gaps as
// one 4- or 8-byte load, the next step's unit in flight, the next row's first step loaded during
// a row's last step), with fewer instructions per entry:
//
// - X in shared memory as the 16-bit values themselves (n * 2 bytes between two pads of TC_PAD
//   zeros; the copy is a plain 16-byte copy, half the chunk kernel's 32 KB for n = 8192);
// - the products on the tensor cores: one mma.m16n8k16 (f32 accumulate) per 4 entries of a lane,
//   of which only the diagonal is used: lane l = 4 r + q puts its entries' values in A's row r
//   (registers a0, a2; rows r + 8 zero) and their X in B's column r (b0, b1), so D[r][r] sums the
//   16 products of lanes 4 r .. 4 r + 3; the other elements of D are discarded. Per pair of
//   entries: one PRMT packing the two X halves, half an mma, no conversions (the products are
//   exact, the sum in float32);
// - the column offsets inside a unit from the gaps alone (not gap + 1): byte j of
//   (lo + hi) * 0x02020202 is twice the gap sum over entries 0 .. 2 j + 1 (at most 240), so an
//   entry's shared-memory address is a PRMT and an add, its "+ 1" per entry an immediate of the load;
// - a row's first and last steps (warp-uniform) take a second path that zeroes the values and the
//   X of entries outside the row (other rows' entries in a boundary unit, lanes past the row's last
//   unit), so an inf / NaN in X at a column no entry of the row stores cannot reach the row; entries
//   before the row's start land in the left pad, those after it at most 2 U - 1 columns past the
//   row's last column (TC_PAD >= 2 U keeps every address inside the copy).
//
// Needs (n + 2 * TC_PAD) * 2 bytes <= 48 KB (the host checks; otherwise the plan runs "chunk").
//
// Measured (session 10, H200, 8192 x 8192, one right-hand side; results/cuda_delta_h200_s10*.json): the
// same time as the chunk kernel within noise although the inner loop issues ~85 warp instructions per
// 256 entries against ~110 (fp16 50 %: tc8 31.2 us, chunk 31.3-31.8; 10 %: 11.1-11.2 against 11.3; 30 %:
// 20.7-20.9 against 20.8-21.1), so the instruction count is not what limits either. Units of 16: 32.4 us at
// 50 %. Tried and removed: three blocks per SM (40 registers: 40.0 us at 50 %, 13.9 at 10 %), and a warp
// per row without the persistent loop or the copy of X (X through L1, 2 or 4 units per lane and step as
// csr16_warp does: 34.5 / 39.7 us at 50 %, 15.6 / 18.0 at 10 %).
#if VAL_KIND <= 1
#define TC_PAD 32

template <int U>
struct TcUnit {
  union {
    uint4 q[U / 8];
    unsigned u[U / 2];
    unsigned short h[U];
  } v;
  unsigned w[U / 8];
  int b;  // UB (tc8pkb): the column before the unit's first entry, from the plan's unit bases
};

template <int U, bool UB = false>
__device__ __forceinline__ void tc_load(const unsigned* __restrict__ gw, const val_t* __restrict__ val, int u, int nnz, TcUnit<U>& r,
                                        const short* __restrict__ ubase = nullptr) {
  if constexpr (UB) r.b = (int)RO(ubase + (size_t)u * (U / 8));  // units of 16: every other base
  if constexpr (U == 8) {
    r.w[0] = RO(gw + u);
  } else {
    uint2 a = RO(reinterpret_cast<const uint2*>(gw) + u);
    r.w[0] = a.x;
    r.w[1] = a.y;
  }
  const int e0 = u * U;
  if (e0 + U <= nnz) {
#pragma unroll
    for (int i = 0; i < U / 8; ++i) r.v.q[i] = RO(reinterpret_cast<const uint4*>(val) + (size_t)u * (U / 8) + i);
  } else {  // the matrix's last, partial unit: element loads (never past nnz)
#pragma unroll
    for (int t = 0; t < U; ++t) r.v.h[t] = e0 + t < nnz ? RO(reinterpret_cast<const unsigned short*>(val) + e0 + t) : (unsigned short)0;
  }
}

// PFD (session 13, "tc8pkbf": 2 steps ahead): ask L2 for unit u's values, gap word (and base): chunk_prefetch with
// 4 gap bytes per unit, one request per 128-byte line
template <int U, bool UB>
__device__ __forceinline__ void tc_prefetch(const unsigned* gw, const val_t* val, const short* ubase, int u) {
  chunk_prefetch<U, 4>(reinterpret_cast<const unsigned char*>(gw), val, u);
  if (UB && ((u * (U / 8)) & 63) == 0) asm volatile("prefetch.global.L2 [%0];" ::"l"(ubase + (size_t)u * (U / 8)));
}

// PRMT with the selector's sign-replicate bits (CUDA's __byte_perm uses 3 bits per selector nibble)
__device__ __forceinline__ unsigned tc_prmt(unsigned a, unsigned b, unsigned sel) {
  unsigned r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// (tc_mma and tc_diag: kernels/common.cuh)
// (the constant part of the address folds into the load's immediate offset)
__device__ __forceinline__ unsigned tc_lds(unsigned a) {
  unsigned short h;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(h) : "r"(a));
  return (unsigned)h;
}

// v += v of the lane o below (none for the first o lanes): the shuffle's own predicate guards the add
__device__ __forceinline__ void tc_scan_add(int& v, int o) {
  asm("{\n\t.reg .pred p;\n\t.reg .b32 t;\n\tshfl.sync.up.b32 t|p, %0, %1, 0, -1;\n\t@p add.s32 %0, %0, t;\n\t}" : "+r"(v) : "r"(o));
}

// The products of one unit. xb: the shared address of X at the column before the unit; EDGE: mask[i]
// keeps (all ones) or drops (zero) the halves of the value / X pairs (entries outside the row).
// pf (PROBE builds only, benchmarking: wrong results): 64 gathers at conflict-free addresses (lane L reads word L of a
// 128-byte row of X per gather), 128 no gathers (X taken as 1.0)
template <int U, bool EDGE>
__device__ __forceinline__ void tc_unit(const TcUnit<U>& c, const unsigned* P2, const unsigned* E2, unsigned xb, const unsigned* mask,
                                        float (&acc)[4], int pf = 0, unsigned ncb = 0) {
#pragma unroll
  for (int i = 0; i < U / 8; ++i) {
    unsigned xh[8];
    if (pf & 128) {
#pragma unroll
      for (int j = 0; j < 8; ++j) xh[j] = 0x3C00u;
    } else if (pf & 64) {
#pragma unroll
      for (int j = 0; j < 8; ++j) xh[j] = tc_lds(ncb + 128u * (8 * i + j) + (__byte_perm(P2[i], 0, 0x4440) & 2u));
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // entries 2 j, 2 j + 1 of the word: column offset 2 * (gap sum) + 2 * (index + 1) bytes
        xh[2 * j] = tc_lds(xb + __byte_perm(E2[i], 0, 0x4440 + j) + 4 * j + 2);
        xh[2 * j + 1] = tc_lds(xb + __byte_perm(P2[i], 0, 0x4440 + j) + 4 * j + 4);
      }
    }
    unsigned b[4], a[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      b[j] = __byte_perm(xh[2 * j], xh[2 * j + 1], 0x5410);
      a[j] = c.v.u[4 * i + j];
      if (EDGE) {
        b[j] &= mask[4 * i + j];
        a[j] &= mask[4 * i + j];
      }
    }
    tc_mma(acc, a[0], a[1], b[0], b[1]);
    tc_mma(acc, a[2], a[3], b[2], b[3]);
    xb += (P2[i] >> 24) + 16;  // 2 * (gap sum + 8): the next word's base
  }
}

// Programmatic dependent launch (session 11, the "p" kernels; launch.py): griddepcontrol.launch_dependents
// at the start (the next kernel of the stream, if launched with PDL, may be scheduled as this one's blocks
// exit) and griddepcontrol.wait before the first read of the values or X and before any write of Y (only the
// row pointers, the plan's own pattern copy, are read before it). No-ops where the launch has no PDL.
__device__ __forceinline__ void dl_trigger() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void dl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// PROBE (session 14, benchmarking only: delta_tc8pkbx_b4, wrong results): parts switched off by ``flags``: 1 returns
// right after griddepcontrol.wait, 2 skips the copy of X into shared memory, 4 the barrier after it, 8 the stores
// of Y, 16 the row-pointer reads of the rows after the first (later rows read as empty), 32 returns after the
// barrier (launch, row pointers, X copy). Compiled out of every other build.
// Session 18 (delta_tc8pkbfrx_b4, the same for tc8pkbfr): 64 the X gathers at conflict-free addresses, 128 no X
// gathers (X read as 1.0), 256 no value / gap / base loads after a row's first step (its registers reused; unsafe:
// stale bases can send gathers past the copy of X, an illegal address on the 10 % matrix, so the probe leaves it out).
// RP (session 14, "tc8pkbr" / "tc8pkbfr"): lane j reads the row pointers of the warp's row j (row0 + j stride) once,
// before griddepcontrol.wait (the plan's own array), and each next row's pair comes by a shuffle instead of a load
// issued one row ahead (rows past the warp's 32nd: loads as before). The probe (skeleton_probe_h200_s14.json) put
// that chain at 1.3 of the 5.0 us a call costs on an 8192^2 matrix with one entry.
template <int U, bool PDLK = false, bool L2PF = false, bool UB = false, int PFD = 0, bool PROBE = false, bool RP = false>
__device__ __forceinline__ void delta_tc_body(int m, int n, int nnz, const idx_t* __restrict__ rowptr, const unsigned* __restrict__ gw,
                                              const val_t* __restrict__ val, const val_t* __restrict__ x, val_t* __restrict__ y,
                                              const short* __restrict__ ubase = nullptr, int flags = 0) {
  typedef TcUnit<U> CU;
  constexpr int NW = U / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  if (PDLK) dl_trigger();
  const int lane = threadIdx.x & 31;
  const int stride = gridDim.x * (blockDim.x >> 5);
  int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  int p0 = 0, p1 = 0;
  int rpa = 0, rpb = 0;  // RP: the row pointers of the warp's row `lane`
  if (RP) {
    const long long r = (long long)row + (long long)lane * stride;
    if (r < m) {
      rpa = (int)RO(rowptr + r);
      rpb = (int)RO(rowptr + r + 1);
    }
    p0 = __shfl_sync(FULL, rpa, 0);
    p1 = __shfl_sync(FULL, rpb, 0);
  } else if (row < m) {
    p0 = (int)RO(rowptr + row);
    p1 = (int)RO(rowptr + row + 1);
  }
  int u0 = p0 / U, u1 = (p1 + U - 1) / U;
  if (L2PF) {
    // L2 prefetches before the wait (no register is written, so no stale value can be read: L2 is where every
    // SM's writes meet, and a line written after its prefetch is simply rewritten there): the warp's first
    // step (values and gap words; one request per 128-byte line) and X (one line per thread)
    const int u = u0 + lane;
    if (u < u1 && (lane == 0 || (u & 7) == 0)) asm volatile("prefetch.global.L2 [%0];" ::"l"(val + (size_t)u * U));
    if (u < u1 && (lane == 0 || (u & 31) == 0)) asm volatile("prefetch.global.L2 [%0];" ::"l"(gw + (size_t)u * (U / 8)));
    if (threadIdx.x * 64 < (unsigned)n) asm volatile("prefetch.global.L2 [%0];" ::"l"(x + threadIdx.x * 64));
  }
  if (PDLK) dl_wait();  // the row pointers only before it
  if (PROBE && (flags & 1)) return;
  CU nx;
  if (u0 + lane < u1) tc_load<U, UB>(gw, val, u0 + lane, nnz, nx, ubase);
  if (!PROBE || !(flags & 2)) {  // X as 16-bit values between two pads of TC_PAD zeros
    unsigned short* sx = reinterpret_cast<unsigned short*>(smem_raw);
    unsigned short* dst = sx + TC_PAD;
    const unsigned short* xh = reinterpret_cast<const unsigned short*>(x);
    int done = 0;
    if ((reinterpret_cast<size_t>(x) & 15) == 0) {
      const int nq = n >> 3;
      for (int t = threadIdx.x; t < nq; t += blockDim.x) reinterpret_cast<uint4*>(dst)[t] = RO(reinterpret_cast<const uint4*>(x) + t);
      done = nq << 3;
    }
    for (int t = done + threadIdx.x; t < n; t += blockDim.x) dst[t] = RO(xh + t);
    for (int t = threadIdx.x; t < TC_PAD; t += blockDim.x) {
      sx[t] = 0;
      dst[n + t] = 0;
    }
  }
  if (!PROBE || !(flags & 4)) __syncthreads();
  if (PROBE && (flags & 32)) return;
  if (row >= m) return;
  const unsigned xs0 = (unsigned)__cvta_generic_to_shared(smem_raw) + 2u * TC_PAD;  // X[0]
  int it = 0;  // RP: the index of this row among the warp's rows (warp-uniform)
  while (row < m) {
    const int nrow = row + stride;
    int q0 = 0, q1 = 0;
    ++it;
    if (RP && it < 32) {  // every lane takes part (the loop is warp-uniform); zeros past m
      q0 = __shfl_sync(FULL, rpa, it);
      q1 = __shfl_sync(FULL, rpb, it);
    } else if (nrow < m && (!PROBE || !(flags & 16))) {
      q0 = (int)RO(rowptr + nrow);
      q1 = (int)RO(rowptr + nrow + 1);
    }
    const int v0 = q0 / U, v1 = (q1 + U - 1) / U;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    int base = u0 * U - p0 - 1;  // the column before the row's first unit (its entries before p0 step by 1)
#pragma unroll
    for (int j = 1; j < PFD; ++j)  // the next row's steps 1 .. PFD - 1 (step 0 is loaded into registers)
      if (v0 + 32 * j + lane < v1) tc_prefetch<U, UB>(gw, val, ubase, v0 + 32 * j + lane);
    if (u0 >= u1 && v0 + lane < v1) tc_load<U, UB>(gw, val, v0 + lane, nnz, nx, ubase);  // an empty row
    for (int ub = u0; ub < u1; ub += 32) {
      const int u = ub + lane;
      CU cur = nx;
      if (ub + 32 < u1) {
        if (u + 32 < u1 && !(PROBE && (flags & 256))) tc_load<U, UB>(gw, val, u + 32, nnz, nx, ubase);
        if (PFD && u + 32 * PFD < u1) tc_prefetch<U, UB>(gw, val, ubase, u + 32 * PFD);  // PFD steps ahead, into L2
      } else if (v0 + lane < v1 && !(PROBE && (flags & 256))) {
        tc_load<U, UB>(gw, val, v0 + lane, nnz, nx, ubase);
      }
      const bool edge = ub == u0 || ub + 32 >= u1;  // warp-uniform: a row's first or last step
      unsigned mask[U / 2];
      if (edge) {  // entries outside [s0, s1) of the unit (all of a lane past the row's last unit): gap 0, value 0, X 0
        const bool act = u < u1;
        const int s0 = act ? max(p0 - u * U, 0) : 0, s1 = act ? min(p1 - u * U, U) : 0;
        unsigned long long keep = (~0ull << (4 * s0)) & (s1 >= 16 ? ~0ull : ~(~0ull << (4 * s1)));
        if (!act) keep = 0ull;
#pragma unroll
        for (int i = 0; i < NW; ++i) {
          const unsigned k = (unsigned)(keep >> (32 * i));
          cur.w[i] &= k;
          mask[4 * i] = tc_prmt(k << 4, k, 0xCC88u);  // halves: entries 2 j (nibble 2 j), 2 j + 1 (nibble 2 j + 1)
          mask[4 * i + 1] = tc_prmt(k << 4, k, 0xDD99u);
          mask[4 * i + 2] = tc_prmt(k << 4, k, 0xEEAAu);
          mask[4 * i + 3] = tc_prmt(k << 4, k, 0xFFBBu);
        }
      }
      unsigned P2[NW], E2[NW];
      int tot = 0;
#pragma unroll
      for (int i = 0; i < NW; ++i) {
        const unsigned lo = cur.w[i] & 0x0F0F0F0Fu, hi = (cur.w[i] >> 4) & 0x0F0F0F0Fu;
        P2[i] = (lo + hi) * 0x02020202u;  // byte j: 2 * (gap sum over entries 0 .. 2 j + 1)
        E2[i] = P2[i] - (hi << 1);         // byte j: 2 * (gap sum over entries 0 .. 2 j)
        tot += (int)(P2[i] >> 25) + 8;
      }
      if constexpr (UB) {  // the unit's base from the plan (no scan): the row's first unit counts its entries before p0
        const int cb = u >= u1 ? 0 : (u == u0 ? u * U - p0 - 1 : cur.b);
        const unsigned xb = xs0 + 2u * (unsigned)cb;
        if (edge)
          tc_unit<U, true>(cur, P2, E2, xb, mask, acc, PROBE ? flags : 0, xs0 + 4u * lane);
        else
          tc_unit<U, false>(cur, P2, E2, xb, mask, acc, PROBE ? flags : 0, xs0 + 4u * lane);
        continue;
      }
      if (edge && u >= u1) tot = 0;  // lanes past the row: no advance (their addresses stay near the row's end)
      int inc = tot;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) tc_scan_add(inc, o);
      const unsigned xb = xs0 + 2u * (unsigned)(base + inc - tot);
      if (edge)
        tc_unit<U, true>(cur, P2, E2, xb, mask, acc, PROBE ? flags : 0, xs0 + 4u * lane);
      else
        tc_unit<U, false>(cur, P2, E2, xb, mask, acc, PROBE ? flags : 0, xs0 + 4u * lane);
      base += __shfl_sync(FULL, inc, 31);
    }
    float s = tc_diag(acc, lane);  // the diagonal, summed over the warp
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
    if (lane == 0 && (!PROBE || !(flags & 8))) y[row] = st(s);
    row = nrow;
    p0 = q0;
    p1 = q1;
    u0 = v0;
    u1 = v1;
  }
}

// delta_tc<U>_b4: units of U entries per lane; the host passes (n + 2 TC_PAD) * 2 bytes (16-byte rounded)
#define DELTA_TC(NAME, U, MINB)                                                                                       \
  extern "C" __global__ void __launch_bounds__(DELTA_CHUNK_BLOCK, MINB)                                               \
      NAME(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned* gw, const val_t* val, const val_t* x, val_t* y) { \
    delta_tc_body<U>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y);                                                \
  }
DELTA_TC(delta_tc8_b4, 8, 2)
DELTA_TC(delta_tc16_b4, 16, 2)
// session 11 ("tc8p"): delta_tc8_b4 with programmatic dependent launch (dl_trigger / dl_wait above)
extern "C" __global__ void __launch_bounds__(DELTA_CHUNK_BLOCK, 2)
    delta_tc8p_b4(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned* gw, const val_t* val, const val_t* x, val_t* y) {
  delta_tc_body<8, true>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y);
}
// "tc8pf": tc8p with L2 prefetches of the first step and of X before griddepcontrol.wait (L2PF above)
extern "C" __global__ void __launch_bounds__(DELTA_CHUNK_BLOCK, 2)
    delta_tc8pf_b4(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned* gw, const val_t* val, const val_t* x, val_t* y) {
  delta_tc_body<8, true, true>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y);
}
// "tc8p5": tc8p in blocks of 256 threads, five per SM (at most 48 registers: 40 warps per SM against 32)
extern "C" __global__ void __launch_bounds__(256, 5)
    delta_tc8p5_b4(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned* gw, const val_t* val, const val_t* x, val_t* y) {
  delta_tc_body<8, true>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y);
}
// "tc8pk": tc8p in one block of 1024 threads per SM (one copy of X per SM; the body reads blockDim)
extern "C" __global__ void __launch_bounds__(1024, 1)
    delta_tc8pk_b4(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned* gw, const val_t* val, const val_t* x, val_t* y) {
  delta_tc_body<8, true>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y);
}
// session 13 ("tc8pkb"): tc8pk with each unit's base column read from the plan (2 bytes per unit of 8 entries:
// _delta.unit_bases) instead of a warp scan of the units' column advances per step
extern "C" __global__ void __launch_bounds__(1024, 1)
    delta_tc8pkb_b4(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned* gw, const val_t* val, const val_t* x, val_t* y,
                    const short* ubase) {
  delta_tc_body<8, true, false, true>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y, ubase);
}
// session 14 ("tc8pkbr" / "tc8pkbfr"): tc8pkb / tc8pkbf with the warp's row pointers read once (RP above)
extern "C" __global__ void __launch_bounds__(1024, 1)
    delta_tc8pkbr_b4(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned* gw, const val_t* val, const val_t* x, val_t* y,
                     const short* ubase) {
  delta_tc_body<8, true, false, true, 0, false, true>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y, ubase);
}
extern "C" __global__ void __launch_bounds__(1024, 1)
    delta_tc8pkbfr_b4(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned* gw, const val_t* val, const val_t* x, val_t* y,
                      const short* ubase) {
  delta_tc_body<8, true, false, true, 2, false, true>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y, ubase);
}
// session 14, benchmarking only: tc8pkb with parts switched off by flags (PROBE above; wrong results)
extern "C" __global__ void __launch_bounds__(1024, 1)
    delta_tc8pkbx_b4(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned* gw, const val_t* val, const val_t* x, val_t* y,
                     const short* ubase, i64 flags) {
  delta_tc_body<8, true, false, true, 0, true>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y, ubase, (int)flags);
}
// session 18, benchmarking only: tc8pkbfr with parts switched off by flags (PROBE above; wrong results)
extern "C" __global__ void __launch_bounds__(1024, 1)
    delta_tc8pkbfrx_b4(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned* gw, const val_t* val, const val_t* x, val_t* y,
                       const short* ubase, i64 flags) {
  delta_tc_body<8, true, false, true, 2, true, true>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y, ubase, (int)flags);
}
// with L2 prefetches of the step after next ("tc8pkbf"; on tc8pk (without bases) they made it slower, three steps
// ahead slower too; units of 16 with every other base slower too: NOTES.md, session 13)
extern "C" __global__ void __launch_bounds__(1024, 1)
    delta_tc8pkbf_b4(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned* gw, const val_t* val, const val_t* x, val_t* y,
                     const short* ubase) {
  delta_tc_body<8, true, false, true, 2>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y, ubase);
}
// session 12: one block of 1024 threads per SM with units of 16 ("tc16pk": half the sequential steps of a row, for
// the low densities where a warp's ~2 rows of ~3 steps each are a chain of load latencies) and with the L2
// prefetches before the wait ("tc8pkf", "tc16pkf")
extern "C" __global__ void __launch_bounds__(1024, 1)
    delta_tc16pk_b4(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned* gw, const val_t* val, const val_t* x, val_t* y) {
  delta_tc_body<16, true>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y);
}
extern "C" __global__ void __launch_bounds__(1024, 1)
    delta_tc8pkf_b4(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned* gw, const val_t* val, const val_t* x, val_t* y) {
  delta_tc_body<8, true, true>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y);
}
extern "C" __global__ void __launch_bounds__(1024, 1)
    delta_tc16pkf_b4(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned* gw, const val_t* val, const val_t* x, val_t* y) {
  delta_tc_body<16, true, true>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y);
}
#endif


// ------------------------------------------------------------------------------------------------
// DELTA(4), half types, one right-hand side: the "tq" kernels (session 11). The tc8 kernel's work per
// step (a warp per row on a persistent grid, units of 8 entries aligned to 8 in the global stream, lane
// L on unit u0 + 32 * step + L, products on the tensor cores, X as 16-bit values in shared memory), but
// the units' values and gap words reach the lanes through a ring of S stages in shared memory filled by
// cp.async (16 bytes of values and the 4-byte gap word per lane and step, no registers held), so S - 1
// steps are in flight instead of one, across row boundaries: each warp's steps form one stream (its rows
// row0, row0 + stride, ..., each row's steps u0, u0 + 32, ... < u1; rows without entries have no step)
// that a producer walks S - 1 steps ahead of the consumer. Each lane copies and reads back only its own
// slots, so cp.async.wait_group (per thread) is the only synchronization the ring needs; the producer
// refills the slot consumed one step earlier, whose values the lane has already used.
//
// Per warp and stage TQ_STAGE bytes: the 32 units' values (512) then their gap words (128). Shared memory:
// X ((n + 2 TC_PAD) * 2 bytes rounded to 16) then 16 warps * S * TQ_STAGE bytes (the host opts in above
// 48 KB). X is copied with cp.async too (16-byte aligned X and n % 8 == 0; otherwise plain copies), in
// the first commit group, so it arrives with the first steps' loads. The matrix's last, partial unit
// copies only the values below nnz (cp.async's source size; the rest of the 16 bytes zero-filled).
// Boundary steps as in tc8: entries outside the row (and lanes past the row's last unit, whose slots
// hold stale data) get gap 0, value 0 and X 0. PDLK: programmatic dependent launch as in tc8p.
//
// Measured (session 11, H200, 8192 x 8192, one right-hand side, CUDA graph of 20 calls;
// results/cuda_delta_h200_s11d*.json): slower than tc8 (fp16 50 %: tq4p 34.5 us, tq3 / tq4 / tq3p / tq6p
// 34.5-35.6, tq4p3 42.6, against tc8 30.9-31.1; 10 %: 12.6-13.5 against 11.1). Nsight Compute (50 %): the
// ring cuts tc8's long-scoreboard stalls (2.02 -> 0.82 per issued instruction) but adds 29 % instructions
// (20.8M against 16.2M), and tc8's first stall is the X gathers' short scoreboard (4.2 per issue, 3.5 shared
// wavefronts per gather), so more bytes in flight do not pay. Of the tc8p builds (PDL, same body), tc8pk (one
// block of 1024 threads per SM) was the fastest at 10 % and 30 % and within 0.2 us of tc8pf at 50 % (29.7 /
// 10.2 / 19.7 us against tc8's 30.9 / 11.2 / 20.7): the default for the half types since session 11;
// tc8p5 (five blocks of 256, 47 registers) was slower (36.8 / 12.2 / 24.6).
#if VAL_KIND <= 1
#define TQ_STAGE 640

__device__ __forceinline__ void tq_cp16(unsigned dst, const void* src, unsigned src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void tq_cp4(unsigned dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void tq_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void tq_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ uint4 tq_lds128(unsigned a) {
  uint4 r;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(a));
  return r;
}
__device__ __forceinline__ unsigned tq_lds32(unsigned a) {
  unsigned r;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(r) : "r"(a));
  return r;
}

// row r's unit range [a, b) (units of 8); a row without entries gets a == b; rows past m none
__device__ __forceinline__ void tq_bounds(const idx_t* __restrict__ rowptr, int m, int r, int& a, int& b) {
  a = b = 0;
  if (r < m) {
    const int q0 = (int)RO(rowptr + r), q1 = (int)RO(rowptr + r + 1);
    a = q0 >> 3;
    b = q1 > q0 ? (q1 + 7) >> 3 : a;
  }
}

template <int S, bool PDLK>
__device__ __forceinline__ void delta_tq_body(int m, int n, int nnz, const idx_t* __restrict__ rowptr, const unsigned* __restrict__ gw,
                                              const val_t* __restrict__ val, const val_t* __restrict__ x, val_t* __restrict__ y) {
  typedef TcUnit<8> CU;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  if (PDLK) dl_trigger();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int stride = gridDim.x * (blockDim.x >> 5);
  const int row0 = blockIdx.x * (blockDim.x >> 5) + warp;
  // the producer: its row, next unit and end, and the bounds of the row after it (loaded a row ahead)
  int prow = row0, pu, pu1, pn0, pn1;
  tq_bounds(rowptr, m, prow, pu, pu1);
  tq_bounds(rowptr, m, prow + stride, pn0, pn1);
  // the consumer's first row (the same)
  int row = row0, c0 = pu, c1 = pu1;
  if (PDLK) dl_wait();  // the row pointers only before it
  const unsigned xbytes = ((unsigned)(n + 2 * TC_PAD) * 2u + 15u) & ~15u;
  const unsigned sbase = (unsigned)__cvta_generic_to_shared(smem_raw);
  const unsigned ring = sbase + xbytes + (unsigned)warp * (S * TQ_STAGE);
  {  // X as 16-bit values between two pads of TC_PAD zeros (cp.async where aligned: group 0 with the first step)
    unsigned short* sx = reinterpret_cast<unsigned short*>(smem_raw);
    unsigned short* dst = sx + TC_PAD;
    const unsigned short* xh = reinterpret_cast<const unsigned short*>(x);
    int done = 0;
    if ((reinterpret_cast<size_t>(x) & 15) == 0) {  // dst: 2 * TC_PAD = 64 bytes in, 16-byte aligned
      const int nq = n >> 3;
      for (int t = threadIdx.x; t < nq; t += blockDim.x) tq_cp16(sbase + 2u * TC_PAD + 16u * t, reinterpret_cast<const uint4*>(x) + t, 16u);
      done = nq << 3;
    }
    for (int t = done + threadIdx.x; t < n; t += blockDim.x) dst[t] = RO(xh + t);
    for (int t = threadIdx.x; t < TC_PAD; t += blockDim.x) {
      sx[t] = 0;
      dst[n + t] = 0;
    }
  }
  while (prow < m && pu >= pu1) {  // rows without entries: no steps
    prow += stride;
    pu = pn0;
    pu1 = pn1;
    tq_bounds(rowptr, m, prow + stride, pn0, pn1);
  }
  // one producer step into stage slot (then one commit group, empty past the warp's last row)
  auto produce = [&](int slot) {
    if (prow < m) {
      const int u = pu + lane;
      if (u < pu1) {
        const unsigned d = ring + (unsigned)slot * TQ_STAGE;
        const int e0 = u << 3;
        const int rem = nnz - e0;
        tq_cp16(d + 16u * lane, val + e0, rem >= 8 ? 16u : 2u * (unsigned)rem);
        tq_cp4(d + 512u + 4u * lane, gw + u);
      }
      pu += 32;
      while (prow < m && pu >= pu1) {
        prow += stride;
        pu = pn0;
        pu1 = pn1;
        tq_bounds(rowptr, m, prow + stride, pn0, pn1);
      }
    }
    tq_commit();
  };
  produce(0);  // group 0: X and the first step
#pragma unroll
  for (int s = 1; s < S - 1; ++s) produce(s);
  tq_wait<S - 2>();  // group 0 (X) complete in this thread
  __syncthreads();
  if (row0 >= m) {
    tq_wait<0>();
    return;
  }
  const unsigned xs0 = sbase + 2u * TC_PAD;  // X[0]
  int cslot = 0, pslot = S - 1;
  int q0 = 0, q1 = 0;  // the consumer's next row's bounds (loaded a row ahead)
  tq_bounds(rowptr, m, row + stride, q0, q1);
  while (row < m) {
    const int p0 = (int)RO(rowptr + row), p1 = (int)RO(rowptr + row + 1);
    const int u0 = c0, u1 = c1;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    int base = u0 * 8 - p0 - 1;
    for (int ub = u0; ub < u1; ub += 32) {
      const int u = ub + lane;
      produce(pslot);
      pslot = pslot == S - 1 ? 0 : pslot + 1;
      tq_wait<S - 1>();  // this step's group complete (in this thread: its own slots)
      CU cur;
      const unsigned d = ring + (unsigned)cslot * TQ_STAGE;
      cslot = cslot == S - 1 ? 0 : cslot + 1;
      cur.v.q[0] = tq_lds128(d + 16u * lane);
      cur.w[0] = tq_lds32(d + 512u + 4u * lane);
      const bool edge = ub == u0 || ub + 32 >= u1;
      unsigned mask[4];
      if (edge) {
        const bool act = u < u1;
        const int s0 = act ? max(p0 - u * 8, 0) : 0, s1 = act ? min(p1 - u * 8, 8) : 0;
        unsigned keep = (~0u << (4 * s0)) & (s1 >= 8 ? ~0u : ~(~0u << (4 * s1)));
        if (!act) keep = 0u;
        cur.w[0] &= keep;
        mask[0] = tc_prmt(keep << 4, keep, 0xCC88u);
        mask[1] = tc_prmt(keep << 4, keep, 0xDD99u);
        mask[2] = tc_prmt(keep << 4, keep, 0xEEAAu);
        mask[3] = tc_prmt(keep << 4, keep, 0xFFBBu);
      }
      unsigned P2[1], E2[1];
      const unsigned lo = cur.w[0] & 0x0F0F0F0Fu, hi = (cur.w[0] >> 4) & 0x0F0F0F0Fu;
      P2[0] = (lo + hi) * 0x02020202u;
      E2[0] = P2[0] - (hi << 1);
      int tot = (int)(P2[0] >> 25) + 8;
      if (edge && u >= u1) tot = 0;
      int inc = tot;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) tc_scan_add(inc, o);
      const unsigned xb = xs0 + 2u * (unsigned)(base + inc - tot);
      if (edge)
        tc_unit<8, true>(cur, P2, E2, xb, mask, acc);
      else
        tc_unit<8, false>(cur, P2, E2, xb, mask, acc);
      base += __shfl_sync(FULL, inc, 31);
    }
    if (u0 < u1) {
      const int r = lane >> 2;
      float s = (lane & 3) == (r >> 1) ? ((r & 1) ? acc[1] : acc[0]) : 0.f;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
      if (lane == 0) y[row] = st(s);
    } else if (lane == 0) {
      y[row] = st(0.f);  // a row without entries
    }
    row += stride;
    c0 = q0;
    c1 = q1;
    tq_bounds(rowptr, m, row + stride, q0, q1);
  }
  tq_wait<0>();
}

// delta_tq<S>[p]_b4: a ring of S stages ("p": programmatic dependent launch); the host passes
// xbytes + 16 * S * TQ_STAGE bytes of dynamic shared memory (blocks of 512 threads)
#define DELTA_TQ(NAME, S, PDLK, MINB)                                                                                 \
  extern "C" __global__ void __launch_bounds__(DELTA_CHUNK_BLOCK, MINB)                                               \
      NAME(i64 m, i64 n, i64 nnz, const idx_t* rowptr, const unsigned* gw, const val_t* val, const val_t* x, val_t* y) { \
    delta_tq_body<S, PDLK>((int)m, (int)n, (int)nnz, rowptr, gw, val, x, y);                                          \
  }
DELTA_TQ(delta_tq3_b4, 3, false, 2)
DELTA_TQ(delta_tq4_b4, 4, false, 2)
DELTA_TQ(delta_tq3p_b4, 3, true, 2)
DELTA_TQ(delta_tq4p_b4, 4, true, 2)
DELTA_TQ(delta_tq6p_b4, 6, true, 2)
// three blocks of 512 threads per SM (at most 40 registers)
DELTA_TQ(delta_tq4p3_b4, 4, true, 3)
#endif

// Tensor-core SpMM for half types (float16 / bfloat16 values, float32 accumulation): Y^T = X^T A^T
// for a sparse A (m x n) and a right-hand side of k columns given as X^T (k x n, row-major: the
// layout of a linear layer's input), Y^T (k x m, row-major) written, bias fused.
//
// "Load as sparse, compute as dense": a block owns BM = 128 (or 64) rows of A and MMA_BB = 64 columns
// of X; it walks the columns of A in tiles of MMA_BK = 64. Per tile the rows' entries are read from
// global memory (loaded two tiles ahead), scattered into a dense BM x 64 tile in shared memory
// (each row zeroed first by the 8 lanes that fill it), and the tile is multiplied with the X^T
// tile by mma.sync m16n8k16 (f16/bf16 in, f32 accumulate). BM / 16 warps, each a 32 (X columns)
// x 32 (A rows) piece of the block's output: 2 x 4 mma per 16-wide step.
//
// The column tiles of A are split S ways (S = 1, 2, 4, 8: spmm_mma*_s<S>) across the S blocks of a
// thread-block cluster (sm_90): each block's float32 partial sums go to its shared memory, and after
// a cluster barrier every block sums its share of the output over the S blocks' shared memories
// (distributed shared memory, mapa + ld.shared::cluster), adds the bias and stores. S spreads a
// short, wide A (4096 rows: 32 row blocks) over the SMs without a global workspace.
//
// CSR (spmm_mma_s<S>): entries in CSR order, columns as uint16 (n < 65535), and per (tile, row)
// the offset of the row's first entry at or after the tile's first column, relative to the row's
// start: toff[t * m + r] (uint16, t = 0 .. T), so the row's entries of tile t are
// [rowptr[r] + toff[t*m + r], rowptr[r] + toff[(t+1)*m + r]). Eight lanes per row, a warp's 16 rows
// in four passes; two entries per lane prefetched, the rest of a long row read at scatter time.
// N:M 2:4 (spmm_mma24_s<S>): the values in slot order (S2 = n / 2 slots per row) and 2-bit
// in-group positions packed 16 per uint32; tile t of a row is its slots [32 t, 32 t + 32): eight
// lanes take four slots each (one 8-byte value load, one byte of positions). The host launches
// these for n % 8 == 0, k <= 65535 * 64, X^T 16-byte aligned (n % 64 == 0 for 2:4).
#if VAL_KIND <= 1

#define MMA_BB 64
#define MMA_BK 64
#define MMA_LD 72    // shared row stride of the X and A tiles (halves): conflict-free fragment loads
#define MMA_MAX_TILES 64  // column tiles per block (CSR: their offsets are staged in shared memory)
// shared memory: the X and A tiles, then the CSR tile offsets; the float32 partial sums (row
// stride BM + 8) overlay them after the loop

__device__ __forceinline__ void mma16816(float* d, const unsigned* a, const unsigned* b) {
#if VAL_KIND == 0
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}


// Loads of the tile loop as volatile asm: issued where they are written (two tiles before their
// use), never moved next to it by the compiler; the registers are waited on at first use only.
__device__ __forceinline__ uint4 ldp_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ldp_v2(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ unsigned ldp_u32(const void* p) {
  unsigned v;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ unsigned ldp_u16(const void* p) {
  unsigned short v;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

template <int S, bool NM, int BM>
__device__ __forceinline__ void spmm_mma_body(int m, int n, int k, int T, const int* __restrict__ rowptr,
                                              const unsigned short* __restrict__ toff, const void* __restrict__ idx,
                                              const val_t* __restrict__ val, const val_t* __restrict__ xt,
                                              const val_t* __restrict__ bias, val_t* __restrict__ yt, int flags) {
  constexpr int THREADS = 2 * BM;  // BM / 16 warps: 2 (X columns) x BM / 32 (rows of A)
  constexpr int PLD = BM + 8;
  constexpr int TILES_BYTES = (MMA_BB + BM) * MMA_LD * 2;
  constexpr int LOOP_BYTES = TILES_BYTES + (MMA_MAX_TILES + 1) * BM * 2;
  constexpr int SMEM = LOOP_BYTES > MMA_BB * PLD * 4 ? LOOP_BYTES : MMA_BB * PLD * 4;
  constexpr int XR = MMA_BB * 8 / THREADS;  // 16-byte pieces of the X^T tile per thread
  __shared__ __align__(16) unsigned char smem[SMEM];
  val_t* Xs = reinterpret_cast<val_t*>(smem);   // [MMA_BB][MMA_LD]
  val_t* Ws = Xs + MMA_BB * MMA_LD;             // [BM][MMA_LD]
  float* P = reinterpret_cast<float*>(smem);    // [MMA_BB][PLD], after the tiles
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int gl = lane & 7, grp = lane >> 3;
  int rank = 0;
#if __CUDA_ARCH__ >= 900
  if (S > 1) rank = (int)cluster_rank();
#endif
  const int row0 = (int)(blockIdx.x / S) * BM;
  const int b0 = (int)blockIdx.y * MMA_BB;
  const int ta = (int)((long long)T * rank / S), te = (int)((long long)T * (rank + 1) / S);
  const int wm = warp & 1, wn = warp >> 1;
  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;

  const int rbase = warp * 16 + grp;  // the thread's rows (scatter): rbase + 4 p, p = 0..3
  int base[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    int r = row0 + rbase + p * 4;
    base[p] = (!NM && r < m) ? RO(rowptr + r) : 0;
  }
  // CSR: the tile offsets of the block's rows for tiles ta .. te, in shared memory, loaded once
  // (so that no load of the tile loop waits for another load)
  unsigned short* Ts = reinterpret_cast<unsigned short*>(smem + TILES_BYTES);  // [te - ta + 1][BM]
  if (!NM) {
    const int nq = (te - ta + 1) * BM;
    for (int q0 = 0; q0 < nq; q0 += 8 * THREADS) {  // eight loads in flight per thread
      unsigned short tv[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        int q = q0 + u * THREADS + tid;
        int tt = q / BM, r = row0 + (q - tt * BM);
        tv[u] = (q < nq && r < m) ? RO(toff + (i64)(ta + tt) * m + r) : (unsigned short)0;
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        int q = q0 + u * THREADS + tid;
        if (q < nq) Ts[q] = tv[u];
      }
    }
    __syncthreads();
  }
  const unsigned short* col = reinterpret_cast<const unsigned short*>(idx);
  const unsigned* posw = reinterpret_cast<const unsigned*>(idx);

  // what one tile needs from global memory, loaded two tiles ahead: the X^T tile (two 16-byte
  // pieces per thread) and the entries of the thread's four rows (CSR: the first two of each
  // row's range, the rest read at scatter time; N:M: four slots per row)
  struct Pref {
    uint4 xr[XR];
    unsigned pc[4][2];
    unsigned pv[4][2];
    unsigned pp[4];
  };
  auto load = [&](int t, Pref& f) {
    if (flags & 4) {
#pragma unroll
      for (int p = 0; p < 4; ++p) f.pc[p][0] = f.pc[p][1] = NM ? 0u : 0xffffffffu;
      f.xr[0] = f.xr[1] = make_uint4(0u, 0u, 0u, 0u);
      return;
    }
#pragma unroll
    for (int s = 0; s < XR; ++s) {
      int q = tid + s * THREADS;
      int r = q >> 3, c8 = q & 7;
      int gc = t * MMA_BK + c8 * 8, b = b0 + r;
      if (b < k && gc < n) f.xr[s] = ldp_v4(xt + (i64)b * n + gc);
      else f.xr[s] = make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      int rl = rbase + p * 4, r = row0 + rl;
      if (NM) {
        int S2 = n >> 1;
        int sl = t * 32 + gl * 4;  // first of the lane's four slots in the row
        if (r < m && sl < S2) {
          i64 slot = (i64)r * S2 + sl;
          uint2 v = ldp_v2(val + slot);
          f.pv[p][0] = v.x;
          f.pv[p][1] = v.y;
          f.pp[p] = (ldp_u32(posw + (slot >> 4)) >> (unsigned)((slot & 15) * 2)) & 0xffu;
          f.pc[p][0] = 1;
        } else {
          f.pc[p][0] = 0;
        }
      } else {
        int es = base[p] + (int)Ts[(t - ta) * BM + rl], ee = base[p] + (int)Ts[(t - ta + 1) * BM + rl];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          int e = es + gl + 8 * u;
          if (r < m && e < ee) {
            f.pc[p][u] = ldp_u16(col + e);
            f.pv[p][u] = ldp_u16(val + e);
          } else {
            f.pc[p][u] = 0xffffffffu;
          }
        }
      }
    }
  };
  // the X^T tile and the zeroed, then filled, A tile in shared memory
  auto stage = [&](int t, const Pref& f) {
    __syncthreads();  // the previous tile's products are done with Xs / Ws
#pragma unroll
    for (int s = 0; s < XR; ++s) {
      int q = tid + s * THREADS;
      *reinterpret_cast<uint4*>(Xs + (q >> 3) * MMA_LD + (q & 7) * 8) = f.xr[s];
    }
    // each row of the A tile is zeroed, then filled, by the 8 lanes that own it (no block barrier)
    if (!(flags & 2)) {
#pragma unroll
      for (int p = 0; p < 4; ++p)
        *reinterpret_cast<uint4*>(Ws + (rbase + p * 4) * MMA_LD + gl * 8) = make_uint4(0u, 0u, 0u, 0u);
    }
    __syncwarp();
    const unsigned c0 = (unsigned)(t * MMA_BK);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      int rl = rbase + p * 4;
      val_t* wr = Ws + rl * MMA_LD;
      if (NM) {
        if (f.pc[p][0]) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            unsigned lc = (unsigned)((gl * 4 + i) >> 1) * 4u + ((f.pp[p] >> (2 * i)) & 3u);
            unsigned w = i < 2 ? f.pv[p][0] : f.pv[p][1];
            wr[lc] = (val_t)((i & 1) ? (w >> 16) : (w & 0xffffu));
          }
        }
      } else {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          unsigned c = f.pc[p][u];
          unsigned lc = c - c0;
          if (lc < MMA_BK && c < (unsigned)n) wr[lc] = (val_t)f.pv[p][u];
        }
        if (row0 + rl < m) {
          int es = base[p] + (int)Ts[(t - ta) * BM + rl], ee = base[p] + (int)Ts[(t - ta + 1) * BM + rl];
          for (int e = es + gl + 16; e < ee; e += 8) {
            unsigned c = RO(col + e);
            unsigned lc = c - c0;
            if (lc < MMA_BK && c < (unsigned)n) wr[lc] = RO(val + e);
          }
        }
      }
    }
    __syncthreads();
  };
  auto multiply = [&]() {
    if (flags & 1) return;
#pragma unroll
    for (int kk = 0; kk < MMA_BK / 16; ++kk) {
      unsigned a[2][4], b[4][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const val_t* xa = Xs + (wm * 32 + mt * 16 + g) * MMA_LD + kk * 16 + 2 * t4;
        a[mt][0] = *reinterpret_cast<const unsigned*>(xa);
        a[mt][1] = *reinterpret_cast<const unsigned*>(xa + 8 * MMA_LD);
        a[mt][2] = *reinterpret_cast<const unsigned*>(xa + 8);
        a[mt][3] = *reinterpret_cast<const unsigned*>(xa + 8 * MMA_LD + 8);
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const val_t* wb = Ws + (wn * 32 + nt * 8 + g) * MMA_LD + kk * 16 + 2 * t4;
        b[nt][0] = *reinterpret_cast<const unsigned*>(wb);
        b[nt][1] = *reinterpret_cast<const unsigned*>(wb + 8);
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) mma16816(acc[mt][nt], a[mt], b[nt]);
    }
  };

  Pref fa, fb;
  if (ta < te) load(ta, fa);
  if (ta + 1 < te) load(ta + 1, fb);
  for (int t = ta; t < te; t += 2) {
    stage(t, fa);
    if (t + 2 < te) load(t + 2, fa);  // two tiles ahead: overlaps this tile's and the next one's products
    multiply();
    if (t + 1 < te) {
      stage(t + 1, fb);
      if (t + 3 < te) load(t + 3, fb);
      multiply();
    }
  }
  __syncthreads();  // the tiles' memory becomes the partial sums
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      float* pr = P + (wm * 32 + mt * 16 + g) * PLD + wn * 32 + nt * 8 + 2 * t4;
      *reinterpret_cast<float2*>(pr) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
      *reinterpret_cast<float2*>(pr + 8 * PLD) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
    }
  tile_epilogue<S, THREADS, BM, PLD>(P, S > 1, S > 1, MMA_BB * rank / S, MMA_BB * (rank + 1) / S, 0, tid, b0, row0, m, k, bias,
                                     yt);
}

#define SPMM_MMA_BM(SP, ATTR, BMV, NAME, NAME24)                                                                        \
  extern "C" __global__ void ATTR __launch_bounds__(2 * BMV, 256 / BMV) NAME(                                          \
      i64 m, i64 n, i64 k, i64 T, const int* rowptr, const unsigned short* toff, const unsigned short* col,            \
      const val_t* val, const val_t* xt, const val_t* bias, val_t* yt, i64 flags) {                                    \
    spmm_mma_body<SP, false, BMV>((int)m, (int)n, (int)k, (int)T, rowptr, toff, col, val, xt, bias, yt, (int)flags);   \
  }                                                                                                                    \
  extern "C" __global__ void ATTR __launch_bounds__(2 * BMV, 256 / BMV) NAME24(                                        \
      i64 m, i64 n, i64 k, i64 T, const int* rowptr, const unsigned short* toff, const unsigned* pos,                  \
      const val_t* val, const val_t* xt, const val_t* bias, val_t* yt, i64 flags) {                                    \
    spmm_mma_body<SP, true, BMV>((int)m, (int)n, (int)k, (int)T, rowptr, toff, pos, val, xt, bias, yt, (int)flags);    \
  }
// spmm_mma_s<S> / spmm_mma24_s<S>: 128 rows of A per block (256 threads, 2 blocks per SM);
// spmm_mma_r64_s<S> / spmm_mma24_r64_s<S>: 64 rows (128 threads, 4 blocks per SM)
#define SPMM_MMA(SP, ATTR)                                                     \
  SPMM_MMA_BM(SP, ATTR, 128, spmm_mma_s##SP, spmm_mma24_s##SP)                 \
  SPMM_MMA_BM(SP, ATTR, 64, spmm_mma_r64_s##SP, spmm_mma24_r64_s##SP)

SPMM_MMA(1, )
#if __CUDA_ARCH__ >= 900
SPMM_MMA(2, __cluster_dims__(2, 1, 1))
SPMM_MMA(4, __cluster_dims__(4, 1, 1))
SPMM_MMA(8, __cluster_dims__(8, 1, 1))
#endif

// ---- spmm_fl_s<S>: the CSR tensor-core SpMM, pipelined (session 7) --------------------------------
// Same product and layout inputs as spmm_mma_s<S> (rowptr, the per (tile, row) uint16 offsets toff,
// the uint16 columns, the values where they lie), another schedule:
// - roles: the A tile is the MMA's A operand (rows of A = M) and the X^T tile its B operand (the
//   batch = N), both loaded by ldmatrix.x4; BM = 128 rows per block, 4 warps, each 32 rows of A x
//   the 64 columns of X (2 x 8 m16n8k16 per 16-wide step), so the A tile is read once;
// - X^T tiles by cp.async (16 bytes, zero-filled outside X) in three stages, two tiles ahead;
// - a row's entries of a tile, read by 4 lanes as aligned 16-byte chunks of columns and values
//   (8 entries each; a run of up to 25 entries in one step, longer runs loop), loaded into
//   registers one tile ahead; the A tiles double-buffered, so tile t + 1 is zeroed and filled
//   while tile t is multiplied: one block barrier per tile;
// - dynamic shared memory (the A tiles, the X stages, the block's tile offsets); the float32
//   partial sums meet over the cluster of S blocks (S column ranges) as in spmm_mma_s<S>.
// The host launches it for n % 8 == 0, 16-byte aligned values, X^T and uint16 columns (padded by
// 8 entries), grid (m / 128 * S, k / 64), 128 threads, fl_smem_bytes() of shared memory. flags
// (benchmarking only, wrong results): 1 skips the products, 2 the A tiles, 4 the entry loads, 8 the
// X^T copies.
#define FL_LD 72  // shared row stride (halves) of the A and X^T tiles: conflict-free ldmatrix
#define FL_NST 3  // X^T stages

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

template <int S>
__device__ __forceinline__ void spmm_fl_body(int m, int n, int k, int T, const int* __restrict__ rowptr,
                                             const unsigned short* __restrict__ toff,
                                             const unsigned short* __restrict__ col, const val_t* __restrict__ val,
                                             const val_t* __restrict__ xt, const val_t* __restrict__ bias,
                                             val_t* __restrict__ yt, int flags) {
  constexpr int BM = 128, THREADS = 128; // 4 warps: 32 rows of A x the 64 columns of X each
  constexpr int NT = 8;                  // 8-column groups of X per warp
  constexpr int RP = THREADS / 4;        // rows per pass of the entry loads (4 lanes per row)
  constexpr int PASSES = BM / RP;
  constexpr int A_HALVES = BM * FL_LD;   // one A tile
  constexpr int X_HALVES = 64 * FL_LD;   // one X^T tile
  constexpr int PLD = BM + 4;            // row stride (floats) of the partial sums: conflict-free stores
  extern __shared__ __align__(16) unsigned char fl_smem[];
  val_t* As = reinterpret_cast<val_t*>(fl_smem);       // [2][BM][FL_LD]
  val_t* Xs = As + 2 * A_HALVES;                       // [FL_NST][64][FL_LD]
  unsigned short* Ts = reinterpret_cast<unsigned short*>(Xs + FL_NST * X_HALVES);  // [te - ta + 1][BM]
  float* P = reinterpret_cast<float*>(fl_smem);        // [64][PLD], after the loop
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int h = tid & 3, rp = tid >> 2;  // entry loads: lane h of the 4 that own rows rp + RP p
  int rank = 0;
#if __CUDA_ARCH__ >= 900
  if (S > 1) rank = (int)cluster_rank();
#endif
  const int row0 = (int)(blockIdx.x / S) * BM;
  const int b0 = (int)blockIdx.y * 64;
  const int ta = (int)((long long)T * rank / S), te = (int)((long long)T * (rank + 1) / S);
  const int ntact = min(8, (k - b0 + 7) >> 3);  // 8-column groups of X that hold a column < k

  int base[PASSES];
#pragma unroll
  for (int p = 0; p < PASSES; ++p) {
    int r = row0 + rp + RP * p;
    base[p] = r < m ? RO(rowptr + r) : 0;
  }
  {  // the block's tile offsets, once
    const int nq = (te - ta + 1) * BM;
    for (int q0 = 0; q0 < nq; q0 += 8 * THREADS) {
      unsigned short tv[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        int q = q0 + u * THREADS + tid;
        int tt = q / BM, r = row0 + (q - tt * BM);
        tv[u] = (q < nq && r < m) ? RO(toff + (i64)(ta + tt) * m + r) : (unsigned short)0;
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        int q = q0 + u * THREADS + tid;
        if (q < nq) Ts[q] = tv[u];
      }
    }
  }
  float acc[2][NT][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;

  auto load_x = [&](int t) {  // X^T tile t -> stage t % FL_NST
    if (flags & 8) return;
    const unsigned xs = smem_addr(Xs + (t % FL_NST) * X_HALVES);
#pragma unroll
    for (int s = 0; s < 512 / THREADS; ++s) {
      int q = tid + s * THREADS;
      int r = q >> 3, c8 = q & 7;
      int gc = t * 64 + c8 * 8, b = b0 + r;
      bool ok = b < k && gc < n;
      cp_async16(xs + (unsigned)(r * FL_LD + c8 * 8) * 2u, ok ? (const void*)(xt + (i64)b * n + gc) : (const void*)xt,
                 ok ? 16u : 0u);
    }
  };
  const uint4* col4 = reinterpret_cast<const uint4*>(col);
  const uint4* val4 = reinterpret_cast<const uint4*>(val);
  uint4 pc[PASSES], pv[PASSES];
  auto load_e = [&](int t) {  // the first chunk of each of the thread's rows' runs in tile t
#pragma unroll
    for (int p = 0; p < PASSES; ++p) {
      int rl = rp + RP * p;
      int es = base[p] + (int)Ts[(t - ta) * BM + rl], ee = base[p] + (int)Ts[(t - ta + 1) * BM + rl];
      int q = (es >> 3) + h;
      if (row0 + rl < m && q * 8 < ee && !(flags & 4)) {
        pc[p] = ldp_v4(col4 + q);
        pv[p] = ldp_v4(val4 + q);
      } else {
        pc[p] = pv[p] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  };
  auto put8 = [&](val_t* wr, uint4 cc, uint4 vv, int q, int es, int ee, unsigned c0) {
    unsigned cw[4] = {cc.x, cc.y, cc.z, cc.w}, vw[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int e = q * 8 + i;
      unsigned lc = ((i & 1) ? (cw[i >> 1] >> 16) : (cw[i >> 1] & 0xffffu)) - c0;
      if (e >= es && e < ee && lc < 64u) wr[lc] = (val_t)((i & 1) ? (vw[i >> 1] >> 16) : (vw[i >> 1] & 0xffffu));
    }
  };
  auto scatter = [&](int t) {  // A tile t -> buffer t & 1: each row zeroed, then filled, by its 4 lanes
    val_t* as = As + (t & 1) * A_HALVES;
    const unsigned c0 = (unsigned)(t * 64);
    if (flags & 2) return;
#pragma unroll
    for (int p = 0; p < PASSES; ++p) {
      uint4* w = reinterpret_cast<uint4*>(as + (rp + RP * p) * FL_LD + h * 16);
      w[0] = make_uint4(0u, 0u, 0u, 0u);
      w[1] = make_uint4(0u, 0u, 0u, 0u);
    }
    __syncwarp();
#pragma unroll
    for (int p = 0; p < PASSES; ++p) {
      int rl = rp + RP * p;
      if (row0 + rl >= m) continue;
      int es = base[p] + (int)Ts[(t - ta) * BM + rl], ee = base[p] + (int)Ts[(t - ta + 1) * BM + rl];
      int q = (es >> 3) + h;
      if (q * 8 >= ee) continue;
      val_t* wr = as + rl * FL_LD;
      put8(wr, pc[p], pv[p], q, es, ee, c0);
      for (q += 4; q * 8 < ee; q += 4) put8(wr, RO(col4 + q), RO(val4 + q), q, es, ee, c0);  // runs over 25 entries
    }
  };
  auto multiply = [&](int t) {
    if (flags & 1) return;
    const unsigned as = smem_addr(As + (t & 1) * A_HALVES);
    const unsigned xs = smem_addr(Xs + (t % FL_NST) * X_HALVES);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      unsigned a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        ldsm_x4(a[mt], as + (unsigned)((warp * 32 + mt * 16 + (lane & 15)) * FL_LD + kk * 16 + (lane >> 4) * 8) * 2u);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        if (2 * np < ntact) {
          unsigned b[4];
          ldsm_x4(b, xs + (unsigned)((np * 16 + ((lane >> 4) << 3) + (lane & 7)) * FL_LD + kk * 16 + ((lane >> 3) & 1) * 8) * 2u);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma16816_free(acc[mt][2 * np], a[mt], b[0], b[1]);
            mma16816_free(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }
  };

  if (ta < te) load_x(ta);
  cp_async_commit();
  if (ta + 1 < te) load_x(ta + 1);
  cp_async_commit();
  __syncthreads();  // the tile offsets
  if (ta < te) {
    load_e(ta);
    scatter(ta);
    if (ta + 1 < te) load_e(ta + 1);
  }
  for (int t = ta; t < te; ++t) {
    cp_async_wait<1>();  // this thread's copies of X^T tile t
    __syncthreads();     // tile t's X^T and A visible; every warp done with tile t - 1's buffers
    if (t + 2 < te) load_x(t + 2);  // into stage (t - 1) % FL_NST
    cp_async_commit();
    multiply(t);
    if (t + 1 < te) {
      scatter(t + 1);  // into buffer (t - 1) & 1
      if (t + 2 < te) load_e(t + 2);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the tiles' memory becomes the partial sums
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      int r = warp * 32 + mt * 16 + g, bc = nt * 8 + 2 * t4;
      P[bc * PLD + r] = acc[mt][nt][0];
      P[(bc + 1) * PLD + r] = acc[mt][nt][1];
      P[bc * PLD + r + 8] = acc[mt][nt][2];
      P[(bc + 1) * PLD + r + 8] = acc[mt][nt][3];
    }
  tile_epilogue<S, THREADS, BM, PLD>(P, S > 1, S > 1, 64 * rank / S, 64 * (rank + 1) / S, 0, tid, b0, row0, m, k, bias, yt);
}

#define SPMM_FL(SP, ATTR)                                                                                            \
  extern "C" __global__ void ATTR __launch_bounds__(128, 2) spmm_fl_s##SP(                                          \
      i64 m, i64 n, i64 k, i64 T, const int* rowptr, const unsigned short* toff, const unsigned short* col,         \
      const val_t* val, const val_t* xt, const val_t* bias, val_t* yt, i64 flags) {                                 \
    spmm_fl_body<SP>((int)m, (int)n, (int)k, (int)T, rowptr, toff, col, val, xt, bias, yt, (int)flags);             \
  }

SPMM_FL(1, )
#if __CUDA_ARCH__ >= 900
SPMM_FL(2, __cluster_dims__(2, 1, 1))
SPMM_FL(3, __cluster_dims__(3, 1, 1))
SPMM_FL(4, __cluster_dims__(4, 1, 1))
SPMM_FL(8, __cluster_dims__(8, 1, 1))
#endif

// ---- spmm_ws_s<S>: spmm_fl with warp specialization (session 7) ------------------------------------
// The inputs, tiles and epilogue of spmm_fl (BM = 128, 32 x 32 per consumer warp), but a block of 16
// warps in two roles, so that loading and multiplying overlap inside the block instead of taking
// turns between barriers: 8 producer warps copy the X^T tile (cp.async) and zero + fill the A tile
// of tile t into slot t % 3 of a ring of three, entries loaded two tiles ahead (4 lanes per row,
// rows rp and rp + 64); 8 consumer warps multiply slot after slot. Named barriers: FULL[i] (1 + i:
// producers arrive, consumers wait) and EMPTY[i] (4 + i: consumers arrive, producers wait before
// refilling slot i). One block per SM (up to 128 registers). flags as spmm_fl's, and
// (benchmarking only) 16: no cluster reduction, 32: no tile offsets staged.
__device__ __forceinline__ void bar_sync_n(int id, int count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive_n(int id, int count) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}

template <int S>
__device__ __forceinline__ void spmm_ws_body(int m, int n, int k, int T, const int* __restrict__ rowptr,
                                             const unsigned short* __restrict__ toff,
                                             const unsigned short* __restrict__ col, const val_t* __restrict__ val,
                                             const val_t* __restrict__ xt, const val_t* __restrict__ bias,
                                             val_t* __restrict__ yt, int flags) {
  constexpr int MT = 2, CW = 8;                      // consumer warps (the first 8): 32 rows x 32 columns of X
  constexpr int BM = 128, PT = 256, THREADS = 32 * CW + PT;  // PT producer threads (the last 8 warps)
  constexpr int RP = PT / 4, PASSES = BM / RP;     // 4 lanes per row, 2 rows per producer thread
  constexpr int A_HALVES = BM * FL_LD, X_HALVES = 64 * FL_LD;
  constexpr int PLD = BM + 4;
  constexpr int NT = 4;  // 8-column groups of X per consumer warp
  extern __shared__ __align__(16) unsigned char ws_smem[];
  val_t* As = reinterpret_cast<val_t*>(ws_smem);                                   // [3][BM][FL_LD]
  val_t* Xs = As + 3 * A_HALVES;                                                    // [3][64][FL_LD]
  unsigned short* Ts = reinterpret_cast<unsigned short*>(Xs + 3 * X_HALVES);       // [te - ta + 1][BM]
  float* P = reinterpret_cast<float*>(ws_smem);                                     // [64][PLD], after the loop
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bool producer = warp >= CW;
  int rank = 0;
#if __CUDA_ARCH__ >= 900
  if (S > 1) rank = (int)cluster_rank();
#endif
  const int row0 = (int)(blockIdx.x / S) * BM;
  const int b0 = (int)blockIdx.y * 64;
  const int ta = (int)((long long)T * rank / S), te = (int)((long long)T * (rank + 1) / S);
  const int ntact = min(8, (k - b0 + 7) >> 3);
  if (!(flags & 32)) {  // the block's tile offsets, once
    const int nq = (te - ta + 1) * BM;
    for (int q0 = 0; q0 < nq; q0 += 4 * THREADS) {
      unsigned short tv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        int q = q0 + u * THREADS + tid;
        int tt = q / BM, r = row0 + (q - tt * BM);
        tv[u] = (q < nq && r < m) ? RO(toff + (i64)(ta + tt) * m + r) : (unsigned short)0;
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        int q = q0 + u * THREADS + tid;
        if (q < nq) Ts[q] = tv[u];
      }
    }
  }
  __syncthreads();
  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;
  const int wm = warp >> 1, wn = warp & 1;  // consumers: rows 16 MT wm, X columns 32 wn

  if (producer) {
    const int ptid = tid - (THREADS - PT), h = ptid & 3, rp = ptid >> 2;
    int base[PASSES];
#pragma unroll
    for (int p = 0; p < PASSES; ++p) {
      int r = row0 + rp + RP * p;
      base[p] = r < m ? RO(rowptr + r) : 0;
    }
    const uint4* col4 = reinterpret_cast<const uint4*>(col);
    const uint4* val4 = reinterpret_cast<const uint4*>(val);
    auto load_e = [&](int t, uint4* pc, uint4* pv) {
#pragma unroll
      for (int p = 0; p < PASSES; ++p) {
        int rl = rp + RP * p;
        int es = base[p] + (int)Ts[(t - ta) * BM + rl], ee = base[p] + (int)Ts[(t - ta + 1) * BM + rl];
        int q = (es >> 3) + h;
        if (row0 + rl < m && q * 8 < ee && !(flags & 4)) {
          pc[p] = ldp_v4(col4 + q);
          pv[p] = ldp_v4(val4 + q);
        } else {
          pc[p] = pv[p] = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    };
    auto put8 = [&](val_t* wr, uint4 cc, uint4 vv, int q, int es, int ee, unsigned c0) {
      unsigned cw[4] = {cc.x, cc.y, cc.z, cc.w}, vw[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        int e = q * 8 + i;
        unsigned lc = ((i & 1) ? (cw[i >> 1] >> 16) : (cw[i >> 1] & 0xffffu)) - c0;
        if (e >= es && e < ee && lc < 64u) wr[lc] = (val_t)((i & 1) ? (vw[i >> 1] >> 16) : (vw[i >> 1] & 0xffffu));
      }
    };
    auto produce = [&](int t, int slot, const uint4* pc, const uint4* pv) {
      if (t - ta >= 3) bar_sync_n(4 + slot, THREADS);  // the consumers are done with slot's previous tile
      if (!(flags & 8)) {
        const unsigned xs = smem_addr(Xs + slot * X_HALVES);
#pragma unroll
        for (int s = 0; s < 512 / PT; ++s) {
          int q = ptid + s * PT;
          int r = q >> 3, c8 = q & 7;
          int gc = t * 64 + c8 * 8, b = b0 + r;
          bool ok = b < k && gc < n;
          cp_async16(xs + (unsigned)(r * FL_LD + c8 * 8) * 2u, ok ? (const void*)(xt + (i64)b * n + gc) : (const void*)xt,
                     ok ? 16u : 0u);
        }
      }
      cp_async_commit();
      if (!(flags & 2)) {
        val_t* as = As + slot * A_HALVES;
        const unsigned c0 = (unsigned)(t * 64);
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
          uint4* w = reinterpret_cast<uint4*>(as + (rp + RP * p) * FL_LD + h * 16);
          w[0] = make_uint4(0u, 0u, 0u, 0u);
          w[1] = make_uint4(0u, 0u, 0u, 0u);
        }
        __syncwarp();
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
          int rl = rp + RP * p;
          if (row0 + rl >= m) continue;
          int es = base[p] + (int)Ts[(t - ta) * BM + rl], ee = base[p] + (int)Ts[(t - ta + 1) * BM + rl];
          int q = (es >> 3) + h;
          if (q * 8 >= ee) continue;
          val_t* wr = as + rl * FL_LD;
          put8(wr, pc[p], pv[p], q, es, ee, c0);
          for (q += 4; q * 8 < ee; q += 4) put8(wr, RO(col4 + q), RO(val4 + q), q, es, ee, c0);
        }
      }
      cp_async_wait<0>();
      bar_arrive_n(1 + slot, THREADS);  // slot holds tile t
    };
    uint4 pa[PASSES], va[PASSES], pb[PASSES], vb[PASSES];
    if (ta < te) load_e(ta, pa, va);
    if (ta + 1 < te) load_e(ta + 1, pb, vb);
    int slot = 0;
    for (int t = ta; t < te; t += 2) {
      produce(t, slot, pa, va);
      slot = slot == 2 ? 0 : slot + 1;
      if (t + 2 < te) load_e(t + 2, pa, va);
      if (t + 1 < te) {
        produce(t + 1, slot, pb, vb);
        slot = slot == 2 ? 0 : slot + 1;
        if (t + 3 < te) load_e(t + 3, pb, vb);
      }
    }
  } else {
    int slot = 0;
    for (int t = ta; t < te; ++t) {
      bar_sync_n(1 + slot, THREADS);  // slot holds tile t
      if (!(flags & 1)) {
        const unsigned as = smem_addr(As + slot * A_HALVES);
        const unsigned xs = smem_addr(Xs + slot * X_HALVES);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          unsigned a[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            ldsm_x4(a[mt], as + (unsigned)((wm * 16 * MT + mt * 16 + (lane & 15)) * FL_LD + kk * 16 + (lane >> 4) * 8) * 2u);
#pragma unroll
          for (int np = 0; np < NT / 2; ++np) {
            if (wn * NT + 2 * np < ntact) {
              unsigned b[4];
              ldsm_x4(b, xs + (unsigned)((wn * NT * 8 + np * 16 + ((lane >> 4) << 3) + (lane & 7)) * FL_LD + kk * 16 +
                                         ((lane >> 3) & 1) * 8) * 2u);
#pragma unroll
              for (int mt = 0; mt < MT; ++mt) {
                mma16816_free(acc[mt][2 * np], a[mt], b[0], b[1]);
                mma16816_free(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
              }
            }
          }
        }
      }
      if (t + 3 < te) bar_arrive_n(4 + slot, THREADS);  // the producers may refill slot
      slot = slot == 2 ? 0 : slot + 1;
    }
  }
  __syncthreads();  // the ring's memory becomes the partial sums
  if (!producer) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        int r = wm * 16 * MT + mt * 16 + (lane >> 2), bc = (wn * NT + nt) * 8 + 2 * (lane & 3);
        P[bc * PLD + r] = acc[mt][nt][0];
        P[(bc + 1) * PLD + r] = acc[mt][nt][1];
        P[bc * PLD + r + 8] = acc[mt][nt][2];
        P[(bc + 1) * PLD + r + 8] = acc[mt][nt][3];
      }
  }
  const bool reduce = S > 1 && !(flags & 16);
  tile_epilogue<S, THREADS, BM, PLD>(P, reduce, reduce, 64 * rank / S, 64 * (rank + 1) / S, 0, tid, b0, row0, m, k, bias, yt);
}

#define SPMM_WS(SP, ATTR)                                                                                            \
  extern "C" __global__ void ATTR __launch_bounds__(512, 1) spmm_ws_s##SP(                                          \
      i64 m, i64 n, i64 k, i64 T, const int* rowptr, const unsigned short* toff, const unsigned short* col,         \
      const val_t* val, const val_t* xt, const val_t* bias, val_t* yt, i64 flags) {                                 \
    spmm_ws_body<SP>((int)m, (int)n, (int)k, (int)T, rowptr, toff, col, val, xt, bias, yt, (int)flags);             \
  }
SPMM_WS(1, )
#if __CUDA_ARCH__ >= 900
SPMM_WS(2, __cluster_dims__(2, 1, 1))
SPMM_WS(3, __cluster_dims__(3, 1, 1))
SPMM_WS(4, __cluster_dims__(4, 1, 1))
SPMM_WS(8, __cluster_dims__(8, 1, 1))
#endif

// ---- csr16 with X in shared memory (csr16_xs<R>): one right-hand side, half types, bias fused ----
// csr16_warp's loads (aligned 8-entry chunks of uint16 columns and values, two per lane per step),
// but X (n halves, n * 2 bytes of dynamic shared memory) is first copied into shared memory by the
// block, so the gathers are shared-memory reads rather than scattered read-only-cache requests.
// Each of the block's 16 warps (512 threads) takes R rows (rows warp, warp + 16, ...: a block covers
// 16 R rows); the first row's first loads are issued before the copy's barrier. (Measured and left
// out, cuda_kernels_h200_s6_left_out.json: blocks of 1024 threads, 4.6 against 4.4 us in the same
// run; the block's first piece of X requested before the row pointers: 44 registers, 2 blocks per
// SM instead of 3, 9.9 us on the 4096 -> 11008 layer against 8.3 / 8.4 us without it in the runs
// before and after.)
template <int R>
__device__ __forceinline__ void csr16_xs_body(int m, int n, const int* __restrict__ rowptr,
                                              const unsigned short* __restrict__ col, const val_t* __restrict__ val,
                                              const val_t* __restrict__ x, const val_t* __restrict__ bias,
                                              val_t* __restrict__ y) {
  extern __shared__ __align__(16) unsigned char xs_raw[];
  val_t* xs = reinterpret_cast<val_t*>(xs_raw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wpb = (int)(blockDim.x >> 5);
  const int rbase = (int)blockIdx.x * wpb * R + warp;
  int s0 = 0, e0 = 0;
  if (rbase < m) {
    s0 = RO(rowptr + rbase);
    e0 = RO(rowptr + rbase + 1);
  }
  uint4 vv[2], cc[2];
  {
    int qa = s0 >> 3, qe = (e0 + 7) >> 3;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      int q = qa + u * 32 + lane;
      if (rbase < m && q < qe) {
        vv[u] = RO(reinterpret_cast<const uint4*>(val) + q);
        cc[u] = RO(reinterpret_cast<const uint4*>(col) + q);
      }
    }
  }
  if ((n & 7) == 0 && (reinterpret_cast<unsigned long long>(x) & 15) == 0) {
    for (int i = threadIdx.x; i < (n >> 3); i += blockDim.x)
      reinterpret_cast<uint4*>(xs)[i] = RO(reinterpret_cast<const uint4*>(x) + i);
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) xs[i] = RO(x + i);
  }
  __syncthreads();
#pragma unroll 1
  for (int p = 0; p < R; ++p) {
    const int row = rbase + p * wpb;
    if (row >= m) break;
    int s = s0, e = e0;
    if (p > 0) {
      s = RO(rowptr + row);
      e = RO(rowptr + row + 1);
    }
    const int qa = s >> 3, qe = (e + 7) >> 3;
    float acc = 0.f;
    for (int qb = qa; qb < qe; qb += 64) {
      if (p > 0 || qb > qa) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          int q = qb + u * 32 + lane;
          if (q < qe) {
            vv[u] = RO(reinterpret_cast<const uint4*>(val) + q);
            cc[u] = RO(reinterpret_cast<const uint4*>(col) + q);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        int q = qb + u * 32 + lane;
        if (q < qe) {
          unsigned vw[4] = {vv[u].x, vv[u].y, vv[u].z, vv[u].w};
          unsigned cw[4] = {cc[u].x, cc[u].y, cc[u].z, cc[u].w};
          int ee0 = q * 8;
          bool whole = ee0 >= s && ee0 + 8 <= e;
#pragma unroll
          for (int t = 0; t < 8; ++t) {
            unsigned c = (t & 1) ? (cw[t >> 1] >> 16) : (cw[t >> 1] & 0xffffu);
            unsigned hv = (t & 1) ? (vw[t >> 1] >> 16) : (vw[t >> 1] & 0xffffu);
            bool in = whole || (ee0 + t >= s && ee0 + t < e);
            if (in) acc += ld((val_t)hv) * ld(xs[c]);
          }
        }
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) y[row] = st(acc + (bias ? ld(RO(bias + row)) : 0.f));
  }
}
extern "C" __global__ void __launch_bounds__(512) csr16_xs1(i64 m, i64 n, const int* rowptr, const unsigned short* col,
                                                            const val_t* val, const val_t* x, const val_t* bias, val_t* y) {
  csr16_xs_body<1>((int)m, (int)n, rowptr, col, val, x, bias, y);
}
extern "C" __global__ void __launch_bounds__(512) csr16_xs2(i64 m, i64 n, const int* rowptr, const unsigned short* col,
                                                            const val_t* val, const val_t* x, const val_t* bias, val_t* y) {
  csr16_xs_body<2>((int)m, (int)n, rowptr, col, val, x, bias, y);
}
extern "C" __global__ void __launch_bounds__(512) csr16_xs4(i64 m, i64 n, const int* rowptr, const unsigned short* col,
                                                            const val_t* val, const val_t* x, const val_t* bias, val_t* y) {
  csr16_xs_body<4>((int)m, (int)n, rowptr, col, val, x, bias, y);
}

// ---- CSR with uint16 columns, one right-hand side, half types: a warp per row, bias fused ------------
// The plan's uint16 copy of the columns (the tensor-core kernel's) halves the index bytes. A lane
// takes aligned chunks of 8 entries (entry 8q .. 8q + 7 of the whole CSR): one 16-byte load of
// values, one 16-byte load of columns, the entries outside the row's [s, e) masked; two chunks per
// lane per step, all loads before the FMAs; X gathered through the read-only path (it stays in L1).
// Values and columns need 16-byte aligned bases (the host checks).
extern "C" __global__ void __launch_bounds__(512) csr16_warp(i64 m_, const int* __restrict__ rowptr,
                                                             const unsigned short* __restrict__ col,
                                                             const val_t* __restrict__ val, const val_t* __restrict__ x,
                                                             const val_t* __restrict__ bias, val_t* __restrict__ y) {
  const int m = (int)m_;
  const int lane = threadIdx.x & 31;
  const int row = (int)((blockIdx.x * (blockDim.x >> 5)) + (threadIdx.x >> 5));
  if (row >= m) return;
  const int s = RO(rowptr + row), e = RO(rowptr + row + 1);
  const int qa = s >> 3, qe = (e + 7) >> 3;
  float acc = 0.f;
  for (int qb = qa; qb < qe; qb += 64) {
    uint4 vv[2], cc[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      int q = qb + u * 32 + lane;
      if (q < qe) {
        vv[u] = RO(reinterpret_cast<const uint4*>(val) + q);
        cc[u] = RO(reinterpret_cast<const uint4*>(col) + q);
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      int q = qb + u * 32 + lane;
      if (q < qe) {
        unsigned vw[4] = {vv[u].x, vv[u].y, vv[u].z, vv[u].w};
        unsigned cw[4] = {cc[u].x, cc[u].y, cc[u].z, cc[u].w};
        int e0 = q * 8;
        bool whole = e0 >= s && e0 + 8 <= e;
        float xs[8];
        bool in[8];
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          unsigned c = (t & 1) ? (cw[t >> 1] >> 16) : (cw[t >> 1] & 0xffffu);
          in[t] = whole || (e0 + t >= s && e0 + t < e);
          xs[t] = in[t] ? ld(RO(x + c)) : 0.f;
        }
        // the product masked, not only X: entries of the neighbouring rows (or the bytes past the last
        // value in the final 16-byte piece) may be Inf / NaN, and 0 * Inf is NaN (session 12: a NaN in
        // the last row of a 517 x 4096 float16 matrix, GPU test run s12a)
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          unsigned hv = (t & 1) ? (vw[t >> 1] >> 16) : (vw[t >> 1] & 0xffffu);
          if (in[t]) acc += ld((val_t)hv) * xs[t];
        }
      }
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) y[row] = st(acc + (bias ? ld(RO(bias + row)) : 0.f));
}


// ---- csr16_xv / csr16_x12 (session 8): one right-hand side, half types, X in shared memory ----------
// A warp per row, as csr16_xs1, but a lane takes one aligned pair of 8-entry chunks (entries 16p ..
// 16p + 15 of the whole CSR, the entries outside the row's [s, e) masked): two 16-byte value loads
// side by side, and the columns either as uint16 (csr16_xv*: two 16-byte loads) or packed 12 bits
// each (csr16_x12*: the plan's copy, 24 bytes per pair as three 8-byte loads, n <= 4096: 3.5 bytes
// per entry read instead of 4). "f" kernels keep X in shared memory as float32 (no conversion per
// gathered entry; 4 n bytes). The pattern's own buffers (row pointers, columns: the plan's copies)
// are read first; then griddepcontrol.wait (sm_90: a no-op unless the launch allows a programmatic
// dependency on the kernel before it), then the values, X and the bias, and Y is written. flags & 1:
// griddepcontrol.launch_dependents at the start (lets a next kernel launched with a programmatic
// dependency start early; it still waits for this grid's completion before reading what it wrote).
// Diagnostic builds (csr16_xv_d<F>, csr16_x12_d<F>, timing only, results not meaningful): F = 1
// gathers X[lane] instead of X[column] (no bank conflicts), 2 no copy of X (and no barrier), 4 no
// value / column loads (column 0), 8 returns at once (the launch of this grid shape).
// csr16_xr: X in shared memory as R copies (flags bits 8..11: R; bits 16..: the copies' stride in 32-bit
// words), copy c holding, in each block b of 32 words, word w at (w + c (2 b + 1)) mod 32: the same word
// lies in R different banks. The columns are the plan's uint16 shared-memory indices (halves) into the
// copy it chose per entry, so that the 32 lanes of one gather hit as few banks twice as it could find
// (MmaMixin._xr_cols: greedy, once per pattern): the random-column bank conflicts of one 32-lane gather
// (about 3 wavefronts for 26 random columns) drop to about 1.3. X's words are requested first.
// "a" kernels (csr16_xva, csr16_x12a): griddepcontrol.wait first, then X's copy issued before the row
// pointers as cp.async (16 bytes each, no registers; X 16-byte aligned, n % 8 == 0, else the plain copy),
// so that X is in shared memory before the entries arrive and no warp waits at the barrier for it.
// Session 9, flags of the "a" kernels (launched with programmatic dependent launch by the plan, launch.py):
// bit 1 (XV_TRIG_LATE): griddepcontrol.launch_dependents after the barrier (X in shared memory), so that
// the next kernel's blocks are scheduled while this one gathers; bit 2 (XV_PATTERN_FIRST): the row pointers
// and the first pair's columns (the plan's own pattern copies, which no kernel in flight writes: launch.py)
// are read before griddepcontrol.wait, X's copy and the values after it, so that under PDL the row-pointer
// -> column chain runs while the kernel before it finishes. Whichever bits, every read of X, the values and
// the bias and the write of Y come after griddepcontrol.wait; launch_dependents only lets a dependent that
// itself waits start (a dependent's wait is for this grid's completion and the visibility of its writes).
// csr16_x12b: csr16_x12a with each whole pair of chunks (its 16 entries in one row) stored in the plan's
// rotated order: column slot t holds entry (t + r) mod 16 of the pair, r (0..15) one byte per pair from
// the plan (MmaMixin._col12b: chosen per lane so that the 32 lanes of a gather step hit few banks twice);
// the lane rotates its 16 values in registers to match (selects and funnel shifts). Pairs that are not
// whole (shared by two rows, masked) keep r = 0. Its 10th argument is the rotation bytes.
// Diagnostic build csr16_x12a_d16 (F = 16, XV_NOWAIT): no griddepcontrol.wait at all, for the benchmark's
// check that a PDL chain without the wait reads stale X (never launched by the plan).
#define XV_NOGATHER 1
#define XV_NOXCOPY 2
#define XV_NOLOAD 4
#define XV_EMPTY 8
#define XV_NOWAIT 16
#define XV_TRIG_LATE 2
#define XV_PATTERN_FIRST 4

__device__ __forceinline__ void xv_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void xv_trigger() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <bool C12>
__device__ __forceinline__ void xv_load_cols(int p, const void* colp, unsigned* cw) {
  if (C12) {
    const uint2* c = reinterpret_cast<const uint2*>(colp) + 3 * p;
    uint2 a = RO(c), b = RO(c + 1), d = RO(c + 2);
    cw[0] = a.x; cw[1] = a.y; cw[2] = b.x; cw[3] = b.y; cw[4] = d.x; cw[5] = d.y;
  } else {
    const uint4* c = reinterpret_cast<const uint4*>(colp) + 2 * p;
    uint4 a = RO(c), b = RO(c + 1);
    cw[0] = a.x; cw[1] = a.y; cw[2] = a.z; cw[3] = a.w; cw[4] = b.x; cw[5] = b.y; cw[6] = b.z; cw[7] = b.w;
  }
}
__device__ __forceinline__ void xv_load_vals(int p, int e, const val_t* val, unsigned* vw) {
  // the second chunk only where it holds entries of the row (never a 16-byte piece wholly past the values)
  const uint4* v = reinterpret_cast<const uint4*>(val) + 2 * p;
  uint4 a = RO(v), b = make_uint4(0u, 0u, 0u, 0u);
  if (16 * p + 8 < e) b = RO(v + 1);
  vw[0] = a.x; vw[1] = a.y; vw[2] = a.z; vw[3] = a.w; vw[4] = b.x; vw[5] = b.y; vw[6] = b.z; vw[7] = b.w;
}
// w holds 16 halves, h[2 i] the low half of w[i]; afterwards half t is h[(t + r) mod 16] (r in 0..15): the
// words rotated by r / 2 (three stages of selects), then by one half where r is odd (funnel shifts)
__device__ __forceinline__ void xv_rotate(unsigned* w, unsigned r) {
  const unsigned q = (r >> 1) & 7u;
#pragma unroll
  for (int k = 4; k >= 1; k >>= 1) {
    unsigned t[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) t[i] = w[(i + k) & 7];
    const bool on = (q & (unsigned)k) != 0u;
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = on ? t[i] : w[i];
  }
  const bool odd = (r & 1u) != 0u;
  unsigned t[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) t[i] = __funnelshift_r(w[i], w[(i + 1) & 7], 16);
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i] = odd ? t[i] : w[i];
}
template <bool C12, int T>
__device__ __forceinline__ unsigned xv_col(const unsigned* cw) {
  if (C12) {
    constexpr int bit = 12 * T, w = bit >> 5, off = bit & 31;
    if (off + 12 <= 32) return (cw[w] >> off) & 0xfffu;
    return __funnelshift_r(cw[w], cw[w + 1], off) & 0xfffu;
  }
  return (T & 1) ? (cw[T >> 1] >> 16) : (cw[T >> 1] & 0xffffu);
}

template <bool C12, bool XF, int F, bool XA = false, bool XR = false, bool ROT = false>
__device__ __forceinline__ void csr16_xv_body(int m, int n, const int* __restrict__ rowptr, const void* __restrict__ colp,
                                              const val_t* __restrict__ val, const val_t* __restrict__ x,
                                              const val_t* __restrict__ bias, val_t* __restrict__ y, int flags,
                                              const unsigned char* __restrict__ rot = nullptr) {
  if (flags & 1) xv_trigger();
  if (F & XV_EMPTY) {
    xv_wait();
    return;
  }
  extern __shared__ __align__(16) unsigned char xs_raw[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = (int)blockIdx.x * (int)(blockDim.x >> 5) + warp;
  const bool xvec = (n & 7) == 0 && (reinterpret_cast<unsigned long long>(x) & 15) == 0;
  const bool pfirst = XA && (flags & XV_PATTERN_FIRST);
  auto wait_then_copy = [&]() {  // griddepcontrol.wait, then X's copy issued (cp.async, no registers)
    if (!(F & XV_NOWAIT)) xv_wait();
    if (xvec && !(F & XV_NOXCOPY)) {
      const unsigned base = smem_addr(xs_raw);
      for (int i = threadIdx.x; i < (n >> 3); i += blockDim.x) cp_async16(base + 16u * (unsigned)i, x + 8 * i, 16u);
      cp_async_commit();
    }
  };
  if (XA && !pfirst) wait_then_copy();  // X's copy first, so that it is in before the entries
  // XR: X's words requested first into registers (word 32 b + lane of X for the warp's blocks b of 32 words)
  const int xr_copies = (flags >> 8) & 15, xr_stride = (int)((unsigned)flags >> 16);
  const int nw = n >> 1, nblk = (nw + 31) >> 5, wpb = (int)(blockDim.x >> 5);
  unsigned xw[2] = {0u, 0u};
  if (XR) {
    xv_wait();
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int w = 32 * (warp + u * wpb) + lane;
      if (warp + u * wpb < nblk && w < nw) xw[u] = RO(reinterpret_cast<const unsigned*>(x) + w);
    }
  }
  int s = 0, e = 0;
  if (row < m) {
    s = RO(rowptr + row);
    e = RO(rowptr + row + 1);
  }
  const int pa = s >> 4, pe = (e + 15) >> 4;
  unsigned vw[8], cw[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) vw[i] = cw[i] = 0u;
  const bool first = row < m && pa + lane < pe;
  unsigned rr = 0u;
  if (!(F & XV_NOLOAD) && first) {
    xv_load_cols<C12>(pa + lane, colp, cw);
    if (ROT) rr = RO(rot + pa + lane);
  }
  if (pfirst) wait_then_copy();  // the pattern's reads above, X and the values below
  if (!XA && !XR) xv_wait();
  if (!(F & XV_NOLOAD) && first) {
    xv_load_vals(pa + lane, e, val, vw);
    if (ROT) xv_rotate(vw, rr);
  }
  if (!(F & XV_NOXCOPY)) {
    if (XR) {
      // copy c of X: in each block b of 32 words, word w at (w + c (2 b + 1)) mod 32; a warp writes 32
      // words of one block per store (32 banks); copies xr_stride words apart
      unsigned* xs32 = reinterpret_cast<unsigned*>(xs_raw);
      for (int b = warp; b < nblk; b += wpb) {
        const int w = 32 * b + lane;
        unsigned v;
        if (b < 2 * wpb) {
          v = b < wpb ? xw[0] : xw[1];
        } else {
          v = w < nw ? RO(reinterpret_cast<const unsigned*>(x) + w) : 0u;
        }
        for (int c = 0; c < xr_copies; ++c) xs32[c * xr_stride + 32 * b + ((lane + c * (2 * b + 1)) & 31)] = v;
      }
    } else if (XA && xvec) {
      cp_async_wait<0>();
    } else if (XF) {
      float* xf = reinterpret_cast<float*>(xs_raw);
      if ((n & 7) == 0 && (reinterpret_cast<unsigned long long>(x) & 15) == 0) {
        for (int i = threadIdx.x; i < (n >> 3); i += blockDim.x) {
          uint4 q = RO(reinterpret_cast<const uint4*>(x) + i);
          unsigned qw[4] = {q.x, q.y, q.z, q.w};
          float4 lo, hi;
          lo.x = ld((val_t)(qw[0] & 0xffffu)); lo.y = ld((val_t)(qw[0] >> 16));
          lo.z = ld((val_t)(qw[1] & 0xffffu)); lo.w = ld((val_t)(qw[1] >> 16));
          hi.x = ld((val_t)(qw[2] & 0xffffu)); hi.y = ld((val_t)(qw[2] >> 16));
          hi.z = ld((val_t)(qw[3] & 0xffffu)); hi.w = ld((val_t)(qw[3] >> 16));
          reinterpret_cast<float4*>(xf)[2 * i] = lo;
          reinterpret_cast<float4*>(xf)[2 * i + 1] = hi;
        }
      } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) xf[i] = ld(RO(x + i));
      }
    } else {
      val_t* xs = reinterpret_cast<val_t*>(xs_raw);
      if ((n & 7) == 0 && (reinterpret_cast<unsigned long long>(x) & 15) == 0) {
        for (int i = threadIdx.x; i < (n >> 3); i += blockDim.x)
          reinterpret_cast<uint4*>(xs)[i] = RO(reinterpret_cast<const uint4*>(x) + i);
      } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) xs[i] = RO(x + i);
      }
    }
    __syncthreads();
  }
  if (XA && (flags & XV_TRIG_LATE)) xv_trigger();
  float acc = 0.f;
  for (int pb = pa; pb < pe; pb += 32) {
    const int p = pb + lane;
    if (pb > pa && p < pe && !(F & XV_NOLOAD)) {
      xv_load_cols<C12>(p, colp, cw);
      xv_load_vals(p, e, val, vw);
      if (ROT) xv_rotate(vw, RO(rot + p));
    }
    if (p < pe) {
      const int e0 = p * 16;
      const bool whole = e0 >= s && e0 + 16 <= e;
#define XV_STEP(T)                                                                                   \
      {                                                                                              \
        unsigned c = (F & XV_NOGATHER) ? (unsigned)lane : xv_col<C12, T>(cw);                        \
        unsigned hv = (T & 1) ? (vw[T >> 1] >> 16) : (vw[T >> 1] & 0xffffu);                         \
        float xv = XF ? reinterpret_cast<const float*>(xs_raw)[c] : ld(reinterpret_cast<const val_t*>(xs_raw)[c]); \
        if (whole || (e0 + T >= s && e0 + T < e)) acc += ld((val_t)hv) * xv;                          \
      }
      XV_STEP(0) XV_STEP(1) XV_STEP(2) XV_STEP(3) XV_STEP(4) XV_STEP(5) XV_STEP(6) XV_STEP(7)
      XV_STEP(8) XV_STEP(9) XV_STEP(10) XV_STEP(11) XV_STEP(12) XV_STEP(13) XV_STEP(14) XV_STEP(15)
#undef XV_STEP
    }
  }
  acc = warp_sum(acc);
  if (row < m && lane == 0) y[row] = st(acc + (bias ? ld(RO(bias + row)) : 0.f));
}

#define CSR16_XV(NAME, C12, XF, F, XA, ...)                                                                         \
  extern "C" __global__ void __launch_bounds__(1024) NAME(i64 m, i64 n, const int* rowptr, const void* col,         \
                                                          const val_t* val, const val_t* x, const val_t* bias,      \
                                                          val_t* y, i64 flags) {                                    \
    csr16_xv_body<C12, XF, F, XA, ##__VA_ARGS__>((int)m, (int)n, rowptr, col, val, x, bias, y, (int)flags);        \
  }
CSR16_XV(csr16_xv, false, false, 0, false)
CSR16_XV(csr16_xvf, false, true, 0, false)
CSR16_XV(csr16_x12, true, false, 0, false)
CSR16_XV(csr16_x12f, true, true, 0, false)
CSR16_XV(csr16_xva, false, false, 0, true)
CSR16_XV(csr16_x12a, true, false, 0, true)
CSR16_XV(csr16_xv_d1, false, false, 1, false)
CSR16_XV(csr16_xv_d2, false, false, 2, false)
CSR16_XV(csr16_xv_d4, false, false, 4, false)
CSR16_XV(csr16_xv_d8, false, false, 8, false)
CSR16_XV(csr16_x12_d1, true, false, 1, false)
CSR16_XV(csr16_x12_d2, true, false, 2, false)
CSR16_XV(csr16_x12_d4, true, false, 4, false)
CSR16_XV(csr16_x12a_d1, true, false, 1, true)
CSR16_XV(csr16_x12a_d4, true, false, 4, true)
CSR16_XV(csr16_xr, false, false, 0, false, true)
CSR16_XV(csr16_xr_d1, false, false, 1, false, true)
CSR16_XV(csr16_x12a_d16, true, false, 16, true)
#undef CSR16_XV
extern "C" __global__ void __launch_bounds__(1024) csr16_x12b(i64 m, i64 n, const int* rowptr, const void* col, const val_t* val,
                                                              const val_t* x, const val_t* bias, val_t* y, i64 flags,
                                                              const unsigned char* rot) {
  csr16_xv_body<true, false, 0, true, false, true>((int)m, (int)n, rowptr, col, val, x, bias, y, (int)flags, rot);
}

// ---- spmm_fixup (session 12): sparse semantics for non-finite X after a tensor-core SpMM ---------------
// The tensor-core kernels multiply whole tiles of A, structural zeros included, so an Inf or NaN in X^T[b, j]
// reaches every row of the tile (0 * Inf = NaN), where the sparse product (SciPy, cuSPARSE, the CPU
// backends, the csr16 kernels) reaches only the rows that store column j. Launched after them, one block
// per row b of X^T (k x n, contiguous, 16-byte aligned, n % 8 == 0: the tensor-core path's conditions):
// the block reads its row of X^T once (16-byte loads) and leaves at once where every value is finite (the
// common case: one read of X^T); otherwise it recomputes Y^T[b, :] from the stored entries only (a warp
// per row of A, float32 sums, bias added) and overwrites what the product wrote there.
extern "C" __global__ void __launch_bounds__(256) spmm_fixup(i64 m_, i64 n_, const int* __restrict__ rowptr,
                                                             const unsigned short* __restrict__ col,
                                                             const val_t* __restrict__ val, const val_t* __restrict__ xt,
                                                             const val_t* __restrict__ bias, val_t* __restrict__ yt) {
  const int m = (int)m_, n = (int)n_;
  const val_t* xr = xt + (i64)blockIdx.x * n;
  int bad = 0;
  for (int q = threadIdx.x; q < (n >> 3); q += blockDim.x) {
    const uint4 w = RO(reinterpret_cast<const uint4*>(xr) + q);
    const unsigned u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int t = 0; t < 4; ++t) {
#if VAL_KIND == 0
      const unsigned e = 0x7C007C00u;  // float16: exponent all ones is Inf or NaN
#else
      const unsigned e = 0x7F807F80u;  // bfloat16
#endif
      const unsigned lo = e & 0xFFFFu, hi = e & 0xFFFF0000u;
      bad |= ((u[t] & lo) == lo) | ((u[t] & hi) == hi);
    }
  }
  if (!__syncthreads_or(bad)) return;
  val_t* yr = yt + (i64)blockIdx.x * m;
  const int lane = threadIdx.x & 31;
  for (int i = (int)(threadIdx.x >> 5); i < m; i += (int)(blockDim.x >> 5)) {
    const int s = RO(rowptr + i), e = RO(rowptr + i + 1);
    float acc = 0.f;
    for (int p = s + lane; p < e; p += 32) acc += ld(RO(val + p)) * ld(RO(xr + (int)RO(col + p)));
    acc = warp_sum(acc);
    if (lane == 0) yr[i] = st(acc + (bias ? ld(RO(bias + i)) : 0.f));
  }
}

#endif  // VAL_KIND <= 1

// bias added in place to Y (m x k, row-major, or its transpose): y[r * rs + c * cs] += bias[r],
// for the kernels that do not fuse it
extern "C" __global__ void add_bias(i64 m, i64 k, i64 rs, i64 cs, const val_t* __restrict__ bias, val_t* __restrict__ y) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m * k) return;
  i64 r = i / k, c = i - r * k;
  val_t* p = y + r * rs + c * cs;
  *p = st(ld(*p) + ld(RO(bias + r)));
}

// spmm_wd ("warp-decoded"): half-precision CSR SpMM with up to 64 right-hand sides on mma.sync, for a
// pruned linear layer's forward pass: Y^T (k x m) = X^T (k x n) A^T (+ bias), A m x n. Python side:
// _spmm_wd.py (WdSpmm). sm_90 (thread-block clusters, mbarrier try_wait).
//
// Per pattern (made once, wd_layout): the rows are cut into strips of RW rows (one warp's rows), the
// columns into tiles of 64; every stored entry of (strip, tile) is one 32-bit word: low 16 bits the
// value's bits, high 16 bits its place in the warp's RW x 64 A buffer, already swizzled (row r, column
// c -> r 64 + ((c / 8) ^ (r % 8)) 8 + c % 8: ldmatrix reads 8 rows of one 16-byte column chunk from 8
// different bank groups). Words are sorted by (strip, tile); toff[strip T + tile] is the absolute
// offset of a (strip, tile)'s first word (T = ceil(n / 64) tiles, nstrips T + 1 offsets). A new value
// set repacks the low halves only (one gather on the host side).
//
// Launch: clusters of S blocks, S K-splits: block rank q owns the columns [q KR, (q + 1) KR) (KR a
// multiple of 64); ncl clusters walk the row blocks rb = cl, cl + ncl, ... (RB = W RW rows each); grid
// (ncl S, ceil(k / 64)), blockIdx.y the 64-column batch of X^T. A block copies its X^T slice (64 batch
// rows x KR halves, 16-byte chunks swizzled by the batch row) into shared memory with cp.async in NP
// pieces, each completing on its own mbarrier, and keeps it for all its row blocks; a warp waits for
// a piece only before its first tile in that piece (no block barrier in the K loop). Each warp owns two
// A buffers (RW x 64 halves) that stay all-zero outside the tile being multiplied: per tile it loads
// the tile's words (coalesced, a tile ahead, NPL per lane in registers, the rest on the spot), stores
// the values at their places (scatter), ldmatrix.x4 the A fragments (16 x 16 per strip of 16 and k16)
// and the X^T fragments (B: batch rows = the mma's n, 8 n-tiles), mma.sync m16n8k16 with float32
// accumulation, then stores zeros at the places it wrote (clear): never a dense zero-fill per tile.
// Pipelined: tile i's products, then tile i + 1's scatter into the other buffer, __syncwarp, tile i's
// clear, tile i + 2's word loads, __syncwarp.
// Epilogue per row block: each warp writes its float32 sums into its own region of shared memory
// (aliasing its A buffers: [64 batch][RW + 4 rows]); a cluster barrier; block q sums its 1/S of the row
// block's outputs over the S blocks in rank order (distributed shared memory, deterministic), adds the
// bias, stores Y^T; a second cluster barrier; the warps zero their A buffers again for the next row block.
//
// Dense-tile semantics: a non-finite X value reaches every row of its 16 x 16 tiles (0 * Inf = NaN), as
// in the other tensor-core SpMMs of this plugin.
//
// _abl builds read `flags` (benchmarking only, wrong results): 1 return right after the X copy (all
// pieces waited for), 2 skip the K loop (launch + X copy + epilogue), 4 no mma (fragments still loaded),
// 8 no scatter / clear (words still loaded), 16 no X copy.

#if VAL_KIND <= 1 && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900)

#define WD_NP 4  // pieces of the X slice copy (one mbarrier each)

__device__ __forceinline__ void wd_sts16(unsigned addr, unsigned v) {
  asm volatile("st.shared.u16 [%0], %1;" ::"r"(addr), "h"((unsigned short)v) : "memory");
}
__device__ __forceinline__ void wd_sts128z(unsigned addr) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(addr), "r"(0u) : "memory");
}
__device__ __forceinline__ float4 wd_lds4(unsigned addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}

template <int S>
__device__ __forceinline__ void wd_sync() {
  if (S > 1) cluster_sync_all();
  else __syncthreads();
}

// SPW strips of 16 per warp (RW = 16 SPW rows), W warps, S K-splits (cluster size), NPL words per lane held in
// registers per tile, ABL: read the benchmarking flags
template <int SPW, int W, int S, int NPL, int PF, bool ABL>
__device__ __forceinline__ void spmm_wd_body(int m, int n, int k, int KR, int nrb, int ncl, int vec,
                                             const int* __restrict__ toff, const unsigned* __restrict__ words,
                                             const val_t* __restrict__ xt, const val_t* __restrict__ bias,
                                             val_t* __restrict__ yt, int flags) {
  constexpr int RW = SPW * 16, RB = W * RW, THREADS = W * 32;
  constexpr int ABYTES = RW * 128;                 // one A buffer: RW rows x 64 halves
  constexpr int SLD = RW + 4;                      // staging row stride (floats): conflict-free fragment stores
  constexpr int WREG = (64 * SLD * 4 > 2 * ABYTES) ? 64 * SLD * 4 : 2 * ABYTES;  // a warp's region, bytes
  const int fl = ABL ? flags : 0;
  extern __shared__ __align__(128) unsigned char wd_smem[];
  const unsigned sbase = smem_addr(wd_smem);
  const unsigned mbar = sbase;                     // WD_NP mbarriers (8 bytes each)
  const unsigned region = sbase + 128;             // W warp regions (A buffers / staging)
  const unsigned xs = region + W * WREG;           // the X^T slice: 64 rows x KR halves
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3, rr = lane & 7;
  int q = 0;
  if (S > 1) q = (int)cluster_rank();
  const int cl = (int)blockIdx.x / S;
  const int f0 = q * KR;
  const int b0 = (int)blockIdx.y * 64;
  const int kv = min(64, k - b0);
  const int T = (n + 63) >> 6;
  const int t0 = f0 >> 6;
  const int ntl = max(0, min(T, (f0 + KR) >> 6) - t0);  // this block's column tiles
  const int tpp = (ntl + WD_NP - 1) / WD_NP;             // tiles per piece of the X copy
  const int nstrips = (m + RW - 1) / RW;
  const int xrow = KR * 2;                               // bytes per batch row of the slice

  // ---- the X^T slice ----
  if (tid == 0) {
#pragma unroll
    for (int p = 0; p < WD_NP; ++p) mbar_init(mbar + 8 * p, THREADS);
  }
  __syncthreads();
  if (!(fl & 16)) {
    if (vec) {  // n % 8 == 0, X^T 16-byte aligned: 16-byte cp.async, zero-filled past k and n
      for (int p = 0; p < WD_NP; ++p) {
        const int ta = p * tpp, tb = min(ntl, ta + tpp);
        const int cpr = max(0, tb - ta) * 8;  // chunks per batch row in this piece
        const int nch = 64 * cpr;
        for (int c = tid; c < nch; c += THREADS) {
          const int row = c / cpr, ch = ta * 8 + (c - row * cpr);
          const int f = f0 + ch * 8;
          const bool ok = (b0 + row < k) && (f < n);
          const val_t* src = ok ? xt + (i64)(b0 + row) * n + f : xt;
          cpa16(xs + (unsigned)(row * xrow) + (unsigned)((ch ^ (row & 7)) << 4), src, ok ? 16u : 0u);
        }
        cpa_arrive(mbar + 8 * p);
      }
    } else {  // ragged: element by element, then one block barrier
      const int per = ntl * 64;
      for (int e = tid; e < 64 * per; e += THREADS) {
        const int row = e / per, fl2 = e - row * per;
        const int f = f0 + fl2;
        unsigned v = 0u;
        if (b0 + row < k && f < n) v = (unsigned)RO(xt + (i64)(b0 + row) * n + f);
        wd_sts16(xs + (unsigned)(row * xrow) + (unsigned)((((fl2 >> 3) ^ (row & 7)) << 4) + (fl2 & 7) * 2), v);
      }
      __syncthreads();
    }
  }
  const bool wait_x = vec && !(fl & 16);
  if (fl & 1) {
    if (wait_x)
      for (int p = 0; p < WD_NP; ++p) mbar_wait(mbar + 8 * p);
    return;
  }

  // per-lane fragment addresses: A (ldmatrix.x4 of a 16 x 16 tile: matrix lane / 8, row lane % 8) and B
  // (ldmatrix.x4 of two n-tiles: matrix j = lane / 8 -> batch rows 8 (2 np + j / 2) .., k half j % 2)
  const unsigned wreg = region + (unsigned)(warp * WREG);
  const unsigned abuf0 = wreg, abuf1 = wreg + ABYTES;
  const int arow = rr + ((lane >> 3) & 1) * 8;  // + 16 s
  const unsigned a_lane = (unsigned)(arow * 128);
  const int ahalf = lane >> 4;                  // k half of the A matrix this lane addresses
  const int jb = lane >> 3;
  const unsigned b_lane = xs + (unsigned)((8 * (jb >> 1) + rr) * xrow);

  for (int rb = cl; rb < nrb; rb += ncl) {
    // zero this warp's A buffers (the region held the last row block's staging)
    for (int o = lane * 16; o < 2 * ABYTES; o += 32 * 16) wd_sts128z(wreg + (unsigned)o);
    __syncwarp();

    float acc[SPW][8][4];
#pragma unroll
    for (int s = 0; s < SPW; ++s)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[s][nt][c] = 0.f;
    unsigned dummy = 0u;

    const int sg = rb * W + warp;  // the warp's strip
    if (!(fl & 2) && sg < nstrips && ntl > 0) {
      const int offv = lane <= ntl ? RO(toff + (i64)sg * T + t0 + lane) : 0;
      unsigned wa[NPL], wb[NPL];
      int oa = 0, ca = 0, ob = 0, cb = 0;
      auto load = [&](int i, unsigned (&w)[NPL], int& o, int& c) {
        o = __shfl_sync(0xffffffffu, offv, i);
        c = __shfl_sync(0xffffffffu, offv, i + 1) - o;
#pragma unroll
        for (int u = 0; u < NPL; ++u) {
          const int j = u * 32 + lane;
          w[u] = j < c ? __ldg(words + o + j) : 0xffffffffu;
        }
      };
      auto scatter = [&](unsigned abuf, const unsigned (&w)[NPL], int o, int c, bool zero) {
        if (fl & 8) {
#pragma unroll
          for (int u = 0; u < NPL; ++u) dummy ^= w[u];
          return;
        }
#pragma unroll
        for (int u = 0; u < NPL; ++u)
          if (w[u] != 0xffffffffu) wd_sts16(abuf + ((w[u] >> 16) << 1), zero ? 0u : w[u]);
        for (int j = NPL * 32 + lane; j < c; j += 32) {
          const unsigned x = __ldg(words + o + j);
          wd_sts16(abuf + ((x >> 16) << 1), zero ? 0u : x);
        }
      };
      auto products = [&](unsigned abuf, int i) {
        if (wait_x && i % tpp == 0) mbar_wait(mbar + 8 * (i / tpp));
        const unsigned xb = b_lane + (unsigned)(i * 128);  // tile i: chunks 8 i .. 8 i + 7 of each row
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          unsigned b[8][2];
          const unsigned xoff = (unsigned)((((2 * kk + (jb & 1)) ^ rr)) << 4);
#pragma unroll
          for (int np = 0; np < 4; ++np) {
            unsigned r[4];
            ldsm_x4(r, xb + (unsigned)(np * 16 * xrow) + xoff);
            b[2 * np][0] = r[0];
            b[2 * np][1] = r[1];
            b[2 * np + 1][0] = r[2];
            b[2 * np + 1][1] = r[3];
          }
          const unsigned aoff = (unsigned)(((2 * kk + ahalf) ^ rr) << 4);
#pragma unroll
          for (int s = 0; s < SPW; ++s) {
            unsigned a[4];
            ldsm_x4(a, abuf + a_lane + (unsigned)(s * 16 * 128) + aoff);
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
              if (fl & 4) acc[s][nt][0] += __uint_as_float((a[0] ^ b[nt][0] ^ a[3] ^ b[nt][1]) & 0x00ffffffu);
              else mma16816_free(acc[s][nt], a, b[nt][0], b[nt][1]);
            }
          }
        }
      };
      // tile i in buffer (cur), its words (wc); tile i + 1's words (wn); tile i + PF + 1's words loaded into wc
      auto step = [&](int i, unsigned (&wc)[NPL], int& oc, int& cc, unsigned (&wn)[NPL], int on, int cn) {
        const unsigned cur = (i & 1) ? abuf1 : abuf0, nxt = (i & 1) ? abuf0 : abuf1;
        products(cur, i);
        if (i + 1 < ntl) scatter(nxt, wn, on, cn, false);
        __syncwarp();
        scatter(cur, wc, oc, cc, true);
        if (i + PF + 1 < ntl) load(i + PF + 1, wc, oc, cc);
        __syncwarp();
      };
      load(0, wa, oa, ca);
      if (ntl > 1) load(1, wb, ob, cb);
      if (PF == 1) {
        scatter(abuf0, wa, oa, ca, false);
        __syncwarp();
        for (int i = 0; i < ntl; i += 2) {
          step(i, wa, oa, ca, wb, ob, cb);
          if (i + 1 < ntl) step(i + 1, wb, ob, cb, wa, oa, ca);
        }
      } else {  // three register sets: words two tiles ahead of their scatter
        unsigned wz[NPL];
        int oz = 0, cz = 0;
        if (PF != 1) {
          if (ntl > 2) load(2, wz, oz, cz);
          scatter(abuf0, wa, oa, ca, false);
          __syncwarp();
          for (int i = 0; i < ntl; i += 3) {
            step(i, wa, oa, ca, wb, ob, cb);
            if (i + 1 < ntl) step(i + 1, wb, ob, cb, wz, oz, cz);
            if (i + 2 < ntl) step(i + 2, wz, oz, cz, wa, oa, ca);
          }
        }
      }
    }
    if (ABL && (fl & 8)) acc[0][0][0] += __uint_as_float(dummy & 0x00ffffffu);

    // ---- epilogue: the warp's sums into its region [64 batch][SLD], cluster sum, bias, Y^T ----
    __syncwarp();
    {
      const unsigned st0 = wreg;
#pragma unroll
      for (int s = 0; s < SPW; ++s)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const int bb = nt * 8 + 2 * t4, r = s * 16 + g;
          const unsigned p0 = st0 + (unsigned)((bb * SLD + r) * 4);
          asm volatile("st.shared.f32 [%0], %1;" ::"r"(p0), "f"(acc[s][nt][0]) : "memory");
          asm volatile("st.shared.f32 [%0], %1;" ::"r"(p0 + SLD * 4), "f"(acc[s][nt][1]) : "memory");
          asm volatile("st.shared.f32 [%0], %1;" ::"r"(p0 + 32), "f"(acc[s][nt][2]) : "memory");
          asm volatile("st.shared.f32 [%0], %1;" ::"r"(p0 + SLD * 4 + 32), "f"(acc[s][nt][3]) : "memory");
        }
    }
    wd_sync<S>();  // every block's sums of this row block written
    {
      constexpr int UPB = RB / 4;  // float4 units per batch column
      const int U = UPB * 64;
      const int u0 = U * q / S, u1 = U * (q + 1) / S;
      const int row0 = rb * RB;
      const bool vst = (m & 3) == 0;
      for (int u = u0 + tid; u < u1; u += THREADS) {
        const int bb = u / UPB, r4 = (u - bb * UPB) * 4;
        const int row = row0 + r4;
        if (bb >= kv || row >= m) continue;
        const unsigned addr = region + (unsigned)((r4 / RW) * WREG + (bb * SLD + (r4 % RW)) * 4);
        float4 sum;
        if (S > 1) {
          sum = ld_cluster(addr, 0u);
#pragma unroll
          for (int rk = 1; rk < S; ++rk) {
            const float4 o = ld_cluster(addr, (unsigned)rk);
            sum.x += o.x;
            sum.y += o.y;
            sum.z += o.z;
            sum.w += o.w;
          }
        } else {
          sum = wd_lds4(addr);
        }
        float sv[4] = {sum.x, sum.y, sum.z, sum.w};
        val_t* yp = yt + (i64)(b0 + bb) * m + row;
        if (vst && row + 4 <= m) {
          unsigned short o[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) o[i] = st(sv[i] + (bias ? ld(RO(bias + row + i)) : 0.f));
          *reinterpret_cast<uint2*>(yp) =
              make_uint2((unsigned)o[0] | ((unsigned)o[1] << 16), (unsigned)o[2] | ((unsigned)o[3] << 16));
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            if (row + i < m) yp[i] = st(sv[i] + (bias ? ld(RO(bias + row + i)) : 0.f));
        }
      }
    }
    wd_sync<S>();  // no block writes its region again (or leaves) while another still reads it
  }
  if (wait_x)  // no copy still in flight at exit (only the _abl builds can skip every wait above)
    for (int p = 0; p < WD_NP; ++p) mbar_wait(mbar + 8 * p);
}

// spmm_wd_p<SPW>_w<W>_s<S>[_abl]: SPW strips of 16 rows per warp, W warps, clusters of S blocks (S K-splits)
#define SPMM_WD(SPW, W, S, NPL, MINB, ABL, ASFX, ATTR, PF, FSFX)                                                      \
  extern "C" __global__ void ATTR __launch_bounds__(W * 32, MINB) spmm_wd_p##SPW##_w##W##_s##S##FSFX##ASFX(           \
      i64 m, i64 n, i64 k, i64 KR, i64 nrb, i64 ncl, i64 vec, const int* toff, const unsigned* words, const val_t* xt, \
      const val_t* bias, val_t* yt, i64 flags) {                                                                      \
    spmm_wd_body<SPW, W, S, NPL, PF, ABL>((int)m, (int)n, (int)k, (int)KR, (int)nrb, (int)ncl, (int)vec, toff, words, xt,  \
                                      bias, yt, (int)flags);                                                          \
  }
#define SPMM_WD_CFG2(SPW, W, NPL, MINB, PF, FSFX)                                            \
  SPMM_WD(SPW, W, 1, NPL, MINB, false, , , PF, FSFX)                                         \
  SPMM_WD(SPW, W, 2, NPL, MINB, false, , __cluster_dims__(2, 1, 1), PF, FSFX)                \
  SPMM_WD(SPW, W, 4, NPL, MINB, false, , __cluster_dims__(4, 1, 1), PF, FSFX)                \
  SPMM_WD(SPW, W, 8, NPL, MINB, false, , __cluster_dims__(8, 1, 1), PF, FSFX)                \
  SPMM_WD(SPW, W, 8, NPL, MINB, true, _abl, __cluster_dims__(8, 1, 1), PF, FSFX)
#define SPMM_WD_CFG(SPW, W, NPL, MINB) SPMM_WD_CFG2(SPW, W, NPL, MINB, 1, )

// the configurations (_spmm_wd.WD_CONFIGS): (SPW, W, NPL words per lane in registers, blocks per SM the
// registers are bounded for); "_f2": the words two tiles ahead (three register sets)
SPMM_WD_CFG(1, 8, 5, 2)
SPMM_WD_CFG(2, 4, 8, 2)
SPMM_WD_CFG(2, 8, 8, 1)
SPMM_WD_CFG(4, 2, 16, 2)
SPMM_WD_CFG(4, 4, 16, 1)
SPMM_WD_CFG(2, 5, 8, 2)
SPMM_WD_CFG2(2, 4, 8, 2, 2, _f2)
SPMM_WD_CFG2(2, 5, 8, 2, 2, _f2)
SPMM_WD_CFG2(2, 8, 8, 1, 2, _f2)
SPMM_WD_CFG2(1, 8, 5, 2, 2, _f2)

#endif

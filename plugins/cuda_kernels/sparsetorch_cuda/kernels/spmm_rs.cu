// spmm_rs ("resident"): half-precision SpMM with up to 64 right-hand sides on mma.sync, Y^T (k x m) = X^T (k x n)
// A^T (+ bias), A m x n, for a pruned linear layer's forward pass. Python side: _spmm_rs.py (RsSpmm). sm_90
// (thread-block clusters).
//
// Why another design: spmm_pb (pair-bitmap A fragments decoded in registers) and the shared-memory tile kernels
// before it (fl / ws / bm / cc / wd) all stall on chains of dependent global loads inside the K loop (header ->
// A words -> products, one or a few column blocks ahead, 1-2 warps per scheduler): session 25 measured removing
// the products, the A loads or the B loads each changes nothing. Here a block first issues asynchronous copies of
// everything its K range needs into shared memory (its tiles' headers and pair words and its X^T slice, the latter
// read where it lies, no permute launch), in RS_NP pieces along K, each completing on its own mbarrier; the K loop
// then reads shared memory only, waiting once per piece. A block of W warps owns R = 16 MS W rows (warp w: MS
// strips of 16) and one of S K-splits (cluster rank q; the S partial sums met on chip by tile_epilogue).
//
// The A fragments are spmm_pb's (see spmm_pb.cu for the k permutation): per tile of 16 rows x 32 columns a 256-bit
// map, bit 8 L + i set where lane L's register slot i holds a nonzero pair; the tile's pairs as 32-bit words in
// map-bit order. The layout (_spmm_rs.rs_layout) orders tiles by (row block, column block, strip of the block),
// pads each (row block, column block) group of words to 16 bytes (so any range of column blocks is a 16-byte
// aligned run: `gbase`, the groups' first words), and stores each header offset relative to its row block's first
// word. The B fragments: lane (g, t) of n-tile j takes the 16 bytes X^T[8 j + g][32 blk + 8 t .. + 7] of the slice
// (row stride XST, an odd multiple of 64 bytes: the quarter-warps' 16-byte loads are conflict-free).
//
// Shared memory: RS_NP mbarriers (128 bytes), X^T slice [64][XST], headers [nbmax][NST][8] uint2, the words of the
// widest segment; after the loop the float32 sums [64 batch][R + 4] reuse it.
//
// `vec`: n % 8 == 0 and X^T 16-byte aligned (the slice copied by 16-byte cp.async, zero-filled past k and n);
// otherwise the slice is filled element by element before the loop (one block barrier).
//
// Dense-tile semantics: a non-finite X value reaches every row of its tiles whose pair holds a zero next to an
// entry or whose registers are zero (0 * Inf = NaN), as in the other tensor-core SpMMs of this plugin.
//
// _abl builds read `flags` (benchmarking only, wrong results): 1 return after the copies completed, 2 skip the K
// loop (copies + epilogue), 4 no mma (loads kept), 8 no A words read (maps still decoded), 16 no copies and no K loop
// (launch + epilogue), 32 the epilogue without the cluster sum (each block stores its own partial sums).

#if VAL_KIND <= 1 && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900)

#define RS_NP 4  // pieces of a block's copies (one mbarrier each)

__device__ __forceinline__ uint4 rs_lds128(unsigned addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 rs_lds64(unsigned addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ unsigned rs_lds32(unsigned addr) {
  unsigned v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}

template <int MS, int W, int S, bool ABL>
__device__ __forceinline__ void spmm_rs_body(int m, int n, int k, int nkb, int nbmax, int vec,
                                             const uint2* __restrict__ hdr, const unsigned* __restrict__ words,
                                             const int* __restrict__ gbase, const val_t* __restrict__ xt,
                                             const val_t* __restrict__ bias, val_t* __restrict__ yt, int flags) {
  constexpr int NST = MS * W, R = 16 * NST, THREADS = 32 * W, PLD = R + 4;
  const int fl = ABL ? flags : 0;
  extern __shared__ __align__(128) unsigned char rs_smem[];
  const unsigned sbase = smem_addr(rs_smem);
  const unsigned mbar = sbase;
  const int XST = 64 * (2 * ((nbmax + 1) >> 1) + 1);
  const unsigned xs = sbase + 128;
  const unsigned hs = xs + (unsigned)(64 * XST);
  const unsigned ws = hs + (unsigned)(nbmax * NST * 64);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  int q = 0;
  if (S > 1) q = (int)cluster_rank();
  const int rb = (int)blockIdx.x / S;
  const int b0 = (int)blockIdx.y * 64;
  const int kb0 = (int)((long long)nkb * q / S), kb1 = (int)((long long)nkb * (q + 1) / S);
  const int nb = kb1 - kb0;
  const i64 gb = (i64)rb * nkb + kb0;  // this segment's first (row block, column block) group

  // ---- the copies, piece by piece: headers and X^T first (they need no lookup), then the words ----
  if (tid == 0) {
#pragma unroll
    for (int p = 0; p < RS_NP; ++p) mbar_init(mbar + 8 * p, THREADS);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int wseg = __ldg(gbase + gb);
  for (int p = 0; p < RS_NP && !(fl & 16); ++p) {
    const int bs = nb * p / RS_NP, be = nb * (p + 1) / RS_NP;
    const int nh = (be - bs) * NST * 4;  // 16-byte chunks of headers (64 bytes a tile)
    const char* hsrc = reinterpret_cast<const char*>(hdr + (gb + bs) * NST * 8);
    for (int c = tid; c < nh; c += THREADS) cpa16(hs + (unsigned)(bs * NST * 64 + c * 16), hsrc + (i64)c * 16, 16u);
    if (vec) {
      const int cpr = (be - bs) * 4;  // 16-byte chunks per batch row
      for (int c = tid; c < 64 * cpr; c += THREADS) {
        const int row = c / cpr, ch = c - row * cpr;
        const int f = 32 * (kb0 + bs) + 8 * ch;
        const bool ok = (b0 + row < k) && (f < n);
        const val_t* src = ok ? xt + (i64)(b0 + row) * n + f : xt;
        cpa16(xs + (unsigned)(row * XST + bs * 64 + ch * 16), src, ok ? 16u : 0u);
      }
    }
    const int wa = __ldg(gbase + gb + bs), wb = __ldg(gbase + gb + be);
    const int nw = (wb - wa) >> 2;  // 16-byte chunks of words (groups are padded to 4 words)
    for (int c = tid; c < nw; c += THREADS)
      cpa16(ws + (unsigned)((wa - wseg) * 4 + c * 16), words + (i64)wa + 4 * c, 16u);
    cpa_arrive(mbar + 8 * p);
  }
  if (fl & 16)
    for (int p = 0; p < RS_NP; ++p) cpa_arrive(mbar + 8 * p);
  if (!vec && !(fl & 16)) {  // ragged X^T: element by element, zero past k and n
    const int per = nb * 32;
    for (int e = tid; e < 64 * per; e += THREADS) {
      const int row = e / per, fc = e - row * per;
      const int f = 32 * kb0 + fc;
      unsigned v = 0u;
      if (b0 + row < k && f < n) v = (unsigned)RO(xt + (i64)(b0 + row) * n + f);
      asm volatile("st.shared.u16 [%0], %1;" ::"r"(xs + (unsigned)(row * XST + (fc >> 5) * 64 + (fc & 31) * 2)),
                   "h"((unsigned short)v) : "memory");
    }
    __syncthreads();
  }
  if (fl & 1) {
    for (int p = 0; p < RS_NP; ++p) mbar_wait(mbar + 8 * p);
    return;
  }

  float acc[MS][8][4];
#pragma unroll
  for (int s = 0; s < MS; ++s)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[s][j][c] = 0.f;

  // header offsets count from the row block's first word; the segment's words start at its group gb
  const int shift = wseg - __ldg(gbase + (i64)rb * nkb);
  const unsigned below = (1u << (8 * t4)) - 1u;
  const unsigned xlane = xs + (unsigned)(g * XST + t4 * 16);
  const unsigned hlane = hs + (unsigned)((warp * MS * 8 + g) * 8);
  int waited = 0;  // pieces waited for
  if (!(fl & 18)) {
    for (int lb = 0; lb < nb; ++lb) {
      while (waited < RS_NP && nb * waited / RS_NP <= lb) {
        mbar_wait(mbar + 8 * waited);
        ++waited;
      }
      uint4 b[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) b[j] = rs_lds128(xlane + (unsigned)(8 * j * XST + lb * 64));
      unsigned a[MS][8];
#pragma unroll
      for (int s = 0; s < MS; ++s) {
        const uint2 h = rs_lds64(hlane + (unsigned)((lb * NST + s) * 64));
        const unsigned byte = (h.x >> (8 * t4)) & 0xffu;
        const unsigned pos = (unsigned)((int)h.y - shift) + (unsigned)__popc(h.x & below);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          unsigned v = 0u;
          if (!(fl & 8) && ((byte >> i) & 1u)) v = rs_lds32(ws + 4u * (pos + (unsigned)__popc(byte & ((1u << i) - 1u))));
          a[s][i] = v;
        }
      }
#pragma unroll
      for (int st = 0; st < 2; ++st)
#pragma unroll
        for (int s = 0; s < MS; ++s)
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const unsigned b0w = st ? b[j].z : b[j].x, b1w = st ? b[j].w : b[j].y;
            if (fl & 4) acc[s][j][0] += __uint_as_float((a[s][4 * st] ^ a[s][4 * st + 3] ^ b0w ^ b1w) & 0x00ffffffu);
            else mma16816_free(acc[s][j], &a[s][4 * st], b0w, b1w);
          }
    }
  }
  // every copy must have landed before the sums reuse the space
  for (; waited < RS_NP; ++waited) mbar_wait(mbar + 8 * waited);
  __syncthreads();

  // ---- epilogue: sums into shared memory [64 batch][PLD], cluster sum in rank order, bias, Y^T ----
  float* P = reinterpret_cast<float*>(rs_smem + 128);
  strip_sums<MS, PLD>(P, acc, warp, g, t4);
  const int kv = min(64, k - b0);
  const int bb0 = 64 * q / S, bb1 = min(64 * (q + 1) / S, kv);
  const bool red = S > 1 && !(fl & 32);
  tile_epilogue<S, THREADS, R, PLD>(P, red, red, bb0, max(bb0, bb1), 0, tid, b0, rb * R, m, k, bias, yt);
}

#define SPMM_RS(MS, W, S, MINB, ABL, ASFX, ATTR)                                                                     \
  extern "C" __global__ void ATTR __launch_bounds__(W * 32, MINB) spmm_rs_p##MS##_w##W##_s##S##ASFX(                \
      i64 m, i64 n, i64 k, i64 nkb, i64 nbmax, i64 vec, const uint2* hdr, const unsigned* words, const int* gbase,  \
      const val_t* xt, const val_t* bias, val_t* yt, i64 flags) {                                                    \
    spmm_rs_body<MS, W, S, ABL>((int)m, (int)n, (int)k, (int)nkb, (int)nbmax, (int)vec, hdr, words, gbase, xt,     \
                                bias, yt, (int)flags);                                                              \
  }
#define SPMM_RS_CFG(MS, W, MINB)                                       \
  SPMM_RS(MS, W, 1, MINB, false, , )                                   \
  SPMM_RS(MS, W, 2, MINB, false, , __cluster_dims__(2, 1, 1))          \
  SPMM_RS(MS, W, 4, MINB, false, , __cluster_dims__(4, 1, 1))          \
  SPMM_RS(MS, W, 8, MINB, false, , __cluster_dims__(8, 1, 1))          \
  SPMM_RS(MS, W, 8, MINB, true, _abl, __cluster_dims__(8, 1, 1))

// the configurations (_spmm_rs.RS_CONFIGS): (MS strips of 16 rows per warp, W warps, blocks per SM the registers
// are bounded for)
SPMM_RS_CFG(1, 8, 2)
SPMM_RS_CFG(2, 4, 2)
SPMM_RS_CFG(2, 8, 1)
SPMM_RS_CFG(1, 16, 1)

#endif

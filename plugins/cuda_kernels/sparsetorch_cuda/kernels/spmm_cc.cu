// Half-precision CSR SpMM with several right-hand sides on mma.sync, roles swapped: the batch is the
// MMA's M and 8 rows of A (a "strip") its N, Y^T (k x m) = X^T (k x n) A^T. Python side: _spmm_cc.py.
//
// Per pattern (made once by the plan, cc_layout): n is cut into C K-slices of KS features (KS a multiple
// of 16; slice q = features [q KS, (q + 1) KS)). For strip s and slice q, only the union of the strip's
// 8 rows' columns in the slice matters; it is cut into steps of 16 columns (the last padded), so one step
// is one k16 x n8 B operand of mma.m16n8k16. Steps are stored group by group (group g = s C + q,
// steps sptr[g] .. sptr[g + 1]); per step:
//   cols[16 st + j]  (uint16) the slice-local feature of the step's column j (padding: any, its B is 0)
//   bv[32 st + lane] (8 bytes) lane's B fragment: A[8 s + lane / 4][col 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9]
//                    (t4 = lane % 4), zero where A has no entry (the values packed once per value set).
// spmm_ccz_* (FMT 1) reads B compressed by 4-byte register instead: recs[st] = (bitmap of the step's 64 B
// registers, lane l's b0 / b1 at bits 2 l / 2 l + 1, as two words; the step's first word in bv), and bv
// holds only the registers that are not zero, step after step; a lane counts the bits below its own to
// find its words (at 10 % density about a third of the registers are nonzero: ~130 instead of ~290 bytes
// a step). The records are loaded CC_PF steps ahead, the words CC_PF / 2 steps ahead.
// The plan orders each group's columns so that the 8 columns of each half-step have distinct f % 8 where
// it can: the gathered rows then hit distinct banks (see the swizzle below).
//
// Launch: clusters of C blocks (rank q = slice q), ncl clusters, grid (ncl C, ceil(k / 64)), NW = 16 warps.
// A block keeps its slice of X feature-major in shared memory (KS rows of 64 batch values = 128 bytes,
// the eight 16-byte chunks of feature f stored at chunk ^ (f % 8)), transposed on the way in by
// movmatrix. Cluster cl owns an even share [s_lo, s_hi) of the strips and walks it in rounds of NW: in
// round r warp w runs strip s_lo + r NW + w (A fragments of the NMT batch tiles by ldmatrix.x4.trans at
// the gathered features, the B fragment one 8-byte load, prefetched CC_PF steps ahead; the next round's
// first steps are fetched before the barrier) and writes its 64 x 8 float32 partial sums to shared
// memory (double-buffered by round parity). The step arrays are padded by CC_PF steps, so the
// prefetch past a strip's end needs no bounds check. A cluster barrier; then each block sums its 1/C share of
// the round's outputs over the C blocks (distributed shared memory, rank order: deterministic), adds the
// bias and stores Y^T. One barrier per round: a block writes a buffer again only after every block has
// passed the next round's barrier, i.e. finished reading it.
//
// flags (benchmarking only, wrong results): 1 skips the products, 2 the A loads (ldmatrix), 4 the pattern
// loads (cols / bv), 8 the X slice load.

#define CC_PF 8     // steps prefetched ahead per warp
#define CC_XB 128   // bytes per feature row of X in shared memory (64 batch halves)

__device__ __forceinline__ void cc_ldsm4t(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ unsigned cc_movt(unsigned x) {
  unsigned y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ void cc_sts32(unsigned addr, unsigned v) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}


#if VAL_KIND <= 1
template <int C>
__device__ __forceinline__ void cc_sync() {
#if __CUDA_ARCH__ >= 900
  if (C > 1) {
    cluster_sync_all();
    return;
  }
#endif
  __syncthreads();
}

template <int C>
__device__ __forceinline__ float4 cc_ld_part(unsigned addr, int rank) {
#if __CUDA_ARCH__ >= 900
  if (C > 1) return ld_cluster(addr, (unsigned)rank);
#endif
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}

// C K-slices (cluster size), NW warps, FMT (0 dense B, 1 compressed), NMT batch tiles of 16 (1: k <= 16, 4: the 64
// columns of a block), ABL: the benchmarking flags read (otherwise ignored), ONE: every round's partial sums kept
// (one buffer per round, the host sizes shared memory for them) and summed over the cluster once, after the last
// round, instead of one cluster barrier and one reduction per round (session 12: the per-round cost, ~6.5 us at
// k = 64 with the products and loads switched off, was the whole kernel's time)
template <int C, int NW, int FMT, int NMT, bool ABL, bool ONE>
__device__ __forceinline__ void spmm_cc_body(int m, int n, int k, int KS, int nstrips, int ncl, const int* __restrict__ sptr,
                                             const unsigned short* __restrict__ cols, const uint2* __restrict__ bv,
                                             const uint4* __restrict__ recs, const val_t* __restrict__ xt,
                                             const val_t* __restrict__ bias, val_t* __restrict__ yt, int flags) {
  constexpr int THREADS = NW * 32, SPR = NW;
  constexpr int PBUF = SPR * 64 * 8;  // floats per partial-sum buffer: [SPR strips][64 batch][8 rows]
  const int fl = ABL ? flags : 0;
  extern __shared__ __align__(16) unsigned char cc_smem[];
  float* P = reinterpret_cast<float*>(cc_smem);
  const unsigned pbase = smem_addr(cc_smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  int q = 0;
#if __CUDA_ARCH__ >= 900
  if (C > 1) q = (int)cluster_rank();
#endif
  const int cl = (int)blockIdx.x / C;
  const int f0 = q * KS;
  const int b0 = (int)blockIdx.y * 64;
  const int kv = min(64, k - b0);
  // the cluster's strips: an even share [s_lo, s_hi), NW a round (warp w: s_lo + r NW + w)
  const int s_lo = (int)((long long)nstrips * cl / ncl), s_hi = (int)((long long)nstrips * (cl + 1) / ncl);
  const int per = (nstrips + ncl - 1) / ncl;
  const int rounds = (per + NW - 1) / NW;  // the same in every cluster (the barriers)
  // the X slice after the partial-sum buffers (two; ONE: one a round)
  const unsigned xs = pbase + (unsigned)(ONE ? rounds : 2) * PBUF * 4u;
  const int jl = ((lane >> 4) << 3) + (lane & 7);
  const unsigned hi = (lane >> 3) & 1;
  const unsigned* vw = reinterpret_cast<const unsigned*>(bv);

  uint2 rb[CC_PF];
  unsigned rc[CC_PF];
  uint4 rr[CC_PF];
  // stage a: columns and B (FMT 0) or the record (FMT 1) of step st (any st < steps + CC_PF: the arrays are padded)
  auto fetch_a = [&](i64 st, uint2& b, unsigned& c, uint4& rec) {
    if (fl & 4) {
      c = (unsigned)(lane & 7);
      b = make_uint2(0u, 0u);
      rec = make_uint4(0u, 0u, 0u, 0u);
      return;
    }
    c = RO(cols + st * 16 + jl);
    if (FMT == 0) b = __ldg(bv + st * 32 + lane);
    else rec = __ldg(recs + st);
  };
  // stage b (FMT 1): the lane's two B registers from the packed words
  auto fetch_b = [&](const uint4& rec, uint2& b) {
    if (FMT == 0) return;
    const unsigned sh = 2u * (unsigned)lane;
    unsigned below, bits;
    if (lane < 16) {
      below = __popc(rec.x & ((1u << sh) - 1u));
      bits = (rec.x >> sh) & 3u;
    } else {
      below = __popc(rec.x) + __popc(rec.y & ((1u << (sh - 32u)) - 1u));
      bits = (rec.y >> (sh - 32u)) & 3u;
    }
    const i64 w = (i64)rec.z + below;
    b.x = (bits & 1u) ? __ldg(vw + w) : 0u;
    b.y = (bits & 2u) ? __ldg(vw + w + (bits & 1u)) : 0u;
  };
  // a round's strip for this warp: its first step and step count in slice q (0 steps past the share)
  auto strip_range = [&](int r, int& a, int& l) {
    const int s = s_lo + r * NW + warp;
    a = 0;
    l = 0;
    if (s < s_hi) {
      a = RO(sptr + (i64)s * C + q);
      l = RO(sptr + (i64)s * C + q + 1) - a;
    }
  };
  auto prefetch = [&](int a) {
#pragma unroll
    for (int u = 0; u < CC_PF; ++u) fetch_a((i64)a + u, rb[u], rc[u], rr[u]);
#pragma unroll
    for (int u = 0; u < CC_PF / 2; ++u) fetch_b(rr[u], rb[u]);
  };

  int a0, l0;
  strip_range(0, a0, l0);
  prefetch(a0);

  // X slice [f0, f0 + KS) x [b0, b0 + 16 NMT) into shared memory, feature-major, transposed by movmatrix
  if (!(fl & 8)) {
    constexpr int BT = 2 * NMT;  // batch tiles of 8
    const int ntiles = (KS / 8) * BT;
    const bool even = (n & 1) == 0;
    for (int t0 = warp; t0 < ntiles; t0 += NW * 16) {
      unsigned v[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int t = t0 + NW * i;
        v[i] = 0u;
        if (t < ntiles) {
          const int ft = t / BT, bt = t % BT;
          const int b = b0 + bt * 8 + (lane >> 2), fa = f0 + ft * 8 + 2 * t4;
          if (b < k && fa < n) {
            const val_t* p = xt + (i64)b * n + fa;
            if (even) v[i] = __ldg(reinterpret_cast<const unsigned*>(p));
            else v[i] = (unsigned)RO(p) | (fa + 1 < n ? ((unsigned)RO(p + 1) << 16) : 0u);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int t = t0 + NW * i;
        if (t < ntiles) {  // warp-uniform
          const int ft = t / BT, bt = t % BT;
          const unsigned w = cc_movt(v[i]);
          const int f = ft * 8 + (lane >> 2);
          cc_sts32(xs + (unsigned)f * CC_XB + (unsigned)((bt ^ (f & 7)) << 4) + (unsigned)(t4 * 4), w);
        }
      }
    }
  }
  __syncthreads();

  // the cluster sum of rounds [rf, rf + nr) (their buffers: ONE, one a round; else round rf's of two), bias, Y^T
  auto reduce = [&](int rf, int nr) {
    constexpr int TOT = SPR * 128;
    const int tot = TOT * nr;
    const int e0 = tot * q / C, e1 = tot * (q + 1) / C;
    const unsigned pb = pbase + (unsigned)(ONE ? 0 : (rf & 1) * PBUF * 4);
    for (int e = e0 + tid; e < e1; e += THREADS) {
      const int rr = rf + e / TOT, w = e % TOT;
      const int j = w >> 7, bb = (w >> 1) & 63, h = w & 1;
      const int s = s_lo + rr * NW + j;
      if (s >= s_hi || bb >= kv) continue;
      float4 sum = cc_ld_part<C>(pb + (unsigned)e * 16u, 0);
#pragma unroll
      for (int rk = 1; rk < C; ++rk) {
        const float4 o = cc_ld_part<C>(pb + (unsigned)e * 16u, rk);
        sum.x += o.x;
        sum.y += o.y;
        sum.z += o.z;
        sum.w += o.w;
      }
      const int row = s * 8 + h * 4;
      float sv[4] = {sum.x, sum.y, sum.z, sum.w};
      val_t* yp = yt + (i64)(b0 + bb) * m + row;
      if (row + 4 <= m && (m & 3) == 0) {
        unsigned short o[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) o[i] = st(sv[i] + (bias ? ld(RO(bias + row + i)) : 0.f));
        *reinterpret_cast<uint2*>(yp) = make_uint2((unsigned)o[0] | ((unsigned)o[1] << 16), (unsigned)o[2] | ((unsigned)o[3] << 16));
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (row + i < m) yp[i] = st(sv[i] + (bias ? ld(RO(bias + row + i)) : 0.f));
      }
    }
  };

  for (int r = 0; r < rounds; ++r) {
    float acc[NMT][4];
#pragma unroll
    for (int i = 0; i < NMT; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][c] = 0.f;
    auto step = [&](unsigned c, const uint2& b) {
      const unsigned ra = xs + c * CC_XB;
      const unsigned x0 = (c & 7u) ^ hi;  // the swizzled 16-byte chunk of batch tile mt: x0 ^ 2 mt
#pragma unroll
      for (int mt = 0; mt < NMT; ++mt) {
        unsigned a[4];
        if (fl & 2) {
          a[0] = a[1] = a[2] = a[3] = c;
        } else {
          cc_ldsm4t(a, ra + ((x0 ^ (unsigned)(2 * mt)) << 4));
        }
        if (!(fl & 1)) mma16816_free(acc[mt], a, b.x, b.y);
        else acc[mt][0] += __uint_as_float(a[0] ^ a[1] ^ a[2] ^ a[3] ^ b.x ^ b.y);
      }
    };
    int p0 = 0;
    for (; p0 + CC_PF <= l0; p0 += CC_PF) {
#pragma unroll
      for (int u = 0; u < CC_PF; ++u) {
        step(rc[u], rb[u]);
        fetch_a((i64)a0 + p0 + u + CC_PF, rb[u], rc[u], rr[u]);
        fetch_b(rr[(u + CC_PF / 2) % CC_PF], rb[(u + CC_PF / 2) % CC_PF]);
      }
    }
    {
      const int rem = l0 - p0;
#pragma unroll
      for (int u = 0; u < CC_PF; ++u) {
        if (u < rem) {
          step(rc[u], rb[u]);
          if (u < CC_PF / 2 && u + CC_PF / 2 < rem) fetch_b(rr[u + CC_PF / 2], rb[u + CC_PF / 2]);
        }
      }
    }
    // this strip's partial sums into the round's buffer
    float* pp = P + (ONE ? r : (r & 1)) * PBUF + warp * 512;
#pragma unroll
    for (int mt = 0; mt < NMT; ++mt) {
      *reinterpret_cast<float2*>(pp + (mt * 16 + g) * 8 + 2 * t4) = make_float2(acc[mt][0], acc[mt][1]);
      *reinterpret_cast<float2*>(pp + (mt * 16 + g + 8) * 8 + 2 * t4) = make_float2(acc[mt][2], acc[mt][3]);
    }
    // the next round's strip: its first steps in flight across the barrier and the reduction
    if (r + 1 < rounds) {
      strip_range(r + 1, a0, l0);
      prefetch(a0);
    }
    if (!ONE) {
      cc_sync<C>();  // every block's partial sums of round r written
      reduce(r, 1);
    }
  }
  if (ONE) {
    cc_sync<C>();  // every block's partial sums of every round written
    reduce(0, rounds);
  }
#if __CUDA_ARCH__ >= 900
  if (C > 1) cluster_sync_all();  // no block leaves while another still reads its shared memory
#endif
}

// spmm_cc{,z}_c<C>_n<NMT>[_o][_abl]: clusters of C blocks (C K-slices), 16 warps, B dense ("") or compressed ("z"),
// NMT batch tiles of 16; _o: one reduction after the last round (ONE; dense B only); _abl: reads the benchmarking flags
#define CC_NW 16
#define SPMM_CC(C, FMT, SFX, NMT, ABL, ASFX, ATTR, ONE)                                                                \
  extern "C" __global__ void ATTR __launch_bounds__(CC_NW * 32, 1) spmm_cc##SFX##_c##C##_n##NMT##ASFX(                 \
      i64 m, i64 n, i64 k, i64 KS, i64 nstrips, i64 ncl, const int* sptr, const unsigned short* cols, const uint2* bv, \
      const uint4* recs, const val_t* xt, const val_t* bias, val_t* yt, i64 flags) {                                   \
    spmm_cc_body<C, CC_NW, FMT, NMT, ABL, ONE>((int)m, (int)n, (int)k, (int)KS, (int)nstrips, (int)ncl, sptr, cols, bv,     \
                                          recs, xt, bias, yt, (int)flags);                                             \
  }
#define SPMM_CC_ALL(C, ATTR)                   \
  SPMM_CC(C, 0, , 1, false, , ATTR, false)     \
  SPMM_CC(C, 0, , 4, false, , ATTR, false)     \
  SPMM_CC(C, 1, z, 1, false, , ATTR, false)    \
  SPMM_CC(C, 1, z, 4, false, , ATTR, false)    \
  SPMM_CC(C, 0, , 1, false, _o, ATTR, true)    \
  SPMM_CC(C, 0, , 4, false, _o, ATTR, true)

SPMM_CC_ALL(1, )
#if __CUDA_ARCH__ >= 900
SPMM_CC_ALL(2, __cluster_dims__(2, 1, 1))
SPMM_CC_ALL(4, __cluster_dims__(4, 1, 1))
SPMM_CC_ALL(8, __cluster_dims__(8, 1, 1))
SPMM_CC(8, 0, , 4, true, _abl, __cluster_dims__(8, 1, 1), false)
SPMM_CC(8, 1, z, 4, true, _abl, __cluster_dims__(8, 1, 1), false)
SPMM_CC(8, 0, , 4, true, _o_abl, __cluster_dims__(8, 1, 1), true)
#endif
#endif

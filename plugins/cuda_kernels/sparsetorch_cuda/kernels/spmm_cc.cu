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
// Launch: clusters of C blocks (rank q = slice q), ncl clusters, grid (ncl C, ceil(k / 64)), NW warps.
// A block keeps its slice of X feature-major in shared memory (KS rows of 64 batch values = 128 bytes,
// the eight 16-byte chunks of feature f stored at chunk ^ (f % 8)), transposed on the way in by
// movmatrix. It then walks rounds: in round r, cluster cl owns the SPR = NW SPW strips
// (r ncl + cl) SPR + j; warp w takes j = w + NW i (i < SPW), runs their steps (A fragments of the 4
// batch tiles by ldmatrix.x4.trans at the gathered features, the B fragment one 8-byte load,
// prefetched PF steps ahead across strips) and writes each strip's 64 x 8 float32 partial sums to
// shared memory (double-buffered by round parity). A cluster barrier; then each block sums its 1/C share of
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
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ unsigned cc_movt(unsigned x) {
  unsigned y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ void cc_sts32(unsigned addr, unsigned v) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ void cc_mma(float* d, const unsigned* a, unsigned b0, unsigned b1) {
#if VAL_KIND == 0
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
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

template <int C, int NW, int SPW, int FMT>
__device__ __forceinline__ void spmm_cc_body(int m, int n, int k, int KS, int nstrips, int ncl, const int* __restrict__ sptr,
                                             const unsigned short* __restrict__ cols, const uint2* __restrict__ bv,
                                             const uint4* __restrict__ recs, const val_t* __restrict__ xt,
                                             const val_t* __restrict__ bias, val_t* __restrict__ yt, int flags) {
  constexpr int THREADS = NW * 32, SPR = NW * SPW;
  constexpr int PBUF = SPR * 64 * 8;  // floats per partial-sum buffer: [SPR strips][64 batch][8 rows]
  extern __shared__ __align__(16) unsigned char cc_smem[];
  float* P = reinterpret_cast<float*>(cc_smem);
  const unsigned pbase = smem_addr(cc_smem);
  const unsigned xs = pbase + 2u * PBUF * 4u;
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
  const int nmt = (kv + 15) >> 4;
  const int rounds = (nstrips + SPR * ncl - 1) / (SPR * ncl);
  // this lane's share of an ldmatrix.x4: feature j of the step (its column list), batch half hi
  const int jl = ((lane >> 4) << 3) + (lane & 7);
  const unsigned hi = (lane >> 3) & 1;

  for (int r = 0; r < rounds; ++r) {
    // the warp's strips this round and their step ranges in slice q
    int a0 = 0, l0 = 0, a1 = 0, l1 = 0;
    {
      const int s0 = (r * ncl + cl) * SPR + warp;
      if (s0 < nstrips) {
        a0 = RO(sptr + (i64)s0 * C + q);
        l0 = RO(sptr + (i64)s0 * C + q + 1) - a0;
      }
      if (SPW > 1) {
        const int s1 = s0 + NW;
        if (s1 < nstrips) {
          a1 = RO(sptr + (i64)s1 * C + q);
          l1 = RO(sptr + (i64)s1 * C + q + 1) - a1;
        }
      }
    }
    const int total = l0 + l1;
    uint2 rb[CC_PF];
    unsigned rc[CC_PF];
    uint4 rr[CC_PF];  // FMT 1: the step's record (register bitmap lo / hi, first word)
    // stage a: the step's columns and B (FMT 0) or its record (FMT 1), CC_PF steps ahead
    auto fetch_a = [&](int p, uint2& b, unsigned& c, uint4& rec) {
      if (p < total && !(flags & 4)) {
        const int st = p < l0 ? a0 + p : a1 + (p - l0);
        c = RO(cols + (i64)st * 16 + jl);
        if (FMT == 0) b = __ldg(bv + (i64)st * 32 + lane);
        else rec = __ldg(recs + st);
      } else {
        c = (unsigned)(lane & 7);
        b = make_uint2(0u, 0u);
        rec = make_uint4(0u, 0u, 0u, 0u);
      }
    };
    // stage b (FMT 1): the lane's two B registers from the packed words, CC_PF / 2 steps ahead
    const unsigned* vw = reinterpret_cast<const unsigned*>(bv);
    auto fetch_b = [&](const uint4& rec, uint2& b) {
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
#pragma unroll
    for (int u = 0; u < CC_PF; ++u) fetch_a(u, rb[u], rc[u], rr[u]);
    if (FMT == 1) {
#pragma unroll
      for (int u = 0; u < CC_PF / 2; ++u) fetch_b(rr[u], rb[u]);
    }

    if (r == 0) {  // X slice [f0, f0 + KS) x [b0, b0 + 64) into shared memory, feature-major, transposed by movmatrix
      if (!(flags & 8)) {
        const int ntiles = KS;  // (KS / 8 feature tiles) x (8 batch tiles)
        const bool even = (n & 1) == 0;
        for (int t0 = warp; t0 < ntiles; t0 += NW * 16) {
          unsigned v[16];
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            const int t = t0 + NW * i;
            v[i] = 0u;
            if (t < ntiles) {
              const int ft = t >> 3, bt = t & 7;
              const int b = b0 + bt * 8 + (lane >> 2), fa = f0 + ft * 8 + 2 * t4;
              if (b < k && fa < n) {
                const val_t* p = xt + (i64)b * n + fa;
                if (even) {
                  v[i] = __ldg(reinterpret_cast<const unsigned*>(p));
                } else {
                  v[i] = (unsigned)RO(p) | (fa + 1 < n ? ((unsigned)RO(p + 1) << 16) : 0u);
                }
              }
            }
          }
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            const int t = t0 + NW * i;
            if (t < ntiles) {  // warp-uniform
              const int ft = t >> 3, bt = t & 7;
              const unsigned w = cc_movt(v[i]);
              const int f = ft * 8 + (lane >> 2);
              cc_sts32(xs + (unsigned)f * CC_XB + (unsigned)((bt ^ (f & 7)) << 4) + (unsigned)(t4 * 4), w);
            }
          }
        }
      }
      __syncthreads();
    }

    float* Pb = P + (r & 1) * PBUF;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][c] = 0.f;
    auto flush = [&](int i) {  // strip i of this warp: its partial sums into the round's buffer, then zero
      float* pp = Pb + (warp + NW * i) * 512;
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        if (mt < nmt) {
          *reinterpret_cast<float2*>(pp + (mt * 16 + g) * 8 + 2 * t4) = make_float2(acc[mt][0], acc[mt][1]);
          *reinterpret_cast<float2*>(pp + (mt * 16 + g + 8) * 8 + 2 * t4) = make_float2(acc[mt][2], acc[mt][3]);
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[mt][c] = 0.f;
      }
    };
    if (l0 == 0) flush(0);
    for (int p0 = 0; p0 < total; p0 += CC_PF) {
#pragma unroll
      for (int u = 0; u < CC_PF; ++u) {
        const int p = p0 + u;
        if (p < total) {
          const unsigned c = rc[u];
          const uint2 b = rb[u];
          const unsigned ra = xs + c * CC_XB;
          const unsigned sw = c & 7;
#pragma unroll
          for (int mt = 0; mt < 4; ++mt) {
            if (mt < nmt) {
              unsigned a[4];
              if (flags & 2) {
                a[0] = a[1] = a[2] = a[3] = c;
              } else {
                cc_ldsm4t(a, ra + ((((unsigned)(2 * mt) + hi) ^ sw) << 4));
              }
              if (!(flags & 1)) cc_mma(acc[mt], a, b.x, b.y);
              else acc[mt][0] += __uint_as_float(a[0] ^ a[1] ^ a[2] ^ a[3] ^ b.x ^ b.y);
            }
          }
          if (SPW > 1 && p == l0 - 1) flush(0);
        }
        fetch_a(p + CC_PF, rb[u], rc[u], rr[u]);
        if (FMT == 1) fetch_b(rr[(u + CC_PF / 2) % CC_PF], rb[(u + CC_PF / 2) % CC_PF]);
      }
    }
    flush(SPW - 1);
    cc_sync<C>();  // every block's partial sums of round r written
    // this block's share of the round's outputs: float4 groups e of [SPR][64][2], summed over the cluster
    {
      constexpr int TOT = SPR * 128;
      const int e0 = TOT * q / C, e1 = TOT * (q + 1) / C;
      const unsigned pb = pbase + (unsigned)((r & 1) * PBUF * 4);
      for (int e = e0 + tid; e < e1; e += THREADS) {
        const int j = e >> 7, bb = (e >> 1) & 63, h = e & 1;
        const int s = (r * ncl + cl) * SPR + j;
        if (s >= nstrips || bb >= kv) continue;
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
    }
    (void)Pb;
  }
#if __CUDA_ARCH__ >= 900
  if (C > 1) cluster_sync_all();  // no block leaves while another still reads its shared memory
#endif
}

// spmm_cc_c<C>_w<NW>_s<SPW>: clusters of C blocks (C K-slices), NW warps, SPW strips per warp and round
#define SPMM_CC(C, NW, SPW, FMT, SFX, ATTR)                                                                          \
  extern "C" __global__ void ATTR __launch_bounds__(NW * 32, 1) spmm_cc##SFX##_c##C##_w##NW##_s##SPW(                 \
      i64 m, i64 n, i64 k, i64 KS, i64 nstrips, i64 ncl, const int* sptr, const unsigned short* cols, const uint2* bv, \
      const uint4* recs, const val_t* xt, const val_t* bias, val_t* yt, i64 flags) {                                   \
    spmm_cc_body<C, NW, SPW, FMT>((int)m, (int)n, (int)k, (int)KS, (int)nstrips, (int)ncl, sptr, cols, bv, recs, xt,  \
                                  bias, yt, (int)flags);                                                               \
  }
// spmm_cc_*: B packed dense (FMT 0); spmm_ccz_*: B compressed by 4-byte register (FMT 1)
#define SPMM_CC_SHAPES(C, ATTR)   \
  SPMM_CC(C, 16, 1, 0, , ATTR)    \
  SPMM_CC(C, 8, 2, 0, , ATTR)     \
  SPMM_CC(C, 16, 1, 1, z, ATTR)   \
  SPMM_CC(C, 8, 2, 1, z, ATTR)

SPMM_CC_SHAPES(1, )
#if __CUDA_ARCH__ >= 900
SPMM_CC_SHAPES(2, __cluster_dims__(2, 1, 1))
SPMM_CC_SHAPES(4, __cluster_dims__(4, 1, 1))
SPMM_CC_SHAPES(8, __cluster_dims__(8, 1, 1))
#endif
#endif

// Half-precision CSR SpMM (several right-hand sides) on mma.sync with the A fragments built in registers
// from per-row column bitmaps (spmm_bm.cu's scheme and plan-side layout), split over the column tiles of A
// WITHOUT clusters: the grid is (row blocks of 128 x KS splits of the column tiles, ceil(k / 64)), KS chosen
// by the host so the blocks make one wave. Python side: _spmm_bmk.py.
//
// Each block accumulates its column-tile range [T rank / KS, T (rank + 1) / KS) in registers (the
// four-stage (three for bmk1, two for bmk2) cp.async pipeline of spmm_bm: X^T tile, the 128 rows' bitmaps and
// the rows' runs of values, two tiles in flight ahead of the products), sums its warps' halves in shared
// memory and then, for KS > 1, adds its 128 x 64 float32 partial into the float32 workspace ws
// (k x mp, row stride mp) with red.global.add(.v4 on sm_90).f32; after a fence it takes a ticket on
// cnt[row block, column block]; the block drawing the last ticket reads the sums back (ld.global.cg),
// adds the bias, stores Y^T (k x m), zeroes the workspace entries it read and resets the counter: the
// next launch (stream ordered, or the next replay of a CUDA graph) finds ws and cnt zero again.
// One launch per product, no memset, no finishing kernel. KS == 1: stored directly, ws / cnt untouched.
// Not deterministic for KS > 1 (the order of the float32 additions varies).
//
// Inputs as spmm_bm: rowptr (int32), toff ((T + 1) x m uint16), bits (T x mp uint64), val (16-byte
// aligned), xt (X^T, k x n, 16-byte aligned, n % 8 == 0). ws: k x mp float32, zero; cnt: ceil(m / 128) x
// ceil(k / 64) int32, zero (made once by the plan). flags (benchmarking only, wrong results): 1 skips
// the products, 2 the A fragments, 4 the value copies, 8 the X^T copies, 16 the reduction (no ws, no Y).

#define BMK_ROWS 128
#define BMK_LD 72
#define BMK_XH (64 * BMK_LD)

__device__ __forceinline__ void bmk_cp16(unsigned dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bmk_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bmk_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void bmk_ldsm4(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void bmk_mma(float* d, const unsigned* a, unsigned b0, unsigned b1) {
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
// float32 additions into global memory (the result unused: red)
__device__ __forceinline__ void bmk_red4(float* p, float4 s) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1,%2,%3,%4};" ::"l"(p), "f"(s.x), "f"(s.y), "f"(s.z), "f"(s.w) : "memory");
#else
  atomicAdd(p, s.x);
  atomicAdd(p + 1, s.y);
  atomicAdd(p + 2, s.z);
  atomicAdd(p + 3, s.w);
#endif
}
__device__ __forceinline__ float4 bmk_ldcg4(const float* p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ float bmk_ldcg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}

// Two A registers of one row for a 16-column step (spmm_bm.cu's bm_pair)
__device__ __forceinline__ void bmk_pair(unsigned w, unsigned x, unsigned mlo, unsigned mhi, int base, const val_t* vs,
                                         unsigned& lo, unsigned& hi) {
  const int pa = base + __popc(w & mlo), pb = base + __popc(w & mhi);
  unsigned h0 = (x & 1u) ? (unsigned)vs[pa] : 0u;
  unsigned h1 = (x & 2u) ? (unsigned)vs[pa + (int)(x & 1u)] : 0u;
  unsigned h8 = (x & 0x100u) ? (unsigned)vs[pb] : 0u;
  unsigned h9 = (x & 0x200u) ? (unsigned)vs[pb + (int)((x >> 8) & 1u)] : 0u;
  lo = h0 | (h1 << 16);
  hi = h8 | (h9 << 16);
}

template <int WK, int NST>
__device__ __forceinline__ void spmm_bmk_body(int m, int n, int k, int T, int mp, int slot, const int* __restrict__ rowptr,
                                              const unsigned short* __restrict__ toff,
                                              const unsigned long long* __restrict__ bits, const val_t* __restrict__ val,
                                              const val_t* __restrict__ xt, const val_t* __restrict__ bias,
                                              val_t* __restrict__ yt, float* ws, int* cnt, int ks, int flags) {
  constexpr int BM = BMK_ROWS, THREADS = 128 * WK, NT = 8;
  constexpr int PLD = BM + 4;  // row stride (floats) of the partial sums
  extern __shared__ __align__(16) unsigned char bmk_smem[];
  __shared__ int bmk_last;
  const int stage_bytes = BMK_XH * 2 + BM * 8 + BM * slot * 2;
  int* Es = reinterpret_cast<int*>(bmk_smem + NST * stage_bytes);  // [NST][BM]: es & 7 per row
  float* P = reinterpret_cast<float*>(bmk_smem);                      // [64][PLD], after the loop
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wr = warp & 3, kw = warp >> 2;
  const int g = lane >> 2, t4 = lane & 3;
  const int rblk = (int)blockIdx.x / ks, rank = (int)blockIdx.x % ks;
  const int row0 = rblk * BM;
  const int b0 = (int)blockIdx.y * 64;
  const int ta = (int)((long long)T * rank / ks), te = (int)((long long)T * (rank + 1) / ks);
  const int ntact = min(8, (k - b0 + 7) >> 3);
  const int vr = tid & (BM - 1), vh = tid / BM;
  const int myr = row0 + vr;
  const bool myok = myr < m;
  const int rp = myok ? RO(rowptr + myr) : 0;
  int o0 = 0, o1 = 0, o2 = 0;  // toff of the next tile to issue and of the two after it
  if (myok && ta < te) {
    o0 = (int)RO(toff + (i64)ta * m + myr);
    o1 = (int)RO(toff + (i64)(ta + 1) * m + myr);
    o2 = ta + 2 <= T ? (int)RO(toff + (i64)(ta + 2) * m + myr) : 0;
  }

  auto sbase = [&](int t) { return bmk_smem + (t % NST) * stage_bytes; };
  auto issue = [&](int t) {  // the copies of tile t into stage t % NST
    unsigned char* sb = sbase(t);
    const unsigned xs = smem_addr(sb), bs = xs + BMK_XH * 2, vsa = bs + BM * 8;
    if (!(flags & 8)) {
#pragma unroll
      for (int s = 0; s < 512 / THREADS; ++s) {
        int q = tid + s * THREADS;
        int r = q >> 3, c8 = q & 7;
        int gc = t * 64 + c8 * 8, b = b0 + r;
        bool ok = b < k && gc < n;
        bmk_cp16(xs + (unsigned)(r * BMK_LD + c8 * 8) * 2u, ok ? (const void*)(xt + (i64)b * n + gc) : (const void*)xt,
                 ok ? 16u : 0u);
      }
    }
    if (tid < BM / 2) bmk_cp16(bs + tid * 16u, bits + (i64)t * mp + row0 + 2 * tid, 16u);
    int es = rp + o0, ee = rp + o1;
    if (vh == 0) Es[(t % NST) * BM + vr] = es & 7;
    if (myok && !(flags & 4)) {
      const unsigned dst = vsa + (unsigned)(vr * slot) * 2u;
      const int ua = es >> 3, ub = (ee + 7) >> 3;
      for (int u = ua + vh; u < ub; u += THREADS / BM) bmk_cp16(dst + (unsigned)(u - ua) * 16u, val + (i64)u * 8, 16u);
    }
    o0 = o1;
    o1 = o2;
    o2 = (myok && t + 3 <= T) ? (int)RO(toff + (i64)(t + 3) * m + myr) : 0;
  };

  float acc[2][NT][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;

  const unsigned m0 = (1u << (2 * t4)) - 1u;
  const unsigned msk[4] = {m0, (m0 << 8) | 0xffu, (m0 << 16) | 0xffffu, (m0 << 24) | 0xffffffu};

  auto compute = [&](int t) {
    unsigned char* sb = sbase(t);
    const unsigned xs = smem_addr(sb);
    const unsigned* Bw = reinterpret_cast<const unsigned*>(sb + BMK_XH * 2);
    const val_t* Vs = reinterpret_cast<const val_t*>(sb + BMK_XH * 2 + BM * 8);
    const int* E = Es + (t % NST) * BM;
#pragma unroll
    for (int half = 0; half < 3 - WK; ++half) {
      const int word = WK == 1 ? half : kw;
      unsigned wd[4], xw[4];
      int vo[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int rl = wr * 32 + (i >> 1) * 16 + (i & 1) * 8 + g;
        wd[i] = Bw[2 * rl + word];
        xw[i] = wd[i] >> (2 * t4);
        vo[i] = rl * slot + E[rl] + (word ? __popc(Bw[2 * rl]) : 0);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int kk = 2 * word + j;
        unsigned a[2][4];
#pragma unroll
        for (int sj = 0; sj < 2; ++sj) {
          if (flags & 2) {
            a[sj][0] = a[sj][1] = a[sj][2] = a[sj][3] = 0u;
            continue;
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int i = sj * 2 + h;
            bmk_pair(wd[i], xw[i] >> (j * 16), msk[j * 2], msk[j * 2 + 1], vo[i], Vs, a[sj][h], a[sj][2 + h]);
          }
        }
        if (flags & 1) continue;
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          if (2 * np < ntact) {
            unsigned b[4];
            bmk_ldsm4(b, xs + (unsigned)((np * 16 + ((lane >> 4) << 3) + (lane & 7)) * BMK_LD + kk * 16 + ((lane >> 3) & 1) * 8) * 2u);
#pragma unroll
            for (int sj = 0; sj < 2; ++sj) {
              bmk_mma(acc[sj][2 * np], a[sj], b[0], b[1]);
              bmk_mma(acc[sj][2 * np + 1], a[sj], b[2], b[3]);
            }
          }
        }
      }
    }
  };

#pragma unroll
  for (int i = 0; i < NST - 1; ++i) {
    if (ta + i < te) issue(ta + i);
    bmk_commit();
  }
  for (int t = ta; t < te; ++t) {
    bmk_wait<NST - 2>();
    __syncthreads();
    if (t + NST - 1 < te) issue(t + NST - 1);
    bmk_commit();
    compute(t);
  }
  bmk_wait<0>();
  __syncthreads();  // the stages' memory becomes the partial sums
#pragma unroll
  for (int pass = 0; pass < WK; ++pass) {
    if (kw == pass) {
#pragma unroll
      for (int sj = 0; sj < 2; ++sj)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          int r = wr * 32 + sj * 16 + g, bc = nt * 8 + 2 * t4;
          float* p0 = P + bc * PLD + r;
          float* p1 = P + (bc + 1) * PLD + r;
          if (pass == 0) {
            p0[0] = acc[sj][nt][0];
            p1[0] = acc[sj][nt][1];
            p0[8] = acc[sj][nt][2];
            p1[8] = acc[sj][nt][3];
          } else {
            p0[0] += acc[sj][nt][0];
            p1[0] += acc[sj][nt][1];
            p0[8] += acc[sj][nt][2];
            p1[8] += acc[sj][nt][3];
          }
        }
    }
    __syncthreads();
  }
  if (flags & 16) return;
  constexpr int RQ = BM / 4;  // float4 units per batch column of the block
  const int nb = min(64, k - b0);
  if (ks == 1) {
    for (int q = tid; q < nb * RQ; q += THREADS) {
      const int bb = q / RQ, c4 = (q % RQ) * 4, r = row0 + c4;
      const float4 s = *reinterpret_cast<const float4*>(P + bb * PLD + c4);
      const float sv[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (r + i < m) yt[(i64)(b0 + bb) * m + r + i] = st(sv[i] + (bias ? ld(RO(bias + r + i)) : 0.f));
    }
    return;
  }
  // this block's share into the workspace (rows < m only)
  for (int q = tid; q < nb * RQ; q += THREADS) {
    const int bb = q / RQ, c4 = (q % RQ) * 4, r = row0 + c4;
    if (r >= m) continue;
    const float4 s = *reinterpret_cast<const float4*>(P + bb * PLD + c4);
    float* w = ws + (i64)(b0 + bb) * mp + r;
    if (r + 3 < m) {
      bmk_red4(w, s);
    } else {
      const float sv[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (r + i < m) atomicAdd(w + i, sv[i]);
    }
  }
  __threadfence();  // this thread's additions before the ticket
  __syncthreads();
  int* c = cnt + (i64)rblk * gridDim.y + blockIdx.y;
  if (tid == 0) bmk_last = atomicAdd(c, 1) == ks - 1;
  __syncthreads();
  if (!bmk_last) return;
  __threadfence();  // the other blocks' additions (all before their tickets) seen from here on
  for (int q = tid; q < nb * RQ; q += THREADS) {
    const int bb = q / RQ, c4 = (q % RQ) * 4, r = row0 + c4;
    if (r >= m) continue;
    float* w = ws + (i64)(b0 + bb) * mp + r;
    val_t* y = yt + (i64)(b0 + bb) * m + r;
    if (r + 3 < m) {
      const float4 s = bmk_ldcg4(w);
      *reinterpret_cast<float4*>(w) = make_float4(0.f, 0.f, 0.f, 0.f);
      const float sv[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) y[i] = st(sv[i] + (bias ? ld(RO(bias + r + i)) : 0.f));
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (r + i < m) {
          const float s = bmk_ldcg(w + i);
          w[i] = 0.f;
          y[i] = st(s + (bias ? ld(RO(bias + r + i)) : 0.f));
        }
    }
  }
  if (tid == 0) atomicExch(c, 0);  // for the next launch (stream ordered)
}

#if VAL_KIND <= 1
// spmm_bmk: 8 warps (WK = 2: each warp one 32-column half of every tile), four stages, up to 2 blocks per SM;
// spmm_bmk1: 4 warps (WK = 1), three stages, up to 4 blocks per SM; spmm_bmk2: 4 warps, two stages (double
// buffering: tile t + 1's copies during tile t's products), the smallest shared memory (more blocks per SM)
#define SPMM_BMK(NAME, WK, NST, MINB)                                                                                  \
  extern "C" __global__ void __launch_bounds__(128 * WK, MINB)                                                        \
      NAME(i64 m, i64 n, i64 k, i64 T, i64 mp, i64 slot, const int* rowptr, const unsigned short* toff,               \
           const unsigned long long* bits, const val_t* val, const val_t* xt, const val_t* bias, val_t* yt, float* ws, \
           int* cnt, i64 ks, i64 flags) {                                                                              \
    spmm_bmk_body<WK, NST>((int)m, (int)n, (int)k, (int)T, (int)mp, (int)slot, rowptr, toff, bits, val, xt, bias, yt, \
                           ws, cnt, (int)ks, (int)flags);                                                              \
  }
SPMM_BMK(spmm_bmk, 2, 4, 2)
SPMM_BMK(spmm_bmk1, 1, 3, 4)
SPMM_BMK(spmm_bmk2, 1, 2, 4)
#endif

// Half-precision CSR SpMM (several right-hand sides) on the dense tensor cores without a scatter:
// the A fragments of mma.sync m16n8k16 are built in registers from per-row column bitmaps and the
// CSR values, read where they lie (in-place value updates are seen). Python side: _spmm_bm.py.
//
// Inputs per pattern (made once by the plan): the row pointers (int32), toff ((T + 1) x m uint16:
// the offset of row r's first entry in column tile t of 64 from rowptr[r], the spmm_fl layout) and
// bits (T x mp uint64, mp = m rounded up to 128: bit j of bits[t * mp + r] = row r holds column
// 64 t + j; zero for padded rows). Columns strictly increase within a row, so the entry of column
// 64 t + j sits at rowptr[r] + toff[t][r] + popc(bits & (2^j - 1)).
//
// A block owns BM = 128 rows of A and 64 columns of X (the batch); 8 warps, each 32 rows (two strips
// of 16) x the 64 columns (2 x 8 accumulator tiles of m16n8) x one half (32 columns) of every column tile
// of A, the halves' sums added in shared memory at the end. The block walks its column tiles
// (T split over a cluster of S blocks) with a four-stage cp.async pipeline (three tiles in flight); a stage holds the X^T
// tile (64 x 64, row stride BM_LD halves, zero-filled outside X), the 128 rows' bitmaps and each
// row's run of values in the tile (the 16-byte units around it, one slot of `slot` halves per row;
// the run's first value at slot offset es & 7). Per 16-column step a lane reads the two bitmaps of its
// rows g and g + 8, counts the bits below its columns 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9 and loads the
// present values from shared memory (zero where a bit is clear): its four A registers. X^T fragments
// by ldmatrix.x4. After the loop the float32 partial sums meet over the cluster in distributed shared
// memory (each block sums its share of the 64 columns in rank order: deterministic), the bias is added
// and Y^T (k x m) stored.
//
// The host launches it for n % 8 == 0 and 16-byte aligned values / X^T, grid (ceil(m / 128) * S,
// ceil(k / 64)), 256 threads, bm_smem_bytes(slot) of dynamic shared memory.
// flags (benchmarking only, wrong results): 1 skips the products, 2 the A fragments (zeros),
// 4 the value copies, 8 the X^T copies; 16 returns after the pipeline's first issues (launch, the
// offsets' first reads, the prologue), 32 after the column-tile loop (no partial sums, no cluster
// sum, no output): session 14's decomposition (benchmarks/gpu/s14/bm_probe.py).

#define BM_ROWS 128
#define BM_LD 72   // shared row stride (halves) of the X^T tile: conflict-free ldmatrix
#define BM_XH (64 * BM_LD)

__device__ __forceinline__ void bm_cp16(unsigned dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bm_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bm_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Two A registers of one row for a 16-column step: columns c, c + 1 (lo) and c + 8, c + 9 (hi) of the
// bitmap word w (32 columns), x = w >> c, masks below c and c + 8, base = entries before the word,
// vs = the row's first value in shared memory.
__device__ __forceinline__ void bm_pair(unsigned w, unsigned x, unsigned mlo, unsigned mhi, int base, const val_t* vs,
                                        unsigned& lo, unsigned& hi) {
  const int pa = base + __popc(w & mlo), pb = base + __popc(w & mhi);
  unsigned h0 = (x & 1u) ? (unsigned)vs[pa] : 0u;
  unsigned h1 = (x & 2u) ? (unsigned)vs[pa + (int)(x & 1u)] : 0u;
  unsigned h8 = (x & 0x100u) ? (unsigned)vs[pb] : 0u;
  unsigned h9 = (x & 0x200u) ? (unsigned)vs[pb + (int)((x >> 8) & 1u)] : 0u;
  lo = h0 | (h1 << 16);
  hi = h8 | (h9 << 16);
}

template <int S, int WK, int NST>
__device__ __forceinline__ void spmm_bm_body(int m, int n, int k, int T, int mp, int slot, const int* __restrict__ rowptr,
                                             const unsigned short* __restrict__ toff,
                                             const unsigned long long* __restrict__ bits, const val_t* __restrict__ val,
                                             const val_t* __restrict__ xt, const val_t* __restrict__ bias,
                                             val_t* __restrict__ yt, int flags) {
  constexpr int BM = BM_ROWS, THREADS = 128 * WK, NT = 8;
  constexpr int PLD = BM + 4;  // row stride (floats) of the partial sums
  extern __shared__ __align__(16) unsigned char bm_smem[];
  const int stage_bytes = BM_XH * 2 + BM * 8 + BM * slot * 2;
  int* Es = reinterpret_cast<int*>(bm_smem + NST * stage_bytes);  // [NST][BM]: es & 7 per row
  float* P = reinterpret_cast<float*>(bm_smem);                      // [64][PLD], after the loop
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wr = warp & 3, kw = warp >> 2;  // 32 rows wr; WK = 2: columns 32 kw .. 32 kw + 31 of each tile
  const int g = lane >> 2, t4 = lane & 3;
  int rank = 0;
#if __CUDA_ARCH__ >= 900
  if (S > 1) rank = (int)cluster_rank();
#endif
  const int row0 = (int)(blockIdx.x / S) * BM;
  const int b0 = (int)blockIdx.y * 64;
  const int ta = (int)((long long)T * rank / S), te = (int)((long long)T * (rank + 1) / S);
  const int ntact = min(8, (k - b0 + 7) >> 3);
  // the value copies: row vr, every second unit of its run from the (tid / BM)-th
  const int vr = tid & (BM - 1), vh = tid / BM;
  const int myr = row0 + vr;
  const bool myok = myr < m;
  const int rp = myok ? RO(rowptr + myr) : 0;
  int o0 = 0, o1 = 0, o2 = 0;  // toff of the next tile to issue and of the two after it (loaded two issues ahead)
  if (myok && ta < te) {
    o0 = (int)RO(toff + (i64)ta * m + myr);
    o1 = (int)RO(toff + (i64)(ta + 1) * m + myr);
    o2 = ta + 2 <= T ? (int)RO(toff + (i64)(ta + 2) * m + myr) : 0;
  }

  auto sbase = [&](int t) { return bm_smem + (t % NST) * stage_bytes; };
  auto issue = [&](int t) {  // the copies of tile t into stage t % NST
    unsigned char* sb = sbase(t);
    const unsigned xs = smem_addr(sb), bs = xs + BM_XH * 2, vsa = bs + BM * 8;
    if (!(flags & 8)) {
#pragma unroll
      for (int s = 0; s < 512 / THREADS; ++s) {
        int q = tid + s * THREADS;
        int r = q >> 3, c8 = q & 7;
        int gc = t * 64 + c8 * 8, b = b0 + r;
        bool ok = b < k && gc < n;
        bm_cp16(xs + (unsigned)(r * BM_LD + c8 * 8) * 2u, ok ? (const void*)(xt + (i64)b * n + gc) : (const void*)xt,
                ok ? 16u : 0u);
      }
    }
    if (tid < BM / 2) bm_cp16(bs + tid * 16u, bits + (i64)t * mp + row0 + 2 * tid, 16u);
    int es = rp + o0, ee = rp + o1;
    if (vh == 0) Es[(t % NST) * BM + vr] = es & 7;
    if (myok && !(flags & 4)) {
      const unsigned dst = vsa + (unsigned)(vr * slot) * 2u;
      const int ua = es >> 3, ub = (ee + 7) >> 3;
      for (int u = ua + vh; u < ub; u += THREADS / BM) bm_cp16(dst + (unsigned)(u - ua) * 16u, val + (i64)u * 8, 16u);
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

  // lane masks: bits below column 2 t4 + 8 q of a 32-bit word, q = 0..3
  const unsigned m0 = (1u << (2 * t4)) - 1u;
  const unsigned msk[4] = {m0, (m0 << 8) | 0xffu, (m0 << 16) | 0xffffu, (m0 << 24) | 0xffffffu};

  auto compute = [&](int t) {
    unsigned char* sb = sbase(t);
    const unsigned xs = smem_addr(sb);
    const unsigned* Bw = reinterpret_cast<const unsigned*>(sb + BM_XH * 2);
    const val_t* Vs = reinterpret_cast<const val_t*>(sb + BM_XH * 2 + BM * 8);
    const int* E = Es + (t % NST) * BM;
#pragma unroll
    for (int half = 0; half < 3 - WK; ++half) {  // WK = 1: both 32-column words; WK = 2: word kw
      const int word = WK == 1 ? half : kw;
      unsigned wd[4], xw[4];
      int vo[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // rows g, g + 8 of strips 0, 1: this word of each
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
            bm_pair(wd[i], xw[i] >> (j * 16), msk[j * 2], msk[j * 2 + 1], vo[i], Vs, a[sj][h], a[sj][2 + h]);
          }
        }
        if (flags & 1) continue;
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          if (2 * np < ntact) {
            unsigned b[4];
            ldsm_x4(b, xs + (unsigned)((np * 16 + ((lane >> 4) << 3) + (lane & 7)) * BM_LD + kk * 16 + ((lane >> 3) & 1) * 8) * 2u);
#pragma unroll
            for (int sj = 0; sj < 2; ++sj) {
              mma16816_free(acc[sj][2 * np], a[sj], b[0], b[1]);
              mma16816_free(acc[sj][2 * np + 1], a[sj], b[2], b[3]);
            }
          }
        }
      }
    }
  };

#pragma unroll
  for (int i = 0; i < NST - 1; ++i) {
    if (ta + i < te) issue(ta + i);
    bm_commit();
  }
  if (flags & 16) {  // uniform over the cluster: no block reads another's shared memory after this
    bm_wait<0>();
    return;
  }
  for (int t = ta; t < te; ++t) {
    bm_wait<NST - 2>();  // this thread's copies of tile t
    __syncthreads();        // everyone's copies of tile t visible; every warp done with tile t - 1's stage
    if (t + NST - 1 < te) issue(t + NST - 1);
    bm_commit();
    compute(t);
  }
  bm_wait<0>();
  if (flags & 32) return;  // uniform, as 16
  __syncthreads();  // the stages' memory becomes the partial sums
  // the two column halves' partial sums: kw = 0 stores, kw = 1 adds (each element by one thread each)
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
    if (pass + 1 < WK) __syncthreads();
  }
  tile_epilogue<S, THREADS, BM, PLD>(P, S > 1, S > 1, 64 * rank / S, 64 * (rank + 1) / S, 0, tid, b0, row0, m, k, bias, yt);
}

#if VAL_KIND <= 1
// spmm_bm_s<S>: 8 warps (WK = 2), four stages; spmm_bm1_s<S>: 4 warps (WK = 1, each warp both halves of a tile),
// three stages, up to four blocks per SM
#define SPMM_BM(NAME, WK, NST, MINB, SP, ATTR)                                                                       \
  extern "C" __global__ void ATTR __launch_bounds__(128 * WK, MINB) NAME##_s##SP(                                    \
      i64 m, i64 n, i64 k, i64 T, i64 mp, i64 slot, const int* rowptr, const unsigned short* toff,                  \
      const unsigned long long* bits, const val_t* val, const val_t* xt, const val_t* bias, val_t* yt, i64 flags) {  \
    spmm_bm_body<SP, WK, NST>((int)m, (int)n, (int)k, (int)T, (int)mp, (int)slot, rowptr, toff, bits, val, xt, bias, \
                              yt, (int)flags);                                                                       \
  }
#define SPMM_BM_ALL(NAME, WK, NST, MINB)            \
  SPMM_BM(NAME, WK, NST, MINB, 1, )                 \
  SPMM_BM_CL(NAME, WK, NST, MINB)

#if __CUDA_ARCH__ >= 900
#define SPMM_BM_CL(NAME, WK, NST, MINB)                          \
  SPMM_BM(NAME, WK, NST, MINB, 2, __cluster_dims__(2, 1, 1))     \
  SPMM_BM(NAME, WK, NST, MINB, 3, __cluster_dims__(3, 1, 1))     \
  SPMM_BM(NAME, WK, NST, MINB, 4, __cluster_dims__(4, 1, 1))     \
  SPMM_BM(NAME, WK, NST, MINB, 6, __cluster_dims__(6, 1, 1))     \
  SPMM_BM(NAME, WK, NST, MINB, 8, __cluster_dims__(8, 1, 1))
#else
#define SPMM_BM_CL(NAME, WK, NST, MINB)
#endif

SPMM_BM_ALL(spmm_bm, 2, 4, 2)
SPMM_BM_ALL(spmm_bm1, 1, 3, 4)
#endif

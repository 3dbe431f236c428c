// Half-precision CSR SpMM (several right-hand sides) on the 2:4 sparse tensor cores: mma.sp
// m16n8k32 (f16 / bf16 in, f32 accumulate) over a plan-built index layout (_spmm_sp.py).
//
// A (m x n, unstructured, e.g. 90 % pruned) is cut in blocks of 16 rows ("strips") x 32 columns
// ("k-chunks"). A row's 4-column group with at most two entries is already 2:4; at 10 % density
// a group holds three or more only ~0.4 % of the time. Per block the plan stores one record of
// 160 bytes (pattern only, made once):
//   words  0..15  occupancy bitmaps: word 2 g + h = the 32 column bits of row g + 8 h of the strip
//   words 16..23  run starts: word 16 + g = toff(row g) | toff(row g + 8) << 16, toff = the CSR
//                 position of the row's first entry in the k-chunk minus the row's start (uint16)
//   words 24..39  mma.sp metadata: word 24 + 2 g + h = what lane 4 g + h (h = 0, 1) hands to the
//                 instruction with sparsity selector 0: groups 4 h .. 4 h + 3 of rows g (bits
//                 15:0) and g + 8 (bits 31:16), a nibble per group (low 2 bits the first kept
//                 position, high 2 bits the second, ascending; a group with < 2 entries pads
//                 with position 3, or (2, 3) when its one entry is at 3, or (0, 1) when empty).
// The values are read where they lie (the plan's CSR values; in-place updates are seen): a
// lane's fragment register for (row, group) takes the group's first one or two entries at
// rowptr[row] + toff + popc(bitmap below the group) (+1). A group's third and fourth entries
// (the residual) are added by the block on CUDA cores after the tensor-core loop: per (strip,
// k-chunk) ranges rptr, their CSR positions res_pos and (column << 4 | row in strip) res_rc.
//
// Blocks: R strips per warp (16 R rows, all 64 columns of X: R x 8 accumulator tiles), WR warps
// along the rows, WK warps along K (each kpw k-chunks); a cluster of CS blocks splits K further
// (sm_90). The block's X^T slice (kpw x WK k-chunks x 64 columns of X) and its records are copied
// into shared memory with cp.async at the start, stage by stage (stage i = the i-th k-chunk of
// every K warp), each stage completing on its own mbarrier, so the loop starts when stage 0 is
// in. X^T rows are 64 bytes per k-chunk with the four 16-byte units XOR-swizzled by (row >> 1) & 3
// (conflict-free ldmatrix.x4 for the B fragments). The value loads of k-chunk i + 1 are issued
// before the products of k-chunk i. Partial sums: the WK warps of a row range add theirs into
// shared memory in order (deterministic), the residual is added, then the CS blocks' partials
// meet over distributed shared memory, each block summing its share of the rows in rank order,
// adding the bias and storing Y^T. No atomics: results are bitwise reproducible.
//
// flags (benchmarking only, wrong results): 1 skips the products, 2 the value loads, 4 the residual,
// 8 the copies into shared memory, 16 the cluster's sum (each block stores its own partial sums).

#if VAL_KIND <= 1

#define SP_REC 160       // bytes per block record
#define SP_BB 64         // columns of X per block
#define SP_RES 512       // residual entries staged in shared memory per block

__device__ __forceinline__ unsigned sp_smem(const void* p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
__device__ __forceinline__ void sp_cp16(unsigned dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void sp_bar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// this thread's cp.async copies so far arrive on the barrier when they complete
__device__ __forceinline__ void sp_bar_arrive_cp(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
// wait until the barrier's first phase completed: try_wait (the thread sleeps in hardware) on sm_90,
// test_wait with a back-off before
__device__ __forceinline__ void sp_bar_wait(unsigned bar) {
  unsigned ok = 0;
  while (!ok) {
#if __CUDA_ARCH__ >= 900
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                 : "=r"(ok) : "r"(bar) : "memory");
#else
    asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                 : "=r"(ok) : "r"(bar) : "memory");
    if (!ok) __nanosleep(32);
#endif
  }
}
__device__ __forceinline__ void sp_ldsm4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void sp_mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[4], unsigned e) {
#if VAL_KIND == 0
  asm volatile("mma.sp.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, "
               "{%0,%1,%2,%3}, %12, 0x0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(e));
#else
  asm volatile("mma.sp.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, "
               "{%0,%1,%2,%3}, %12, 0x0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(e));
#endif
}
#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ void sp_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ unsigned sp_cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ float4 sp_ld_cluster(unsigned addr, unsigned rank) {
  unsigned ra;
  float4 v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(ra) : "memory");
  return v;
}
#endif

// Loads of one k-chunk's values for R strips: per strip and fragment register the group's first
// entry (v1, low half; none where the group's only entry is at position 3) and second (v2, high
// half; the only entry where it is at position 3), zero where absent.
template <int R>
__device__ __forceinline__ void sp_load_vals(unsigned (&v)[R][4], const unsigned char* rec0, const int (&rp)[R][2],
                                             const val_t* __restrict__ val, int g, int sh0) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const unsigned char* rec = rec0 + r * SP_REC;
    uint2 occ = *reinterpret_cast<const uint2*>(rec + 8 * g);
    unsigned tp = *reinterpret_cast<const unsigned*>(rec + 64 + 4 * g);
    const int rs[2] = {rp[r][0] + (int)(tp & 0xFFFFu), rp[r][1] + (int)(tp >> 16)};
    const unsigned oc[2] = {occ.x, occ.y};
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // register q: row g + 8 (q & 1), group tig + 4 (q >> 1)
      const unsigned o = oc[q & 1];
      const int sh = sh0 + 16 * (q >> 1);
      const unsigned nib = (o >> sh) & 15u;
      const int pos = rs[q & 1] + __popc(o & ((1u << sh) - 1u));
      const int cnt = __popc(nib);
      unsigned v1 = 0, v2 = 0;
      if (nib != 0u && nib != 8u) v1 = __ldg(reinterpret_cast<const unsigned short*>(val) + pos);
      if (cnt >= 2 || nib == 8u) v2 = __ldg(reinterpret_cast<const unsigned short*>(val) + pos + (nib == 8u ? 0 : 1));
      v[r][q] = v1 | (v2 << 16);
    }
  }
}

template <int R, int WR, int WK, int CS, int PD>
__device__ __forceinline__ void spmm_sp_body(i64 m_, i64 n_, i64 k_, i64 J_, i64 kpw_, const int* __restrict__ rowptr,
                                             const unsigned char* __restrict__ recs, const int* __restrict__ rptr,
                                             const int* __restrict__ res_pos, const int* __restrict__ res_rc,
                                             const val_t* __restrict__ val, const val_t* __restrict__ xt,
                                             const val_t* __restrict__ bias, val_t* __restrict__ yt, i64 flags_) {
  constexpr int NT = 32 * WR * WK;
  constexpr int ROWS = 16 * R * WR;
  constexpr int PLD = ROWS + 4;
  constexpr int SPW = R * WR;  // strips per block
  const int m = (int)m_, n = (int)n_, k = (int)k_, J = (int)J_, kpw = (int)kpw_, flags = (int)flags_;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* Xs = smem;                                   // [kpw][WK][64][4 units of 16 bytes]
  unsigned char* Rs = Xs + (size_t)kpw * WK * 4096;           // [kpw][WK][SPW][SP_REC]
  float* P = reinterpret_cast<float*>(Rs + (size_t)kpw * WK * SPW * SP_REC);  // [64][PLD]
  int* res_c = reinterpret_cast<int*>(P + SP_BB * PLD);       // [SP_RES] staged residual: column << 4 | row
  float* res_v = reinterpret_cast<float*>(res_c + SP_RES);    // [SP_RES] and value
  int* res_a = reinterpret_cast<int*>(res_v + SP_RES);        // [16] the strips' first entries
  int* res_p = res_a + 16;                                    // [16] their prefix in the staged list
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(res_p + 16);  // [kpw]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tig = lane & 3;
  const int wr = warp % WR, wk = warp / WR;
  int rank = 0;
#if __CUDA_ARCH__ >= 900
  if (CS > 1) rank = (int)sp_cluster_rank();
#endif
  const int S = (m + 15) >> 4;
  const int strip0 = (int)(blockIdx.x / CS) * SPW;
  const int row0 = strip0 * 16;
  const int b0 = (int)blockIdx.y * SP_BB;
  const int jlo = rank * WK * kpw;                 // the block's k-chunks [jlo, jhi)
  const int jhi = min(J, jlo + WK * kpw);
  // blocks start at different slots (k-chunks) so that they do not all read the same X^T lines at once
  const int rot = (int)((blockIdx.x / CS) % (unsigned)kpw);
  const unsigned xs0 = sp_smem(Xs), rs0 = sp_smem(Rs), bar0 = sp_smem(bars);

  if (tid == 0)
    for (int i = 0; i < kpw; ++i) sp_bar_init(bar0 + 8u * i, NT);
  if (tid < SPW) {  // the strips' residual ranges over the block's k-chunks
    const int s = strip0 + tid;
    const bool ok = s < S && jlo < jhi;
    res_a[tid] = ok ? __ldg(rptr + (i64)s * J + jlo) : 0;
    res_p[tid] = ok ? __ldg(rptr + (i64)s * J + jhi) : 0;  // the end, for now
  }
  __syncthreads();
  // every slot's copies, slot rot first; each thread's copies of slot si arrive on bars[si]
  for (int ii = 0; ii < kpw; ++ii) {
    const int si = ii + rot < kpw ? ii + rot : ii + rot - kpw;
    for (int u = (flags & 8) ? WK * 256 : tid; u < WK * 256; u += NT) {
      const int w = u >> 8, b = (u >> 2) & 63, q = u & 3;
      const int j = jlo + w * kpw + si, col = 32 * j + 8 * q;
      const bool ok = j < J && col < n && b0 + b < k;
      sp_cp16(xs0 + (unsigned)((((si * WK + w) * 64 + b) * 4 + (q ^ ((b >> 1) & 3))) * 16),
              ok ? (const void*)(xt + (i64)(b0 + b) * n + col) : (const void*)xt, ok ? 16u : 0u);
    }
    for (int u = (flags & 8) ? WK * SPW * 10 : tid; u < WK * SPW * 10; u += NT) {
      const int w = u / (SPW * 10), rem = u % (SPW * 10), sl = rem / 10, q = rem % 10;
      const int j = jlo + w * kpw + si, s = strip0 + sl;
      const bool ok = j < J && s < S;
      sp_cp16(rs0 + (unsigned)(((si * WK + w) * SPW + sl) * SP_REC + 16 * q),
              ok ? (const void*)(recs + ((i64)s * J + j) * SP_REC + 16 * q) : (const void*)recs, ok ? 16u : 0u);
    }
    sp_bar_arrive_cp(bar0 + 8u * si);
  }
  // the residual's first SP_RES entries (column, value) into shared memory while the copies fly
  // staged entry f: the strips' ranges one after the other (prefix(sl) = where strip sl's begin)
  auto prefix = [&](int sl) {
    int p = 0;
    for (int t = 0; t < sl; ++t) p += res_p[t] - res_a[t];
    return p;
  };
  const int staged = min(prefix(SPW), SP_RES);
  if (!(flags & 4)) {
    for (int f = tid; f < staged; f += NT) {
      int sl = 0, off = f;
      while (sl < SPW - 1 && off >= res_p[sl] - res_a[sl]) off -= res_p[sl] - res_a[sl], ++sl;
      const int e = res_a[sl] + off;
      res_c[f] = __ldg(res_rc + e);
      res_v[f] = ld(val[__ldg(res_pos + e)]);
    }
  }

  float acc[R][8][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < 8; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[r][t][c] = 0.f;
  int rp[R][2];
  bool live[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int s = strip0 + wr * R + r;
    live[r] = s < S;
    const int ra = 16 * s + g, rb = ra + 8;
    rp[r][0] = ra < m ? __ldg(rowptr + ra) : 0;
    rp[r][1] = rb < m ? __ldg(rowptr + rb) : 0;
  }
  const int jw = jlo + wk * kpw;
  const int iters = min(kpw, J - jw);  // this warp's k-chunks jw + slot, slot < iters (k-chunks past J: none)
  const int sh0 = 4 * tig;
  int tiles = (k - b0 + 7) >> 3;
  tiles = tiles > 8 ? 8 : tiles;
  // ldmatrix.x4 rows: matrix (lane >> 3) = k units, row (lane & 7) = column of X
  const int lr = lane & 7, lq = lane >> 3;
  // this warp's slots (k-chunks jw + slot < J: slot < iters) in the block's order, slot rot % iters first
  const int rotw = iters > 0 ? rot % iters : 0;
  auto slot = [&](int i) { return i + rotw < iters ? i + rotw : i + rotw - iters; };
  const unsigned char* rw = Rs + (size_t)(wk * SPW + wr * R) * SP_REC;  // slot 0's records of this warp
  constexpr size_t SLOT = (size_t)WK * SPW * SP_REC;
  unsigned v[PD][R][4];
#pragma unroll
  for (int p = 0; p < PD; ++p) {
    if (p < iters) {
      const int sp = slot(p);
      sp_bar_wait(bar0 + 8u * sp);
      if (!(flags & 2)) sp_load_vals<R>(v[p], rw + SLOT * sp, rp, val, g, sh0);
    }
  }
  for (int i = 0; i < iters; ++i) {
    const int si = slot(i);
    const unsigned char* rec = rw + SLOT * si;
    unsigned a[R][4], e[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int q = 0; q < 4; ++q) a[r][q] = (flags & 2) ? 0x3c003c00u : v[0][r][q];
      e[r] = *reinterpret_cast<const unsigned*>(rec + r * SP_REC + 96 + 4 * (2 * g + (tig & 1)));
    }
#pragma unroll
    for (int p = 0; p + 1 < PD; ++p)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int q = 0; q < 4; ++q) v[p][r][q] = v[p + 1][r][q];
    if (i + PD < iters) {
      const int sn = slot(i + PD);
      sp_bar_wait(bar0 + 8u * sn);
      if (!(flags & 2)) sp_load_vals<R>(v[PD - 1], rw + SLOT * sn, rp, val, g, sh0);
    }
    if (!(flags & 1)) {
      const unsigned xst = xs0 + (unsigned)((si * WK + wk) * 4096);
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        if (t < tiles) {
          const int b = 8 * t + lr;
          unsigned bf[4];
          sp_ldsm4(bf, xst + (unsigned)((b * 4 + (lq ^ ((b >> 1) & 3))) * 16));
#pragma unroll
          for (int r = 0; r < R; ++r)
            if (live[r]) sp_mma(acc[r][t], a[r], bf, e[r]);
        }
      }
    }
  }

  // the WK warps of each row range add their partial sums in order
  for (int w = 0; w < WK; ++w) {
    __syncthreads();
    if (wk == w) {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          const int row = wr * 16 * R + 16 * r + g, b = 8 * t + 2 * tig;
          float* p = P + b * PLD + row;
          if (w == 0) {
            p[0] = acc[r][t][0];
            p[PLD] = acc[r][t][1];
            p[8] = acc[r][t][2];
            p[PLD + 8] = acc[r][t][3];
          } else {
            p[0] += acc[r][t][0];
            p[PLD] += acc[r][t][1];
            p[8] += acc[r][t][2];
            p[PLD + 8] += acc[r][t][3];
          }
        }
    }
  }
  // the residual (groups' third and fourth entries) on CUDA cores: a thread per (column of X,
  // strip), its strip's entries in order (deterministic); X^T from shared memory
  for (int i = 0; i < kpw; ++i) sp_bar_wait(bar0 + 8u * i);
  __syncthreads();
  if (!(flags & 4)) {
    const int bl = tid & 63;
    if (b0 + bl < k) {
      for (int sl = tid >> 6; sl < SPW; sl += NT / 64) {
        const int f0 = prefix(sl), f1 = f0 + res_p[sl] - res_a[sl];
        for (int f = f0; f < f1; ++f) {
          int rc;
          float av;
          if (f < staged) {
            rc = res_c[f];
            av = res_v[f];
          } else {
            const int e = res_a[sl] + f - f0;
            rc = __ldg(res_rc + e);
            av = ld(val[__ldg(res_pos + e)]);
          }
          const int col = rc >> 4, rl = rc & 15;
          const int jl = (col >> 5) - jlo, kc = col & 31;
          const int w = jl / kpw, i = jl - w * kpw;
          const val_t xv = *reinterpret_cast<const val_t*>(
              Xs + (((i * WK + w) * 64 + bl) * 4 + ((kc >> 3) ^ ((bl >> 1) & 3))) * 16 + (kc & 7) * 2);
          P[bl * PLD + 16 * sl + rl] += av * ld(xv);
        }
      }
    }
  }
#if __CUDA_ARCH__ >= 900
  if (CS > 1) sp_cluster_sync();
  else __syncthreads();
#else
  __syncthreads();
#endif
  constexpr int RR = ROWS / CS;  // rows this block stores
  const unsigned pbase = sp_smem(P);
  for (int q = tid; q < SP_BB * (RR / 4); q += NT) {
    const int bb = q / (RR / 4), c4 = rank * RR + (q % (RR / 4)) * 4;
    float4 s4 = *reinterpret_cast<const float4*>(P + bb * PLD + c4);
#if __CUDA_ARCH__ >= 900
    if (CS > 1 && !(flags & 16)) {
      s4 = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int c = 0; c < CS; ++c) {
        const float4 o = sp_ld_cluster(pbase + (unsigned)((bb * PLD + c4) * 4), (unsigned)c);
        s4.x += o.x;
        s4.y += o.y;
        s4.z += o.z;
        s4.w += o.w;
      }
    }
#endif
    const int b = b0 + bb, r = row0 + c4;
    if (b < k) {
      const float sv[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (r + c < m) yt[(i64)b * m + r + c] = st(sv[c] + (bias ? ld(RO(bias + r + c)) : 0.f));
    }
  }
  (void)pbase;
#if __CUDA_ARCH__ >= 900
  if (CS > 1) sp_cluster_sync();  // no block leaves while another still reads its shared memory
#endif
}

#define SPMM_SP(R, WR, WK, CS, ATTR)                                                                                   \
  extern "C" __global__ void ATTR __launch_bounds__(32 * WR * WK, 1) spmm_sp_r##R##w##WR##k##WK##_s##CS(               \
      i64 m, i64 n, i64 k, i64 J, i64 kpw, const int* rowptr, const unsigned char* recs, const int* rptr,              \
      const int* res_pos, const int* res_rc, const val_t* val, const val_t* xt, const val_t* bias, val_t* yt,          \
      i64 flags) {                                                                                                     \
    spmm_sp_body<R, WR, WK, CS, (R == 2 ? 2 : 1)>(m, n, k, J, kpw, rowptr, recs, rptr, res_pos, res_rc, val, xt, bias, yt, flags);      \
  }

#define SPMM_SP_ALL(R, WR, WK)                     \
  SPMM_SP(R, WR, WK, 1, )                          \
  SPMM_SP_CL(R, WR, WK)

#if __CUDA_ARCH__ >= 900
#define SPMM_SP_CL(R, WR, WK)                       \
  SPMM_SP(R, WR, WK, 2, __cluster_dims__(2, 1, 1)) \
  SPMM_SP(R, WR, WK, 4, __cluster_dims__(4, 1, 1)) \
  SPMM_SP(R, WR, WK, 8, __cluster_dims__(8, 1, 1))
#else
#define SPMM_SP_CL(R, WR, WK)
#endif

// the configurations _spmm_sp.SP_CONFIGS lists: (R, WR, WK)
SPMM_SP_ALL(4, 2, 4)
SPMM_SP_ALL(4, 4, 2)
SPMM_SP_ALL(2, 4, 2)
SPMM_SP_ALL(2, 2, 4)

#endif  // VAL_KIND <= 1

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
// (the residual) are added on CUDA cores after the tensor-core loop: per (strip, k-chunk) ranges
// rptr, their CSR positions res_pos and (column << 4 | row in strip) res_rc.
//
// Blocks: R strips per warp (16 R rows, all 64 columns of X: R x 8 accumulator tiles), WR warps
// along the rows, WK warps along K (each kpw k-chunks); a cluster of CS blocks splits K further
// (sm_90). Everything a block reads is copied into shared memory with cp.async at its start, so that
// the loop never waits on global memory: the X^T slice (kpw x WK k-chunks x 64 columns of X) and the
// records stage by stage (stage i = the i-th k-chunk of every K warp, each on its own mbarrier,
// blocks starting at rotated stages), then each row's run of values in the block's k-chunks (the
// 16-byte units around [rowptr + toff(first), rowptr + toff(last + 1)): the runs' lengths, a prefix
// over the rows, then the copies; a value at CSR position p then sits at delta(row) + 2 p) and the
// block's residual entries, on one more mbarrier. Where a block's runs exceed vcap bytes it reads the
// values from global memory instead. X^T rows are 64 bytes per k-chunk with the four 16-byte units
// XOR-swizzled by (row >> 1) & 3 (conflict-free ldmatrix.x4 for the B fragments). The residual goes
// into the accumulators of the first K warp of each row range (each lane its rows' entries, in
// order). Partial sums: the WK warps of a row range add theirs into shared memory in order
// (deterministic), then the CS blocks' partials meet over distributed shared memory, each block
// summing its share of the rows in rank order, adding the bias and storing Y^T. No atomics: results
// are bitwise reproducible.
//
// flags (benchmarking only, wrong results): 1 skips the products, 2 the value loads, 4 the residual,
// 8 the copies into shared memory, 16 the cluster's sum (each block stores its own partial sums).

#if VAL_KIND <= 1

#define SP_REC 160       // bytes per block record
#define SP_BB 64         // columns of X per block
#define SP_RES 512       // residual entries staged in shared memory per block

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

__device__ __forceinline__ unsigned sp_lds16(unsigned addr) {
  unsigned short v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sp_cp4(unsigned dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}

// One value of the CSR (position p): from the block's copy in shared memory (at dl + 2 p, dl the
// row's delta) or, where the block's values did not fit, from global memory.
__device__ __forceinline__ unsigned sp_val(bool vsm, unsigned dl, int p, const val_t* __restrict__ val) {
  return vsm ? sp_lds16(dl + 2u * (unsigned)p) : (unsigned)__ldg(reinterpret_cast<const unsigned short*>(val) + p);
}

// One k-chunk's fragment registers for R strips: per strip and register the group's first entry
// (low half; none where the group's only entry is at position 3) and second (high half; the only
// entry where it is at position 3), zero where absent.
template <int R>
__device__ __forceinline__ void sp_load_vals(unsigned (&v)[R][4], const unsigned char* rec0, const int (&rp)[R][2],
                                             const unsigned (&dl)[R][2], bool vsm, const val_t* __restrict__ val,
                                             int g, int sh0) {
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
      if (nib != 0u && nib != 8u) v1 = sp_val(vsm, dl[r][q & 1], pos, val);
      if (cnt >= 2 || nib == 8u) v2 = sp_val(vsm, dl[r][q & 1], pos + (nib == 8u ? 0 : 1), val);
      v[r][q] = v1 | (v2 << 16);
    }
  }
}

// Shared memory (bytes, in order): the X^T slots [kpw][WK][64][64 bytes]; the records
// [kpw][WK][SPW][SP_REC]; the block's CSR values (vcap bytes: per row the 16-byte-aligned run of its
// entries in the block's k-chunks); the residual entries (SP_RES x (res_rc, res_pos)); per row of the
// block its delta (value at CSR position p at delta + 2 p), start (rowptr) and value units (prefix);
// per strip its residual range; the barriers (kpw slots + one for values and residual). The float32
// partial sums [64][ROWS + 4] reuse the X^T slots and records after the loop.
template <int R, int WR, int WK, int CS>
__device__ __forceinline__ void spmm_sp_body(i64 m_, i64 n_, i64 k_, i64 J_, i64 kpw_, i64 vcap_,
                                             const int* __restrict__ rowptr, const unsigned char* __restrict__ recs,
                                             const int* __restrict__ rptr, const int* __restrict__ res_pos,
                                             const int* __restrict__ res_rc, const val_t* __restrict__ val,
                                             const val_t* __restrict__ xt, const val_t* __restrict__ bias,
                                             val_t* __restrict__ yt, i64 flags_) {
  constexpr int NT = 32 * WR * WK;
  constexpr int ROWS = 16 * R * WR;
  constexpr int PLD = ROWS + 4;
  constexpr int SPW = R * WR;  // strips per block
  const int m = (int)m_, n = (int)n_, k = (int)k_, J = (int)J_, kpw = (int)kpw_, flags = (int)flags_;
  const int vcap = (int)vcap_;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* Xs = smem;
  unsigned char* Rs = Xs + (size_t)kpw * WK * 4096;
  unsigned char* Vs = Rs + (size_t)kpw * WK * SPW * SP_REC;
  int* rs_c = reinterpret_cast<int*>(Vs + vcap);   // [SP_RES]
  int* rs_p = rs_c + SP_RES;                       // [SP_RES]
  int* row_d = rs_p + SP_RES;                      // [ROWS] delta (shared address of CSR position 0)
  int* row_s = row_d + ROWS;                       // [ROWS] rowptr
  int* row_u = row_s + ROWS;                       // [ROWS + 1] value units: counts, then exclusive prefix
  int* res_a = row_u + ROWS + 4;                   // [16] the strips' first residual entries
  int* res_n = res_a + 16;                         // [16] and their counts
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(res_n + 16);  // [kpw + 1]
  float* P = reinterpret_cast<float*>(smem);       // [64][PLD], after the loop
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tig = lane & 3;
  const int wr = warp % WR, wk = warp / WR;
  int rank = 0;
#if __CUDA_ARCH__ >= 900
  if (CS > 1) rank = (int)cluster_rank();
#endif
  const int S = (m + 15) >> 4;
  const int strip0 = (int)(blockIdx.x / CS) * SPW;
  const int row0 = strip0 * 16;
  const int b0 = (int)blockIdx.y * SP_BB;
  const int jlo = rank * WK * kpw;                 // the block's k-chunks [jlo, jhi)
  const int jhi = min(J, jlo + WK * kpw);
  // blocks start at different slots (k-chunks) so that they do not all read the same X^T lines at once
  const int rot = (int)((blockIdx.x / CS) % (unsigned)kpw);
  const unsigned xs0 = smem_addr(Xs), rs0 = smem_addr(Rs), vs0 = smem_addr(Vs), bar0 = smem_addr(bars);
  const unsigned vbar = bar0 + 8u * kpw;
  const unsigned long long vp = (unsigned long long)val;

  if (tid == 0)
    for (int i = 0; i <= kpw; ++i) mbar_init(bar0 + 8u * i, NT);
  __syncthreads();
  // every slot's X^T and records, slot rot first; each thread's copies of slot si arrive on bars[si]
  for (int ii = 0; ii < kpw; ++ii) {
    const int si = ii + rot < kpw ? ii + rot : ii + rot - kpw;
    for (int u = (flags & 8) ? WK * 256 : tid; u < WK * 256; u += NT) {
      const int w = u >> 8, b = (u >> 2) & 63, q = u & 3;
      const int j = jlo + w * kpw + si, col = 32 * j + 8 * q;
      const bool ok = j < J && col < n && b0 + b < k;
      cpa16(xs0 + (unsigned)((((si * WK + w) * 64 + b) * 4 + (q ^ ((b >> 1) & 3))) * 16),
              ok ? (const void*)(xt + (i64)(b0 + b) * n + col) : (const void*)xt, ok ? 16u : 0u);
    }
    for (int u = (flags & 8) ? WK * SPW * 10 : tid; u < WK * SPW * 10; u += NT) {
      const int w = u / (SPW * 10), rem = u % (SPW * 10), sl = rem / 10, q = rem % 10;
      const int j = jlo + w * kpw + si, s = strip0 + sl;
      const bool ok = j < J && s < S;
      cpa16(rs0 + (unsigned)(((si * WK + w) * SPW + sl) * SP_REC + 16 * q),
              ok ? (const void*)(recs + ((i64)s * J + j) * SP_REC + 16 * q) : (const void*)recs, ok ? 16u : 0u);
    }
    cpa_arrive(bar0 + 8u * si);
  }
  // the rows' runs of values in the block's k-chunks: [rowptr + toff(jlo), rowptr + toff(jhi)), as
  // 16-byte units from the unit holding the first; the strips' residual ranges
  for (int t = tid; t < ROWS; t += NT) {
    const int r = row0 + t, s = r >> 4, rl = r & 15;
    int units = 0, d0 = 0, start = 0;
    if (r < m && jlo < jhi) {
      start = __ldg(rowptr + r);
      const unsigned tw = (unsigned)__ldg(reinterpret_cast<const int*>(recs + ((i64)s * J + jlo) * SP_REC + 64 + 4 * (rl & 7)));
      const int tlo = (int)((tw >> (16 * (rl >> 3))) & 0xFFFFu);
      int thi;
      if (jhi < J) {
        const unsigned th = (unsigned)__ldg(reinterpret_cast<const int*>(recs + ((i64)s * J + jhi) * SP_REC + 64 + 4 * (rl & 7)));
        thi = (int)((th >> (16 * (rl >> 3))) & 0xFFFFu);
      } else {
        thi = __ldg(rowptr + r + 1) - start;
      }
      if (thi > tlo) {
        const unsigned long long a0 = vp + 2ull * (unsigned long long)(start + tlo);
        const unsigned long long a1 = vp + 2ull * (unsigned long long)(start + thi);
        const unsigned long long f0 = a0 & ~15ull;
        units = (int)((((a1 + 15ull) & ~15ull) - f0) >> 4);
        d0 = (int)(long long)(vp - f0);  // value at CSR position p: unit-relative byte d0 + 2 p
      }
    }
    row_s[t] = start;
    row_d[t] = d0;
    row_u[t] = units;
  }
  if (tid < SPW) {
    const int s = strip0 + tid;
    const bool ok = s < S && jlo < jhi;
    const int ea = ok ? __ldg(rptr + (i64)s * J + jlo) : 0;
    res_a[tid] = ea;
    res_n[tid] = ok ? __ldg(rptr + (i64)s * J + jhi) - ea : 0;
  }
  __syncthreads();
  if (warp == 0) {  // exclusive prefix of the rows' units (ROWS / 32 rows per lane)
    constexpr int PER = ROWS / 32;
    int loc[PER], sum = 0;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      loc[i] = row_u[lane * PER + i];
      sum += loc[i];
    }
    int inc = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += y;
    }
    int run = inc - sum;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      row_u[lane * PER + i] = run;
      run += loc[i];
    }
    if (lane == 31) row_u[ROWS] = run;
  }
  __syncthreads();
  const int units = row_u[ROWS];
  const bool vsm = 16 * units <= vcap && !(flags & 8);
  if (vsm) {
    for (int t = tid; t < ROWS; t += NT) row_d[t] += (int)(vs0 + 16u * (unsigned)row_u[t]);
  }
  auto prefix = [&](int sl) {
    int p = 0;
    for (int t = 0; t < sl; ++t) p += res_n[t];
    return p;
  };
  const int nres = prefix(SPW), staged = min(nres, SP_RES);
  __syncthreads();
  if (vsm) {
    for (int f = tid; f < units; f += NT) {  // unit f: the row t with row_u[t] <= f < row_u[t + 1]
      int lo = 0, hi = ROWS;
      while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (row_u[mid] <= f) lo = mid;
        else hi = mid;
      }
      const unsigned dst = vs0 + 16u * (unsigned)f;
      cpa16(dst, (const void*)(vp + (unsigned long long)(long long)(int)(dst - (unsigned)row_d[lo])), 16u);
    }
  }
  if (!(flags & 4)) {
    for (int f = tid; f < staged; f += NT) {
      int sl = 0, off = f;
      while (sl < SPW - 1 && off >= res_n[sl]) off -= res_n[sl], ++sl;
      const int e = res_a[sl] + off;
      sp_cp4(smem_addr(rs_c + f), res_rc + e);
      sp_cp4(smem_addr(rs_p + f), res_pos + e);
    }
  }
  cpa_arrive(vbar);

  float acc[R][8][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < 8; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[r][t][c] = 0.f;
  int rp[R][2];
  unsigned dl[R][2];
  bool live[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int sl = wr * R + r;
    live[r] = strip0 + sl < S;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      rp[r][h] = row_s[16 * sl + g + 8 * h];
      dl[r][h] = (unsigned)row_d[16 * sl + g + 8 * h];
    }
  }
  const int jw = jlo + wk * kpw;
  const int iters = min(kpw, J - jw);  // this warp's k-chunks jw + slot, slot < iters (k-chunks past J: none)
  const int sh0 = 4 * tig;
  int tiles = (k - b0 + 7) >> 3;
  tiles = tiles > 8 ? 8 : tiles;
  // ldmatrix.x4 rows: matrix (lane >> 3) = k units, row (lane & 7) = column of X
  const int lr = lane & 7, lq = lane >> 3;
  // this warp's slots in the block's order, slot rot % iters first
  const int rotw = iters > 0 ? rot % iters : 0;
  auto slot = [&](int i) { return i + rotw < iters ? i + rotw : i + rotw - iters; };
  const unsigned char* rw = Rs + (size_t)(wk * SPW + wr * R) * SP_REC;  // slot 0's records of this warp
  constexpr size_t SLOT = (size_t)WK * SPW * SP_REC;
  mbar_wait(vbar);
  unsigned v[R][4];
  if (iters > 0) {
    const int sp0 = slot(0);
    mbar_wait(bar0 + 8u * sp0);
    if (!(flags & 2)) sp_load_vals<R>(v, rw + SLOT * sp0, rp, dl, vsm, val, g, sh0);
  }
  for (int i = 0; i < iters; ++i) {
    const int si = slot(i);
    const unsigned char* rec = rw + SLOT * si;
    unsigned a[R][4], e[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int q = 0; q < 4; ++q) a[r][q] = (flags & 2) ? 0x3c003c00u : v[r][q];
      e[r] = *reinterpret_cast<const unsigned*>(rec + r * SP_REC + 96 + 4 * (2 * g + (tig & 1)));
    }
    if (i + 1 < iters) {
      const int sn = slot(i + 1);
      mbar_wait(bar0 + 8u * sn);
      if (!(flags & 2)) sp_load_vals<R>(v, rw + SLOT * sn, rp, dl, vsm, val, g, sh0);
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
  // the residual (groups' third and fourth entries) on CUDA cores, into the accumulators of the first
  // K warp of each row range: lane (g, tig) takes its rows' entries in order (deterministic)
  if (wk == 0 && !(flags & 4)) {
    for (int i = 0; i < kpw; ++i) mbar_wait(bar0 + 8u * i);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int sl = wr * R + r;
      const int f0 = prefix(sl), f1 = f0 + res_n[sl];
      for (int f = f0; f < f1; ++f) {
        int rc, pos;
        if (f < staged) {
          rc = rs_c[f];
          pos = rs_p[f];
        } else {
          const int e = res_a[sl] + f - f0;
          rc = __ldg(res_rc + e);
          pos = __ldg(res_pos + e);
        }
        const int rl = rc & 15;
        if ((rl & 7) != g) continue;
        const int col = rc >> 4;
        const float av = ld((val_t)sp_val(vsm, (unsigned)row_d[16 * sl + rl], pos, val));
        const int jl = (col >> 5) - jlo, kc = col & 31;
        const int w = jl / kpw, si = jl - w * kpw;
        const unsigned char* xb = Xs + (size_t)((si * WK + w) * 64) * 64 + (kc & 7) * 2;
        const int ku = kc >> 3;
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          const int b = 8 * t + 2 * tig;
          const float x0 = ld(*reinterpret_cast<const val_t*>(xb + (b * 4 + (ku ^ ((b >> 1) & 3))) * 16));
          const float x1 = ld(*reinterpret_cast<const val_t*>(xb + ((b + 1) * 4 + (ku ^ (((b + 1) >> 1) & 3))) * 16));
          if (rl & 8) {
            acc[r][t][2] += av * x0;
            acc[r][t][3] += av * x1;
          } else {
            acc[r][t][0] += av * x0;
            acc[r][t][1] += av * x1;
          }
        }
      }
    }
  }
  // every warp is past the X^T slots (and every copy has landed): the partial sums take their place;
  // the WK warps of each row range add theirs in order
  for (int i = 0; i < kpw; ++i) mbar_wait(bar0 + 8u * i);
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
  tile_epilogue<CS, NT, ROWS / CS, PLD>(P, CS > 1, CS > 1 && !(flags & 16), 0, SP_BB, rank * (ROWS / CS), tid, b0, row0, m, k,
                                       bias, yt);
}

#define SPMM_SP(R, WR, WK, CS, ATTR)                                                                                   \
  extern "C" __global__ void ATTR __launch_bounds__(32 * WR * WK, 1) spmm_sp_r##R##w##WR##k##WK##_s##CS(               \
      i64 m, i64 n, i64 k, i64 J, i64 kpw, i64 vcap, const int* rowptr, const unsigned char* recs, const int* rptr,    \
      const int* res_pos, const int* res_rc, const val_t* val, const val_t* xt, const val_t* bias, val_t* yt,          \
      i64 flags) {                                                                                                     \
    spmm_sp_body<R, WR, WK, CS>(m, n, k, J, kpw, vcap, rowptr, recs, rptr, res_pos, res_rc, val, xt, bias, yt, flags); \
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

// Shared prelude of every kernel source: the value, accumulator and index types, chosen at
// compile time by -DVAL_KIND=<0 float16 | 1 bfloat16 | 2 float32 | 3 float64> and
// -DIDX_KIND=<0 int32 | 1 int64>. Half types are carried as their 16-bit patterns and converted
// with PTX instructions, so NVRTC needs no toolkit header (cuda_fp16.h is not on a driver-only
// machine). Half and bfloat16 accumulate in float32, float32 in float32, float64 in float64.
// Sizes and strides travel as 64-bit integers; every kernel parameter is 8 bytes wide.

#if !defined(VAL_KIND) || !defined(IDX_KIND)
#error "compile with -DVAL_KIND=<0..3> -DIDX_KIND=<0|1>"
#endif

typedef long long i64;

#if VAL_KIND == 0
typedef unsigned short val_t;
typedef float acc_t;
__device__ __forceinline__ acc_t ld(val_t v) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v)); return f; }
__device__ __forceinline__ val_t st(acc_t f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#elif VAL_KIND == 1
typedef unsigned short val_t;
typedef float acc_t;
__device__ __forceinline__ acc_t ld(val_t v) { return __uint_as_float(((unsigned)v) << 16); }
__device__ __forceinline__ val_t st(acc_t f) { unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#elif VAL_KIND == 2
typedef float val_t;
typedef float acc_t;
__device__ __forceinline__ acc_t ld(val_t v) { return v; }
__device__ __forceinline__ val_t st(acc_t f) { return f; }
#elif VAL_KIND == 3
typedef double val_t;
typedef double acc_t;
__device__ __forceinline__ acc_t ld(val_t v) { return v; }
__device__ __forceinline__ val_t st(acc_t f) { return f; }
#else
#error "VAL_KIND must be 0..3"
#endif

#if IDX_KIND == 0
typedef int idx_t;
#elif IDX_KIND == 1
typedef long long idx_t;
#else
#error "IDX_KIND must be 0 or 1"
#endif

#define RO(p) __ldg(p)

// Sum over the VEC lanes of an aligned group of a warp (VEC a power of two <= 32).
template <int VEC>
__device__ __forceinline__ acc_t group_sum(acc_t s) {
  unsigned mask = VEC == 32 ? 0xffffffffu : (((1u << VEC) - 1u) << ((threadIdx.x & 31u) & ~(unsigned)(VEC - 1)));
#pragma unroll
  for (int o = VEC / 2; o > 0; o >>= 1) s += __shfl_down_sync(mask, s, o, VEC);
  return s;
}

__device__ __forceinline__ acc_t warp_sum(acc_t s) { return group_sum<32>(s); }

#if VAL_KIND <= 1
// Dot products on the tensor cores (the DELTA "tc" kernels, delta.cu, and the 2:4 "tc" SpMV, structured.cu): D += A B
// (mma m16n8k16, f32 accumulate) with A's rows g + 8 zero, where lane L = 4 g + t holds a0 = A[g][2t, 2t + 1],
// a2 = A[g][2t + 8, 2t + 9] and b0 = B[2t, 2t + 1][g], b1 = B[2t + 8, 2t + 9][g]: D[g][g] sums, over the four lanes
// of group g, a0 . b0 + a2 . b1. A lane whose a words hold its values and whose b words hold the matching X
// values thus adds its dot product to its group's diagonal element; tc_diag picks that element (lane 4 g + g / 2,
// element g % 2; zero in the other lanes), so a warp sum of it is the sum of every lane's dot products.
__device__ __forceinline__ void tc_mma(float (&c)[4], unsigned a0, unsigned a2, unsigned b0, unsigned b1) {
#if VAL_KIND == 0
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%5}, {%7,%8}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(b0), "r"(b1));
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%5}, {%7,%8}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(b0), "r"(b1));
#endif
}
__device__ __forceinline__ float tc_diag(const float (&c)[4], int lane) {
  const int g = lane >> 2;
  return (lane & 3) == (g >> 1) ? ((g & 1) ? c[1] : c[0]) : 0.f;
}
#endif

// Shared-memory and cluster helpers of the tensor-core kernels (mma.cu, spmm_sp.cu).
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ float4 ld_cluster(unsigned addr, unsigned rank) {
  unsigned ra;
  float4 v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(ra) : "memory");
  return v;
}
#endif

// The epilogue of the tensor-core SpMMs (mma.cu, spmm_bm.cu, spmm_sp.cu): the block's float32
// partial sums P[bb * PLD + r] (bb: the X column of the block's 64, r: the row among its rows) are
// stored as Y^T (k x m, row-major) with the bias added. Where the blocks of a cluster hold partial
// sums of one output tile (`cluster`: the column tiles of A split over the cluster), a cluster
// barrier comes first, each block sums the pieces it stores over the cluster's shared memories in
// rank order (`reduce`; deterministic), and a second barrier keeps every block's shared memory
// alive until the others have read it; otherwise a block barrier. A block stores the X columns
// [bb0, bb1) of its tile and, of each, the RR rows from c0 (RR a multiple of 4: float4 pieces).
template <int S, int THREADS, int RR, int PLD>
__device__ __forceinline__ void tile_epilogue(const float* P, bool cluster, bool reduce, int bb0, int bb1, int c0, int tid,
                                              int b0, int row0, int m, int k, const val_t* __restrict__ bias,
                                              val_t* __restrict__ yt) {
#if __CUDA_ARCH__ >= 900
  if (cluster) cluster_sync_all();
  else __syncthreads();
#else
  __syncthreads();
#endif
  constexpr int RQ = RR / 4;  // float4 pieces per stored column
  const unsigned pbase = smem_addr(P);
  for (int q = bb0 * RQ + tid; q < bb1 * RQ; q += THREADS) {
    const int bb = q / RQ, c4 = c0 + (q % RQ) * 4;
    float4 s = *reinterpret_cast<const float4*>(P + bb * PLD + c4);
#if __CUDA_ARCH__ >= 900
    if (reduce) {  // the S loads issued back to back, then summed in rank order
      float4 o[S];
#pragma unroll
      for (int j = 0; j < S; ++j) o[j] = ld_cluster(pbase + (unsigned)((bb * PLD + c4) * 4), (unsigned)j);
      s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int j = 0; j < S; ++j) {
        s.x += o[j].x;
        s.y += o[j].y;
        s.z += o[j].z;
        s.w += o[j].w;
      }
    }
#endif
    const int b = b0 + bb, r = row0 + c4;
    if (b < k) {
      const float sv[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (r + i < m) yt[(i64)b * m + r + i] = st(sv[i] + (bias ? ld(RO(bias + r + i)) : 0.f));
    }
  }
  (void)pbase;
  (void)reduce;
#if __CUDA_ARCH__ >= 900
  if (cluster) cluster_sync_all();
#endif
}

// Asynchronous copies into shared memory completing on mbarriers (spmm_sp.cu, spmm_wd.cu, spmm_rs.cu; sm_80+):
// a 16-byte cp.async that zero-fills past `bytes` (0: all zeros, the source is not read), this thread's copies so far
// arriving on a barrier when they complete (no pending-count increment: init the barrier with the thread count),
// and the wait for the barrier's first phase (try_wait sleeps in hardware on sm_90, test_wait with a back-off before).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
__device__ __forceinline__ void cpa16(unsigned dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void cpa_arrive(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar) {
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
#endif

// A warp's float32 sums of MS strips of 16 rows x 64 columns (8 m16n8k16 accumulators per strip: c0 / c1 row g,
// columns 2 t4, 2 t4 + 1 of n-tile j; c2 / c3 row g + 8) into P [64 batch][PLD] at rows 16 (warp MS + s) .. (spmm_pb.cu,
// spmm_rs.cu: what tile_epilogue then sums and stores).
template <int MS, int PLD>
__device__ __forceinline__ void strip_sums(float* P, const float (&acc)[MS][8][4], int warp, int g, int t4) {
#pragma unroll
  for (int s = 0; s < MS; ++s)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float* p = P + (8 * j + 2 * t4) * PLD + (warp * MS + s) * 16 + g;
      p[0] = acc[s][j][0];
      p[PLD] = acc[s][j][1];
      p[8] = acc[s][j][2];
      p[PLD + 8] = acc[s][j][3];
    }
}

// Tensor-core fragments of the half-precision SpMMs (mma.cu, spmm_bm.cu, spmm_cc.cu; sm_80+): four 8x8
// b16 matrices from shared memory (ldmatrix.x4, one row address per lane) and one m16n8k16 product
// with float32 accumulation, float16 or bfloat16 by VAL_KIND. The product carries no memory clobber,
// so the compiler may schedule it between fragment loads.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
__device__ __forceinline__ void ldsm_x4(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void mma16816_free(float* d, const unsigned* a, unsigned b0, unsigned b1) {
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
#endif

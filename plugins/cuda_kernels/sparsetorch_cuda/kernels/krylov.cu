// Fused conjugate gradients (CG, and PCG with Jacobi) for one real SPD system, float32 / float64.
//
// One iteration is three kernels, every scalar stays on the device (no host sync per iteration):
//
//   K1 cg_{csr,dia}_spmv_dot   q = A p and p.q (block partial sums; the last block to finish
//                              adds the partials in a fixed order and sets alpha = rho / p.q)
//   K2 cg_update_r             r -= alpha q, r.r (and r.D^-1.r with Jacobi); the last block sets
//                              beta = rho' / rho, rho = rho', counts the iteration and decides
//                              whether to stop (converged, maxiter, indefinite, not finite)
//   K3 cg_update_xp            x += alpha p; p = D^-1 r + beta p (z = r without Jacobi)
//
// Bytes per iteration (n unknowns, w = value size): K1 the matrix + 2 n w (+ neighbours of p
// from cache), K2 3 n w (+ n w Jacobi), K3 5 n w (+ n w Jacobi): 10 n w + matrix, 12 n w + matrix.
// Work vectors: x (the solution handed back), r, p, q (+ D^-1): 4 (5) per unknown, nothing else of size n.
//
// Stopping: S[S_DONE] becomes nonzero (1 converged, 2 p.Ap <= 0, 3 NaN/Inf, 4 maxiter, 5 r.D^-1.r
// <= 0); from then on every kernel returns at once (K3 still applies the last x update in the
// iteration that set it), so the host may queue blocks of iterations (a CUDA graph) past the end
// and only polls S every block. The block partial sums are added in a fixed order: results are
// deterministic for a given grid.
//
// Dot products and scalars are float64 for both value types. Every kernel takes 8-byte parameters.

#define FULL 0xffffffffu
#define KB 256  // threads per block, every kernel here
#define CSR_U 8  // CSR: a warp's nonzeros in chunks of 32 * CSR_U

#define S_RHO 0
#define S_PAP 1
#define S_ALPHA 2
#define S_BETA 3
#define S_RR 4
#define S_MINPAP 5
#define S_MINRZ 6
#define S_TOL2 7
#define S_DONE 8
#define S_ITERS 9
#define S_MAXIT 10
#define S_XDONE 11
#define S_RTOL 12
#define S_ATOL 13
#define S_RR0 14

typedef double sc_t;

__device__ __forceinline__ bool finite_(sc_t v) { return v == v && v - v == 0.0; }

// Sum over the block (KB threads); the result is valid in thread 0. Every thread must call it.
__device__ __forceinline__ sc_t block_sum(sc_t v, sc_t* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(FULL, v, o);
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();  // sh may still be read by a previous call
  if (l == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    v = l < (KB / 32) ? sh[l] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(FULL, v, o);
  }
  return v;
}

// Every block stores its NP partial sums; the last block to arrive adds them all (fixed order)
// into tot (valid in thread 0) and returns true; the ticket is reset for the next kernel.
template <int NP>
__device__ __forceinline__ bool last_block(const sc_t (&v)[NP], sc_t* partial, unsigned* ticket, sc_t (&tot)[NP]) {
  __shared__ sc_t sh[32];
  __shared__ bool amlast;
#pragma unroll
  for (int p = 0; p < NP; ++p) {
    sc_t s = block_sum(v[p], sh);
    if (threadIdx.x == 0) partial[(i64)p * gridDim.x + blockIdx.x] = s;
  }
  if (threadIdx.x == 0) {
    __threadfence();
    unsigned t = atomicAdd(ticket, 1u);
    amlast = (t == gridDim.x - 1);
  }
  __syncthreads();
  if (!amlast) return false;
  __threadfence();
#pragma unroll
  for (int p = 0; p < NP; ++p) {
    sc_t a = 0.0;
    for (int i = threadIdx.x; i < (int)gridDim.x; i += KB) a += __ldcg(partial + (i64)p * gridDim.x + i);
    tot[p] = block_sum(a, sh);
  }
  if (threadIdx.x == 0) *ticket = 0u;
  return true;
}

// After the product: p.Ap, the step length, the indefinite / not-finite stops.
__device__ __forceinline__ void finish_pap(sc_t pap, sc_t* S) {
  S[S_PAP] = pap;
  S[S_MINPAP] = fmin(S[S_MINPAP], pap);
  sc_t alpha = S[S_RHO] / pap;
  if (!finite_(pap) || !finite_(alpha)) {
    S[S_ALPHA] = 0.0;
    S[S_DONE] = 3.0;
  } else if (pap <= 0.0) {
    S[S_ALPHA] = 0.0;
    S[S_DONE] = 2.0;
  } else {
    S[S_ALPHA] = alpha;
  }
}

// A launch that finds the iteration over: the next x update is skipped too.
#define RETURN_IF_DONE(S)                                              \
  if (S[S_DONE] != 0.0) {                                              \
    if (blockIdx.x == 0 && threadIdx.x == 0) S[S_XDONE] = 1.0;         \
    return;                                                            \
  }

// ---- start: x = 0, r = b, p = z = D^-1 b, rho = r.z, the stopping threshold -----------------------
extern "C" __global__ void __launch_bounds__(KB) cg_init(i64 n, const val_t* __restrict__ b, val_t* __restrict__ x,
                                                         val_t* __restrict__ r, val_t* __restrict__ p,
                                                         const val_t* __restrict__ dinv, sc_t* S, sc_t* partial,
                                                         unsigned* ticket) {
  sc_t v[2] = {0.0, 0.0};
  for (i64 i = (i64)blockIdx.x * KB + threadIdx.x; i < n; i += (i64)gridDim.x * KB) {
    acc_t bi = ld(b[i]);
    acc_t zi = dinv ? bi * ld(dinv[i]) : bi;
    r[i] = st(bi);
    p[i] = st(zi);
    x[i] = st((acc_t)0);
    v[0] += (sc_t)bi * (sc_t)bi;
    v[1] += (sc_t)bi * (sc_t)zi;
  }
  sc_t tot[2];
  if (!last_block<2>(v, partial, ticket, tot) || threadIdx.x != 0) return;
  sc_t rr = tot[0], rz = dinv ? tot[1] : tot[0];
  sc_t rtol = S[S_RTOL], atol = S[S_ATOL];
  sc_t tol2 = fmax(rtol * rtol * rr, atol * atol);
  S[S_RR] = rr;
  S[S_RR0] = rr;
  S[S_RHO] = rz;
  S[S_TOL2] = tol2;
  S[S_ALPHA] = 0.0;
  S[S_BETA] = 0.0;
  S[S_ITERS] = 0.0;
  S[S_MINPAP] = 1.0 / 0.0;
  S[S_MINRZ] = dinv ? rz : 1.0 / 0.0;
  sc_t done = 0.0;
  if (!finite_(rr) || !finite_(rz)) done = 3.0;
  else if (rr <= tol2) done = 1.0;
  else if (dinv && !(rz > 0.0)) done = 5.0;
  else if (S[S_MAXIT] <= 0.0) done = 4.0;
  S[S_DONE] = done;
  S[S_XDONE] = done != 0.0 ? 1.0 : 0.0;
}

// ---- K1, CSR: 32 consecutive rows per warp, the warp's nonzeros in coalesced chunks of 32 * U -------
// (the arithmetic of fast.cu's csr_stream, with the dot product p.q fused, over a fixed grid)
extern "C" __global__ void __launch_bounds__(KB) cg_csr_spmv_dot(i64 m, const idx_t* __restrict__ rowptr,
                                                                 const idx_t* __restrict__ col,
                                                                 const val_t* __restrict__ val,
                                                                 const val_t* __restrict__ p, val_t* __restrict__ q,
                                                                 sc_t* S, sc_t* partial, unsigned* ticket) {
  RETURN_IF_DONE(S)
  __shared__ acc_t sp_all[KB / 32][32 * CSR_U];
  acc_t* sp = sp_all[threadIdx.x >> 5];
  const int lane = threadIdx.x & 31;
  const i64 tiles = (m + 31) >> 5;
  const i64 step = ((i64)gridDim.x * KB) >> 5;
  sc_t dot[1] = {0.0};
  for (i64 t = ((i64)blockIdx.x * KB + threadIdx.x) >> 5; t < tiles; t += step) {
    i64 r = (t << 5) + lane;
    idx_t a = RO(rowptr + (r < m ? r : m));
    idx_t bnd = RO(rowptr + (r + 1 < m ? r + 1 : m));
    idx_t start = __shfl_sync(FULL, a, 0), end = __shfl_sync(FULL, bnd, 31);
    acc_t s = 0;
    for (idx_t cs = start; cs < end; cs += 32 * CSR_U) {
      acc_t pr[CSR_U];
#pragma unroll
      for (int u = 0; u < CSR_U; ++u) {
        idx_t e = cs + u * 32 + lane;
        bool in = e < end;
        idx_t j = in ? __ldcs(col + e) : (idx_t)0;
        acc_t v = in ? ld(__ldcs(val + e)) : (acc_t)0;
        pr[u] = v * ld(RO(p + j));
      }
#pragma unroll
      for (int u = 0; u < CSR_U; ++u) sp[u * 32 + lane] = pr[u];
      __syncwarp();
      idx_t lo = (a > cs ? a : cs) - cs, hi = (bnd < cs + 32 * CSR_U ? bnd : cs + 32 * CSR_U) - cs;
      for (idx_t k = lo; k < hi; ++k) s += sp[k];
      __syncwarp();
    }
    if (r < m) {
      q[r] = st(s);
      dot[0] += (sc_t)ld(p[r]) * (sc_t)s;
    }
  }
  sc_t tot[1];
  if (last_block<1>(dot, partial, ticket, tot) && threadIdx.x == 0) finish_pap(tot[0], S);
}

// ---- K1, DIA (diagonals by row: val[d * m + i] = A[i, i + off_d]), at most 8 diagonals ---------------
// A thread per row, the offsets as parameters, no index traffic; out-of-range columns skipped.
extern "C" __global__ void __launch_bounds__(KB) cg_dia_spmv_dot(i64 m, i64 nd, i64 o0, i64 o1, i64 o2, i64 o3, i64 o4,
                                                                 i64 o5, i64 o6, i64 o7, const val_t* __restrict__ val,
                                                                 const val_t* __restrict__ p, val_t* __restrict__ q,
                                                                 sc_t* S, sc_t* partial, unsigned* ticket) {
  RETURN_IF_DONE(S)
  const i64 o[8] = {o0, o1, o2, o3, o4, o5, o6, o7};
  sc_t dot[1] = {0.0};
  for (i64 i = (i64)blockIdx.x * KB + threadIdx.x; i < m; i += (i64)gridDim.x * KB) {
    acc_t v[8], xv[8];
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      i64 j = i + o[t];
      bool in = t < nd && j >= 0 && j < m;
      v[t] = in ? ld(__ldcs(val + (i64)t * m + i)) : (acc_t)0;
      xv[t] = in ? ld(RO(p + j)) : (acc_t)0;
    }
    acc_t s = 0;
#pragma unroll
    for (int t = 0; t < 8; ++t) s += v[t] * xv[t];
    q[i] = st(s);
    dot[0] += (sc_t)ld(RO(p + i)) * (sc_t)s;
  }
  sc_t tot[1];
  if (last_block<1>(dot, partial, ticket, tot) && threadIdx.x == 0) finish_pap(tot[0], S);
}

// ---- K2: r -= alpha q, r.r (and r.z, z = D^-1 r), the stopping decision ------------------------------
extern "C" __global__ void __launch_bounds__(KB) cg_update_r(i64 n, const val_t* __restrict__ q, val_t* __restrict__ r,
                                                             const val_t* __restrict__ dinv, sc_t* S, sc_t* partial,
                                                             unsigned* ticket) {
  if (S[S_DONE] != 0.0) return;
  const acc_t alpha = (acc_t)S[S_ALPHA];
  sc_t v[2] = {0.0, 0.0};
  for (i64 i = (i64)blockIdx.x * KB + threadIdx.x; i < n; i += (i64)gridDim.x * KB) {
    acc_t ri = ld(r[i]) - alpha * ld(__ldcs(q + i));
    r[i] = st(ri);
    v[0] += (sc_t)ri * (sc_t)ri;
    if (dinv) v[1] += (sc_t)ri * (sc_t)ri * (sc_t)ld(dinv[i]);
  }
  sc_t tot[2];
  if (!last_block<2>(v, partial, ticket, tot) || threadIdx.x != 0) return;
  sc_t rr = tot[0], rz = dinv ? tot[1] : tot[0];
  sc_t it = S[S_ITERS] + 1.0;
  S[S_ITERS] = it;
  S[S_RR] = rr;
  if (dinv) S[S_MINRZ] = fmin(S[S_MINRZ], rz);
  sc_t done = 0.0;
  if (!finite_(rr) || !finite_(rz)) done = 3.0;
  else if (rr <= S[S_TOL2]) done = 1.0;
  else if (dinv && !(rz > 0.0)) done = 5.0;
  else if (it >= S[S_MAXIT]) done = 4.0;
  S[S_BETA] = rz / S[S_RHO];
  S[S_RHO] = rz;
  S[S_DONE] = done;
}

// ---- K3: x += alpha p; p = z + beta p (skipped once the iteration has stopped) -----------------------
// x is found through xp (a device word holding its address), so that a graph captured once serves
// every solve with a fresh x (the solution handed to the caller, never copied).
extern "C" __global__ void __launch_bounds__(KB) cg_update_xp(i64 n, val_t* const* xp, val_t* __restrict__ p,
                                                              const val_t* __restrict__ r, const val_t* __restrict__ dinv,
                                                              const sc_t* S) {
  if (S[S_XDONE] != 0.0) return;
  val_t* __restrict__ x = *xp;
  const acc_t alpha = (acc_t)S[S_ALPHA], beta = (acc_t)S[S_BETA];
  const bool more = S[S_DONE] == 0.0;
  for (i64 i = (i64)blockIdx.x * KB + threadIdx.x; i < n; i += (i64)gridDim.x * KB) {
    acc_t pi = ld(p[i]);
    x[i] = st(ld(x[i]) + alpha * pi);
    if (more) {
      acc_t zi = dinv ? ld(r[i]) * ld(dinv[i]) : ld(r[i]);
      p[i] = st(zi + beta * pi);
    }
  }
}

// ---- Jacobi: D^-1 of a CSR matrix (explicit diagonal entries summed; 0 where the sum is 0) -----------
extern "C" __global__ void __launch_bounds__(KB) cg_csr_diag_inv(i64 m, const idx_t* __restrict__ rowptr,
                                                                 const idx_t* __restrict__ col,
                                                                 const val_t* __restrict__ val, val_t* __restrict__ dinv) {
  for (i64 i = (i64)blockIdx.x * KB + threadIdx.x; i < m; i += (i64)gridDim.x * KB) {
    acc_t d = 0;
    for (idx_t e = rowptr[i]; e < rowptr[i + 1]; ++e)
      if ((i64)col[e] == i) d += ld(val[e]);
    dinv[i] = st(d != (acc_t)0 ? (acc_t)1 / d : (acc_t)0);
  }
}

// =====================================================================================================
// Fused BiCGStab (right-preconditioned, van der Vorst; Jacobi optional) for one real square system.
//
// With the shadow residual rh = r0 = b (x0 = 0; rh is b itself, read through ptrs[1]):
//
//   K1 bicg_{csr,dia}_spmv_v   v = A ph (ph = D^-1 p gathered on the fly) with rh.v and v.v; the
//                              last block sets alpha = rho / rh.v (breakdown if |rh.v| <= eps^2 ||rh|| ||v||)
//   K2 bicg_{csr,dia}_spmv_t   t = A sh with s = r - alpha v (and sh = D^-1 s) formed on the fly from
//                              r and v (s is never stored), s.s, t.s and t.t fused; the last block sets
//                              omega = t.s / t.t (0 when ||s|| already meets the tolerance: the half
//                              step; breakdown when |t.s| <= eps ||t|| ||s|| or t = 0)
//   K3 bicg_update_xr          x += D^-1 (alpha p + omega s); r = s - omega t with r.r and rh.r; the last
//                              block counts the iteration, decides the stop, sets beta and rho
//   K4 bicg_update_p           p = r + beta (p - omega v)
//
// Bytes per iteration (n unknowns, w = value size): the matrix twice + 18 n w (21 n w with Jacobi):
// K1 3 (4), K2 3 (4), K3 8 (9), K4 4. Work vectors: x (handed back), r, p, v, t (+ D^-1).
//
// Stops (S[B_DONE]): 1 converged, 3 NaN/Inf, 4 maxiter, 6 rho = rh.r ~ 0, 7 rh.v ~ 0, 8 omega ~ 0.
// A stop found by K1 (or a NaN by K2) leaves x as the last full iteration made it; a half step or an
// omega breakdown found by K2 is still applied by K3 (as SciPy does), then the stop is recorded
// (S[B_PEND]). After a stop every kernel returns at once.

#define B_RHO 0
#define B_ALPHA 1
#define B_OMEGA 2
#define B_BETA 3
#define B_RR 4
#define B_RHV 5
#define B_VAL 6
#define B_TOL2 7
#define B_DONE 8
#define B_ITERS 9
#define B_MAXIT 10
#define B_PEND 11
#define B_RTOL 12
#define B_ATOL 13
#define B_RR0 14
#define B_EPS 15
#define B_SS 16

__device__ __forceinline__ float fma_(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double fma_(double a, double b, double c) { return fma(a, b, c); }

// s = r - alpha v, rounded to the value type (K2 and K3 form it identically)
__device__ __forceinline__ acc_t bicg_s(val_t r, val_t v, acc_t alpha) { return ld(st(fma_(-alpha, ld(v), ld(r)))); }

// The rows of a CSR product y = A g (g(j): the input at column j), 32 rows per warp, the warp's
// nonzeros in coalesced chunks of 32 * CSR_U (as cg_csr_spmv_dot); row(i, y_i) for every row.
template <class G, class R>
__device__ __forceinline__ void csr_rows(i64 m, const idx_t* __restrict__ rowptr, const idx_t* __restrict__ col,
                                         const val_t* __restrict__ val, const G& g, R& row) {
  __shared__ acc_t sp_all[KB / 32][32 * CSR_U];
  acc_t* sp = sp_all[threadIdx.x >> 5];
  const int lane = threadIdx.x & 31;
  const i64 tiles = (m + 31) >> 5;
  const i64 step = ((i64)gridDim.x * KB) >> 5;
  for (i64 t = ((i64)blockIdx.x * KB + threadIdx.x) >> 5; t < tiles; t += step) {
    i64 r = (t << 5) + lane;
    idx_t a = RO(rowptr + (r < m ? r : m));
    idx_t bnd = RO(rowptr + (r + 1 < m ? r + 1 : m));
    idx_t start = __shfl_sync(FULL, a, 0), end = __shfl_sync(FULL, bnd, 31);
    acc_t s = 0;
    for (idx_t cs = start; cs < end; cs += 32 * CSR_U) {
      acc_t pr[CSR_U];
#pragma unroll
      for (int u = 0; u < CSR_U; ++u) {
        idx_t e = cs + u * 32 + lane;
        bool in = e < end;
        idx_t j = in ? __ldcs(col + e) : (idx_t)0;
        acc_t v = in ? ld(__ldcs(val + e)) : (acc_t)0;
        pr[u] = v * g((i64)j);
      }
#pragma unroll
      for (int u = 0; u < CSR_U; ++u) sp[u * 32 + lane] = pr[u];
      __syncwarp();
      idx_t lo = (a > cs ? a : cs) - cs, hi = (bnd < cs + 32 * CSR_U ? bnd : cs + 32 * CSR_U) - cs;
      for (idx_t k = lo; k < hi; ++k) s += sp[k];
      __syncwarp();
    }
    if (r < m) row(r, s);
  }
}

// The rows of a DIA product (at most 8 diagonals, val[d * m + i] = A[i, i + o_d]), a thread per row.
template <class G, class R>
__device__ __forceinline__ void dia_rows(i64 m, i64 nd, const i64 (&o)[8], const val_t* __restrict__ val, const G& g,
                                         R& row) {
  for (i64 i = (i64)blockIdx.x * KB + threadIdx.x; i < m; i += (i64)gridDim.x * KB) {
    acc_t v[8], xv[8];
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      i64 j = i + o[t];
      bool in = t < nd && j >= 0 && j < m;
      v[t] = in ? ld(__ldcs(val + (i64)t * m + i)) : (acc_t)0;
      xv[t] = in ? g(j) : (acc_t)0;
    }
    acc_t s = 0;
#pragma unroll
    for (int t = 0; t < 8; ++t) s += v[t] * xv[t];
    row(i, s);
  }
}

// ---- start: x = 0, r = p = b, rho = rr = b.b, the stopping threshold -------------------------------
extern "C" __global__ void __launch_bounds__(KB) bicg_init(i64 n, const val_t* __restrict__ b, val_t* __restrict__ x,
                                                           val_t* __restrict__ r, val_t* __restrict__ p, sc_t* S,
                                                           sc_t* partial, unsigned* ticket) {
  sc_t v[1] = {0.0};
  for (i64 i = (i64)blockIdx.x * KB + threadIdx.x; i < n; i += (i64)gridDim.x * KB) {
    val_t bi = b[i];
    r[i] = bi;
    p[i] = bi;
    x[i] = st((acc_t)0);
    v[0] += (sc_t)ld(bi) * (sc_t)ld(bi);
  }
  sc_t tot[1];
  if (!last_block<1>(v, partial, ticket, tot) || threadIdx.x != 0) return;
  sc_t rr = tot[0];
  sc_t rtol = S[B_RTOL], atol = S[B_ATOL];
  sc_t tol2 = fmax(rtol * rtol * rr, atol * atol);
  S[B_RR] = rr;
  S[B_RR0] = rr;
  S[B_RHO] = rr;
  S[B_TOL2] = tol2;
  S[B_ALPHA] = 1.0;
  S[B_OMEGA] = 1.0;
  S[B_BETA] = 0.0;
  S[B_ITERS] = 0.0;
  S[B_PEND] = 0.0;
  sc_t done = 0.0;
  if (!finite_(rr)) done = 3.0;
  else if (rr <= tol2) done = 1.0;
  else if (S[B_MAXIT] <= 0.0) done = 4.0;
  S[B_DONE] = done;
}

// After K1: alpha, the rh.v breakdown.
__device__ __forceinline__ void bicg_finish_v(sc_t rhv, sc_t vv, sc_t* S) {
  S[B_RHV] = rhv;
  sc_t eps = S[B_EPS];
  sc_t alpha = S[B_RHO] / rhv;
  if (!finite_(rhv) || !finite_(vv)) {
    S[B_DONE] = 3.0;
  } else if (fabs(rhv) <= eps * eps * sqrt(S[B_RR0]) * sqrt(vv)) {
    S[B_VAL] = fabs(rhv);
    S[B_DONE] = 7.0;
  } else if (!finite_(alpha)) {
    S[B_DONE] = 3.0;
  } else {
    S[B_ALPHA] = alpha;
  }
}

// After K2: omega, the half step, the omega breakdown.
__device__ __forceinline__ void bicg_finish_t(sc_t ss, sc_t ts, sc_t tt, sc_t* S) {
  S[B_SS] = ss;
  sc_t eps = S[B_EPS];
  if (!finite_(ss) || !finite_(ts) || !finite_(tt)) {
    S[B_DONE] = 3.0;
    return;
  }
  sc_t omega = 0.0, pend = 0.0;
  if (ss <= S[B_TOL2]) {
    pend = 1.0;  // the half step meets the tolerance: x += alpha ph, r = s
  } else if (!(tt > 0.0)) {
    pend = 8.0;  // t = A sh = 0 with s != 0
    S[B_VAL] = 0.0;
  } else {
    omega = ts / tt;
    if (fabs(ts) <= eps * sqrt(tt) * sqrt(ss)) {
      pend = 8.0;
      S[B_VAL] = omega;
    }
  }
  S[B_OMEGA] = omega;
  S[B_PEND] = pend;
}

// ---- K1: v = A D^-1 p with rh.v and v.v ---------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(KB) bicg_csr_spmv_v(i64 m, const idx_t* __restrict__ rowptr,
                                                                 const idx_t* __restrict__ col,
                                                                 const val_t* __restrict__ val,
                                                                 const val_t* __restrict__ p,
                                                                 const val_t* __restrict__ dinv, val_t* __restrict__ v,
                                                                 val_t* const* ptrs, sc_t* S, sc_t* partial,
                                                                 unsigned* ticket) {
  if (S[B_DONE] != 0.0) return;
  const val_t* __restrict__ rh = ptrs[1];
  sc_t dot[2] = {0.0, 0.0};
  auto g = [&](i64 j) -> acc_t { acc_t a = ld(RO(p + j)); return dinv ? a * ld(RO(dinv + j)) : a; };
  auto row = [&](i64 i, acc_t s) {
    val_t sv = st(s);
    v[i] = sv;
    sc_t y = (sc_t)ld(sv);
    dot[0] += (sc_t)ld(rh[i]) * y;
    dot[1] += y * y;
  };
  csr_rows(m, rowptr, col, val, g, row);
  sc_t tot[2];
  if (last_block<2>(dot, partial, ticket, tot) && threadIdx.x == 0) bicg_finish_v(tot[0], tot[1], S);
}

extern "C" __global__ void __launch_bounds__(KB) bicg_dia_spmv_v(i64 m, i64 nd, i64 o0, i64 o1, i64 o2, i64 o3, i64 o4,
                                                                 i64 o5, i64 o6, i64 o7, const val_t* __restrict__ val,
                                                                 const val_t* __restrict__ p,
                                                                 const val_t* __restrict__ dinv, val_t* __restrict__ v,
                                                                 val_t* const* ptrs, sc_t* S, sc_t* partial,
                                                                 unsigned* ticket) {
  if (S[B_DONE] != 0.0) return;
  const i64 o[8] = {o0, o1, o2, o3, o4, o5, o6, o7};
  const val_t* __restrict__ rh = ptrs[1];
  sc_t dot[2] = {0.0, 0.0};
  auto g = [&](i64 j) -> acc_t { acc_t a = ld(RO(p + j)); return dinv ? a * ld(RO(dinv + j)) : a; };
  auto row = [&](i64 i, acc_t s) {
    val_t sv = st(s);
    v[i] = sv;
    sc_t y = (sc_t)ld(sv);
    dot[0] += (sc_t)ld(rh[i]) * y;
    dot[1] += y * y;
  };
  dia_rows(m, nd, o, val, g, row);
  sc_t tot[2];
  if (last_block<2>(dot, partial, ticket, tot) && threadIdx.x == 0) bicg_finish_v(tot[0], tot[1], S);
}

// ---- K2: t = A D^-1 s, s = r - alpha v on the fly, with s.s, t.s, t.t ---------------------------------
extern "C" __global__ void __launch_bounds__(KB) bicg_csr_spmv_t(i64 m, const idx_t* __restrict__ rowptr,
                                                                 const idx_t* __restrict__ col,
                                                                 const val_t* __restrict__ val,
                                                                 const val_t* __restrict__ r,
                                                                 const val_t* __restrict__ v,
                                                                 const val_t* __restrict__ dinv, val_t* __restrict__ t,
                                                                 sc_t* S, sc_t* partial, unsigned* ticket) {
  if (S[B_DONE] != 0.0) return;
  const acc_t alpha = (acc_t)S[B_ALPHA];
  sc_t dot[3] = {0.0, 0.0, 0.0};
  auto g = [&](i64 j) -> acc_t { acc_t a = bicg_s(RO(r + j), RO(v + j), alpha); return dinv ? a * ld(RO(dinv + j)) : a; };
  auto row = [&](i64 i, acc_t s) {
    val_t tv = st(s);
    t[i] = tv;
    sc_t y = (sc_t)ld(tv), si = (sc_t)bicg_s(r[i], v[i], alpha);
    dot[0] += si * si;
    dot[1] += y * si;
    dot[2] += y * y;
  };
  csr_rows(m, rowptr, col, val, g, row);
  sc_t tot[3];
  if (last_block<3>(dot, partial, ticket, tot) && threadIdx.x == 0) bicg_finish_t(tot[0], tot[1], tot[2], S);
}

extern "C" __global__ void __launch_bounds__(KB) bicg_dia_spmv_t(i64 m, i64 nd, i64 o0, i64 o1, i64 o2, i64 o3, i64 o4,
                                                                 i64 o5, i64 o6, i64 o7, const val_t* __restrict__ val,
                                                                 const val_t* __restrict__ r,
                                                                 const val_t* __restrict__ v,
                                                                 const val_t* __restrict__ dinv, val_t* __restrict__ t,
                                                                 sc_t* S, sc_t* partial, unsigned* ticket) {
  if (S[B_DONE] != 0.0) return;
  const i64 o[8] = {o0, o1, o2, o3, o4, o5, o6, o7};
  const acc_t alpha = (acc_t)S[B_ALPHA];
  sc_t dot[3] = {0.0, 0.0, 0.0};
  auto g = [&](i64 j) -> acc_t { acc_t a = bicg_s(RO(r + j), RO(v + j), alpha); return dinv ? a * ld(RO(dinv + j)) : a; };
  auto row = [&](i64 i, acc_t s) {
    val_t tv = st(s);
    t[i] = tv;
    sc_t y = (sc_t)ld(tv), si = (sc_t)bicg_s(r[i], v[i], alpha);
    dot[0] += si * si;
    dot[1] += y * si;
    dot[2] += y * y;
  };
  dia_rows(m, nd, o, val, g, row);
  sc_t tot[3];
  if (last_block<3>(dot, partial, ticket, tot) && threadIdx.x == 0) bicg_finish_t(tot[0], tot[1], tot[2], S);
}

// ---- K3: x += D^-1 (alpha p + omega s); r = s - omega t, r.r and rh.r; the stopping decision ----------
extern "C" __global__ void __launch_bounds__(KB) bicg_update_xr(i64 n, val_t* const* ptrs, const val_t* __restrict__ p,
                                                                const val_t* __restrict__ v,
                                                                const val_t* __restrict__ t, val_t* __restrict__ r,
                                                                const val_t* __restrict__ dinv, sc_t* S, sc_t* partial,
                                                                unsigned* ticket) {
  if (S[B_DONE] != 0.0) return;
  val_t* __restrict__ x = ptrs[0];
  const val_t* __restrict__ rh = ptrs[1];
  const acc_t alpha = (acc_t)S[B_ALPHA], omega = (acc_t)S[B_OMEGA];
  sc_t d[2] = {0.0, 0.0};
  for (i64 i = (i64)blockIdx.x * KB + threadIdx.x; i < n; i += (i64)gridDim.x * KB) {
    acc_t si = bicg_s(r[i], v[i], alpha);
    acc_t up = fma_(omega, si, alpha * ld(p[i]));
    if (dinv) up *= ld(dinv[i]);
    x[i] = st(ld(x[i]) + up);
    val_t rv = st(fma_(-omega, ld(__ldcs(t + i)), si));
    r[i] = rv;
    sc_t y = (sc_t)ld(rv);
    d[0] += y * y;
    d[1] += (sc_t)ld(rh[i]) * y;
  }
  sc_t tot[2];
  if (!last_block<2>(d, partial, ticket, tot) || threadIdx.x != 0) return;
  sc_t rr = tot[0], rho = tot[1];
  sc_t it = S[B_ITERS] + 1.0;
  S[B_ITERS] = it;
  S[B_RR] = rr;
  sc_t eps = S[B_EPS], pend = S[B_PEND];
  sc_t beta = (rho / S[B_RHO]) * (S[B_ALPHA] / S[B_OMEGA]);
  sc_t done = 0.0;
  if (!finite_(rr) || !finite_(rho)) done = 3.0;
  else if (rr <= S[B_TOL2]) done = 1.0;
  else if (pend != 0.0) done = pend;
  else if (fabs(rho) <= eps * eps * sqrt(S[B_RR0]) * sqrt(rr)) {
    S[B_VAL] = fabs(rho);
    done = 6.0;
  } else if (it >= S[B_MAXIT]) done = 4.0;
  else if (!finite_(beta)) done = 3.0;
  S[B_BETA] = done == 0.0 ? beta : 0.0;
  S[B_RHO] = rho;
  S[B_DONE] = done;
}

// ---- K4: p = r + beta (p - omega v) -----------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(KB) bicg_update_p(i64 n, val_t* __restrict__ p, const val_t* __restrict__ r,
                                                               const val_t* __restrict__ v, const sc_t* S) {
  if (S[B_DONE] != 0.0) return;
  const acc_t beta = (acc_t)S[B_BETA], omega = (acc_t)S[B_OMEGA];
  for (i64 i = (i64)blockIdx.x * KB + threadIdx.x; i < n; i += (i64)gridDim.x * KB)
    p[i] = st(fma_(beta, fma_(-omega, ld(__ldcs(v + i)), ld(p[i])), ld(r[i])));
}

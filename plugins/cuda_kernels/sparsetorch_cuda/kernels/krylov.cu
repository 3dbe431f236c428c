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

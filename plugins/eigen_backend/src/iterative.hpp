// Iterative solvers on zero-copy maps of A's buffers: conjugate gradient, BiCGSTAB and least-squares
// CG (CGLS), with Eigen's preconditioners (diagonal, IncompleteCholesky, IncompleteLUT).
//
// The loops are those of Eigen's ConjugateGradient, BiCGSTAB and LeastSquaresConjugateGradient
// (Eigen/src/IterativeLinearSolvers), written out here so that they can
//   - stop on sparsetorch's test ||b - A x|| <= max(rtol ||b||, atol), per right-hand side;
//   - check the true residual at the end and continue from x when the recursive one drifted;
//   - detect p^H A p <= 0 in CG (an indefinite matrix under properties="spd");
//   - report NaN/Inf and breakdowns as statuses, and call a progress callback.
// Products with A use Eigen's sparse kernels on Map<SparseMatrix> views of the user's buffers
// (CSR = RowMajor, CSC = ColMajor; int32 or int64 indices): no copy of values or indices.
// Eigen runs the RowMajor product y = A x with OpenMP (Eigen::setNbThreads), when A has more
// than 20000 entries; the ColMajor and adjoint products are sequential.
#pragma once

#include <functional>
#include <memory>

#include <Eigen/IterativeLinearSolvers>
#include <Eigen/OrderingMethods>

#include "common.hpp"

namespace ste {

template <class S>
using ColMatrixI = Eigen::SparseMatrix<S, Eigen::ColMajor, int>;

// y = A x (or A^H x) on a map of A's buffers, type-erased over index width and layout.
template <class S>
struct LinOp {
  virtual ~LinOp() = default;
  virtual void apply(const Vec<S>& x, Vec<S>& y, bool adjoint) const = 0;
  virtual ColMatrixI<S> copy(bool adjoint) const = 0;  // for the incomplete factorizations
  virtual Vec<S> diagonal() const = 0;
  virtual Vec<Real<S>> col_sqnorms(bool adjoint) const = 0;  // ||A e_j||^2 (rows when adjoint)
  virtual double frobenius() const = 0;
  virtual bool finite() const = 0;
  Index rows = 0, cols = 0;
};

template <class S, class I, int Layout>
struct MapOp final : LinOp<S> {
  using M = Eigen::Map<const Eigen::SparseMatrix<S, Layout, I>>;
  M A;
  MapOp(Index r, Index c, Index nnz, const void* outer, const void* inner, const S* v)
      : A(r, c, nnz, static_cast<const I*>(outer), static_cast<const I*>(inner), v) {
    this->rows = r;
    this->cols = c;
  }
  void apply(const Vec<S>& x, Vec<S>& y, bool adjoint) const override {
    if (adjoint) y.noalias() = A.adjoint() * x;
    else y.noalias() = A * x;
  }
  ColMatrixI<S> copy(bool adjoint) const override {
    if (adjoint) return ColMatrixI<S>(A.adjoint());
    return ColMatrixI<S>(A);
  }
  Vec<S> diagonal() const override {
    Vec<S> d = Vec<S>::Zero(std::min(A.rows(), A.cols()));
    for (Index o = 0; o < A.outerSize(); ++o)
      for (typename M::InnerIterator it(A, o); it; ++it)
        if (it.row() == it.col()) d(it.row()) += it.value();
    return d;
  }
  Vec<Real<S>> col_sqnorms(bool adjoint) const override {
    Vec<Real<S>> out = Vec<Real<S>>::Zero(adjoint ? A.rows() : A.cols());
    for (Index o = 0; o < A.outerSize(); ++o)
      for (typename M::InnerIterator it(A, o); it; ++it) out(adjoint ? it.row() : it.col()) += Eigen::numext::abs2(it.value());
    return out;
  }
  double frobenius() const override {
    double s = 0;
    const S* v = A.valuePtr();
    for (Index i = 0; i < A.nonZeros(); ++i) s += double(Eigen::numext::abs2(v[i]));
    return std::sqrt(s);
  }
  bool finite() const override {
    const S* v = A.valuePtr();
    for (Index i = 0; i < A.nonZeros(); ++i)
      if (!Eigen::numext::isfinite(v[i])) return false;
    return true;
  }
};

// z = M^{-1} r.
template <class S>
struct Precond {
  virtual ~Precond() = default;
  virtual void apply(const Vec<S>& r, Vec<S>& z) const = 0;
};

template <class S>
struct IdentityPre final : Precond<S> {
  void apply(const Vec<S>& r, Vec<S>& z) const override { z = r; }
};

template <class S>
struct DiagonalPre final : Precond<S> {
  Vec<S> inv;
  explicit DiagonalPre(const Vec<S>& d) : inv(d.size()) {
    // Eigen's DiagonalPreconditioner: 1/d where d != 0, else 1.
    for (Index i = 0; i < d.size(); ++i) inv(i) = d(i) == S(0) ? S(1) : S(1) / d(i);
  }
  void apply(const Vec<S>& r, Vec<S>& z) const override { z = inv.cwiseProduct(r); }
};

template <class S>
struct ICPre final : Precond<S> {
  Eigen::IncompleteCholesky<S, Eigen::Lower, Eigen::AMDOrdering<int>> ic;
  void apply(const Vec<S>& r, Vec<S>& z) const override { z = ic.solve(r); }
};

template <class S>
struct ILUTPre final : Precond<S> {
  Eigen::IncompleteLUT<S, int> ilut;
  void apply(const Vec<S>& r, Vec<S>& z) const override { z = ilut.solve(r); }
};

struct Outcome {
  Index iterations = 0;
  double residual = 0;  // true relative residual ||b - A x|| / ||b|| (LSQR: see lscg)
  int code = OK;
  std::string message;
  std::vector<double> history;
};

using Callback = std::function<void(Index, double)>;

struct Stop {
  double rtol = 1e-6, atol = 0, btol = 1e-6, damp = 0;
  Index maxiter = -1;
  Index check_every = 1;
  // BiCGSTAB: stop when no residual 1 % below the best has come in max(1000, n) iterations (0: run to maxiter). The
  // core asks for it where a direct method waits behind the attempt (dispatch chose it; no maxiter was given).
  bool stagnation = false;
  Callback callback;
};

template <class S>
bool all_finite(const Vec<S>& v) {
  for (Index i = 0; i < v.size(); ++i)
    if (!Eigen::numext::isfinite(v(i))) return false;
  return true;
}

template <class S>
class Iterative {
 public:
  using R = Real<S>;

  Iterative(const std::string& method, const std::string& precond, Index rows, Index cols, std::uintptr_t outer,
            std::uintptr_t inner, Index nnz, bool index64, bool csr, Index batch, double ilut_droptol, int ilut_fill,
            double ic_shift)
      : method_(method), precond_(precond), rows_(rows), cols_(cols), outer_(as_ptr(outer)), inner_(as_ptr(inner)),
        nnz_(nnz), index64_(index64), csr_(csr), batch_(batch), ilut_droptol_(ilut_droptol), ilut_fill_(ilut_fill),
        ic_shift_(ic_shift) {
    require(method == "cg" || method == "bicgstab" || method == "lscg", "unknown iterative method '" + method + "'");
    require(precond == "none" || precond == "jacobi" || precond == "ic" || precond == "ilut",
            "unknown preconditioner '" + precond + "' (none, jacobi, ic, ilut)");
    require(method == "lscg" || rows == cols, method + " needs a square matrix");
    require(!(method == "lscg" && (precond == "ic" || precond == "ilut")), "lscg takes the jacobi preconditioner only");
    require(batch >= 1 && nnz >= 0, "bad sizes");
  }

  // Numeric phase: maps of the new values, preconditioners built per member. Returns, per member,
  // (code, message) of the preconditioner's setup (IncompleteCholesky can fail).
  std::vector<std::pair<int, std::string>> set_values(std::uintptr_t values) {
    const S* v = static_cast<const S*>(as_ptr(values));
    ops_.clear();
    pre_.clear();
    pre_adj_.clear();
    finite_.clear();
    frob_.clear();
    std::vector<std::pair<int, std::string>> out;
    for (Index i = 0; i < batch_; ++i) {
      ops_.emplace_back(make_op(v + i * nnz_));
      finite_.push_back(ops_.back()->finite());
      frob_.push_back(ops_.back()->frobenius());
      std::pair<int, std::string> st{OK, ""};
      pre_.emplace_back(finite_.back() ? build_pre(*ops_.back(), false, st) : std::unique_ptr<Precond<S>>(new IdentityPre<S>()));
      pre_adj_.emplace_back(nullptr);
      out.push_back(st);
    }
    return out;
  }

  // X for the k columns of B ((n, k) column-major); one Outcome per column.
  std::vector<Outcome> solve(Index member, std::uintptr_t b, std::uintptr_t x, Index k, bool adjoint, const Stop& stop) {
    require(member >= 0 && member < Index(ops_.size()), "solve before set_values, or member out of range");
    const LinOp<S>& op = *ops_[member];
    const bool ls = method_ == "lscg";
    const Index m = ls ? (adjoint ? cols_ : rows_) : rows_;
    const Index n = ls ? (adjoint ? rows_ : cols_) : cols_;
    Eigen::Map<const Mat<S>> B(static_cast<const S*>(as_ptr(b)), m, k);
    Eigen::Map<Mat<S>> X(static_cast<S*>(const_cast<void*>(as_ptr(x))), n, k);
    const Precond<S>* M = preconditioner(member, adjoint);
    std::vector<Outcome> outs;
    for (Index j = 0; j < k; ++j) {
      Vec<S> bj = B.col(j), xj = Vec<S>::Zero(n);
      Outcome o;
      if (!finite_[member] || !all_finite(bj)) {
        xj.setConstant(S(std::numeric_limits<R>::quiet_NaN()));
        o.code = NOT_FINITE;
        o.residual = std::numeric_limits<double>::quiet_NaN();
        o.message = !finite_[member] ? "A's values hold NaN or Inf" : "the right-hand side holds NaN or Inf";
      } else if (method_ == "cg") {
        o = cg(op, *M, bj, xj, adjoint, stop);
      } else if (method_ == "bicgstab") {
        o = bicgstab(op, *M, bj, xj, adjoint, stop);
      } else {
        o = lscg(op, *M, bj, xj, adjoint, stop, frob_[member]);
      }
      X.col(j) = xj;
      outs.push_back(std::move(o));
    }
    return outs;
  }

 private:
  std::unique_ptr<LinOp<S>> make_op(const S* v) const {
    // CSR buffers: RowMajor map of A. CSC buffers: ColMajor map of A.
    if (index64_) {
      if (csr_) return std::unique_ptr<LinOp<S>>(new MapOp<S, std::int64_t, Eigen::RowMajor>(rows_, cols_, nnz_, outer_, inner_, v));
      return std::unique_ptr<LinOp<S>>(new MapOp<S, std::int64_t, Eigen::ColMajor>(rows_, cols_, nnz_, outer_, inner_, v));
    }
    if (csr_) return std::unique_ptr<LinOp<S>>(new MapOp<S, int, Eigen::RowMajor>(rows_, cols_, nnz_, outer_, inner_, v));
    return std::unique_ptr<LinOp<S>>(new MapOp<S, int, Eigen::ColMajor>(rows_, cols_, nnz_, outer_, inner_, v));
  }

  std::unique_ptr<Precond<S>> build_pre(const LinOp<S>& op, bool adjoint, std::pair<int, std::string>& st) const {
    if (precond_ == "none") return std::unique_ptr<Precond<S>>(new IdentityPre<S>());
    if (precond_ == "jacobi") {
      if (method_ == "lscg") {
        // Eigen's LeastSquareDiagonalPreconditioner: the diagonal of A^H A (or A A^H).
        Vec<Real<S>> d = op.col_sqnorms(adjoint);
        return std::unique_ptr<Precond<S>>(new DiagonalPre<S>(d.template cast<S>()));
      }
      Vec<S> d = op.diagonal();
      if (adjoint) d = d.conjugate();
      return std::unique_ptr<Precond<S>>(new DiagonalPre<S>(d));
    }
    if (precond_ == "ic") {
      auto* p = new ICPre<S>();
      p->ic.setInitialShift(R(ic_shift_));
      ColMatrixI<S> A = op.copy(false);  // Hermitian: A^H = A
      p->ic.compute(A);
      if (p->ic.info() != Eigen::Success) {
        st = {INDEFINITE, "IncompleteCholesky failed (the matrix does not look positive definite)"};
        delete p;
        return std::unique_ptr<Precond<S>>(new IdentityPre<S>());
      }
      return std::unique_ptr<Precond<S>>(p);
    }
    auto* p = new ILUTPre<S>();
    p->ilut.setDroptol(R(ilut_droptol_));
    p->ilut.setFillfactor(ilut_fill_);
    ColMatrixI<S> A = op.copy(adjoint);
    p->ilut.compute(A);
    if (p->ilut.info() != Eigen::Success) {
      st = {FAILED, "IncompleteLUT failed (a zero pivot)"};
      delete p;
      return std::unique_ptr<Precond<S>>(new IdentityPre<S>());
    }
    return std::unique_ptr<Precond<S>>(p);
  }

  const Precond<S>* preconditioner(Index member, bool adjoint) {
    if (!adjoint || precond_ == "none" || precond_ == "ic") return pre_[member].get();
    if (!pre_adj_[member]) {
      std::pair<int, std::string> st{OK, ""};
      pre_adj_[member] = finite_[member] ? build_pre(*ops_[member], true, st) : std::unique_ptr<Precond<S>>(new IdentityPre<S>());
    }
    return pre_adj_[member].get();
  }

  Index budget(const Stop& s, Index n) const { return s.maxiter > 0 ? s.maxiter : std::max<Index>(10 * n, 100); }

  static void report(const Stop& s, Outcome& o, Index it, double rel) {
    const Index every = std::max<Index>(1, s.check_every);
    if (it % every == 0) {
      o.history.push_back(rel);
      if (s.callback) s.callback(it, rel);
    }
  }

  // Preconditioned CG (Eigen's internal::conjugate_gradient) with the curvature check.
  Outcome cg(const LinOp<S>& A, const Precond<S>& M, const Vec<S>& b, Vec<S>& x, bool adjoint, const Stop& s) const {
    Outcome o;
    const Index n = cols_;
    const double bnorm = double(b.norm());
    const double thr = std::max(s.rtol * bnorm, s.atol);
    const Index maxit = budget(s, n);
    if (bnorm == 0) { x.setZero(); return o; }
    Vec<S> r(n), z(n), p(n), tmp(n);
    Index it = 0;
    // restarts from the true residual after the recursive one met the tolerance: past kRefresh, the gap
    // between them (the rounding of the updates: CG's attainable accuracy in this precision) stopped the
    // run, not maxiter, and the message says so (session 29: "maxiter=100000 reached" after 169 float32
    // iterations)
    constexpr int kRefresh = 5;
    int met = 0;
    for (int refresh = 0; refresh < kRefresh; ++refresh) {
      A.apply(x, tmp, adjoint);
      r = b - tmp;
      double rn = double(r.norm());
      if (rn <= thr) { o.code = OK; break; }
      if (it >= maxit) { o.code = MAX_ITERATIONS; break; }
      M.apply(r, z);
      p = z;
      R absNew = Eigen::numext::real(r.dot(z));
      if (!(absNew > 0)) {
        o.code = absNew == absNew ? INDEFINITE : NOT_FINITE;
        o.message = "the preconditioner is not positive definite (r^H M^-1 r <= 0)";
        break;
      }
      const R thr2 = R(thr) * R(thr);
      bool done = false;
      while (it < maxit) {
        A.apply(p, tmp, adjoint);
        const R curv = Eigen::numext::real(p.dot(tmp));
        if (!(curv > 0)) {
          o.code = curv == curv ? INDEFINITE : NOT_FINITE;
          o.message = curv == curv ? "p^H A p = " + fmt_double(double(curv)) + " <= 0 at iteration " + std::to_string(it + 1) +
                                         ": the matrix is not positive definite"
                                   : "a NaN or Inf appeared at iteration " + std::to_string(it + 1);
          done = true;
          break;
        }
        const S alpha = S(absNew / curv);
        x += alpha * p;
        r -= alpha * tmp;
        ++it;
        const R rn2 = r.squaredNorm();
        if (!(rn2 == rn2) || std::isinf(double(rn2))) {
          o.code = NOT_FINITE;
          o.message = "a NaN or Inf appeared at iteration " + std::to_string(it);
          done = true;
          break;
        }
        report(s, o, it, std::sqrt(double(rn2)) / bnorm);
        if (rn2 <= thr2) { ++met; break; }
        M.apply(r, z);
        const R absOld = absNew;
        absNew = Eigen::numext::real(r.dot(z));
        p = z + S(absNew / absOld) * p;
      }
      if (done) break;
    }
    finish(A, b, x, adjoint, bnorm, thr, it, o, maxit);
    if (o.code == MAX_ITERATIONS && met >= kRefresh && it < maxit)
      o.message = "stagnated, not maxiter (" + std::to_string(maxit) + ", not reached): the recursive residual met "
                  "the tolerance " + std::to_string(met) + " times, restarted each time from the true residual, which "
                  "stays at ||b - A x|| = " + fmt_double(o.residual * bnorm) + " > max(rtol ||b||, atol) = " +
                  fmt_double(thr) + " (the rounding of CG's updates limits its attainable accuracy in this "
                  "precision; a direct method or a looser rtol)";
    return o;
  }

  // BiCGSTAB (Eigen's internal::bicgstab), restarting from x when r0 becomes orthogonal to r.
  Outcome bicgstab(const LinOp<S>& A, const Precond<S>& M, const Vec<S>& b, Vec<S>& x, bool adjoint, const Stop& s) const {
    Outcome o;
    const Index n = cols_;
    const double bnorm = double(b.norm());
    const double thr = std::max(s.rtol * bnorm, s.atol);
    const Index maxit = budget(s, n);
    if (bnorm == 0) { x.setZero(); return o; }
    const R eps2 = Eigen::NumTraits<S>::epsilon() * Eigen::NumTraits<S>::epsilon();
    const R thr2 = R(thr) * R(thr);
    Vec<S> r(n), r0(n), v(n), p(n), y(n), z(n), sv(n), t(n), tmp(n);
    Index it = 0;
    int restarts = 0;
    // stagnation (Stop::stagnation): no residual 1 % below the smallest so far within `window` iterations ends the
    // run (a float32 system whose residual grew to 228 ||b|| ran 200,005 iterations to NaN before the LU that
    // answered it in 2 s; session 26's sweep). The window is generous: BiCGSTAB's residual wanders and plateaus,
    // and a run the caller asked for by name (or with its own maxiter) is not stopped: it may still converge.
    const Index window = std::max<Index>(1000, n);
    R best = R(0);
    Index best_it = 0;
    bool stagnated = false;
    for (int refresh = 0; refresh < 5; ++refresh) {
      A.apply(x, tmp, adjoint);
      r = b - tmp;
      if (double(r.norm()) <= thr) { o.code = OK; break; }
      if (it >= maxit) { o.code = MAX_ITERATIONS; break; }
      r0 = r;
      R r0_sqnorm = r0.squaredNorm();
      S rho = S(1), alpha = S(1), w = S(1);
      v.setZero();
      p.setZero();
      bool failed = false;
      while (r.squaredNorm() > thr2 && it < maxit) {
        const S rho_old = rho;
        rho = r0.dot(r);
        if (Eigen::numext::abs(rho) < eps2 * r0_sqnorm) {
          // r0 is (nearly) orthogonal to r: restart with r0 = r (as Eigen does).
          if (++restarts > 20) {
            o.code = BREAKDOWN;
            o.message = "BiCGSTAB broke down (rho ~ 0) " + std::to_string(restarts) + " times by iteration " + std::to_string(it);
            failed = true;
            break;
          }
          A.apply(x, tmp, adjoint);
          r = b - tmp;
          r0 = r;
          rho = r0_sqnorm = r.squaredNorm();
          alpha = w = S(1);
          v.setZero();
          p.setZero();
          continue;
        }
        const S beta = (rho / rho_old) * (alpha / w);
        p = r + beta * (p - w * v);
        M.apply(p, y);
        A.apply(y, v, adjoint);
        alpha = rho / r0.dot(v);
        sv = r - alpha * v;
        M.apply(sv, z);
        A.apply(z, t, adjoint);
        const R tt = t.squaredNorm();
        w = tt > R(0) ? S(t.dot(sv) / tt) : S(0);
        x += alpha * y + w * z;
        r = sv - w * t;
        ++it;
        const R rn2 = r.squaredNorm();
        if (!(rn2 == rn2) || std::isinf(double(rn2))) {
          o.code = BREAKDOWN;
          o.message = "BiCGSTAB produced NaN/Inf at iteration " + std::to_string(it) + " (a breakdown)";
          failed = true;
          break;
        }
        report(s, o, it, std::sqrt(double(rn2)) / bnorm);
        if (best == R(0) || rn2 < R(0.98) * best) {
          best = rn2;
          best_it = it;
        } else if (s.stagnation && it - best_it > window) {
          stagnated = failed = true;
          o.code = MAX_ITERATIONS;
          break;
        }
      }
      if (failed) break;
    }
    if (o.code == BREAKDOWN && !all_finite(x)) {
      o.residual = std::numeric_limits<double>::quiet_NaN();
      o.iterations = it;
      return o;
    }
    finish(A, b, x, adjoint, bnorm, thr, it, o, maxit);
    if (stagnated && o.code == MAX_ITERATIONS)
      o.message = "BiCGSTAB stagnated: no residual below " + fmt_double(std::sqrt(double(best)) / bnorm) +
                  " ||b|| (reached at iteration " + std::to_string(best_it) + ") in the " + std::to_string(window) +
                  " iterations after it; stopped at iteration " + std::to_string(it);
    return o;
  }

  // Least-squares CG on the normal equations (Eigen's least_square_conjugate_gradient, CGLS),
  // with damping: min ||A x - b||^2 + damp^2 ||x||^2. Stops on LSQR's tests with ||A||_F:
  //   ||r|| <= btol ||b|| + atol ||A|| ||x||   (a compatible system), or
  //   ||A^H r - damp^2 x|| <= atol ||A|| ||r|| (a least-squares solution).
  // From x0 = 0 without preconditioner the iterates stay in range(A^H): the minimum-norm solution.
  Outcome lscg(const LinOp<S>& A, const Precond<S>& M, const Vec<S>& b, Vec<S>& x, bool adjoint, const Stop& s,
               double anorm) const {
    Outcome o;
    const bool fwd = !adjoint;  // operator: A (forward) or A^H
    const Index n = x.size(), m = b.size();
    const double bnorm = double(b.norm());
    const Index maxit = budget(s, n);
    const R d2 = R(s.damp * s.damp);
    if (bnorm == 0) { x.setZero(); return o; }
    Vec<S> res(m), nres(n), p(n), z(n), tmp(m);
    A.apply(x, tmp, !fwd);
    res = b - tmp;
    A.apply(res, nres, fwd);
    M.apply(nres, p);
    R absNew = Eigen::numext::real(nres.dot(p));
    Index it = 0;
    o.code = MAX_ITERATIONS;
    auto converged = [&](double rn, double nrn) {
      const double xn = double(x.norm());
      return rn <= s.btol * bnorm + s.atol * anorm * xn || nrn <= s.atol * anorm * rn;
    };
    if (converged(double(res.norm()), double(nres.norm()))) o.code = OK;
    while (o.code != OK && it < maxit) {
      A.apply(p, tmp, !fwd);
      const R denom = tmp.squaredNorm() + d2 * p.squaredNorm();
      if (!(denom > 0)) {
        o.code = denom == denom ? BREAKDOWN : NOT_FINITE;
        o.message = "||A p||^2 = 0 at iteration " + std::to_string(it + 1);
        break;
      }
      const S alpha = S(absNew / denom);
      x += alpha * p;
      res -= alpha * tmp;
      A.apply(res, nres, fwd);
      if (d2 > 0) nres -= S(d2) * x;
      ++it;
      const double rn = double(res.norm()), nrn = double(nres.norm());
      if (!(rn == rn) || std::isinf(rn)) {
        o.code = NOT_FINITE;
        o.message = "a NaN or Inf appeared at iteration " + std::to_string(it);
        break;
      }
      report(s, o, it, rn / bnorm);
      if (converged(rn, nrn)) { o.code = OK; break; }
      M.apply(nres, z);
      const R absOld = absNew;
      absNew = Eigen::numext::real(nres.dot(z));
      p = z + S(absNew / absOld) * p;
    }
    A.apply(x, tmp, !fwd);
    o.residual = double((b - tmp).norm()) / bnorm;
    o.iterations = it;
    if (o.code == MAX_ITERATIONS)
      o.message = "maxiter=" + std::to_string(maxit) + " reached (||b - A x|| / ||b|| = " + fmt_double(o.residual) + ")";
    return o;
  }

  // The true residual decides; a recursive residual that looked converged but is not, and the
  // iteration budget, are reported as MAX_ITERATIONS.
  void finish(const LinOp<S>& A, const Vec<S>& b, const Vec<S>& x, bool adjoint, double bnorm, double thr, Index it,
              Outcome& o, Index maxit) const {
    Vec<S> tmp(b.size());
    A.apply(x, tmp, adjoint);
    const double rn = double((b - tmp).norm());
    o.iterations = it;
    o.residual = rn / bnorm;
    if (o.code == OK || o.code == MAX_ITERATIONS) {
      if (rn <= thr) {
        o.code = OK;
      } else if (!(rn == rn)) {
        o.code = NOT_FINITE;
        o.message = "the iterate holds NaN or Inf";
      } else {
        o.code = MAX_ITERATIONS;
        o.message = "maxiter=" + std::to_string(maxit) + " reached with ||b - A x|| = " + fmt_double(rn) +
                    " > max(rtol ||b||, atol) = " + fmt_double(thr);
      }
    }
  }

  std::string method_, precond_;
  Index rows_, cols_;
  const void* outer_;
  const void* inner_;
  Index nnz_;
  bool index64_, csr_;
  Index batch_;
  double ilut_droptol_;
  int ilut_fill_;
  double ic_shift_;
  std::vector<std::unique_ptr<LinOp<S>>> ops_;
  std::vector<std::unique_ptr<Precond<S>>> pre_, pre_adj_;
  std::vector<bool> finite_;
  std::vector<double> frob_;
};

}  // namespace ste

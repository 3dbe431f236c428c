// Direct solvers: SimplicialLLT, SimplicialLDLT, SparseLU, SparseQR on a fixed pattern.
//
// The pattern is analysed once (constructor: analyzePattern per value-batch member); factorize()
// is the numeric phase and may run any number of times with new values. The factored matrix F
// is A's buffers read column-major without a copy (Eigen's direct solvers are column-major):
// F = A for CSC buffers, F = A^T for CSR buffers, and the solves account for it:
//   Cholesky/LDL^T (A Hermitian): A = conj(F), so A x = b  <=>  F conj(x) = conj(b);
//   LU: A x = b is F^T x = b (SparseLU's transpose view); A^H x = b is F conj(x) = conj(b).
// SparseQR takes A itself (it copies the matrix into its own storage in any case), so CSR input
// is converted by Eigen once per factorization.
#pragma once

#include <memory>

#include <Eigen/OrderingMethods>
#include <Eigen/SparseCholesky>
#include <Eigen/SparseLU>
#include <Eigen/SparseQR>

#include "common.hpp"

namespace ste {

// SparseLU builds its ordering functor itself; the runtime choice reaches it through this.
inline thread_local int lu_ordering_choice = 0;  // 0 COLAMD, 1 AMD on A^T + A, 2 natural

struct RuntimeOrdering {
  typedef Eigen::PermutationMatrix<Dynamic, Dynamic, int> PermutationType;
  template <class MatrixType>
  void operator()(const MatrixType& mat, PermutationType& perm) {
    if (lu_ordering_choice == 1) {
      // AMDOrdering returns the permutation in SimplicialLLT's convention (A is read as
      // P A P^-1 with P the inverse of the ordering); SparseLU applies perm_c^-1: invert it.
      PermutationType p;
      Eigen::AMDOrdering<int>()(mat, p);
      perm = p.inverse();
    } else if (lu_ordering_choice == 3) {
      Eigen::AMDOrdering<int>()(mat, perm);
    } else if (lu_ordering_choice == 2) {
      Eigen::NaturalOrdering<int>()(mat, perm);
    } else {
      Eigen::COLAMDOrdering<int>()(mat, perm);
    }
  }
};

template <class S>
using ColMap = Eigen::Map<const Eigen::SparseMatrix<S, Eigen::ColMajor, int>>;
template <class S>
using RowMap = Eigen::Map<const Eigen::SparseMatrix<S, Eigen::RowMajor, int>>;
template <class S>
using ColMatrix = Eigen::SparseMatrix<S, Eigen::ColMajor, int>;

// SparseLU with access to its pivots and permutation signs (for slogdet and the pivot check).
template <class S>
class LU : public Eigen::SparseLU<ColMap<S>, RuntimeOrdering> {
  using Base = Eigen::SparseLU<ColMap<S>, RuntimeOrdering>;

 public:
  // The diagonal of U (stored in the supernodes of L), in the factored order.
  Vec<S> pivots() const {
    const Index n = this->cols();
    Vec<S> d = Vec<S>::Zero(n);
    for (Index j = 0; j < n; ++j) {
      for (typename Base::SCMatrix::InnerIterator it(this->m_Lstore, j); it; ++it) {
        if (it.row() < j) continue;
        if (it.row() == j) d(j) = it.value();
        break;
      }
    }
    return d;
  }
  int permutation_sign() const { return int(this->m_detPermR * this->m_detPermC); }
  // SparseLU's blocking parameters (Eigen's defaults: panel 16, relax 1, maxsuper 128, rowblk 16,
  // colblk 8); a value <= 0 keeps the current one.
  void tune(Index panel, Index relax, Index maxsuper, Index rowblk, Index colblk) {
    if (panel > 0) this->m_perfv.panel_size = panel;
    if (relax > 0) this->m_perfv.relax = relax;
    if (maxsuper > 0) this->m_perfv.maxsuper = maxsuper;
    if (rowblk > 0) this->m_perfv.rowblk = rowblk;
    if (colblk > 0) this->m_perfv.colblk = colblk;
  }
};

// Eigen's dense kernels inside SparseLU/SparseQR (supernode updates) parallelise with OpenMP when
// Eigen::nbThreads() > 1; on a 2-core VM that made SparseLU 10-30x slower (small blocks, busy
// cores). The direct solvers run with one thread; the previous setting is restored afterwards.
struct OneThread {
  int saved;
  OneThread() : saved(Eigen::nbThreads()) { Eigen::setNbThreads(1); }
  ~OneThread() { Eigen::setNbThreads(saved); }
};

struct FactorInfo {
  int code = OK;
  std::string message;
  Index where = -1;  // a column/pivot index when known
};

template <class S>
struct SlogdetResult {
  S sign;
  double logabs;
};

template <class S>
class Direct {
 public:
  using R = Real<S>;

  Direct(const std::string& kind, Index rows, Index cols, std::uintptr_t outer, std::uintptr_t inner, Index nnz,
         bool csr, Index batch, const std::string& ordering, double pivot_threshold, bool symmetric_mode,
         double qr_threshold)
      : kind_(kind), rows_(rows), cols_(cols), outer_(static_cast<const int*>(as_ptr(outer))),
        inner_(static_cast<const int*>(as_ptr(inner))), nnz_(nnz), csr_(csr), batch_(batch),
        pivot_threshold_(pivot_threshold), symmetric_mode_(symmetric_mode), qr_threshold_(qr_threshold) {
    require(kind == "cholesky" || kind == "ldlt" || kind == "lu" || kind == "qr",
            "unknown direct method '" + kind + "' (cholesky, ldlt, lu, qr)");
    require(rows >= 0 && cols >= 0 && nnz >= 0 && batch >= 1, "negative sizes or an empty value batch");
    require(kind == "qr" || rows == cols, kind + " needs a square matrix");
    if (ordering == "colamd") ordering_ = 0;
    else if (ordering == "amd") ordering_ = 1;
    else if (ordering == "natural") ordering_ = 2;
    else if (ordering == "amd_raw") ordering_ = 3;
    else throw InvalidArgument("unknown ordering '" + ordering + "' (colamd, amd, natural)");
    OneThread one;
    // The pattern is analysed with placeholder values (Eigen's symbolic steps copy values too).
    std::vector<S> ones(static_cast<size_t>(nnz), S(1));
    infos_.resize(batch);
    for (Index i = 0; i < batch; ++i) {
      if (kind == "cholesky") {
        llt_.emplace_back(new Eigen::SimplicialLLT<ColMap<S>, Eigen::Lower, Eigen::AMDOrdering<int>>());
        llt_.back()->analyzePattern(fmap(ones.data()));
      } else if (kind == "ldlt") {
        ldlt_.emplace_back(new Eigen::SimplicialLDLT<ColMap<S>, Eigen::Lower, Eigen::AMDOrdering<int>>());
        ldlt_.back()->analyzePattern(fmap(ones.data()));
      } else if (kind == "lu") {
        lu_.emplace_back(new LU<S>());
        lu_.back()->isSymmetric(symmetric_mode);
        if (pivot_threshold >= 0) lu_.back()->setPivotThreshold(R(pivot_threshold));
        lu_ordering_choice = ordering_;
        lu_.back()->analyzePattern(fmap(ones.data()));
      } else {
        qr_.emplace_back(new QRState());
        ColMatrix<S> A = amatrix(ones.data());
        qr_.back()->qr.analyzePattern(A);
      }
    }
    factored_.assign(batch, false);
  }

  Index batch() const { return batch_; }

  void tune_lu(Index panel, Index relax, Index maxsuper, Index rowblk, Index colblk) {
    for (auto& lu : lu_) lu->tune(panel, relax, maxsuper, rowblk, colblk);
  }

  // Numeric phase for every value-batch member: values is (batch, nnz), contiguous.
  void factorize(std::uintptr_t values) {
    const S* v = static_cast<const S*>(as_ptr(values));
    OneThread one;
    for (Index i = 0; i < batch_; ++i) factorize_member(i, v + i * nnz_);
  }

  FactorInfo info(Index member) const { return infos_.at(member); }

  // X = A^{-1} B (A^{-H} B when adjoint); B and X are (n, k) column-major (k columns of n).
  void solve(Index member, std::uintptr_t b, std::uintptr_t x, Index k, bool adjoint) {
    check_member(member);
    require(rows_ == cols_, "solve needs a square matrix");
    OneThread one;
    const Index n = rows_;
    Eigen::Map<const Mat<S>> B(static_cast<const S*>(as_ptr(b)), n, k);
    Eigen::Map<Mat<S>> X(static_cast<S*>(const_cast<void*>(as_ptr(x))), n, k);
    if (kind_ == "cholesky" || kind_ == "ldlt") {
      // A is Hermitian: adjoint solves are the same solves.
      const bool flip = csr_ && is_complex_v<S>;
      Mat<S> rhs = B;
      if (flip) conj_in_place(rhs);
      if (kind_ == "cholesky") X = llt_[member]->solve(rhs);
      else X = ldlt_[member]->solve(rhs);
      if (flip) X = X.conjugate();
    } else if (kind_ == "lu") {
      LU<S>& lu = *lu_[member];
      if (!csr_) {
        if (!adjoint) X = lu.solve(B);
        else X = lu.adjoint().solve(B);
      } else if (!adjoint) {
        X = lu.transpose().solve(B);  // F = A^T
      } else {
        Mat<S> rhs = B;
        conj_in_place(rhs);
        X = lu.solve(rhs);
        if constexpr (is_complex_v<S>) X = X.conjugate();
      }
    } else {
      QRState& s = *qr_[member];
      if (s.rank < n) throw InvalidArgument("the matrix is rank deficient; solve() needs full rank");
      X = adjoint ? qr_adjoint(s, B) : qr_forward(s, B);
    }
  }

  // Minimum-norm least-squares solution (QR only): A X = B (A^H X = B when adjoint).
  void lstsq(Index member, std::uintptr_t b, std::uintptr_t x, Index k, bool adjoint) {
    check_member(member);
    require(kind_ == "qr", "lstsq needs the qr method");
    OneThread one;
    const Index m = adjoint ? cols_ : rows_, n = adjoint ? rows_ : cols_;
    Eigen::Map<const Mat<S>> B(static_cast<const S*>(as_ptr(b)), m, k);
    Eigen::Map<Mat<S>> X(static_cast<S*>(const_cast<void*>(as_ptr(x))), n, k);
    QRState& s = *qr_[member];
    X = adjoint ? qr_adjoint(s, B) : qr_forward(s, B);
  }

  // (sign, log|det|) from the factors. Singular: sign 0, logabs -inf.
  SlogdetResult<S> slogdet(Index member) const {
    const double ninf = -std::numeric_limits<double>::infinity();
    require(member >= 0 && member < batch_, "member out of range");
    require(kind_ != "qr", "slogdet is not available from a QR factorization");
    require(factored_[member], "slogdet() before factorize()");
    const FactorInfo& inf = infos_[member];
    if (inf.code == SINGULAR) return {S(0), ninf};
    if (inf.code != OK && kind_ != "lu") return {S(0), std::numeric_limits<double>::quiet_NaN()};
    if (kind_ == "cholesky") {
      const auto& L = llt_[member]->matrixL().nestedExpression();
      double acc = 0;
      for (Index j = 0; j < L.outerSize(); ++j) acc += std::log(double(std::real(L.coeff(j, j))));
      return {S(1), 2 * acc};
    }
    if (kind_ == "ldlt") {
      const Vec<S> d = ldlt_[member]->vectorD();
      double acc = 0;
      int sign = 1;
      for (Index j = 0; j < d.size(); ++j) {
        const double dj = double(std::real(d(j)));
        if (dj == 0) return {S(0), ninf};
        if (dj < 0) sign = -sign;
        acc += std::log(std::abs(dj));
      }
      return {S(R(sign)), acc};
    }
    // LU: det(F) = det(A) for F = A^T; sign(det) = sign(perms) * prod(u_jj / |u_jj|).
    if (inf.code != OK) return {S(0), ninf};
    const Vec<S> d = lu_[member]->pivots();
    double acc = 0;
    S phase = S(R(lu_[member]->permutation_sign()));
    for (Index j = 0; j < d.size(); ++j) {
      const R a = std::abs(d(j));
      if (a == R(0)) return {S(0), ninf};
      acc += std::log(double(a));
      phase *= d(j) / a;
    }
    if constexpr (is_complex_v<S>) phase /= std::abs(phase);  // renormalise the rounding drift
    return {phase, acc};
  }

  Index rank(Index member) const {
    check_member(member);
    if (kind_ == "qr") return qr_[member]->rank;
    return std::min(rows_, cols_);
  }

  // Stored entries of the factors (L for Cholesky/LDL^T, L+U for LU, R for QR).
  Index factor_nnz(Index member) const {
    check_member(member);
    if (kind_ == "cholesky") return llt_[member]->matrixL().nestedExpression().nonZeros();
    if (kind_ == "ldlt") return ldlt_[member]->matrixL().nestedExpression().nonZeros() + rows_;
    if (kind_ == "lu") return lu_[member]->nnzL() + lu_[member]->nnzU();
    return qr_[member]->qr.matrixR().nonZeros() + qr_[member]->qr.matrixQ().rows();
  }

  // |pivot| extremes (for the singularity test): (min |pivot|, max |pivot|, argmin).
  std::tuple<double, double, Index> pivot_range(Index member) const {
    check_member(member);
    Vec<S> d;
    if (kind_ == "cholesky") {
      const auto& L = llt_[member]->matrixL().nestedExpression();
      d.resize(L.outerSize());
      for (Index j = 0; j < L.outerSize(); ++j) d(j) = L.coeff(j, j) * L.coeff(j, j);
    } else if (kind_ == "ldlt") {
      d = ldlt_[member]->vectorD();
    } else if (kind_ == "lu") {
      d = lu_[member]->pivots();
    } else {
      const auto& Rm = qr_[member]->qr.matrixR();
      const Index r = std::min(Rm.rows(), Rm.cols());
      d.resize(r);
      for (Index j = 0; j < r; ++j) d(j) = Rm.coeff(j, j);
    }
    if (d.size() == 0) return {0.0, 0.0, -1};
    Index at = 0;
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (Index j = 0; j < d.size(); ++j) {
      const double a = double(std::abs(d(j)));
      if (!(a >= lo)) { lo = a; at = j; }
      hi = std::max(hi, a);
    }
    // argmin as the input's index (0-based), not the factored order's: LU, the factored matrix's column
    // (CSC: A's column; CSR: A's row); Cholesky / LDL^T (P A P^T), A's row and column; QR: -1 (not mapped)
    if (kind_ == "lu") at = lu_[member]->colsPermutation().size() == d.size() ? factored_to_input(lu_[member]->colsPermutation(), at) : -1;
    else if (kind_ == "cholesky") at = symmetric_to_input(llt_[member]->permutationPinv(), at, d.size());
    else if (kind_ == "ldlt") at = symmetric_to_input(ldlt_[member]->permutationPinv(), at, d.size());
    else at = -1;
    return {lo, hi, at};
  }

 private:
  struct QRState {
    Eigen::SparseQR<ColMatrix<S>, Eigen::COLAMDOrdering<int>> qr;
    Index rank = 0;
    ColMatrix<S> R11;  // rank x rank upper triangle (full column rank)
    // rank < n: QR of W^H, W = R[:rank, :]
    std::unique_ptr<Eigen::SparseQR<ColMatrix<S>, Eigen::COLAMDOrdering<int>>> qr2;
    ColMatrix<S> R2;   // rank2 x rank2 upper triangle of the second QR
    Index rank2 = 0;
  };

  ColMap<S> fmap(const S* v) const {
    // CSC buffers: A itself; CSR buffers of an m x n A: A^T (n x m), read as CSC.
    const Index r = csr_ ? cols_ : rows_, c = csr_ ? rows_ : cols_;
    return ColMap<S>(r, c, nnz_, outer_, inner_, v);
  }

  ColMatrix<S> amatrix(const S* v) const {
    if (!csr_) return ColMatrix<S>(ColMap<S>(rows_, cols_, nnz_, outer_, inner_, v));
    return ColMatrix<S>(RowMap<S>(rows_, cols_, nnz_, outer_, inner_, v));
  }

  // The input column whose image under perm (column i of the input is column perm(i) of the matrix factored)
  // is k.
  template <class Perm>
  static Index factored_to_input(const Perm& perm, Index k) {
    const auto& idx = perm.indices();
    for (Index i = 0; i < idx.size(); ++i)
      if (Index(idx(i)) == k) return i;
    return -1;
  }
  // P A P^T (Eigen's simplicial Cholesky): factor index k is the input's index Pinv(k); no permutation: k.
  template <class Perm>
  static Index symmetric_to_input(const Perm& pinv, Index k, Index n) {
    if (pinv.size() == 0) return k;
    return pinv.size() == n ? Index(pinv.indices()(k)) : -1;
  }

  void check_member(Index member) const {
    require(member >= 0 && member < batch_, "member out of range");
    require(factored_[member], "solve before factorize");
    require(infos_[member].code == OK, "the factorization failed: " + infos_[member].message);
  }

  void factorize_member(Index i, const S* v) {
    FactorInfo inf;
    factored_[i] = false;
    if (kind_ == "cholesky") {
      auto& s = *llt_[i];
      s.factorize(fmap(v));
      if (s.info() != Eigen::Success) {
        inf.code = INDEFINITE;
        inf.message = "a pivot of the Cholesky factorization was zero or negative: the matrix is not positive definite";
      }
    } else if (kind_ == "ldlt") {
      auto& s = *ldlt_[i];
      s.factorize(fmap(v));
      if (s.info() != Eigen::Success) {
        inf.code = SINGULAR;
        inf.message = "a pivot of the LDL^T factorization is exactly zero";
      }
    } else if (kind_ == "lu") {
      auto& s = *lu_[i];
      s.factorize(fmap(v));
      if (s.info() != Eigen::Success) {
        const std::string msg = s.lastErrorMessage();
        inf.code = msg.find("SINGULAR") != std::string::npos ? SINGULAR : FAILED;
        inf.message = msg;
        const auto at = msg.find_last_of(' ');
        Index k = 0;  // Eigen's pivotL reports jcol + 1: 1-based, in the factored (column-permuted) order
        if (at != std::string::npos) {
          try { k = std::stol(msg.substr(at + 1)); } catch (...) { k = 0; }
        }
        // back to the factored matrix's own column (CSC: A's column; CSR, F = A^T: A's row), 0-based: column
        // i of the input is column perm_c(i) of the matrix factored
        inf.where = (k >= 1 && k <= cols_ && s.colsPermutation().size() == cols_) ? factored_to_input(s.colsPermutation(), k - 1) : -1;
      }
    } else {
      QRState& s = *qr_[i];
      ColMatrix<S> A = amatrix(v);
      if (qr_threshold_ >= 0) s.qr.setPivotThreshold(R(qr_threshold_));
      s.qr.factorize(A);
      if (s.qr.info() != Eigen::Success) {
        inf.code = FAILED;
        inf.message = "SparseQR failed: " + s.qr.lastErrorMessage();
      } else {
        s.rank = s.qr.rank();
        s.qr2.reset();
        const Index r = s.rank;
        ColMatrix<S> W = s.qr.matrixR().topRows(r);
        if (r == cols_) {
          s.R11 = W.leftCols(r);
        } else {
          ColMatrix<S> WH = W.adjoint();
          s.qr2.reset(new Eigen::SparseQR<ColMatrix<S>, Eigen::COLAMDOrdering<int>>());
          s.qr2->compute(WH);
          if (s.qr2->info() != Eigen::Success) {
            inf.code = FAILED;
            inf.message = "SparseQR of the rank-deficient part failed: " + s.qr2->lastErrorMessage();
          } else {
            s.rank2 = s.qr2->rank();
            s.R2 = ColMatrix<S>(s.qr2->matrixR().topLeftCorner(s.rank2, s.rank2));
          }
        }
        if (inf.code == OK && rows_ == cols_ && r < cols_) {
          inf.code = SINGULAR;
          inf.where = r;
          inf.message = "SparseQR found rank " + std::to_string(r) + " < n = " + std::to_string(cols_);
          inf.code = OK;  // kept usable for lstsq; square solves check the rank
        }
      }
    }
    infos_[i] = inf;
    factored_[i] = true;
  }

  // Minimum-norm least squares of A x = b from A P = Q R (rank r).
  template <class Rhs>
  Mat<S> qr_forward(QRState& s, const Rhs& B) {
    const Index n = cols_, r = s.rank, k = B.cols();
    Mat<S> y = s.qr.matrixQ().adjoint() * B;  // m x k
    Mat<S> c = y.topRows(r);
    Mat<S> z(n, k);
    if (r == n) {
      z = s.R11.template triangularView<Eigen::Upper>().solve(c);
    } else {
      // W y = c, W = R[:r, :] = P2 R2^H Q2^H: v = R2^{-H} P2^T c, y = Q2 [v; 0].
      const Index r2 = s.rank2;
      Mat<S> pc = s.qr2->colsPermutation().transpose() * c;
      Mat<S> v = s.R2.adjoint().template triangularView<Eigen::Lower>().solve(pc.topRows(r2));
      Mat<S> pad = Mat<S>::Zero(n, k);
      pad.topRows(r2) = v;
      z = s.qr2->matrixQ() * pad;
    }
    return s.qr.colsPermutation() * z;
  }

  // Minimum-norm least squares of A^H x = b: A^H = P W^H Q_r^H.
  template <class Rhs>
  Mat<S> qr_adjoint(QRState& s, const Rhs& B) {
    const Index m = rows_, n = cols_, r = s.rank, k = B.cols();
    Mat<S> d = s.qr.colsPermutation().transpose() * B;  // n x k
    Mat<S> u(r, k);
    if (r == n) {
      u = s.R11.adjoint().template triangularView<Eigen::Lower>().solve(d);
    } else {
      // min ||W^H u - d||, W^H P2 = Q2 R2: u = P2 R2^{-1} (Q2^H d)[:r2].
      const Index r2 = s.rank2;
      Mat<S> t = s.qr2->matrixQ().adjoint() * d;
      Mat<S> w = Mat<S>::Zero(r, k);
      w.topRows(r2) = s.R2.template triangularView<Eigen::Upper>().solve(t.topRows(r2));
      u = s.qr2->colsPermutation() * w;
    }
    Mat<S> pad = Mat<S>::Zero(m, k);
    pad.topRows(r) = u;
    return s.qr.matrixQ() * pad;
  }

  std::string kind_;
  Index rows_, cols_;
  const int* outer_;
  const int* inner_;
  Index nnz_;
  bool csr_;
  Index batch_;
  int ordering_ = 0;
  double pivot_threshold_;
  bool symmetric_mode_;
  double qr_threshold_;
  std::vector<std::unique_ptr<Eigen::SimplicialLLT<ColMap<S>, Eigen::Lower, Eigen::AMDOrdering<int>>>> llt_;
  std::vector<std::unique_ptr<Eigen::SimplicialLDLT<ColMap<S>, Eigen::Lower, Eigen::AMDOrdering<int>>>> ldlt_;
  std::vector<std::unique_ptr<LU<S>>> lu_;
  std::vector<std::unique_ptr<QRState>> qr_;
  std::vector<FactorInfo> infos_;
  std::vector<bool> factored_;
};

}  // namespace ste

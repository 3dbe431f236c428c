// Shared definitions of the sparsetorch-eigen extension: buffer maps, status codes, errors.
//
// Buffers arrive from Python as raw addresses (torch's data_ptr()) with their sizes; Python keeps
// the tensors alive for as long as the C++ objects hold maps of them. Nothing here calls Python
// while the GIL is released (except user callbacks, which pybind11 wraps with a GIL acquire).
#pragma once

#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>
#include <Eigen/SparseCore>

namespace ste {

using Eigen::Dynamic;
using Eigen::Index;

template <class S>
using Vec = Eigen::Matrix<S, Dynamic, 1>;
template <class S>
using Mat = Eigen::Matrix<S, Dynamic, Dynamic>;  // column-major
template <class S>
using Real = typename Eigen::NumTraits<S>::Real;

template <class S>
constexpr bool is_complex_v = Eigen::NumTraits<S>::IsComplex;

// A user-visible error in the arguments (wrong size, bad pointer): Python turns it into InputError.
struct InvalidArgument : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

inline void require(bool ok, const std::string& what) {
  if (!ok) throw InvalidArgument(what);
}

// Status codes shared with Python (sparsetorch_eigen/_codes.py).
enum Code : int {
  OK = 0,
  MAX_ITERATIONS = 1,
  BREAKDOWN = 2,
  INDEFINITE = 3,     // CG: p^H A p <= 0; Cholesky: a pivot <= 0
  NOT_FINITE = 4,     // NaN or Inf met
  SINGULAR = 5,       // a zero (or negligible) pivot, or rank < n for a square solve
  FAILED = 6,         // any other failure of Eigen's routine (its message is kept)
};

// One compressed sparse pattern: outer pointers, inner indices (either index width).
struct Pattern {
  Index outer = 0, inner = 0;  // outer size (rows of CSR / columns of CSC), inner size
  Index nnz = 0;
  const void* outer_ptr = nullptr;
  const void* inner_ptr = nullptr;
  bool index64 = false;
};

inline const void* as_ptr(std::uintptr_t p) { return reinterpret_cast<const void*>(p); }

template <class S>
inline S conj_if(const S& v) {
  if constexpr (is_complex_v<S>) return std::conj(v); else return v;
}

template <class Derived>
inline void conj_in_place(Eigen::MatrixBase<Derived>& m) {
  if constexpr (is_complex_v<typename Derived::Scalar>) m = m.conjugate();
}

inline std::string fmt_double(double v) {
  std::ostringstream s;
  s.precision(3);
  s << v;
  return s.str();
}

}  // namespace ste

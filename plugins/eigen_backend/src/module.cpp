// The sparsetorch_eigen._eigen extension module: Eigen's sparse solvers for sparsetorch.
#include <pybind11/pybind11.h>

#include <Eigen/Core>

#include "common.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace py = pybind11;

void register_f32(py::module_& m);
void register_f64(py::module_& m);
void register_c64(py::module_& m);
void register_c128(py::module_& m);
void register_convert(py::module_& m);  // convert.cpp: the csr_to_bsr conversion kernel

PYBIND11_MODULE(_eigen, m) {
  m.doc() = "Eigen sparse direct and iterative solvers on zero-copy maps of torch buffers; a CSR -> BSR kernel";
  py::register_exception<ste::InvalidArgument>(m, "InvalidArgument", PyExc_ValueError);
  register_f32(m);
  register_f64(m);
  register_c64(m);
  register_c128(m);
  register_convert(m);
  m.attr("eigen_version") = std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + "." +
                            std::to_string(EIGEN_MINOR_VERSION);
#ifdef _OPENMP
  m.attr("openmp") = true;
#else
  m.attr("openmp") = false;
#endif
  m.def("set_num_threads", [](int n) { Eigen::setNbThreads(n); }, py::arg("n"),
        "Threads of Eigen's OpenMP kernels (the row-major products of the iterative solvers).");
  m.def("get_num_threads", []() { return Eigen::nbThreads(); });
  m.attr("OK") = int(ste::OK);
  m.attr("MAX_ITERATIONS") = int(ste::MAX_ITERATIONS);
  m.attr("BREAKDOWN") = int(ste::BREAKDOWN);
  m.attr("INDEFINITE") = int(ste::INDEFINITE);
  m.attr("NOT_FINITE") = int(ste::NOT_FINITE);
  m.attr("SINGULAR") = int(ste::SINGULAR);
  m.attr("FAILED") = int(ste::FAILED);
}

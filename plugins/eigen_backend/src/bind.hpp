// pybind11 bindings of Direct<S> and Iterative<S> for one scalar type (one translation unit each,
// so the four scalar types compile in parallel).
#pragma once

#include <pybind11/complex.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "direct.hpp"
#include "iterative.hpp"

namespace py = pybind11;

namespace ste {

template <class S>
py::object to_py_scalar(const S& v) {
  if constexpr (is_complex_v<S>) return py::cast(std::complex<double>(double(v.real()), double(v.imag())));
  else return py::cast(double(v));
}

template <class S>
void bind_scalar(py::module_& m, const std::string& suffix) {
  using D = Direct<S>;
  py::class_<D>(m, ("Direct_" + suffix).c_str())
      .def(py::init<const std::string&, Index, Index, std::uintptr_t, std::uintptr_t, Index, bool, Index, const std::string&,
                    double, bool, double>(),
           py::arg("kind"), py::arg("rows"), py::arg("cols"), py::arg("outer"), py::arg("inner"), py::arg("nnz"),
           py::arg("csr"), py::arg("batch"), py::arg("ordering"), py::arg("pivot_threshold"), py::arg("symmetric_mode"),
           py::arg("qr_threshold"), py::call_guard<py::gil_scoped_release>())
      .def("factorize", &D::factorize, py::arg("values"), py::call_guard<py::gil_scoped_release>())
      .def("info", [](const D& d, Index member) {
        FactorInfo i = d.info(member);
        return py::make_tuple(i.code, i.message, i.where);
      })
      .def("solve", &D::solve, py::arg("member"), py::arg("b"), py::arg("x"), py::arg("k"), py::arg("adjoint"),
           py::call_guard<py::gil_scoped_release>())
      .def("lstsq", &D::lstsq, py::arg("member"), py::arg("b"), py::arg("x"), py::arg("k"), py::arg("adjoint"),
           py::call_guard<py::gil_scoped_release>())
      .def("slogdet", [](const D& d, Index member) {
        SlogdetResult<S> r = d.slogdet(member);
        return py::make_tuple(to_py_scalar(r.sign), r.logabs);
      })
      .def("tune_lu", &D::tune_lu, py::arg("panel"), py::arg("relax"), py::arg("maxsuper"), py::arg("rowblk"),
           py::arg("colblk"))
      .def("rank", &D::rank)
      .def("factor_nnz", &D::factor_nnz)
      .def("pivot_range", &D::pivot_range);

  using It = Iterative<S>;
  py::class_<It>(m, ("Iterative_" + suffix).c_str())
      .def(py::init<const std::string&, const std::string&, Index, Index, std::uintptr_t, std::uintptr_t, Index, bool, bool,
                    Index, double, int, double>(),
           py::arg("method"), py::arg("precond"), py::arg("rows"), py::arg("cols"), py::arg("outer"), py::arg("inner"),
           py::arg("nnz"), py::arg("index64"), py::arg("csr"), py::arg("batch"), py::arg("ilut_droptol"),
           py::arg("ilut_fill"), py::arg("ic_shift"))
      .def("set_values", &It::set_values, py::arg("values"), py::call_guard<py::gil_scoped_release>())
      .def(
          "solve",
          [](It& self, Index member, std::uintptr_t b, std::uintptr_t x, Index k, bool adjoint, double rtol, double atol,
             double btol, double damp, Index maxiter, Index check_every, py::object callback, bool stagnation) {
            Stop stop;
            stop.stagnation = stagnation;
            stop.rtol = rtol;
            stop.atol = atol;
            stop.btol = btol;
            stop.damp = damp;
            stop.maxiter = maxiter;
            stop.check_every = check_every;
            if (!callback.is_none()) {
              stop.callback = [callback](Index it, double rel) {
                py::gil_scoped_acquire gil;
                callback(it, rel);
              };
            }
            std::vector<Outcome> outs;
            {
              py::gil_scoped_release release;
              outs = self.solve(member, b, x, k, adjoint, stop);
            }
            stop.callback = nullptr;  // drop the Python reference with the GIL held
            py::list result;
            for (const Outcome& o : outs)
              result.append(py::make_tuple(o.iterations, o.residual, o.code, o.message, o.history));
            return result;
          },
          py::arg("member"), py::arg("b"), py::arg("x"), py::arg("k"), py::arg("adjoint"), py::arg("rtol"), py::arg("atol"),
          py::arg("btol"), py::arg("damp"), py::arg("maxiter"), py::arg("check_every"), py::arg("callback"),
          py::arg("stagnation") = false);
}

}  // namespace ste
